"""The report's window figures by SQL (``store.engine``), as ``windows.window_figures`` computes them from every
report window: each rank's window count and medians, the slow windows, the time by phase, the heatmap and each rank's
windows merged to its limit; and the windows of the ranges the findings flag (``windows_at``).

The windows are typed from the reports' JSON (the engine's ``windows`` view) and numbered a group of ranks at a time
(at most ``WINDOWS_AT_ONCE`` reports), so DuckDB holds one group's windows, not the run's (1.28 M at 64 x 1M). Every
figure is per rank except the heatmap's bounds and typical value (a median over every window): for those each
window's (rank, iteration, mean) is kept, a Parquet file per group in the engine's own directory (``Engine.scratch``;
in DuckDB's memory it held ~30 MiB at 64 x 1M to the end of the figures). The merged windows' limits depend on which
ranks have windows; the ranks that have reports are assumed, and were one of them without a window, the merges are
done again with the right limits (a second pass)."""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any

from ..analysis.findings_sql import REPORTS_AT_ONCE, rank_groups
from ..analysis.quantiles_sql import median
from ..store.engine import Engine
from ..store.views import insert_rows
from .model_pass import PHASES, Window
from .packed_windows import PackedWindows
from .windows import MAX_HEATMAP_COLUMNS, SLOW_ITERATION_FACTOR, Heatmap, WindowFigures, window_limit

__all__ = ["WindowsSql"]

ORDER = "rank, pid, segment, line"  # collection order
WINDOWS_AT_ONCE = REPORTS_AT_ONCE  # the windows typed and numbered in one query
TABLE = "report_windows"  # one group's windows, numbered per rank (i: 0..n-1 by iteration)
COLUMNS = "rank, iteration, wall_ns, iterations, avg, p50, p90, p99, mx, total, sps, pavg, dev, " + \
    ", ".join(f"ph_{p}" for p in PHASES)


def window_of(row: tuple[Any, ...]) -> Window:
    """A ``Window`` of a row of ``COLUMNS``."""
    rank, iteration, wall, iterations, avg, p50, p90, p99, mx, total, sps, pavg, dev, *phases = row
    return Window(rank=rank, iteration=iteration, wall_ns=wall, iterations=int(iterations), avg=avg, p50=p50,
                  p90=p90, p99=p99, max=mx, total=total, samples_per_second=sps,
                  phases={p: v for p, v in zip(PHASES, phases, strict=True) if v is not None},
                  phase_source="device" if dev else "host",
                  phase_avg=None if pavg is None or not math.isfinite(pavg) else pavg)


def _packed(by_rank: dict[int, PackedWindows], rank: int) -> PackedWindows:
    ws = by_rank.get(rank)
    if ws is None:
        ws = by_rank[rank] = PackedWindows(rank)
    return ws


class WindowsSql:
    """The window figures of the rows ``where`` selects of the engine's ``windows`` view; ``counts``: (rank,
    reports) of those rows, by rank."""

    def __init__(self, engine: Engine, where: str, counts: list[tuple[Any, Any]]) -> None:
        self.engine = engine
        self.where = where
        self.counts = [(int(rank), int(n)) for rank, n in counts if n]

    def _build(self, ranks: str) -> None:
        """The table ``TABLE`` of the windows of ``ranks`` (an SQL list)."""
        # phase_times.py's rule: a window's device times when it has any (then only those), else its host times
        dev = "(" + " OR ".join(f"isfinite(avg_{p}_device_time_sec)" for p in PHASES) + ")"
        phases = ", ".join(f"CASE WHEN {dev} THEN (CASE WHEN isfinite(avg_{p}_device_time_sec) THEN "
                           f"avg_{p}_device_time_sec END) WHEN isfinite(avg_{p}_time_sec) THEN avg_{p}_time_sec END "
                           f"AS ph_{p}" for p in PHASES)
        pavg = (f"CASE WHEN {dev} AND isfinite(avg_iteration_device_time_sec) THEN avg_iteration_device_time_sec "
                f"ELSE avg_iteration_time_sec END AS pavg, coalesce({dev}, false) AS dev")
        self.engine.temp_table(TABLE, f"""
            SELECT rank, pid, segment, line, wall_ns, current_iteration AS iteration,
              coalesce(window_iterations, 0) AS iterations, avg_iteration_time_sec AS avg,
              p50_iteration_time_sec AS p50, p90_iteration_time_sec AS p90, p99_iteration_time_sec AS p99,
              max_iteration_time_sec AS mx, total_iteration_time_sec AS total,
              samples_per_second AS sps, {phases}, {pavg},
              row_number() OVER (PARTITION BY rank ORDER BY current_iteration, wall_ns, {ORDER}) - 1 AS i,
              count(*) OVER (PARTITION BY rank) AS n
            FROM windows WHERE {self.where} AND current_iteration IS NOT NULL AND rank IN {ranks}""")

    def figures(self) -> WindowFigures:
        e = self.engine
        figures = WindowFigures(counts={}, merged={}, medians={}, slow_windows=[], phase_seconds={}, heatmap=None)
        assumed = [rank for rank, _ in self.counts]  # the ranks with windows, until their windows are read
        medians: dict[int, float | None] = {}
        slow: list[tuple[tuple[int, int, int], Window]] = []
        bounds: list[tuple[Any, Any, Any]] = []
        # the ranks within their limit, then the merged ones (as window_figures), packed (``packed_windows``)
        whole: dict[int, PackedWindows] = {}
        merged: dict[int, PackedWindows] = {}
        # the heatmap's narrow rows, a Parquet file a group in the engine's own directory: in DuckDB's memory they
        # held ~24 bytes a window to the end of the figures (30 MiB at 64 x 1M)
        heat: list[str] = []
        try:
            with e.one_thread():  # (a group's windows: a few ten thousand)
                for k, ranks in enumerate(rank_groups(self.counts, WINDOWS_AT_ONCE)):
                    self._build(ranks)
                    per_rank = e.rows(
                        f"SELECT rank, any_value(n), median(avg) FILTER (WHERE isfinite(avg)), "
                        f"median(coalesce(p50, avg)) FILTER (WHERE isfinite(coalesce(p50, avg))) FROM {TABLE} "
                        "GROUP BY rank ORDER BY rank")
                    for rank, n, m, _ in per_rank:
                        figures.counts[rank] = int(n)
                        medians[rank] = None if m is None else float(m)
                    slow += self._slow({rank: t for rank, _, _, t in per_rank if t})
                    self._phases(figures)
                    bounds += e.rows(f"SELECT min(iteration), max(iteration), max(n) FROM {TABLE} HAVING count(*) > 0")
                    heat.append(os.path.join(e.scratch, f"report_heat_{k}.parquet"))
                    e.execute(f"COPY (SELECT rank, iteration, avg FROM {TABLE} WHERE isfinite(avg)) TO $path "
                              "(FORMAT parquet)", {"path": heat[-1]})
                    self._merged(assumed, whole, merged)
            figures.medians = medians
            figures.slow_windows = [w for _, w in sorted(slow, key=lambda kw: kw[0])]
            if not figures.counts:
                return figures
            ranks_with_windows = sorted(figures.counts)
            if ranks_with_windows != assumed:  # a rank whose reports hold no iteration: the limits change
                whole, merged = {}, {}
                for ranks in rank_groups([(r, n) for r, n in self.counts if r in figures.counts], WINDOWS_AT_ONCE):
                    self._build(ranks)
                    self._merged(ranks_with_windows, whole, merged)
            figures.merged = {**whole, **merged}
            figures.heatmap = self._heatmap(bounds, medians, heat)
            return figures
        finally:
            e.execute(f"DROP TABLE IF EXISTS {TABLE}")
            for path in heat:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def _slow(self, typical: dict[int, float]) -> list[tuple[tuple[int, int, int], Window]]:
        """Slow windows: slowest iteration > 3x the rank's median p50 (its mean where it has none), keyed by
        (iteration, rank, i)."""
        if not typical:
            return []
        self.engine.execute("CREATE OR REPLACE TEMP TABLE report_typical (rank BIGINT, t DOUBLE)")
        insert_rows(self.engine.con, "report_typical", list(typical.items()))
        rows = self.engine.rows(
            f"SELECT {COLUMNS}, i FROM {TABLE} JOIN report_typical USING (rank) WHERE mx IS NOT NULL "
            f"AND NOT isnan(mx) AND mx > {SLOW_ITERATION_FACTOR} * t")
        self.engine.execute("DROP TABLE report_typical")
        return [((row[1], row[0], row[-1]), window_of(row[:-1])) for row in rows]

    def _phases(self, figures: WindowFigures) -> None:
        """Time by phase: a rank with device times counts only its windows that have them (window_figures)."""
        keep = "(dev OR NOT rank_dev)"
        sums = ", ".join(f"coalesce(fsum({c} * iterations) FILTER (WHERE {keep}), 0.0)"
                         for c in (f"ph_{p}" for p in PHASES))
        any_phase = " OR ".join(f"ph_{p} IS NOT NULL" for p in PHASES)
        for rank, rank_dev, *values in self.engine.rows(
                f"SELECT rank, any_value(rank_dev), {sums}, coalesce(fsum(pavg * iterations) FILTER (WHERE "
                f"isfinite(pavg) AND {keep}), 0.0) FROM (SELECT *, bool_or(dev) OVER (PARTITION BY rank) AS rank_dev "
                f"FROM {TABLE}) GROUP BY rank HAVING bool_or({any_phase}) ORDER BY rank"):
            figures.phase_seconds[rank] = ({p: float(v) for p, v in zip(PHASES, values[:-1], strict=True)},
                                           float(values[-1]))
            figures.phase_sources[rank] = "device" if rank_dev else "host"

    def _heatmap(self, bounds: list[tuple[Any, Any, Any]], medians: dict[int, float | None],
                 files: list[str]) -> Heatmap:
        lo, hi, most = min(b[0] for b in bounds), max(b[1] for b in bounds), max(b[2] for b in bounds)
        ncols = max(1, min(MAX_HEATMAP_COLUMNS, int(most)))
        heat = Heatmap(ranks=sorted(medians), lo=int(lo), hi=int(hi), ncols=ncols, cells=[], typical=1.0,
                       medians=dict(medians))
        width = heat.width
        rows = "read_parquet([" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "])"
        cells: dict[int, list[float | None]] = {rank: [None] * ncols for rank in heat.ranks}
        for rank, col, mean in self.engine.rows(
                f"SELECT rank, least({ncols - 1}, greatest(0, floor((iteration - {heat.lo})::DOUBLE / $width)))"
                f"::BIGINT AS c, fsum(avg) / count(*) FROM {rows} GROUP BY ALL ORDER BY ALL",
                {"width": width}):
            cells[rank][int(col)] = float(mean)
        heat.cells = [cells[rank] for rank in heat.ranks]
        typical = median(self.engine, "avg", f"FROM {rows}")  # (DuckDB's median held every window's mean)
        heat.typical = float(typical) if typical is not None and typical > 0 else 1.0
        return heat

    def _merged(self, ranks: list[int], whole: dict[int, PackedWindows], merged: dict[int, PackedWindows]) -> None:
        """Each rank's windows of ``TABLE`` into ``whole`` when within its limit (``window_limit`` among ``ranks``,
        the run's ranks with windows), else merged to it into ``merged``."""
        held = [int(r) for (r,) in self.engine.rows(f"SELECT DISTINCT rank FROM {TABLE} ORDER BY rank")]
        if not held:
            return
        self.engine.execute("CREATE OR REPLACE TEMP TABLE report_limits (rank BIGINT, lim BIGINT)")
        insert_rows(self.engine.con, "report_limits", [(rank, window_limit(rank, ranks)) for rank in held])
        w = f"(SELECT * FROM {TABLE} JOIN report_limits USING (rank))"
        for row in self.engine.rows(f"SELECT {COLUMNS} FROM {w} WHERE n <= lim ORDER BY rank, i"):
            _packed(whole, row[0]).append(window_of(row))
        size = "((n + lim - 1) // lim)"

        def mean(c: str) -> str:
            return f"favg({c}) FILTER (WHERE isfinite({c}))"

        def largest(c: str) -> str:
            return f"max({c}) FILTER (WHERE isfinite({c}))"

        phases = ", ".join(mean(f"ph_{p}") for p in PHASES)
        for row in self.engine.rows(
                f"""SELECT rank, last(iteration ORDER BY i), last(wall_ns ORDER BY i), sum(iterations), {mean('avg')},
                      {mean('p50')}, {largest('p90')}, {largest('p99')}, {largest('mx')},
                      fsum(total) FILTER (WHERE isfinite(total)), {mean('sps')}, NULL, false, {phases}
                    FROM {w} WHERE n > lim GROUP BY rank, i // {size} ORDER BY rank, i // {size}"""):
            _packed(merged, row[0]).append(window_of(row))
        self.engine.execute("DROP TABLE report_limits")

    def windows_at(self, flagged: set[tuple[int, int, int]]) -> list[Window]:
        """The (unmerged) report windows of these (rank, first step, last step)s, as ``_Collector.windows_at``: of
        each range, the window(s) ending in it whose slowest iteration is the slowest (the flagged ranks' windows
        typed again, a group of ranks at a time)."""
        e = self.engine
        wanted = {rank for rank, _, _ in flagged}
        out: list[tuple[tuple[int, int, int], Window]] = []
        e.execute("CREATE OR REPLACE TEMP TABLE report_flagged (rank BIGINT, a BIGINT, b BIGINT)")
        insert_rows(e.con, "report_flagged", sorted(flagged))
        try:
            for ranks in rank_groups([(r, n) for r, n in self.counts if r in wanted], WINDOWS_AT_ONCE):
                self._build(ranks)
                out += [((row[1], row[0], row[-1]), window_of(row[:-1])) for row in e.rows(
                    f"SELECT {COLUMNS}, i FROM {TABLE} WHERE (rank, i) IN (SELECT rank, i FROM ("
                    f"SELECT w.rank, w.i, w.mx, max(w.mx) OVER (PARTITION BY f.rank, f.a, f.b) AS top FROM {TABLE} w "
                    "JOIN report_flagged f ON w.rank = f.rank AND w.iteration BETWEEN f.a AND f.b WHERE w.mx IS NOT "
                    "NULL AND isfinite(w.mx)) WHERE mx = top)")]
        finally:
            e.execute("DROP TABLE report_flagged")
            e.execute(f"DROP TABLE IF EXISTS {TABLE}")
        return [w for _, w in sorted(out, key=lambda kw: kw[0])]
