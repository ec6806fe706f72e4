"""Fast-path helpers for the training step: a chunked linear + cross-entropy and block compilation.

* :func:`chunked_linear_cross_entropy` -- the LM-head matmul fused with the mean next-token
  cross-entropy, computed ``chunk_size`` tokens at a time, so the full-vocabulary fp32 logits
  of the whole batch (78k tokens x 128k vocab x 4 bytes = 40 GB for the paper's Llama micro
  batch) never exist. With gradients enabled the gradients w.r.t. the hidden states and the
  head weight are formed chunk by chunk inside the forward (as Liger-Kernel's fused linear
  cross-entropy does): the chunk's logits are then never stored nor recomputed, and the total
  cost stays the usual three head matmuls (forward, d/dh, d/dW).
* :func:`compile_blocks` -- ``torch.compile`` each transformer block once (``dynamic=False``).
  The loop itself stays in Python, so running the shared core r times reuses the same compiled
  graph for any r: no recompilation when r changes (tests/test_perf_compile.py proves it).

No function here reads a value back to the host (no ``.item()``, no boolean-mask indexing):
the step stays asynchronous on GPU.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100
# Tokens per chunk: 4096 x 128k vocab is 2 GB of fp32 logits (plus the bf16 copy) -- large
# enough that the head matmul runs at full speed, small next to a 1B model's activations.
DEFAULT_CHUNK_TOKENS = 4096


class _Chunk:
    """Forward quantities of one chunk of tokens: fp32 logits, their log-sum-exp, the gather-safe
    targets and the valid-token mask (fp32)."""

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int):
        self.logits = F.linear(hidden, weight).float()
        valid = targets != ignore_index
        self.safe = torch.where(valid, targets, torch.zeros_like(targets))  # gather needs in-range indices
        self.validf = valid.to(torch.float32)
        self.lse = torch.logsumexp(self.logits, dim=-1)

    def loss_sum(self) -> torch.Tensor:
        target_logit = self.logits.gather(1, self.safe.unsqueeze(1)).squeeze(1)
        return ((self.lse - target_logit) * self.validf).sum()


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean CE of ``hidden @ weight.T`` with gradients formed chunk by chunk in the forward."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_size: int,
                ignore_index: int) -> torch.Tensor:
        count = (targets != ignore_index).sum().to(torch.float32)  # device tensor: no host sync
        inv_count = 1.0 / count
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        # fp32 accumulation of the head gradient over chunks (bf16 would lose low bits per chunk)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start:start + chunk_size]
            c = _Chunk(h, weight, targets[start:start + chunk_size], ignore_index)
            total = total + c.loss_sum()
            # d(mean CE)/d(logits) = (softmax - onehot) * valid / count, built in place on the logits
            grad = c.logits.sub_(c.lse.unsqueeze(1)).exp_()
            grad.scatter_add_(1, c.safe.unsqueeze(1), -c.validf.unsqueeze(1))
            grad = grad.mul_((c.validf * inv_count).unsqueeze(1)).to(hidden.dtype)
            del c
            if grad_hidden is not None:
                grad_hidden[start:start + chunk_size] = grad @ weight
            if grad_weight is not None and grad.dtype == torch.float32:
                grad_weight.addmm_(grad.t(), h)
            elif grad_weight is not None:
                grad_weight += (grad.t() @ h).float()
        ctx.save_for_backward(grad_hidden if grad_hidden is not None else hidden.new_empty(0),
                              grad_weight.to(weight.dtype) if grad_weight is not None else weight.new_empty(0))
        return total * inv_count

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        gh = grad_hidden * grad_output.to(grad_hidden.dtype) if ctx.needs_input_grad[0] else None
        gw = grad_weight * grad_output.to(grad_weight.dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                                 chunk_size: int = DEFAULT_CHUNK_TOKENS,
                                 ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight).float(), targets, ignore_index=...)`` (mean),
    without ever holding more than ``chunk_size`` tokens of logits.

    ``hidden`` is ``[N, d]``, ``weight`` ``[V, d]``, ``targets`` ``[N]``. As F.cross_entropy, the
    mean is over the non-ignored targets (NaN when every target is ignored).
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"expected hidden [N, d] and targets [N], got {tuple(hidden.shape)} and "
                         f"{tuple(targets.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size}: expected a positive integer")
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(hidden, weight, targets, chunk_size, ignore_index)
    # No gradient wanted (evaluation): plain chunked reduction, nothing kept.
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], chunk_size):
        total = total + _Chunk(hidden[start:start + chunk_size], weight, targets[start:start + chunk_size],
                               ignore_index).loss_sum()
    return total / (targets != ignore_index).sum().to(torch.float32)


# ----------------------------------------------------------------------------- compilation


def compile_blocks(blocks: Iterable[nn.Module], backend: str | Callable = "inductor", **options) -> None:
    """Compile each block's forward in place (``nn.Module.compile``), static shapes.

    Blocks of one model share their forward code; dynamo lifts their parameters to graph
    inputs (``inline_inbuilt_nn_modules``), so every block occurrence -- every layer of the
    shared core at every loop -- reuses one compiled graph per (shapes, psi present, grad mode).
    """
    from megatron_loop.model.compat import make_megatron_compilable

    make_megatron_compilable()
    for block in blocks:
        block.compile(backend=backend, dynamic=False, **options)


# ----------------------------------------------------------------------------- measurement


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (timing boundaries only; never inside a step)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(fns: dict[str, Callable[[], object]], device: torch.device, steps: int,
                     warmup: int) -> dict[str, list[float]]:
    """Wall-clock seconds of ``steps`` calls of each function, after ``warmup`` untimed calls each.

    The functions take turns (a, b, a, b, ...), so on a shared, noisy machine every
    configuration sees the same background load and their ratios stay meaningful.
    """
    import time

    for _ in range(warmup):
        for fn in fns.values():
            fn()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(steps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


def time_calls(fn: Callable[[], object], device: torch.device, steps: int, warmup: int) -> list[float]:
    """Wall-clock seconds of ``steps`` calls of ``fn`` after ``warmup`` untimed calls."""
    return time_interleaved({"fn": fn}, device, steps, warmup)["fn"]


def peak_memory_delta(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated during one call of ``fn`` above what was allocated when it started.

    CUDA: ``max_memory_allocated`` after a reset. CPU: the running sum of torch's allocation
    and free events recorded by ``torch.profiler`` (``profile_memory=True``) -- exact tensor
    bytes, independent of the malloc arena and of other processes (RSS is neither).
    """
    if device.type == "cuda":
        synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, size: int = 1024, reps: int = 30) -> float:
    """Measured dense matmul FLOP/s (best of ``reps``): the MFU denominator where no published
    peak applies (CPUs). Timing the same shapes as a GEMM-bound model keeps it comparable."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    times = time_calls(lambda: a @ a, device, reps, warmup=2)
    return 2 * size**3 / min(times)


def count_host_syncs(fn: Callable[[], object], device: torch.device) -> int | None:
    """Synchronising CUDA calls made by one call of ``fn`` (``torch.cuda.set_sync_debug_mode``);
    ``None`` off CUDA, where the notion does not apply."""
    if device.type != "cuda":
        return None
    import warnings

    synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)
