"""Every command of the README's ``bash`` blocks that can run on CPU runs as documented, in a
sandbox laid out like the repository after ``make demo``'s data stage.

The sandbox links the repository's scripts, examples and DeepSpeed configs, and gets its data
from ``tools/pipeline.sh``'s ``prepare_data runs/demo`` (the stage of ``make demo`` that writes
``runs/demo/data`` and ``runs/demo/tokenizer``), so the tiny configs are checked against the
paths the demo really writes. Training commands get ``--set train.max_steps=4`` appended (fast
variant, otherwise as documented). A command that cannot run here must be listed in
``NOT_ON_CPU`` with the reason, so a new README command is either run or explained.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from train_fixtures import VENV_BIN, env
from testpaths import REPO

pytestmark = pytest.mark.slow

ROOT = REPO
FAST = ["--set", "train.max_steps=4"]

NOT_ON_CPU = {  # regex on the command -> why it is not run here
    r"^make (demo|test)$": "make demo is tests/integration/tools/test_demo.py (tools/demo.sh); make test is this suite",
    r"--input HuggingFaceFW/": "streams FineWeb-Edu from the hub (network, hours)",
    r"^(deepspeed|torchrun) .*examples/llama_4x5\.yaml": "paper scale: a 1B-parameter model on 8+ GPUs",
    r"(hf|runs)/llama_4x5": "needs the paper-scale checkpoint",
    r"^(mkdir -p logs && )?sbatch ": "needs SLURM",
    r"^(deepspeed|torchrun) .*parallel\.tensor_model_parallel_size=2": "tensor parallelism: a paper-scale model on 8 GPUs",
    r"^source \.venv/bin/activate && export OMP_NUM_THREADS=1$": "the environment this suite already runs in",
    r"^python tools/bench\.py --help$": "tests/integration/docs/test_docs.py runs --help of every README script",
}


def readme_commands() -> list[str]:
    """The README's bash commands, continuation lines joined, comments dropped, in order, unique."""
    text = (ROOT / "README.md").read_text()
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(re.sub(r"(^|\s)#.*$", "", line).split())
            if line and line not in commands:
                commands.append(line)
    return commands


def _runnable(command: str) -> bool:
    return not any(re.search(pattern, command) for pattern in NOT_ON_CPU)


def test_every_readme_command_is_run_or_explained():
    commands = readme_commands()
    assert len(commands) >= 15
    runnable = [c for c in commands if _runnable(c)]
    assert all(c.startswith(("python pretrain_loop.py", "python tools/")) for c in runnable), runnable
    assert {"python pretrain_loop.py --config examples/tiny_2x3.yaml",
            "python pretrain_loop.py --config examples/tiny_2x3.yaml --dry-run"} <= set(runnable)


def _sandbox(root: Path) -> Path:
    for name in ("pretrain_loop.py", "tools", "examples", "deepspeed_configs"):
        (root / name).symlink_to(ROOT / name)
    e = dict(env(), PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(["bash", "-c", "source tools/pipeline.sh && prepare_data runs/demo"], cwd=root, env=e,
                         capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    # README step 1 (FineWeb-Edu) stands in as the demo corpus under the paper config's prefix names.
    (root / "data").mkdir()
    for ours, theirs in (("corpus", "fineweb_edu_llama"), ("corpus_valid", "fineweb_edu_llama_valid")):
        for ext in (".bin", ".idx"):
            (root / "data" / f"{theirs}{ext}").symlink_to(root / "runs" / "demo" / "data" / f"{ours}{ext}")
    return root


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    args = shlex.split(command)
    assert args[0] == "python"
    if args[1] == "pretrain_loop.py" and "--dry-run" not in args:
        args += FAST
    return subprocess.run([str(VENV_BIN / "python"), *args[1:]], cwd=cwd, env=env(), capture_output=True, text=True,
                          timeout=400)


@pytest.fixture(scope="module")
def readme_runs(tmp_path_factory):
    root = _sandbox(tmp_path_factory.mktemp("readme"))
    runnable = [c for c in readme_commands() if _runnable(c)]
    # every tiny config, not only those the README names, reads the demo's files (checked by --dry-run)
    runnable += [f"python pretrain_loop.py --config examples/{p.name} --dry-run"
                 for p in sorted((ROOT / "examples").glob("tiny_*.yaml"))
                 if f"python pretrain_loop.py --config examples/{p.name} --dry-run" not in runnable]
    # pretrain_loop.py commands are independent; the tools read what they wrote (the sweep: the export).
    stages = [[c for c in runnable if "pretrain_loop.py" in c],
              [c for c in runnable if "pretrain_loop.py" not in c and "eval_loops.py" not in c],
              [c for c in runnable if "eval_loops.py" in c]]
    results = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for stage in stages:
            results.update(zip(stage, pool.map(lambda c: _run(c, root), stage)))
    return root, results


def test_readme_commands_run_on_cpu_after_the_demo_data(readme_runs):
    root, results = readme_runs
    for command, result in results.items():
        assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    dry = json.loads(results["python pretrain_loop.py --config examples/tiny_2x3.yaml --dry-run --json"].stdout)
    assert dry["train_prefixes"] == [str(root / "runs/demo/data/corpus")] and dry["train_steps"] == 300
    assert dry["tokenizer"] == str(root / "runs/demo/tokenizer")
    # the plain dry run: the start-up statement training prints, for a person
    human = results["python pretrain_loop.py --config examples/tiny_2x3.yaml --dry-run"].stdout.splitlines()
    assert human[0].startswith("model: LoopLM tiny-llama 0+2x3+0 (L(K) = 6") and human[1].startswith(
        "plan: 614,400 tokens = 300 steps x 16 sequences x 128 tokens") and human[2].startswith("parallel: TP 1 x DP 1")
    assert human[-1] == "nothing written; --json prints these numbers as one JSON line"
    paper = next(r.stdout for c, r in results.items() if "llama_4x5.yaml --dry-run" in c)
    assert "516,699,648 parameters" in paper and "global batch 1824 = micro 38 x accumulation 6 x DP 8" in paper

    train = results["python pretrain_loop.py --config examples/tiny_2x3.yaml"]
    step_line = re.search(r"^step 4/4 \| loss \d+\.\d{4} \| lr .* \| grad norm .* tok/s \| mem .*$", train.stderr, re.M)
    assert step_line and "MFU" not in step_line.group(0)  # CPU: no known peak, no MFU (README "Logging")
    assert re.search(r"^validation at step 4 \| loss r=1 \S+ \| r=3 \S+ \| r=6 \S+$", train.stderr, re.M)
    assert "training finished at step 4/4" in train.stderr
    # the run config next to the checkpoint names its files absolutely (tools work from anywhere)
    run_cfg = json.loads((root / "runs/tiny_2x3/checkpoints/looplm_config.json").read_text())
    assert run_cfg["data"]["tokenizer"] == str(root / "runs/demo/tokenizer")
    assert all(Path(p).is_absolute() for p in run_cfg["data"]["train_prefixes"] + run_cfg["data"]["valid_prefixes"])
    assert (root / "runs/tiny_2x3/hf/config.json").is_file()
    assert (root / "runs/tiny_2x3/hf/tokenizer.json").is_file()
    assert (root / "runs/tiny_2x3/curves.png").read_bytes()[:4] == b"\x89PNG"
    # step 4 offline (this suite runs with HF_HUB_OFFLINE=1): the bundled tasks on the demo's data
    sweep = json.loads((root / "runs/tiny_2x3/eval/results.json").read_text())
    assert set(sweep["tasks"]) == {"facts", "clutrr", "proofwriter", "bbh"} and sweep["loops"] == [1, 2, 3, 4, 5, 6]
    # the probe's sample sized to the run: its train.seq_length, the 8 windows asked for
    probe = json.loads((root / "runs/tiny_2x3/probe/geometry.json").read_text())["sampling"]
    assert (probe["seq_length"], probe["num_sequences"]) == (128, 8)
