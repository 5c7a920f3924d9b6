"""``RunSamples`` by SQL (``store.engine``): the comparison's series computed by DuckDB over the columnar copy and
the JSONL tail, so that memory does not grow with the number of windows. Same rules as ``samples._Collector`` and
``samples._window_of`` (the phases on the device's clock when a window has device times, ``phase_times.py``; the
contention share of each window, ``findings.inputs.contention_share``); the tests check both paths give the same
series."""

from __future__ import annotations

import os
import shutil
import tempfile
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..report.curves import CurveBuilder, is_user_group
from ..report.curves_sql import feed_curves
from ..semconv import series_key
from ..store.codec import loads_column
from ..store.engine import Engine
from ..store.rank_groups import rank_groups
from ..store.reader import Run
from ..store.views import insert_rows
from .quantiles_sql import median, ranked
from .samples import (
    _CONTENTION,
    DURATIONS,
    OTHER,
    PHASES,
    RunSamples,
    hardware_cpu_count,
    interpolate,
    quantile_positions,
)
from .samples_sums import RunSums

__all__ = ["samples_sql"]

WINDOWS_AT_ONCE = 24_576  # reports whose windows one table holds (a group of ranks: ~5 MiB a table of 20,000)
MAX_RANK_PHASES = 16  # compare.MAX_RANK_PHASES: per-rank phase series are only compared for this many ranks

_Key = tuple[str, int | None, bool]  # (metric, rank or None for the run, busy_free)


class SeriesStore(Mapping[_Key, Sequence[float]]):
    """``RunSamples.precomputed``: the series by key; the per-rank ones (one value per window of every rank: ~10 MB
    a run at 64 ranks x 1M iterations, which compare holds for two runs) in an unlinked temporary file, read back a
    series at a time (``os.pread``: no shared file position), the run-level ones in memory."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="telemetrain-series-")
        self._at: dict[_Key, tuple[int, int]] = {}
        self._held: dict[_Key, Sequence[float]] = {}
        self._end = 0

    def hold(self, key: _Key, values: Sequence[float]) -> None:
        self.discard(key)
        self._held[key] = values

    def spill(self, key: _Key, values: array[float]) -> None:
        self.discard(key)
        data = values.tobytes()
        os.pwrite(self._file.fileno(), data, self._end)
        self._at[key] = (self._end, len(values))
        self._end += len(data)

    def discard(self, key: _Key) -> None:
        self._held.pop(key, None)
        self._at.pop(key, None)

    def __getitem__(self, key: _Key) -> Sequence[float]:
        if key in self._held:
            return self._held[key]
        offset, n = self._at[key]
        values = array("d")
        values.frombytes(os.pread(self._file.fileno(), n * values.itemsize, offset))
        return values

    def __iter__(self) -> Iterator[_Key]:
        yield from self._held
        yield from self._at

    def __len__(self) -> int:
        return len(self._held) + len(self._at)


def _finite(col: str) -> str:
    return f"CASE WHEN isfinite({col}) THEN {col} END"


_DEVICE = "(" + " OR ".join(f"isfinite(avg_{p}_device_time_sec)" for p in PHASES) + ")"
# samples.OTHER: the step's time outside its phases, host clock only (device phases against a host iteration time
# are not comparable)
_OTHER = ("CASE WHEN NOT dev AND (" + " OR ".join(f"{p} IS NOT NULL" for p in PHASES) + ") THEN greatest(0.0, mean - ("
          + " + ".join(f"coalesce({p}, 0.0)" for p in PHASES) + ")) END")
_REPORTS = "group_name = 'training' AND name = 'training_metrics_update' AND role <> 'agent'"  # the windows view's


def _windows_sql(ranks: str) -> str:
    """The steady-state windows of ``ranks`` (an SQL list): every rule is per process (the first report of each
    training loop of a process is its warm-up), so a group of ranks gives the same rows as the whole run."""
    return f"""
WITH w AS (
  SELECT rank, pid, current_iteration AS iteration, window_iterations AS n, avg_iteration_time_sec AS mean,
         samples_per_second AS sps, coalesce({_DEVICE}, false) AS dev,
         {", ".join(f"CASE WHEN {_DEVICE} THEN {_finite(f'avg_{p}_device_time_sec')} ELSE {_finite(f'avg_{p}_time_sec')} END AS {p}" for p in PHASES)},
         CASE WHEN isfinite(cpu_time_sec) AND isfinite(cpu_wait_sec) AND cpu_time_sec + cpu_wait_sec > 0
              THEN greatest(0.0, least(1.0, cpu_wait_sec / (cpu_time_sec + cpu_wait_sec))) END AS share,
         row_number() OVER (PARTITION BY session, run, rank, pid, coalesce(train_iterations_start, -1)
                            ORDER BY segment, line) AS nth
  FROM windows{f" WHERE rank IN {ranks}" if ranks else ""})
SELECT rank, iteration, n, mean, sps, dev, {", ".join(PHASES)}, share FROM w WHERE nth > 1 AND mean IS NOT NULL AND isfinite(mean) AND mean > 0 AND iteration IS NOT NULL
  AND n IS NOT NULL AND n >= 1"""  # noqa: E501
# (the table keeps only what the series read)


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
    (by name). One pass over the metrics gives each (name, attributes) with numbers -- its series key as
    ``Engine.series_keys`` gives it -- and, per group and rank, the extent ``feed_curves`` needs (its first pass,
    ``curves_sql.curve_extent_sql``, rolled up here per series key), and the first point of every user series:
    the builder's time origin, whichever series are fed (the earliest point of all is fed whenever its series is,
    whatever the series' axis: a point at the same time with a step is fed in its place). Only the wanted names are
    read again, for their buckets."""
    keys: dict[tuple[str, str | None], str] = {}
    extents: dict[tuple[str, str, int], list[Any]] = {}
    first = None
    for group, name, text, rank, by_step, s0, s1, w0, w1 in engine.rows(
            "SELECT group_name, name, attributes, rank, arg_min(step IS NOT NULL, wall_ns), min(step), max(step), "
            "min(wall_ns), max(wall_ns) FROM metrics WHERE role <> 'agent' AND value_bool IS NULL AND value IS NOT "
            "NULL GROUP BY ALL"):
        if group is None or not is_user_group(group):  # (SQL's test of a NULL group is not true either)
            continue
        first = w0 if first is None else min(first, w0)
        key = keys.get((name, text))
        if key is None:
            attributes = loads_column(text)
            key = keys[(name, text)] = (series_key(name, attributes) if isinstance(attributes, dict) and attributes
                                        else name)
        if wanted is not None and not wanted(key):
            continue
        extent = extents.get((group, key, rank))
        if extent is None:
            extents[(group, key, rank)] = [by_step, s0, s1, w0, w1]
            continue
        if w0 < extent[3]:  # the axis of the series' first point
            extent[0] = by_step
        extent[1] = s0 if extent[1] is None else extent[1] if s0 is None else min(extent[1], s0)
        extent[2] = s1 if extent[2] is None else extent[2] if s1 is None else max(extent[2], s1)
        extent[3], extent[4] = min(extent[3], w0), max(extent[4], w1)
    fed = {key for _, key, _ in extents}
    pairs = [(name, text, key) for (name, text), key in keys.items() if key in fed]
    if pairs:
        engine.execute("CREATE OR REPLACE TEMP TABLE compare_series (name VARCHAR, attributes VARCHAR, skey VARCHAR)")
        insert_rows(engine.con, "compare_series", pairs)
        engine.execute("CREATE OR REPLACE TEMP TABLE compare_extents (group_name VARCHAR, skey VARCHAR, rank BIGINT, "
                       "c_by_step BOOLEAN, c_s0 BIGINT, c_s1 BIGINT, c_w0 BIGINT, c_w1 BIGINT)")
        insert_rows(engine.con, "compare_extents", [(*k, *v) for k, v in extents.items()])
        listed = ", ".join("'" + n.replace("'", "''") + "'" for n in sorted({n for n, _, _ in pairs}))
        feed_curves(engine, curves, "(SELECT m.*, k.skey FROM metrics m JOIN compare_series k ON m.name = k.name AND "
                    f"m.attributes IS NOT DISTINCT FROM k.attributes WHERE m.role <> 'agent' AND m.name IN ({listed}))",
                    extents="compare_extents")
        engine.execute("DROP TABLE compare_extents")
    if first is not None:
        curves.first_wall_ns = int(first)


def _windows_by_group(engine: Engine, metrics: list[tuple[str, str]], run_metrics: list[tuple[str, str]],
                      into: SeriesStore, shares_dir: str) -> tuple[int, int, list[int], set[bool], bool]:
    """Every series, a group of ranks at a time: each group's windows (their attributes parsed once) in a temporary
    table, its per-rank series read from it, its values added to the run-level sums (``samples_sums``) and its
    contention shares kept for their median (a Parquet file per group in ``shares_dir``). Returns the report and
    window counts, the ranks with a window, the phases' clocks and whether every window carries its wait."""
    counts = engine.rows(f"SELECT rank, count(*) FROM events WHERE {_REPORTS} GROUP BY rank ORDER BY rank")
    phases_by_rank = len(counts) <= MAX_RANK_PHASES  # (an upper bound of the ranks with a window: checked below)
    sums = RunSums(engine, [c for _, c in run_metrics])
    count = shares = 0
    total = sum(int(n) for _, n in counts)
    ranks: list[int] = []
    clocks: set[bool] = set()
    phased = " OR ".join(f"{p} IS NOT NULL" for p in PHASES)
    with engine.one_thread():  # (a group's windows: a few ten thousand)
        for k, group in enumerate(rank_groups(counts, WINDOWS_AT_ONCE)):
            engine.temp_table("compare_windows", _windows_sql(group))
            devs, n, with_share = engine.rows(f"SELECT list_distinct(list(dev) FILTER (WHERE {phased})), count(*), "
                                              "count(share) FROM compare_windows")[0]
            clocks.update(devs or [])
            count, shares = count + n, shares + with_share
            ranks += [r for r, in engine.rows("SELECT DISTINCT rank FROM compare_windows ORDER BY rank")]
            if with_share:  # on disk: a table of every window's share grew with the run (10 MiB at 64 x 1M)
                engine.execute("COPY (SELECT share FROM compare_windows WHERE share IS NOT NULL) TO $path "
                               "(FORMAT parquet)", {"path": os.path.join(shares_dir, f"{k}.parquet")})
            sums.add("compare_windows")
            # per rank: the iteration time, and the phases for the few ranks compare compares them for; busy-free
            # while every window so far carries its wait (compare uses busy-free series only when all do)
            found: dict[_Key, array[float]] = {}
            for busy_free in ((False, True) if shares == count else (False,)):
                _series(engine, metrics if phases_by_rank else metrics[:1], True, busy_free, found)
            for key, values in found.items():  # (a rank is in one group only)
                into.spill(key, values)
    engine.execute("DROP TABLE IF EXISTS compare_windows")
    known = count > 0 and shares == count
    if not known:
        for key in [k for k in into if k[2]]:
            into.discard(key)
    if not phases_by_rank and len(ranks) <= MAX_RANK_PHASES and ranks:  # few ranks with a window after all
        engine.execute("CREATE OR REPLACE TEMP TABLE compare_windows AS "
                       + _windows_sql("(" + ", ".join(map(str, ranks)) + ")"))
        found = {}
        for busy_free in ((False, True) if known else (False,)):
            _series(engine, metrics[1:], True, busy_free, found)
        for key, values in found.items():
            into.spill(key, values)
        engine.execute("DROP TABLE compare_windows")
    if sums.ok:
        for busy_free in ((False, True) if known else (False,)):
            for name, means in sums.series(busy_free, [m for m, _ in run_metrics]).items():
                into.hold((name, None, busy_free), array("d", means))
    else:  # values too far apart for one scale: the run-level series from every window at once
        engine.execute("CREATE OR REPLACE TEMP TABLE compare_windows AS " + _windows_sql(""))
        run: dict[_Key, array[float]] = {}
        for busy_free in ((False, True) if known else (False,)):
            _series(engine, run_metrics, False, busy_free, run)
        for key, values in run.items():
            into.hold(key, values)
        engine.execute("DROP TABLE compare_windows")
    sums.close()
    return total, count, ranks, clocks, known


def _iteration_percentiles(engine: Engine) -> tuple[float, float, int] | None:
    """p50 and p99 of the sampled iteration spans' seconds, as ``RunSamples.iteration_percentiles`` computes them: the
    ordered values each needs found by ``quantiles_sql`` (a ``quantile_cont`` held every span's duration)."""
    source = ("FROM span_ends WHERE group_name = 'training' AND name = 'training_single_iteration' AND status = 'ok' "
              "AND role <> 'agent'")
    def positions(n: int) -> list[tuple[int, int, float]]:
        return [quantile_positions(n, q) for q in (0.5, 0.99)]

    n, ns = ranked(engine, "duration_ns", source, lambda n: [k for low, high, _ in positions(n) for k in (low, high)])
    if not n:
        return None
    p50, p99 = (interpolate(ns[low] / 1e9, ns[high] / 1e9, weight) for low, high, weight in positions(n))
    return p50, p99, n


def samples_sql(engine: Engine, run: Run, curves: Callable[[str], bool] | None = None) -> RunSamples:
    metrics = [("iteration_time", "mean"), ("samples_per_second", "CASE WHEN isfinite(sps) AND sps > 0 THEN sps END"),
               *((p, p) for p in PHASES)]
    run_metrics = [*metrics, (OTHER, _OTHER)]  # the rest of the step: compared for the whole run only
    precomputed = SeriesStore()
    shares = tempfile.mkdtemp(prefix="compare-shares-", dir=engine.scratch)
    try:
        total, count, ranks, clocks, known = _windows_by_group(engine, metrics, run_metrics, precomputed, shares)
        # the median share, as DuckDB's median of every window's gives it, in memory that does not grow with them
        files = "'" + os.path.join(shares, "*.parquet").replace("'", "''") + "'"
        fraction = median(engine, "share", f"FROM read_parquet({files})") if os.listdir(shares) else None
    finally:
        shutil.rmtree(shares, ignore_errors=True)
    source = ("device" if next(iter(clocks)) else "host") if len(clocks) == 1 else ("mixed" if clocks else "")
    iterations = engine.scalar(f"SELECT sum(n) FROM ({_windows_sql(f'({ranks[0]})')})") if ranks else 0
    percentiles = _iteration_percentiles(engine)
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
                      cpu_count=_sampler_cpus(engine) or hardware_cpu_count(cpus),
                      precomputed=precomputed, precomputed_ranks=ranks, precomputed_windows=int(count),
                      precomputed_iterations=int(iterations or 0),
                      precomputed_percentiles=percentiles,
                      precomputed_phase_source=source, precomputed_waits_known=bool(known),
                      precomputed_wait_fraction=None if fraction is None else float(fraction), curves=builder)


def _sampler_cpus(engine: Engine) -> float | None:
    """The mean of the CPUs each system sampler divided process CPU by (its start event), as the file reader's."""
    value = engine.scalar(
        "SELECT avg(c) FROM (SELECT TRY_CAST(json_extract(attributes, '$.\"process.cpu_count\"') AS DOUBLE) AS c "
        "FROM events WHERE role <> 'agent' AND name = 'system.sampler.start') WHERE isfinite(c) AND c > 0")
    return float(value) if isinstance(value, (int, float)) else None
