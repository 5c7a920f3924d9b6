"""``Summary``: what a stat knows about one window, in a form that merges across windows, processes and ranks.

Samples are aggregated as floats, as torch.monitor's are (so ints are exact up to 2**53). Exact parts: ``count``
(every sample), ``finite`` (samples that are numbers), ``sum``, ``min``, ``max``, ``m2`` (sum of squared deviations
from the mean, merged with Chan et al.'s parallel formula, so ``stddev`` merges without the cancellation of
sum-of-squares), ``nan_count``, ``inf_count`` and ``last``.

Distribution (for quantiles and the histogram): the samples themselves while there are at most ``RAW_LIMIT`` of them,
so quantiles of small windows are exact (numpy's default "linear" method, the same arithmetic); beyond that an
``ExpHistogram`` (relative error 0.54%, see ``histogram``). Memory is therefore bounded whatever the sample count.

Non-finite samples (NaN, +inf, -inf) are data, not numbers to aggregate: they count in ``count`` and in
``nan_count``/``inf_count``, ``last`` keeps them, and they are left out of sum, mean, min, max, stddev, quantiles and
the histogram, which they would otherwise corrupt for the whole window. An int beyond float range counts as an
infinity there (``last`` keeps it as it is).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from operator import mul
from typing import Any

from .aggregations import DIST, M2, MINMAX, quantile_of
from .histogram import ExpHistogram, lerp

__all__ = ["RAW_LIMIT", "Summary"]

RAW_LIMIT = 2048
ALL = MINMAX | M2 | DIST
Number = int | float


class Summary:
    """A mergeable summary of samples. ``track`` (bit flags from ``aggregations``) says which optional parts to keep;
    a merged summary keeps what both sides kept. Not thread-safe: its owner locks."""

    __slots__ = ("_max", "_min", "count", "finite", "histogram", "inf_count", "last", "m2", "nan_count", "raw", "sum",
                 "track")

    def __init__(self, track: int = ALL) -> None:
        self.track = track
        self.count = 0
        self.finite = 0
        self.nan_count = 0
        self.inf_count = 0
        self.sum: Number = 0
        self._min: Number | None = None  # while samples are kept (``raw``), min and max come from them
        self._max: Number | None = None
        self.m2 = 0.0
        self.last: Number | None = None
        self.raw: list[Number] | None = [] if track & DIST else None
        self.histogram: ExpHistogram | None = None

    @classmethod
    def sketch(cls, track: int = ALL) -> Summary:
        """A summary that keeps no samples: quantiles from the histogram from the first sample (within its bound),
        for long-lived summaries that absorb window after window."""
        out = cls(track)
        if track & DIST:
            out.raw = None
            out.histogram = ExpHistogram()
        return out

    @classmethod
    def of(cls, values: Iterable[Number], track: int = ALL) -> Summary:
        out = cls(track)
        out.fold(list(values))
        return out

    # -- adding ----------------------------------------------------------------------------------------------------

    def fold(self, chunk: list[Number]) -> None:
        """Add a batch of samples (ints, floats; type-checked by the caller). Takes ownership of ``chunk``."""
        n = len(chunk)
        if not n:
            return
        last = chunk[-1]
        try:
            total = sum(chunk)
            if type(total) is int:  # all ints: aggregated as floats, like every stat (an int past float range raises)
                chunk = list(map(float, chunk))
                total = sum(chunk)
        except OverflowError:  # an int past float range (mixed with floats, sum() raised): it is an infinity here
            chunk = [_as_float(x) for x in chunk]
            total = sum(chunk)
        self.count += n
        self.last = last
        if total - total != 0:  # a NaN or an infinity among them (or a sum that overflowed): set them apart
            chunk = self._set_apart_nonfinite(chunk)
            n = len(chunk)
            if not n:
                return
            total = sum(chunk)
        track = self.track
        before = self.finite
        if track & M2:
            mean = total / n
            deviations = [x - mean for x in chunk]
            m2 = float(sum(map(mul, deviations, deviations)))
            if before:
                delta = mean - self.sum / before
                m2 += self.m2 + delta * delta * before * n / (before + n)
            self.m2 = m2
        raw = self.raw
        keep = raw is not None and len(raw) + n <= RAW_LIMIT
        if track & MINMAX and not keep:  # while the samples are kept, min and max are read from them
            self._fold_minmax(chunk)
        self.finite = before + n
        self.sum += total
        if track & DIST:
            if keep:
                raw.extend(chunk)  # type: ignore[union-attr]
            else:
                self._histogram().record(chunk)

    def _fold_minmax(self, chunk: Sequence[Number]) -> None:
        lo, hi = min(chunk), max(chunk)
        if self._min is None or lo < self._min:
            self._min = lo
        if self._max is None or hi > self._max:
            self._max = hi

    def _set_apart_nonfinite(self, chunk: list[Number]) -> list[Number]:
        finite = [x for x in chunk if x - x == 0]
        nans = sum(1 for x in chunk if x != x)
        self.nan_count += nans
        self.inf_count += len(chunk) - len(finite) - nans
        return finite

    def _histogram(self) -> ExpHistogram:
        """The histogram, building it from the raw samples first (from then on the summary is approximate)."""
        hist = self.histogram
        if hist is None:
            hist = self.histogram = ExpHistogram()
        if self.raw:
            if self.track & MINMAX:
                self._fold_minmax(self.raw)
            hist.record(self.raw)
        self.raw = None
        return hist

    # -- reading ---------------------------------------------------------------------------------------------------

    @property
    def exact(self) -> bool:
        """Whether quantiles are exact (all samples kept) rather than estimates from the histogram."""
        return self.raw is not None

    @property
    def min(self) -> Number | None:
        """The smallest finite sample (``None`` without one, or when min/max are not tracked)."""
        if self.raw is not None:
            return min(self.raw) if self.raw and self.track & MINMAX else None
        return self._min

    @property
    def max(self) -> Number | None:
        if self.raw is not None:
            return max(self.raw) if self.raw and self.track & MINMAX else None
        return self._max

    @property
    def mean(self) -> float | None:
        return self.sum / self.finite if self.finite else None

    @property
    def stddev(self) -> float | None:
        """Population standard deviation (ddof=0, numpy.std's default)."""
        if not self.finite or not self.track & M2:
            return None
        return math.sqrt(max(self.m2, 0.0) / self.finite)

    def quantiles(self, qs: Sequence[float]) -> list[float | None]:
        """Quantiles (0..1) of the finite samples; ``None`` when there are none or distribution is not tracked."""
        for q in qs:
            if not 0.0 <= q <= 1.0:
                raise ValueError(f"quantiles must be in [0, 1], got {q!r}")
        if not self.finite or not self.track & DIST:
            return [None for _ in qs]
        if self.raw is None:
            assert self.histogram is not None
            return self.histogram.quantiles(qs, self._min, self._max)
        return _exact_quantiles(sorted(self.raw), qs)
    def histogram_dict(self) -> dict[str, Any] | None:
        """The finite samples as an OpenTelemetry-shaped exponential histogram (see ``ExpHistogram.to_dict``)."""
        if not self.track & DIST:
            return None
        if self.raw is not None:
            hist = ExpHistogram()
            if self.raw:
                hist.record(self.raw)
            return hist.to_dict()
        assert self.histogram is not None
        return self.histogram.to_dict()

    def values(self, aggregations: Sequence[str], duration_s: float | None = None) -> dict[str, Number]:
        """One value per aggregation (``histogram`` is not a number: see ``histogram_dict``). Aggregations without a
        value (the mean of an empty window) are left out, never invented; ``nan_count``/``inf_count`` are added when
        non-zero."""
        out: dict[str, Number] = {}
        wanted_q: list[tuple[str, float]] = []
        lo, hi = self._min, self._max
        ordered: list[Number] | None = None
        if self.raw and self.track & MINMAX:  # samples kept: one sort gives min, max and the quantiles
            ordered = sorted(self.raw)
            lo, hi = ordered[0], ordered[-1]
        for key in aggregations:
            value: Number | None
            if key == "count":
                value = self.count
            elif key == "sum":
                value = self.sum
            elif key == "mean":
                value = self.mean
            elif key == "min":
                value = lo if self.finite else None
            elif key == "max":
                value = hi if self.finite else None
            elif key == "stddev":
                value = self.stddev
            elif key == "value":
                value = self.last
            elif key == "rate":
                value = self.count / duration_s if duration_s else None
            else:
                q = quantile_of(key)
                if q is not None:
                    wanted_q.append((key, q))
                continue
            if value is not None:
                out[key] = value
        if wanted_q:
            qs = [q for _, q in wanted_q]
            estimates = _exact_quantiles(ordered, qs) if ordered is not None else self.quantiles(qs)
            for (key, _), value in zip(wanted_q, estimates, strict=True):
                if value is not None:
                    out[key] = value
            out = {key: out[key] for key in aggregations if key in out}  # the order asked for
        if self.nan_count:
            out["nan_count"] = self.nan_count
        if self.inf_count:
            out["inf_count"] = self.inf_count
        return out

    # -- merging and transport -------------------------------------------------------------------------------------

    def copy(self) -> Summary:
        out = Summary(self.track)
        for name in ("count", "finite", "nan_count", "inf_count", "sum", "_min", "_max", "m2", "last"):
            setattr(out, name, getattr(self, name))
        out.raw = None if self.raw is None else list(self.raw)
        out.histogram = None if self.histogram is None else self.histogram.copy()
        return out

    def merge(self, other: Summary, _into: ExpHistogram | None = None) -> Summary:
        """A new summary of both sets of samples. Count, sum, min, max, mean and stddev are exact; quantiles stay
        exact while both sides kept their samples and there are at most ``RAW_LIMIT`` together, and are otherwise
        within the histogram's bound. ``last`` is ``other``'s when it has one (pass the later window second)."""
        if not isinstance(other, Summary):
            raise TypeError(f"other must be a Summary, got {type(other).__name__}")
        out = Summary(self.track & other.track)
        out.count = self.count + other.count
        out.nan_count = self.nan_count + other.nan_count
        out.inf_count = self.inf_count + other.inf_count
        out.last = other.last if other.count else self.last
        out.finite = self.finite + other.finite
        out.sum = self.sum + other.sum
        present = [s for s in (self, other) if s.finite]
        if out.track & MINMAX and present:
            out._min = min(s.min for s in present)  # type: ignore[type-var]
            out._max = max(s.max for s in present)  # type: ignore[type-var]
        if out.track & M2 and len(present) == 2:
            na, nb = self.finite, other.finite
            delta = other.sum / nb - self.sum / na
            out.m2 = self.m2 + other.m2 + delta * delta * na * nb / (na + nb)
        elif out.track & M2 and present:
            out.m2 = present[0].m2
        if out.track & DIST:
            if self.raw is not None and other.raw is not None and len(self.raw) + len(other.raw) <= RAW_LIMIT:
                out.raw = self.raw + other.raw
            else:
                out.raw = None
                sides: tuple[Summary, ...]
                if _into is not None:  # absorb(): this side's own histogram, grown in place
                    hist, sides = _into, (other,)
                else:
                    hist, sides = ExpHistogram(), (self, other)
                for side in sides:
                    if side.raw:
                        hist.record(side.raw)
                    elif side.histogram is not None:
                        hist.merge(side.histogram)
                out.histogram = hist
        return out

    def absorb(self, other: Summary) -> None:
        """Add ``other``'s samples into this summary in place: what ``merge`` computes, growing this summary's own
        histogram rather than copying it (O(other), not O(both): a cumulative summary absorbing each window)."""
        hist = self.histogram if self.raw is None else None
        merged = self.merge(other, _into=hist)
        for name in self.__slots__:
            setattr(self, name, getattr(merged, name))

    def to_dict(self, compact: bool = False) -> dict[str, Any]:
        """A JSON-able form for sending to another process (``from_dict`` reads it back). ``compact`` replaces kept
        samples by the histogram (a few hundred bytes instead of up to ``RAW_LIMIT`` numbers)."""
        out: dict[str, Any] = {
            "track": self.track,
            "count": self.count,
            "finite": self.finite,
            "nan_count": self.nan_count,
            "inf_count": self.inf_count,
            "sum": self.sum,
            "min": self.min,
            "max": self.max,
            "m2": self.m2,
            "last": self.last,
        }
        if self.track & DIST:
            if self.raw is not None and not compact:
                out["raw"] = list(self.raw)
            else:
                out["histogram"] = self.histogram_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        try:
            out = cls(int(data["track"]))
            for name in ("count", "finite", "nan_count", "inf_count"):
                value = data[name]
                if type(value) is not int or value < 0:
                    raise ValueError(name)
                setattr(out, name, value)
            for name in ("sum", "min", "max", "m2", "last"):
                value = data.get(name)
                if value is not None and type(value) not in (int, float):
                    raise ValueError(name)
                attribute = {"min": "_min", "max": "_max"}.get(name, name)
                setattr(out, attribute, value if value is not None or name not in ("sum", "m2") else 0)
            if out.finite + out.nan_count + out.inf_count != out.count:
                raise ValueError("count is not finite + nan_count + inf_count")
            if out.finite and out.track & MINMAX and (out._min is None or out._max is None or not out._min <= out._max):
                raise ValueError("min and max")
            if out.track & DIST:
                if "raw" in data:
                    raw = list(data["raw"])
                    if len(raw) > RAW_LIMIT or len(raw) != out.finite:
                        raise ValueError("raw: not one sample per finite sample")
                    if any(type(v) not in (int, float) or v - v != 0 for v in raw):
                        raise ValueError("raw: not finite numbers")
                    out.raw = raw
                else:
                    out.raw = None
                    out.histogram = ExpHistogram.from_dict(data["histogram"])
                    if out.histogram.count != out.finite:
                        raise ValueError("histogram: not one count per finite sample")
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a summary: {exc}") from None
        return out

    def __repr__(self) -> str:
        return f"Summary(count={self.count}, mean={self.mean}, min={self.min}, max={self.max}, exact={self.exact})"


def _exact_quantiles(ordered: Sequence[Number], qs: Sequence[float]) -> list[float | None]:
    """numpy's "linear" quantiles of sorted samples, with numpy's arithmetic."""
    last = len(ordered) - 1
    out: list[float | None] = []
    for q in qs:
        rank = q * last
        below = math.floor(rank)
        out.append(float(lerp(ordered[below], ordered[min(below + 1, last)], rank - below)))
    return out


def _as_float(x: Number) -> Number:
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def merge_all(summaries: Iterable[Summary]) -> Summary | None:
    """All summaries merged, in order (``None`` for none)."""
    out: Summary | None = None
    for s in summaries:
        out = s.copy() if out is None else out.merge(s)
    return out
