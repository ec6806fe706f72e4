"""Launch paths: bare ``srun`` maps SLURM's task ids onto torch's
variables; the multi-node examples are well-formed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from megatron_loop.parallel.bootstrap import _adopt_slurm_env

REPO = Path(__file__).resolve().parents[1]
TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variables now, and none left behind: setting before deleting makes monkeypatch
    remove at teardown whatever ``_adopt_slurm_env`` writes into os.environ."""
    for key in TORCH_VARS:
        monkeypatch.setenv(key, "placeholder")
        monkeypatch.delenv(key)
    return monkeypatch


def test_srun_task_ids_become_torch_ranks(clean_env):
    import os

    clean_env.setenv("SLURM_NTASKS", "16")
    clean_env.setenv("SLURM_PROCID", "9")
    clean_env.setenv("SLURM_LOCALID", "1")
    clean_env.setenv("MASTER_ADDR", "node-001")
    _adopt_slurm_env()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("9", "16", "1")
    assert os.environ["MASTER_PORT"] == "29500"


def test_launcher_variables_win_over_slurm(clean_env):
    import os

    clean_env.setenv("SLURM_NTASKS", "16")
    clean_env.setenv("SLURM_PROCID", "9")
    clean_env.setenv("RANK", "3")
    _adopt_slurm_env()
    assert os.environ["RANK"] == "3" and "WORLD_SIZE" not in os.environ


def test_srun_without_master_addr_says_what_to_export(clean_env):
    clean_env.setenv("SLURM_NTASKS", "2")
    clean_env.setenv("SLURM_PROCID", "0")
    from megatron_loop.errors import LoopConfigError

    # one clear error: line (exit 2) from pretrain_loop.py, not a traceback per rank
    with pytest.raises(LoopConfigError, match=r"^srun without a launcher: MASTER_ADDR is not set; expected it "
                                              r"exported as the first node of the allocation"):
        _adopt_slurm_env()


def test_multinode_examples_are_well_formed():
    hosts = [line.split() for line in (REPO / "examples" / "hostfile").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert hosts and all(len(h) == 2 and h[1].startswith("slots=") for h in hosts)
    sbatch = REPO / "examples" / "slurm_pretrain.sbatch"
    subprocess.run(["bash", "-n", str(sbatch)], check=True)
    text = sbatch.read_text()
    assert "--signal=B:USR1@" in text and "srun" in text and "pretrain_loop.py" in text
