"""Pair-weighted interaction summaries C_D and configuration comparisons (App. A.4
"Aggregation by loop lag"): C_D over a lag set, percent differences 100 (C_D^A / C_D^B - 1)
and pointwise ratios R(d) = C_A(d) / C_B(d) (e.g. triple I+H+T over double H+T)."""

from __future__ import annotations

from collections.abc import Sequence

from megatron_loop.errors import LoopConfigError
from megatron_loop.probes import metrics

LagSet = tuple[int, ...]


def parse_lag_sets(text: str) -> list[LagSet]:
    """``"1-6,2-6"`` -> [(1..6), (2..6)]; single lags as ``"3"``."""
    sets = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            lo, _, hi = part.partition("-")
            lo_i, hi_i = int(lo), int(hi or lo)
        except ValueError:
            raise LoopConfigError(f"lag set {part!r}: expected 'a-b' or 'a' with integers") from None
        if not 0 <= lo_i <= hi_i:
            raise LoopConfigError(f"lag set {part!r}: expected 0 <= a <= b")
        sets.append(tuple(range(lo_i, hi_i + 1)))
    return sets


def lag_set_name(lags: LagSet) -> str:
    return f"{lags[0]}-{lags[-1]}"


def _by_lag(result: dict) -> dict | None:
    interaction = result.get("interaction")
    return interaction and interaction.get("by_lag")


def default_lag_sets(results: Sequence[dict]) -> list[LagSet]:
    """The common cross-loop range {1..d_max} shared by every probed depth with lags >= 1, and
    {2..d_max} (the paper's {1..6} and {2..6} for D = 56 and 84 of a 4x7 model)."""
    maxima = [max(b["lags"]) for b in map(_by_lag, results) if b and max(b["lags"]) >= 1]
    if not maxima:
        return []
    top = min(maxima)
    return [tuple(range(start, top + 1)) for start in (1, 2) if start <= top]


def lag_set_summaries(by_lag: dict, lag_sets: Sequence[LagSet]) -> dict[str, dict[str, float]]:
    """C_D, N_D and B_D (pair-weighted) for each lag set fully measured at this depth."""
    counts = dict(zip(by_lag["lags"], by_lag["pairs"]))
    out = {}
    for lags in lag_sets:
        if all(d in counts for d in lags):
            out[lag_set_name(lags)] = {
                key: metrics.lag_summary(dict(zip(by_lag["lags"], by_lag[key])), counts, lags)
                for key in ("C", "N", "B")}
    return out


def add_summaries(report: dict, lag_sets: Sequence[LagSet] | None = None) -> list[LagSet]:
    """Writes ``interaction.by_lag.summaries`` into every loop-count result of a probe report."""
    results = list(report["loops"].values())
    lag_sets = default_lag_sets(results) if lag_sets is None else list(lag_sets)
    for result in results:
        by_lag = _by_lag(result)
        if by_lag:
            by_lag["summaries"] = lag_set_summaries(by_lag, lag_sets)
    report["lag_sets"] = [lag_set_name(s) for s in lag_sets]
    return lag_sets


def compare_reports(report_a: dict, report_b: dict) -> dict:
    """Configuration A against reference B at each common loop count: percent differences of
    C_D, N_D, B_D and the pointwise ratios R(d) of C, N and B (ratios of configuration means)."""
    if report_a["sampling"]["fingerprint"] != report_b["sampling"]["fingerprint"]:
        raise LoopConfigError("the reference report used different examples or selection masks "
                              "(sampling fingerprints differ); App. A.4 compares identical samples")
    out = {}
    for L in sorted(set(report_a["loops"]) & set(report_b["loops"]), key=int):
        a, b = _by_lag(report_a["loops"][L]), _by_lag(report_b["loops"][L])
        if not (a and b):
            continue
        entry = {"ratio_by_lag": {}, "percent_difference": {}}
        for key in ("C", "N", "B"):
            ratio = metrics.lag_ratio(dict(zip(a["lags"], a[key])), dict(zip(b["lags"], b[key])))
            entry["ratio_by_lag"][key] = {"lags": list(ratio), "ratio": list(ratio.values())}
        for name in set(a.get("summaries", {})) & set(b.get("summaries", {})):
            entry["percent_difference"][name] = {
                key: metrics.percent_difference(a["summaries"][name][key], b["summaries"][name][key])
                for key in ("C", "N", "B")}
        out[L] = entry
    return out
