"""The pre-registered analysis plan of a paired study (``finding1_paired``): the paper's first
finding tested as the paper measures it (Sec. 3, Fig. 1(a), Tables 8-9): one trained model,
weights fixed, the change of its scores from r = K to r = 2K, reasoning against knowledge.

A :class:`PairedPlan` fixes, before any confirmatory number is seen, the primary model, the
statistic, the exclusion rule (r = K accuracy bands, read before any change is computed) and the
decision rule; ``megatron_loop/eval/paired.py`` applies it, ``tools/paired_study.py plan`` prints
it, and docs/REPRODUCE.md quotes it as it was fixed (:meth:`PairedPlan.text`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class PairedPlan:
    """What a paired study tests, and how it decides."""

    primary: str  # the twin named in advance as the primary test
    fixed: str  # when and on what evidence the plan was fixed (the pilots)
    reasoning_task: str = "compose"  # bundled task keys (eval/tasks.py): metric and group come from there
    knowledge_task: str = "facts"
    target_multiple: int = 2  # the primary statistic compares r = target_multiple * K with r = K
    control_offset: int = 1  # the control compares r = K - control_offset with r = K
    # a run (model, seed) enters the paired statistics only if, at r = K (percent): its knowledge
    # accuracy over every item lies in knowledge_band (chance 25 %: not stored below, no room to fall
    # above), its reasoning accuracy over the trained hops reaches reasoning_floor (chance 10 %: the
    # task not learned below) and over every hop stays at most reasoning_ceiling (no room to rise)
    knowledge_band: tuple[float, float] = (35.0, 95.0)
    reasoning_floor: float = 35.0
    reasoning_ceiling: float = 95.0
    min_seeds: int = 3  # fewer included seeds of the primary model: inconclusive
    bootstrap_replicates: int = 10_000  # primary statistic, control, per hop
    curve_replicates: int = 2_000  # the curves over every r
    # True only for the exploratory reading of post_hoc_all_runs: same statistics, no exclusion
    post_hoc: bool = False

    def post_hoc_all_runs(self) -> "PairedPlan":
        """The same statistics over every run, the exclusion rule switched off: an exploratory reading
        chosen after the data were seen (``tools/paired_study.py analyse --post-hoc-all-runs``), never
        the registered test; its report says so on its first line."""
        return replace(self, knowledge_band=(0.0, 100.0), reasoning_floor=0.0, reasoning_ceiling=100.0, post_hoc=True)

    def target(self, k: int) -> int:
        return self.target_multiple * k

    def control(self, k: int) -> int:
        return max(1, k - self.control_offset)

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        """The plan in words (docs/REPRODUCE.md quotes it verbatim)."""
        kl, kh = self.knowledge_band
        return "\n".join([
            f"* Primary model: `{self.primary}`. The other allocations are secondary.",
            f"* Primary statistic, at r = {self.target_multiple}K against r = K on the same items: per seed s, "
            f"Delta_R,s = mean over every `{self.reasoning_task}` item (all hops) of [correct at "
            f"{self.target_multiple}K - correct at K], Delta_K,s the same over every `{self.knowledge_task}` item, "
            "and D_s = Delta_R,s - Delta_K,s (percentage points; the task's headline metric from eval/tasks.py). "
            "Combined over the included seeds as their unweighted mean.",
            f"* Intervals: hierarchical bootstrap, {self.bootstrap_replicates:,} replicates (seeds with "
            "replacement, then items with replacement within each drawn seed, independently per task; the "
            "drawn seeds are shared by Delta_R and Delta_K, so D stays paired); percentile 95 % intervals, "
            "one-sided 95 % bounds at the 5th / 95th percentile.",
            f"* Exclusion, from r = K accuracies only, before any change is computed: a run (model, seed) is "
            f"left out of every paired statistic if its knowledge accuracy (every item) is outside [{kl:g}, {kh:g}] "
            f"% (floor or ceiling), its reasoning accuracy over the trained hops is below {self.reasoning_floor:g} % "
            f"(not learned), or its reasoning accuracy over every hop is above {self.reasoning_ceiling:g} % "
            "(ceiling). Excluded runs are reported with their numbers.",
            f"* Decision: the paper's first finding is supported for the primary model if Delta_R > 0 and "
            "Delta_K < 0 with one-sided intervals excluding 0 (5th percentile of Delta_R > 0 and 95th "
            f"percentile of Delta_K < 0); not supported otherwise; inconclusive if fewer than {self.min_seeds} of "
            "its seeds are included. Whatever the outcome, Delta_R, Delta_K and D are reported with intervals.",
            f"* Secondary, no decision attached: the same statistics for the other allocations; the curves over "
            f"r = 1..2K ({self.curve_replicates:,} replicates each); r = K - {self.control_offset} against r = K "
            "as a control where both are expected to fall; Delta_R per hop; accuracy per hop over r "
            "(Fig. 1(b,c)); held-out loss over r; every run's per-seed numbers, excluded or not.",
            f"* Fixed: {self.fixed}",
        ])
