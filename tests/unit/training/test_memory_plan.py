"""``training/memory_plan.py``: what a training step holds per rank, from the config, and the refusal of a
plan its device cannot hold (issue 44 case 6, issue 43: ``model.hidden_size=1000000``, 5.45B parameters,
passed on a 24 GiB host and was killed by the OOM killer 87 s later). The optimizer-state figure is
checked against a real DeepSpeed engine in tests/integration/training/test_zero_engine.py."""

from __future__ import annotations

import pytest

from megatron_loop.config import config_from_dict
from megatron_loop.errors import LoopConfigError
from megatron_loop.flops import block_matmul_params
from megatron_loop.model.loss_chunk import DEFAULT_CHUNK_TOKENS
from megatron_loop.model.recompute import GIB, FULL, NONE, loop_memory, predicted_peak, schedule_loops
from megatron_loop.plan import count_parameters
from megatron_loop.training import memory_plan
from megatron_loop.training.memory_plan import check_fits_device, dry_run_memory, rank_memory

TINY = {"backbone": "tiny-llama", "core_layers": 2, "train_loops": 3, "vocab_size": 640}
TRAIN = {"seq_length": 32, "micro_batch_size": 2, "global_batch_size": 8}


def _cfg(model=None, train=None, **sections):
    return config_from_dict({"model": {**TINY, **(model or {})}, "train": {**TRAIN, **(train or {})}, **sections})


@pytest.mark.parametrize("stage, dp, bf16", [(0, 1, False), (1, 4, False), (1, 4, True), (2, 4, True), (3, 4, True)])
def test_the_training_state_per_rank_follows_the_zero_stage(stage, dp, bf16):
    cfg = _cfg()
    p = count_parameters(cfg.model).total
    muon = cfg.model.physical_depth * block_matmul_params(cfg.model)
    w = 2 if bf16 else 4
    got = rank_memory(cfg, dp, stage, bf16)
    assert got["weights"] == p * w // (dp if stage == 3 else 1)
    assert got["gradients"] == p * w // (dp if stage >= 2 else 1)
    assert got["master_weights"] == (4 * p // dp if stage >= 1 else 0)
    assert got["optimizer_state"] == 4 * (muon + 2 * (p - muon)) // (dp if stage >= 1 else 1)
    assert got["total"] == sum(got[k] for k in memory_plan.PARTS)


def test_adamw_only_keeps_two_moments_of_every_parameter():
    cfg = _cfg(train={"optimizer": "adamw"})
    assert rank_memory(cfg, 1, 1, False)["optimizer_state"] == 8 * count_parameters(cfg.model).total


@pytest.mark.parametrize("mode", ["none", "per_loop", "selective"])
def test_the_activation_term_is_the_recompute_memory_model(mode):
    """The activations are model/recompute.py's memory model of the plan (not a second one)."""
    cfg = _cfg(model={"recompute": mode})
    memory = loop_memory(cfg.model, 2, 32, 4, DEFAULT_CHUNK_TOKENS)
    kinds = {"none": (NONE,) * 3, "per_loop": (FULL, FULL, NONE), "selective": ("selective", "selective", NONE)}[mode]
    assert rank_memory(cfg, 1, 1, False)["activations"] == predicted_peak(kinds, memory)


def test_auto_plans_against_the_memory_the_state_leaves_and_backprop_loops_cut_the_graph():
    cfg = _cfg(model={"recompute": "auto"})
    memory = loop_memory(cfg.model, 2, 32, 4, DEFAULT_CHUNK_TOKENS)
    least = schedule_loops(3, memory, 0, 0.5)
    assert rank_memory(cfg, 1, 1, False)["activations"] == least.peak_bytes  # the dry run: its least memory
    assert rank_memory(cfg, 1, 1, False, activation_budget=None)["activations"] == predicted_peak((NONE,) * 3, memory)
    truncated = _cfg(model={"recompute": "none", "initial_injection": "dense"},
                     train={"loop_sampling": "uniform", "backprop_loops": 2, "loop_sampling_min": 1})
    assert memory_plan.graphed_loops(truncated) == 2  # draws up to 2K - 1 = 5 loops, 2 with a graph


def test_a_five_billion_parameter_model_is_refused_before_anything_is_built(monkeypatch):
    """The issue's case: 5.45B parameters on a 24 GiB host (one line naming every figure)."""
    cfg = _cfg(model={"hidden_size": 1_000_000, "vocab_size": 2048})  # examples/tiny_2x3.yaml's vocabulary
    monkeypatch.setattr(memory_plan, "host_memory_bytes", lambda: 24 * GIB)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(LoopConfigError) as e:
        check_fits_device(cfg, 1, 1, False, cuda=False)
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith("model.vocab_size=2048, hidden_size=1000000, 2 blocks (5,445,000,000 parameters) with "
                           "train.micro_batch_size=2 x seq_length=32 needs about "), line
    assert "weights 20.3 GiB (fp32), gradients 20.3 GiB, fp32 master weights 20.3 GiB, optimizer state " in line
    assert "(Muon momentum + AdamW moments; ZeRO 1 over 1 data-parallel ranks), activations " in line
    assert line.endswith("more than this host's 24.0 GiB of memory (1 rank on it); expected a smaller model or "
                         "micro-batch, more data-parallel ranks with ZeRO 2/3, more tensor-parallel ranks, or "
                         "activation recomputation (model.recompute)"), line
    # a plan that fits goes through and says what it needs
    assert check_fits_device(_cfg(), 1, 1, False, cuda=False)["total"] < GIB


def test_on_cpu_the_ranks_of_a_host_share_its_memory_and_on_gpu_each_has_its_device(monkeypatch):
    cfg = _cfg()
    need = rank_memory(cfg, 2, 1, False, activation_budget=None)["total"]
    monkeypatch.setattr(memory_plan, "host_memory_bytes", lambda: int(need * 1.5))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(LoopConfigError, match=r"more than this host's .* of memory \(2 ranks on it\)"):
        check_fits_device(cfg, 2, 1, False, cuda=False)
    assert check_fits_device(cfg, 2, 1, False, cuda=True, device_bytes=int(need * 1.5))["total"] == need
    with pytest.raises(LoopConfigError, match=r"more than one GPU's "):
        check_fits_device(cfg, 2, 1, False, cuda=True, device_bytes=need // 2)


def test_auto_recompute_on_a_gpu_plans_within_what_the_state_leaves():
    """On a GPU ``auto`` recomputes what it must (model/recompute.py's planner against the device
    minus the state), so a step that fits with recomputation is not refused; on CPU it plans no
    recomputation without a budget, so the same step is refused there, saying how to plan one."""
    cfg = _cfg(model={"recompute": "auto"}, train={"micro_batch_size": 8, "global_batch_size": 8})
    state = rank_memory(cfg, 1, 1, False, activation_budget=None)
    least = rank_memory(cfg, 1, 1, False)  # the least memory auto can plan
    device = state["total"] - state["activations"] + (least["activations"] + state["activations"]) // 2
    fits = check_fits_device(cfg, 1, 1, False, cuda=True, device_bytes=device)
    assert least["activations"] <= fits["activations"] < state["activations"] and fits["total"] <= device
    import megatron_loop.training.memory_plan as mp

    original = mp.host_memory_bytes
    try:
        mp.host_memory_bytes = lambda: device
        with pytest.raises(LoopConfigError, match=r"; with recompute auto off CUDA set "
                                                  r"model\.recompute_budget_gib to plan recomputation$"):
            check_fits_device(cfg, 1, 1, False, cuda=False)
    finally:
        mp.host_memory_bytes = original


def test_the_dry_run_reports_the_figures_and_warns_instead_of_refusing(monkeypatch):
    """The dry run does not know where the run will train (a paper config planned on a login node):
    a plan this host's CPU could not train is a warning naming the figures, not a refusal."""
    monkeypatch.setattr(memory_plan, "host_memory_bytes", lambda: 24 * GIB)
    need, warnings = dry_run_memory(_cfg(model={"hidden_size": 1_000_000}), 1, 1, "fp32")
    assert need["total"] > 24 * GIB and len(warnings) == 1
    assert warnings[0].startswith("warning: model.vocab_size=640, hidden_size=1000000") and warnings[0].endswith(
        f"more than this host's 24.0 GiB of memory: training refuses it on this host's CPU; on GPUs it needs "
        f"{need['total'] / GIB:,.1f} GiB per device")
    assert dry_run_memory(_cfg(), 1, 1, "auto")[1] == []
