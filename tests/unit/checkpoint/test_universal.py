"""``checkpoint/universal.py``: a ZeRO 1/2 checkpoint rewritten in DeepSpeed's universal layout, per
parameter, with every per-element optimizer state (Muon's momentum included). Here on two ranks' shards
written in DeepSpeed's own layout by the test (its constants, its ``fragment_address``), so the
reassembled tensors are known exactly; a real run resumed on another data-parallel size through it:
tests/integration/training/test_checkpoint_format.py."""

from __future__ import annotations

import pytest
import torch

from megatron_loop.checkpoint.universal import MODEL_STATES, optimizer_shards, to_universal
from megatron_loop.checkpoint.weights import safe_load
from megatron_loop.errors import LoopDataError


def test_shards_in_data_parallel_rank_order(tmp_path):
    for name in ("zero_pp_rank_10_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt",
                 "zero_pp_rank_0_mp_rank_00_optim_states.pt", MODEL_STATES, "zero_pp_rank_1_mp_rank_01_optim_states.pt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in optimizer_shards(tmp_path)] == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt",
        "zero_pp_rank_10_mp_rank_00_optim_states.pt"]  # 10 after 2: by rank, not by name


def test_a_folder_without_zero_shards_is_refused(tmp_path):
    (tmp_path / MODEL_STATES).write_bytes(b"")
    with pytest.raises(LoopDataError) as err:
        to_universal(tmp_path, tmp_path / "out")
    assert str(err.value) == (f"{tmp_path}: no ZeRO 1/2 optimizer shards or {MODEL_STATES}; only ZeRO 1/2 "
                              "checkpoints convert to DeepSpeed's universal layout")


def _write_two_rank_checkpoint(tag_dir, weights, momentum):
    from deepspeed.checkpoint import (BASE_OPTIMIZER_STATE, OPTIMIZER_STATE_DICT, PARAM_GROUPS, PARAM_SHAPES,
                                      PARAM_SLICE_MAPPINGS, SINGLE_PARTITION_OF_FP32_GROUPS)
    from deepspeed.utils.tensor_fragment import fragment_address

    tag_dir.mkdir(parents=True)
    torch.save({PARAM_SHAPES: [{n: w.shape for n, w in weights.items()}], "module": {}}, tag_dir / MODEL_STATES)
    flat_w = torch.cat([w.flatten() for w in weights.values()])
    flat_m = torch.cat([m.flatten() for m in momentum.values()])
    half = flat_w.numel() // 2  # rank 0 holds the first half of the flat group, rank 1 the second
    offsets, start = {}, 0
    for n, w in weights.items():
        offsets[n] = (start, start + w.numel())
        start += w.numel()
    for rank, (lo, hi) in enumerate(((0, half), (half, flat_w.numel()))):
        mapping = {n: fragment_address(numel=min(b, hi) - max(a, lo), start=max(a, lo) - lo)
                   for n, (a, b) in offsets.items() if min(b, hi) > max(a, lo)}
        optim = {SINGLE_PARTITION_OF_FP32_GROUPS: [flat_w[lo:hi].clone()], PARAM_SLICE_MAPPINGS: [mapping],
                 BASE_OPTIMIZER_STATE: {"state": {0: {"momentum_buffer": flat_m[lo:hi].clone(),
                                                      "step": torch.tensor(7.0)}},
                                        PARAM_GROUPS: [{"lr": 0.01, "params": [0]}]},
                 "zero_stage": 1, "loss_scaler": None}
        torch.save({OPTIMIZER_STATE_DICT: optim}, tag_dir / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")


def test_fragments_are_reassembled_per_parameter_with_muon_momentum(tmp_path):
    gen = torch.Generator().manual_seed(0)
    weights = {"a.weight": torch.randn(3, 4, generator=gen), "b.bias": torch.randn(5, generator=gen)}  # 17: split 8 | 9
    momentum = {n: torch.randn(w.shape, generator=gen) for n, w in weights.items()}
    tag = tmp_path / "ckpt" / "global_step7"
    _write_two_rank_checkpoint(tag, weights, momentum)
    out = to_universal(tag, tmp_path / "universal")
    assert out == tmp_path / "universal" / "global_step7"
    for name, w in weights.items():
        folder = out / "zero" / name
        assert sorted(p.name for p in folder.iterdir()) == ["fp32.pt", "momentum_buffer.pt", "step.pt"]
        fp32, mom = safe_load(folder / "fp32.pt"), safe_load(folder / "momentum_buffer.pt")
        assert torch.equal(fp32["param"], w) and fp32["cat_dim"] == 0
        assert torch.equal(mom["param"], momentum[name])  # the state DeepSpeed's converter drops (no exp_avg)
        assert safe_load(folder / "step.pt").item() == 7.0
    common = safe_load(out / "zero" / "optimizer_state.pt")
    assert common["param_groups"] == [{"lr": 0.01, "params": [0]}] and common["zero_stage"] == 1
    assert "base_optimizer_state" not in common and "single_partition_of_fp32_groups" not in common
    assert (out / MODEL_STATES).read_bytes() == (tag / MODEL_STATES).read_bytes()
