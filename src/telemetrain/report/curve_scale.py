"""How a curve is drawn: its smoothing (a centered rolling median) and its y axis (the range, spikes kept off the
range and marked at its top, log for values spanning decades). The report's charts, ``compare``'s overlay and
``tail``'s sparkline share them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .curves import CurveLine

__all__ = ["YScale", "log_allowed", "smooth", "smoothing_window", "y_scale"]

_LOG_WORDS = ("loss", "ppl", "perplexity", "grad", "norm", "lr", "learning_rate")


def smooth(values: Sequence[float], window: int | None = None) -> list[float]:
    """A centered rolling median of ``values`` (NaN stays NaN and is skipped by its neighbours); ``window``: odd, by
    default ``max(5, len // 20)`` made odd. A median, not an EMA: it does not lag, and a spike does not move it (the
    raw line shows the spike). The window narrows at the ends, so that it stays centered."""
    n = len(values)
    if window is None:
        window = max(5, n // 20)
    window |= 1
    half = window // 2
    out = []
    for i in range(n):
        if values[i] != values[i]:
            out.append(math.nan)
            continue
        h = min(half, i, n - 1 - i)  # symmetric at the edges too: a trend's ends are not pulled inwards
        around = sorted(v for v in values[i - h: i + h + 1] if v == v)
        mid = len(around) // 2
        out.append(around[mid] if len(around) % 2 else (around[mid - 1] + around[mid]) / 2)
    return out


def smoothing_window(n: int) -> int:
    return max(5, n // 20) | 1


@dataclass(frozen=True, slots=True)
class YScale:
    lo: float
    hi: float
    log: bool
    spikes: tuple[tuple[float, float], ...]  # (x, value) of the values above ``hi``: drawn as markers at the top


def _quantile(ordered: Sequence[float], q: float) -> float:
    pos = q * (len(ordered) - 1)
    i = int(pos)
    j = min(i + 1, len(ordered) - 1)
    return ordered[i] + (ordered[j] - ordered[i]) * (pos - i)


def log_allowed(name: str) -> bool:
    """A log y axis suits losses, perplexities, gradient norms and learning rates (spanning decades is their
    nature); not accuracies and other bounded scores, whose first value near 0 would squash the rest."""
    low = name.lower()
    return any(w in low for w in _LOG_WORDS)


def y_scale(lines: Sequence[CurveLine], *, zero: bool = False, allow_log: bool = True) -> YScale | None:
    """The y range of a chart: the bucket means and minima, and the maxima unless a few of them would flatten the
    rest. A maximum is a spike when it lies beyond the line's own smoothed value by more than the maxima usually do
    (their median excess) plus 8 robust deviations -- of the means around the smoothed line, or of the maxima's
    excesses where those vary more: a bucket of several values reaches further than its mean, and a noisy metric's
    ordinary maxima are not spikes. When the spikes would stretch the range by more than half, the range stops at
    the non-spike values and the spikes are marked at its top edge. Log when every value is positive and the range
    spans at least two decades (a loss falling from 10 to 0.01)."""
    kept: list[float] = []
    spikes: list[tuple[float, float]] = []
    for line in lines:
        pts = [p for p in line.points if p.n]
        if not pts:
            continue
        means = [p.mean for p in pts]
        center = smooth(means, smoothing_window(len(means)))
        resid = sorted(abs(m - c) for m, c in zip(means, center, strict=True))
        scale = max(1.4826 * _quantile(resid, 0.5), 1e-12)
        excess = sorted(p.hi - c for p, c in zip(pts, center, strict=True) if p.hi == p.hi)
        usual = max(_quantile(excess, 0.5), 0.0) if excess else 0.0
        spread = 1.4826 * _quantile(sorted(abs(e - usual) for e in excess), 0.5) if excess else 0.0
        limit = usual + 8 * max(scale, spread)
        for i, (p, c) in enumerate(zip(pts, center, strict=True)):
            # a spike jumps above the buckets on either side; a falling curve's bucket holds its own highest value
            # first (under the bucket before it), and its first bucket has nothing to jump from: neither is one
            jump = i > 0 and p.hi > pts[i - 1].mean and (i + 1 == len(pts) or p.hi > pts[i + 1].mean)
            if jump and p.hi - c > limit and len(pts) >= 8:  # a spike: its bucket counts at the smoothed value
                spikes.append((p.hi_x, p.hi))
                kept.append(c)
                if p.n > 1:
                    kept.append(p.lo)
                    if p.mean - c <= limit:
                        kept.append(p.mean)
            else:
                kept += (p.lo, p.mean, p.hi)
        kept += [v for pair in line.band for v in pair if math.isfinite(v)]
    kept = [v for v in kept if math.isfinite(v)]
    if not kept:
        return None
    lo, hi = min(kept), max(kept)
    top = max((v for _, v in spikes), default=hi)
    span = hi - lo if hi > lo else abs(hi) or 1.0
    if top <= hi + 0.5 * span:  # the spikes fit without flattening the rest: show them in range
        hi, spikes = max(hi, top), []
    log = allow_log and lo > 0 and hi / lo >= 100
    if not log:
        if zero and lo > 0 and lo < 0.5 * hi:
            lo = 0.0
        pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
        hi += pad
        lo = lo - pad if not (zero and lo == 0.0) else lo
    return YScale(lo, hi, log, tuple(sorted(spikes)))
