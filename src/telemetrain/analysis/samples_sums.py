"""The run-level series of ``samples_sql`` (each metric's windows of every rank at one iteration averaged), added
up a group of ranks at a time without holding every window: exact sums that add across groups.

A double times a power of two is exact, and so is its cast to HUGEINT once it is an integer: with a scale 2**k per
metric under which every value is an integer below 2**94, DuckDB sums a group's values at each iteration in HUGEINT
exactly, the groups' sums add exactly (at most 2**32 windows an iteration), and Python rounds the total once
(``int / 2**k`` is correctly rounded): the mean is ``math.fsum(values) / n``, as ``statistics.fmean`` gives it on
the pure-Python path. DuckDB's ``fsum`` (a Kahan sum over every window, which the whole-run query used) gives the
same double on the scale runs; this is exact whatever the order. The scale comes from the first group holding a
nonzero value, with room for values up to 2**20 smaller than its smallest and at least as much larger than its
largest; a later group outside that range (or a value too small or too large for any scale: a subnormal, 1e300)
leaves ``ok`` false, and the caller reads the run-level series from every window at once instead.

What is held: one row per iteration (the sums, counts and each metric's largest contention share), in DuckDB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["RunSums"]

_BITS = 94  # every scaled value below 2**94: 2**32 of them add up below HUGEINT's 2**127
_MARGIN = 20  # the first group's smallest value may be 2**20 larger than a later group's


def _either(column: str, i: int, combine: str) -> str:
    """SQL: column ``i`` of the sums so far (``a``) and of a group (``b``) combined as ``sum``/``max`` combine two
    parts: NULL only when both are (a part without a value), else the one, else both combined."""
    a, b = f"a.{column}{i}", f"b.{column}{i}"
    both = f"{a} + {b}" if combine == "+" else f"{combine}({a}, {b})"
    return f"(CASE WHEN {a} IS NULL THEN {b} WHEN {b} IS NULL THEN {a} ELSE {both} END)"


class RunSums:
    """Feed each group's windows table (``add(table)``), then ``series`` gives the run-level series."""

    def __init__(self, engine: Any, columns: Sequence[str], table: str = "compare_run") -> None:
        self.engine = engine
        self.columns = list(columns)  # SQL expressions over the windows table, one per metric
        self.table = table
        self.scales: list[int | None] = [None] * len(self.columns)
        self.ok = True
        self.groups = 0

    def _fits(self, i: int, low: float | None, high: float | None) -> bool:
        """Whether every value of column ``i`` (nonzero ones between ``low`` and ``high`` in magnitude) is an
        integer below 2**_BITS under the column's scale, choosing it if it has none yet."""
        if low is None or high is None:  # no nonzero value: any scale
            return True
        k = self.scales[i]
        if k is None:
            least = 52 - (math.frexp(low)[1] - 1)  # the least k that makes the smallest value an integer
            most = _BITS - math.frexp(high)[1]  # the largest k that keeps the largest below 2**_BITS
            if least > most or not -1000 <= least <= 1000 or not -1000 <= most <= 1000:
                return False
            k = self.scales[i] = min(least + _MARGIN, (least + most) // 2)
        # a double of magnitude >= 2**(52 - k) is a multiple of 2**-k
        return low >= math.ldexp(1.0, 52 - k) and high < math.ldexp(1.0, _BITS - k)

    def add(self, windows: str) -> None:
        """Add the windows of the table ``windows`` (a group of ranks)."""
        if not self.ok:
            return
        bounds = self.engine.rows("SELECT " + ", ".join(
            f"min(abs({c})) FILTER (WHERE {c} <> 0), max(abs({c}))" for c in self.columns) + f" FROM {windows}")[0]
        for i in range(len(self.columns)):
            if not self._fits(i, bounds[2 * i], bounds[2 * i + 1]):
                self.ok = False
                self.engine.execute(f"DROP TABLE IF EXISTS {self.table}")
                return
        parts = []
        for i, c in enumerate(self.columns):
            scale = f"CAST(pow(2, {self.scales[i] or 0}) AS DOUBLE)"
            parts.append(f"sum(CAST(({c}) * {scale} AS HUGEINT)) AS s{i}, count({c}) AS n{i}, "
                         f"max(coalesce(share, 0.0)) FILTER (WHERE ({c}) IS NOT NULL) AS f{i}")
        group = f"SELECT iteration, {', '.join(parts)} FROM {windows} GROUP BY iteration"
        if not self.groups:
            self.engine.execute(f"CREATE OR REPLACE TEMP TABLE {self.table} AS {group}")
        else:  # the sums so far and this group's, added per iteration (one row per iteration is kept); joined on
            # the iteration rather than grouped over both: DuckDB then holds this group's rows in a hash table, not
            # every row with its aggregate states (~-10 MiB of compare's peak at 64 ranks x 1M iterations)
            merged = ", ".join(f"{_either('s', i, '+')}::HUGEINT AS s{i}, (coalesce(a.n{i}, 0) + coalesce(b.n{i}, 0))"
                               f"::BIGINT AS n{i}, {_either('f', i, 'greatest')} AS f{i}"
                               for i in range(len(self.columns)))
            self.engine.execute(f"CREATE OR REPLACE TEMP TABLE {self.table}_next AS SELECT coalesce(a.iteration, "
                                f"b.iteration) AS iteration, {merged} FROM {self.table} a FULL OUTER JOIN ({group}) b "
                                "ON a.iteration IS NOT DISTINCT FROM b.iteration")
            self.engine.execute(f"DROP TABLE {self.table}")
            self.engine.execute(f"ALTER TABLE {self.table}_next RENAME TO {self.table}")
        self.groups += 1

    def series(self, busy_free: bool, names: Sequence[str]) -> dict[str, list[float]]:
        """Each metric's value per iteration (in iteration order, iterations without one left out), as
        ``samples_sql._series`` computes it from every window: the mean, and with ``busy_free`` less (a rate:
        raised by) the most contended window's share (``names[i]``: the metric of column ``i``)."""
        out: dict[str, list[float]] = {}
        if not self.groups:
            return out
        cols = ", ".join(f"s{i}, n{i}, f{i}" for i in range(len(self.columns)))
        for row in self.engine.rows(f"SELECT {cols} FROM {self.table} ORDER BY iteration"):
            for i, name in enumerate(names):
                total, n, share = row[3 * i], row[3 * i + 1], row[3 * i + 2]
                if not n:
                    continue
                k = self.scales[i] or 0
                mean = (total / (1 << k) if k >= 0 else float(total << -k)) / n
                if busy_free:
                    free = 1.0 - min(share if share is not None else 0.0, 0.999)
                    mean = mean / free if name == "samples_per_second" else mean * free
                out.setdefault(name, []).append(mean)
        return out

    def close(self) -> None:
        self.engine.execute(f"DROP TABLE IF EXISTS {self.table}")
