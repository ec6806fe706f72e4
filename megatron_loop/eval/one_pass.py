"""One-pass loop sweeps: every r of a sweep from one forward per batch, where the trajectory allows.

A forward at r reads the Coda and the head from h^r (paper Eq. loop-state-evolution). Where the
recurrent trajectory does not depend on r (no timestep conditioning, or the ``prefix`` grid with
r <= K: the export's ``readout_obstacle``), one forward at r_max that reads Coda + head after every
requested loop (the export's ``LoopLMForCausalLM.loop_readouts``) gives logits bitwise equal to
``forward(num_loops=r)`` for each r: a sweep r = 1..R costs R loop forwards instead of R(R+1)/2.
Elsewhere (the ``rescaled`` grid, t_l = l/r) the sweep runs one pass per r.

lm-eval still scores each r on its own (one ``simple_evaluate`` per r, so its metrics, standard
errors and logged samples are unchanged): ``sweep_lm.LoopSweepLM`` answers the log-likelihood requests
of the first r for every r of the sweep at once, batching exactly as lm-eval's ``HFLM`` does (so the
answers are bitwise those of a pass at each r), and serves the others from memory. Generation
requests (``generate_until``) stay one pass per r. The held-out loss reads every r from one
forward per batch too (``heldout.heldout_loss`` with ``loops``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SweepPasses:
    """How a sweep evaluates its loop counts: ``one_pass`` (one forward per batch at max(loops)) or
    one pass per r, and why (printed, and recorded in results.json ``sweep_passes``)."""

    one_pass: bool
    loops: tuple[int, ...]
    reason: str

    def line(self) -> str:
        listed = ", ".join(map(str, self.loops))
        if self.one_pass:
            return (f"loop sweep: one forward per batch at r = {max(self.loops)} reads out r = {listed} "
                    f"({self.reason})")
        return f"loop sweep: one pass per r for r = {listed} ({self.reason})"

    def record(self) -> dict:
        return {"mode": "one-pass" if self.one_pass else "per-r", "loops": list(self.loops), "reason": self.reason}


def sweep_passes(model, loops, allowed: bool = True) -> SweepPasses:
    """One pass for every r of ``loops`` when the export's trajectory does not depend on r, else per r."""
    loops = tuple(sorted(loops))
    config = model.config
    if not allowed:
        return SweepPasses(False, loops, "--per-r")
    if len(loops) < 2:
        return SweepPasses(False, loops, "a single loop count")
    if config.model_type != "looplm":
        return SweepPasses(False, loops, f"a native {config.model_type} export")
    if not hasattr(model, "loop_readouts"):
        return SweepPasses(False, loops, "the export's modeling file predates one-pass readouts; export again "
                                         "with tools/convert_to_hf.py for one-pass sweeps")
    if config.exit_criterion != "none":
        return SweepPasses(False, loops, f"adaptive exit ({config.exit_criterion}) is on")
    obstacle = model.readout_obstacle(loops)
    if obstacle is not None:
        return SweepPasses(False, loops, obstacle)
    why = ("no timestep conditioning" if config.timestep == "none"
           else f"timestep conditioning ({config.timestep}) on the prefix grid, r <= K = {config.train_loops}")
    return SweepPasses(True, loops, f"the trajectory does not depend on r: {why}")
