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
- **Report windows** (the slowdown, straggler and slow-iteration rules): the ~30 figures the findings engine reads
  of each report come typed from the engine's ``reports`` table (``store.report_rows``: typed once, at compaction;
  ``window_fields_sql``); Python makes the
  window of each (``findings.builder.window_point``) and the builder holds them within its budget, merged past it
  (``findings.window_budget``), as on the pure-Python path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..store.rank_groups import rank_groups as engine_rank_groups
from ..store.views import insert_rows
from .findings.builder import CUDA_ALLOCATED, RSS, WINDOW_POINT_KEYS, InputBuilder
from .findings.inputs import SpikeSelection, ValueSeries
from .findings.memory import MAX_POINTS, thin_indices
from .findings.thresholds import DEFAULT_THRESHOLDS, Thresholds
from .findings.values import _candidate, selected_spikes, spike_points_sql, value_kind

__all__ = ["WINDOW_POINT_KEYS", "by_start_sql", "candidates_sql", "feed_memory_series_sql", "feed_value_series_sql",
           "gauges_relation", "loop_start_sql", "rank_groups", "reports_relation", "window_fields_sql",
           "window_values_sql"]

BLOCK_LINES = 2048  # the spike pre-filter's blocks: a series' points within this many lines of a segment
# records (of every kind) of the ranks whose blocks are aggregated at once: the table of blocks grows with the points
# (68,000 blocks, ~9 MiB, on 64 ranks x 1M iterations, all at once); ~7 ranks of 1M iterations a group
BLOCK_RECORDS_AT_ONCE = 16_000_000
EXACT_AT_ONCE = 1 << 20  # flagged points up to which the candidates of every rank are found in one query
_INTEGERS = WINDOW_POINT_KEYS[:3]  # current_iteration, window_iterations, train_iterations_start


def feed_value_series_sql(builder: InputBuilder, engine: Any, relation: str, key: str,
                          thresholds: Thresholds | None = None, *, block_lines: int = BLOCK_LINES) -> int:
    """Give ``builder`` the value series of ``relation`` (columns ``key``, rank, step, value, pid, segment, line;
    the numeric points, non-finite included, of the series ``InputBuilder.metric`` keeps as values; a series' points
    are taken in (pid, segment, line) order: make ``pid`` the process's start order with ``by_start_sql``): each as
    the points that settle its spikes for ``thresholds``, or whole where those do not. Returns the points given.

    Two passes: the candidates (``candidates_sql``: no sort of every point), then, for the series that have some,
    their finite points within ``spike_history`` before and twice that after each."""
    th = thresholds if thresholds is not None else DEFAULT_THRESHOLDS
    h = th.spike_history
    # every series counts in the spike rule's correction over ranks, those without candidates too
    for name, ranks, most in engine.rows(
            f"SELECT k, count(*), max(n) FROM (SELECT {key} AS k, rank, count(*) AS n FROM {relation} "
            "WHERE isfinite(value) GROUP BY ALL) GROUP BY k ORDER BY k"):
        builder.value_family(name, int(ranks), int(most))
    ranges: list[list[Any]] = []  # [k, rank, first fi, last fi], merged
    for query in candidates_sql(engine, relation, key, th, block_lines, _record_groups(engine)):
        for _, batch in engine.stream(query):
            for k, rank, fi in batch:
                last = ranges[-1] if ranges else None
                if last is not None and last[0] == k and last[1] == rank and fi - h <= last[3] + 1:
                    last[3] = fi + 2 * h
                else:
                    ranges.append([k, rank, max(fi - h, 0), fi + 2 * h])
    engine.execute("DROP TABLE findings_blocks")
    engine.execute("DROP TABLE findings_needed")
    if not ranges:
        engine.execute("DROP TABLE IF EXISTS findings_process_order")  # (by_start_sql's, when made)
        return 0
    engine.execute("CREATE OR REPLACE TEMP TABLE findings_ranges (k VARCHAR, rank BIGINT, a BIGINT, b BIGINT)")
    insert_rows(engine.con, "findings_ranges", ranges)
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
    engine.execute("DROP TABLE IF EXISTS findings_process_order")
    return given


def by_start_sql(relation: str, engine: Any = None) -> str:
    """``relation`` (with columns rank, pid, wall_ns) with ``pid`` replaced by the process's place among its rank's
    processes, by their first point's wall time, then pid: the order the Python readers take them in
    (``store.reader.in_start_order``). A restart's pid need not be higher (pid namespaces, containers): by pid, its
    points came first, and a spike just after it was read without the history before it. ``engine``: the order is
    made once, in the temp table ``findings_process_order`` (a relation read by several queries: one scan for it)."""
    order = (f"SELECT rank, pid, row_number() OVER (PARTITION BY rank ORDER BY min(wall_ns), pid) AS ix "
             f"FROM {relation} GROUP BY rank, pid")
    if engine is not None:
        engine.execute(f"CREATE OR REPLACE TEMP TABLE findings_process_order AS {order}")
        order = "SELECT * FROM findings_process_order"
    return (f"(SELECT r.* REPLACE (o.ix AS pid) FROM {relation} r JOIN ({order}) o "
            "ON r.rank = o.rank AND r.pid IS NOT DISTINCT FROM o.pid)")


def _record_groups(engine: Any) -> list[str] | None:
    """The ranks of ``engine``'s runs in groups of at most ``BLOCK_RECORDS_AT_ONCE`` records (its per-process
    counts, read when it opened the runs); None (all at once) for an engine without them."""
    counts: dict[int, int] = {}
    for (_, agent, rank, _), c in (getattr(engine, "process_counts", None) or {}).items():
        if not agent:
            counts[int(rank)] = counts.get(int(rank), 0) + int(c.records)
    return engine_rank_groups(sorted(counts.items()), BLOCK_RECORDS_AT_ONCE) if len(counts) > 1 else None


def candidates_sql(engine: Any, relation: str, key: str, th: Thresholds,
                   block_lines: int = BLOCK_LINES, groups: list[str] | None = None) -> Iterator[str]:
    """Queries of the spike candidates (k, rank, fi) of the value series in ``relation`` (``feed_value_series_sql``'s
    columns), each ordered by (k, rank, fi): exactly those of ``values.spike_candidates_sql`` (and of
    ``spike_points_sql`` for a series holding NaN/inf), without sorting every point. Leaves the tables
    ``findings_blocks`` and ``findings_needed`` for the caller to drop. ``groups``: SQL lists of ranks whose blocks
    are made and queried together (None: every rank at once), a group's queries yielded once its tables are made:
    the caller runs each before asking for the next.

    **Blocks.** One hash aggregate (no sort) gives each series' blocks, (pid, segment, line // ``block_lines``) in
    file order: their points, smallest and largest value, and whether one is NaN/inf. A point's ``spike_history``
    finite predecessors lie in its own block and the ``spike_history`` blocks before it (each holds at least one
    point), so the smallest value ``b`` of those blocks is at most the point's ``lo`` (``values._candidate``). When
    ``b > 0`` and the block's largest value is below ``spike_ratio x b`` (loosened by 1e-9 as ``_candidate``
    loosens it; rounding is monotone), no point of the block can pass ``_candidate``: its ``lo`` is positive and
    the point below ``spike_ratio x lo``. The other blocks are *flagged*; only they (with the blocks before them that
    hold their predecessors) are sorted, their points numbered from the points of the blocks before (``fi``), and
    ``_candidate`` applied as ``spike_candidates_sql`` applies it: in one query for the group's ranks when few,
    else one rank at a time (as DuckDB sorted every point before, rank by rank: 64 ranks x 1M at once outgrew its
    memory). A series holding NaN/inf takes ``spike_points_sql`` (its finite index skips them)."""
    h = th.spike_history
    ratio = float(th.spike_ratio)
    every: list[str | None] = [None]
    for ranks in groups or every:
        group = relation if ranks is None else f"(SELECT * FROM {relation} WHERE rank IN {ranks})"
        engine.execute(f"""CREATE OR REPLACE TEMP TABLE findings_blocks AS
            SELECT *, bool_or(bad) OVER (PARTITION BY k, rank) AS unclean,
                   sum(n) OVER (PARTITION BY k, rank ORDER BY pid, segment, blk ROWS UNBOUNDED PRECEDING) - n AS off,
                   min(lo) OVER (PARTITION BY k, rank ORDER BY pid, segment, blk ROWS BETWEEN {h} PRECEDING AND CURRENT
                                 ROW) AS bound,
                   row_number() OVER (PARTITION BY k, rank ORDER BY pid, segment, blk) AS b
            FROM (SELECT {key} AS k, rank, pid, segment, line // {int(block_lines)} AS blk, count(*) AS n,
                         min(value) AS lo, max(value) AS hi, bool_or(NOT isfinite(value)) AS bad
                  FROM {group} GROUP BY ALL)""")
        engine.execute(f"""CREATE OR REPLACE TEMP TABLE findings_blocks AS
            SELECT *, NOT unclean AND (bound <= 0 OR hi >= {ratio!r} * bound * (1 - 1e-9)) AS flagged
            FROM findings_blocks""")
        # the flagged blocks and the spike_history blocks before each (their points are the flagged ones'
        # predecessors)
        engine.execute(f"""CREATE OR REPLACE TEMP TABLE findings_needed AS
            SELECT DISTINCT x.k, x.rank, x.pid, x.segment, x.blk, x.off, x.flagged FROM findings_blocks x
            JOIN findings_blocks f ON f.flagged AND x.k = f.k AND x.rank = f.rank AND x.b BETWEEN f.b - {h} AND f.b""")
        segments = engine.rows("SELECT DISTINCT segment FROM findings_needed ORDER BY ALL LIMIT 65")
        # (the segments' numbers as constants, for DuckDB to skip the other segments' row groups)
        only = "" if len(segments) > 64 or any(g is None for g, in segments) else \
            f" AND segment IN ({', '.join(str(int(g)) for g, in segments)})"
        exact = f"""SELECT k, rank, fi FROM (
            SELECT p.k, p.rank, p.value, q.flagged,
                   q.off + row_number() OVER (PARTITION BY p.k, p.rank, p.pid, p.segment, q.blk
                                              ORDER BY p.line) - 1 AS fi,
                   min(p.value) OVER (PARTITION BY p.k, p.rank ORDER BY p.pid, p.segment, p.line
                                      ROWS BETWEEN {h} PRECEDING AND 1 PRECEDING) AS lo
            FROM (SELECT {key} AS k, rank, value, pid, segment, line, line // {int(block_lines)} AS blk
                  FROM {relation} WHERE rank IN {{ranks}}{only}) p
            JOIN findings_needed q ON p.k = q.k AND p.rank = q.rank AND p.pid IS NOT DISTINCT FROM q.pid
              AND p.segment IS NOT DISTINCT FROM q.segment AND p.blk IS NOT DISTINCT FROM q.blk)
            WHERE flagged AND {_candidate(th)} ORDER BY k, rank, fi"""
        those = (f"(SELECT * FROM {relation} WHERE ({key}, rank) IN "
                 "(SELECT k, rank FROM findings_blocks WHERE unclean))")
        unclean = f"SELECT k, rank, fi FROM {spike_points_sql(those, key, th)} WHERE cand ORDER BY k, rank, fi"
        flagged = engine.rows("SELECT rank, sum(n) FROM findings_blocks WHERE flagged GROUP BY rank ORDER BY rank")
        if sum(int(n) for _, n in flagged) <= EXACT_AT_ONCE:  # few: one scan for all ranks
            queries = [exact.replace("{ranks}", "(" + ", ".join(str(int(r)) for r, _ in flagged) + ")")] \
                if flagged else []
        else:  # many (a series where most points are candidates): one rank at a time
            queries = [exact.replace("{ranks}", f"({int(r)})") for r, _ in flagged]
        if engine.rows("SELECT bool_or(unclean) FROM findings_blocks")[0][0]:
            queries.append(unclean)
        yield from queries


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
        insert_rows(engine.con, "findings_whole_gauges", whole)
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
        insert_rows(engine.con, "findings_thin_gauges", [(*k, i) for *k, n in thin for i in thin_indices(n)])
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


REPORTS_AT_ONCE = 49_152  # reports DuckDB sorts in one query (~30 typed attributes each: ~12 MB; docs/scale.md)


def rank_groups(counts: list[tuple[Any, Any]], most: int = REPORTS_AT_ONCE) -> list[str]:
    """The ranks of ``counts`` ((rank, reports), by rank) as SQL lists of consecutive ranks holding at most ``most``
    reports together (a rank holding more is alone): the reports are read a group at a time, sorted by DuckDB."""
    return engine_rank_groups(counts, most)


def loop_start_sql() -> str:
    """SQL: a report's ``train_iterations_start`` from the typed report columns (``store.report_rows``), as
    ``window_point`` reads it in Python: a JSON integer, or a bool as an integer (``isinstance(True, int)``)."""
    return "coalesce(train_iterations_start, train_iterations_start_bool::BIGINT)"


def window_fields_sql() -> str:
    """SQL: the columns ``WINDOW_POINT_KEYS`` (``wp0``, ``wp1``, ...) of a relation with the typed report columns
    (the engine's ``reports`` table or ``windows`` view, ``store.report_rows``), typed as ``window_point`` reads them
    in Python: the step, the window's iterations and the loop's start an integer, the rest a number (not a bool, the
    non-finite ones untagged); anything else NULL, as a missing attribute."""
    return ", ".join(f"{loop_start_sql() if key == 'train_iterations_start' else key} AS wp{i}"
                     for i, key in enumerate(WINDOW_POINT_KEYS))


def window_values_sql(alias: str = "") -> str:
    """SQL over ``window_fields_sql``'s columns: the values ``InputBuilder.window_values`` takes (the numbers finite
    or NULL, as ``window_point`` reads them with ``finite``); ``alias``: named ``<alias>0``, ``<alias>1``, ..."""
    return ", ".join((f"wp{i}" if key in _INTEGERS else f"CASE WHEN isfinite(wp{i}) THEN wp{i} END")
                     + (f" AS {alias}{i}" if alias else "") for i, key in enumerate(WINDOW_POINT_KEYS))


def reports_relation(source: str, where: str) -> str:
    """The reports of ``source`` (rows with rank, pid, segment, line, wall_ns, host and the typed report columns:
    ``reports`` or ``windows``) that ``where`` selects, as ``findings_windows_sql.feed_windows_sql`` reads them (v0,
    v1, ...: the values of ``WINDOW_POINT_KEYS``)."""
    cols = "rank, pid, segment, line, wall_ns, host"
    return (f"(SELECT {cols}, {window_values_sql('v')} FROM (SELECT {cols}, {window_fields_sql()} FROM {source} "
            f"WHERE {where}))")
