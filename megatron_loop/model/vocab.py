"""The vocabulary under tensor parallelism: a vocab-parallel token embedding and LM head, and the
chunked linear + cross-entropy on vocabulary shards.

TP rank t of N holds rows ``[t V/N, (t + 1) V/N)`` of the embedding and of the LM head (tied or
not: both are split the same way, so a tied head is the local embedding shard). The loss never
gathers the logits: per chunk of tokens each rank forms its ``[n, V/N]`` fp32 logits, and

    m   = max over ranks of the local row maxima                 (all-reduce MAX, n floats)
    Z   = sum over ranks of sum_v exp(z_v - m)                   (all-reduce SUM, together with
    z_y = the target logit, from the rank whose shard holds y     the target logit: 2n floats)
    CE  = log Z + m - z_y

so the communication per chunk is 3n floats against n V fp32 logits for a gather. The gradient
``softmax - onehot`` of the local columns is local; d/dh of the local columns is a partial sum
that the backward of the head input all-reduces (reduce-scatters with sequence parallelism).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from megatron_loop.errors import LoopConfigError
from megatron_loop.model import roles
from megatron_loop.config.parallel import ParallelConfig
from megatron_loop.model.placement import ParallelPlacement, tensor_parallel_group

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, VocabParallelEmbedding
    from megatron.core.tensor_parallel.mappings import (gather_from_sequence_parallel_region,
                                                        gather_from_tensor_model_parallel_region)


def token_embedding(vocab_size: int, hidden_size: int, std: float, tcfg, placement: ParallelPlacement) -> nn.Module:
    """``nn.Embedding`` at TP = 1; megatron-core's ``VocabParallelEmbedding`` otherwise (reduce-scattered
    to sequence shards with sequence parallelism). Both draw the whole ``[V, d]`` table from the
    global generator exactly as the TP = 1 module does (``nn.Embedding``'s own N(0, 1) draw, then
    N(0, std), App. C.2), so a TP = N model holds the TP = 1 model's shards."""
    if placement.tp_size == 1:
        embedding = nn.Embedding(vocab_size, hidden_size)
        nn.init.normal_(embedding.weight, mean=0.0, std=std)
    else:
        embedding = VocabParallelEmbedding(
            vocab_size, hidden_size, config=tcfg, reduce_scatter_embeddings=placement.sequence_parallel,
            init_method=lambda w: nn.init.normal_(nn.init.normal_(w), mean=0.0, std=std))
    roles.set_role(embedding.weight, roles.EMBEDDING)
    return embedding


def lm_head(hidden_size: int, vocab_size: int, std: float, tcfg, placement: ParallelPlacement) -> nn.Module:
    """The untied LM head: ``nn.Linear`` at TP = 1, a ``ColumnParallelLinear`` over the vocabulary
    otherwise (only its weight is used: the loss and the logits read it directly). The master
    weight is drawn as ``nn.Linear``'s (Kaiming uniform, then N(0, std))."""
    if placement.tp_size == 1:
        head = nn.Linear(hidden_size, vocab_size, bias=False)
        nn.init.normal_(head.weight, mean=0.0, std=std)
    else:
        head = ColumnParallelLinear(
            hidden_size, vocab_size, config=tcfg, bias=False, gather_output=False, skip_bias_add=True,
            init_method=lambda w: nn.init.normal_(nn.init.kaiming_uniform_(w, a=math.sqrt(5)), mean=0.0, std=std))
    roles.set_role(head.weight, roles.HEAD)
    return head


def vocab_parallel_chunk(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                         need_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk of the cross-entropy on this rank's vocabulary shard ``weight`` ``[V/N, d]``: the
    summed CE of the chunk's tokens (the same value on every TP rank) and, with ``need_grad``,
    d(sum CE)/d(local logits) = softmax - onehot over the local columns, in the hidden dtype.
    A :class:`~megatron_loop.model.loss.ChunkLoss` (the contract of ``torch_chunk_loss``)."""
    group = tensor_parallel_group()
    shard = weight.shape[0]
    start = dist.get_rank(group) * shard
    logits = F.linear(hidden, weight).float()
    valid = targets != ignore_index
    local = targets - start
    owned = valid & (local >= 0) & (local < shard)
    safe = torch.where(owned, local, torch.zeros_like(local))
    row_max = logits.max(dim=1).values
    dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
    logits.sub_(row_max.unsqueeze(1))
    target_logit = logits.gather(1, safe.unsqueeze(1)).squeeze(1) * owned.to(torch.float32)
    exp = logits.exp_()  # in place: the shifted logits are not needed again
    stats = torch.stack([exp.sum(dim=1), target_logit])
    dist.all_reduce(stats, group=group)
    sum_exp, target_logit = stats
    validf = valid.to(torch.float32)
    loss = ((sum_exp.log() - target_logit) * validf).sum()
    if not need_grad:
        return loss, None
    grad = exp.div_(sum_exp.unsqueeze(1))
    grad.scatter_add_(1, safe.unsqueeze(1), -owned.to(torch.float32).unsqueeze(1))
    return loss, grad.mul_(validf.unsqueeze(1)).to(hidden.dtype)


class _SumGradientOverTP(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the TP group. megatron-core's
    ``copy_to_tensor_model_parallel_region`` does the same but all-reduces ``grad.contiguous()``,
    a temporary copy when the gradient arrives non-contiguous (it does here: the head input is
    transposed to ``[b, s, d]`` next), and then returns the unreduced gradient."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=tensor_parallel_group())
        return grad


class TensorParallelEdges:
    """What the model does where the tensor-parallel region begins and ends.

    Entry: token embedding -> ``[s, b, d]`` (``[s/N, b, d]`` with sequence parallelism). Exit: the
    final hidden states back to the whole sequence with a backward that sums the vocabulary
    shards' partial gradients, the logits gathered over the vocabulary, the loss on shards. At
    TP = 1 every method is what the model did without tensor parallelism.
    """

    def __init__(self, placement: ParallelPlacement):
        self.placement = placement

    @classmethod
    def of(cls, model, placement: ParallelPlacement | None = None) -> "TensorParallelEdges":
        """The edges for a model (a ModelConfig) at ``placement`` (None: one rank, TP = 1). Reads no process
        group: at TP > 1 the caller built megatron-core's groups of that size, and its layers are built in them."""
        placement = ParallelPlacement() if placement is None else placement
        ParallelConfig(placement.tp_size).check_model(model)
        if placement.tp_size > 1:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from megatron.core import parallel_state

            built = (parallel_state.get_tensor_model_parallel_world_size()
                     if parallel_state.model_parallel_is_initialized() else None)
            if built != placement.tp_size:
                raise LoopConfigError(f"parallel.tensor_model_parallel_size={placement.tp_size}: this process's "
                                      f"tensor-parallel groups have size {built or 1} (parallel.bootstrap."
                                      "init_model_parallel builds them, and returns the placement)")
        return cls(placement)

    @property
    def enabled(self) -> bool:
        return self.placement.tp_size > 1

    def embed(self, embedding: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        if self.placement.sequence_parallel:
            if input_ids.shape[1] % self.placement.tp_size:
                raise LoopConfigError(f"input length {input_ids.shape[1]}: sequence parallelism needs a multiple of "
                                      f"parallel.tensor_model_parallel_size={self.placement.tp_size}")
            return embedding(input_ids)  # reduce-scattered: [s/N, b, d]
        return embedding(input_ids).transpose(0, 1)

    def gather_sequence(self, hidden: torch.Tensor) -> torch.Tensor:
        """A sequence-sharded state ``[s/N, b, d]`` as the whole ``[s, b, d]`` (trajectories)."""
        if not self.placement.sequence_parallel:
            return hidden
        return gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)

    def head_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final hidden states ``[s, b, d]`` whole on every rank; backward sums (and re-shards) the
        partial gradients of the vocabulary shards."""
        if self.placement.sequence_parallel:
            return gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=True)
        if self.enabled:
            return _SumGradientOverTP.apply(hidden)
        return hidden

    def logits(self, hidden: torch.Tensor, head_weight: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, head_weight)
        return gather_from_tensor_model_parallel_region(logits) if self.enabled else logits

    def loss_implementation(self, implementation: str):
        """The :class:`~megatron_loop.model.loss.ChunkLoss` of ``model.loss.chunked_linear_cross_entropy``: :func:`vocab_parallel_chunk`
        under TP (Liger's fused kernel needs whole vocabulary rows), ``implementation`` otherwise."""
        return vocab_parallel_chunk if self.enabled else implementation

    def check_exit(self, exit_criterion: str) -> None:
        if self.enabled and exit_criterion != "none":
            raise LoopConfigError(f"exit_criterion={exit_criterion!r}: per-token adaptive exit runs on the HF export "
                                  "or a TP = 1 model, not on a tensor-parallel training model")
