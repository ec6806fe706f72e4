"""The training run's place in the world and the few collectives the loop needs.

The same entry point runs under ``deepspeed`` (single or multi-node, hostfile), ``torchrun``,
SLURM ``srun`` without a launcher, and plain ``python`` (a world of one); the process groups are
made by :mod:`megatron_loop.parallel.bootstrap` (the one place that creates them).

Every collective waits at most ``train.collective_timeout_s`` (default 600 s, as Megatron-LM's
10 minutes; DeepSpeed's default is 30 minutes): a rank that stopped or hung makes the others
fail with one clear error instead of blocking the allocation. Ranks also watch the launcher
processes above them (:func:`launcher_processes`) so that a launcher that dies does not leave
them training unattended.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from megatron_loop.config.launch_env import env_int
from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.parallel.bootstrap import init_world


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(timeout_s: float | None = None) -> DistInfo:
    """The launcher's world (:func:`megatron_loop.parallel.bootstrap.init_world`, idempotent) and this
    process's place in it; ``timeout_s`` bounds every collective (``train.collective_timeout_s``)."""
    init_world(timeout_s)
    return DistInfo(dist.get_rank(), dist.get_world_size(), env_int("LOCAL_RANK", 0))


def _comm_device() -> torch.device:
    # nccl only reduces CUDA tensors; gloo only CPU ones.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_max(values: list[float]) -> list[float]:
    """Element-wise maximum over ranks (flags: any rank set it)."""
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def all_reduce_mean(values: list[float]) -> list[float]:
    """Element-wise mean over ranks (losses of data-parallel shards)."""
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return (t / dist.get_world_size()).tolist()


def broadcast_object(obj, src: int = 0):
    """Rank ``src``'s Python object on every rank (rank 0 decides, everyone follows)."""
    box = [obj]
    dist.broadcast_object_list(box, src=src, device=_comm_device())
    return box[0]


def all_gather_object(obj) -> list:
    """Every rank's Python object, in rank order, on every rank (each rank tells the others)."""
    box = [None] * dist.get_world_size()
    dist.all_gather_object(box, obj)
    return box


def barrier() -> None:
    dist.barrier()


def on_main(info: DistInfo, fn, share: bool = False):
    """Run ``fn`` on rank 0 only; every rank raises its config/data error, or gets its result
    (``share``; else rank 0 gets it and the others None). Rank 0 decides, everyone follows."""
    kinds = {"LoopConfigError": LoopConfigError, "LoopDataError": LoopDataError}
    result, error, unexpected = None, None, None
    if info.is_main:
        try:
            result = fn()
        except (LoopConfigError, LoopDataError) as e:
            error = (type(e).__name__, str(e))
        except Exception as e:  # the others must not wait for rank 0 until the collective timeout
            unexpected, error = e, ("RuntimeError", f"rank 0 failed: {type(e).__name__}: {e}")
    error, shared = broadcast_object((error, result if share else None))
    if unexpected is not None:
        raise unexpected
    if error is not None:
        raise kinds.get(error[0], RuntimeError)(error[1])
    return shared if share else result


# ----------------------------------------------------------------------------- launchers

# How a launcher process shows in its command line: torchrun's agent, DeepSpeed's per-node
# launch.py and the ``deepspeed`` runner above it.
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher.launch",
                     "deepspeed.launcher.runner")
_LAUNCHER_SCRIPTS = ("torchrun", "deepspeed")


def _is_launcher(cmdline: list[str]) -> bool:
    for i, arg in enumerate(cmdline[:4]):
        if os.path.basename(arg) in _LAUNCHER_SCRIPTS:
            return True
        if arg == "-m" and i + 1 < len(cmdline) and cmdline[i + 1] in _LAUNCHER_MODULES:
            return True
    return False


def launcher_processes() -> list:
    """The launcher processes above this rank (psutil handles, nearest first): the chain of
    ancestors whose command line is torchrun, DeepSpeed's launch.py or the ``deepspeed`` runner.
    Empty under plain ``python`` and bare ``srun`` (the parent is a shell or slurmstepd).

    A launcher that dies without taking its ranks along (torchrun on SIGUSR1 or ``kill -9``, the
    ``deepspeed`` runner on SIGTERM, which does not forward it to launch.py) is noticed through
    ``psutil.Process.is_running``, which also guards against a reused pid."""
    try:
        import psutil

        chain = []
        proc = psutil.Process().parent()
        while proc is not None and _is_launcher(proc.cmdline()):
            chain.append(proc)
            proc = proc.parent()
        return chain
    except Exception as e:  # psutil missing, or /proc unreadable: the watch is a safety net only
        print(f"warning: cannot watch the launcher processes ({type(e).__name__}: {e})", file=sys.stderr)
        return []


def launcher_gone(launchers: list) -> bool:
    """A launcher that exited (a zombie its parent has not reaped yet counts as exited)."""
    import psutil

    for proc in launchers:
        try:
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
    return False


# ----------------------------------------------------------------------------- collective failures


def collective_failure(error: BaseException, timeout_s: float | None, started: bool = True) -> str | None:
    """A one-line explanation when ``error`` is a collective that timed out or lost a peer
    (``started``: after the ranks had met; before, it is the start-up rendezvous)."""
    text = str(error)
    seen = text.strip().splitlines()[0][:300] if text.strip() else type(error).__name__
    if "Connection refused" in text or "ECONNREFUSED" in text:  # checked first: such errors also say "timeout"
        return (f"a rank could not connect to another rank (connection refused: no process listening there, "
                f"e.g. a rank that exited, or an old address after a torchrun restart; seen: {seen})")
    # gloo: "Timed out waiting ...", "Application timeout caused pair closure" (a peer's own
    # timeout closed the connection while this rank waited on it)
    if any(s in text for s in ("Timed out", "timed out", "Timeout", "wait timeout", "timeout caused pair closure",
                               "Connect timeout")):
        if not started:
            return (f"the ranks did not all start within train.collective_timeout_s={timeout_s:g} s (a rank "
                    f"failed, or started much later than the others; seen: {seen})")
        return (f"a collective operation did not complete within train.collective_timeout_s={timeout_s:g} s: "
                "another rank stopped, hung or died")
    if "Connection closed by peer" in text or "Connection reset by peer" in text or "Broken pipe" in text:
        return "another rank exited in the middle of a collective operation (connection closed by peer)"
    return None
