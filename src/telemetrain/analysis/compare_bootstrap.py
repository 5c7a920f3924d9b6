"""The comparison's statistics: medians, blocks of windows, and the percentile bootstrap of a ratio of medians.

``bootstrap_ratio`` resamples each side with replacement, ``resamples`` times, from ``random.Random(seed)``: each
resample draws the baseline's values, then the candidate's, as ``Random.choices`` draws them (``floor(random() * n)``
per value), and its ratio is ``median(candidate*) / median(baseline*)``. That loop costs a Python call per value
drawn (2,000 resamples of 200 + 200 values: 800,000 draws a metric, most of compare's time on a run with many ranks).
When NumPy is installed (the ``columnar`` extra brings it with pyarrow), the same draws are made by NumPy's MT19937
started from the very state of the ``random.Random`` -- the same 32-bit words, turned into doubles by the same 53-bit
formula -- and the same medians and ratios are computed by the same IEEE operations on whole arrays: the interval is
the same to the last bit as the loop's (a test compares them on many seeds and sizes), only faster. (The loop gives a
resample whose baseline median is 0 an infinite ratio without drawing the candidate's values: the arrays follow it.)
Without NumPy, or for values that are not all finite (the order of a NaN in a sort differs), the loop runs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

__all__ = ["MAX_UNITS", "blocks", "bootstrap_ratio", "bootstrap_ratio_python", "median"]

MAX_UNITS = 200
_CHUNK = 250  # resamples drawn at once by NumPy: 250 x (200 + 200) doubles, 0.8 MB


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def blocks(values: Sequence[float], limit: int = MAX_UNITS) -> list[float]:
    """``values`` as at most ``limit`` means of consecutive runs of values (unchanged when short enough)."""
    n = len(values)
    if n <= limit:
        return list(values)
    size = math.ceil(n / limit)
    return [math.fsum(values[i:i + size]) / len(values[i:i + size]) for i in range(0, n, size)]


def _interval(ratios: Sequence[float], confidence: float, resamples: int) -> tuple[float, float]:
    alpha = (1.0 - confidence) / 2
    low = ratios[max(0, math.floor(alpha * (resamples - 1)))]
    high = ratios[min(resamples - 1, math.ceil((1 - alpha) * (resamples - 1)))]
    return low, high


def _check(candidate: Sequence[float], baseline: Sequence[float]) -> None:
    if not candidate or not baseline:
        raise ValueError("bootstrap_ratio needs values on both sides")


def bootstrap_ratio_python(candidate: Sequence[float], baseline: Sequence[float], *, confidence: float,
                           resamples: int, seed: int) -> tuple[float, float, float]:
    """``bootstrap_ratio`` by the loop over ``Random.choices`` (the definition; the fallback without NumPy)."""
    _check(candidate, baseline)
    rng = random.Random(seed)
    c, b = list(candidate), list(baseline)
    nc, nb = len(c), len(b)
    ratios = []
    choices = rng.choices
    for _ in range(resamples):
        mb = median(choices(b, k=nb))
        ratios.append(median(choices(c, k=nc)) / mb if mb else math.inf)
    ratios.sort()
    low, high = _interval(ratios, confidence, resamples)
    mb = median(b)
    return (median(c) / mb if mb else math.inf), low, high


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _medians(np: Any, values: Any, draws: Any) -> Any:
    """The median of each row of ``values[floor(draws * n)]``, as ``median`` computes it (the middle value, or the
    two middle values' sum halved)."""
    n = values.shape[0]
    picked = values[np.floor(draws * float(n)).astype(np.intp)]
    mid = n // 2
    if n % 2:
        return np.partition(picked, mid, axis=1)[:, mid]
    part = np.partition(picked, (mid - 1, mid), axis=1)
    return (part[:, mid - 1] + part[:, mid]) / 2


def _bootstrap_numpy(np: Any, candidate: Sequence[float], baseline: Sequence[float], confidence: float,
                     resamples: int, seed: int) -> tuple[float, float, float]:
    state = random.Random(seed).getstate()[1]  # (624 words of MT19937's state, the position): random.seed's work
    bits = np.random.MT19937()
    bits.state = {"bit_generator": "MT19937", "state": {"key": np.array(state[:624], dtype=np.uint32),
                                                        "pos": state[624]}}
    gen = np.random.Generator(bits)  # its random() is genrand_res53, as random.random()
    c, b = np.array(candidate, dtype=np.float64), np.array(baseline, dtype=np.float64)
    nc, nb = c.shape[0], b.shape[0]
    width = nb + nc
    ratios = np.empty(resamples, dtype=np.float64)
    stream, at = np.empty(0, dtype=np.float64), 0  # the doubles drawn, and the next one the loop would use
    done = 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        while done < resamples:
            rows = min(_CHUNK, resamples - done)
            if stream.shape[0] - at < rows * width:
                stream = np.concatenate((stream[at:], gen.random(_CHUNK * width)))
                at = 0
            draws = stream[at:at + rows * width].reshape(rows, width)  # a resample: the baseline's, the candidate's
            mb = _medians(np, b, draws[:, :nb])
            zero = np.flatnonzero(mb == 0)
            if zero.shape[0]:
                # the loop gives a zero baseline median an infinite ratio without drawing the candidate's values:
                # the next resample starts nc draws earlier
                rows = int(zero[0]) + 1
                mb = mb[:rows]
            mc = _medians(np, c, draws[:rows, nb:])
            ratios[done:done + rows] = np.where(mb != 0, mc / np.where(mb != 0, mb, 1.0), np.inf)
            at += rows * width - (nc if zero.shape[0] else 0)
            done += rows
    ratios.sort()
    low, high = _interval(ratios, confidence, resamples)
    mb = median(baseline)
    return (median(candidate) / mb if mb else math.inf), float(low), float(high)


def bootstrap_ratio(candidate: Sequence[float], baseline: Sequence[float], *, confidence: float = 0.95,
                    resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """``median(candidate) / median(baseline)`` and its percentile bootstrap interval at ``confidence``, resampling
    each side independently with ``random.Random(seed)``. Both sides need at least one value. With NumPy the draws
    are made on arrays, to the same result (this module's docstring)."""
    _check(candidate, baseline)
    np = _numpy()
    if np is None or not all(math.isfinite(v) for v in (*candidate, *baseline)):
        return bootstrap_ratio_python(candidate, baseline, confidence=confidence, resamples=resamples, seed=seed)
    return _bootstrap_numpy(np, candidate, baseline, confidence, resamples, seed)
