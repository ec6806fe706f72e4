"""Recurrence conditioning (paper Sec. 5 and App. C.1).

State conditioning:
  * :class:`InitialStateInjection` -- I_phi(h, h0), Eq. (initial_state_injection_variants).
  * :class:`HistoryStateInjection` -- sum_j B_j(h_{l-j} - h_l), Eq. (history_state_injection).
Timestep conditioning:
  * :func:`timestep_features` -- psi(t, dt) in R^8, Eq. (timestep_features), with the
    training / ``rescaled`` / ``prefix`` grids of App. C.1.
  * :class:`LoopGating` -- g_l = 1 + q^T psi_l, Eq. (loop_level_timestep_gating).
  * :class:`BranchGating` -- per core layer and branch scalar gate, Eq. (branch_level_timestep_gating).
  * :class:`AdaLN` -- [g - 1; s] = W psi_l, Eq. (adaln_timestep_parameters).
BranchGating and AdaLN modulate the residual branch u+ = u + g * Branch((1 + s) * Norm(u)),
Eq. (branch_timestep_modulation); the core block (``layers.LoopBlock``) applies that update.

Every parameter here starts so that the model equals the unconditioned BaseLoop at
initialisation (unless ``model.injection_init_noise`` perturbs the initial-state injection, the
App. E.1 ablation), and is tagged with the ``conditioning`` role (AdamW group, App. C.2; the
dense injection matrices go to Muon with ``train.muon_conditioning_matrices``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from megatron_loop.errors import LoopConfigError
from megatron_loop.model import roles

NUM_TIMESTEP_FEATURES = 8


class InitialStateInjection(nn.Module):
    """Initial-state injection I_phi(h, h0), applied before every execution of the shared core.

    Eq. (initial_state_injection_variants), App. C.1 "Initial-state injection models":
      scalar           h + alpha h0                 alpha = 0          1 parameter
      channel          a * h + b * h0               a = 1, b = 0       2d
      residual_channel (1 + delta_a) * h + b * h0   delta_a = b = 0    2d
      dense            [W_h W_0] [h; h0]            [I_d 0], no bias   2d^2
    Shared across loops and token positions.

    ``init_noise`` (``model.injection_init_noise``, App. E.1 "Input Noise Initialization
    Ablation"): the paper compares "initialization without noise against a noise scale of 0.03"
    for the scalar, channel and residual_channel variants without saying how the noise enters;
    we read it as N(0, init_noise^2) added to every coefficient of the identity initialisation
    above (alpha; a and b; delta_a and b), drawn from torch's global generator (so the run seed
    fixes it). Default 0: exactly the identity.
    """

    def __init__(self, kind: str, hidden_size: int, init_noise: float = 0.0):
        super().__init__()
        d = hidden_size
        self.kind = kind
        if kind == "scalar":
            self.alpha = nn.Parameter(torch.zeros(1))
        elif kind == "channel":
            self.a = nn.Parameter(torch.ones(d))
            self.b = nn.Parameter(torch.zeros(d))
        elif kind == "residual_channel":
            self.delta_a = nn.Parameter(torch.zeros(d))
            self.b = nn.Parameter(torch.zeros(d))
        elif kind == "dense":
            weight = torch.zeros(d, 2 * d)
            weight[:, :d] = torch.eye(d)
            self.weight = nn.Parameter(weight)
        else:
            raise LoopConfigError(f"model.initial_injection={kind!r}: expected scalar, channel, residual_channel or dense")
        if init_noise:
            if kind == "dense":
                raise LoopConfigError("model.injection_init_noise: expected 0 for dense initial injection "
                                      "(the App. E.1 ablation covers scalar, channel and residual_channel)")
            with torch.no_grad():
                for p in self.parameters():
                    p.add_(torch.randn_like(p) * init_noise)
        roles.tag_all(self, roles.CONDITIONING)
        if kind == "dense":  # one bias-free projection of concat(h, h0), as Huginn's adapter
            roles.set_conditioning_matrix(self.weight)

    def forward(self, h: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        if self.kind == "scalar":
            return h + self.alpha * h0
        if self.kind == "channel":
            return self.a * h + self.b * h0
        if self.kind == "residual_channel":
            return (1 + self.delta_a) * h + self.b * h0
        return torch.cat([h, h0], dim=-1) @ self.weight.t()


class HistoryStateInjection(nn.Module):
    """History-state injection, Eq. (history_state_injection):

        h_{l+1} = F(h_l + sum_{j=1}^{m_l} B_j(h_{l-j} - h_l)),   m_l = min(w, max(l - 1, 0)).

    This module returns the sum; the caller adds it to the (possibly initial-state-injected)
    core input. The window holds only completed recurrent states h_1..h_{l-1}: never h0,
    never the current state (see :func:`history_window`). ``B_j`` depends only on the lag j,
    is shared across iterations, and is zero-initialised: ``scalar`` beta [w], ``channel``
    [w, d], ``dense`` [w, d, d] (lag j uses ``beta[j-1]``, dense as ``diff @ beta[j-1].T``).
    """

    def __init__(self, kind: str, hidden_size: int, window: int):
        super().__init__()
        d = hidden_size
        shapes = {"scalar": (window,), "channel": (window, d), "dense": (window, d, d)}
        if kind not in shapes:
            raise LoopConfigError(f"model.history_injection={kind!r}: expected scalar, channel or dense")
        self.kind = kind
        self.window = window
        self.beta = nn.Parameter(torch.zeros(shapes[kind]))
        roles.tag_all(self, roles.CONDITIONING)
        if kind == "dense":  # w independent d x d matrices, one per lag
            roles.set_conditioning_matrix(self.beta, roles.StackSplit(window, d))

    def forward(self, h: torch.Tensor, past: list[torch.Tensor]) -> torch.Tensor:
        """``past[j-1]`` is h_{l-j}; differences are taken w.r.t. the recurrent state ``h``."""
        total = torch.zeros_like(h)
        for j, h_lag in enumerate(past, start=1):
            diff = h_lag - h
            beta = self.beta[j - 1]
            if self.kind == "dense":
                total = total + diff @ beta.t()
            else:
                total = total + beta * diff
        return total


def history_window(completed: list[torch.Tensor], window: int) -> list[torch.Tensor]:
    """The states h_{l-1}, ..., h_{l-m_l} for the transition h_l -> h_{l+1}.

    ``completed`` is [h_1, ..., h_l] (every recurrent state produced so far, h0 excluded);
    its last element is the current state h_l, which the window excludes, so
    m_l = min(w, max(l - 1, 0)).
    """
    previous = completed[:-1]
    return previous[::-1][:window]


def timestep_features(num_loops: int, train_loops: int, grid: str,
                      device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """psi(t_l, dt) for l = 0..r-1, shape [r, 8], Eq. (timestep_features).

    psi(t, dt) = (t, dt, t^2, dt^2, t dt, sin(pi t), cos(pi t) - 1, sin(2 pi t)),
    t_l = l / T, dt = 1 / T. Training uses T = K. Inference grids (App. C.1):
    ``rescaled`` T = r (any r); ``prefix`` T = K, the first r steps, r <= K.
    """
    if num_loops < 1:
        raise LoopConfigError(f"num_loops={num_loops}: expected an integer >= 1")
    if grid == "rescaled":
        horizon = num_loops
    elif grid == "prefix":
        if num_loops > train_loops:
            raise LoopConfigError(
                f"timestep_grid='prefix' with num_loops={num_loops}: the prefix grid keeps T = train_loops "
                f"= {train_loops} and needs num_loops <= {train_loops}; use timestep_grid='rescaled' to extrapolate")
        horizon = train_loops
    else:
        raise LoopConfigError(f"timestep_grid={grid!r}: expected 'rescaled' or 'prefix'")
    t = torch.arange(num_loops, dtype=torch.float64) / horizon
    dt = torch.full_like(t, 1.0 / horizon)
    psi = torch.stack([t, dt, t * t, dt * dt, t * dt, torch.sin(math.pi * t),
                       torch.cos(math.pi * t) - 1, torch.sin(2 * math.pi * t)], dim=-1)
    return psi.to(device=device, dtype=dtype)


class LoopGating(nn.Module):
    """Loop Gating (LG), Eq. (loop_level_timestep_gating):

        g_l = 1 + q^T psi_l,     h_{l+1} = x_l + g_l (y_l - x_l),

    where y_l is the shared core's output for this iteration and x_l its reference (the caller
    picks it with ``model.loop_gating_reference``). 8 parameters.

    With state injection the reference is ambiguous: Eq. (loop_level_timestep_gating) writes
    h_{l+1} = h_l + g_l (F(h_l) - h_l), i.e. without injection, while Sec. 5.2 describes LG as
    scaling "the difference between the shared stack's output and its input", and with injection
    the stack's input is u_l = I(h_l, h0) + sum_j B_j(h_{l-j} - h_l), not h_l. ``state`` (the
    default) mixes with the recurrent state h_l; ``injected`` mixes with u_l. Without injection
    u_l = h_l and the two agree.
    """

    def __init__(self):
        super().__init__()
        self.q = nn.Parameter(torch.zeros(NUM_TIMESTEP_FEATURES))
        roles.tag_all(self, roles.CONDITIONING)

    def forward(self, h: torch.Tensor, y: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
        """``h``: the reference x_l (h_l or u_l); ``y``: the core output for this loop."""
        g = 1 + psi.to(self.q.dtype) @ self.q
        return h + g.to(h.dtype) * (y - h)


class BranchGating(nn.Module):
    """Branch Gating (BG) for one residual branch of one core layer, Eq. (branch_level_timestep_gating):

        g = 1 + (q_k^b)^T psi_l (a scalar broadcast over channels),  s = 0.

    8 parameters per branch, 16 per core layer.
    """

    def __init__(self):
        super().__init__()
        self.q = nn.Parameter(torch.zeros(NUM_TIMESTEP_FEATURES))
        roles.tag_all(self, roles.CONDITIONING)

    def forward(self, psi: torch.Tensor) -> tuple[torch.Tensor, None]:
        return 1 + psi.to(self.q.dtype) @ self.q, None


class AdaLN(nn.Module):
    """AdaLN modulation for one residual branch of one core layer, Eq. (adaln_timestep_parameters):

        [g - 1; s] = W_k^b psi_l,   W_k^b in R^{2d x 8} (rows :d give g - 1, rows d: give s),

    used as u+ = u + g * Branch((1 + s) * Norm(u)); no additive shift. 16d parameters per
    branch, 32d per core layer. The backbone RMSNorm weights stay.
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.weight = nn.Parameter(torch.zeros(2 * hidden_size, NUM_TIMESTEP_FEATURES))
        roles.tag_all(self, roles.CONDITIONING)

    def forward(self, psi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.weight @ psi.to(self.weight.dtype)
        return 1 + out[: self.hidden_size], out[self.hidden_size:]


def branch_modulation(kind: str, hidden_size: int) -> nn.Module | None:
    """The per-branch timestep module a core block carries for ``model.timestep=kind``."""
    if kind == "branch_gating":
        return BranchGating()
    if kind == "adaln":
        return AdaLN(hidden_size)
    return None
