"""``RunSamples`` by SQL (``store.engine``): the comparison's series computed by DuckDB over the columnar copy and
the JSONL tail, so that memory does not grow with the number of windows. Same rules as ``samples._Collector`` and
``samples._window_of`` (the phases on the device's clock when a window has device times, ``phase_times.py``; the
contention share of each window, ``findings.inputs.contention_share``); the tests check both paths give the same
series."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

from ..report.curves import CurveBuilder
from ..report.curves_sql import _user_groups as user_groups
from ..report.curves_sql import feed_curves
from ..store.engine import Engine, rank_groups
from ..store.reader import Run
from .samples import _CONTENTION, DURATIONS, OTHER, PHASES, RunSamples

__all__ = ["samples_sql"]

WINDOWS_AT_ONCE = 131_072  # windows grouped per query of the per-rank series
MAX_RANK_PHASES = 16  # compare.MAX_RANK_PHASES: per-rank phase series are only compared for this many ranks


def _finite(col: str) -> str:
    return f"CASE WHEN isfinite({col}) THEN {col} END"


_DEVICE = "(" + " OR ".join(f"isfinite(avg_{p}_device_time_sec)" for p in PHASES) + ")"
# samples.OTHER: the step's time outside its phases, host clock only (device phases against a host iteration time
# are not comparable)
_OTHER = ("CASE WHEN NOT dev AND (" + " OR ".join(f"{p} IS NOT NULL" for p in PHASES) + ") THEN greatest(0.0, mean - ("
          + " + ".join(f"coalesce({p}, 0.0)" for p in PHASES) + ")) END")
_WINDOWS = f"""
WITH w AS (
  SELECT rank, pid, current_iteration AS iteration, window_iterations AS n, avg_iteration_time_sec AS mean,
         samples_per_second AS sps, coalesce({_DEVICE}, false) AS dev,
         {", ".join(f"CASE WHEN {_DEVICE} THEN {_finite(f'avg_{p}_device_time_sec')} ELSE {_finite(f'avg_{p}_time_sec')} END AS {p}" for p in PHASES)},
         CASE WHEN isfinite(cpu_time_sec) AND isfinite(cpu_wait_sec) AND cpu_time_sec + cpu_wait_sec > 0
              THEN greatest(0.0, least(1.0, cpu_wait_sec / (cpu_time_sec + cpu_wait_sec))) END AS share,
         row_number() OVER (PARTITION BY session, run, rank, pid, coalesce(train_iterations_start, -1)
                            ORDER BY segment, line) AS nth
  FROM windows)
SELECT rank, iteration, mean, sps, dev, {", ".join(PHASES)}, share FROM w WHERE nth > 1 AND mean IS NOT NULL AND isfinite(mean) AND mean > 0 AND iteration IS NOT NULL
  AND n IS NOT NULL AND n >= 1"""  # noqa: E501
# (the table keeps only what the series read: at 64 ranks x 1M iterations it holds 1.28 M windows)


def _series(engine: Engine, metrics: list[tuple[str, str]], by_rank: bool, busy_free: bool,
            into: dict[tuple[str, int | None, bool], array[float]], ranks: str = "") -> None:
    """One value per iteration (per rank and iteration with ``by_rank``) of each metric: the mean of the windows
    that have it; ``busy_free`` as ``RunSamples.series`` (the most contended window's share at that iteration).
    ``ranks``: only these (an SQL list)."""
    cols = []
    for metric, col in metrics:
        mean = f"fsum({col}) / count({col})"
        if busy_free:
            free = f"(1.0 - least(coalesce(max(coalesce(share, 0.0)) FILTER (WHERE {col} IS NOT NULL), 0.0), 0.999))"
            mean = f"{mean} / {free}" if metric == "samples_per_second" else f"{mean} * {free}"
        cols.append(mean)
    keys = "rank, iteration" if by_rank else "iteration"
    where = f" WHERE rank IN {ranks}" if ranks else ""
    query = f"SELECT {keys}, {', '.join(cols)} FROM compare_windows{where} GROUP BY {keys} ORDER BY {keys}"
    for _, batch in engine.stream(query):
        for row in batch:
            rank = row[0] if by_rank else None
            for (metric, _), value in zip(metrics, row[2 if by_rank else 1:], strict=True):
                if value is not None:
                    into.setdefault((metric, rank, busy_free), array("d")).append(float(value))


def _feed_curves(engine: Engine, curves: CurveBuilder, wanted: Callable[[str], bool] | None) -> None:
    """The user's metrics (the loss compared, the overlay), bucketed by SQL: every series, or those ``wanted``
    (by name). The builder's time origin is the first point of every user series either way: the first point of
    the fed series, unless a point of another comes before it (a query that row groups' statistics mostly answer).
    (The earliest point of all is fed whenever its series is, whatever the series' axis: a point at the same time
    with a step is fed in its place.)"""
    engine.series_keys("compare_series", "role <> 'agent'")
    if wanted is not None:
        keys = [k for (k,) in engine.rows("SELECT DISTINCT skey FROM compare_series") if wanted(k)]
        engine.execute("DELETE FROM compare_series WHERE NOT list_contains($keys, skey)", {"keys": keys})
    names = [n for (n,) in engine.rows("SELECT DISTINCT name FROM compare_series ORDER BY 1")]
    if names:
        listed = ", ".join("'" + n.replace("'", "''") + "'" for n in names)
        feed_curves(engine, curves, "(SELECT m.*, k.skey FROM metrics m JOIN compare_series k ON m.name = k.name AND "
                    f"m.attributes IS NOT DISTINCT FROM k.attributes WHERE m.role <> 'agent' AND m.name IN ({listed}))")
    if wanted is None:
        return
    before = "" if curves.first_wall_ns is None else f" AND wall_ns < {int(curves.first_wall_ns)}"
    first = engine.scalar("SELECT min(wall_ns) FROM metrics WHERE role <> 'agent' AND value_bool IS NULL AND value IS "
                          f"NOT NULL AND {user_groups('group_name')}{before}")
    if first is not None:
        curves.first_wall_ns = int(first)


def samples_sql(engine: Engine, run: Run, curves: Callable[[str], bool] | None = None) -> RunSamples:
    # the windows are read (their attributes parsed) once, into a temporary table; every series is a query of it
    engine.execute("CREATE OR REPLACE TEMP TABLE compare_windows AS " + _WINDOWS)
    count = engine.scalar("SELECT count(*) FROM compare_windows") or 0
    total = engine.scalar("SELECT count(*) FROM windows") or 0
    counts = engine.rows("SELECT rank, count(*) FROM compare_windows GROUP BY rank ORDER BY rank")
    ranks = [r for r, _ in counts]
    groups = rank_groups(counts, WINDOWS_AT_ONCE)
    clocks, known, fraction = engine.rows(
        "SELECT list_distinct(list(dev) FILTER (WHERE " + " OR ".join(f"{p} IS NOT NULL" for p in PHASES) + ")), "
        "count(*) > 0 AND count(share) = count(*), median(share) FROM compare_windows")[0]
    clocks = clocks or []
    source = ("device" if clocks[0] else "host") if len(clocks) == 1 else ("mixed" if clocks else "")
    metrics = [("iteration_time", "mean"), ("samples_per_second", "CASE WHEN isfinite(sps) AND sps > 0 THEN sps END"),
               *((p, p) for p in PHASES)]
    run_metrics = [*metrics, (OTHER, _OTHER)]  # the rest of the step: compared for the whole run only
    precomputed: dict[tuple[str, int | None, bool], array[float]] = {}
    for busy_free in ((False, True) if known else (False,)):  # compare uses busy-free series only when waits are known
        _series(engine, run_metrics, False, busy_free, precomputed)
        # per rank: the iteration time, and the phases for the few ranks compare compares them for
        # (a group of ranks at a time: one group per window would otherwise be held for every window of the run)
        for group in groups:
            _series(engine, metrics if len(ranks) <= MAX_RANK_PHASES else metrics[:1], True, busy_free, precomputed,
                    group)
    pct: Any = engine.execute(
        "SELECT count(*), quantile_cont(duration_ns / 1e9, 0.5), quantile_cont(duration_ns / 1e9, 0.99) FROM span_ends "
        "WHERE group_name = 'training' AND name = 'training_single_iteration' AND status = 'ok' AND role <> 'agent'"
    ).fetchone()
    engine.execute("DROP TABLE compare_windows")
    builder = CurveBuilder()
    _feed_curves(engine, builder, curves)
    durations: dict[str, list[tuple[int, float]]] = {}
    names = "(" + ", ".join(f"'{n}'" for n in DURATIONS) + ")"
    for name, rank, seconds in engine.rows(
            f"SELECT name, rank, duration_ns / 1e9 FROM span_ends WHERE group_name = 'training' AND name IN {names} "
            "AND status = 'ok' AND role <> 'agent' ORDER BY rank, pid, segment, line"):
        durations.setdefault(DURATIONS[name], []).append((rank, float(seconds)))
    signals = " ".join(f"WHEN name = '{n}' THEN '{k}'" for n, k in _CONTENTION.items())
    contention = {key: float(mean) for key, mean in engine.rows(
        f"""SELECT key, fsum(v) / count(v) FROM (
              SELECT CASE {signals} ELSE 'gpu_throttled' END AS key,
                     CASE WHEN starts_with(name, 'hw.gpu.throttle.') THEN (value > 0)::DOUBLE ELSE value END AS v
              FROM metrics WHERE role <> 'agent' AND value_bool IS NULL AND isfinite(value) AND
                (name IN ({", ".join(f"'{n}'" for n in _CONTENTION)}) OR
                 (starts_with(name, 'hw.gpu.throttle.') AND name <> 'hw.gpu.throttle.reasons')))
            GROUP BY key ORDER BY key""") if mean is not None}
    baseline = bool(engine.scalar(
        "SELECT count(*) FROM events WHERE role <> 'agent' AND name = 'one_logger_initialization' AND "
        "json_extract(attributes, '$.is_baseline_run')::VARCHAR = 'true'"))
    meta = run.meta
    created = meta.get("created_wall_ns")
    hardware = meta.get("hardware")
    cpus = hardware.get("cpu_count") if isinstance(hardware, dict) else None
    perf_tag = str(meta.get("perf_tag") or engine.scalar("SELECT first(perf_tag) FROM events") or "")
    return RunSamples(path=run.path, run_id=run.run_id, session_tag=run.session_tag, perf_tag=perf_tag,
                      created_wall_ns=created if isinstance(created, int) else 0, windows=[],
                      skipped_windows=int(total) - int(count),
                      workload=dict(meta["workload"]) if isinstance(meta.get("workload"), dict) else {},
                      durations=durations, contention=contention,
                      is_baseline=baseline or meta.get("is_baseline_run") is True,
                      cpu_count=cpus if isinstance(cpus, int) and not isinstance(cpus, bool) and cpus > 0 else None,
                      precomputed=dict(precomputed), precomputed_ranks=ranks, precomputed_windows=int(count),
                      precomputed_percentiles=(float(pct[1]), float(pct[2])) if pct and pct[0] else None,
                      precomputed_phase_source=source, precomputed_waits_known=bool(known),
                      precomputed_wait_fraction=None if fraction is None else float(fraction), curves=builder)
