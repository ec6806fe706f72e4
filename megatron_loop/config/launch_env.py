"""The environment variables a launcher sets and a run reads, read in one place and checked before
anything is built or written.

torchrun / deepspeed export ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``
(torchrun also ``TORCHELASTIC_RESTART_COUNT``); a bare ``srun`` gives ``SLURM_NTASKS``,
``SLURM_PROCID``, ``SLURM_LOCALID`` (:func:`megatron_loop.parallel.bootstrap.init_world` maps them
onto torch's). A value that is not a number (``WORLD_SIZE=abc``), or out of its range, is one
error line naming the variable instead of a traceback from ``int()`` inside the process-group start.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from megatron_loop.errors import LoopConfigError

# name -> (smallest value, largest value or None, what it is)
LAUNCH_VARIABLES: dict[str, tuple[int, int | None, str]] = {
    "WORLD_SIZE": (1, None, "the number of ranks the launcher started"),
    "RANK": (0, None, "this process's rank, 0 .. WORLD_SIZE - 1"),
    "LOCAL_RANK": (0, None, "this process's rank on its node"),
    "MASTER_PORT": (1, 65535, "the TCP port of the rendezvous"),
    "TORCHELASTIC_RESTART_COUNT": (0, None, "torchrun's restart attempt"),
    "SLURM_NTASKS": (1, None, "the number of SLURM tasks"),
    "SLURM_PROCID": (0, None, "this task's rank, 0 .. SLURM_NTASKS - 1"),
    "SLURM_LOCALID": (0, None, "this task's rank on its node"),
}


def env_int(name: str, default: int | None = None, environ: Mapping[str, str] | None = None) -> int | None:
    """The integer value of launch variable ``name`` (``default`` when it is not set)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(name)
    if raw is None:
        return default
    low, high, what = LAUNCH_VARIABLES[name]
    bounds = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    # plain decimal digits: int() would also take "1_0", " ٣ " or "+1", which no launcher writes
    value = int(raw) if re.fullmatch(r"\s*[0-9]+\s*", raw) else None
    if value is None or value < low or (high is not None and value > high):
        raise LoopConfigError(f"environment variable {name}={raw!r}: expected {bounds} ({what})")
    return value


def launch_world_size(environ: Mapping[str, str] | None = None) -> int:
    """The world a launcher started: ``WORLD_SIZE`` (torchrun, deepspeed), else ``SLURM_NTASKS`` (a bare
    ``srun``), else 1 (plain python); every launch variable checked first (:func:`check_launch_env`)."""
    check_launch_env(environ)
    world = env_int("WORLD_SIZE", environ=environ)
    return world if world is not None else env_int("SLURM_NTASKS", 1, environ)


def check_launch_env(environ: Mapping[str, str] | None = None) -> None:
    """Every launch variable that is set is an integer in its range, each rank is inside its world, and a rank
    comes with the rest of its launcher's variables (torch's env:// rendezvous fails without them)."""
    environ = os.environ if environ is None else environ
    values = {name: env_int(name, environ=environ) for name in LAUNCH_VARIABLES}
    if values["RANK"] is not None:
        missing = [name for name in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not environ.get(name)]
        if missing:
            raise LoopConfigError(f"environment variable RANK={values['RANK']} without {', '.join(missing)}: expected "
                                  "WORLD_SIZE, MASTER_ADDR and MASTER_PORT with it (torchrun and deepspeed set all "
                                  "four; plain python needs none)")
    elif (values["SLURM_NTASKS"] or 1) > 1 and values["SLURM_PROCID"] is None:
        raise LoopConfigError(f"environment variable SLURM_NTASKS={values['SLURM_NTASKS']} without SLURM_PROCID: "
                              "expected both (srun sets them), or a launcher's RANK and WORLD_SIZE")
    for rank, world in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                        ("SLURM_LOCALID", "SLURM_NTASKS")):
        if values[rank] is not None and values[world] is not None and values[rank] >= values[world]:
            raise LoopConfigError(f"environment variable {rank}={values[rank]}: expected a rank below "
                                  f"{world}={values[world]} (ranks count from 0)")
