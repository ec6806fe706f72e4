"""The LM head and its loss: mean next-token cross-entropy of ``hidden @ weight.T`` (App. C.2),
computed ``chunk_size`` tokens at a time so that the full-vocabulary fp32 logits of the whole
batch (78k tokens x 128k vocab x 4 bytes = 40 GB for the paper's Llama micro batch) never exist.

One interface, several implementations (as OLMo-core's ``LMHead`` with its loss-implementation
enum, torchtitan's ``components/loss.py``). :func:`chunked_linear_cross_entropy` owns the chunk
loop, the 1 / (non-ignored count) scaling and the autograd function; an implementation is a
:class:`ChunkLoss`, one chunk's ``(summed loss, d loss / d logits)`` from the chunk's hidden
states, the head weight and the chunk's targets:

* ``chunked`` (:func:`torch_chunk_loss`) -- torch, fp32 logits per chunk: the reference.
* ``fused`` (:func:`liger_chunk_loss`) -- Liger-Kernel's Triton cross-entropy kernel on logits in
  the hidden dtype (CUDA; CPU through Triton's interpreter).

With gradients enabled the gradients w.r.t. the hidden states and the head weight are formed
chunk by chunk inside the forward (as Liger-Kernel's fused linear cross-entropy does): the chunk's
logits are then never stored nor recomputed, and the total cost stays the usual three head matmuls
(forward, d/dh, d/dW).

A vocabulary-parallel head fits the same interface: its :class:`ChunkLoss` receives this rank's
vocabulary shard of the weight (``[V / tp, d]``), reduces the row maximum, the sum of exponentials
and the target logit over the tensor-parallel group, and returns the summed loss and the gradient
of its own logits shard; the caller passes ``hidden`` through megatron-core's
``copy_to_tensor_model_parallel_region`` so that d loss / d hidden is summed over the group.

No function here reads a value back to the host (no ``.item()``, no boolean-mask indexing): the
step stays asynchronous on GPU.
"""

from __future__ import annotations

import os
from typing import Protocol

import torch
import torch.nn.functional as F

from megatron_loop.model.loss_chunk import DEFAULT_CHUNK_TOKENS  # tokens per chunk (torch-free there)

IGNORE_INDEX = -100


class ChunkLoss(Protocol):
    """One chunk of tokens: ``(summed cross-entropy over the non-ignored targets, d(sum)/d(logits)``
    in the hidden dtype, ignored rows zero; None without ``need_grad``). ``hidden`` is ``[n, d]``,
    ``weight`` the head's ``[V, d]`` (or this rank's vocabulary shard), ``targets`` ``[n]``."""

    def __call__(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                 need_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class _ChunkLogits:
    """Forward quantities of one chunk of tokens: fp32 logits, their log-sum-exp, the targets with
    ignored positions replaced by 0 (gather needs in-range indices) and the fp32 mask of valid targets."""

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int):
        self.logits = F.linear(hidden, weight).float()
        valid = targets != ignore_index
        self.gather_targets = torch.where(valid, targets, torch.zeros_like(targets))
        self.valid_mask = valid.to(torch.float32)
        self.lse = torch.logsumexp(self.logits, dim=-1)

    def loss_sum(self) -> torch.Tensor:
        target_logit = self.logits.gather(1, self.gather_targets.unsqueeze(1)).squeeze(1)
        return ((self.lse - target_logit) * self.valid_mask).sum()


def torch_chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                     need_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reference :class:`ChunkLoss` (torch): summed CE of the chunk and, with ``need_grad``,
    d(sum CE)/d(logits) = softmax - onehot (ignored rows zero) in the hidden dtype, built in place
    on the fp32 logits."""
    chunk = _ChunkLogits(hidden, weight, targets, ignore_index)
    loss = chunk.loss_sum()
    if not need_grad:
        return loss, None
    grad = chunk.logits.sub_(chunk.lse.unsqueeze(1)).exp_()
    grad.scatter_add_(1, chunk.gather_targets.unsqueeze(1), -chunk.valid_mask.unsqueeze(1))
    return loss, grad.mul_(chunk.valid_mask.unsqueeze(1)).to(hidden.dtype)


def liger_chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                      need_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The :class:`ChunkLoss` of Liger-Kernel's Triton cross-entropy kernel: logits stay in the hidden
    dtype, and one kernel pass (fp32 inside) writes each row's loss and replaces the logits by their
    gradient -- the fp32 elementwise passes of :func:`torch_chunk_loss` never happen.

    ``reduction="sum"``: the kernel then neither reads the non-ignored count (Liger's own
    ``LigerFusedLinearCrossEntropyFunction`` reads it with ``.item()``, a host synchronisation)
    nor scales; the caller divides by the count as a device tensor.
    """
    kernel = liger_cross_entropy_kernel()
    logits = (hidden @ weight.t()).contiguous()
    targets = targets.contiguous()
    n, vocab = logits.shape
    loss_1d = torch.zeros(n, dtype=torch.float32, device=hidden.device)
    kernel[(n,)](
        X_ptr=logits, X_stride=logits.stride(-2), Y_ptr=targets, Y_stride=targets.stride(-1), weight_ptr=None,
        loss_ptr=loss_1d, z_loss_ptr=None, loss_stride=loss_1d.stride(-1), token_accuracy_ptr=None,
        token_accuracy_stride=0, predicted_tokens_ptr=None, predicted_tokens_stride=0, n_cols=vocab,
        n_non_ignore=1, sum_non_ignore_weight=1, weight_sum=0.0, ignore_index=ignore_index, lse_square_scale=0.0,
        label_smoothing=0.0, reduction="sum", softcap=None, RETURN_Z_LOSS=False, RETURN_TOKEN_ACCURACY=False,
        RETURN_PREDICTED_TOKENS=False, HAS_WEIGHT=False, HAS_SOFTCAPPING=False, HAS_GRADIENTS=need_grad,
        BLOCK_SIZE=min(LIGER_MAX_BLOCK, _next_power_of_2(vocab)), num_warps=32)
    return loss_1d.sum(), (logits if need_grad else None)


# model.loss_implementation -> its ChunkLoss ("auto" resolves to one of them: resolve_loss_implementation)
CHUNK_LOSSES: dict[str, ChunkLoss] = {"chunked": torch_chunk_loss, "fused": liger_chunk_loss}
LIGER_MAX_BLOCK = 32768  # Liger's MAX_FUSED_SIZE: columns per kernel iteration


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def liger_cross_entropy_kernel():
    """Liger-Kernel's Triton cross-entropy kernel (``pip install liger-kernel``; pinned in pyproject)."""
    try:
        from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel as kernel
    except ImportError as e:  # pragma: no cover - liger-kernel is a dependency
        raise RuntimeError("model.loss_implementation=fused needs liger-kernel (pip install liger-kernel)") from e
    return kernel


def triton_interpreter() -> bool:
    """True when Triton kernels run on CPU tensors through its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_loss_implementation(implementation: str, hidden: torch.Tensor) -> str:
    """``auto``: Liger's fused kernel on CUDA (when liger-kernel imports), the chunked torch reference
    elsewhere. ``fused`` off CUDA needs Triton's interpreter (tests)."""
    if implementation == "auto":
        if not hidden.is_cuda:
            return "chunked"
        try:
            liger_cross_entropy_kernel()
        except RuntimeError:
            return "chunked"
        return "fused"
    if implementation == "fused" and not (hidden.is_cuda or triton_interpreter()):
        raise RuntimeError(f"model.loss_implementation=fused: Liger's Triton kernel needs a CUDA device "
                           f"(or TRITON_INTERPRET=1 on CPU); the hidden states are on {hidden.device}")
    if implementation not in CHUNK_LOSSES:
        raise ValueError(f"loss implementation {implementation!r}: expected auto, chunked or fused")
    return implementation


def _accumulate_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` with ``acc`` in fp32: summed over many chunks, low-precision partial sums
    would lose bits. A bf16 product is one bf16 GEMM (fp32 accumulation inside, its result rounded
    once to bf16) added to ``acc`` in fp32: the same ops on CPU and CUDA and on any torch
    (``addmm(..., out_dtype=)`` exists on CUDA only, from torch 2.8, and 2.8-2.9 refuse an fp32
    ``self`` with bf16 operands)."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        acc.add_(a @ b)


def _scaled_fp32(tensor: torch.Tensor, scale: torch.Tensor, rows: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """``tensor * scale`` computed in fp32 and returned in ``tensor``'s dtype, ``rows`` rows at a time.

    ``scale`` is a 0-dim fp32 device tensor (no host sync). A bf16 tensor times an fp32 0-dim
    tensor would round the scale to bf16 first (1/38 becomes 1/37.93, +0.2% on every element);
    the upcast keeps it exact, one chunk of fp32 rows at a time.
    """
    if tensor.dtype in (torch.float32, torch.float64):  # float64: gradcheck of the weighted loss below
        return tensor * scale
    out = torch.empty_like(tensor)
    for start in range(0, tensor.shape[0], rows):
        torch.mul(tensor[start:start + rows].float(), scale, out=out[start:start + rows])
    return out


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean CE of ``hidden @ weight.T`` with gradients formed chunk by chunk in the forward.

    One loop for every implementation: its :class:`ChunkLoss` gives the chunk's summed loss and its
    unscaled logits gradient; the 1 / (non-ignored count) scale and the incoming gradient are
    applied in fp32 as device tensors (:func:`_scaled_fp32`), so nothing is read back to the host
    and no scale is rounded to bf16.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_size: int,
                ignore_index: int, chunk_loss: ChunkLoss) -> torch.Tensor:
        count = (targets != ignore_index).sum().to(torch.float32)  # device tensor: no host sync
        inv_count = 1.0 / count
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start:start + chunk_size]
            loss, grad = chunk_loss(h, weight, targets[start:start + chunk_size], ignore_index, True)
            total = total + loss
            if grad_hidden is not None:
                torch.mm(grad, weight, out=grad_hidden[start:start + chunk_size])
            if grad_weight is not None:
                _accumulate_fp32(grad_weight, grad.t(), h)
            del grad
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(inv_count).to(weight.dtype)
        # grad_hidden stays unscaled: backward applies inv_count and the incoming gradient at once
        ctx.save_for_backward(grad_hidden if grad_hidden is not None else hidden.new_empty(0),
                              grad_weight if grad_weight is not None else weight.new_empty(0), inv_count)
        return total * inv_count

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grad_hidden, grad_weight, inv_count = ctx.saved_tensors
        scale = grad_output.to(torch.float32)
        gh = _scaled_fp32(grad_hidden, scale * inv_count) if ctx.needs_input_grad[0] else None
        gw = _scaled_fp32(grad_weight, scale) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None, None


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                                 chunk_size: int = DEFAULT_CHUNK_TOKENS, ignore_index: int = IGNORE_INDEX,
                                 implementation: str | ChunkLoss = "chunked") -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight).float(), targets, ignore_index=...)`` (mean),
    without ever holding more than ``chunk_size`` tokens of logits.

    ``hidden`` is ``[N, d]``, ``weight`` ``[V, d]``, ``targets`` ``[N]``. As F.cross_entropy, the
    mean is over the non-ignored targets (NaN when every target is ignored). ``implementation``:
    ``chunked`` (torch, fp32 logits per chunk: the reference), ``fused`` (Liger-Kernel's Triton
    kernel on logits in the hidden dtype) or ``auto`` (:func:`resolve_loss_implementation`), or a
    :class:`ChunkLoss` of its own (the vocabulary-parallel one: ``model/vocab.py``).
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"expected hidden [N, d] and targets [N], got {tuple(hidden.shape)} and "
                         f"{tuple(targets.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size}: expected a positive integer")
    chunk_loss = (implementation if callable(implementation)
                  else CHUNK_LOSSES[resolve_loss_implementation(implementation, hidden)])
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(hidden, weight, targets, chunk_size, ignore_index, chunk_loss)
    # No gradient wanted (evaluation): plain chunked reduction, nothing kept.
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], chunk_size):
        total = total + chunk_loss(hidden[start:start + chunk_size], weight, targets[start:start + chunk_size],
                                 ignore_index, False)[0]
    return total / (targets != ignore_index).sum().to(torch.float32)


# ---------------------------------------------------------------------------- per-token weights
# Ouro's Stage I objective (model/exit_gate.py) weighs each token's loss at loop t by its exit
# probability p(t|x), which is itself trained: the weights need a gradient, d/dw_i = loss_i / count.


def _row_dtype(hidden: torch.Tensor) -> torch.dtype:
    """fp32 logits for bf16/fp32 hidden states; float64 stays float64 (gradcheck)."""
    return torch.promote_types(hidden.dtype, torch.float32)


def _rows_and_grad(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                   need_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk: per-row cross-entropy [n] (0 at ignored rows) and, with ``need_grad``, d(row loss)/d(logits)
    = softmax - onehot [n, V] (ignored rows zero), in the logits' precision."""
    logits = F.linear(hidden, weight).to(_row_dtype(hidden))
    valid = targets != ignore_index
    gather = torch.where(valid, targets, torch.zeros_like(targets))
    mask = valid.to(logits.dtype)
    lse = torch.logsumexp(logits, dim=-1)
    rows = (lse - logits.gather(1, gather.unsqueeze(1)).squeeze(1)) * mask
    if not need_grad:
        return rows, None
    grad = logits.sub_(lse.unsqueeze(1)).exp_()
    grad.scatter_add_(1, gather.unsqueeze(1), -mask.unsqueeze(1))
    return rows, grad.mul_(mask.unsqueeze(1))


def token_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               chunk_size: int = DEFAULT_CHUNK_TOKENS,
                               ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Per-token cross-entropy [N] of ``hidden @ weight.T`` (0 at ignored targets), without a graph,
    ``chunk_size`` tokens of logits at a time (Ouro's Stage II reads the detached per-step losses)."""
    with torch.no_grad():
        return torch.cat([_rows_and_grad(hidden[i:i + chunk_size], weight, targets[i:i + chunk_size], ignore_index,
                                         False)[0] for i in range(0, hidden.shape[0], chunk_size)])


class _WeightedLinearCrossEntropy(torch.autograd.Function):
    """sum_i w_i CE_i / count with the hidden, weight and w gradients formed chunk by chunk in the
    forward (the logits of a chunk are never kept), as :class:`_LinearCrossEntropy`."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, token_weight, chunk_size, ignore_index):
        inv_count = 1.0 / (targets != ignore_index).sum().to(_row_dtype(hidden))
        w = token_weight.detach().to(_row_dtype(hidden))
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=_row_dtype(hidden)) if ctx.needs_input_grad[1] else None
        rows = []
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start:start + chunk_size]
            loss, grad = _rows_and_grad(h, weight, targets[start:start + chunk_size], ignore_index, True)
            rows.append(loss)
            grad = grad.mul_(w[start:start + chunk_size].unsqueeze(1)).to(hidden.dtype)
            if grad_hidden is not None:
                torch.mm(grad, weight, out=grad_hidden[start:start + chunk_size])
            if grad_weight is not None:
                _accumulate_fp32(grad_weight, grad.t(), h)
        rows = torch.cat(rows)
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(inv_count).to(weight.dtype)
        ctx.save_for_backward(grad_hidden if grad_hidden is not None else hidden.new_empty(0),
                              grad_weight if grad_weight is not None else weight.new_empty(0), rows, inv_count)
        ctx.token_weight_dtype = token_weight.dtype
        return (rows * w).sum() * inv_count

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight, rows, inv_count = ctx.saved_tensors
        scale = grad_output.to(inv_count.dtype)
        gh = _scaled_fp32(grad_hidden, scale * inv_count) if ctx.needs_input_grad[0] else None
        gw = _scaled_fp32(grad_weight, scale) if ctx.needs_input_grad[1] else None
        gt = (rows * (scale * inv_count)).to(ctx.token_weight_dtype) if ctx.needs_input_grad[3] else None
        return gh, gw, None, gt, None, None


def weighted_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                                  token_weight: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_TOKENS,
                                  ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """``sum_i token_weight_i * CE_i / count`` (count: non-ignored targets), CE_i the cross-entropy of row
    i of ``hidden @ weight.T`` in fp32 (float64 for float64 inputs), ``chunk_size`` rows of logits at a time;
    differentiable in ``hidden``, ``weight`` and ``token_weight`` [N]. All-ones weights give
    :func:`chunked_linear_cross_entropy`'s value. Torch only: the fused kernel and the vocabulary-parallel
    head return summed losses, not per-token ones."""
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1] or token_weight.shape != targets.shape:
        raise ValueError(f"expected hidden [N, d], targets [N] and token_weight [N], got {tuple(hidden.shape)}, "
                         f"{tuple(targets.shape)} and {tuple(token_weight.shape)}")
    return _WeightedLinearCrossEntropy.apply(hidden, weight, targets, token_weight, chunk_size, ignore_index)
