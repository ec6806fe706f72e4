"""``parallel/bootstrap.py``, the one place process groups are created: bare ``srun`` maps SLURM's task
ids onto torch's variables; a model is built without any group while ``ensure_groups`` makes a world
of one; ``init_world`` / ``init_model_parallel`` bound every group by the collective timeout (read back
from the groups torch holds); a second TP size in one process is refused; ``ensure_groups`` never
rebuilds. The checks that need a process without any group run in fresh subprocesses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from datetime import timedelta

import pytest
import torch.distributed as dist

from megatron_loop.errors import LoopConfigError
from megatron_loop.parallel import bootstrap
from megatron_loop.parallel.bootstrap import (_adopt_slurm_env, ensure_groups, free_port, groups_ready,
                                              init_model_parallel)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state

pytestmark = pytest.mark.deps  # megatron-core's and DeepSpeed's group APIs (tools/deps.py drift)

TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variables now, and none left behind: setting before deleting makes monkeypatch
    remove at teardown whatever ``_adopt_slurm_env`` writes into os.environ."""
    for key in TORCH_VARS:
        monkeypatch.setenv(key, "placeholder")
        monkeypatch.delenv(key)
    return monkeypatch


# ----------------------------------------------------------------------------- bare srun


def test_srun_task_ids_become_torch_ranks(clean_env):
    clean_env.setenv("SLURM_NTASKS", "16")
    clean_env.setenv("SLURM_PROCID", "9")
    clean_env.setenv("SLURM_LOCALID", "1")
    clean_env.setenv("MASTER_ADDR", "node-001")
    _adopt_slurm_env()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("9", "16", "1")
    assert os.environ["MASTER_PORT"] == "29500"


def test_launcher_variables_win_over_slurm(clean_env):
    clean_env.setenv("SLURM_NTASKS", "16")
    clean_env.setenv("SLURM_PROCID", "9")
    clean_env.setenv("RANK", "3")
    _adopt_slurm_env()
    assert os.environ["RANK"] == "3" and "WORLD_SIZE" not in os.environ


def test_srun_without_master_addr_says_what_to_export(clean_env):
    clean_env.setenv("SLURM_NTASKS", "2")
    clean_env.setenv("SLURM_PROCID", "0")
    # one clear error: line (exit 2) from pretrain_loop.py, not a traceback per rank
    with pytest.raises(LoopConfigError, match=r"^srun without a launcher: MASTER_ADDR is not set; expected it "
                                              r"exported as the first node of the allocation"):
        _adopt_slurm_env()


def test_free_port_is_a_free_loopback_port():
    port = free_port()
    assert 1024 <= port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # nobody holds it


# ----------------------------------------------------------------------------- in this process


def _refuse(*args, **kwargs):
    raise AssertionError("a process group was created again")


def test_ensure_groups_builds_once_and_keeps_the_groups(monkeypatch):
    """A second call creates nothing (creating a world or megatron-core's groups would fail here) and
    keeps the very same group objects."""
    ensure_groups()
    assert groups_ready()
    world, tp, dp = (dist.group.WORLD, parallel_state.get_tensor_model_parallel_group(),
                     parallel_state.get_data_parallel_group())
    monkeypatch.setattr(dist, "init_process_group", _refuse)
    monkeypatch.setattr(parallel_state, "initialize_model_parallel", _refuse)
    ensure_groups()
    assert dist.group.WORLD is world
    assert parallel_state.get_tensor_model_parallel_group() is tp and parallel_state.get_data_parallel_group() is dp
    assert parallel_state.get_tensor_model_parallel_world_size() == 1


def test_init_model_parallel_keeps_the_built_size_and_refuses_another(monkeypatch):
    """The same TP size again returns this rank's place without rebuilding; another size is refused
    (megatron-core's groups are process-global). A world of one is stood in for by a world of two,
    so that size 2 divides it and the refusal is the one about the groups already built."""
    ensure_groups()
    monkeypatch.setattr(parallel_state, "initialize_model_parallel", _refuse)
    placement = init_model_parallel(1)
    assert (placement.tp_size, placement.tp_rank, placement.dp_size, placement.dp_rank) == (1, 0, 1, 0)
    assert not init_model_parallel(1, sequence_parallel=True).sequence_parallel  # SP needs TP > 1
    with pytest.raises(LoopConfigError, match=r"^parallel.tensor_model_parallel_size=3: expected a divisor of the "
                                              r"world size 1$"):
        init_model_parallel(3)
    world_size = dist.get_world_size
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2 if group is None else world_size(group))
    monkeypatch.setattr(bootstrap, "make_megatron_collectives_cpu_capable", lambda: None)
    with pytest.raises(LoopConfigError, match=r"^parallel.tensor_model_parallel_size=2: this process already built "
                                              r"tensor-parallel groups of size 1$"):
        init_model_parallel(2)


def test_the_collective_timeout_reaches_initialize_model_parallel(monkeypatch):
    """``timeout_s`` becomes megatron-core's ``distributed_timeout_minutes`` (fractional minutes);
    None keeps megatron-core's 30 minutes. (The groups holding it: the subprocess tests below.)"""
    ensure_groups()
    calls = []
    monkeypatch.setattr(parallel_state, "model_parallel_is_initialized", lambda: False)
    monkeypatch.setattr(parallel_state, "initialize_model_parallel", lambda **kw: calls.append(kw))
    init_model_parallel(1, timeout_s=90)
    init_model_parallel(1)
    assert [c["distributed_timeout_minutes"] for c in calls] == [1.5, 30]
    assert all(c["tensor_model_parallel_size"] == 1 and c["pipeline_model_parallel_size"] == 1 for c in calls)


def test_init_model_parallel_needs_a_world(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(LoopConfigError, match=r"^tensor parallelism needs torch.distributed initialised first "
                                              r"\(parallel.bootstrap.init_world\)$"):
        init_model_parallel(1)


# ----------------------------------------------------------------------------- in a fresh process

_PRELUDE = """
import json, os, warnings
import torch
import torch.distributed as dist
from megatron_loop.config import build_model_config
from megatron_loop.errors import LoopConfigError
from megatron_loop.parallel import bootstrap
from megatron_loop.model.looplm import LoopLM, build_model
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state as ps

def timeout_s(group):  # what torch's gloo group was created with
    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()

def groups():
    return (dist.group.WORLD, ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group())

cfg = build_model_config(dict(backbone="tiny-llama", core_layers=1, train_loops=2))
out = {}
"""

# Outside a launcher: LoopLM(...) and build_model create nothing; ensure_groups makes a world of one;
# init_world over it bounds DeepSpeed's clone of the world group; megatron-core's groups built again with a
# timeout hold it.
_ENSURE_GROUPS = _PRELUDE + """
out["ready_before"] = bootstrap.groups_ready()
LoopLM(cfg)
build_model(cfg)
out["world_after_build"] = dist.is_initialized()
bootstrap.ensure_groups()
out.update(ready_after=bootstrap.groups_ready(), world=dist.get_world_size(), backend=dist.get_backend(),
           tp=ps.get_tensor_model_parallel_world_size(), launcher_env="RANK" in os.environ,
           default_timeout_s=timeout_s(ps.get_tensor_model_parallel_group()))
world = dist.group.WORLD
bootstrap.init_world(timeout_s=123)
from deepspeed.utils import groups as ds_groups
out.update(same_world=dist.group.WORLD is world, deepspeed_world_timeout_s=timeout_s(ds_groups._WORLD_GROUP))
ps.destroy_model_parallel()
bootstrap.init_model_parallel(1, timeout_s=90)
out["tp_timeout_s"] = timeout_s(ps.get_tensor_model_parallel_group())
out["dp_timeout_s"] = timeout_s(ps.get_data_parallel_group())
print("RESULT " + json.dumps(out))
"""

# Plain `python` (no launcher variables): init_world makes a world of one through DeepSpeed on a free port,
# every group bounded by the timeout; building a model then leaves those groups as they are.
_INIT_WORLD = _PRELUDE + """
bootstrap.init_world(timeout_s=123)
from deepspeed.utils import groups as ds_groups
placement = bootstrap.init_model_parallel(1, timeout_s=90)
before = groups()
build_model(cfg)
out.update(env={k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")},
           port=int(os.environ["MASTER_PORT"]), world=dist.get_world_size(),
           world_timeout_s=timeout_s(dist.group.WORLD), deepspeed_world_timeout_s=timeout_s(ds_groups._WORLD_GROUP),
           tp_timeout_s=timeout_s(ps.get_tensor_model_parallel_group()),
           dp_timeout_s=timeout_s(ps.get_data_parallel_group()),
           placement=[placement.tp_size, placement.dp_size], kept=all(a is b for a, b in zip(before, groups())))
print("RESULT " + json.dumps(out))
"""


def _fresh_process(code: str, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in TORCH_VARS and not k.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_a_model_is_built_without_groups_and_ensure_groups_makes_a_world_of_one(tmp_path):
    got = _fresh_process(_ENSURE_GROUPS, tmp_path)
    assert got["ready_before"] is False
    assert got["world_after_build"] is False  # the model is built plain (tests/unit/model/test_looplm.py)
    assert (got["ready_after"], got["world"], got["backend"], got["tp"]) == (True, 1, "gloo", 1)
    assert got["launcher_env"] is False  # an in-memory store: no rendezvous variables
    assert got["default_timeout_s"] == timedelta(minutes=30).total_seconds()
    assert got["same_world"] is True and got["deepspeed_world_timeout_s"] == 123
    assert got["tp_timeout_s"] == got["dp_timeout_s"] == 90


def test_init_world_outside_a_launcher_bounds_every_group(tmp_path):
    got = _fresh_process(_INIT_WORLD, tmp_path)
    assert got["env"] == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    assert 1024 <= got["port"] < 65536 and got["world"] == 1
    assert got["world_timeout_s"] == got["deepspeed_world_timeout_s"] == 123
    assert got["tp_timeout_s"] == got["dp_timeout_s"] == 90
    assert got["placement"] == [1, 1] and got["kept"] is True  # build_model used the groups init_* made
