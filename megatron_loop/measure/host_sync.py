"""Calls that make the host wait for the device: the CPU detector (:class:`HostSyncDetector`, a
stand-in for ``torch.cuda.set_sync_debug_mode``) and :func:`count_host_syncs` (either, by device).

Used by the tests and benchmarks that prove a training step never reads a value back to the host.
"""

from __future__ import annotations

import os
import traceback
import warnings
from typing import Callable

import torch
import torch.utils._python_dispatch

from megatron_loop.measure.timing import synchronize


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


def _calling_line() -> str:
    """file:line of the innermost frame outside torch (where the synchronising call was written)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if f"{os.sep}torch{os.sep}" not in frame.filename and not (
                frame.filename == __file__ and frame.name in _DETECTOR_FRAMES):
            return f"{frame.filename}:{frame.lineno} ({frame.name})"
    return "?"


_DETECTOR_FRAMES = frozenset({"__torch_function__", "__torch_dispatch__", "_transfer", "_track"})


def pinning_available() -> bool:
    """Whether page-locked host memory exists here (it needs CUDA): only then can a copy's source be pinned."""
    return torch.cuda.is_available()


def _makes_host_wait(func, args, kwargs) -> bool:
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
            self.record(f"{problem} at {_calling_line()}")
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
        if not self._transfers.depth and _makes_host_wait(func, args, kwargs):
            self.syncs.append(f"{func} at {_calling_line()}")
        return func(*args, **kwargs)


def find_host_syncs(fn: Callable[[], object]) -> list[str]:
    """The synchronising ops of one call of ``fn`` (:class:`HostSyncDetector`), any device."""
    with HostSyncDetector() as detector:
        fn()
    return detector.syncs


def sync_warnings(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    """The warnings of ``torch.cuda.set_sync_debug_mode("warn")`` that report a synchronising call.
    torch's own notice on switching the mode on ("Synchronization debug mode is a prototype feature
    ...") is not one: counted, it made the first case measured on an H200 report a sync."""
    return [w for w in caught if "synchroniz" in str(w.message) and "prototype feature" not in str(w.message)]


def count_host_syncs(fn: Callable[[], object], device: torch.device, where: list[str] | None = None) -> int:
    """Synchronising calls made by one call of ``fn``: on CUDA what ``torch.cuda.set_sync_debug_mode``
    reports (any cause, kernels included), elsewhere :func:`find_host_syncs`. ``where`` collects
    the location of each (the line that made the call)."""
    if device.type != "cuda":
        found = find_host_syncs(fn)
        if where is not None:
            where.extend(found)
        return len(found)
    synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    hits = sync_warnings(caught)
    if where is not None:
        where.extend(f"{w.filename}:{w.lineno}: {str(w.message).splitlines()[0]}" for w in hits)
    return len(hits)
