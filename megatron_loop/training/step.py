"""What one training step computes (OLMo-core's ``TrainModule``): :class:`TrainStep`.

The loop (:mod:`megatron_loop.training.loop`) asks it for the step's loop count and, per micro-batch, the
forward's :class:`~megatron_loop.model.options.LoopOptions`; it knows no design. Everything a design changes
about a training step is here, read from the config once:

* the loop count of each micro-batch: K, or drawn by ``train.loop_sampling`` from (``train.seed``, step,
  micro-batch) -- Huginn's draw per micro-batch -- or from (``train.seed``, step) with ``train.loop_sampling_per:
  step`` (:mod:`megatron_loop.training.loop_sampling`), the same on every rank, with psi on the grid of the
  drawn r (``rescaled``), and ``train.backprop_loops`` (truncated backpropagation);
* Huginn (``model.initial_state: noise``, :mod:`megatron_loop.model.initial_state`): the micro-batch's noise
  seed, a pure function of (``train.seed``, step, micro-batch, rank);
* LoopFormer (``train.shortcut_consistency``, :mod:`megatron_loop.model.shortcut`): the micro-batch's short
  trajectory and its objective;
* Ouro (``train.exit_gate_objective``, :mod:`megatron_loop.model.exit_gate`): the Stage I or II objective, and
  Stage II's frozen LM (:meth:`TrainStep.prepare`, before the optimizer is built).

Validation forwards run the cross-entropy at each r of ``train.eval_loops`` (:meth:`TrainStep.validation`).
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_loop.config import ModelConfig, TrainConfig
from megatron_loop.model.exit_gate import ExitObjective
from megatron_loop.model.initial_state import step_seed
from megatron_loop.model.options import LoopOptions
from megatron_loop.model.shortcut import shortcut_trajectory
from megatron_loop.training.loop_sampling import sample_train_loops


@dataclass(frozen=True)
class TrainStep:
    """A training step of the run ``train`` / ``model`` on data-parallel rank ``rank`` (module docstring)."""

    train: TrainConfig
    model: ModelConfig
    rank: int = 0

    @property
    def exit_objective(self) -> ExitObjective | None:
        return ExitObjective.of(self.train)

    def prepare(self, model) -> None:
        """What the objective needs of the built model before the optimizer sees it (Ouro's Stage II: every
        parameter but the gate's frozen)."""
        if self.exit_objective is not None:
            self.exit_objective.prepare(model)

    def loops(self, step: int, micro: int = 0) -> int:
        """The loop count of micro-batch ``micro`` of step ``step`` (0-based), the same on every rank (per step
        with ``train.loop_sampling_per: step``: ``micro`` is then not read)."""
        return sample_train_loops(self.train, self.model.train_loops, step, micro)

    def step_loops(self, step: int, accumulation: int) -> list[int]:
        """The loop counts of the ``accumulation`` micro-batches of step ``step``."""
        return [self.loops(step, micro) for micro in range(accumulation)]

    def options(self, loops: int, step: int, micro: int) -> LoopOptions:
        """The forward of micro-batch ``micro`` of step ``step`` at ``loops`` loops."""
        k = self.model.train_loops
        seed = (step_seed(self.train.seed, step, micro, self.rank) if self.model.initial_state == "noise" else None)
        return LoopOptions(num_loops=loops, timestep_grid=None if loops == k else "rescaled",  # psi on r's grid
                           backprop_loops=self.train.backprop_loops, initial_state_seed=seed, compute_logits=False,
                           objective=shortcut_trajectory(self.train, k, step, micro) or self.exit_objective)

    @staticmethod
    def validation(loops: int) -> LoopOptions:
        """A validation forward: the cross-entropy of the prediction at ``loops``."""
        return LoopOptions(num_loops=loops, compute_logits=False)
