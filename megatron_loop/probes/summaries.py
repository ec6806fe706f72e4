"""Pair-weighted interaction summaries C_D and configuration comparisons (App. C.4
"Aggregation by loop lag"): C_D over a lag set, percent differences 100 (C_D^A / C_D^B - 1)
and pointwise ratios R(d) = C_A(d) / C_B(d) (e.g. triple I+H+T over double H+T); the mean C per
shared-block pair s:q over a lag set and its configuration ratio (appendix figure
``fig:appendix_composition_geometry`` b,d); and the terminal response profile of
``fig:conditioning_responses`` (a). Everything here is computed from the N, B, C matrices a
probe report stores, so it can be recomputed from any ``geometry.json``."""

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


def block_pair_means(result: dict, layout: dict, train_loops: int, lag_sets: Sequence[LagSet]) -> dict:
    """Mean C, N and B per shared-block pair s:q over the pairs of P_d, d in each lag set (one-based
    source block s and target block q inside the shared stack; each occurrence pair weighs equally,
    B_j repeated for every source paired with target j), for lag sets fully measured at this depth."""
    interaction = result["interaction"]
    prelude, shared = layout["prelude"], layout["shared"]
    pairs = metrics.lag_pairs(result["loop_of"], train_loops)
    block = lambda position: (position - prelude - 1) % shared + 1  # noqa: E731
    names = [f"{a}:{b}" for a in range(1, shared + 1) for b in range(1, shared + 1)]
    out = {}
    for lags in lag_sets:
        if not all(d in pairs for d in lags):
            continue
        groups: dict[str, list[tuple[int, int]]] = {n: [] for n in names}
        for d in lags:
            for i, j in pairs[d]:
                groups[f"{block(i)}:{block(j)}"].append((i, j))
        kept = [n for n in names if groups[n]]
        means = {key: [sum(_pair_value(interaction, key, i, j) for i, j in groups[n]) / len(groups[n]) for n in kept]
                 for key in ("C", "N", "B")}
        out[lag_set_name(lags)] = {"pairs": kept, "counts": [len(groups[n]) for n in kept], **means}
    return out


def _pair_value(interaction: dict, key: str, i: int, j: int) -> float:
    value = interaction["B"][j - 1] if key == "B" else interaction[key][i - 1][j - 1]
    if value is None:
        raise ValueError(f"pair {i}->{j} was not measured (skip runs missing for source {i})")
    return value


def terminal_response(result: dict, layout: dict, train_loops: int) -> dict | None:
    """The response profile of ``fig:conditioning_responses`` (a), for one loop count r.

    Sources S are the occurrences just past the training depth, l = L(K)+1 .. L(K)+(p+s+c) (the
    paper's positions 21-24 for 4-layer models with L(K) = 20); for each later target j the
    response is the mean of C_{i->j} over S, divided by its mean over the targets of the final
    loop r. ``terminal_to_core`` is that ratio at the last occurrence j = L(r) (a coda block when
    c > 0; the paper reports 0.85-0.89 without and 0.48-0.50 with a coda). None when S was not
    measured or the final loop does not lie wholly after S.
    """
    interaction = result.get("interaction")
    if not interaction:
        return None
    prelude, shared, coda = layout["prelude"], layout["shared"], layout["coda"]
    depth, loops = result["effective_depth"], result["num_loops"]
    train_depth = prelude + train_loops * shared + coda
    sources = [i for i in range(train_depth + 1, train_depth + prelude + shared + coda + 1)
               if i in interaction["sources"] and i < depth]
    final_loop = list(range(prelude + (loops - 1) * shared + 1, prelude + loops * shared + 1))
    if not sources or final_loop[0] <= max(sources):
        return None
    targets = list(range(max(sources) + 1, depth + 1))
    response = [sum(interaction["C"][i - 1][j - 1] for i in sources) / len(sources) for j in targets]
    core = sum(response[targets.index(j)] for j in final_loop) / len(final_loop)
    if core <= 0:
        return None
    relative = [v / core for v in response]
    return {"sources": sources, "targets": targets, "segments": [result["segments"][j - 1] for j in targets],
            "response": response, "final_loop": final_loop, "final_loop_mean": core, "relative": relative,
            "terminal_to_core": relative[-1]}


def add_summaries(report: dict, lag_sets: Sequence[LagSet] | None = None) -> list[LagSet]:
    """Writes ``interaction.by_lag.summaries`` (C_D, N_D, B_D), ``interaction.by_lag.block_pairs``
    and ``interaction.terminal_response`` into every loop-count result of a probe report."""
    results = list(report["loops"].values())
    lag_sets = default_lag_sets(results) if lag_sets is None else list(lag_sets)
    for result in results:
        by_lag = _by_lag(result)
        if by_lag:
            by_lag["summaries"] = lag_set_summaries(by_lag, lag_sets)
            by_lag["block_pairs"] = block_pair_means(result, report["layout"], report["train_loops"], lag_sets)
        if result.get("interaction"):
            result["interaction"]["terminal_response"] = terminal_response(result, report["layout"],
                                                                           report["train_loops"])
    report["lag_sets"] = [lag_set_name(s) for s in lag_sets]
    return lag_sets


def compare_reports(report_a: dict, report_b: dict) -> dict:
    """Configuration A against reference B at each common loop count: percent differences of
    C_D, N_D, B_D and the pointwise ratios R(d) of C, N and B (ratios of configuration means)."""
    if report_a["sampling"]["fingerprint"] != report_b["sampling"]["fingerprint"]:
        raise LoopConfigError("the reference report used different examples or selection masks "
                              "(sampling fingerprints differ); App. C.4 compares identical samples")
    out = {}
    for L in sorted(set(report_a["loops"]) & set(report_b["loops"]), key=int):
        a, b = _by_lag(report_a["loops"][L]), _by_lag(report_b["loops"][L])
        if not (a and b):
            continue
        entry = {"ratio_by_lag": {}, "percent_difference": {}, "ratio": {}, "block_pair_ratio": {}}
        for key in ("C", "N", "B"):
            ratio = metrics.lag_ratio(dict(zip(a["lags"], a[key])), dict(zip(b["lags"], b[key])))
            entry["ratio_by_lag"][key] = {"lags": list(ratio), "ratio": list(ratio.values())}
        for name in sorted(set(a.get("summaries", {})) & set(b.get("summaries", {}))):
            entry["percent_difference"][name] = {
                key: metrics.percent_difference(a["summaries"][name][key], b["summaries"][name][key])
                for key in ("C", "N", "B")}
            entry["ratio"][name] = {key: metrics.safe_ratio(a["summaries"][name][key], b["summaries"][name][key])
                                    for key in ("C", "N", "B")}
        for name in sorted(set(a.get("block_pairs", {})) & set(b.get("block_pairs", {}))):
            pa, pb = a["block_pairs"][name], b["block_pairs"][name]
            common = [n for n in pa["pairs"] if n in pb["pairs"]]
            entry["block_pair_ratio"][name] = {
                "pairs": common,
                **{key: [metrics.safe_ratio(pa[key][pa["pairs"].index(n)], pb[key][pb["pairs"].index(n)])
                         for n in common] for key in ("C", "N", "B")}}
        out[L] = entry
    return out
