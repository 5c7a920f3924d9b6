"""The last points of a stepped curve series, one by one (``StepDetail``): what splits the bucket that straddles a
rollback's step (``curves.CurveBuilder``), whose slots cannot be taken apart once merged.

A rollback to step ``to`` abandons the points of the attempt left at steps ``to`` and past; the bucket holding ``to``
(unless ``to`` is its first step) also holds earlier steps that stay. With every point of that bucket held here, it
is rebuilt from the points before ``to`` and its points at or past ``to`` go to the abandoned buckets, as the SQL path
buckets them (``curves_sql``). Only the last ``DETAIL_POINTS`` to twice that are held (24 bytes a point, in arrays:
a list of tuples was ~6 times that and made ``add`` 3 times slower): a bucket older than that stays whole.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from typing import Any

from .curve_buckets import BAD, BAD_X, HI, HI_X, LO, SUM, WALL, XN, XSUM, N, merge

__all__ = ["DETAIL_POINTS", "StepDetail"]

DETAIL_POINTS = 256  # per stepped series and rank fed point by point (up to twice that held between trims)
_NEVER = 1 << 63  # ``start`` once a point cannot be held (past int64): no split any more


class StepDetail:
    """The points of a series at steps ``>= start`` that it keeps (x, value, wall time), in the order fed; their steps
    ascend, since a lower step is a rollback, which drops the points at or past it first (``split``)."""

    __slots__ = ("start", "values", "walls", "xs")

    def __init__(self) -> None:
        self.xs = array("q")
        self.values = array("d")
        self.walls = array("q")
        self.start = 0

    def add(self, x: int, v: float, wall_ns: int) -> None:
        """One point kept at step ``x``; past twice ``DETAIL_POINTS`` the oldest are dropped, down to that many."""
        if x < self.start:
            return
        xs = self.xs
        try:
            xs.append(x)
            self.walls.append(wall_ns)
        except (OverflowError, TypeError):  # (not an int64: none held from now on)
            self.start = _NEVER
            self._cut(len(self.values))
            return
        self.values.append(v)
        if len(xs) > 2 * DETAIL_POINTS:
            cut = len(xs) - DETAIL_POINTS
            self.start = max(self.start, xs[cut - 1] + 1)  # (a step partly dropped is not held)
            self._cut(cut)

    def _cut(self, n: int) -> None:
        for a in (self.xs, self.values, self.walls):
            del a[:n]

    def split(self, buckets: dict[int, Any], abandoned: dict[int, Any], width: int, to: int) -> None:
        """A rollback to ``to``: the bucket of ``buckets`` (``width`` steps each) that holds ``to`` keeps its points
        before it, the others merged into ``abandoned``, when every point of it is held; else it stays whole (and
        holds points at or past ``to`` that are not here: ``start`` moves past it). The points at or past ``to``
        are dropped either way."""
        key = to // width
        first, end = key * width, (key + 1) * width
        cut = bisect_left(self.xs, to)
        if first < self.start:
            if to > first:
                self.start = max(self.start, end)
        elif to > first and key in buckets and cut < len(self.xs):
            below = bisect_left(self.xs, first)
            kept = self._bucket(below, cut)
            if kept is None:
                del buckets[key]
            else:
                buckets[key] = kept
            left = self._bucket(cut, bisect_left(self.xs, end))
            into = abandoned.get(key)
            if left is not None:
                if into is None:
                    abandoned[key] = left
                else:
                    merge(into, left)  # (the builder's abandoned buckets are lists)
        for a in (self.xs, self.values, self.walls):
            del a[cut:]

    def _bucket(self, i: int, j: int) -> list[Any] | None:
        """The builder's bucket of points ``i`` to ``j`` (None: none), made as ``CurveBuilder.add`` makes it."""
        if i >= j:
            return None
        b: list[Any] = [0, 0.0, math.inf, -math.inf, 0.0, 0, math.nan, 0, 0.0, 0]
        for x, v, wall in zip(self.xs[i:j], self.values[i:j], self.walls[i:j], strict=True):
            if math.isfinite(v):
                b[N] += 1
                b[SUM] += v
                if v < b[LO]:
                    b[LO] = v
                if v > b[HI]:
                    b[HI], b[HI_X] = v, x
            else:
                if not b[BAD]:
                    b[BAD_X] = x
                b[BAD] += 1
            if wall > b[WALL]:
                b[WALL] = wall
            b[XSUM] += x
            b[XN] += 1
        return b
