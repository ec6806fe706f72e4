"""Muon update math (App. C.2 "Optimizer"): momentum, Newton-Schulz, per-projection scaling.

Pure tensor functions on FULL matrices; where the matrices come from (a plain parameter, or a
ZeRO partition gathered back together) is :mod:`megatron_loop.optim.partitions`'s job.

The maths follows ``torch.optim.Muon`` (torch 2.13) operation for operation so that it can be
the test reference:

* momentum ``B <- mu*B + (1-mu)*g`` (``lerp``), Nesterov input ``g + mu*(B - g)``;
* 5 quintic Newton-Schulz steps with coefficients (3.4445, -4.7750, 2.0315), run in bfloat16
  after normalising by the Frobenius norm, on the transpose when the matrix is tall;
* the update is scaled to AdamW's RMS, ``0.2*sqrt(max(rows, cols))`` ("Muon is scalable",
  ``adjust_lr_fn="match_rms_adamw"``, the default) or Keller's ``sqrt(max(1, rows/cols))``
  (``"original"``).

Fused megatron-core matrices (QKV, SwiGLU fc1) are orthogonalised PER PROJECTION: q, k and v of
the fused QKV (as Megatron's ``muon_split_qkv``) and gate and up of fc1 each go through
Newton-Schulz on their own and are scaled by their own shape, which is exactly what separate
HF-style ``q_proj``/``k_proj``/``v_proj``/``gate_proj``/``up_proj`` matrices would get. The split
comes from :func:`megatron_loop.model.roles.projection_rows`, never from a parameter name; the
row indices are built once per weight and device, on that device (:func:`projection_rows_on`), so a
step copies nothing from the host.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from megatron_loop.model import roles

NS_COEFFICIENTS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7
# Newton-Schulz compute dtype (torch.optim.Muon's). The multi-rank equivalence tests set float32: in bf16 a
# last-bit difference of the input (another reduction order) can flip a rounding and move a weight by ~1e-4.
NS_DTYPE = torch.bfloat16
ScaleRule = Literal["match_rms_adamw", "original"]
SCALE_RULES: tuple[str, ...] = ("match_rms_adamw", "original")


def newton_schulz(
    matrix: torch.Tensor,
    steps: int = 5,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = NS_EPS,
) -> torch.Tensor:
    """Approximate ``U V^T`` of ``matrix`` (singular values pushed into roughly [0.7, 1.2]).

    Computed in bfloat16 like ``torch.optim.Muon`` and Keller Jordan's reference; the result is
    returned in ``matrix``'s dtype (bf16 -> fp32 is exact, so fp32 callers see the same values
    ``torch.optim.Muon`` adds). Deliberately not ``torch.compile``d: DeepSpeed's compiled
    Newton-Schulz costs ~25 s of cold start on CPU, paid by every rank of every run.
    """
    if matrix.ndim != 2:
        raise ValueError(f"Newton-Schulz needs a 2-D matrix, got shape {tuple(matrix.shape)}")
    a, b, c = coefficients
    x = matrix.to(NS_DTYPE)
    tall = matrix.size(0) > matrix.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    if tall:
        x = x.T
    return x.to(matrix.dtype)


def muon_scale(shape: tuple[int, int] | torch.Size, rule: ScaleRule = "match_rms_adamw") -> float:
    """Multiplier of the orthogonalised update of one ``rows x cols`` projection."""
    rows, cols = int(shape[0]), int(shape[1])
    if rule == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if rule == "original":
        return math.sqrt(max(1.0, rows / cols))
    raise ValueError(f"unknown Muon scale rule {rule!r}; expected one of {SCALE_RULES}")


def momentum_input_(
    buffer: torch.Tensor, grad: torch.Tensor, momentum: float, nesterov: bool
) -> torch.Tensor:
    """Advance the momentum ``buffer`` in place and return the Newton-Schulz input.

    Elementwise, so it runs on a flat ZeRO partition as well as on a whole matrix: the momentum
    lives (and is checkpointed) wherever the gradient shard lives.
    """
    buffer.lerp_(grad, 1 - momentum)
    return grad.lerp(buffer, momentum) if nesterov else buffer.clone()


# weight -> {device: its projections' row indices on that device}; weak: a freed model takes its entries
_ROWS: WeakTensorKeyDictionary = WeakTensorKeyDictionary()


def projection_rows_on(param: torch.nn.Parameter, device: torch.device) -> list[torch.Tensor] | None:
    """:func:`roles.projection_rows` of ``param``, built on ``device`` at the first call and kept:
    rebuilding them on the host and copying them every step would make the host wait for the
    device on each fused projection (a pageable host-to-device copy)."""
    per_device = _ROWS.setdefault(param, {})
    if device not in per_device:
        with torch.device(device):  # the splits' torch.arange calls build on the device itself
            per_device[device] = roles.projection_rows(param)
    return per_device[device]


def orthogonalized_update(
    matrix: torch.Tensor,
    param: torch.nn.Parameter,
    *,
    steps: int = 5,
    rule: ScaleRule = "match_rms_adamw",
) -> torch.Tensor:
    """Scaled Muon direction for one (possibly fused) weight; ``matrix`` is shaped like it.

    Each projection of ``param`` (see :func:`roles.projection_rows`) is orthogonalised and
    scaled by its own shape; the returned tensor holds ``scale_j * NS(matrix[rows_j])`` in the
    rows of projection ``j``. The caller applies ``param -= lr * update``.
    """
    rows = projection_rows_on(param, matrix.device)
    if rows is not None and matrix.ndim == 3:  # a stack of matrices (roles.StackSplit): its 2-D view
        return orthogonalized_update(matrix.reshape(-1, matrix.shape[-1]), param, steps=steps,
                                     rule=rule).reshape(matrix.shape)
    return orthogonalize_projections(matrix, rows, steps=steps, rule=rule)


def orthogonalize_projections(matrix: torch.Tensor, rows: list[torch.Tensor] | None, *, steps: int = 5,
                              rule: ScaleRule = "match_rms_adamw") -> torch.Tensor:
    """``scale_j * NS(matrix[rows_j])`` in the rows of every projection ``j`` of a 2-D ``matrix``
    (``rows`` None: the matrix is one projection)."""
    if rows is None:
        return newton_schulz(matrix, steps).mul_(muon_scale(matrix.shape, rule))
    update = torch.empty_like(matrix)
    covered = 0
    for index in rows:
        sub = matrix.index_select(0, index)
        update.index_copy_(0, index, newton_schulz(sub, steps).mul_(muon_scale(sub.shape, rule)))
        covered += index.numel()
    if covered != matrix.size(0):
        raise ValueError(f"projection split covers {covered} of {matrix.size(0)} rows")
    return update
