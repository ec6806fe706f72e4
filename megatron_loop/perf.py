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

import os
from typing import Callable, Iterable

import torch
import torch.utils._python_dispatch
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


def _torch_chunk(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                 need_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reference chunk (torch): summed CE of the chunk and, with ``need_grad``, d(sum CE)/d(logits)
    = softmax - onehot (ignored rows zero) in the hidden dtype, built in place on the fp32 logits."""
    c = _Chunk(hidden, weight, targets, ignore_index)
    loss = c.loss_sum()
    if not need_grad:
        return loss, None
    grad = c.logits.sub_(c.lse.unsqueeze(1)).exp_()
    grad.scatter_add_(1, c.safe.unsqueeze(1), -c.validf.unsqueeze(1))
    return loss, grad.mul_(c.validf.unsqueeze(1)).to(hidden.dtype)


def _liger_chunk(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                 need_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The same quantities from Liger-Kernel's Triton cross-entropy kernel: logits stay in the hidden
    dtype, and one kernel pass (fp32 inside) writes each row's loss and replaces the logits by their
    gradient -- the fp32 elementwise passes of :func:`_torch_chunk` never happen.

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


CHUNK_IMPLEMENTATIONS = {"chunked": _torch_chunk, "fused": _liger_chunk}
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
    if implementation not in CHUNK_IMPLEMENTATIONS:
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
    if tensor.dtype == torch.float32:
        return tensor * scale
    out = torch.empty_like(tensor)
    for start in range(0, tensor.shape[0], rows):
        torch.mul(tensor[start:start + rows].float(), scale, out=out[start:start + rows])
    return out


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean CE of ``hidden @ weight.T`` with gradients formed chunk by chunk in the forward.

    One loop for both implementations: a chunk function gives the chunk's summed loss and its
    unscaled logits gradient; the 1 / (non-ignored count) scale and the incoming gradient are
    applied in fp32 as device tensors (:func:`_scaled_fp32`), so nothing is read back to the host
    and no scale is rounded to bf16.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_size: int,
                ignore_index: int, chunk_fn: Callable) -> torch.Tensor:
        count = (targets != ignore_index).sum().to(torch.float32)  # device tensor: no host sync
        inv_count = 1.0 / count
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start:start + chunk_size]
            loss, grad = chunk_fn(h, weight, targets[start:start + chunk_size], ignore_index, True)
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
                                 implementation: str | Callable = "chunked") -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight).float(), targets, ignore_index=...)`` (mean),
    without ever holding more than ``chunk_size`` tokens of logits.

    ``hidden`` is ``[N, d]``, ``weight`` ``[V, d]``, ``targets`` ``[N]``. As F.cross_entropy, the
    mean is over the non-ignored targets (NaN when every target is ignored). ``implementation``:
    ``chunked`` (torch, fp32 logits per chunk: the reference), ``fused`` (Liger-Kernel's Triton
    kernel on logits in the hidden dtype) or ``auto`` (:func:`resolve_loss_implementation`), or a
    chunk function with :func:`_torch_chunk`'s contract (vocabulary shards: ``parallel/vocab.py``).
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"expected hidden [N, d] and targets [N], got {tuple(hidden.shape)} and "
                         f"{tuple(targets.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size}: expected a positive integer")
    # a callable is a chunk function of its own (the vocab-parallel one: parallel.vocab.vocab_parallel_chunk)
    chunk_fn = (implementation if callable(implementation)
                else CHUNK_IMPLEMENTATIONS[resolve_loss_implementation(implementation, hidden)])
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(hidden, weight, targets, chunk_size, ignore_index, chunk_fn)
    # No gradient wanted (evaluation): plain chunked reduction, nothing kept.
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], chunk_size):
        total = total + chunk_fn(hidden[start:start + chunk_size], weight, targets[start:start + chunk_size],
                                 ignore_index, False)[0]
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


def uncompile_blocks(blocks: Iterable[nn.Module]) -> None:
    """Undo :func:`compile_blocks`: the blocks run their eager forward again."""
    for block in blocks:
        block._compiled_call_impl = None


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

    CUDA: ``max_memory_allocated`` after a reset. CPU: the running sum of the allocations made
    during the call and their frees, from ``torch.profiler`` (``profile_memory=True``) -- exact
    tensor bytes, independent of the malloc arena and of other processes (RSS is neither).
    Frees of blocks allocated before the call (last step's gradients under
    ``zero_grad(set_to_none=True)``) are not counted: torch's CPU allocator sizes them from a table
    that keeps stale entries of earlier profiled windows, so their sizes depend on address reuse
    and the measurement would vary from run to run. The CPU figure is therefore the peak of what
    the call itself allocates (gradients included), the quantity the memory model predicts.
    """
    if device.type == "cuda":
        synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:  # the allocation events sit at every depth of the op tree
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size < 0, node.extra_fields.ptr,
                           node.extra_fields.alloc_size))
    live: dict[int, int] = {}  # ptr -> bytes of the blocks allocated inside the window
    current = peak = 0
    for _, _, ptr, nbytes in sorted(events):  # at equal times an allocation precedes a free
        if nbytes > 0:
            live[ptr] = nbytes
        elif ptr in live:
            nbytes = -live.pop(ptr)
        else:
            continue  # allocated before the window
        current += nbytes
        peak = max(peak, current)
    return peak


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, size: int = 1024, reps: int = 30) -> float:
    """Measured dense matmul FLOP/s (best of ``reps``): the MFU denominator where no published
    peak applies (CPUs). Timing the same shapes as a GEMM-bound model keeps it comparable."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    times = time_calls(lambda: a @ a, device, reps, warmup=2)
    return 2 * size**3 / min(times)


# Ops that read device memory back to the host (on CUDA each one waits for the stream): scalar
# reads (``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``) and data-dependent output shapes
# (boolean masks, nonzero, unique, ...).
HOST_SYNC_OPS = frozenset({
    "_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "argwhere", "masked_select", "_unique",
    "_unique2", "unique_dim", "unique_consecutive", "bincount", "histc"})
# Python data entering the step (``torch.tensor([...])``: a pageable host-to-device copy on GPU).
# ``torch.from_numpy`` (a data loader's batch) is not one: its copy is the batch's own.
HOST_DATA_FUNCTIONS = frozenset({"tensor", "as_tensor"})
# Tensor methods that hand a tensor's data to Python or NumPy (a device-to-host copy and a wait on GPU);
# no aten op shows them on CPU.
HOST_READ_METHODS = frozenset({"tolist", "numpy", "__array__"})
# Tensor methods that move a tensor to a device.
TRANSFER_METHODS = frozenset({"to", "cuda"})


def _caller() -> str:
    """file:line of the innermost frame outside torch (where the synchronising call was written)."""
    import traceback

    for frame in reversed(traceback.extract_stack()[:-2]):
        if f"{os.sep}torch{os.sep}" not in frame.filename and not (
                frame.filename == __file__ and frame.name in _DETECTOR_FRAMES):
            return f"{frame.filename}:{frame.lineno} ({frame.name})"
    return "?"


_DETECTOR_FRAMES = frozenset({"__torch_function__", "__torch_dispatch__", "_transfer", "_track"})


def pinning_available() -> bool:
    """Whether page-locked host memory exists here (it needs CUDA): only then can a copy's source be pinned."""
    return torch.cuda.is_available()


def _syncs(func, args, kwargs) -> bool:
    name = func.overloadpacket.__name__
    if name in HOST_SYNC_OPS:
        return True
    if name == "repeat_interleave" and torch.is_tensor(args[0] if args else None) and \
            kwargs.get("output_size") is None and len(args) < 4:  # tensor repeats, output size unknown
        return True
    if name in ("index", "index_put", "index_put_"):  # boolean masks become nonzero()
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices)
    if name in ("_to_copy", "copy_"):  # a copy between devices (host <-> device)
        src = args[1] if name == "copy_" else args[0]
        dst = args[0].device if name == "copy_" else kwargs.get("device") or args[0].device
        if not torch.is_tensor(src) or torch.device(dst).type == src.device.type:
            return False
        non_blocking = kwargs.get("non_blocking", args[2] if name == "copy_" and len(args) > 2 else False)
        # host -> device from pinned memory with non_blocking: queued on the stream, no wait
        return not (src.device.type == "cpu" and non_blocking and src.is_pinned())
    return False


def _transfer_problem(src: torch.Tensor, non_blocking: bool, host_built: bool) -> str | None:
    """Why moving the host tensor ``src`` to the device would make the host wait (None: it would not)."""
    if host_built:
        return ("host-to-device copy of a tensor built on the host in the step "
                "(build it on the device, or once and keep it there)")
    if not non_blocking or (pinning_available() and not src.is_pinned()):
        return "host-to-device copy from pageable memory or without non_blocking=True (pin the source)"
    return None


class _HostTransfers(torch.overrides.TorchFunctionMode):
    """The Python-level half of :class:`HostSyncDetector`: reads that no aten op shows
    (``.tolist()``, ``.numpy()``) and explicit moves of host tensors to a device (``.to(device)``,
    ``.to(other)``, ``.cuda()``). On CPU the host is the device, so a move the code asks for is
    flagged as the copy it is on GPU: one that is not ``non_blocking`` from pinned memory (pageable),
    or one of a tensor the step built on the host from nothing (``torch.arange``, ``torch.zeros``,
    ... and ops on such tensors only), which belongs on the device (or cached there)."""

    def __init__(self, record: Callable[[str], None]):
        super().__init__()
        self.record = record
        self.host_built = torch.utils.weak.WeakTensorKeyDictionary()
        self.depth = 0  # > 0 while a flagged call runs: its aten ops are not counted again

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        problem = None
        if name in HOST_READ_METHODS and args and torch.is_tensor(args[0]):
            problem = f"Tensor.{name}() reads the tensor on the host"
        elif name in HOST_DATA_FUNCTIONS and not (args and torch.is_tensor(args[0])):
            problem = f"torch.{name}() of Python data: host data entering the step"
        elif name in TRANSFER_METHODS and args and torch.is_tensor(args[0]) and args[0].device.type == "cpu":
            problem = self._transfer(name, args, kwargs)
        if problem is not None:
            self.record(f"{problem} at {_caller()}")
        self.depth += problem is not None
        try:
            out = func(*args, **kwargs)
        finally:
            self.depth -= problem is not None
        self._track(name, args, kwargs, out)
        return out

    def _transfer(self, name: str, args, kwargs) -> str | None:
        src = args[0]
        if name == "cuda":
            device, non_blocking = "cuda", kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
        else:
            device, _, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
        if device is None:
            return None  # a dtype conversion on the host
        return _transfer_problem(src, bool(non_blocking), src in self.host_built)

    def _track(self, name: str, args, kwargs, out) -> None:
        """Mark outputs built on the host from nothing (a factory given no device), or from
        host-built tensors only. A factory given a device (``device=x.device``, or inside
        ``with torch.device(...)``) builds on the step's device."""
        outputs = [t for t in torch.utils._pytree.tree_leaves(out) if torch.is_tensor(t) and t.device.type == "cpu"]
        if not outputs or name in TRANSFER_METHODS:
            return
        inputs = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if torch.is_tensor(t)]
        if not inputs and kwargs.get("device") is not None:
            return
        if all(t in self.host_built for t in inputs):
            for t in outputs:
                self.host_built[t] = True


class HostSyncDetector(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every call (with the line that made it) that would make the host wait for the device.

    The CPU stand-in for ``torch.cuda.set_sync_debug_mode``. At the aten level it sees what
    ``.item()``, ``bool(t)``, ``int(t)``, boolean-mask indexing and copies between devices call,
    inside forward, backward (autograd's ops run through the mode too) and optimizer steps; a
    companion ``TorchFunctionMode`` (:class:`_HostTransfers`) sees what no aten op shows on CPU:
    ``.tolist()``, ``.numpy()``, ``torch.tensor(...)`` of Python data, and host-to-device moves
    from pageable memory or of tensors built on the host in the step. On CPU a ``.to(device)`` of a tensor
    computed from device data (a no-op on GPU) cannot be told from a host tensor's move and is
    reported too.
    """

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []
        self._transfers = _HostTransfers(self.syncs.append)

    def __enter__(self):
        self._transfers.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._transfers.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self._transfers.depth and _syncs(func, args, kwargs):
            self.syncs.append(f"{func} at {_caller()}")
        return func(*args, **kwargs)


def find_host_syncs(fn: Callable[[], object]) -> list[str]:
    """The synchronising ops of one call of ``fn`` (:class:`HostSyncDetector`), any device."""
    with HostSyncDetector() as detector:
        fn()
    return detector.syncs


def count_host_syncs(fn: Callable[[], object], device: torch.device, where: list[str] | None = None) -> int:
    """Synchronising calls made by one call of ``fn``: on CUDA what ``torch.cuda.set_sync_debug_mode``
    reports (any cause, kernels included), elsewhere :func:`find_host_syncs`. ``where`` collects
    the location of each (the line that made the call)."""
    if device.type != "cuda":
        found = find_host_syncs(fn)
        if where is not None:
            where.extend(found)
        return len(found)
    import warnings

    synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    hits = [w for w in caught if "synchroniz" in str(w.message)]
    if where is not None:
        where.extend(f"{w.filename}:{w.lineno}: {str(w.message).splitlines()[0]}" for w in hits)
    return len(hits)
