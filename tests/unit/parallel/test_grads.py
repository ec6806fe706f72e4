"""``parallel/grads.py``: which gradients are partial over the TP group, and the one hook that sums them.

In one process the TP group has one rank, so a model built here is given the placement of a TP = 2 rank
(``TensorParallelEdges`` with ``tp_size=2``; the embedding marked as the vocab-parallel shard it would
be): the rule picks the parameters by name, the hooks are registered once, and each hook all-reduces
the incoming gradient over the TP group once per backward (the weight-tied core applied r times
included), returning the sum (over one rank: the gradient itself). The multi-rank sums are
tests/integration/parallel/test_tp_train.py's."""

from __future__ import annotations

import warnings

import torch

from megatron_loop import build_model
from megatron_loop.config import build_model_config
from megatron_loop.parallel import grads
from megatron_loop.parallel.grads import partial_grad_parameters, register_tp_gradient_sum
from megatron_loop.model.placement import ParallelPlacement
from megatron_loop.model.vocab import TensorParallelEdges

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state

REPLICATED = {  # every parameter TP ranks hold whole (the embedding and the linears are shards)
    "prelude.0.input_layernorm.weight", "prelude.0.self_attention.q_layernorm.weight",
    "prelude.0.self_attention.k_layernorm.weight", "prelude.0.pre_mlp_layernorm.weight",
    "core.0.input_layernorm.weight", "core.0.self_attention.q_layernorm.weight",
    "core.0.self_attention.k_layernorm.weight", "core.0.pre_mlp_layernorm.weight",
    "norm.weight", "initial_injection.a", "initial_injection.b", "loop_gating.q"}
QK_NORMS = {name for name in REPLICATED if "_layernorm.weight" in name and name.split(".")[-2][0] in "qk"}


def _model(tp_size: int = 1, sequence_parallel: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    cfg = build_model_config(dict(backbone="tiny-qwen", prelude_layers=1, core_layers=1, coda_layers=0,
                                  train_loops=3, initial_injection="channel", timestep="loop_gating"))
    model = build_model(cfg)
    if tp_size > 1:  # this rank's placement in a TP group of tp_size
        model.tensor_parallel = TensorParallelEdges(ParallelPlacement(tp_size=tp_size,
                                                                      sequence_parallel=sequence_parallel))
        model.embed_tokens.weight.tensor_model_parallel = True  # VocabParallelEmbedding's attribute
    return model


def _hooked(model) -> set[str]:
    return {name for name, p in model.named_parameters() if p._backward_hooks}


def test_nothing_is_partial_at_tp_1():
    model = _model()
    assert partial_grad_parameters(model) == []
    assert register_tp_gradient_sum(model) == 0
    assert _hooked(model) == set() and model.tp_gradient_sum is False


def test_partial_gradients_are_the_qk_norms_without_sequence_parallelism_and_every_replicated_one_with_it():
    assert QK_NORMS == {"prelude.0.self_attention.q_layernorm.weight", "prelude.0.self_attention.k_layernorm.weight",
                        "core.0.self_attention.q_layernorm.weight", "core.0.self_attention.k_layernorm.weight"}
    assert {name for name, _ in partial_grad_parameters(_model(2))} == QK_NORMS
    sequence_parallel = _model(2, sequence_parallel=True)
    assert {name for name, _ in partial_grad_parameters(sequence_parallel)} == REPLICATED
    sequence_parallel.norm.weight.requires_grad_(False)  # frozen: no gradient to sum
    assert {name for name, _ in partial_grad_parameters(sequence_parallel)} == REPLICATED - {"norm.weight"}


def test_the_sum_is_registered_once_per_model():
    model = _model(2, sequence_parallel=True)
    assert register_tp_gradient_sum(model) == len(REPLICATED)
    assert register_tp_gradient_sum(model) == len(REPLICATED)  # the count again, no second hook
    assert model.tp_gradient_sum is True
    assert _hooked(model) == REPLICATED
    assert all(len(p._backward_hooks) == 1 for name, p in model.named_parameters() if name in REPLICATED)


def test_each_hook_all_reduces_once_per_backward_over_the_tp_group_and_returns_the_sum(monkeypatch):
    """One all-reduce per hooked parameter per backward, on the TP group, though the core runs 3 times;
    over a group of one rank the sum is the gradient: equal to a twin model's without hooks."""
    hooked, plain = _model(2, sequence_parallel=True), _model()
    assert register_tp_gradient_sum(hooked) == len(REPLICATED)
    hooked.tensor_parallel = plain.tensor_parallel  # then the forward of TP = 1: only the hooks differ
    reduced = []
    real = torch.distributed.all_reduce

    def all_reduce(tensor, group=None, **kwargs):
        reduced.append((tuple(tensor.shape), group))
        return real(tensor, group=group, **kwargs)

    monkeypatch.setattr(grads.dist, "all_reduce", all_reduce)
    x = torch.randint(0, 2048, (2, 8))
    for model in (hooked, plain):
        model(x, labels=x, compute_logits=False).loss.backward()
    shapes = sorted(tuple(p.shape) for name, p in hooked.named_parameters() if name in REPLICATED)
    assert sorted(shape for shape, _ in reduced) == shapes
    assert all(group is parallel_state.get_tensor_model_parallel_group() for _, group in reduced)
    for (name, a), b in zip(hooked.named_parameters(), plain.parameters()):
        assert a.grad is not None and torch.equal(a.grad, b.grad), name
