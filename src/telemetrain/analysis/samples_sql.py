"""``RunSamples`` by SQL (``store.engine``): the comparison's series computed by DuckDB over the columnar copy and
the JSONL tail, so that memory does not grow with the number of windows. Same rules as ``samples._Collector`` and
``samples._window_of``; the tests check both paths give the same series."""

from __future__ import annotations

from array import array
from typing import Any

from ..store.engine import Engine
from ..store.reader import Run
from .samples import PHASES, RunSamples

__all__ = ["samples_sql"]

_WINDOWS = """
WITH w AS (
  SELECT rank, pid, current_iteration AS iteration, window_iterations AS n, avg_iteration_time_sec AS mean,
         samples_per_second AS sps, {phases},
         row_number() OVER (PARTITION BY session, run, rank, pid, coalesce(train_iterations_start, -1)
                            ORDER BY segment, line) AS nth
  FROM windows)
SELECT * FROM w WHERE nth > 1 AND mean IS NOT NULL AND isfinite(mean) AND mean > 0 AND iteration IS NOT NULL
  AND n IS NOT NULL AND n >= 1"""


def samples_sql(engine: Engine, run: Run) -> RunSamples:
    phase_cols = ", ".join(f"CASE WHEN isfinite(avg_{p}_time_sec) THEN avg_{p}_time_sec END AS {p}" for p in PHASES)
    # the windows are read (their attributes parsed) once, into a temporary table; every series is a query of it
    engine.execute("CREATE OR REPLACE TEMP TABLE compare_windows AS " + _WINDOWS.format(phases=phase_cols))
    count = engine.scalar("SELECT count(*) FROM compare_windows") or 0
    total = engine.scalar("SELECT count(*) FROM windows") or 0
    ranks = [r for (r,) in engine.rows("SELECT DISTINCT rank FROM compare_windows ORDER BY 1")]
    metrics = (("iteration_time", "mean"), ("samples_per_second", "CASE WHEN isfinite(sps) AND sps > 0 THEN sps END"),
               *((p, p) for p in PHASES))
    means = ", ".join(f"fsum({c}) / count({c})" for _, c in metrics)
    precomputed: dict[tuple[str, int | None], array[float]] = {(m, None): array("d") for m, _ in metrics}
    # the windows of all ranks that end at the same iteration are one observation (samples.RunSamples.series)
    for _, *values in engine.rows(f"SELECT iteration, {means} FROM compare_windows GROUP BY iteration ORDER BY 1"):
        for (metric, _), value in zip(metrics, values, strict=True):
            if value is not None:
                precomputed[(metric, None)].append(float(value))
    for _, batch in engine.stream("SELECT rank, iteration, fsum(mean) / count(mean) FROM compare_windows "
                                  "GROUP BY rank, iteration ORDER BY 1, 2"):  # a value per window of every rank
        for rank, _, value in batch:
            precomputed.setdefault(("iteration_time", rank), array("d")).append(float(value))
    pct: Any = engine.execute(
        "SELECT count(*), quantile_cont(duration_ns / 1e9, 0.5), quantile_cont(duration_ns / 1e9, 0.99) FROM span_ends "
        "WHERE group_name = 'training' AND name = 'training_single_iteration' AND status = 'ok' AND role <> 'agent'"
    ).fetchone()
    engine.execute("DROP TABLE compare_windows")
    meta = run.meta
    created = meta.get("created_wall_ns")
    perf_tag = str(meta.get("perf_tag") or engine.scalar("SELECT first(perf_tag) FROM events") or "")
    return RunSamples(path=run.path, run_id=run.run_id, session_tag=run.session_tag, perf_tag=perf_tag,
                      created_wall_ns=created if isinstance(created, int) else 0, windows=[],
                      skipped_windows=int(total) - int(count), precomputed=dict(precomputed), precomputed_ranks=ranks,
                      precomputed_windows=int(count),
                      precomputed_percentiles=(float(pct[1]), float(pct[2])) if pct and pct[0] else None)
