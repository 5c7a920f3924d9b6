"""An exponential histogram with OpenTelemetry's bucket layout: the percentile sketch of every stat.

Buckets at scale ``s`` have base ``b = 2 ** (2 ** -s)``; bucket ``i`` holds the magnitudes in ``(b**i, b**(i+1)]``
(OpenTelemetry's ``ExponentialHistogramDataPoint``: upper-inclusive, index computed from ``log2``). Negative values
go to a second set of buckets by magnitude, zeros to ``zero_count``. Two histograms merge exactly: bucket counts add
after the finer one is downscaled to the coarser scale (``i >> k``, as OpenTelemetry does).

Error bound: a value is estimated as the bucket's relative midpoint ``2 * b**(i+1) / (b + 1)``, at most
``(b - 1) / (b + 1)`` from any value in the bucket, relatively. We start at scale 6 (b = 2**(1/64)): 0.5415%. A
histogram keeps at most ``max_buckets`` buckets per sign (default 4096: magnitudes spanning a factor 2**64, e.g.
1 ns to 584 years in seconds); a wider spread downscales (scale 5: 1.08%, and so on), so memory stays bounded
whatever the data. ``relative_error`` says what the current scale guarantees.

Recording is batched (``record``): the values are sorted once (in C) and each occupied bucket is found by one
``log2`` and one ``bisect``, so the cost is per occupied bucket rather than per value; when numpy is already loaded
(torch loads it) large batches are bucketed by numpy instead (2-3x faster).
"""

from __future__ import annotations

import math
import sys
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate
from typing import Any

__all__ = ["DEFAULT_MAX_BUCKETS", "DEFAULT_SCALE", "ExpHistogram", "relative_error"]

DEFAULT_SCALE = 6
DEFAULT_MAX_BUCKETS = 4096
_MIN_SCALE = -10  # base 2**1024: every finite double in a handful of buckets
_NUMPY_FROM = 256  # below this many values numpy's per-call overhead outweighs its speed
_log2 = math.log2
_ceil = math.ceil


def relative_error(scale: int) -> float:
    """The largest relative error of a value estimated from a bucket at ``scale``."""
    base = 2.0 ** (2.0**-scale)
    return float((base - 1.0) / (base + 1.0))


def _index(magnitude: float, scale: int) -> int:
    return _ceil(_log2(magnitude) * 2.0**scale) - 1


def _upper(index: int, scale: int) -> float:
    try:
        return float(2.0 ** ((index + 1) * 2.0**-scale))
    except OverflowError:
        return math.inf


class _Buckets:
    """Dense counts of consecutive bucket indexes ``offset .. offset + len(counts) - 1`` (8 bytes a bucket)."""

    __slots__ = ("counts", "offset")

    def __init__(self, offset: int = 0, counts: Iterable[int] = ()) -> None:
        self.offset = offset
        self.counts = array("q", counts)

    def add(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Add (index, count) pairs, indexes ascending."""
        lo, hi = pairs[0][0], pairs[-1][0]
        counts = self.counts
        if not counts:
            self.offset = lo
            self.counts = counts = array("q", [0]) * (hi - lo + 1)
        else:
            if lo < self.offset:
                self.counts = counts = array("q", [0]) * (self.offset - lo) + counts
                self.offset = lo
            end = self.offset + len(counts) - 1
            if hi > end:
                counts.extend(array("q", [0]) * (hi - end))
        offset = self.offset
        for index, n in pairs:
            counts[index - offset] += n

    def downscale(self, by: int) -> None:
        if by <= 0 or not self.counts:
            return
        merged: dict[int, int] = {}
        for i, n in enumerate(self.counts):
            if n:
                key = (self.offset + i) >> by
                merged[key] = merged.get(key, 0) + n
        self._replace(merged)

    def _replace(self, counts: Mapping[int, int]) -> None:
        if not counts:
            self.offset, self.counts = 0, array("q")
            return
        lo, hi = min(counts), max(counts)
        self.offset = lo
        self.counts = array("q", [0]) * (hi - lo + 1)
        for index, n in counts.items():
            self.counts[index - lo] += n

    def items(self) -> list[tuple[int, int]]:
        """(index, count) of the occupied buckets, ascending."""
        offset = self.offset
        return [(offset + i, n) for i, n in enumerate(self.counts) if n]

    def total(self) -> int:
        return sum(self.counts)

    def copy(self) -> _Buckets:
        out = _Buckets(self.offset)
        out.counts = array("q", self.counts)
        return out

    def trimmed(self) -> tuple[int, list[int]]:
        """(offset, counts) without empty buckets at either end."""
        counts = self.counts
        lo, hi = 0, len(counts)
        while lo < hi and not counts[lo]:
            lo += 1
        while hi > lo and not counts[hi - 1]:
            hi -= 1
        return (self.offset + lo if lo < hi else 0), counts[lo:hi].tolist()


def _occupied(magnitudes: Sequence[float], scale: int) -> list[tuple[int, int]]:
    """(bucket index, count) of sorted positive finite magnitudes: one log2 and one bisect per occupied bucket."""
    pairs: list[tuple[int, int]] = []
    pos, n = 0, len(magnitudes)
    while pos < n:
        index = _index(magnitudes[pos], scale)
        nxt = bisect_right(magnitudes, _upper(index, scale), pos)
        if nxt <= pos:  # the computed upper bound rounded below this value: it is alone in its bucket
            nxt = pos + 1
        if pairs and pairs[-1][0] == index:
            pairs[-1] = (index, pairs[-1][1] + nxt - pos)
        else:
            pairs.append((index, nxt - pos))
        pos = nxt
    return pairs


class ExpHistogram:
    """A mergeable exponential histogram of finite values. Not thread-safe: its owner locks."""

    __slots__ = ("_negative", "_positive", "max_buckets", "scale", "zero_count")

    def __init__(self, scale: int = DEFAULT_SCALE, max_buckets: int = DEFAULT_MAX_BUCKETS) -> None:
        if type(scale) is not int or not _MIN_SCALE <= scale <= 20:
            raise ValueError(f"scale must be an int in [{_MIN_SCALE}, 20], got {scale!r}")
        if type(max_buckets) is not int or max_buckets < 2:
            raise ValueError(f"max_buckets must be an int >= 2, got {max_buckets!r}")
        self.scale = scale
        self.max_buckets = max_buckets
        self.zero_count = 0
        self._positive = _Buckets()
        self._negative = _Buckets()

    # -- recording -------------------------------------------------------------------------------------------------

    def record(self, values: Iterable[float]) -> None:
        """Add finite values, in any order (the caller has removed NaN and infinities)."""
        np = sys.modules.get("numpy")  # used when the process already has it (torch imports it); never imported here
        if np is not None:
            values = list(values)
            if len(values) >= _NUMPY_FROM:
                try:
                    self._record_numpy(np, values)
                    return
                except Exception:  # noqa: BLE001 - an odd numpy (or ints too big for float64): the plain way
                    pass
        ordered = sorted(values)
        split = bisect_right(ordered, 0.0)
        first_zero = split
        while first_zero > 0 and ordered[first_zero - 1] == 0.0:
            first_zero -= 1
        self.zero_count += split - first_zero
        if first_zero:
            self._add(self._negative, [-v for v in reversed(ordered[:first_zero])])
        if split < len(ordered):
            self._add(self._positive, ordered[split:])

    def _record_numpy(self, np: Any, values: list[float]) -> None:
        """``record`` vectorised: the same bucket indexes (``ceil(log2(v) * 2**scale) - 1``), 3-5x faster."""
        array_ = np.asarray(values, dtype=np.float64)
        zeros = int(np.count_nonzero(array_ == 0.0))
        positive = array_[array_ > 0.0]
        negative = -array_[array_ < 0.0]
        for buckets, magnitudes in ((self._positive, positive), (self._negative, negative)):
            if not magnitudes.size:
                continue
            # the scale of this moment: adding the positives may have downscaled
            index = np.ceil(np.log2(magnitudes) * 2.0**self.scale).astype(np.int64) - 1
            lo = int(index.min())
            counts = np.bincount(index - lo)
            occupied = np.flatnonzero(counts)
            self._add_pairs(buckets, list(zip((occupied + lo).tolist(), counts[occupied].tolist(), strict=True)))
        self.zero_count += zeros

    def _add(self, buckets: _Buckets, magnitudes: list[float]) -> None:
        self._add_pairs(buckets, _occupied(magnitudes, self.scale))

    def _add_pairs(self, buckets: _Buckets, pairs: list[tuple[int, int]]) -> None:
        by = self._downscale_needed(buckets, pairs[0][0], pairs[-1][0])
        if by:
            self.downscale(by)
            pairs = _merge_pairs([(i >> by, n) for i, n in pairs])
        buckets.add(pairs)

    def _downscale_needed(self, buckets: _Buckets, lo: int, hi: int) -> int:
        """Scale steps to coarsen so that ``buckets`` plus indexes ``lo..hi`` fit in ``max_buckets``."""
        by = 0
        while _span_after(buckets, lo, hi, by) > self.max_buckets and self.scale - by > _MIN_SCALE:
            by += 1
        return by

    def downscale(self, by: int) -> None:
        """Coarsen by ``by`` scale steps (each merges pairs of buckets, doubling the error bound)."""
        if by <= 0:
            return
        by = min(by, self.scale - _MIN_SCALE)
        self._positive.downscale(by)
        self._negative.downscale(by)
        self.scale -= by

    # -- reading ---------------------------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return self.zero_count + self._positive.total() + self._negative.total()

    @property
    def relative_error(self) -> float:
        return relative_error(self.scale)

    def _order_statistic_finder(self) -> tuple[int, Callable[[int], float]]:
        """(total count, a function rank -> the value estimate of the bucket holding that order statistic). The
        cumulative counts come from C (``accumulate`` over the dense arrays); a value is computed only for the
        buckets asked for, so a quantile costs O(log buckets) after one O(buckets) C pass."""
        neg, pos = self._negative, self._positive
        neg_cum = list(accumulate(reversed(neg.counts)))  # most negative bucket first
        neg_total = neg_cum[-1] if neg_cum else 0
        zero_end = neg_total + self.zero_count
        pos_cum = list(accumulate(pos.counts, initial=zero_end))[1:]
        total = pos_cum[-1] if pos_cum else zero_end
        scale = self.scale
        factor = float(2.0 / (2.0 ** (2.0**-scale) + 1.0))
        neg_top = neg.offset + len(neg.counts) - 1

        def value(rank: int) -> float:
            if rank < neg_total:
                index = neg_top - bisect_right(neg_cum, rank)
                return -_upper(index, scale) * factor
            if rank < zero_end:
                return 0.0
            return _upper(pos.offset + bisect_right(pos_cum, rank), scale) * factor

        return total, value

    def quantiles(
        self, qs: Sequence[float], lowest: float | None = None, highest: float | None = None
    ) -> list[float | None]:
        """Estimates of the ``qs`` quantiles (0..1), interpolated between order statistics as numpy's default
        ("linear") method does, so each is within ``relative_error`` of ``numpy.quantile`` on the same values (when
        the two neighbouring order statistics share a sign). ``lowest``/``highest`` (the exact min and max) clamp the
        estimates and make q=0 and q=1 exact. ``None`` for an empty histogram."""
        total, estimate = self._order_statistic_finder()
        if not total:
            return [None for _ in qs]

        def order_statistic(k: int) -> float:
            if k == 0 and lowest is not None:
                return lowest
            if k == total - 1 and highest is not None:
                return highest
            value = estimate(k)
            if lowest is not None and value < lowest:
                return lowest
            if highest is not None and value > highest:
                return highest
            return value

        out: list[float | None] = []
        for q in qs:
            rank = q * (total - 1)
            below = math.floor(rank)
            a = order_statistic(below)
            b = order_statistic(min(below + 1, total - 1))
            out.append(lerp(a, b, rank - below))
        return out

    # -- merging and transport -------------------------------------------------------------------------------------

    def copy(self) -> ExpHistogram:
        out = ExpHistogram(self.scale, self.max_buckets)
        out.zero_count = self.zero_count
        out._positive = self._positive.copy()
        out._negative = self._negative.copy()
        return out

    def merge(self, other: ExpHistogram) -> None:
        """Add ``other``'s counts into this histogram (exact, at the coarser of the two scales)."""
        if not isinstance(other, ExpHistogram):
            raise TypeError(f"other must be an ExpHistogram, got {type(other).__name__}")
        self.downscale(self.scale - other.scale)
        self.zero_count += other.zero_count
        for mine, theirs in ((self._positive, other._positive), (self._negative, other._negative)):
            by = other.scale - self.scale  # again for each sign: merging the positive side may have downscaled
            pairs = _merge_pairs([(i >> by, n) for i, n in theirs.items()])
            if not pairs:
                continue
            step = self._downscale_needed(mine, pairs[0][0], pairs[-1][0])
            if step:
                self.downscale(step)
                pairs = _merge_pairs([(i >> step, n) for i, n in pairs])
            mine.add(pairs)

    def to_dict(self) -> dict[str, Any]:
        """OpenTelemetry's shape: ``scale``, ``zero_count``, ``positive``/``negative`` as ``offset`` + ``counts``."""
        pos_offset, pos_counts = self._positive.trimmed()
        neg_offset, neg_counts = self._negative.trimmed()
        return {
            "scale": self.scale,
            "zero_count": self.zero_count,
            "positive": {"offset": pos_offset, "counts": pos_counts},
            "negative": {"offset": neg_offset, "counts": neg_counts},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], max_buckets: int = DEFAULT_MAX_BUCKETS) -> ExpHistogram:
        """The inverse of ``to_dict``; ``ValueError`` for anything malformed (it may come from another process)."""
        try:
            scale = data["scale"]
            if type(scale) is not int:
                raise ValueError(f"scale must be an int, got {scale!r}")
            out = cls(scale, max_buckets)
            zero = data.get("zero_count", 0)
            stores = [(out._positive, data.get("positive") or {}), (out._negative, data.get("negative") or {})]
            if type(zero) is not int or zero < 0:
                raise ValueError("zero_count")
            out.zero_count = zero
            for buckets, part in stores:
                offset, counts = part.get("offset", 0), list(part.get("counts", ()))
                if type(offset) is not int or any(type(n) is not int or n < 0 for n in counts):
                    raise ValueError("bucket counts")
                if len(counts) > max_buckets:
                    raise ValueError("more buckets than max_buckets")
                buckets.offset, buckets.counts = offset, array("q", counts)
        except (KeyError, TypeError, AttributeError, OverflowError) as exc:
            raise ValueError(f"not a histogram: {exc}") from None
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExpHistogram) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ExpHistogram(scale={self.scale}, count={self.count})"


def _span_after(buckets: _Buckets, lo: int, hi: int, by: int) -> int:
    if not buckets.counts:
        return (hi >> by) - (lo >> by) + 1
    end = buckets.offset + len(buckets.counts) - 1
    return (max(hi, end) >> by) - (min(lo, buckets.offset) >> by) + 1


def _merge_pairs(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ascending (index, count) pairs with equal indexes summed (after a downscale)."""
    out: list[tuple[int, int]] = []
    for index, n in pairs:
        if out and out[-1][0] == index:
            out[-1] = (index, out[-1][1] + n)
        else:
            out.append((index, n))
    return out


def lerp(a: float, b: float, t: float) -> float:
    """numpy's interpolation between two order statistics (the same arithmetic, so exact windows match it)."""
    diff = b - a
    return b - diff * (1.0 - t) if t >= 0.5 else a + diff * t
