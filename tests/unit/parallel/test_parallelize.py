"""``parallel/parallelize.py``, the one stage that prepares a built model for training: its four steps in
order (TP gradient sum, activation recomputation, compile, ZeRO-3 registration) and the line it
returns; the TP sum only at TP > 1; ZeRO-3's external parameters registered with DeepSpeed.

Compiled blocks: the same outputs and gradients as eager through AOTAutograd (``aot_eager``: dynamo's
graphs, functionalised and split into forward and backward as inductor receives them), compiled once,
no recompilation when r changes, and one rule for when training compiles."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from megatron_loop import build_model, load_config
from megatron_loop.config import build_model_config
from megatron_loop.errors import LoopConfigError
from megatron_loop.model.recompute import RecomputeSettings
from megatron_loop.parallel.parallelize import apply_recompute
from megatron_loop.parallel import parallelize as preparation
from megatron_loop.parallel.bootstrap import ensure_groups
from megatron_loop.model.placement import ParallelPlacement
from megatron_loop.parallel.parallelize import apply_compile, parallelize
from megatron_loop.model.vocab import TensorParallelEdges


def _config(**kw):
    base = dict(backbone="tiny-llama", prelude_layers=1, core_layers=2, coda_layers=1, train_loops=3,
                timestep="branch_gating", recompute="none")
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
    """Recomputation applied first, compilation second: a compiled block traces its recomputed
    region (the selective policy included) and the gradients stay those of eager."""
    eager, compiled = _pair(_config(timestep="none"))
    for model in (eager, compiled):
        apply_recompute(model, RecomputeSettings(mode))
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


@pytest.mark.parametrize("cuda", [True, False])
@pytest.mark.parametrize("compile_key", ["auto", True])
def test_when_training_compiles(monkeypatch, compile_key, cuda):
    """``compile: auto`` compiles where CUDA is, except under ZeRO-3, whose compiler-disabled parameter
    hooks split a compiled block into many graphs (measured in tests/support/perf_scripts/zero_engine.py);
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


# ----------------------------------------------------------------------------- the stage's steps


def test_the_steps_run_in_order_and_zero3_registration_only_at_stage_3(monkeypatch):
    """TP sum, recomputation (as ``model.recompute`` asks), compile when the rule says so,
    ZeRO-3 registration: recomputation before compile, so that a compiled block traces its recomputed
    region (test_compiled_training_step_matches_eager_gradients)."""
    calls = []
    monkeypatch.setattr(preparation, "register_tp_gradient_sum", lambda m: calls.append("tp sum"))
    monkeypatch.setattr(preparation, "apply_recompute",
                        lambda m, settings: calls.append(f"recompute {settings.mode}"))
    monkeypatch.setattr(preparation, "apply_compile", lambda m: calls.append("compile"))
    monkeypatch.setattr(preparation, "register_external_parameters", lambda m: calls.append("zero-3"))
    expected = {(True, 3): ["tp sum", "recompute per_loop", "compile", "zero-3"],
                (True, 1): ["tp sum", "recompute per_loop", "compile"],
                (False, 3): ["tp sum", "recompute per_loop", "zero-3"]}
    for (compile_key, zero), steps in expected.items():
        calls.clear()
        model = build_model(_config(compile=compile_key, recompute="per_loop"), device="meta")
        note = parallelize(model, zero)
        assert calls == steps, (compile_key, zero)
        assert note == preparation.compile_decision(model.config, zero)[1] == model.compile_note


def test_the_tp_gradient_sum_is_registered_only_at_tp_above_1():
    """At TP = 1 no parameter gets a hook; as a rank of a TP = 2 group with sequence parallelism every
    replicated parameter (not the TP shards) gets one (the rule: tests/unit/parallel/test_grads.py)."""
    plain = build_model(_config())
    parallelize(plain, 1)
    assert not any(p._backward_hooks for p in plain.parameters()) and plain.tp_gradient_sum is False
    sharded = build_model(_config())
    ensure_groups()  # the sum's hooks are made for megatron-core's TP group (here: of one rank)
    sharded.tensor_parallel = TensorParallelEdges(ParallelPlacement(tp_size=2, sequence_parallel=True))
    sharded.embed_tokens.weight.tensor_model_parallel = True  # as VocabParallelEmbedding marks it
    sharded.lm_head.weight.tensor_model_parallel = True  # and the vocab-parallel head
    parallelize(sharded, 1)
    hooked = {name for name, p in sharded.named_parameters() if p._backward_hooks}
    replicated = {name for name, p in sharded.named_parameters() if not getattr(p, "tensor_model_parallel", False)}
    assert sharded.tp_gradient_sum is True
    assert hooked == replicated and "norm.weight" in hooked and "core.1.input_layernorm.weight" in hooked
    assert not any(name.endswith(("linear_qkv.weight", "linear_fc1.weight")) for name in hooked)


def test_zero3_registers_the_head_weight_with_deepspeed_as_an_external_parameter():
    """The LM head (here tied: the embedding) is applied by the root's chunked loss, outside its owning
    module: DeepSpeed's ``register_external_parameter`` records it on the root (``_external_params``,
    what ZeRO-3's fetch reads through ``ds_external_parameters``)."""
    tied = build_model(build_model_config(dict(backbone="tiny-qwen", core_layers=1, train_loops=2)))
    parallelize(tied, 1)
    assert not hasattr(tied, "_external_params")  # ZeRO 0-2: whole weights, nothing to gather
    parallelize(tied, 3)
    assert list(tied._external_params.values()) == [tied.embed_tokens.weight]
    assert [p for _, p in tied.ds_external_parameters()] == [tied.embed_tokens.weight]
    untied = build_model(_config())
    parallelize(untied, 3)
    assert list(untied._external_params.values()) == [untied.lm_head.weight]


def test_parallelize_sets_only_what_the_model_declares():
    """What training adds to a model (recomputation, the compile note, the TP gradient sum) is declared by
    the model and set by this stage: parallelize adds no attribute of its own."""
    model = build_model(_config(recompute="per_loop"))
    declared = set(vars(model))
    assert (model.recompute, model.compile_note, model.tp_gradient_sum) == (None, None, False)
    parallelize(model, 1)
    assert set(vars(model)) == declared
    assert model.recompute is not None and model.compile_note.startswith("model.compile=")


# the modules that build, train, step and save a model; the model's own constructor sets its fields
NO_MODEL_ATTRIBUTES = ("megatron_loop/model", "megatron_loop/optim", "megatron_loop/training",
                       "megatron_loop/checkpoint")
OWN_FIELDS = {"megatron_loop/model/looplm.py"}


def _model_attribute_assignments(path) -> list[str]:
    import ast

    def names_a_model(node) -> bool:  # model.x, module.x, engine.module.x
        return ((isinstance(node, ast.Name) and node.id in ("model", "module"))
                or (isinstance(node, ast.Attribute) and node.attr == "module"))

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        found += [f"{path}:{node.lineno}" for t in targets if isinstance(t, ast.Attribute) and names_a_model(t.value)]
    return found


def test_no_module_but_the_preparation_stage_sets_attributes_on_a_model(tmp_path):
    """optim/engine, training/setup, recompute and the rest set nothing on a model from outside (parallelize
    does, for the fields the model declares)."""
    from testpaths import REPO

    files = [p for folder in NO_MODEL_ATTRIBUTES for p in sorted((REPO / folder).rglob("*.py"))
             if p.relative_to(REPO).as_posix() not in OWN_FIELDS]
    assert [hit for p in files for hit in _model_attribute_assignments(p)] == []
    bad = tmp_path / "bad.py"
    bad.write_text("def f(model, engine):\n    model.recompute = 1\n    engine.module.note = 2\n")
    assert len(_model_attribute_assignments(bad)) == 2  # the check sees both spellings
