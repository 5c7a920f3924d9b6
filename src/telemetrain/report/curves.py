"""The model's own metrics as curves: a bounded-memory builder fed plain tuples, and what a chart needs of them.

Whoever reads the run (the report's record pass, ``tail``, ``compare``, a SQL query) feeds ``CurveBuilder.add`` one
point at a time: ``(rank, group, name, step, value, wall_ns)``, ``name`` already keyed by its attributes
(``semconv.series_key``). Only *user* metrics are kept (``is_user_group``: not the training lifecycle's derived
metrics, the system sampler's or the cross-rank aggregator's); the others are ignored, so a reader may feed every
metric it decodes.

Memory is bounded whatever the run's length: each (group, name, rank) series holds at most ``capacity`` buckets of
the x axis. A bucket keeps the count, sum, min and max of its finite values (and where the max was), its NaN/inf count
and its last wall time; when a series outgrows ``capacity`` buckets, the bucket width doubles (or more, at once, for
sparse x) and neighbours merge -- a min/max-per-bucket downsampling, so a 1M-step run draws as fast as a short one
and a one-step spike still shows in its bucket's max.

The x axis of a series is its ``step`` when its first point has one (``Telemetry.log(..., step=)``,
``metric(step=)``), else the wall time (seconds since the run's start): torchelastic's ``put_metric`` has no step.

A stepped series whose step goes back (lower than the highest step of the current attempt, same rank and series, in
the order the points are fed: a rollback to a checkpoint, in the process or after a restart writing to the same run)
starts a new attempt: the buckets wholly at or past the step it went back to move to the series' *abandoned* buckets
(drawn dimmed, the rollback marked), so the curve follows the latest attempt of each step, the steps the final model
saw -- TensorBoard's ``purge_step`` and its reader's purge of orphaned events, and W&B's rewind, do the same. The same
step again (gradient-accumulation micro-batches logged at one step) is not a rollback: those values are that step's.
A bucket that straddles the step gone back to is split: its points before that step stay, the ones at or past it
are abandoned -- exactly while its points are among the last ``DETAIL_POINTS`` fed (``curve_detail`` holds them, 24
bytes each), as the SQL path always splits it (``curves_sql``); a rollback further back than that keeps the
straddling bucket whole, both attempts' values (the curve's resolution is its bucket).
Past ``MAX_ROLLBACKS`` rollbacks the series' step is not training progress (an index that restarts every epoch):
the abandoned buckets merge back and every value counts, as without the rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .curve_buckets import (
    BAD,
    BAD_X,
    HI,
    HI_X,
    LO,
    SUM,
    WALL,
    XN,
    XSUM,
    N,
    PackedBuckets,
    merge,
    opened,
    pack_series,
    unpack,
)
from .curve_detail import DETAIL_POINTS as DETAIL_POINTS
from .curve_detail import StepDetail
from .curve_names import _SYSTEM_GROUPS as _SYSTEM_GROUPS  # (re-exported: curves_sql's filter)
from .curve_names import EVAL_WORDS as EVAL_WORDS  # (the names: re-exported, callers import them from here)
from .curve_names import is_eval as is_eval
from .curve_names import is_user_group as is_user_group
from .curve_names import pick_loss as pick_loss

__all__ = [
    "EVAL_WORDS",
    "MAX_ROLLBACKS",
    "MIN_POINTS",
    "BucketPoint",
    "Curve",
    "CurveBuilder",
    "CurveLine",
    "Rollback",
    "is_eval",
    "is_user_group",
    "pick_loss",
]

CAPACITY = 256  # buckets per (group, name, rank) series
MAX_ROLLBACKS = 16  # per series and rank: more, and its step is not training progress (the module's docstring)
MIN_POINTS = 4  # a metric with fewer values (on its busiest rank) is a table row, not a chart
MAX_RANK_LINES = 8  # more ranks that differ: their median, and a min..max band across ranks
WALL_WIDTH_NS = 1_000_000  # the first bucket width of a wall-time axis: 1 ms


@dataclass(frozen=True, slots=True)
class BucketPoint:
    """One bucket of a drawn line: x (the mean step, or seconds since the run's start), the mean, min and max of its
    finite values, where its max was, how many values it holds and how many were NaN/inf."""

    x: float
    mean: float  # NaN when the bucket holds only non-finite values (drawn as a gap)
    lo: float
    hi: float
    hi_x: float
    n: int
    bad: int = 0
    bad_x: float = math.nan
    seconds: float = math.nan  # the bucket's last wall time, seconds since the run's start


@dataclass(frozen=True, slots=True)
class CurveLine:
    label: str  # "rank 3", "all ranks", "median of 64 ranks"
    points: tuple[BucketPoint, ...]
    rank: int | None = None
    # across ranks (a median line): the lowest and highest rank mean of each bucket
    band: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Rollback:
    """A stepped series that went back: from ``from_step`` (the highest step of the attempt left) to ``to_step``."""

    rank: int
    from_step: int
    to_step: int


@dataclass(frozen=True, slots=True)
class Curve:
    group: str
    name: str
    unit: str
    by_step: bool  # x is the step; else seconds since the run's start
    lines: tuple[CurveLine, ...]
    points: int  # values recorded, all ranks
    nonfinite: int  # of them NaN/inf
    ranks: int  # ranks that recorded it
    ranks_differ: bool
    bucket_width: float  # steps (or seconds) per drawn point: 1 when every point is drawn
    # the values of attempts a rollback left (one line per rank that has them, the first MAX_RANK_LINES), and the
    # rollbacks (the first MAX_ROLLBACKS of each rank; one per (from, to) when ranks went back alike)
    abandoned: tuple[CurveLine, ...] = ()
    rollbacks: tuple[Rollback, ...] = ()
    abandoned_points: int = 0

    @property
    def title(self) -> str:
        return f"{self.group}/{self.name}" if self.group not in ("", "default") else self.name

    @property
    def evaluation(self) -> bool:
        return is_eval(self.name)

    @property
    def x_label(self) -> str:
        return "step" if self.by_step else "seconds since the run's start"


@dataclass(slots=True)
class _Series:
    by_step: bool
    width: int
    unit: str
    # a bucket's slots: a list, or packed (``pack``); a series fed in full, all packed (``pack_series``)
    buckets: dict[int, Any] | PackedBuckets = field(default_factory=dict)
    last_step: int = 0
    points: int = 0
    high: int | None = None  # the highest step of the current attempt
    abandoned: dict[int, Any] = field(default_factory=dict)  # keyed as ``buckets``, at the same width
    rollbacks: list[tuple[int, int]] = field(default_factory=list)  # (from, to), the first MAX_ROLLBACKS
    went_back: int = 0  # rollbacks, all of them (past MAX_ROLLBACKS: none is applied)
    # ``add``'s stepped series: its last steps, to split a bucket that straddles a rollback's step (None: a series
    # fed by ``add_bucket``, whose SQL split it, or past MAX_ROLLBACKS)
    detail: StepDetail | None = None


class CurveBuilder:
    """Fed one metric point at a time; ``curves()`` gives what the charts draw. ``capacity``: buckets per series and
    rank (memory: ~``capacity`` x 10 numbers per series and rank, whatever the run's length)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 8:
            raise ValueError(f"capacity must be at least 8, got {capacity}")
        self.capacity = capacity
        self._series: dict[tuple[str, str], dict[int, _Series]] = {}
        self.first_wall_ns: int | None = None  # the earliest point kept (an origin when the run's start is unknown)

    def __len__(self) -> int:
        return len(self._series)

    def names(self) -> list[tuple[str, str]]:
        """(group, name) of every series fed so far."""
        return sorted(self._series)

    def add(self, rank: int, group: str, name: str, step: int | None, value: object, wall_ns: int,
            unit: str = "") -> None:
        """One point. Ignored: a metric of a lifecycle/system group, a bool, anything not a number."""
        if type(value) is bool or not isinstance(value, (int, float)) or not is_user_group(group):
            return
        by_rank = self._series.get((group, name))
        if by_rank is None:
            self._series[(group, name)] = by_rank = {}
        s = by_rank.get(rank)
        if s is None:
            by_step = step is not None
            by_rank[rank] = s = _Series(by_step, 1 if by_step else WALL_WIDTH_NS, unit)
            if by_step:
                s.detail = StepDetail()
        if s.by_step:
            if step is None:
                x = s.last_step  # a point without a step in a stepped series: at the last step seen
            else:
                x = s.last_step = int(step)
                if s.high is None or x > s.high:
                    s.high = x
                elif x < s.high:
                    self._rollback(s, x)
        else:
            x = int(wall_ns)
        s.points += 1
        if self.first_wall_ns is None or wall_ns < self.first_wall_ns:
            self.first_wall_ns = wall_ns
        buckets = _opened_series(s)
        key = x // s.width
        b = buckets.get(key)
        if type(b) is bytes:
            b = buckets[key] = unpack(b)
        v = float(value)
        finite = math.isfinite(v)
        if b is None:
            buckets[key] = b = [0, 0.0, math.inf, -math.inf, 0.0, 0, math.nan, 0, 0.0, 0]
            if len(buckets) > self.capacity:
                buckets = self._shrink(s, buckets)
                b = buckets[x // s.width]
                if type(b) is bytes:
                    b = buckets[x // s.width] = unpack(b)
        if finite:
            b[N] += 1
            b[SUM] += v
            if v < b[LO]:
                b[LO] = v
            if v > b[HI]:
                b[HI] = v
                b[HI_X] = x
        else:
            if not b[BAD]:
                b[BAD_X] = x
            b[BAD] += 1
        if wall_ns > b[WALL]:
            b[WALL] = wall_ns
        b[XSUM] += x
        b[XN] += 1
        if s.detail is not None:
            s.detail.add(x, v, wall_ns)

    def add_bucket(self, rank: int, group: str, name: str, by_step: bool, x: int, stats: Sequence[Any],
                   first_wall_ns: int, unit: str = "", *, abandoned: bool = False) -> None:
        """Points aggregated elsewhere (``curves_sql``: DuckDB groups a series' points by ``x // w``, ``w`` a power
        of two), ``x`` the first x of their bucket; ``stats`` in the bucket slots' order (finite count, sum, min, max,
        x of the max, non-finite count, x of the first non-finite, last wall ns, sum of x, points). Merged as ``add``
        merges points: the same buckets once this builder's width reaches ``w``, which its first widening does.
        ``abandoned``: the points of attempts a rollback left (``note_rollback``), found by the SQL."""
        if not is_user_group(group) or not stats[XN]:
            return
        by_rank = self._series.get((group, name))
        if by_rank is None:
            self._series[(group, name)] = by_rank = {}
        s = by_rank.get(rank)
        if s is None:
            by_rank[rank] = s = _Series(by_step, 1 if by_step else WALL_WIDTH_NS, unit)
        if s.by_step != by_step:  # (a rank whose points disagree on having a step: as ``add``, by its first)
            return
        if unit and not s.unit:  # (a series ``note_rollback`` opened)
            s.unit = unit
        s.points += int(stats[XN])
        if self.first_wall_ns is None or first_wall_ns < self.first_wall_ns:
            self.first_wall_ns = first_wall_ns
        b = list(stats)  # (ints stay ints: a wall time in ns is past a float's exact range)
        if not b[N]:
            b[LO], b[HI], b[HI_X] = math.inf, -math.inf, 0.0
        if not b[BAD]:
            b[BAD_X] = math.nan
        buckets = _opened_series(s)
        into_dict = s.abandoned if abandoned else buckets
        key = x // s.width
        into = into_dict.get(key)
        if into is not None:
            if type(into) is bytes:
                into = into_dict[key] = unpack(into)
            merge(into, b)
            return
        into_dict[key] = b
        if len(into_dict) > self.capacity:
            self._shrink(s, buckets)

    def note_rollback(self, rank: int, group: str, name: str, from_step: int, to_step: int) -> None:
        """A rollback found elsewhere (``curves_sql``), its points fed with ``add_bucket(..., abandoned=True)``."""
        s = self._series.get((group, name), {}).get(rank)
        if s is None:
            s = self._series.setdefault((group, name), {})[rank] = _Series(True, 1, "")
        s.went_back += 1
        if len(s.rollbacks) < MAX_ROLLBACKS:
            s.rollbacks.append((from_step, to_step))

    def _rollback(self, s: _Series, to: int) -> None:
        """The series went back to step ``to``: a new attempt; the buckets wholly at or past it are abandoned."""
        s.went_back += 1
        if s.went_back > MAX_ROLLBACKS:
            s.detail = None  # (no split any more)
            if s.abandoned:  # not restarts: every value counts, the abandoned ones merged back
                buckets = _opened_series(s)
                for key, b in s.abandoned.items():
                    into = buckets.get(key)
                    if into is None:
                        buckets[key] = b
                    else:
                        if type(into) is bytes:
                            into = buckets[key] = unpack(into)
                        merge(into, b)
                s.abandoned = {}
                if len(buckets) > self.capacity:
                    self._shrink(s, buckets)
            return
        s.rollbacks.append((int(s.high if s.high is not None else to), to))
        s.high = to
        buckets = _opened_series(s)
        first = -(-to // s.width)  # the first bucket whose steps all lie at or past ``to``
        if s.detail is not None:
            s.detail.split(buckets, s.abandoned, s.width, to)
        for key in [k for k in buckets if k >= first]:
            b = opened(buckets.pop(key))
            into = s.abandoned.get(key)
            if into is None:
                s.abandoned[key] = b
            else:
                merge(into, b)
        if len(s.abandoned) > self.capacity:
            self._shrink(s, buckets)

    def _shrink(self, s: _Series, buckets: dict[int, Any]) -> dict[int, Any]:
        """Widen the buckets (a power of two, enough to fit half the capacity) and merge neighbours, the abandoned
        ones too (the same width: the span of both counts); the series' buckets now."""
        keys = [*buckets.keys(), *s.abandoned.keys()]
        span = max(keys) - min(keys) + 1
        factor = 2
        while span / factor > self.capacity // 2:
            factor *= 2
        s.width *= factor
        s.buckets = merged = _widened(buckets, factor)
        if s.abandoned:
            s.abandoned = {k: opened(b) for k, b in _widened(s.abandoned, factor).items()}
        return merged

    def pack(self, ranks: Iterable[int]) -> None:
        """Pack the buckets of these ranks' series (``curve_buckets``): for ranks fed in full (``curves_sql`` feeds a
        group of ranks at a time), whose buckets are now only read, unless more points come."""
        wanted = set(ranks)
        for by_rank in self._series.values():
            for rank, s in by_rank.items():
                if rank in wanted and type(s.buckets) is dict:
                    s.buckets = pack_series(s.buckets)

    # -- what the charts draw --------------------------------------------------------------------------------------

    def curves(self, start_ns: int = 0, *, min_points: int = MIN_POINTS,
               names: Iterable[tuple[str, str]] | None = None) -> list[Curve]:
        """Every series with at least ``min_points`` values on some rank, in (group, name) order;
        ``start_ns``: the run's start, origin of a wall-time axis; ``names``: only these (group, name)."""
        wanted = set(names) if names is not None else None
        out = []
        for key in sorted(self._series):
            if wanted is not None and key not in wanted:
                continue
            curve = self._curve(key, start_ns, min_points)
            if curve is not None:
                out.append(curve)
        return out

    def curve(self, group: str, name: str, start_ns: int = 0, *, min_points: int = 1) -> Curve | None:
        return self._curve((group, name), start_ns, min_points) if (group, name) in self._series else None

    def _curve(self, key: tuple[str, str], start_ns: int, min_points: int) -> Curve | None:
        by_rank = self._series[key]
        total = sum(s.points for s in by_rank.values())
        if max(s.points for s in by_rank.values()) < min_points:  # a few values per rank: not a curve
            return None
        by_step = next(iter(by_rank.values())).by_step
        series = {r: s for r, s in by_rank.items() if s.by_step == by_step}  # (a rank that disagrees: left out)
        width = max(s.width for s in series.values())
        scale = 1.0 if by_step else 1e-9
        origin = 0 if by_step else start_ns
        aligned = {rank: _align(s, width) for rank, s in sorted(series.items())}
        nonfinite = sum(int(b[BAD]) for buckets in aligned.values() for b in buckets.values())

        def points_of(rank: int) -> tuple[BucketPoint, ...]:
            return tuple(_point(k, b, scale, origin, start_ns) for k, b in sorted(aligned[rank].items()))

        # each rank's line against the first, one at a time: the lines of every rank at once (64 ranks: ~16,000
        # points a series) were the largest thing the report's Python held (docs/scale.md)
        first_rank = next(iter(aligned))
        first = points_of(first_rank)
        differ = any(not _same([first, points_of(rank)]) for rank in list(aligned)[1:])
        if not differ:
            label = f"rank {first_rank}" if len(aligned) == 1 else f"all {len(aligned)} ranks (equal)"
            lines: tuple[CurveLine, ...] = (CurveLine(label, first, first_rank if len(aligned) == 1 else None),)
        elif len(aligned) <= MAX_RANK_LINES:
            lines = tuple(CurveLine(f"rank {rank}", first if rank == first_rank else points_of(rank), rank)
                          for rank in aligned)
        else:
            lines = (_median_line(aligned, scale, origin, start_ns),)
        unit = next((s.unit for s in series.values() if s.unit), "")
        left = [(rank, _align(s, width, True)) for rank, s in sorted(series.items()) if s.abandoned]
        abandoned = tuple(
            CurveLine(f"rank {rank}, abandoned", tuple(_point(k, b, scale, origin, start_ns)
                                                       for k, b in sorted(buckets.items())), rank)
            for rank, buckets in left[:MAX_RANK_LINES])
        seen: set[tuple[int, int]] = set()
        rollbacks = []
        for rank, s in sorted(series.items()):
            for went in s.rollbacks if s.went_back <= MAX_ROLLBACKS else ():  # (past it: merged back, none)
                if went not in seen:  # (data-parallel ranks go back alike: once)
                    seen.add(went)
                    rollbacks.append(Rollback(rank, *went))
        return Curve(group=key[0], name=key[1], unit=unit, by_step=by_step, lines=lines, points=total,
                     nonfinite=nonfinite, ranks=len(aligned), ranks_differ=differ,
                     bucket_width=width * scale if by_step else width * 1e-9, abandoned=abandoned,
                     rollbacks=tuple(rollbacks),
                     abandoned_points=sum(int(b[XN]) for _, buckets in left for b in buckets.values()))


def _widened(buckets: dict[int, Any], factor: int) -> dict[int, Any]:
    """``buckets`` merged ``factor`` neighbours to one (the dict's own buckets, changed)."""
    merged: dict[int, Any] = {}
    for key, b in buckets.items():
        into = merged.get(key // factor)
        if into is None:
            merged[key // factor] = b
        else:
            if type(into) is bytes:
                into = merged[key // factor] = unpack(into)
            merge(into, opened(b))
    return merged


def _opened_series(s: _Series) -> dict[int, Any]:
    """The series' buckets as a dict, to change: a packed series (``pack``) opened again (more points came)."""
    if isinstance(s.buckets, PackedBuckets):
        s.buckets = s.buckets.to_dict()
    return s.buckets


def _align(s: _Series, width: int, abandoned: bool = False) -> dict[int, list[float]]:
    """The series' buckets (or its abandoned ones) at ``width`` (a power-of-two multiple of its own): at its own
    width, the builder's lists (only read) and the packed ones unpacked; else merged copies (the builder keeps
    going)."""
    factor = width // s.width
    buckets = s.abandoned if abandoned else s.buckets
    if factor == 1:
        return {k: opened(b) for k, b in buckets.items()}
    out: dict[int, list[float]] = {}
    for key, b in buckets.items():
        into = out.get(key // factor)
        if into is None:
            out[key // factor] = unpack(b) if type(b) is bytes else list(b)
        else:
            merge(into, opened(b))
    return out


def _point(key: int, b: list[float], scale: float, origin: int, start_ns: int) -> BucketPoint:
    n = int(b[N])
    x = (b[XSUM] / b[XN] - origin) * scale
    return BucketPoint(x=x, mean=b[SUM] / n if n else math.nan, lo=b[LO] if n else math.nan,
                       hi=b[HI] if n else math.nan, hi_x=(b[HI_X] - origin) * scale if n else math.nan, n=n,
                       bad=int(b[BAD]), bad_x=(b[BAD_X] - origin) * scale if b[BAD] else math.nan,
                       seconds=(b[WALL] - start_ns) / 1e9 if b[WALL] else math.nan)


def _same(lines: Sequence[tuple[BucketPoint, ...]]) -> bool:
    """Whether every rank's line is the same (data-parallel ranks logging the all-reduced loss)."""
    first = lines[0]
    for other in lines[1:]:
        if len(other) != len(first):
            return False
        for a, b in zip(first, other, strict=True):
            if a.n != b.n or a.bad != b.bad:
                return False
            if a.n and not (math.isclose(a.mean, b.mean, rel_tol=1e-9, abs_tol=1e-12)
                            and math.isclose(a.lo, b.lo, rel_tol=1e-9, abs_tol=1e-12)
                            and math.isclose(a.hi, b.hi, rel_tol=1e-9, abs_tol=1e-12)):
                return False
    return True


def _median_line(aligned: dict[int, dict[int, list[float]]], scale: float, origin: int, start_ns: int) -> CurveLine:
    """Many ranks that differ: each bucket's median of the ranks' means, and their min..max as a band."""
    keys = sorted({k for buckets in aligned.values() for k in buckets})
    points, band = [], []
    for k in keys:
        bs = [buckets[k] for buckets in aligned.values() if k in buckets]
        merged = list(bs[0])
        for b in bs[1:]:
            merge(merged, b)
        means = sorted(b[SUM] / b[N] for b in bs if b[N])
        p = _point(k, merged, scale, origin, start_ns)
        if means:
            mid = len(means) // 2
            median = means[mid] if len(means) % 2 else (means[mid - 1] + means[mid]) / 2
            p = BucketPoint(p.x, median, p.lo, p.hi, p.hi_x, p.n, p.bad, p.bad_x, p.seconds)
            band.append((means[0], means[-1]))
        else:
            band.append((math.nan, math.nan))
        points.append(p)
    return CurveLine(f"median of {len(aligned)} ranks", tuple(points), None, tuple(band))
