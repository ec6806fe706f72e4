"""Recurrence conditioning (paper Sec. 5 and App. C.1) for the training model.

Each equation has one implementation, in the HF export's modeling file
(``megatron_loop/hf/modeling_looplm.py``, which must stay self-contained: it ships inside every
export). The classes here are those classes, plus what training adds: the ``model.*`` key named in
errors, the App. E.1 initialisation noise, and the parameter roles the optimizer groups by.

State conditioning:
  * :class:`InitialStateInjection` -- I_phi(h, h0), Eq. (initial_state_injection_variants).
  * :class:`HistoryStateInjection` -- sum_j B_j(h_{l-j} - h_l), Eq. (history_state_injection),
    over the window :func:`history_window`.
Timestep conditioning:
  * :func:`timestep_features` -- psi(t, dt) in R^8, Eq. (timestep_features), with the
    training / ``rescaled`` / ``prefix`` grids of App. C.1.
  * :class:`LoopGating` -- g_l = 1 + q^T psi_l, Eq. (loop_level_timestep_gating).
  * :class:`BranchGating` -- per core layer and branch scalar gate, Eq. (branch_level_timestep_gating).
  * :class:`AdaLN` -- [g - 1; s] = W psi_l, Eq. (adaln_timestep_parameters).
  * LoopFormer's shortcut modulation (``model.timestep: shortcut``, Jeddi et al., ICLR 2026):
    :class:`ShortcutEmbedding` c_l = SiLU(E_t(t_l) + E_dt(dt_l)) and, per branch, the same
    :class:`AdaLN` parametrised as [g; s] = W c_l + b (the export's ``adaln_arguments``).
BranchGating and AdaLN modulate the residual branch u+ = u + g * Branch((1 + s) * Norm(u)),
Eq. (branch_timestep_modulation); the core block (``layers.LoopBlock``) applies that update with
the export's :func:`~megatron_loop.hf.modeling_looplm.modulated_residual`.

Every parameter here starts so that the model equals the unconditioned BaseLoop at
initialisation (unless ``model.injection_init_noise`` perturbs the initial-state injection, the
App. E.1 ablation), and is tagged with the ``conditioning`` role (AdamW group, App. C.2; the
dense injection matrices go to Muon with ``train.muon_conditioning_matrices``).
"""

from __future__ import annotations

import torch
from torch import nn

from megatron_loop.errors import LoopConfigError
from megatron_loop.hf import modeling_looplm as export
from megatron_loop.model import roles

NUM_TIMESTEP_FEATURES = export.NUM_TIMESTEP_FEATURES
history_window = export.history_window


class InitialStateInjection(export.InitialStateInjection):
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
        if kind not in export.INITIAL_INJECTIONS[1:]:
            raise LoopConfigError(f"model.initial_injection={kind!r}: expected scalar, channel, residual_channel "
                                  "or dense")
        if init_noise and kind == "dense":
            raise LoopConfigError("model.injection_init_noise: expected 0 for dense initial injection "
                                  "(the App. E.1 ablation covers scalar, channel and residual_channel)")
        super().__init__(kind, hidden_size)
        if init_noise:
            with torch.no_grad():
                for p in self.parameters():
                    p.add_(torch.randn_like(p) * init_noise)
        roles.tag_all(self, roles.CONDITIONING)
        if kind == "dense":  # one bias-free projection of concat(h, h0), as Huginn's adapter
            roles.set_conditioning_matrix(self.weight)


class HistoryStateInjection(export.HistoryStateInjection):
    """History-state injection, Eq. (history_state_injection):

        h_{l+1} = F(h_l + sum_{j=1}^{m_l} B_j(h_{l-j} - h_l)),   m_l = min(w, max(l - 1, 0)).

    The module returns the sum; the caller adds it to the (possibly initial-state-injected) core
    input. The window holds only completed recurrent states h_1..h_{l-1}: never h0, never the
    current state (:func:`history_window`). ``B_j`` depends only on the lag j, is shared across
    iterations, and is zero-initialised: ``scalar`` beta [w], ``channel`` [w, d], ``dense`` [w, d, d]
    (lag j uses ``beta[j-1]``, dense as ``diff @ beta[j-1].T``).
    """

    def __init__(self, kind: str, hidden_size: int, window: int):
        if kind not in export.HISTORY_INJECTIONS[1:]:
            raise LoopConfigError(f"model.history_injection={kind!r}: expected scalar, channel or dense")
        super().__init__(kind, hidden_size, window)
        self.window = window
        roles.tag_all(self, roles.CONDITIONING)
        if kind == "dense":  # w independent d x d matrices, one per lag
            roles.set_conditioning_matrix(self.beta, roles.StackSplit(window, hidden_size))


def timestep_features(num_loops: int, train_loops: int, grid: str,
                      device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """psi(t_l, dt) for l = 0..r-1, shape [r, 8], Eq. (timestep_features) (the export's function; a
    grid or loop count it refuses is a :class:`LoopConfigError` here).

    psi(t, dt) = (t, dt, t^2, dt^2, t dt, sin(pi t), cos(pi t) - 1, sin(2 pi t)),
    t_l = l / T, dt = 1 / T. Training uses T = K. Inference grids (App. C.1):
    ``rescaled`` T = r (any r); ``prefix`` T = K, the first r steps, r <= K.
    """
    try:
        return export.timestep_features(num_loops, train_loops, grid, device=device, dtype=dtype)
    except ValueError as e:
        raise LoopConfigError(str(e)) from None


class LoopGating(export.LoopGating):
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
        roles.tag_all(self, roles.CONDITIONING)


class BranchGating(export.BranchGating):
    """Branch Gating (BG) for one residual branch of one core layer, Eq. (branch_level_timestep_gating):

        g = 1 + (q_k^b)^T psi_l (a scalar broadcast over channels),  s = 0.

    8 parameters per branch, 16 per core layer.
    """

    def __init__(self):
        super().__init__()
        roles.tag_all(self, roles.CONDITIONING)


class AdaLN(export.AdaLN):
    """AdaLN modulation for one residual branch of one core layer, Eq. (adaln_timestep_parameters):

        [g - 1; s] = W_k^b psi_l,   W_k^b in R^{2d x 8} (rows :d give g - 1, rows d: give s),

    used as u+ = u + g * Branch((1 + s) * Norm(u)); no additive shift. 16d parameters per
    branch, 32d per core layer. The backbone RMSNorm weights stay.

    ``timestep='shortcut'``: LoopFormer's modulation of the branch, [g; s] = W c_l + b, W [2d, d],
    b [2d], c_l from :class:`ShortcutEmbedding` (its ``adaLN_modulation``, one Linear(d, 4d) per
    block = one [2d, d] per branch). Initialised as LoopFormer's released code trains it
    (models/loopformer.py): the block zeroes the Linear, but ``GPT.__init__`` then applies
    ``_init_weights`` to every ``nn.Linear``, so W ~ N(0, ``init_std``) (0.02 there;
    ``model.initializer_range`` here) and b = 0: every gate starts near 0, not at 1.
    """

    def __init__(self, hidden_size: int, timestep: str = "adaln", init_std: float = 0.02):
        super().__init__(hidden_size, **export.adaln_arguments(timestep, hidden_size))
        if timestep == "shortcut":
            with torch.no_grad():
                self.weight.normal_(0.0, init_std)
        roles.tag_all(self, roles.CONDITIONING)


class ShortcutEmbedding(export.ShortcutEmbedding):
    """LoopFormer's conditioning of loop l on (t_l, dt_l) (the export's class):

        c_l = SiLU(E_t(t_l) + E_dt(dt_l)),   E(x) = W2 SiLU(W1 sinusoid_256(x) + b1) + b2,

    two ``TimestepEmbedder`` s of models/loopformer.py, summed (``c = te + dte``). Initialised as
    there: every weight N(0, ``init_std``), biases 0. Plain ``conditioning`` parameters (AdamW):
    they map fixed functions of (t, dt), not a hidden state (as AdaLN's W, ``roles``).
    """

    def __init__(self, hidden_size: int, init_std: float = 0.02):
        super().__init__(hidden_size)
        with torch.no_grad():
            for layer in (*self.time_embedder, *self.step_embedder):
                if isinstance(layer, nn.Linear):
                    layer.weight.normal_(0.0, init_std)
                    layer.bias.zero_()
        roles.tag_all(self, roles.CONDITIONING)


def timestep_times(num_loops: int, train_loops: int, grid: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(t_l, dt_l) float64 over the grid's horizon (the export's function; a refused grid or loop count
    is a :class:`LoopConfigError` here)."""
    try:
        return export.timestep_times(num_loops, train_loops, grid)
    except ValueError as e:
        raise LoopConfigError(str(e)) from None


def trajectory_times(steps, horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(t_l, dt_l) float64 of a trajectory of step sizes n_l / K (the export's function; a bad trajectory
    is a :class:`LoopConfigError` here)."""
    try:
        return export.trajectory_times(steps, horizon)
    except ValueError as e:
        raise LoopConfigError(str(e)) from None


def branch_modulation(kind: str, hidden_size: int, init_std: float = 0.02) -> nn.Module | None:
    """The per-branch timestep module a core block carries for ``model.timestep=kind``."""
    if kind == "branch_gating":
        return BranchGating()
    if kind in ("adaln", "shortcut"):
        return AdaLN(hidden_size, kind, init_std)
    return None
