"""Geometry metrics of App. C.4 "Geometry Probing", as pure functions on tensors.

Rows of every ``[n, m]`` tensor are state vectors (one token position each). Equation names
follow the paper: Eq. (probing_angle), Eq. (probing_relative_update), Eq. (probing_variance),
Eq. (probing_variance_normalization), the amplification factors g_inj / g_core / g_mix with
their telescoping identity, Eq. (probing_response) and Eq. (probing_lag_response).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

EPSILON = 1e-12  # denominator floor of the angle and the relative update norm
RESPONSE_FLOOR = 1e-8  # C_{i->j} is recorded as zero when B_j <= this


def safe_ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN for a zero denominator (the paper's ratios assume positive variances)."""
    return numerator / denominator if denominator != 0 else math.nan


# ----------------------------------------------------------------------------- per-row terms
def angular_distance(u: torch.Tensor, v: torch.Tensor, eps: float = EPSILON) -> torch.Tensor:
    """a(u, v) = arccos(clip_[-1,1](u.v / max(|u||v|, eps))) / pi per row, Eq. (probing_angle).

    The floor gives 1/2 when either vector is zero; the clip absorbs rounding overshoots.
    """
    u, v = u.double(), v.double()
    denom = torch.clamp(u.norm(dim=-1) * v.norm(dim=-1), min=eps)
    cosine = torch.clamp((u * v).sum(dim=-1) / denom, -1.0, 1.0)
    return torch.arccos(cosine) / math.pi


def relative_update(before: torch.Tensor, after: torch.Tensor, eps: float = EPSILON) -> torch.Tensor:
    """|after - before| / max(|before|, eps) per row, the summand of Eq. (probing_relative_update)."""
    before, after = before.double(), after.double()
    return (after - before).norm(dim=-1) / torch.clamp(before.norm(dim=-1), min=eps)


def token_variance(h: torch.Tensor) -> torch.Tensor:
    """Variance over the m hidden coordinates of each row, correction one (divide by m - 1)."""
    return h.double().var(dim=-1, correction=1)


def update_norm(h_in: torch.Tensor, h_out: torch.Tensor) -> torch.Tensor:
    """|u_p| with u_p = h_out_p - h_in_p, the block update of App. C.4 "Computational interaction"."""
    return (h_out.double() - h_in.double()).norm(dim=-1)


def update_change_norm(u_skipped: torch.Tensor, u_base: torch.Tensor) -> torch.Tensor:
    """|u^(-i)_{j,p} - u_{j,p}| per row, the summand of N_{i->j}."""
    return (u_skipped.double() - u_base.double()).norm(dim=-1)


# ----------------------------------------------------------------------------- block / loop means
def mean_angular_distance(u: torch.Tensor, v: torch.Tensor, eps: float = EPSILON) -> float:
    """A_l or A_loop(t): the mean over sequences of a(u_n, v_n) (not arccos of a mean cosine)."""
    return float(angular_distance(u, v, eps).mean())


def mean_relative_update(before: torch.Tensor, after: torch.Tensor, eps: float = EPSILON) -> float:
    """rho_l or rho_loop(t): the mean of per-sequence ratios, Eq. (probing_relative_update)."""
    return float(relative_update(before, after, eps).mean())


def state_variance(h: torch.Tensor) -> float:
    """V(h) = mean over the tokens of T of the per-token variance with correction one,
    Eq. (probing_variance)."""
    return float(token_variance(h.reshape(-1, h.shape[-1])).mean())


def normalized_variance(variances: Sequence[float], reference: float) -> list[float]:
    """V~(t) = V(x^(t)) / V(x^(L_tr)), Eq. (probing_variance_normalization)."""
    return [safe_ratio(v, reference) for v in variances]


def standard_error(total: torch.Tensor, total_sq: torch.Tensor, count: int) -> torch.Tensor | None:
    """Standard error of a mean from the running sum and sum of squares of its ``count`` terms:
    sqrt(s^2 / count) with the sample variance s^2 (correction one); None for a single term."""
    if count < 2:
        return None
    mean = total / count
    variance = torch.clamp((total_sq - count * mean.square()) / (count - 1), min=0.0)
    return (variance / count).sqrt()


# ----------------------------------------------------------------------------- amplification
def amplification_factors(state_var: Sequence[float], injected_var: Sequence[float],
                          core_out_var: Sequence[float]) -> dict[str, list[float]]:
    """g_inj(t) = V(z^t)/V(x^t), g_core(t) = V(y^t)/V(z^t), g_mix(t) = V(x^{t+1})/V(y^t).

    ``state_var`` is V(x^(0..L)); ``injected_var`` V(z^(0..L-1)) (input of the first shared
    block after injection); ``core_out_var`` V(y^(0..L-1)) (output of the last shared block
    before loop-level mixing).
    """
    loops = len(injected_var)
    if len(state_var) != loops + 1 or len(core_out_var) != loops:
        raise ValueError(f"expected L+1 state variances and L z/y variances; got {len(state_var)}, "
                         f"{len(injected_var)}, {len(core_out_var)}")
    return {
        "g_inj": [safe_ratio(injected_var[t], state_var[t]) for t in range(loops)],
        "g_core": [safe_ratio(core_out_var[t], injected_var[t]) for t in range(loops)],
        "g_mix": [safe_ratio(state_var[t + 1], core_out_var[t]) for t in range(loops)],
    }


def telescoping_product(factors: dict[str, Sequence[float]], train_loops: int) -> float:
    """prod_{t=L_tr}^{L-1} g_inj(t) g_core(t) g_mix(t), which equals V(x^L) / V(x^{L_tr})."""
    loops = len(factors["g_inj"])
    if train_loops > loops:
        raise ValueError(f"the telescoping product needs L >= L_tr; got L={loops}, L_tr={train_loops}")
    return math.prod(factors[k][t] for t in range(train_loops, loops) for k in ("g_inj", "g_core", "g_mix"))


# ----------------------------------------------------------------------------- interaction
def relative_response(numerator: float, baseline: float, floor: float = RESPONSE_FLOOR) -> float:
    """C_{i->j} = N_{i->j} / B_j, Eq. (probing_response); zero when B_j <= floor (a fallback,
    not a measured absence of influence)."""
    return 0.0 if baseline <= floor else numerator / baseline


def interaction_from_updates(u_base: torch.Tensor, u_skipped: torch.Tensor,
                             floor: float = RESPONSE_FLOOR) -> tuple[float, float, float]:
    """(N_{i->j}, B_j, C_{i->j}) from the target updates ``[|T|, m]`` of a normal run and of
    the run with occurrence i skipped; N and B are token means of norms."""
    numerator = float(update_change_norm(u_skipped, u_base).mean())
    baseline = float(u_base.double().norm(dim=-1).mean())
    return numerator, baseline, relative_response(numerator, baseline, floor)


# ----------------------------------------------------------------------------- lag aggregation
def lag_pairs(loop_of: Sequence[int | None], train_loops: int) -> dict[int, list[tuple[int, int]]]:
    """P_d = {(i, j): i < j, r(i) > L_tr, r(j) > L_tr, r(j) - r(i) = d}, Eq. (probing_lag_response).

    ``loop_of[l - 1]`` is r(l), the one-based loop holding effective position l (None for
    prelude and coda occurrences). Positions in the pairs are one-based.
    """
    beyond = [(pos, r) for pos, r in enumerate(loop_of, start=1) if r is not None and r > train_loops]
    pairs: dict[int, list[tuple[int, int]]] = {}
    for a, (i, r_i) in enumerate(beyond):
        for j, r_j in beyond[a + 1:]:
            pairs.setdefault(r_j - r_i, []).append((i, j))
    return dict(sorted(pairs.items()))


def lag_means(matrix: Sequence[Sequence[float | None]], pairs: dict[int, list[tuple[int, int]]]) -> dict[int, float]:
    """C(d) = mean of matrix[i][j] over P_d (one-based positions), each pair weighted equally."""
    means = {}
    for d, members in pairs.items():
        values = [matrix[i - 1][j - 1] for i, j in members]
        if any(v is None for v in values):
            raise ValueError(f"lag {d}: a pair of P_d was not measured (skip runs missing for its source)")
        means[d] = sum(values) / len(values)
    return means


def lag_summary(by_lag: dict[int, float], counts: dict[int, int], lags: Iterable[int]) -> float:
    """C_D = sum_d |P_d| C(d) / sum_d |P_d| over the lag set D (block pairs weigh equally)."""
    lags = list(lags)
    missing = [d for d in lags if d not in by_lag]
    if missing:
        raise ValueError(f"lags {missing} were not measured (available: {sorted(by_lag)})")
    total = sum(counts[d] for d in lags)
    return sum(counts[d] * by_lag[d] for d in lags) / total


def percent_difference(value_a: float, value_b: float) -> float:
    """100 (C_D^A / C_D^B - 1): the percent difference of configuration A over B."""
    return 100.0 * (value_a / value_b - 1.0)


def lag_ratio(by_lag_a: dict[int, float], by_lag_b: dict[int, float]) -> dict[int, float]:
    """R(d) = C_A(d) / C_B(d) at the common lags: a ratio of configuration-level means (e.g. the
    triple I+H+T over the double H+T), not a mean of matched pairwise ratios."""
    return {d: by_lag_a[d] / by_lag_b[d] for d in sorted(set(by_lag_a) & set(by_lag_b))}
