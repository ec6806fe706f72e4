"""Warmup-stable-decay learning-rate schedule (App. C.2 "Learning-rate scheduler", Table 3).

``lambda(t) = t/T_w`` for ``0 <= t <= T_w``; ``1`` for ``T_w < t <= T_w+T_s``;
``1 - 0.9 (t - T_w - T_s)/T_d`` up to ``T_w+T_s+T_d``, so the last update runs at 0.1 x peak.
Lengths: ``T_w = round(0.05 T)``, ``T_s = round(0.85 T)``, ``T_d = T - T_w - T_s``
(5394 -> 270/4585/539, 2860 -> 143/2431/286).

Convention: ``t`` counts optimizer updates from 1, i.e. update ``t`` (the t-th call of
``optimizer.step``) runs at ``peak * lambda(t)``: the first update already moves (lambda(1) =
1/T_w), warmup ends at update T_w with the peak, and update T (the last) runs at exactly 0.1 x
peak. The same multiplier drives both param groups (one peak lr for Muon and AdamW).

Extending a run (``train.max_steps`` raised on resume, ``training/resume.py``) re-derives the split
for the new total. From a checkpoint of the stable phase that is the WSD way (the point of a
warmup-stable-decay schedule: the stable phase can be prolonged and the decay run later, over the
new end; App. C.2 only states the schedule). From a checkpoint
already in its decay the re-derived split would jump back to the peak, so by default
(``train.schedule_on_resume: continue_decay``) the decay goes on linearly from the multiplier the
checkpoint's last update ran at down to ``final`` at the new end (:class:`WSDMultiplier`'s
``decay_from_*`` fields); ``rewarm`` asks for the jump back to the peak by name.

The schedule is applied by a ``torch.optim.lr_scheduler.LambdaLR`` passed to
``deepspeed.initialize`` as ``lr_scheduler`` (not DeepSpeed's WarmupLR, which overwrites
per-group learning rates); the engine steps it once per optimizer update and checkpoints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from megatron_loop.config import OptimizerSettings

if TYPE_CHECKING:  # torch only where a scheduler is built: the dry run imports this module
    import torch

# The paper's shape, as the config declares it (train.warmup_fraction / stable_fraction / min_lr_ratio).
WARMUP_FRACTION = OptimizerSettings.warmup_fraction
STABLE_FRACTION = OptimizerSettings.stable_fraction
FINAL_FRACTION = OptimizerSettings.min_lr_ratio


class WSDSplit(NamedTuple):
    warmup: int
    stable: int
    decay: int


def wsd_split(total_steps: int, warmup_fraction: float = WARMUP_FRACTION,
              stable_fraction: float = STABLE_FRACTION) -> WSDSplit:
    """Warmup / stable / decay update counts of a run of ``total_steps`` updates
    (Table 3: 5394 -> 270/4585/539, 2860 -> 143/2431/286)."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    warmup = round(warmup_fraction * total_steps)
    stable = round(stable_fraction * total_steps)
    return WSDSplit(warmup, stable, total_steps - warmup - stable)


def wsd_lambda(step: int, warmup: int, stable: int, decay: int, final: float = FINAL_FRACTION) -> float:
    """The paper's multiplier ``lambda(t)`` at update ``t = step`` (held at ``final`` after the end)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step <= warmup:
        return step / warmup if warmup > 0 else 1.0
    if step <= warmup + stable:
        return 1.0
    if decay <= 0:
        return 1.0
    progress = min(step - warmup - stable, decay) / decay
    return 1.0 - (1.0 - final) * progress


@dataclass
class WSDMultiplier:
    """Picklable ``LambdaLR`` lambda: its fields go into the scheduler's state_dict (resume).

    ``LambdaLR`` calls it with the number of updates already done; the next update is
    ``done + 1`` (see the module docstring).
    """

    warmup: int
    stable: int
    decay: int
    final: float = FINAL_FRACTION
    # continue_decay (train.schedule_on_resume): after update ``decay_from_step``, which ran at
    # ``decay_from_value``, decay linearly to ``final`` at the last update instead of the split's shape
    decay_from_step: int | None = None
    decay_from_value: float = 1.0

    @property
    def total(self) -> int:
        return self.warmup + self.stable + self.decay

    def __call__(self, done: int) -> float:
        step = done + 1
        start = self.decay_from_step
        if start is not None and step > start:
            progress = min(step - start, self.total - start) / max(self.total - start, 1)
            return self.decay_from_value + (self.final - self.decay_from_value) * progress
        return wsd_lambda(step, self.warmup, self.stable, self.decay, self.final)

    def in_decay(self, step: int) -> bool:
        """Whether update ``step`` runs below the peak after the stable phase (or a continued decay)."""
        return step > self.warmup + self.stable or (self.decay_from_step is not None and step > self.decay_from_step)


def wsd_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_fraction: float = WARMUP_FRACTION,
                  stable_fraction: float = STABLE_FRACTION,
                  final: float = FINAL_FRACTION) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` applying the WSD multiplier to every group of ``optimizer`` (one peak lr)."""
    split = wsd_split(total_steps, warmup_fraction, stable_fraction)
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, WSDMultiplier(*split, final=final))
