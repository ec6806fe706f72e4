"""Compiled blocks, applied from outside the model (``model/apply.py``): the same outputs and gradients
as eager through AOTAutograd (``aot_eager``: dynamo's graphs, functionalised and split into forward
and backward as inductor receives them), compiled once, no recompilation when r changes, and one
rule for when training compiles."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from megatron_loop import build_model, load_config
from megatron_loop.config import build_model_config
from megatron_loop.errors import LoopConfigError
from megatron_loop.model.recompute import CheckpointingSettings, apply_activation_checkpointing
from megatron_loop.parallel.parallelize import apply_compile, parallelize


def _config(**kw):
    base = dict(backbone="tiny-llama", prelude_layers=1, core_layers=2, coda_layers=1, train_loops=3,
                timestep="branch_gating", activation_checkpointing="none")
    base.update(kw)
    return build_model_config(base)


def _pair(cfg):
    torch.manual_seed(0)
    eager = build_model(cfg)
    compiled = build_model(cfg)
    compiled.load_state_dict(eager.state_dict())
    return eager, compiled


def _compiled_graphs():
    """A backend that counts the graphs dynamo hands it and runs them through AOTAutograd."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    return CompileCounterWithBackend("aot_eager")


def test_compiled_blocks_match_eager_and_never_recompile_across_r():
    eager, compiled = _pair(_config())
    counter = _compiled_graphs()
    apply_compile(compiled, backend=counter)
    x = torch.randint(0, 2048, (2, 16))
    with torch.no_grad():
        for r in (2, 3, 5, 1):
            torch.testing.assert_close(compiled(x, num_loops=r).logits, eager(x, num_loops=r).logits)
            if r == 2:
                # one graph for the prelude/coda blocks (psi=None), one for the modulated core blocks
                graphs = counter.frame_count
                assert graphs == 2, graphs
    assert counter.frame_count == graphs  # r = 3, 5, 1: the same graphs, no recompilation
    stats = torch._dynamo.utils.counters
    assert not stats["graph_break"], dict(stats["graph_break"])


@pytest.mark.parametrize("mode", ["per_loop", "selective", "per_block"])
def test_compiled_training_step_matches_eager_gradients(mode):
    """Checkpointing applied first, compilation second: a compiled block traces its checkpointed
    region (the selective policy included) and the gradients stay those of eager."""
    eager, compiled = _pair(_config(timestep="none"))
    for model in (eager, compiled):
        apply_activation_checkpointing(model, CheckpointingSettings(mode))
    counter = _compiled_graphs()
    apply_compile(compiled, backend=counter)
    x = torch.randint(0, 2048, (2, 16))
    for r in (3, 4):
        losses = [m(x, num_loops=r, labels=x, compute_logits=False).loss for m in (eager, compiled)]
        torch.testing.assert_close(losses[1], losses[0])
        for m, loss in zip((eager, compiled), losses):
            m.zero_grad()
            loss.backward()
        for p_e, p_c in zip(eager.parameters(), compiled.parameters()):
            torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-5, atol=1e-6)
        if r == 3:
            graphs = counter.frame_count
            assert graphs > 0
    assert counter.frame_count == graphs


def test_compile_config_key():
    cfg = load_config("examples/tiny_2x3.yaml", overrides=["model.compile=true"])
    assert cfg.model.compile is True
    model = build_model(cfg.model, device="meta")
    assert all(block._compiled_call_impl is None for block in model.blocks())  # as built: eager
    assert "each block compiled once" in parallelize(model, zero_stage=0)
    assert all(block._compiled_call_impl is not None for block in model.blocks())
    off = build_model(build_model_config(dict(backbone="tiny-llama", compile=False)), device="meta")
    assert parallelize(off, zero_stage=0) == "model.compile=False: off"
    assert all(block._compiled_call_impl is None for block in off.blocks())
    with pytest.raises(LoopConfigError, match="model.compile"):
        build_model_config(dict(backbone="tiny-llama", compile="yes"))


def test_execution_keys_stay_out_of_the_checkpoint_signature():
    """A run may resume with compile, checkpointing or the loss kernel switched (same weights)."""
    from megatron_loop.checkpoint.manifest import model_signature

    a = load_config("examples/tiny_2x3.yaml")
    b = load_config("examples/tiny_2x3.yaml", overrides=[
        "model.compile=true", "model.activation_checkpointing=auto", "model.activation_checkpointing_budget_gib=8",
        "model.loss_implementation=chunked"])
    assert model_signature(a) == model_signature(b)
    assert model_signature(a) != model_signature(load_config("examples/tiny_2x3.yaml",
                                                             overrides=["model.train_loops=4"]))


@pytest.mark.parametrize("cuda", [True, False])
@pytest.mark.parametrize("compile_key", ["auto", True])
def test_when_training_compiles(monkeypatch, compile_key, cuda):
    """``compile: auto`` compiles where CUDA is, except under ZeRO-3, whose compiler-disabled parameter
    hooks split a compiled block into many graphs (measured in tests/perf_scripts/zero_engine.py);
    an explicit ``true`` compiles everywhere and, under ZeRO-3, says what it costs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    cfg = _config(compile=compile_key)
    for stage in (0, 1, 2, 3):
        model = build_model(cfg, device="meta")
        note = parallelize(model, stage)
        compiled = [block._compiled_call_impl is not None for block in model.blocks()]
        if compile_key == "auto" and not cuda:
            assert not any(compiled) and note == "model.compile=auto: off"
        elif compile_key == "auto" and stage == 3:
            assert not any(compiled) and "off under ZeRO-3" in note
        else:
            assert all(compiled) and "each block compiled once" in note
            assert ("ZeRO-3" in note) == (stage == 3)
        assert model.compile_note == note
