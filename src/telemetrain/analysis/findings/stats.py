"""The robust statistics every finding rule shares: medians and MADs, change points (PELT) and a shift-of-medians
test, a trend test with its slope, and the tail of a binomial. Standard library only; each function documents its
assumptions.

Why these: training telemetry is heavy-tailed (a GC pause, a descheduled process, a checkpoint in a window) and
bursty, so every rule takes medians and median absolute deviations rather than means and standard deviations, and
ranks or medians rather than values where a test is needed (a single 10x window moves a mean, not a median).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

__all__ = [
    "MAD_TO_SD",
    "binomial_tail",
    "chebyshev_confidence",
    "mad",
    "mann_kendall",
    "median",
    "median_shift",
    "min_rank_sum_p",
    "noise_scale",
    "normal_quantile",
    "normal_sf",
    "pelt",
    "rank_sum_p",
    "robust_z",
    "theil_sen",
]

MAD_TO_SD = 1.4826  # MAD x this = the standard deviation, for normal data


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        raise ValueError("median of no values")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def mad(values: Sequence[float], center: float | None = None) -> float:
    """Median absolute deviation from ``center`` (default: the median)."""
    c = median(values) if center is None else center
    return median([abs(v - c) for v in values])


def robust_z(value: float, reference: Sequence[float], floor: float) -> tuple[float, float, float]:
    """``(z, center, scale)``: how many robust standard deviations ``value`` lies above the median of ``reference``.
    The scale is ``MAD_TO_SD x MAD``, but never below ``floor`` (identical references would make any difference
    infinitely significant)."""
    center = median(reference)
    scale = max(MAD_TO_SD * mad(reference, center), floor)
    return (value - center) / scale if scale > 0 else math.inf, center, scale


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def normal_quantile(p: float) -> float:
    """The z with P(Z <= z) = p (Acklam's rational approximation, relative error < 1.2e-9)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    low = 0.02425
    if p < low:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - low:
        return -normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def chebyshev_confidence(z: float) -> float:
    """1 - 1/z^2: the least probability, for ANY distribution with that spread, that a value this far out is not
    chance (Chebyshev's inequality). Distribution-free, so honest for heavy-tailed series; 0 below z = 1."""
    return 0.0 if z <= 1 else 1.0 - 1.0 / (z * z)


def median_shift(before: Sequence[float], after: Sequence[float], floor: float = 0.0) -> tuple[float, float]:
    """``(z, p)``: how far ``median(after)`` lies above ``median(before)`` in standard errors, one-sided. Each
    median's standard error is ``1.2533 x 1.4826 MAD / sqrt(n)`` (its large-sample value for normal data, from a
    robust spread: one wild value does not widen it), the spread never below ``floor``. Like any test on
    consecutive measurements it assumes them independent; bursts make it optimistic (the rules also demand an
    effect size)."""
    if not before or not after:
        return 0.0, 1.0
    mb, ma = median(before), median(after)
    se2 = 0.0
    for values, center in ((before, mb), (after, ma)):
        spread = max(MAD_TO_SD * mad(values, center), floor)
        se2 += (1.2533 * spread) ** 2 / len(values)
    if se2 <= 0:
        return (math.inf, 0.0) if ma > mb else (0.0, 1.0)
    z = (ma - mb) / math.sqrt(se2)
    return z, normal_sf(z)


def noise_scale(values: Sequence[float]) -> float:
    """The noise level of a series whose level may jump: ``1.4826 MAD`` of its first differences over sqrt(2) (a
    jump is one outlying difference, so it hardly moves the estimate)."""
    if len(values) < 3:
        return 0.0
    diffs = [b - a for a, b in itertools.pairwise(values)]
    return MAD_TO_SD * mad(diffs) / math.sqrt(2)


def pelt(values: Sequence[float], *, min_size: int, penalty: float) -> list[int]:
    """Change points of the mean of ``values`` by optimal partitioning with PELT's pruning (Killick, Fearnhead and
    Eckley 2012): the segmentation, every segment at least ``min_size`` long, that minimises the within-segment sum
    of squares plus ``penalty`` per segment. Returns the sorted indices at which a new segment starts (0 excluded).
    Exact; about linear time when changes are spread out, quadratic at worst (callers bound ``len(values)``)."""
    n = len(values)
    if n < 2 * min_size:
        return []
    s1 = [0.0] * (n + 1)
    s2 = [0.0] * (n + 1)
    for i, v in enumerate(values):
        s1[i + 1] = s1[i] + v
        s2[i + 1] = s2[i] + v * v

    def cost(a: int, b: int) -> float:
        m = b - a
        total = s1[b] - s1[a]
        return s2[b] - s2[a] - total * total / m

    best = [math.inf] * (n + 1)
    best[0] = -penalty
    last = [0] * (n + 1)
    candidates = [0]
    for t in range(1, n + 1):
        value, arg = math.inf, 0
        for s in candidates:
            if t - s >= min_size:
                v = best[s] + cost(s, t) + penalty
                if v < value:
                    value, arg = v, s
        best[t], last[t] = value, arg
        candidates = [s for s in candidates if t - s < min_size or best[s] + cost(s, t) <= value]
        if value < math.inf:
            candidates.append(t)
    cuts = []
    t = n
    while t > 0:
        t = last[t]
        if t > 0:
            cuts.append(t)
    return sorted(cuts)


def mann_kendall(values: Sequence[float]) -> tuple[float, float]:
    """Mann-Kendall trend test: ``(z, p)`` for an upward trend (one-sided). ``S = sum_{i<j} sign(x_j - x_i)``, its
    variance ``n(n-1)(2n+5)/18`` (no tie correction: ties only make the test conservative), continuity-corrected.
    O(n^2): callers pass at most a few hundred values."""
    n = len(values)
    if n < 3:
        return 0.0, 1.0
    s = 0
    for i in range(n - 1):
        xi = values[i]
        for j in range(i + 1, n):
            d = values[j] - xi
            s += (d > 0) - (d < 0)
    var = n * (n - 1) * (2 * n + 5) / 18
    z = (s - 1) / math.sqrt(var) if s > 0 else ((s + 1) / math.sqrt(var) if s < 0 else 0.0)
    return z, normal_sf(z)


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The Theil-Sen slope: the median of the pairwise slopes (robust to 29% of outliers). O(n^2)."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
              if xs[j] != xs[i]]
    return median(slopes) if slopes else 0.0


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return min(1.0, math.fsum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def min_rank_sum_p(n: int, m: int) -> float:
    """The smallest two-sided p a rank-sum test of ``n`` against ``m`` values can give: ``2 / C(n + m, n)`` (every
    value of one side above every value of the other). Above the level wanted, no sample of that size can be
    significant, however far apart: 3 against 3 gives 0.1."""
    if n < 1 or m < 1:
        return 1.0
    return min(1.0, 2 / math.comb(n + m, n))


def rank_sum_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p of the Mann-Whitney rank-sum test that ``a`` and ``b`` come from one distribution (normal
    approximation with a tie correction and a continuity correction; exact enough from 4 values a side, and never
    below ``min_rank_sum_p``). Distribution-free: it asks whether one side's values tend to lie above the other's,
    so a few spans cannot be significant however noisy the machine made them."""
    n, m = len(a), len(b)
    if not n or not m:
        return 1.0
    ordered = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks = [0.0] * len(ordered)
    ties = 0.0
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1][0] == ordered[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    u = sum(r for r, (_, side) in zip(ranks, ordered, strict=True) if side == 0) - n * (n + 1) / 2
    total = n + m
    var = n * m / 12 * ((total + 1) - ties / (total * (total - 1)))
    if var <= 0:
        return 1.0
    z = max(abs(u - n * m / 2) - 0.5, 0.0) / math.sqrt(var)
    return max(min(1.0, 2 * normal_sf(z)), min_rank_sum_p(n, m))
