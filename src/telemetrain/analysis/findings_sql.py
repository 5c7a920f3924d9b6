"""The findings engine's series by SQL (``store.engine``), bounded whatever the run's length; shared by ``report``
(``report.model_sql``) and ``show`` (``show_sql``).

- **Loss and gradient-norm series** (the spike rule): instead of every point (one per step and rank: 64 M points on
  64 ranks x 1M steps), DuckDB selects the spike candidates and their neighbours
  (``findings.values.spike_points_sql``, exact) and Python evaluates only those
  (``findings.values.selected_spikes``). A series whose selection does not settle it (a jump that stays) is read
  whole.
- **Memory gauges** (the memory-growth rule): the rule reads at most ``memory.MAX_POINTS`` points of a series, evenly
  spread from the steady state on (``memory.thin_indices``); DuckDB numbers the points from the first report window
  after warm-up and returns only those. A series with NaN/inf, or short, is read whole.
- **Report windows** (the slowdown, straggler and slow-iteration rules): DuckDB extracts and types the ~30
  attributes the findings engine reads of each report (``window_json_sql``, ``window_fields_sql``); Python makes the
  window of each (``findings.builder.window_point``) and the builder holds them within its budget, merged past it
  (``findings.window_budget``), as on the pure-Python path.
"""

from __future__ import annotations

from typing import Any

from .findings.builder import CUDA_ALLOCATED, RSS, WINDOW_POINT_KEYS, InputBuilder
from .findings.inputs import SpikeSelection, ValueSeries
from .findings.memory import MAX_POINTS, thin_indices
from .findings.thresholds import DEFAULT_THRESHOLDS, Thresholds
from .findings.values import selected_spikes, spike_candidates_sql, spike_points_sql, value_kind

__all__ = ["WINDOW_POINT_KEYS", "feed_memory_series_sql", "feed_value_series_sql", "gauges_relation",
           "window_fields_sql", "window_json_sql"]

_INTEGERS = WINDOW_POINT_KEYS[:3]  # current_iteration, window_iterations, train_iterations_start


def feed_value_series_sql(builder: InputBuilder, engine: Any, relation: str, key: str,
                          thresholds: Thresholds | None = None) -> int:
    """Give ``builder`` the value series of ``relation`` (columns ``key``, rank, step, value, pid, segment, line;
    the numeric points, non-finite included, of the series ``InputBuilder.metric`` keeps as values): each as the
    points that settle its spikes for ``thresholds``, or whole where those do not. Returns the points given.

    Two passes: the candidates (one window pass over the points, rank by rank: the only sort of every point), then,
    for the series that have some, their finite points within ``spike_history`` before and twice that after each."""
    th = thresholds if thresholds is not None else DEFAULT_THRESHOLDS
    h = th.spike_history
    # the series holding NaN/inf: their finite index needs its own window pass (rare)
    found = engine.rows(f"SELECT {key}, rank, bool_or(NOT isfinite(value)) FROM {relation} GROUP BY ALL")
    unclean = [(k, rank) for k, rank, bad in found if bad]
    engine.execute("CREATE OR REPLACE TEMP TABLE findings_unclean (k VARCHAR, rank BIGINT)")
    if unclean:
        engine.con.executemany("INSERT INTO findings_unclean VALUES (?, ?)", unclean)
    series = f"({key}, rank) IN (SELECT k, rank FROM findings_unclean)"
    # rank by rank: DuckDB sorts one rank's points at a time (64 ranks x 1M steps at once outgrow its memory)
    queries = [spike_candidates_sql(f"(SELECT * FROM {relation} WHERE rank = {int(r)} AND NOT {series})", key, th)
               for r in sorted({rank for _, rank, _ in found})]
    if unclean:
        those = spike_points_sql(f"(SELECT * FROM {relation} WHERE {series})", key, th)
        queries.append(f"SELECT k, rank, fi FROM {those} WHERE cand ORDER BY k, rank, fi")
    ranges: list[list[Any]] = []  # [k, rank, first fi, last fi], merged
    for query in queries:
        for _, batch in engine.stream(query):
            for k, rank, fi in batch:
                last = ranges[-1] if ranges else None
                if last is not None and last[0] == k and last[1] == rank and fi - h <= last[3] + 1:
                    last[3] = fi + 2 * h
                else:
                    ranges.append([k, rank, max(fi - h, 0), fi + 2 * h])
    engine.execute("DROP TABLE findings_unclean")
    if not ranges:
        return 0
    engine.execute("CREATE OR REPLACE TEMP TABLE findings_ranges (k VARCHAR, rank BIGINT, a BIGINT, b BIGINT)")
    engine.con.executemany("INSERT INTO findings_ranges VALUES (?, ?, ?, ?)", ranges)
    del ranges
    selected = f"(SELECT * FROM {relation} WHERE ({key}, rank) IN (SELECT DISTINCT k, rank FROM findings_ranges))"
    given = 0
    current: tuple[str, int] | None = None
    points: list[tuple[int, float]] = []
    index: list[int] = []
    candidate: list[bool] = []
    finite = 0
    unsettled: list[tuple[str, int]] = []  # read whole after the stream (one query at a time on the connection)

    def flush() -> int:
        if current is None or not points:
            return 0
        name, rank = current
        kind = value_kind(name)
        assert kind is not None
        selection = SpikeSelection(index=list(index), candidate=list(candidate), finite=finite,
                                   history=th.spike_history, min_history=th.spike_min_history, ratio=th.spike_ratio)
        series = ValueSeries(name, kind, rank, list(points), selection)
        if selected_spikes(series, th) is None:
            unsettled.append(current)
            return 0
        builder.value_series(series)
        return len(series.points)

    for _, batch in engine.stream(
            f"SELECT p.k, p.rank, p.step, p.value, p.fi, p.cand, p.nf FROM {spike_points_sql(selected, key, th)} p "
            "JOIN findings_ranges r ON p.k = r.k AND p.rank = r.rank AND p.fi BETWEEN r.a AND r.b "
            "ORDER BY p.k, p.rank, p.fi"):
        for name, rank, step, value, fi, cand, nf in batch:
            if (name, rank) != current:
                given += flush()
                current = (name, rank)
                points, index, candidate, finite = [], [], [], int(nf)
            points.append((int(step), float(value)))
            index.append(int(fi))
            candidate.append(bool(cand))
    given += flush()
    engine.execute("DROP TABLE findings_ranges")
    for name, rank in unsettled:
        whole = ValueSeries(name, value_kind(name) or "loss", rank, _whole(engine, relation, key, name, rank))
        builder.value_series(whole)
        given += len(whole.points)
    return given


def _whole(engine: Any, relation: str, key: str, name: str, rank: int) -> list[tuple[int, float]]:
    """Every point of one series, in the order ``InputBuilder.metric`` meets them."""
    out: list[tuple[int, float]] = []
    for _, batch in engine.stream(
            f"SELECT coalesce(step, row_number() OVER (ORDER BY pid, segment, line) - 1), value FROM {relation} "
            f"WHERE {key} = $name AND rank = $rank ORDER BY pid, segment, line", {"name": name, "rank": rank}):
        out.extend((int(step), float(value)) for step, value in batch)
    return out


def feed_memory_series_sql(builder: InputBuilder, engine: Any, relation: str) -> int:
    """Give ``builder`` the memory gauges of ``relation`` (columns kind, rank, host, device, wall_ns, value: the
    numeric points of the gauges ``InputBuilder.metric`` keeps, as its keys name them), each thinned as the memory
    rule thins it from the steady state on (the builder's reports are fed first), or whole where it is short or holds
    NaN/inf. Nothing without a report window after warm-up (the rule does not run then). Returns the points given."""
    steady = builder.steady_ns()
    if steady is None:
        return 0
    key = "kind, rank, host, device"
    thin: list[tuple[str, int, str, str, int]] = []
    whole: list[tuple[str, int, str, str]] = []
    for kind, rank, host, device, n, bad in engine.rows(
            f"SELECT {key}, count(*) FILTER (WHERE wall_ns >= {int(steady)}), count(*) FILTER (WHERE NOT "
            f"isfinite(value)) FROM {relation} GROUP BY ALL ORDER BY ALL"):
        if n > MAX_POINTS and not bad:
            thin.append((kind, rank, host, device, int(n)))
        else:
            whole.append((kind, rank, host, device))
    given = 0
    points: dict[tuple[str, int, str, str], list[tuple[int, float]]] = {}
    if whole:
        engine.execute("CREATE OR REPLACE TEMP TABLE findings_whole_gauges (kind VARCHAR, rank BIGINT, host VARCHAR, "
                       "device VARCHAR)")
        engine.con.executemany("INSERT INTO findings_whole_gauges VALUES (?, ?, ?, ?)", whole)
        for _, batch in engine.stream(f"SELECT {key}, wall_ns, value FROM {relation} JOIN findings_whole_gauges "
                                      f"USING ({key})"):
            for kind, rank, host, device, wall, value in batch:
                points.setdefault((kind, rank, host, device), []).append((int(wall), float(value)))
        engine.execute("DROP TABLE findings_whole_gauges")
        for k, ps in points.items():
            builder.memory_series(*k, ps)
            given += len(ps)
    if thin:
        engine.execute("CREATE OR REPLACE TEMP TABLE findings_thin_gauges (kind VARCHAR, rank BIGINT, host VARCHAR, "
                       "device VARCHAR, i BIGINT)")
        engine.con.executemany("INSERT INTO findings_thin_gauges VALUES (?, ?, ?, ?, ?)",
                               [(*k, i) for *k, n in thin for i in thin_indices(n)])
        picked: dict[tuple[str, int, str, str], list[tuple[int, float]]] = {}
        for _, batch in engine.stream(
                f"SELECT {key}, wall_ns, value FROM (SELECT {key}, wall_ns, value, row_number() OVER (PARTITION BY "
                f"{key} ORDER BY wall_ns, value) - 1 AS i FROM {relation} WHERE wall_ns >= {int(steady)}) "
                f"JOIN findings_thin_gauges USING ({key}, i) ORDER BY {key}, i"):
            for kind, rank, host, device, wall, value in batch:
                picked.setdefault((kind, rank, host, device), []).append((int(wall), float(value)))
        engine.execute("DROP TABLE findings_thin_gauges")
        for kind, rank, host, device, n in thin:
            ps = picked[(kind, rank, host, device)]
            builder.memory_series(kind, rank, host, device, ps, (int(steady), n))
            given += len(ps)
    return given


def gauges_relation(table: str, key: str, where: str) -> str:
    """The memory gauges ``InputBuilder.metric`` keeps, from ``table`` (metric rows, ``key`` the name column), as
    ``feed_memory_series_sql`` reads them."""
    rss, cuda = RSS.replace("'", "''"), CUDA_ALLOCATED.replace("'", "''")
    return (f"(SELECT CASE WHEN {key} = '{rss}' THEN 'rss' ELSE 'cuda' END AS kind, rank, host, "
            f"CASE WHEN {key} = '{rss}' THEN '' ELSE 'cuda:' || group_name[{len('system.cuda.') + 1}:] END AS device, "
            f"wall_ns, value FROM {table} WHERE {where} AND value_bool IS NULL AND value IS NOT NULL AND "
            f"(({key} = '{rss}' AND group_name = 'system') OR "
            f"({key} = '{cuda}' AND starts_with(group_name, 'system.cuda.'))))")


def window_json_sql(attributes: str = "attributes") -> str:
    """SQL: the values of ``WINDOW_POINT_KEYS`` (``findings.builder``: what the findings engine reads of a report)
    in the JSON text ``attributes``, one extraction (a list of JSON values, for ``window_fields_sql``); a report's
    JSON (~30 attributes, ~1.5 KB) is not decoded in Python."""
    paths = ", ".join(f"'$.{k}'" for k in WINDOW_POINT_KEYS)
    return f"json_extract({attributes}, [{paths}])"


def window_fields_sql(j: str) -> str:
    """SQL: the columns ``WINDOW_POINT_KEYS`` from ``j`` (``window_json_sql``'s list), typed as ``window_point`` reads
    them in Python: the step, the window's iterations and the loop's start an integer (a JSON integer; the start
    also a bool, as Python's ``isinstance(..., int)`` takes one), the rest a number (``json_double``: not a bool,
    the non-finite ones untagged); anything else NULL, as a missing attribute."""
    from ..store.engine import json_double

    out = []
    for i, key in enumerate(WINDOW_POINT_KEYS, start=1):
        x = f"{j}[{i}]"
        if key in _INTEGERS:
            boolean = f"WHEN json_type({x}) = 'BOOLEAN' THEN TRY_CAST({x} AS BOOLEAN)::BIGINT " \
                if key == "train_iterations_start" else ""
            out.append(f"(CASE WHEN json_type({x}) IN ('BIGINT', 'UBIGINT') THEN TRY_CAST({x} AS BIGINT) {boolean}"
                       "END)")
        else:
            out.append(json_double(x))
    return ", ".join(out)
