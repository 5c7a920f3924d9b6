"""What the page shows of a job of many ranks (or hosts), where a line or a row each would not be read: a chart of
more than ``MAX_LINES`` series as their envelope (the band from the lowest to the highest value at each moment and
their median) with the few of the highest peaks drawn alone, and a per-rank table of more than ``cli_common.SHOWN_ROWS``
rows (the processes, the ranks' windows) as its first rows and outliers, as ``show`` prints them, the whole table
folded below (``<details>``: no script)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Container, Sequence
from typing import Any

from ..cli_common import few
from .model import Series

__all__ = ["BUCKETS", "MAX_HEATMAP_ROWS", "MAX_LINES", "OUTLIERS", "envelope", "few_rows", "heatmap_rows"]

MAX_LINES = 8  # series drawn one line each; past this, their envelope
OUTLIERS = 3  # series drawn alone beside the envelope: the highest peaks
BUCKETS = 200  # steps of time the envelope is taken over

Point = tuple[float, float]


def envelope(series: Sequence[Series]) -> tuple[list[tuple[str, list[Point]]],
                                                list[tuple[str, list[Point], list[Point]]], str]:
    """The lines, bands and note of a chart of ``series``: each series a line up to ``MAX_LINES``; past that, in each
    of ``BUCKETS`` steps of time, the lowest, median and highest of the series' values there (a series' mean over
    the step), and the ``OUTLIERS`` series of the highest peaks, drawn alone."""
    if len(series) <= MAX_LINES:
        return [(s.label, s.points) for s in series], [], ""
    finite = [[(x, y) for x, y in s.points if math.isfinite(x) and math.isfinite(y)] for s in series]
    xs = [x for pts in finite for x, _ in pts]
    if not xs:
        return [], [], ""
    lo, hi = min(xs), max(xs)
    step = (hi - lo) / BUCKETS or 1.0
    by_bucket: dict[int, list[float]] = {}
    for pts in finite:
        sums: dict[int, list[float]] = {}
        for x, y in pts:
            acc = sums.setdefault(min(int((x - lo) / step), BUCKETS - 1), [0.0, 0.0])
            acc[0] += y
            acc[1] += 1
        for b, (total, n) in sums.items():
            by_bucket.setdefault(b, []).append(total / n)
    lower, middle, upper = [], [], []
    for b in sorted(by_bucket):
        x, values = lo + (b + 0.5) * step, by_bucket[b]
        lower.append((x, min(values)))
        middle.append((x, statistics.median(values)))
        upper.append((x, max(values)))
    peaks = sorted(((max(y for _, y in pts), i) for i, pts in enumerate(finite) if pts), reverse=True)[:OUTLIERS]
    n = len(series)
    lines = [("median", middle)] + [(series[i].label, finite[i]) for _, i in peaks]
    note = (f"{n:,} series: the band spans their lowest to highest value at each moment ({BUCKETS} steps of time, "
            f"each series' mean over a step), the first line is their median; drawn alone, the {len(peaks)} with "
            f"the highest peaks ({', '.join(series[i].label for _, i in peaks)}).")
    return lines, [(f"range of {n:,}", lower, upper)], note


def few_rows(rows: Sequence[Sequence[Any]], *, key: Callable[[Sequence[Any]], float | None],
             marked: Callable[[Sequence[Any]], bool] = lambda row: False) -> tuple[list[Any], int]:
    """The rows of a per-rank table a page lists first (``cli_common.few``): all up to ``SHOWN_ROWS``, else the first
    and the outliers: the rows of the lowest and the highest ``key`` (records, windows, time; None: not known), and
    those ``marked`` (a damaged file, a slow rank). Returns them and how many were left out."""
    return few(rows, keep=marked, extremes=key)


MAX_HEATMAP_ROWS = 64  # the heatmap's rows; past this many ranks, each row is a group of consecutive ranks


def heatmap_rows(ranks: Sequence[int], cells: Sequence[Sequence[float | None]], slow: Container[int]
                 ) -> tuple[list[str], list[list[float | None]], dict[int, int], int]:
    """The heatmap's (labels, cells, rank -> row, ranks per row). Up to ``MAX_HEATMAP_ROWS`` ranks, one row each;
    past that, groups of consecutive ranks, a cell holding the highest of its ranks' means (a slow rank still shows;
    a row each of 4,096 ranks drew ~800,000 cells, tens of MB that no browser draws usably). A label ends in
    " slow" when the findings name a rank of it a straggler."""
    size = max(1, math.ceil(len(ranks) / MAX_HEATMAP_ROWS))
    if size == 1:
        return ([f"rank {r}" + (" slow" if r in slow else "") for r in ranks], [list(row) for row in cells],
                {r: i for i, r in enumerate(ranks)}, 1)
    labels, grouped, row_of = [], [], {}
    for start in range(0, len(ranks), size):
        members = ranks[start:start + size]
        rows = cells[start:start + size]
        grouped.append([max((v for v in column if v is not None), default=None) for column in zip(*rows, strict=True)])
        labels.append(f"ranks {members[0]}..{members[-1]}" + (" slow" if any(r in slow for r in members) else ""))
        row_of.update({r: len(labels) - 1 for r in members})
    return labels, grouped, row_of, size
