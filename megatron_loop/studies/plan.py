"""A registered study: what it trains, what it measures, how it decides, in one object whose text is pinned.

A :class:`StudyPlan` fixes, before any confirmatory run: the models (:class:`Arm`: a CPU twin and its seeds),
the corpus and training settings, the per-seed statistics (:class:`Change`: the paired item-level change of
one measure between two loop counts of the same model, or the difference of two models' changes at the
same seed), the primary test (:class:`Test`, one or more combined by intersection: every one must hold),
its decision rule (supported / not supported / inconclusive, from one-sided 95 % t bounds over seeds and a
smallest effect of interest), the exclusions (none in these studies: every seed that trains counts), the
seed count and the power analysis behind it, and the secondary readings (reported, never decisive).

:meth:`StudyPlan.text` is the plan in words; its sha256 is pinned by ``tests/unit/studies/test_plans.py``
and recorded in ``megatron_loop/studies/registration.py`` by the registration commit, and
``tools/study.py gate`` refuses to start a confirmatory run when the text differs from the registered one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from megatron_loop.registry import ToyRun

# Loop budgets a plan names, resolved per model (:func:`resolve_budget`): the training loop count K, its
# double 2K, and the loop counts whose effective depth L(r) = p + r s + c is a quarter / half / twice L(K).
BUDGETS = ("K", "2K", "K-1", "quarter_depth", "half_depth", "double_depth")


def resolve_budget(budget: str, layout: tuple[int, int, int, int]) -> int:
    """The loop count r a budget name means for a model ``p+s x K+c``."""
    p, s, k, c = layout
    depth = p + k * s + c
    if budget == "K":
        return k
    if budget == "2K":
        return 2 * k
    if budget == "K-1":
        return max(1, k - 1)
    if budget in ("quarter_depth", "half_depth", "double_depth"):
        target = {"quarter_depth": depth // 4, "half_depth": depth // 2, "double_depth": 2 * depth}[budget]
        r, rest = divmod(target - p - c, s)
        if rest or r < 1:
            raise ValueError(f"layout {p}+{s}x{k}+{c}: no loop count with L(r) = {target}")
        return r
    raise ValueError(f"budget {budget!r}: expected one of {', '.join(BUDGETS)}")


@dataclass(frozen=True)
class Arm:
    """One model of a study and the seeds it is trained with (``train.seed``; run NAME-seedS)."""

    toy: ToyRun
    seeds: tuple[int, ...]
    role: str = "primary"  # primary: in the primary test; secondary: reported only

    @property
    def name(self) -> str:
        return self.toy.name

    @property
    def layout_text(self) -> str:
        p, s, k, c = self.toy.layout
        return f"{p}+{s}x{k}+{c}"


@dataclass(frozen=True)
class Measure:
    """A number per run and loop count, from its items.json: ``accuracy`` (percent correct) or ``margin``
    (mean log-probability margin, nats) of a task's items, restricted to one ``split`` (compose: seen /
    in_horizon / beyond) or depths; or ``loss``, the held-out loss (nats per token)."""

    task: str
    kind: str  # accuracy | margin | loss
    split: str | None = None
    depths: tuple[int, ...] = ()

    def label(self) -> str:
        if self.kind == "loss":
            return "held-out loss (nats/token)"
        where = f", {self.split} items" if self.split else ""
        where += f", depth {'/'.join(map(str, self.depths))}" if self.depths else ""
        unit = "accuracy (points)" if self.kind == "accuracy" else "log-probability margin (nats)"
        return f"`{self.task}` {unit}{where}"


@dataclass(frozen=True)
class Change:
    """Per seed: measure at ``at`` minus measure at ``ref`` for the model ``arm`` (a paired change over the
    same items), or, with ``minus``, that change minus another change at the same seed: another model's
    (a contrast of two models, paired by seed: same corpus and data order) or another measure's of the same
    model (is a fall specific to the task?)."""

    measure: Measure
    arm: str
    ref: str = "K"
    at: str = "2K"
    minus: "Change | None" = None

    def label(self) -> str:
        base = f"{self.measure.label()}, r = {self.ref} -> {self.at}, `{self.arm}`"
        return base + (f", minus [{self.minus.label()}]" if self.minus else "")


@dataclass(frozen=True)
class Spread:
    """Per seed: the spread of a measure over every budget, max - min over r = 1..2K, of the model ``arm``
    (or its difference from the model ``minus`` at the same seed): robustness across inference budgets."""

    measure: Measure
    arm: str
    minus: str | None = None

    def label(self) -> str:
        base = f"{self.measure.label()}, max - min over r = 1..2K, `{self.arm}`"
        return base + (f" minus `{self.minus}`" if self.minus else "")


@dataclass(frozen=True)
class Test:
    """One part of the primary test: the seed mean of ``change`` is predicted to be positive (``direction``
    +1) or negative (-1). Supported when its one-sided 95 % t bound excludes 0 on the predicted side;
    refuted when the other one-sided 95 % bound excludes an effect as large as ``sesoi`` (the smallest effect
    of interest, same units); inconclusive otherwise."""

    name: str
    change: Change
    direction: int
    sesoi: float
    claim: str  # what the paper says, in one line


@dataclass(frozen=True)
class Power:
    """The seed count's derivation: per test, the pilots' standard deviation of the per-seed value (or the
    planning value used instead, with why), the smallest effect of interest and the seeds for 80 % power."""

    lines: tuple[str, ...]


@dataclass(frozen=True)
class StudyPlan:
    name: str
    title: str
    finding: str  # the paper's claim tested, quoted
    arms: tuple[Arm, ...]
    corpus_args: str  # tools/make_corpus.py flags
    train: tuple[tuple[str, object], ...]  # train.* of every arm
    tasks: tuple[str, ...]  # tools/paired_study.py eval --tasks
    primary: tuple[Test, ...]  # all must hold (an intersection-union test: no multiplicity correction)
    power: Power
    secondary: tuple[tuple[str, Change | Spread], ...]  # (label, reading): t intervals, never decisive
    notes: tuple[str, ...] = ()  # items, controls, exclusions, what the pilots showed: part of the text

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(f"study {self.name}: no model {name!r}")

    def text(self) -> str:
        """The registered plan in words (docs/REPRODUCE.md prints it; its sha256 is pinned)."""
        lines = [f"Study `{self.name}`: {self.title}", "", f"Finding tested: {self.finding}", "", "Models:"]
        for arm in self.arms:
            t = arm.toy
            lines.append(f"* `{arm.name}` ({arm.layout_text}, {t.conditioning.label}, tiny-llama block), {arm.role}, "
                         f"seeds {', '.join(map(str, arm.seeds))}")
        lines += ["", f"Corpus: tools/make_corpus.py --seed 0 {self.corpus_args}",
                  "Training: " + ", ".join(f"train.{k}={v}" for k, v in self.train)
                  + "; evaluation: every item at every r = 1..2K (tools/paired_study.py eval --tasks "
                  + ",".join(self.tasks) + "), held-out loss per r", "",
                  "Primary test (every part must hold; one-sided 95 % Student t bounds over seeds, n - 1 degrees of "
                  "freedom; per seed the mean over items):"]
        for test in self.primary:
            sign = "> 0" if test.direction > 0 else "< 0"
            lines.append(f"* {test.name}: {test.change.label()} {sign}; smallest effect of interest "
                         f"{test.sesoi:g}. Paper: {test.claim}")
        lines += ["Decision: supported if every part's one-sided bound excludes 0 on the predicted side; not "
                  "supported if any part's opposite one-sided bound excludes its smallest effect of interest (an "
                  "effect that large is ruled out); inconclusive otherwise. No run is excluded: every seed that "
                  "trains counts (a crashed run is rerun with its seed and the crash reported).", "",
                  "Seeds (power analysis, one-sided t test at 5 %, 80 % power):"]
        lines += [f"* {line}" for line in self.power.lines]
        lines += ["", "Secondary readings (t intervals over seeds, no decision):"]
        lines += [f"* {label}: {change.label()}" for label, change in self.secondary]
        if self.notes:
            lines += ["", *self.notes]
        return "\n".join(lines)

    def sha256(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()
