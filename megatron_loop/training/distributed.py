"""Launcher-agnostic process-group setup and the few collectives the loop needs (issue 5 item 1).

The same entry point runs under ``deepspeed`` (single or multi-node, hostfile), ``torchrun``,
SLURM ``srun`` without a launcher, and plain ``python`` (a world of one). Every launcher but
SLURM exports ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; under bare ``srun`` we translate SLURM's
variables so DeepSpeed's env:// rendezvous finds them. The backend is DeepSpeed's choice for the
accelerator: nccl on GPU, gloo on CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from megatron_loop.errors import LoopConfigError


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _adopt_slurm_env() -> None:
    """Bare ``srun python pretrain_loop.py``: map SLURM's task ids onto torch's env variables."""
    if "RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    os.environ.setdefault("MASTER_PORT", "29500")
    if "MASTER_ADDR" not in os.environ:
        raise LoopConfigError("srun without a launcher: MASTER_ADDR is not set; expected it exported as the first "
                              "node of the allocation (see examples/slurm_pretrain.sbatch)")


def _skip_cpu_shm_extension() -> None:
    """On CPU, DeepSpeed JIT-compiles a shared-memory extension at every process-group start
    (gcc, 30 s to minutes; rebuilt whenever another Python environment used the shared
    torch_extensions cache in between). It only serves ``inference_all_reduce``; training
    collectives go through gloo either way, so we do not build it."""
    if torch.cuda.is_available():
        return
    import importlib

    # (``import deepspeed.comm.torch as m`` would bind the torch package that deepspeed.comm imports)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def setup_distributed() -> DistInfo:
    """Initialise torch.distributed (idempotent) and return this process's place in the world."""
    _adopt_slurm_env()
    _skip_cpu_shm_extension()
    if torch.cuda.is_available():
        # before the first collective: nccl needs each rank on its own GPU (DeepSpeed would only
        # set it when the engine is built, after our resume-point broadcast)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    from megatron_loop.optim import init_distributed  # plain python -> world of one on a free port

    init_distributed()
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


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


def barrier() -> None:
    dist.barrier()
