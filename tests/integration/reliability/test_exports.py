"""Exports and probes read checkpoints as training does, and exports publish whole.

* a same-size garbled shard in the newest checkpoint: the export (and the probe loader) falls
  back to the newest complete checkpoint; that checkpoint named explicitly is refused;
* ``--overwrite`` killed after the old export was moved aside and before the new one is in
  place: the old export is not lost, the next export puts it back, and no hidden folder stays;
* exported files follow the user's umask (group-readable, not 0700/0600).
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest
import torch

from megatron_loop.errors import LoopDataError
from megatron_loop.export.convert import convert_checkpoint, to_hf_state_dict
from megatron_loop.export.load import read_hf_state_dict
from megatron_loop.checkpoint.folders import load_run_config
from megatron_loop.checkpoint.weights import consolidated_state_dict
from megatron_loop.export.load import load_model_from_checkpoint
from train_fixtures import FAULTS, copy_run, reference_run, run_cli

pytestmark = pytest.mark.slow


def _garbled_newest(tmp_path):
    ckpt = copy_run(reference_run().run_dir, tmp_path / "run") / "checkpoints"
    shard = ckpt / "global_step10" / "mp_rank_00_model_states.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the manifest's sha256 can tell
    shard.write_bytes(bytes(data))
    return ckpt, shard


def _hidden(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def _modes(folder):
    return {stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.rglob("*")] if p.is_dir()}, \
        {stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*") if p.is_file()}


def test_corrupt_newest_checkpoint_falls_back_and_is_refused_by_name(tmp_path, capsys):
    ckpt, shard = _garbled_newest(tmp_path)
    expected = to_hf_state_dict(consolidated_state_dict(ckpt, "global_step9"), load_run_config(ckpt).model)
    previous = os.umask(0o027)
    try:
        out = convert_checkpoint(ckpt, tmp_path / "hf")
    finally:
        os.umask(previous)
    err = capsys.readouterr().err
    assert f"warning: skipping checkpoint global_step10: {shard}: sha256 differs" in err
    assert f"reading {ckpt / 'global_step9'} (the newest complete checkpoint)" in err
    got = read_hf_state_dict(out)
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)
    assert _modes(out) == ({0o750}, {0o640})  # the umask, not tempfile's 0700 / safetensors' 0600

    with pytest.raises(LoopDataError, match=rf"{shard}: sha256 differs from .*manifest\.json \(corrupt file\)"):
        convert_checkpoint(ckpt / "global_step10", tmp_path / "hf10")
    assert not (tmp_path / "hf10").exists() and _hidden(tmp_path) == []

    model, _ = load_model_from_checkpoint(ckpt, quiet=True)  # probe_geometry.py's loader
    weights = {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}
    step9 = consolidated_state_dict(ckpt, "global_step9")
    assert all(torch.equal(weights[k], step9[k]) for k in step9)


def _exported(tmp_path):
    """A copy of the reference run and its step-9 export: (checkpoints, export folder, its files)."""
    ckpt = copy_run(reference_run().run_dir, tmp_path / "run") / "checkpoints"
    hf = tmp_path / "hf"
    convert_checkpoint(ckpt, hf, tag="global_step9")
    return ckpt, hf, {p.name: p.read_bytes() for p in hf.iterdir()}


def test_overwrite_killed_mid_swap_keeps_the_old_export(tmp_path):
    ckpt, hf, old = _exported(tmp_path)

    killed = run_cli("kill_in_swap", "convert_to_hf.py", "--checkpoint", str(ckpt), "--output", str(hf),
                     "--overwrite", script=str(FAULTS))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not hf.exists()  # killed between the two renames: the old export is aside, not deleted
    (retired,) = [tmp_path / n for n in _hidden(tmp_path) if n.startswith(".hf.old-")]
    assert {p.name: p.read_bytes() for p in retired.iterdir()} == old

    with pytest.raises(LoopDataError, match=r"output folder is not empty; pass --overwrite"):
        convert_checkpoint(ckpt, hf)  # first puts the old export back, then refuses to replace it
    assert {p.name: p.read_bytes() for p in hf.iterdir()} == old and _hidden(tmp_path) == []

    previous = os.umask(0o022)
    try:
        convert_checkpoint(ckpt, hf, overwrite=True)  # the newest checkpoint replaces it, atomically
    finally:
        os.umask(previous)
    assert _hidden(tmp_path) == [] and (hf / "config.json").is_file()
    assert {p.name: p.read_bytes() for p in hf.iterdir()} != old
    assert _modes(hf) == ({0o755}, {0o644})


def test_overwrite_replaces_only_an_export_never_a_run_or_a_checkpoint(tmp_path):
    """``--overwrite`` with ``--output`` naming the run folder while a run holds its lock, its
    ``checkpoints/``, a ``global_stepN`` or a folder inside one, or an export someone added a file
    to: one line each, nothing touched (before: rc 0 and every checkpoint, metrics.jsonl and
    run.lock gone; done while the run trained, the run died)."""
    import re

    from megatron_loop.training.lock import RunLock

    ckpt, hf, old = _exported(tmp_path)
    run_dir = ckpt.parent

    def tree():
        return {str(p.relative_to(tmp_path)): p.stat().st_size for p in sorted(tmp_path.rglob("*")) if p.is_file()}

    lock = RunLock(run_dir).acquire()  # a live run trains in the folder
    try:
        before = tree()
        result = run_cli("--checkpoint", str(ckpt), "--output", str(run_dir), "--overwrite",
                         script="tools/convert_to_hf.py")
        assert result.returncode == 2, result.stderr[-3000:]
        (line,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
        assert re.fullmatch(rf"error: --output {re.escape(str(run_dir))}: holds a training run or checkpoints "
                            r"\(run\.lock, metrics\.jsonl, checkpoints\); a run is training there \(host .+, pid "
                            rf"{os.getpid()}, started .+\); --overwrite replaces only an export written by "
                            r"convert_to_hf\.py: choose another --output \(e\.g\. RUN/hf\)", line), line
        assert lock.still_ours()
        for target, what in ((ckpt, rf"is the checkpoint folder {re.escape(str(ckpt))} of a run"),
                             (ckpt / "global_step10", rf"is inside the checkpoint folder {re.escape(str(ckpt))} "),
                             (ckpt / "global_step10" / "hf", "inside the checkpoint folder")):
            with pytest.raises(LoopDataError, match=what):
                convert_checkpoint(ckpt, target, overwrite=True)
        (hf / "notes.txt").write_text("mine")  # an export with a file of someone else's
        with pytest.raises(LoopDataError, match=rf"holds {re.escape(str(hf / 'notes.txt'))} that the export did "
                                                "not write; --overwrite would delete them"):
            convert_checkpoint(ckpt, hf, overwrite=True)
        assert tree() == {**before, "hf/notes.txt": 4} and _hidden(tmp_path) == []
    finally:
        lock.release()


@pytest.mark.timeout(300)
def test_a_second_export_to_the_same_folder_is_refused_while_one_runs(tmp_path):
    """Two exports to one --output at once: the second stops with one error naming the first
    (before any work), the first's lock is intact, and nothing of the second is left behind."""
    import subprocess
    import sys

    ckpt = copy_run(reference_run().run_dir, tmp_path / "run") / "checkpoints"
    hf = tmp_path / "hf"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                               "from megatron_loop.export.output_folder import ExportLock\n"
                               "with ExportLock(Path(sys.argv[1])):\n    print('held', flush=True)\n"
                               "    time.sleep(120)\n", str(hf)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        second = run_cli("--checkpoint", str(ckpt), "--output", str(hf), script="tools/convert_to_hf.py")
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 2, second.stderr[-3000:]
    errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {hf}: another export to this folder is running (host {os.uname().nodename}, "
                      f"pid {holder.pid}, started {errors[0].split('started ')[1].split(')')[0]}): wait for it "
                      "to end, or choose another --output"], second.stderr[-3000:]
    assert not hf.exists() and [n for n in _hidden(tmp_path) if n != ".hf.lock"] == []
    convert_checkpoint(ckpt, hf)  # the holder is gone: the lock is free again, and removed after
    assert (hf / "config.json").is_file() and _hidden(tmp_path) == []


@pytest.mark.timeout(300)
def test_read_only_output_is_refused_before_the_weights_are_read(tmp_path):
    ckpt = copy_run(reference_run().run_dir, tmp_path / "run") / "checkpoints"
    ro = tmp_path / "ro"
    ro.mkdir()
    result = run_cli(f"oserror@EROFS:{ro}", "convert_to_hf.py", "--checkpoint", str(ckpt), "--output",
                     str(ro / "hf"), script=str(FAULTS))
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == (f"error: {ro / 'hf'}: cannot write an export there (read-only file "
                                              f"system (EROFS): {ro / '.hf.lock'}); expected a writable folder")
    assert "reading " not in result.stderr  # refused before the checkpoint was chosen and consolidated


@pytest.mark.timeout(300)
def test_overwrite_export_under_a_file_size_limit_keeps_the_old_export(tmp_path):
    """The disk fills (here: ``ulimit -f``, the same write failure) while the new export's
    safetensors are written: one error naming the condition; the old export is untouched."""
    ckpt, hf, old = _exported(tmp_path)
    # the limit lies between the modeling file (about 0.1 MB) and the weights (about 0.7 MB): the shards fail

    result = run_cli("fsize@300000", "convert_to_hf.py", "--checkpoint", str(ckpt), "--output", str(hf),
                     "--overwrite", script=str(FAULTS))
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert line.startswith(f"error: {hf}: writing the export failed (file too large (the process file-size limit, "
                           "ulimit -f) (EFBIG) ") and line.endswith(f"nothing was published; the previous export in "
                                                                     f"{hf} is kept"), line
    assert "Traceback" not in result.stderr
    assert {p.name: p.read_bytes() for p in hf.iterdir()} == old and _hidden(tmp_path) == []


def test_an_export_into_a_runs_checkpoint_folder_is_refused(tmp_path):
    """RELIABILITY.md row 62. Before: ``--output RUN/checkpoints/global_step300`` (a step the run had not
    reached) was rc 0 "exported", and the run's save of step 300 then replaced the export; an export
    to ``global_step3`` was removed by retention; ``--output RUN/checkpoints/set_aside`` was accepted.
    Now each is one line before the weights are read, and nothing is written there."""
    import re

    ckpt = copy_run(reference_run().run_dir, tmp_path / "run") / "checkpoints"
    before = sorted(p.name for p in ckpt.iterdir())
    for target in (ckpt / "global_step300", ckpt / "global_step3", ckpt / "set_aside", ckpt / "mine"):
        with pytest.raises(LoopDataError, match=rf"^--output {re.escape(str(target))}: is inside the checkpoint folder "
                                                rf"{re.escape(str(ckpt))} of a run, whose saves replace a global_step\* "
                                                r"folder of the same name, whose retention removes old ones and whose "
                                                r"resume sets folders aside; expected a folder outside it \(e\.g\. RUN/hf\)$"):
            convert_checkpoint(ckpt, target)
    assert sorted(p.name for p in ckpt.iterdir()) == before
    result = run_cli("--checkpoint", str(ckpt), "--output", str(ckpt / "global_step300"),
                     script="tools/convert_to_hf.py")
    assert result.returncode == 2 and len([x for x in result.stderr.splitlines() if x.startswith("error: ")]) == 1
    assert "is inside the checkpoint folder" in result.stderr and sorted(p.name for p in ckpt.iterdir()) == before
    # exports named after the steps they hold, outside any run: not a checkpoint folder
    from megatron_loop.export.output_folder import check_not_in_a_checkpoint

    (tmp_path / "exports" / "global_step100").mkdir(parents=True)
    (tmp_path / "exports" / "global_step100" / "config.json").write_text("{}")
    check_not_in_a_checkpoint(tmp_path / "exports" / "global_step200")


def test_a_checkpoint_removed_by_retention_mid_export_is_named_and_the_newest_is_read(tmp_path, monkeypatch, capsys):
    """RELIABILITY.md row 63. A live run's retention deletes the checkpoint an export is reading
    (simulated: the folder is removed as DeepSpeed's reader starts). Before: "Directory
    .../global_stepN doesn't exist", nothing said about retention, no fallback. Now the export says
    which checkpoint was removed and reads the newest complete one; a checkpoint named explicitly is
    refused with that line instead of being swapped for another."""
    import shutil

    from deepspeed.utils import zero_to_fp32

    ckpt = copy_run(reference_run().run_dir, tmp_path / "run") / "checkpoints"
    expected = to_hf_state_dict(consolidated_state_dict(ckpt, "global_step9"), load_run_config(ckpt).model)
    read = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint
    removed = []

    def retention_strikes(root, tag=None, **kwargs):
        if not removed:  # the first read: retention removes the folder under the reader
            removed.append(tag)
            shutil.rmtree(Path(root) / tag)
        return read(root, tag=tag, **kwargs)

    monkeypatch.setattr(zero_to_fp32, "get_fp32_state_dict_from_zero_checkpoint", retention_strikes)
    out = convert_checkpoint(ckpt, tmp_path / "hf")
    err = capsys.readouterr().err
    assert removed == ["global_step10"]
    assert (f"warning: {ckpt / 'global_step10'}: removed while it was read (a live run's retention keeps only the "
            f"newest train.keep_last checkpoints, a resume sets newer ones aside); reading {ckpt / 'global_step9'} "
            "(the newest complete checkpoint)") in err, err
    got = read_hf_state_dict(out)
    assert all(torch.equal(got[k], expected[k]) for k in expected) and got.keys() == expected.keys()

    removed.clear()
    with pytest.raises(LoopDataError, match=rf"^{ckpt / 'global_step9'}: removed while it was read .*; expected a "
                                            r"checkpoint the run keeps: name a newer one, or the run's checkpoint "
                                            rf"folder {ckpt} for its newest$"):
        convert_checkpoint(ckpt / "global_step9", tmp_path / "hf9")
    assert not (tmp_path / "hf9").exists()


def test_a_garbled_export_shard_is_refused_before_evaluation_and_probes(tmp_path):
    """RELIABILITY.md row 64. Every export records the sha256 of each weight shard; the loader of
    eval_loops.py and probe_geometry.py (``export.load.check_export``) verifies them. Before: a
    same-size garbled safetensors shard was evaluated without a word."""
    from megatron_loop.export.load import check_export
    from megatron_loop.export.output_folder import EXPORT_RECORD
    from megatron_loop.probes.cli import check_probe_export

    ckpt = copy_run(reference_run().run_dir, tmp_path / "run") / "checkpoints"
    hf = convert_checkpoint(ckpt, tmp_path / "hf")
    check_export(hf)  # as written: verifies
    (shard,) = sorted(hf.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-len(data) // 3] ^= 0xFF  # inside the tensors, same size: the header still parses
    shard.write_bytes(bytes(data))
    message = (rf"^{shard}: sha256 differs from {hf / EXPORT_RECORD} \(a corrupt or replaced weight shard\); "
               r"expected the files as tools/convert_to_hf\.py wrote them: export the checkpoint again$")
    for check in (check_export, check_probe_export):
        with pytest.raises(LoopDataError, match=message):
            check(str(hf))
