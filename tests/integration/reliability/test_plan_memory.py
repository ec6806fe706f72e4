"""A plan its host cannot hold is refused before anything is built (docs/RELIABILITY.md row 65; issue 44
case 6). Before: ``model.hidden_size=1000000`` (5.45B parameters) passed the check on a 24 GiB host
(4 bytes per parameter: 20.3 GiB), built for 87 s and was killed by the kernel's OOM killer (rc 137,
no message; on a shared host it can take other jobs with it). Now training refuses it with one
line naming the figures (weights, gradients, master weights, optimizer state, activations) before
the process group, the lock or the output folder exist; ``--dry-run`` reports the figures and
warns (it does not know where the run will train). The host is made a 24 GiB one here, as in the
issue, so that the outcome does not depend on the machine running the suite."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from megatron_loop.model.recompute import GIB
from testpaths import REPO, load_script
from train_fixtures import tiny_config


@pytest.fixture
def host_of_24_gib(monkeypatch):
    from megatron_loop import plan
    from megatron_loop.training import memory_plan

    for module in (plan, memory_plan):
        monkeypatch.setattr(module, "host_memory_bytes", lambda: 24 * GIB)
    for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK"):
        monkeypatch.delenv(key, raising=False)


def _main(*argv):
    import megatron_loop.training.setup as setup

    main = load_script("pretrain_loop.py").main
    err, out = io.StringIO(), io.StringIO()

    def refuse(*args, **kwargs):
        raise AssertionError("the process group was reached: the check came too late")

    original, setup.distributed.setup_distributed = setup.distributed.setup_distributed, refuse
    try:
        with contextlib.chdir(REPO), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(list(argv))
    finally:
        setup.distributed.setup_distributed = original
    return code, out.getvalue(), err.getvalue()


def test_a_five_billion_parameter_model_is_refused_with_one_line_before_anything_is_built(tmp_path, host_of_24_gib):
    config = tiny_config(tmp_path, train={"output_dir": str(tmp_path / "run")})
    overrides = ["--set", "model.hidden_size=1000000", "--set", "model.vocab_size=2048"]
    code, _, err = _main("--config", str(config), *overrides)
    assert code == 2, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    assert line.startswith("error: model.vocab_size=2048, hidden_size=1000000, 2 blocks (5,445,000,000 parameters)") and \
        " needs about " in line and "more than this host's 24.0 GiB of memory (1 rank on it)" in line, line
    assert "Traceback" not in err and not (tmp_path / "run").exists()

    # reported and warned, not refused
    code, out, err = _main("--config", str(config), *overrides, "--dry-run", "--json")
    assert code == 0, err[-3000:]
    report = json.loads(out)
    assert report["memory_per_rank"]["total"] > 24 * GIB
    assert [x for x in err.splitlines() if x.startswith("warning: model.vocab_size=2048")][0].endswith(
        "training refuses it on this host's CPU; on GPUs it needs "
        f"{report['memory_per_rank']['total'] / GIB:,.1f} GiB per device")
