"""Parameter roles: the model's own knowledge of what each parameter is.

The optimizer (App. C.2 "Optimizer") puts the matrix-valued attention and MLP projection
weights of Prelude, Core and Coda into Muon and everything else (embeddings, LM head, norms,
conditioning parameters) into AdamW. That split is decided here, when the model builds each
parameter, never by matching parameter names.

Fused megatron-core matrices carry how to split them into their projections, so that Muon
orthogonalises each projection on its own (q, k, v of the fused QKV, as Megatron's
``muon_split_qkv``; gate and up of the fused fc1), exactly as if the model had separate
``q_proj``/``k_proj``/``v_proj``/``gate_proj``/``up_proj`` matrices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MATRIX = "matrix"  # hidden projection matrix -> Muon
EMBEDDING = "embedding"  # token embedding -> AdamW
HEAD = "head"  # LM head (absent when tied) -> AdamW
NORM = "norm"  # RMSNorm weights -> AdamW
CONDITIONING = "conditioning"  # injection / timestep parameters -> AdamW (see conditioning_matrix)
ROLES = (MATRIX, EMBEDDING, HEAD, NORM, CONDITIONING)

_ROLE_ATTR = "looplm_role"
_SPLIT_ATTR = "looplm_split"
_DENSE_ATTR = "looplm_conditioning_matrix"


@dataclass(frozen=True)
class QKVSplit:
    """megatron-core fused QKV layout: rows grouped per query group as
    ``[q (heads_per_group * head_dim), k (head_dim), v (head_dim)]`` repeated ``num_groups`` times."""

    num_groups: int
    heads_per_group: int
    head_dim: int

    def row_index(self) -> list[torch.Tensor]:
        per_group = (self.heads_per_group + 2) * self.head_dim
        q_rows = self.heads_per_group * self.head_dim
        base = torch.arange(self.num_groups).unsqueeze(1) * per_group
        q = (base + torch.arange(q_rows)).reshape(-1)
        k = (base + q_rows + torch.arange(self.head_dim)).reshape(-1)
        v = (base + q_rows + self.head_dim + torch.arange(self.head_dim)).reshape(-1)
        return [q, k, v]


@dataclass(frozen=True)
class GateUpSplit:
    """megatron-core fused SwiGLU fc1 layout: ``[gate (ffn rows); up (ffn rows)]``."""

    ffn_size: int

    def row_index(self) -> list[torch.Tensor]:
        return [torch.arange(self.ffn_size), torch.arange(self.ffn_size, 2 * self.ffn_size)]


@dataclass(frozen=True)
class StackSplit:
    """A stack of ``count`` independent ``rows x cols`` matrices stored as one ``[count, rows, cols]``
    tensor (dense history injection: one B_j per lag). Muon treats it as its 2-D view
    ``[count * rows, cols]`` split into ``count`` row blocks, i.e. one matrix at a time."""

    count: int
    rows: int

    def row_index(self) -> list[torch.Tensor]:
        return [torch.arange(j * self.rows, (j + 1) * self.rows) for j in range(self.count)]


def set_role(param: torch.nn.Parameter, role: str, split: QKVSplit | GateUpSplit | StackSplit | None = None) -> None:
    if role not in ROLES:
        raise ValueError(f"unknown parameter role {role!r}; expected one of {ROLES}")
    setattr(param, _ROLE_ATTR, role)
    setattr(param, _SPLIT_ATTR, split)


def set_conditioning_matrix(param: torch.nn.Parameter, split: StackSplit | None = None) -> None:
    """Tag a dense injection matrix: a ``conditioning`` parameter that is also a hidden matrix.

    The paper's two passages disagree on it. Sec. 2.2: Muon "for hidden matrix parameters, and
    AdamW for embeddings, output heads, biases, and other non-matrix parameters" -- a dense
    injection matrix is a hidden matrix, so Muon. App. C.2: Muon for "the matrix-valued attention
    and feed-forward projection weights", AdamW for "other vector- or scalar-valued parameters"
    -- it is neither, so a reading either way. AdamW by default (the App. C.2 reading), Muon with
    ``train.muon_conditioning_matrices`` (see :func:`uses_muon`).

    AdaLN's W_k^b (2d x 8, Eq. adaln_timestep_parameters) is *not* tagged here: it maps the 8 fixed
    timestep features psi_l, not a hidden state, so under neither passage is it a hidden matrix; it
    is a plain ``conditioning`` parameter and always goes to AdamW.
    """
    set_role(param, CONDITIONING, split)
    setattr(param, _DENSE_ATTR, True)


def is_conditioning_matrix(param: torch.nn.Parameter) -> bool:
    return role_of(param) == CONDITIONING and getattr(param, _DENSE_ATTR, False)


def role_of(param: torch.nn.Parameter) -> str:
    role = getattr(param, _ROLE_ATTR, None)
    if role is None:
        raise ValueError(f"parameter of shape {tuple(param.shape)} has no role; every model parameter must be tagged")
    return role


def uses_muon(param: torch.nn.Parameter, conditioning_matrices: bool = False) -> bool:
    """Muon for hidden matrices; with ``conditioning_matrices`` also for the dense injection matrices."""
    return role_of(param) == MATRIX or (conditioning_matrices and is_conditioning_matrix(param))


def projection_split(param: torch.nn.Parameter) -> QKVSplit | GateUpSplit | StackSplit | None:
    """How a fused matrix splits into its projections (None: the matrix is one projection)."""
    return getattr(param, _SPLIT_ATTR, None)


def projection_rows(param: torch.nn.Parameter) -> list[torch.Tensor] | None:
    """Row indices of each projection inside a fused matrix (None: the matrix is one projection)."""
    split = projection_split(param)
    return None if split is None else split.row_index()


def tag_all(module: torch.nn.Module, role: str) -> None:
    """Tag every parameter of ``module`` with ``role`` (used for conditioning modules)."""
    for p in module.parameters():
        set_role(p, role)
