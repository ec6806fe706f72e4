"""``model/vocab.py``: the vocabulary under tensor parallelism. In one process the TP group has one
rank, whose shard is the whole vocabulary: the vocab-parallel cross-entropy (its max / sum-exp / target
logit all-reduces over the TP group) must then be F.cross_entropy exactly, with the gradient softmax -
onehot; the TP = 1 embedding and head are torch's own modules with their roles and initialisation; the
edges of the TP region are the identity at TP = 1 and the configuration's TP size is checked against
the groups. (TP = 2 and 4 against TP = 1: tests/integration/parallel/test_tp_equivalence.py.)"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from megatron_loop.config import build_model_config
from megatron_loop.errors import LoopConfigError
from megatron_loop.model import roles
from megatron_loop.model.loss import torch_chunk_loss
from megatron_loop.model import vocab
from megatron_loop.parallel.bootstrap import ensure_groups
from megatron_loop.model.placement import ParallelPlacement
from megatron_loop.model.vocab import TensorParallelEdges, lm_head, token_embedding, vocab_parallel_chunk

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state

TP1 = ParallelPlacement()


@pytest.fixture(autouse=True)
def groups():
    ensure_groups()


def test_vocab_parallel_cross_entropy_over_one_rank_is_cross_entropy(monkeypatch):
    torch.manual_seed(0)
    hidden, weight = torch.randn(6, 16), torch.randn(50, 16)
    targets = torch.tensor([3, 49, -100, 0, 17, -100])
    reduced = []
    real = torch.distributed.all_reduce
    monkeypatch.setattr(vocab.dist, "all_reduce", lambda t, op=torch.distributed.ReduceOp.SUM, group=None: (
        reduced.append((tuple(t.shape), op, group)), real(t, op=op, group=group))[1])
    loss, grad = vocab_parallel_chunk(hidden, weight, targets, -100, need_grad=True)
    logits = hidden @ weight.T
    assert torch.allclose(loss, F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum"))
    expected = torch.softmax(logits, -1) - F.one_hot(targets.clamp(min=0), 50)
    expected[targets == -100] = 0
    assert grad.dtype == hidden.dtype and torch.allclose(grad, expected)
    ref_loss, ref_grad = torch_chunk_loss(hidden, weight, targets, -100, need_grad=True)  # the TP = 1 ChunkLoss
    assert torch.allclose(loss, ref_loss) and torch.allclose(grad, ref_grad)
    tp = parallel_state.get_tensor_model_parallel_group()
    assert reduced == [((6,), torch.distributed.ReduceOp.MAX, tp), ((2, 6), torch.distributed.ReduceOp.SUM, tp)]
    assert vocab_parallel_chunk(hidden, weight, targets, -100, need_grad=False)[1] is None


def test_the_tp1_embedding_and_head_are_torch_modules_with_their_roles():
    torch.manual_seed(0)
    embedding = token_embedding(300, 64, 0.02, None, TP1)
    head = lm_head(64, 300, 0.02, None, TP1)
    assert type(embedding) is nn.Embedding and embedding.weight.shape == (300, 64)
    assert type(head) is nn.Linear and head.bias is None and head.weight.shape == (300, 64)
    assert roles.role_of(embedding.weight) == roles.EMBEDDING and roles.role_of(head.weight) == roles.HEAD
    for weight in (embedding.weight, head.weight):
        assert abs(weight.mean().item()) < 2e-3 and weight.std().item() == pytest.approx(0.02, rel=0.05)
    torch.manual_seed(0)  # nn.Embedding's own draw, then N(0, std): the global generator as at TP > 1
    reference = nn.Embedding(300, 64)
    nn.init.normal_(reference.weight, std=0.02)
    assert torch.equal(embedding.weight, reference.weight)


def test_the_edges_at_tp1_are_the_identity():
    edges = TensorParallelEdges(TP1)
    assert not edges.enabled
    embedding = nn.Embedding(10, 4)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert torch.equal(edges.embed(embedding, ids), embedding(ids).transpose(0, 1))  # [s, b, d]
    h = torch.randn(3, 2, 4, requires_grad=True)
    assert edges.head_input(h) is h and edges.gather_sequence(h) is h
    w = torch.randn(10, 4)
    assert torch.equal(edges.logits(h, w), F.linear(h, w))
    assert edges.loss_implementation("fused") == "fused"
    edges.check_exit("kl")  # adaptive exit runs at TP = 1


def test_the_edges_of_a_tp_rank_use_the_vocab_shards_and_refuse_what_tp_cannot_run():
    edges = TensorParallelEdges(ParallelPlacement(tp_size=2, sequence_parallel=True))
    assert edges.enabled and edges.loss_implementation("fused") is vocab_parallel_chunk
    with pytest.raises(LoopConfigError, match=r"^input length 5: sequence parallelism needs a multiple of "
                                              r"parallel.tensor_model_parallel_size=2$"):
        edges.embed(nn.Embedding(10, 4), torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(LoopConfigError, match=r"^exit_criterion='kl': per-token adaptive exit runs on the HF "
                                              r"export or a TP = 1 model"):
        edges.check_exit("kl")
    edges.check_exit("none")


def test_the_gradient_of_the_head_input_is_summed_over_the_tp_group(monkeypatch):
    """Without sequence parallelism the head input's backward all-reduces its (non-contiguous) gradient
    over the TP group, in a contiguous copy."""
    edges = TensorParallelEdges(ParallelPlacement(tp_size=2))
    seen = []
    monkeypatch.setattr(vocab.dist, "all_reduce", lambda t, group=None: seen.append((t.is_contiguous(), group)))
    h = torch.randn(3, 2, 4, requires_grad=True)
    out = edges.head_input(h)
    assert torch.equal(out, h)
    out.transpose(0, 1).sum(-1).mul(torch.arange(3.0)).sum().backward()
    assert seen == [(True, parallel_state.get_tensor_model_parallel_group())]
    assert torch.equal(h.grad, torch.arange(3.0)[:, None, None].expand(3, 2, 4))  # one rank: the sum is itself


def test_the_placement_tp_size_must_be_the_groups():
    cfg = build_model_config(dict(backbone="tiny-llama", core_layers=1, train_loops=2))
    assert TensorParallelEdges.of(cfg, ParallelPlacement(tp_size=1)).placement.tp_size == 1
    assert TensorParallelEdges.of(cfg, None).placement == TP1
    with pytest.raises(LoopConfigError, match=r"^parallel.tensor_model_parallel_size=2: this process's "
                                              r"tensor-parallel groups have size 1"):
        TensorParallelEdges.of(cfg, ParallelPlacement(tp_size=2))
