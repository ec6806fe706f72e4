"""The multi-node launch examples (examples/hostfile for the deepspeed launcher,
examples/slurm_pretrain.sbatch for SLURM) are well-formed."""

from __future__ import annotations

import subprocess

from testpaths import REPO


def test_multinode_examples_are_well_formed():
    hosts = [line.split() for line in (REPO / "examples" / "hostfile").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert hosts and all(len(h) == 2 and h[1].startswith("slots=") for h in hosts)
    sbatch = REPO / "examples" / "slurm_pretrain.sbatch"
    subprocess.run(["bash", "-n", str(sbatch)], check=True)
    text = sbatch.read_text()
    assert "--signal=B:USR1@" in text and "srun" in text and "pretrain_loop.py" in text
