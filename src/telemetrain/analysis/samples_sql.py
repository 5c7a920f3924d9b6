"""``RunSamples`` by SQL (``store.engine``): the comparison's series computed by DuckDB over the columnar copy and
the JSONL tail, so that memory does not grow with the number of windows. Same rules as ``samples._Collector`` and
``samples._window_of``; the tests check both paths give the same series."""

from __future__ import annotations

from typing import Any

from ..store.engine import Engine
from ..store.reader import Run
from .samples import PHASES, RunSamples

__all__ = ["samples_sql"]

_WINDOWS = """
WITH w AS (
  SELECT rank, pid, current_iteration AS iteration, window_iterations AS n, avg_iteration_time_sec AS mean,
         samples_per_second AS sps, {phases},
         row_number() OVER (PARTITION BY session, run, rank, pid,
                            coalesce(CASE WHEN json_type(json_extract(attributes, '$.train_iterations_start'))
                                          IN ('BIGINT', 'UBIGINT') THEN
                                          TRY_CAST(json_extract(attributes, '$.train_iterations_start') AS BIGINT)
                                          END, -1)
                            ORDER BY segment, line) AS nth
  FROM windows)
SELECT * FROM w WHERE nth > 1 AND mean IS NOT NULL AND isfinite(mean) AND mean > 0 AND iteration IS NOT NULL
  AND n IS NOT NULL AND n >= 1"""


def _series(engine: Engine, windows: str, column: str, by_rank: bool) -> dict[int | None, list[float]]:
    keys = "rank, iteration" if by_rank else "iteration"
    rows = engine.rows(f"SELECT {'rank' if by_rank else 'NULL'}, fsum(x) / count(x) FROM "
                       f"(SELECT *, {column} AS x FROM ({windows})) WHERE x IS NOT NULL "
                       f"GROUP BY {keys} ORDER BY {keys}")
    out: dict[int | None, list[float]] = {}
    for rank, value in rows:
        out.setdefault(rank, []).append(float(value))
    return out


def samples_sql(engine: Engine, run: Run) -> RunSamples:
    phase_cols = ", ".join(f"CASE WHEN isfinite(avg_{p}_time_sec) THEN avg_{p}_time_sec END AS {p}" for p in PHASES)
    windows = _WINDOWS.format(phases=phase_cols)
    count = engine.scalar(f"SELECT count(*) FROM ({windows})") or 0
    total = engine.scalar("SELECT count(*) FROM windows") or 0
    precomputed: dict[tuple[str, int | None], list[float]] = {}
    ranks = [r for (r,) in engine.rows(f"SELECT DISTINCT rank FROM ({windows}) ORDER BY 1")]
    sps = "CASE WHEN isfinite(sps) AND sps > 0 THEN sps END"
    for metric, column in (("iteration_time", "mean"), ("samples_per_second", sps), *((p, p) for p in PHASES)):
        precomputed[(metric, None)] = _series(engine, windows, column, False).get(None, [])
        if metric == "iteration_time":
            for rank, values in _series(engine, windows, column, True).items():
                precomputed[(metric, rank)] = values
    pct: Any = engine.execute(
        "SELECT count(*), quantile_cont(duration_ns / 1e9, 0.5), quantile_cont(duration_ns / 1e9, 0.99) FROM span_ends "
        "WHERE group_name = 'training' AND name = 'training_single_iteration' AND status = 'ok' AND role <> 'agent'"
    ).fetchone()
    meta = run.meta
    created = meta.get("created_wall_ns")
    perf_tag = str(meta.get("perf_tag") or engine.scalar("SELECT first(perf_tag) FROM windows") or "")
    return RunSamples(path=run.path, run_id=run.run_id, session_tag=run.session_tag, perf_tag=perf_tag,
                      created_wall_ns=created if isinstance(created, int) else 0, windows=[],
                      skipped_windows=int(total) - int(count), precomputed=precomputed, precomputed_ranks=ranks,
                      precomputed_windows=int(count),
                      precomputed_percentiles=(float(pct[1]), float(pct[2])) if pct and pct[0] else None)
