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

What is held: nothing in memory between groups. Each group's sums (one row per iteration: the sums as
DECIMAL(38,0), exact, the counts, each metric's largest contention share) are written to a Parquet file in the
engine's scratch directory, and ``series`` adds them up per iteration in one query. (They were merged into one table
as the groups came: that table and the next, ~9 MiB each at 1M iterations, were compare's peak on 64 ranks.)
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

__all__ = ["RunSums"]

_BITS = 94  # every scaled value below 2**94: 2**32 of them add up below HUGEINT's 2**127
_MARGIN = 20  # the first group's smallest value may be 2**20 larger than a later group's


class RunSums:
    """Feed each group's windows table (``add(table)``), then ``series`` gives the run-level series."""

    def __init__(self, engine: Any, columns: Sequence[str]) -> None:
        self.engine = engine
        self.columns = list(columns)  # SQL expressions over the windows table, one per metric
        self.scales: list[int | None] = [None] * len(self.columns)
        self.ok = True
        self.groups = 0
        self._dir = tempfile.mkdtemp(prefix="run-sums-", dir=engine.scratch)
        self._files: list[str] = []

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
                self.close()
                return
        parts = []
        for i, c in enumerate(self.columns):
            scale = f"CAST(pow(2, {self.scales[i] or 0}) AS DOUBLE)"
            # (DECIMAL(38,0): Parquet keeps it exactly, a HUGEINT it would write as a DOUBLE; a group's sum at an
            # iteration is below 2**126, within its 10**38)
            parts.append(f"sum(CAST(({c}) * {scale} AS HUGEINT))::DECIMAL(38, 0) AS s{i}, count({c}) AS n{i}, "
                         f"max(coalesce(share, 0.0)) FILTER (WHERE ({c}) IS NOT NULL) AS f{i}")
        path = os.path.join(self._dir, f"{self.groups}.parquet")
        self.engine.execute(f"COPY (SELECT iteration, {', '.join(parts)} FROM {windows} GROUP BY iteration) TO $path "
                            "(FORMAT parquet)", {"path": path})
        self._files.append(path)
        self.groups += 1

    def series(self, busy_free: bool, names: Sequence[str]) -> dict[str, list[float]]:
        """Each metric's value per iteration (in iteration order, iterations without one left out), as
        ``samples_sql._series`` computes it from every window: the mean, and with ``busy_free`` less (a rate:
        raised by) the most contended window's share (``names[i]``: the metric of column ``i``)."""
        out: dict[str, list[float]] = {}
        if not self.groups:
            return out
        # per iteration, every group's parts: a sum NULL only where every part is (no value), the counts added, the
        # largest share of the parts that have one
        cols = ", ".join(f"sum(s{i}::HUGEINT), sum(n{i}), max(f{i})" for i in range(len(self.columns)))
        with self.engine.one_thread():  # (a second thread held a hash table of every iteration of its own)
            for _, batch in self.engine.stream(f"SELECT {cols} FROM read_parquet($files) GROUP BY iteration "
                                               "ORDER BY iteration", {"files": self._files}):
                for row in batch:
                    self._means(row, busy_free, names, out)
        return out

    def _means(self, row: tuple[Any, ...], busy_free: bool, names: Sequence[str], out: dict[str, list[float]]) -> None:
        """One iteration's row of sums into ``out``'s series."""
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

    def close(self) -> None:
        """Remove the groups' files."""
        shutil.rmtree(self._dir, ignore_errors=True)
        self._files = []
