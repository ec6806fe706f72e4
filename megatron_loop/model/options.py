"""What one forward of the LoopLM runs: :class:`LoopOptions`.

The loop count r and its timestep grid, the loops that build a graph (truncated backpropagation), a
LoopFormer trajectory of step sizes, per-token adaptive exit, Huginn's per-step noise seed, what the output
keeps (trajectory, head input, logits) and, in training, the objective that replaces the cross-entropy
(LoopFormer's shortcut consistency, :class:`~megatron_loop.model.shortcut.ShortcutTrajectory`; Ouro's Stage I
or II, :class:`~megatron_loop.model.exit_gate.ExitObjective`). One object, passed whole: through the DeepSpeed
engine to ``LoopLM.forward``, and on from there (LoopFormer's two passes, an adaptive forward run without a
graph), so nothing a caller asked for is dropped on the way. A training step's options are made by
:class:`megatron_loop.training.step.TrainStep`; everything else passes the fields it needs as keywords
(``model(ids, num_loops=3)``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoopOptions:
    """One forward's settings (module docstring); the defaults are the paper's forward at r = K."""

    num_loops: int | None = None  # r (None: the training K)
    timestep_grid: str | None = None  # rescaled | prefix (None: model.timestep_grid)
    backprop_loops: int | None = None  # N: only the last N loops build a graph (None: all of them)
    loop_steps: tuple[int, ...] | None = None  # LoopFormer: step sizes n_l / K, positive integers summing to K
    exit_criterion: str = "none"  # none | kl | cosine | q_exit: per-token exit with r as the cap (inference)
    exit_threshold: float = 0.0
    exit_mode: str | None = None  # readout | freeze (TokenExit; None: the criterion's own, readout for q_exit)
    weighted_exit: bool = False  # Ouro: the expected logits over the exit distribution (inference, exit_gate.py)
    initial_state_seed: int | None = None  # Huginn: a training step's seed (None: position-keyed noise)
    return_trajectory: bool = False  # [h^0, h^1, ..., h^r], each [b, s, d]
    return_hidden: bool = False  # the head input [b, s, d]
    compute_logits: bool = True
    objective: Any = None  # training: ShortcutTrajectory (LoopFormer) or ExitObjective (Ouro)

    @classmethod
    def of(cls, options: LoopOptions | None = None, fields: dict | None = None) -> LoopOptions:
        """``options`` (default: the paper's forward) with ``fields`` (a forward call's keywords) set."""
        base = cls() if options is None else options
        if not fields:
            return base
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"LoopLM.forward got {unknown[0]!r}, which is no LoopOptions field; expected one of "
                            f"{[f.name for f in dataclasses.fields(cls)]}")
        return dataclasses.replace(base, **fields)

    def but(self, **fields) -> LoopOptions:
        """These options with ``fields`` changed."""
        return dataclasses.replace(self, **fields)
