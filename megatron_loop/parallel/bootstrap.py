"""The one place that creates process groups and picks rendezvous ports.

Everything else reads the groups that exist (:mod:`megatron_loop.model.placement`); nothing under
``model/`` creates one (``tests/unit/test_import_layers.py`` keeps it so). Three entry points:

* :func:`init_world` -- the launcher's world (``deepspeed``, ``torchrun``, bare SLURM ``srun``; plain
  ``python`` becomes a world of one on a free local port) through DeepSpeed, which picks the backend
  (nccl on GPU, gloo on CPU). ``timeout_s`` (``train.collective_timeout_s``) bounds every collective
  of the world group and of DeepSpeed's clone of it. Under ``torchrun`` each attempt (``--max-restarts``)
  rendezvous in its own namespace of torchrun's store, so that a restarted job starts afresh.
* :func:`init_model_parallel` -- megatron-core's tensor- and data-parallel groups over that world,
  bounded by the same timeout (megatron-core's default is 30 minutes).
* :func:`ensure_groups` -- megatron-core's groups for a process outside a launcher that needs them (a test
  of megatron-core's own attention, a single-process engine): the world that exists, or a one-process gloo
  world over an in-memory store, and megatron-core's groups (TP = 1 unless built already). Building a model
  needs none: :func:`megatron_loop.model.build_model` creates no group and reads none.

megatron-core orders ranks TP-fastest: with world size W and TP size N, ranks ``[k N, (k + 1) N)``
form TP group k and ranks ``{j, j + N, j + 2N, ...}`` form DP group j. Launchers number the ranks of
one node consecutively, so with N dividing the GPUs per node every TP group is inside a node (its
all-reduces stay on NVLink) and only the data-parallel gradient reduction crosses nodes.
"""

from __future__ import annotations

import os
import socket
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from megatron_loop.config.launch_env import check_launch_env, env_int
from megatron_loop.errors import LoopConfigError
from megatron_loop.parallel.cpu import make_megatron_collectives_cpu_capable
from megatron_loop.model.placement import ParallelPlacement, current_placement

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state


def free_port() -> int:
    """A free TCP port on the loopback interface (rendezvous of single-node runs and tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _adopt_slurm_env() -> None:
    """Bare ``srun python pretrain_loop.py``: map SLURM's task ids onto torch's env variables."""
    if "RANK" in os.environ or env_int("SLURM_NTASKS", 1) <= 1:
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


def _init_torchrun_attempt(timeout: timedelta) -> None:
    """The world of one torchrun attempt (``--max-restarts``: after a rank failed, torchrun starts
    every rank again on the same MASTER_PORT, whose store -- its own, with static rendezvous --
    still holds the previous attempt's keys: the gloo addresses of ranks that are gone, the counts
    of its group barriers; the new ranks read them and connect to dead ports or wait forever). The
    ranks rendezvous through that store under a prefix of this attempt
    (``TORCHELASTIC_RESTART_COUNT``), as ``env://`` would without the prefix; DeepSpeed then finds
    the world initialised. The restarted job resumes from its latest checkpoint (``train.resume``)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE); otherwise rank 0 does
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_store and rank == 0, timeout=timeout)
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    extra = {}
    if torch.cuda.is_available() and world > 1:  # as DeepSpeed binds it (its TorchBackend)
        extra["device_id"] = torch.device("cuda", env_int("LOCAL_RANK", 0))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timeout, rank=rank,
                            world_size=world, store=dist.PrefixStore(f"megatron_loop/attempt_{attempt}", store),
                            **extra)


def _bound_deepspeed_world_group(timeout: timedelta) -> None:
    """ZeRO reduces gradients over DeepSpeed's clone of the world group, which torch's
    ``new_group`` creates with the backend's default timeout (30 minutes for gloo), whatever
    ``init_process_group`` was given. Create that clone here, with our timeout, before DeepSpeed
    does (every rank calls this at the same point, as ``new_group`` requires)."""
    from deepspeed.utils import groups

    if groups._WORLD_GROUP is None:
        groups._WORLD_GROUP = dist.new_group(ranks=list(range(dist.get_world_size())), timeout=timeout)


def init_world(timeout_s: float | None = None) -> None:
    """Initialise torch.distributed through DeepSpeed (idempotent); ``timeout_s`` bounds every
    collective (None keeps DeepSpeed's default)."""
    timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        check_launch_env()  # WORLD_SIZE=abc: one error line naming it, not int()'s traceback
        _adopt_slurm_env()
        _skip_cpu_shm_extension()
        if torch.cuda.is_available():
            # before the first collective: nccl needs each rank on its own GPU (DeepSpeed would only
            # set it when the engine is built, after the resume point is broadcast)
            torch.cuda.set_device(env_int("LOCAL_RANK", 0))
        if "RANK" not in os.environ:  # plain python: a world of one
            os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
        if "TORCHELASTIC_RESTART_COUNT" in os.environ:  # torchrun: this attempt's own rendezvous namespace
            _init_torchrun_attempt(timeout or timedelta(minutes=30))
        import deepspeed

        deepspeed.init_distributed(dist_backend=None, auto_mpi_discovery=False,
                                   **({} if timeout is None else {"timeout": timeout}))
    if timeout is not None:
        _bound_deepspeed_world_group(timeout)


def init_model_parallel(tensor_model_parallel_size: int = 1, sequence_parallel: bool = False,
                        timeout_s: float | None = None) -> ParallelPlacement:
    """megatron-core's model-parallel groups over the world (which :func:`init_world` set up), every
    one bounded by ``timeout_s``; returns this rank's layout.

    Idempotent for the same TP size; a different TP size than the groups already built is refused
    (megatron-core's groups are process-global)."""
    if not dist.is_initialized():
        raise LoopConfigError("tensor parallelism needs torch.distributed initialised first "
                              "(parallel.bootstrap.init_world)")
    world = dist.get_world_size()
    n = tensor_model_parallel_size
    if world % n:
        raise LoopConfigError(f"parallel.tensor_model_parallel_size={n}: expected a divisor of the world size {world}")
    if n > 1:
        make_megatron_collectives_cpu_capable()
    if parallel_state.model_parallel_is_initialized():
        built = parallel_state.get_tensor_model_parallel_world_size()
        if built != n:
            raise LoopConfigError(f"parallel.tensor_model_parallel_size={n}: this process already built "
                                  f"tensor-parallel groups of size {built}")
    else:
        minutes = 30 if timeout_s is None else timeout_s / 60  # a timedelta of these (fractional) minutes
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=n, pipeline_model_parallel_size=1,
                                                     distributed_timeout_minutes=minutes)
    return current_placement(sequence_parallel)


def ensure_groups() -> None:
    """The groups megatron-core's layers need, for a model built outside the training entry point:
    the world that exists (under a launcher every rank calls this while building the model) or a
    one-process gloo world over an in-memory store, and megatron-core's groups (TP = 1 unless some
    were built already)."""
    if not dist.is_initialized():
        if parallel_state.model_parallel_is_initialized():  # groups of a world that is gone: not reusable
            parallel_state.destroy_model_parallel()
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        init_model_parallel(1)


def shutdown_groups() -> None:
    """End the world this process is in: megatron-core's groups, then the default process group. The
    groups go first and together -- megatron-core's ``parallel_state`` would otherwise keep groups of a
    destroyed world as 'initialised', and a later :func:`ensure_groups` in the same process (a CLI run
    through ``main(argv)``, then a model built) would hand layers a group no world has registered."""
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def groups_ready() -> bool:
    """Whether the groups a model is built in exist (:func:`ensure_groups`, :func:`init_model_parallel`)."""
    return dist.is_initialized() and parallel_state.model_parallel_is_initialized()
