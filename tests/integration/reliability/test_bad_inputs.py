"""The catalogue of bad inputs: each one ends ``pretrain_loop.py`` (or the
tool) with exit 2 and ONE ``error: ...`` line naming the key or file and what is expected, and
leaves nothing half-written (no output folder; an existing run folder unchanged).

One module fixture runs every case up front; each test then checks its own result. Cases raised
by the config, data, model I/O and training code alike. A case that stops before training creates
a process group runs in this process through the CLI's own ``main(argv)`` (stderr and the exit code
as the user sees them; reaching the process group fails the case), the others, the fault-injection
wrapper and at least one case of each CLI (:data:`SUBPROCESS`) as real processes, a few at a time,
meanwhile: the interpreter-level path (imports, ``__main__``, exit status) stays covered.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shutil
import subprocess
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from data_fixtures import data_assets
from megatron_loop.training.lock import RunLock
from train_fixtures import FAULTS, command, copy_run, env, reference_run, tiny_config
from testpaths import REPO, load_script

pytestmark = pytest.mark.slow


@dataclass
class Case:
    args: list[str]
    pattern: str  # regex the error line must match (after "error: ")
    script: str = "pretrain_loop.py"
    untouched: list[Path] = field(default_factory=list)  # folders whose listing must not change
    absent: list[Path] = field(default_factory=list)  # paths that must not exist afterwards


def _snapshot(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def _copy_prefix(src: str, dst: Path, with_stats: bool = False) -> str:
    dst.parent.mkdir(parents=True, exist_ok=True)
    for ext in (".bin", ".idx") + ((".stats.json",) if with_stats else ()):
        shutil.copy(src + ext, str(dst) + ext)
    return str(dst)


def _cases(root: Path) -> dict[str, Case]:
    assets = data_assets()
    config = tiny_config(root, "base.yaml")

    fresh = (root / f"out{n}" for n in range(1000))

    def c(overrides: list[str], pattern: str, **kw) -> Case:
        out = next(fresh)  # one folder per case: they run concurrently, and a folder holds one run
        args = ["--config", str(config), "--set", f"train.output_dir={out}"]
        for o in overrides:
            args += ["--set", o]
        return Case(args, pattern, absent=[out], **kw)

    def data(prefix: str) -> list[str]:
        return [f"data.train_prefixes=[{prefix}]"]

    bad_magic = _copy_prefix(assets.prefix, root / "magic" / "p")
    raw = bytearray(Path(bad_magic + ".idx").read_bytes())
    raw[:9] = b"NOTMAGIC!"
    Path(bad_magic + ".idx").write_bytes(bytes(raw))
    short_idx = _copy_prefix(assets.prefix, root / "shortidx" / "p")
    Path(short_idx + ".idx").write_bytes(Path(short_idx + ".idx").read_bytes()[:40])
    short_bin = _copy_prefix(assets.prefix, root / "shortbin" / "p")
    Path(short_bin + ".bin").write_bytes(Path(short_bin + ".bin").read_bytes()[:1000])
    big_ids = _copy_prefix(assets.prefix, root / "ids" / "p")  # no stats.json: the scan must catch it
    fifo = _copy_prefix(assets.prefix, root / "fifo" / "p")
    os.unlink(fifo + ".bin")
    os.mkfifo(fifo + ".bin")  # exists, but a named pipe: reading it would block forever
    device = _copy_prefix(assets.prefix, root / "device" / "p")
    os.unlink(device + ".bin")
    os.symlink("/dev/zero", device + ".bin")  # endless zeros, no size

    from megatron_loop.data.preprocess import PreprocessOptions, preprocess

    four = root / "four" / "p"  # a corpus of a few tokens: 10 steps x 8 x 32 tokens read it hundreds of times
    (root / "four.jsonl").write_text('{"text": "a cat"}\n')
    preprocess(str(root / "four.jsonl"), str(assets.tokenizer), str(four), PreprocessOptions(progress=False))

    previous = copy_run(reference_run().run_dir, root / "previous")
    other_arch = copy_run(reference_run().run_dir, root / "other_arch")
    not_empty = root / "not_empty"
    not_empty.mkdir()
    (not_empty / "notes.txt").write_text("mine")
    bad_yaml = root / "bad.yaml"
    bad_yaml.write_text("model: [unclosed\n")
    runs = {name: copy_run(reference_run().run_dir, root / name)
            for name in ("in_use", "seq_changed", "zero_changed", "read_only", "metrics_locked", "corrupt")}
    ref_config = str(reference_run().config)
    corrupt_tag = runs["corrupt"] / "checkpoints" / "global_step10"
    shard = corrupt_tag / "mp_rank_00_model_states.pt"
    garbled = bytearray(shard.read_bytes())
    garbled[len(garbled) // 2] ^= 0xFF
    shard.write_bytes(bytes(garbled))

    def resume(name: str, *overrides: str, fault: str | None = None) -> Case:
        args = [fault] if fault else []
        args += ["--config", ref_config, "--set", f"train.output_dir={runs[name]}"]
        for o in overrides:
            args += ["--set", o]
        return Case(args, "", script=str(FAULTS) if fault else "pretrain_loop.py", untouched=[runs[name]])

    return {
        "unknown_key": c(["train.learning_rate=1"], r"train\.learning_rate: unknown key; did you mean .lr.\?"),
        "wrong_type": c(["train.lr=fast"], r"train\.lr='fast': expected a number"),
        "wrong_bool": c(["train.resume=maybe"], r"train\.resume='maybe': expected a boolean"),
        "bad_override": c(["train.lr"], r"--set 'train\.lr': expected key\.path=value"),
        "unknown_choice": c(["train.nan_policy=ignore"], r"train\.nan_policy='ignore': expected 'skip' or 'stop'"),
        "impossible_heads": c(["model.num_attention_heads=3"],
                              r"model\.num_attention_heads=3: expected a multiple of num_key_value_heads=2"),
        "no_core": c(["model.core_layers=0"], r"model\.core_layers=0: expected an integer >= 1"),
        "batch_not_divisible": c(["train.global_batch_size=7"],
                                 r"train\.global_batch_size=7: expected a multiple of micro_batch_size=2"),
        "loops_below_one": c(["train.eval_loops=[0,2]"], r"train\.eval_loops=\[0, 2\]: expected .*loop counts >= 1"),
        "prefix_grid_beyond_k": c(["model.timestep=loop_gating", "model.timestep_grid=prefix",
                                   "train.eval_loops=[1,2,4]"],
                                  r"train\.eval_loops=\[1, 2, 4\]: model\.timestep_grid='prefix' "
                                  r".* every r must be <= 2"),
        "seq_beyond_context": c(["train.seq_length=8192"],
                                r"train\.seq_length=8192: expected at most the model's maximum context "
                                r"model\.max_position_embeddings=4096"),
        "too_few_tokens": c(["train.max_steps=null", "train.train_tokens=100"],
                            r"train\.train_tokens=100: less than one global batch"),
        "missing_ds_config": c(["train.deepspeed_config=deepspeed_configs/zero9.json"],
                               r"train\.deepspeed_config='deepspeed_configs/zero9\.json': file not found"),
        "no_train_data": c(["data.train_prefixes=[]"], r"data\.train_prefixes: empty; expected"),
        "missing_data": c(data(str(root / "nowhere" / "p")),
                          rf"prefix '{re.escape(str(root / 'nowhere' / 'p'))}': missing .*\.bin and .*\.idx"),
        "data_is_a_fifo": c(data(fifo), rf"prefix '{re.escape(fifo)}': {re.escape(fifo)}\.bin is a named pipe "
                                         r"\(FIFO\), not a regular file; expected P\.bin and P\.idx"),
        "data_is_a_device": c(data(device), rf"{re.escape(device)}\.bin \(a link to /dev/zero\) is a character "
                                            r"device, not a regular file; expected"),
        "wrong_magic": c(data(bad_magic), rf"{re.escape(bad_magic)}\.idx: not a Megatron index; expected magic"),
        "truncated_idx": c(data(short_idx), rf"{re.escape(short_idx)}\.idx: truncated"),
        "short_bin": c(data(short_bin), rf"{re.escape(short_bin)}\.bin: 1000 bytes, but .* describes"),
        "token_ids_beyond_vocab": c(data(big_ids) + ["model.vocab_size=300"],
                                    rf"{re.escape(big_ids)}\.bin: token id \d+ is not below "
                                    r"the model's vocab_size 300"),
        "tokenizer_vocab_mismatch": c([f"data.tokenizer={assets.tokenizer}", "model.vocab_size=512"],
                                      r"tokenizer\.json: tokenizer vocabulary of 600 tokens does not fit "
                                      r"model\.vocab_size=512"),
        "data_vocab_mismatch": c(["model.vocab_size=512"],
                                 r"train\.stats\.json: tokenizer vocabulary of 600 tokens does not fit"),
        "output_not_empty": Case(["--config", str(config), "--set", f"train.output_dir={not_empty}"],
                                 r"train\.output_dir='.*not_empty': exists and is not empty",
                                 untouched=[not_empty]),
        "previous_run_without_resume": Case(
            ["--config", str(config), "--set", f"train.output_dir={previous}", "--set", "train.resume=false"],
            r"exists and holds a previous run; set train\.resume=true", untouched=[previous]),
        "checkpoint_other_architecture": Case(
            ["--config", str(reference_run().config), "--set", f"train.output_dir={other_arch}",
             "--set", "model.core_layers=3"],
            r"global_step10/manifest\.json: checkpoint is for a different architecture: "
            r"model\.core_layers=2 in the checkpoint, 3 in the config", untouched=[other_arch]),
        "resume_path_missing": c([], r"--resume .*nothing_here: not found; expected a checkpoint folder"),
        "config_missing": Case(["--config", str(root / "none.yaml")], r"none\.yaml: config file not found"),
        "config_not_yaml": Case(["--config", str(bad_yaml)], r"bad\.yaml: not valid YAML"),
        "convert_missing_checkpoint": Case(
            ["--checkpoint", str(root / "no_ckpt"), "--output", str(root / "hf_out")],
            r"no_ckpt: checkpoint folder not found",
            script=str(REPO / "tools" / "convert_to_hf.py"), absent=[root / "hf_out"]),
        # one run per folder, resume that checks what changed, unwritable folders
        "collective_timeout_not_positive": c(["train.collective_timeout_s=0"],
                                             r"train\.collective_timeout_s=0(\.0)?: expected a positive number"),
        "output_dir_in_use": _with(resume("in_use"), rf"{re.escape(str(runs['in_use']))}/run\.lock: train\."
                                   r"output_dir is in use by another run \(host .+, pid \d+, started .+\): wait"),
        "resume_seq_length_changed": _with(resume("seq_changed", "train.seq_length=16"),
                                           r"global_step10/manifest\.json: train\.seq_length=32 in the checkpoint, "
                                           r"16 in the config: the data position counts sequences"),
        "resume_zero_stage_changed": _with(resume("zero_changed", "train.deepspeed_config=deepspeed_configs/zero3.json"),
                                           r"global_step10/manifest\.json: written with ZeRO stage 1, resumed with "
                                           r"stage 3 .* resume with a stage-1 DeepSpeed config"),
        "output_dir_read_only": _with(resume("read_only", fault=f"oserror@EROFS:{runs['read_only']}"),
                                      rf"train\.output_dir='{re.escape(str(runs['read_only']))}': not writable "
                                      r"\(read-only file system \(EROFS\): .*run\.lock\)"),
        "metrics_not_writable_on_resume": _with(
            resume("metrics_locked", fault=f"oserror@EACCES:{runs['metrics_locked'] / 'metrics.jsonl'}"),
            r"metrics\.jsonl: cannot be written \(permission denied \(EACCES\)\); the run appends"),
        "convert_overwrite_of_a_live_run": Case(  # a run holds the folder (the fixture's lock)
            ["--checkpoint", str(runs["in_use"] / "checkpoints"), "--output", str(runs["in_use"]), "--overwrite"],
            rf"--output {re.escape(str(runs['in_use']))}: holds a training run or checkpoints \(run\.lock, "
            r"metrics\.jsonl, checkpoints\); a run is training there \(host .+, pid \d+, started .+\); --overwrite "
            r"replaces only an export", script=str(REPO / "tools" / "convert_to_hf.py"), untouched=[runs["in_use"]]),
        "data_read_too_often": c(data(str(four)), rf"data\.train_prefixes\[0\] '{re.escape(str(four))}': the plan "
                                                  r"reads [\d,.]+ epochs of its \d+ tokens \(10 steps x 8 sequences "
                                                  r"of 32\); expected at most data\.max_epochs=100: add data"),
        "convert_tag_outside_the_checkpoints": Case(  # another run's checkpoint through --tag
            ["--checkpoint", str(previous / "checkpoints"), "--output", str(root / "hf_tag"),
             "--tag", "../../other_arch/checkpoints/global_step10"],
            rf"--tag names '\.\./\.\./other_arch/checkpoints/global_step10', a path, not a checkpoint of "
            rf"{re.escape(str(previous / 'checkpoints'))}; expected the name of a checkpoint folder in it",
            script=str(REPO / "tools" / "convert_to_hf.py"), absent=[root / "hf_tag"], untouched=[other_arch]),
        "convert_corrupt_named_checkpoint": Case(
            ["--checkpoint", str(corrupt_tag), "--output", str(root / "hf_corrupt")],
            rf"{re.escape(str(shard))}: sha256 differs from .*manifest\.json \(corrupt file\)",
            script=str(REPO / "tools" / "convert_to_hf.py"), absent=[root / "hf_corrupt"],
            untouched=[runs["corrupt"]]),
    }


def _with(case: Case, pattern: str) -> Case:
    case.pattern = pattern
    return case


# Real processes: the cases that get past the checks made before training creates its process group
# (the data loader, the resume, the run lock), the fault-injection wrapper, and at least one case of
# each CLI for the interpreter-level path. The others run in this process (_run_in_process).
SUBPROCESS = {
    "wrong_magic", "truncated_idx", "short_bin", "token_ids_beyond_vocab", "checkpoint_other_architecture",
    "resume_path_missing", "output_dir_in_use", "resume_seq_length_changed", "resume_zero_stage_changed",
    "output_dir_read_only", "metrics_not_writable_on_resume",  # past the process group, or a wrapper
    "unknown_key", "convert_corrupt_named_checkpoint",  # a config error as a process; convert_to_hf.py's one
}


def _run(case: Case) -> subprocess.CompletedProcess:
    return subprocess.run(command(*case.args, script=case.script), cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=400)


@functools.lru_cache(maxsize=None)
def _main(script: str):
    """The ``main`` of ``pretrain_loop.py`` or a tool, loaded once."""
    return load_script(script if script == "pretrain_loop.py" else str(Path(script).relative_to(REPO))).main


class _ProcessGroupReached(Exception):
    """An in-process case got as far as creating a process group: it belongs in SUBPROCESS."""


def _run_in_process(case: Case) -> subprocess.CompletedProcess:
    """``main(argv)`` of the case's script as its ``__main__`` calls it, from the repository root like
    :func:`_run`; an uncaught exception is printed as the interpreter would (exit 1), SystemExit
    (argparse) gives its code. The process group is never created here."""
    import megatron_loop.training.setup as setup

    main = _main(case.script)
    out, err = io.StringIO(), io.StringIO()

    def refuse(*args, **kwargs):
        raise _ProcessGroupReached(case.args)

    with contextlib.chdir(REPO), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        original, setup.distributed.setup_distributed = setup.distributed.setup_distributed, refuse
        try:
            code = main(case.args)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except _ProcessGroupReached:
            raise
        except Exception:
            traceback.print_exc()
            code = 1
        finally:
            setup.distributed.setup_distributed = original
    return subprocess.CompletedProcess(case.args, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_inputs")
    cases = _cases(root)
    cases["resume_path_missing"].args += ["--resume", str(root / "nothing_here")]
    before = {name: [_snapshot(p) for p in case.untouched] for name, case in cases.items()}
    holder = RunLock(root / "in_use").acquire()  # a live run on that folder
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:  # the processes run while the rest runs here
            launched = {name: pool.submit(_run, case) for name, case in cases.items() if name in SUBPROCESS}
            results = {name: _run_in_process(case) for name, case in cases.items() if name not in SUBPROCESS}
            results.update({name: future.result() for name, future in launched.items()})
    finally:
        holder.release()
    return {name: (cases[name], results[name], before[name]) for name in cases}


CASE_NAMES = [
    "unknown_key", "wrong_type", "wrong_bool", "bad_override", "unknown_choice", "impossible_heads", "no_core",
    "batch_not_divisible", "loops_below_one", "prefix_grid_beyond_k", "seq_beyond_context", "too_few_tokens",
    "missing_ds_config", "no_train_data", "missing_data", "data_is_a_fifo", "data_is_a_device", "wrong_magic", "truncated_idx", "short_bin",
    "token_ids_beyond_vocab", "tokenizer_vocab_mismatch", "data_vocab_mismatch", "output_not_empty",
    "previous_run_without_resume", "checkpoint_other_architecture", "resume_path_missing", "config_missing",
    "config_not_yaml", "convert_missing_checkpoint", "collective_timeout_not_positive", "output_dir_in_use",
    "resume_seq_length_changed", "resume_zero_stage_changed", "output_dir_read_only",
    "metrics_not_writable_on_resume", "convert_overwrite_of_a_live_run", "convert_corrupt_named_checkpoint",
    "data_read_too_often", "convert_tag_outside_the_checkpoints",
]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_bad_input_fails_cleanly(outcomes, name):
    case, result, before = outcomes[name]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    assert len(errors) == 1, result.stderr[-3000:]
    assert re.search(case.pattern, errors[0][len("error: "):]), errors[0]
    assert "Traceback" not in result.stderr
    for path in case.absent:
        assert not path.exists(), f"{path} was created"
    assert [_snapshot(p) for p in case.untouched] == before


def test_in_process_runs_print_what_the_process_prints(outcomes):
    """The in-process runner against the real process on the same case: the same exit code and error line."""
    case, process, _ = outcomes["unknown_key"]
    again = _run_in_process(case)
    assert (again.returncode, again.stdout) == (process.returncode, process.stdout) == (2, "")
    assert [line for line in again.stderr.splitlines() if line.startswith("error: ")] == \
        [line for line in process.stderr.splitlines() if line.startswith("error: ")]


def test_batch_arithmetic_with_data_parallel_ranks_names_the_keys():
    from megatron_loop.config import config_from_dict
    from megatron_loop.errors import LoopConfigError
    from megatron_loop.plan import accumulation_steps

    cfg = config_from_dict({"train": {"global_batch_size": 12, "micro_batch_size": 2, "seq_length": 32}})
    assert accumulation_steps(cfg, 2) == 3  # 2 x 3 x 2 = 12
    with pytest.raises(LoopConfigError, match=r"train\.global_batch_size=12: expected a multiple of "
                                              r"train\.micro_batch_size=2 x data-parallel size 4 = 8"):
        accumulation_steps(cfg, 4)
