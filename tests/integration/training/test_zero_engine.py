"""The GPU path's training step inside DeepSpeed's engine, on CPU (tests/support/perf_scripts/zero_engine.py):
the batch reaches the device without the host waiting, ``auto`` recomputation counts the optimizer
state and gradient buckets the step still allocates, and compiled blocks stay whole graphs under
ZeRO-1 but break apart under ZeRO-3 (why ``compile: auto`` is off there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from testpaths import PERF_SCRIPTS, TESTS

pytestmark = pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)

SCRIPT = PERF_SCRIPTS / "zero_engine.py"


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path_factory.mktemp("zero_engine"))], env=env,
                         capture_output=True, text=True, timeout=600, cwd=TESTS)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_training_step_copies_the_batch_without_waiting(measured):
    """``training.loop.train_step`` (real loaders, ZeRO-1): no host-to-device copy from our code; the
    only reads of ours are the step's loss and gradient norm for the log and torch AdamW's host-side
    step counter. (DeepSpeed's own ``.to(device)`` of its gradient norms is a no-op on GPU, which the
    CPU detector cannot tell from a copy; its sites are not ours to change.)"""
    ours = [s for s in measured["train_step"]["syncs"] if f"{os.sep}megatron_loop{os.sep}" in s]
    assert not [s for s in ours if "host-to-device" in s], ours
    sites = {s.rsplit("(", 1)[-1].rstrip(")") for s in ours}
    assert sites <= {"train_step", "_as_float", "_adamw_step"}, ours


@pytest.mark.parametrize("stage", [1, 3])
def test_auto_recompute_counts_optimizer_state_and_buckets(measured, stage):
    """Before the first step, Muon's momentum and AdamW's two moments (fp32, this rank's partitions)
    are counted as still to come (ZeRO-3 creates them when the engine starts, so they are already
    allocated); after it, nothing. ZeRO-1's gradient bucket: reduce_bucket_size fp32 elements;
    ZeRO-3's prefetched parameters: stage3_prefetch_bucket_size elements."""
    m = measured[f"zero{stage}"]
    state = 4 * (m["muon_numel"] + 2 * m["adamw_numel"])
    assert m["before"]["optimizer_state"] == (state if stage == 1 else 0)
    assert m["after"]["optimizer_state"] == 0
    bucket = m["reduce_bucket_size"] if stage == 1 else m["prefetch_bucket_size"]
    assert m["before"]["buckets"] == m["after"]["buckets"] == 4 * bucket


def test_compiled_block_is_one_graph_under_zero1_and_splits_under_zero3(measured):
    assert measured["zero1"]["graphs"] == 1 and measured["zero1"]["graph_breaks"] == 0
    assert measured["zero3"]["graphs"] > 10 and measured["zero3"]["graph_breaks"] > 0


def test_the_plans_memory_check_counts_the_engines_training_state(measured):
    """training/memory_plan.py counts, from the config alone, what DeepSpeed's ZeRO-1 engine holds on
    one rank after a step: the fp32 weights, Muon's momentum and AdamW's two moments, and the fp32
    master partitions (padded by ZeRO to its alignment: at most a few elements more)."""
    from megatron_loop.config import config_from_dict
    from megatron_loop.training.memory_plan import muon_parameters, rank_memory

    m = measured["zero1"]
    cfg = config_from_dict({"model": {"backbone": "tiny-llama", "core_layers": 1, "train_loops": 2,
                                      "recompute": "none"}})
    need = rank_memory(cfg, 1, 1, False)
    assert muon_parameters(cfg) == m["muon_numel"]
    assert need["weights"] == need["gradients"] == m["param_bytes"]
    assert need["optimizer_state"] == m["optimizer_state_bytes"]
    assert 0 <= m["master_bytes"] - need["master_weights"] <= 4 * 64 and need["master_weights"] == m["param_bytes"]
