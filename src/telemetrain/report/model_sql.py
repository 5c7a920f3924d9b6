"""The report's collection by SQL (``store.engine``): what ``model_pass._Collector`` gathers in one Python pass over
every record, DuckDB computes over the columnar copy and the JSONL tail, so that memory follows the size of the report,
not of the run. Big things are reduced in SQL to what the report keeps: counts and sums, the first 300 events, each
rank's windows merged to at most 1,000 (``windows.py``), every k-th point of a series.

The rules are ``_Collector``'s, line for line; where the Python pass depends on the order it meets records in (the
first non-finite value, the last value of a metric, the first 300 events), "collection order" is the processes by
(rank, pid), then file order (segment, line). The tests build both models on the same runs and compare them.
The launcher's agents write a few records each: they go through ``_Collector`` itself.
"""

from __future__ import annotations

from typing import Any

from ..analysis.counter_totals import lifetimes_sql, merge_lifetimes
from ..analysis.findings.builder import (
    CONTAINER_MEMORY,
    GPU_MEMORY_LIMIT,
    HOST_MEMORY_LIMIT,
    HOST_MEMORY_USAGE,
    VALUE_SERIES_NAME_SQL,
)
from ..analysis.findings.thresholds import Thresholds
from ..analysis.findings.values import value_kind
from ..analysis.findings_sql import (
    REPORTS_AT_ONCE,
    by_start_sql,
    feed_memory_series_sql,
    feed_value_series_sql,
    gauges_relation,
    rank_groups,
    window_fields_sql,
    window_values_sql,
)
from ..analysis.findings_windows_sql import feed_windows_sql
from ..store.codec import loads_column
from ..store.engine import Engine
from ..store.reader import Run
from ..store.views import first_int_sql, insert_rows
from ..training.names import CHECKPOINT_STEP_KEYS
from .curves_sql import curve_extent_sql, feed_curves
from .model_pass import (
    _ENERGY_NAMES,
    CHECKPOINT_SPANS,
    ITERATION_CHART_POINTS,
    LIFECYCLE_SPANS,
    MAX_CHECKPOINT_ROWS,
    MAX_CHECKPOINT_SPANS,
    MAX_EVENT_ROWS,
    MAX_EVENT_ROWS_PER_NAME,
    MAX_SERIES_POINTS,
    PHASE_SPANS,
    ROUTINE_EVENTS,
    SYSTEM_CHARTS,
    EventRow,
    SpanRow,
    Window,
    _Collector,
)
from .windows import WindowFigures
from .windows_sql import WindowsSql

__all__ = ["SqlCollector"]

ORDER = "rank, pid, segment, line"  # collection order

def _attrs(text: Any) -> dict[str, Any]:
    """An attributes column (JSON text) as the reader gives it: an object, non-finite floats untagged."""
    if text is None:
        return {}
    value = loads_column(text)
    return value if isinstance(value, dict) else {}


def _step(attributes: str) -> str:
    """SQL of a checkpoint span's iteration in its ``attributes``, as ``training.names.checkpoint_step`` takes it."""
    return first_int_sql(attributes, CHECKPOINT_STEP_KEYS)


def _names(names: Any) -> str:
    return "(" + ", ".join("'" + str(n).replace("'", "''") + "'" for n in names) + ")"


def _metric_value(value: Any, value_int: Any, value_bool: Any) -> Any:
    if value_bool is not None:
        return bool(value_bool)
    if value_int is not None:
        return int(value_int)
    return value


class SqlCollector(_Collector):
    """``_Collector`` with its pass over the ranks' records done by SQL; the agents' records are read as before."""

    def __init__(self, run: Run, engine: Engine, thresholds: Thresholds | None = None) -> None:
        super().__init__(run)
        self.engine = engine
        self.thresholds = thresholds  # the spike rule's, which the loss points are selected for
        engine.attach(run)
        self.where = self.where_of("")
        self._figures: WindowFigures | None = None
        self._counts: list[tuple[Any, Any]] = []  # (rank, reports), by rank
        self._spans: dict[int, list[tuple[int, float]]] = {}
        self._system: dict[tuple[str, str], list[tuple[int, float]]] = {}

    def where_of(self, alias: str) -> str:
        """The rows of this run's ranks (the engine may hold the session's other runs too, for goodput)."""
        a = f"{alias}." if alias else ""
        session, run_id = (v.replace("'", "''") for v in (self.run.session_tag, self.run.run_id))
        return f"{a}session = '{session}' AND {a}run = '{run_id}' AND {a}role <> 'agent'"

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self.engine.rows(query.replace("{w}", self.where), params)

    # -- the pass ------------------------------------------------------------------------------------------------

    def collect(self) -> None:
        # The report windows' queries parse every report's JSON (DuckDB's largest working memory): they run as soon
        # as the time bounds are known (the metrics' included, the findings' origin), before the events, spans and
        # curves are held in Python, so that the process's peak is not their sum (docs/scale.md)
        self._bounds()
        self._series_keys()
        self._metrics()
        self._windows()
        # the user's metrics, bucketed by SQL (their extents from _metrics' pass)
        feed_curves(self.engine, self.curves, self._metrics_keyed(), extents="report_metric_stats")
        self.engine.execute("DROP TABLE IF EXISTS report_metric_stats")
        self._events()
        self._spans_and_problems()
        self._stats()
        self._diagnostics()
        for log in self.run.agents:
            self._process(log, f"agent {log.identity.host}", agent=True)
        self.events.sort(key=lambda e: e.wall_ns)
        self.problems.sort(key=lambda e: e.wall_ns)
        self.engine.release_freed()  # (the model and the findings are made in Python from here)

    def _series_keys(self) -> None:
        """``semconv.series_key`` of every (name, attributes) the run's metrics have (a few hundred at most), as the
        temporary table ``report_series`` (name, attributes, skey): the SQL groups metrics by series as the Python
        pass does (v1 and v2 records of a series alike)."""
        self.engine.series_keys("report_series", self.where)
        self._skeys = {(n, a): k for n, a, k in self.engine.rows("SELECT name, attributes, skey FROM report_series")}

    def _metrics_keyed(self, alias: str = "") -> str:
        """The run's rank metrics with their series key ``skey`` (a subquery)."""
        return (f"(SELECT m.*, k.skey FROM metrics m JOIN report_series k ON m.name = k.name AND "
                f"m.attributes IS NOT DISTINCT FROM k.attributes WHERE {self.where_of('m')}){alias}")

    def _bounds(self) -> None:
        """The time bounds of the records; the metrics' are taken in ``_metrics``' pass over them."""
        parts = " UNION ALL ".join(f"SELECT min(wall_ns) AS lo, max(wall_ns) AS hi FROM {t} WHERE {{w}}"
                                   for t in ("events", "span_starts", "span_ends", "stats", "diagnostics"))
        lo, hi = self.rows(f"SELECT min(lo), max(hi) FROM ({parts})")[0]
        self.first_ns, self.last_ns = lo, hi

    def _widen(self, lo: int | None, hi: int | None) -> None:
        if lo is not None:
            self.first_ns = lo if self.first_ns is None else min(self.first_ns, lo)
        if hi is not None:
            self.last_ns = hi if self.last_ns is None else max(self.last_ns, hi)

    def _events(self) -> None:
        for group, name, n in self.rows("SELECT group_name, name, count(*) FROM events WHERE {w} GROUP BY ALL "
                                        "ORDER BY ALL"):
            self.event_counts[("ranks", group, name)] += n
        # each rank's last report: its position (a narrow scan), then the row itself from its segment's file
        positions = self.rows("SELECT any_value(session), any_value(run), rank, max((pid, segment, line)) FROM events "
                              "WHERE {w} AND group_name = 'training' AND name = 'training_metrics_update' "
                              "GROUP BY rank")
        names, fetched = self.engine.fetch("events", [(session, run, rank, *k) for session, run, rank, k in positions])
        for row in sorted(fetched, key=lambda row: row[names.index("rank")]):
            r = dict(zip(names, row, strict=True))
            self.last_update[r["rank"]] = _attrs(r["attributes"])
        for rank, attributes, wall in self.rows(
                f"SELECT rank, attributes, wall_ns FROM events WHERE {{w}} AND group_name = 'cross_rank' AND "
                f"name = 'straggler' ORDER BY {ORDER}"):
            a = _attrs(attributes)
            self.stragglers.append({**a, "reported_by": rank, "wall_ns": wall})
            self.inputs.straggler(a)
        for group, attributes in self.rows(
                f"SELECT group_name, attributes FROM events WHERE {{w}} AND name IN ('hyperparameters', "
                f"'update_training_telemetry_config') ORDER BY {ORDER}"):
            into = self.hyperparameters if group == "run" else self.training_config
            for key, value in _attrs(attributes).items():
                into.setdefault(key, value)  # ranks agree; the lowest rank's value is kept otherwise
        for rank, attributes in self.rows(
                f"SELECT rank, attributes FROM events WHERE {{w}} AND group_name = 'watchdog' AND "
                f"name = 'stall_evidence' ORDER BY {ORDER}"):
            self.inputs.stall_evidence(rank, _attrs(attributes))
        routine = _names(ROUTINE_EVENTS)
        base = ("FROM events WHERE {w} AND NOT (group_name = 'training' AND name = 'training_metrics_update') AND "
                "NOT (group_name = 'cross_rank' AND name = 'straggler')")
        problem = "(severity IN ('warning', 'error', 'critical') OR (group_name = 'training' AND name = 'error'))"
        # the checkpoint successes the report lists: the earliest, as build_model's stable sort by time of the
        # collection order takes them (a long run's 6,400, with their attributes, held ~12 MiB)
        for rank, wall, group, name, severity, attributes in self.rows(
                f"SELECT rank, wall_ns, group_name, name, severity, attributes {base} AND "
                f"name = 'save_checkpoint_success' ORDER BY wall_ns, {ORDER} LIMIT {MAX_CHECKPOINT_ROWS}"):
            self.successes.append(EventRow(wall, f"rank {rank}", group, name, severity, _attrs(attributes)))
        notable = f"{base} AND NOT {problem} AND name NOT IN {routine}"
        for rank, wall, group, name, severity, attributes in self.rows(
                f"SELECT rank, wall_ns, group_name, name, severity, attributes {notable} QUALIFY row_number() OVER "
                f"(PARTITION BY group_name, name ORDER BY {ORDER}) <= {MAX_EVENT_ROWS_PER_NAME} ORDER BY {ORDER} "
                f"LIMIT {MAX_EVENT_ROWS}"):
            self.events.append(EventRow(wall, f"rank {rank}", group, name, severity, _attrs(attributes)))
        total = self.rows(f"SELECT count(*) {notable}")[0][0]
        self.events_left_out = max(0, int(total) - len(self.events))
        self._problem_events = (f"SELECT 0 AS src, rank, pid, segment, line, wall_ns, group_name, name, severity, "
                                f"attributes, NULL AS status, NULL AS error, NULL AS duration_ns, NULL AS sink, "
                                f"NULL AS record_count, NULL AS message {base} AND {problem}")

    def _spans_and_problems(self) -> None:
        for group, name, n, seconds, bad in self.rows(
                "SELECT group_name, name, count(*), fsum(duration_ns / 1e9), count(*) FILTER (WHERE status <> 'ok') "
                "FROM span_ends WHERE {w} GROUP BY ALL ORDER BY ALL"):
            self.span_stats[(group, name)] = [n, float(seconds), bad]
        for rank, name, seconds in self.rows(
                f"SELECT rank, name, fsum(duration_ns / 1e9) FROM span_ends WHERE {{w}} AND name IN "
                f"{_names(PHASE_SPANS)} GROUP BY ALL ORDER BY ALL"):
            self.span_phase_seconds[rank][PHASE_SPANS[name]] += float(seconds)
        # the iteration chart's: every k-th iteration span of the lowest rank that exported any (the one drawn)
        iteration = "name = 'training_single_iteration'"
        lowest = self.engine.scalar(f"SELECT min(rank) FROM span_ends WHERE {self.where} AND {iteration}")
        if lowest is not None:
            self._spans[int(lowest)] = [(wall, seconds) for wall, seconds in self.rows(
                f"""WITH s AS (SELECT wall_ns, duration_ns,
                      row_number() OVER (ORDER BY wall_ns, duration_ns) - 1 AS i, count(*) OVER () AS n
                    FROM span_ends WHERE {{w}} AND {iteration} AND rank = $rank)
                SELECT wall_ns, duration_ns / 1e9 FROM s WHERE i % greatest(1, n // {ITERATION_CHART_POINTS}) = 0
                ORDER BY i""", {"rank": int(lowest)})]
        lifecycle = _names(LIFECYCLE_SPANS)
        # the lifecycle spans' starts and ends first (a few per rank), then their pairing over those alone: the
        # correlated lookups over the whole span tables held +30-45 MiB on 64 x 1M, the tables' filtered rows +10-16
        for table, into in (("span_starts", "report_lifecycle_starts"), ("span_ends", "report_lifecycle_ends")):
            self.engine.execute(f"CREATE OR REPLACE TEMP TABLE {into} AS SELECT * FROM {table} WHERE {self.where} "
                                f"AND name IN {lifecycle}")
        same = ("s.session = e.session AND s.run = e.run AND s.rank = e.rank AND s.pid = e.pid AND "
                "s.span_id = e.span_id AND (s.segment, s.line) < (e.segment, e.line)")
        # the attributes of the checkpoint spans the report shows alone (build_model keeps the first
        # MAX_CHECKPOINT_SPANS by (start, rank)): those up to the last one's (start, rank), ties included
        checkpoint = _names(CHECKPOINT_SPANS)
        last = self.engine.rows(
            f"""SELECT start, rank FROM (
                  SELECT e.wall_ns - e.duration_ns AS start, e.rank FROM report_lifecycle_ends e
                  WHERE e.name IN {checkpoint}
                  UNION ALL
                  SELECT s.wall_ns, s.rank FROM report_lifecycle_starts s ANTI JOIN report_lifecycle_ends e ON {same}
                  WHERE s.name IN {checkpoint})
                ORDER BY start, rank LIMIT 1 OFFSET {MAX_CHECKPOINT_SPANS - 1}""")

        def shown(alias: str, start: str) -> str:
            if not last:
                return "true"
            return (f"({alias}.name NOT IN {checkpoint} OR ({start}, {alias}.rank) <= "
                    f"({int(last[0][0])}::BIGINT, {int(last[0][1])}::BIGINT))")

        end_shown, start_shown = shown("e", "e.wall_ns - e.duration_ns"), shown("s", "s.wall_ns")
        # an end's start: the latest before it with its span id, by a join grouped per end (a correlated
        # ``ORDER BY ... LIMIT 1`` subquery held ~+5 MiB more on 64 x 1M's 6,592 lifecycle spans)
        ended = self.engine.stream(
            f"""SELECT e.rank, e.pid, any_value(e.name), any_value(e.wall_ns), any_value(e.duration_ns),
                   any_value(e.status), any_value(e.attributes) FILTER (WHERE {end_shown}), any_value(e.error),
                   arg_max_null(s.attributes, (s.segment, s.line)) FILTER (WHERE {end_shown}) AS start_attributes,
                   CASE WHEN any_value(e.name) IN {checkpoint} THEN coalesce({_step("any_value(e.attributes)")},
                     {_step("arg_max_null(s.attributes, (s.segment, s.line))")}) END AS step,
                   0 AS k, e.segment, e.line
                FROM report_lifecycle_ends e LEFT JOIN report_lifecycle_starts s ON {same}
                GROUP BY e.session, e.run, e.rank, e.pid, e.segment, e.line
            UNION ALL
            SELECT s.rank, s.pid, s.name, s.wall_ns, NULL, NULL, NULL, NULL,
                   CASE WHEN {start_shown} THEN s.attributes END,
                   CASE WHEN s.name IN {checkpoint} THEN {_step("s.attributes")} END, 1, s.segment, s.line
                FROM report_lifecycle_starts s ANTI JOIN report_lifecycle_ends e ON {same}
            ORDER BY rank, pid, k, segment, line""")
        strings: dict[str, str] = {}  # one object for each span name and status (DuckDB gives one a row)
        for _, batch in ended:
            for rank, _, name, wall, duration_ns, status, attributes, error, start_attributes, step, k, _, _ in batch:
                name = strings.setdefault(name, name)
                if status is not None:
                    status = strings.setdefault(status, status)
                if k == 0:
                    merged = _attrs(start_attributes)
                    merged.update(_attrs(attributes))
                    self.lifecycle.append(SpanRow(rank, name, wall - duration_ns, duration_ns / 1e9, status, merged,
                                                  error, step))
                else:
                    self.lifecycle.append(SpanRow(rank, name, wall, None, "never ended", _attrs(attributes),
                                                  step=step))
        self.engine.execute("DROP TABLE report_lifecycle_starts")
        self.engine.execute("DROP TABLE report_lifecycle_ends")
        failed = ("SELECT 1, rank, pid, segment, line, wall_ns, group_name, name, NULL, NULL, status, error, "
                  "duration_ns, NULL, NULL, NULL FROM span_ends WHERE {w} AND status <> 'ok'")
        diagnostics = ("SELECT 2, rank, pid, segment, line, wall_ns, 'diagnostic', name, 'warning', NULL, NULL, NULL, "
                       "NULL, sink, record_count, message FROM diagnostics WHERE {w} AND name <> 'sink_resumed'")
        for (src, rank, _, _, _, wall, group, name, severity, attributes, status, error, duration_ns, sink, count,
             message) in self.rows(f"SELECT * FROM ({self._problem_events} UNION ALL {failed} UNION ALL "
                                   f"{diagnostics}) ORDER BY {ORDER}"):
            source = f"rank {rank}"
            if src == 1:
                self.problems.append(EventRow(wall, source, group, name, "error" if status == "error" else "warning",
                                              {"span status": status, "error": error,
                                               "duration_s": duration_ns / 1e9}))
            elif src == 2:
                self.problems.append(EventRow(wall, source, "diagnostic", name, "warning",
                                              {"sink": sink, "records": count, "message": message}))
            else:
                self.problems.append(EventRow(wall, source, group, name, severity, _attrs(attributes)))

    def _metrics(self) -> None:
        # One streaming pass over the metrics: per series (``semconv.series_key``: a v2 record's attributes make its
        # series) its count, time bounds, min and max; the last record (collection order: the highest rank, pid,
        # then file order) and the first's unit are then read from the records of that one rank only. A min or max is
        # an int when an int record holds it (the Python pass keeps the type of the first record holding it: they
        # differ only for a series mixing 3 and 3.0 at its extreme).
        # The pass is per series and rank (each figure a min, max or count, rolled up per series below), and also
        # gives the curves' extents (``curves_sql.feed_curves``: its first pass, not made again).
        m = self._metrics_keyed()
        plain = "value_bool IS NULL AND isfinite(value)"
        self.engine.execute(
            f"""CREATE OR REPLACE TEMP TABLE report_metric_stats AS
                SELECT group_name, skey, rank, count(*) AS n, min(value) FILTER (WHERE {plain}) AS lo,
                   min(value_int) FILTER (WHERE {plain}) AS lo_int, max(value) FILTER (WHERE {plain}) AS hi,
                   max(value_int) FILTER (WHERE {plain}) AS hi_int, min(wall_ns) AS first, max(wall_ns) AS last,
                   {curve_extent_sql()}
                FROM {m} GROUP BY group_name, skey, rank""")
        stats = self.rows(
            """SELECT group_name, skey, sum(n)::BIGINT, min(lo), min(lo_int), max(hi), max(hi_int), max(rank),
                   min(rank), min(first), max(last) FROM report_metric_stats GROUP BY ALL""")
        for *_, first, latest in stats:
            self._widen(first, latest)
        self._findings_metrics()
        stats = [row[:9] for row in stats]
        if not stats:
            return
        self.engine.execute("CREATE OR REPLACE TEMP TABLE report_metric_ranks (group_name VARCHAR, skey VARCHAR, "
                            "hi BIGINT, lo BIGINT)")
        insert_rows(self.engine.con, "report_metric_ranks",
                    [(g, n, hi, lo) for g, n, _, _, _, _, _, hi, lo in stats])
        last = {(g, n): v for g, n, v in self.rows(
            f"""SELECT m.group_name, m.skey, arg_max_null(struct_pack(m.value, m.value_int, m.value_bool),
                       (m.pid, m.segment, m.line))
                FROM {m} m JOIN report_metric_ranks r ON m.group_name = r.group_name AND m.skey = r.skey
                  AND m.rank = r.hi GROUP BY ALL""")}
        units = {(g, n): u for g, n, u in self.rows(
            f"""SELECT m.group_name, m.skey, arg_min_null(m.unit, (m.pid, m.segment, m.line))
                FROM {m} m JOIN report_metric_ranks r ON m.group_name = r.group_name AND m.skey = r.skey
                  AND m.rank = r.lo GROUP BY ALL""")}
        self.engine.execute("DROP TABLE report_metric_ranks")
        for group, name, n, lo, lo_int, hi, hi_int, _, _ in sorted(stats):
            v = last[(group, name)]
            self.metric_stats[(group, name)] = [
                n, _metric_value(v["value"], v["value_int"], v["value_bool"]),
                None if lo is None else (int(lo_int) if lo_int is not None and lo_int == lo else lo),
                None if hi is None else (int(hi_int) if hi_int is not None and hi_int == hi else hi),
                units[(group, name)]]
        names = _names(name for name, _, _ in SYSTEM_CHARTS)
        who = ("CASE WHEN starts_with(skey, 'hw.') THEN host || ' ' || (CASE WHEN starts_with(group_name, 'system.') "
               "THEN group_name[8:] ELSE group_name END) WHEN starts_with(skey, 'system.') OR "
               "starts_with(skey, 'container.') THEN host "
               "ELSE 'rank ' || rank END")
        for name, label, wall, value in self.rows(
                f"""WITH p AS (SELECT skey, {who} AS who, wall_ns, value,
                      row_number() OVER (PARTITION BY skey, {who} ORDER BY wall_ns, value) - 1 AS i,
                      count(*) OVER (PARTITION BY skey, {who}) AS n
                    FROM {m} WHERE skey IN {names} AND value_bool IS NULL)
                SELECT skey, who, wall_ns, value FROM p
                WHERE i % greatest(1, n // {MAX_SERIES_POINTS}) = 0 OR i = n - 1 ORDER BY skey, who, i"""):
            self._system.setdefault((name, label), []).append((wall, value))
        lifetimes: dict[tuple[str, str, str], list[tuple[int, int, float]]] = {}
        for host, group, name, first, last, joules in self.rows(
                lifetimes_sql(m, "host", "skey", f"skey IN {_names(_ENERGY_NAMES)}")):
            lifetimes.setdefault((host, group, name), []).append((int(first), int(last), float(joules)))
        self.energy = {k: merge_lifetimes(lives) for k, lives in lifetimes.items()}  # over the sampler's lifetimes

    def _findings_metrics(self) -> None:
        """The metric records the findings engine reads (``InputBuilder.metric``: memory limits and every non-finite
        value), streamed in collection order (a rank's processes by their start: the first NaN's step is the
        Python path's); the loss and gradient-norm series as the points that settle their
        spikes (``analysis.findings_sql``; the memory gauges after the reports, in ``_windows``); the rest are not
        read."""
        keys = {k for k in self._skeys.values()}
        wanted = {k for k in keys if k in (GPU_MEMORY_LIMIT, HOST_MEMORY_LIMIT, HOST_MEMORY_USAGE, *CONTAINER_MEMORY)}
        nonfinite = "(value_int IS NULL AND value_bool IS NULL AND NOT isfinite(value))"
        where = f"(skey IN {_names(sorted(wanted))} OR {nonfinite})" if wanted else nonfinite
        metric = self.inputs.metric
        for _, batch in self.engine.stream(
                f"SELECT rank, host, group_name, skey, step, value, value_int, value_bool, wall_ns FROM "
                f"{by_start_sql(f'(SELECT * FROM {self._metrics_keyed()} WHERE {where})')} ORDER BY {ORDER}"):
            for rank, host, group, name, step, value, value_int, value_bool, wall in batch:
                metric(rank, host, group, name, step, _metric_value(value, value_int, value_bool), wall, series=False)
        values = sorted(k for k in keys if value_kind(k) is not None)
        if values:
            excluded = "('training', 'system', 'cross_rank')"
            feed_value_series_sql(
                self.inputs, self.engine, by_start_sql(
                    f"(SELECT {VALUE_SERIES_NAME_SQL.format(name='skey')} AS vkey, rank, step, value, pid, segment, "
                    f"line, wall_ns FROM {self._metrics_keyed()} WHERE skey IN {_names(values)} AND group_name NOT IN "
                    f"{excluded} AND NOT starts_with(group_name, 'system.') AND value_bool IS NULL AND value IS NOT "
                    "NULL)", self.engine), "vkey", self.thresholds)

    def _stats(self) -> None:
        bad = ("coalesce(TRY_CAST(json_extract(\"values\", '$.nan_count') AS DOUBLE), 0) + "
               "coalesce(TRY_CAST(json_extract(\"values\", '$.inf_count') AS DOUBLE), 0)")
        for group, name, n, rank in self.rows(
                f"SELECT group_name, name, sum(trunc(bad))::BIGINT, first(rank ORDER BY {ORDER}) FROM "
                f"(SELECT *, {bad} AS bad FROM stats WHERE {{w}}) WHERE bad <> 0 GROUP BY ALL ORDER BY ALL"):
            self.inputs.stat(rank, group, name, {"nan_count": int(n)})  # the sum of each record's count

    def _diagnostics(self) -> None:
        for name, sink, total, at_least_one in self.rows(
                "SELECT name, sink, sum(record_count), sum(greatest(record_count, 1)) FROM diagnostics WHERE {w} "
                "AND name IN ('dropped', 'unencodable', 'sink_error', 'sink_suspended') GROUP BY ALL ORDER BY ALL"):
            if name == "dropped":
                self.dropped += int(total)
            elif name == "unencodable":
                self.unencodable += int(at_least_one)
            else:
                self.sink_failures[(sink, name)] += int(at_least_one)

    # -- the windows -------------------------------------------------------------------------------------------------

    def _windows(self) -> None:
        # rank by rank: DuckDB sorts one rank's reports at a time (all ranks' attributes at once outgrow its memory);
        # ranks together while they hold few reports (a query per rank costs a scan of the reports each)
        self._counts = self.engine.rows(f"SELECT rank, count(*) FROM windows WHERE {self.where} GROUP BY rank "
                                        "ORDER BY rank")
        # the figures a group of ranks at a time (windows_sql), the run's windows never held together; first, while
        # Python holds least (the findings' windows: ~0.13 KB each held)
        self._windows_sql = WindowsSql(self.engine, self.where, self._counts)
        self._figures = self._windows_sql.figures()
        self._feed_windows()
        # the memory gauges as the memory rule thins them from the steady state on, which the reports give
        feed_memory_series_sql(self.inputs, self.engine, gauges_relation(self._metrics_keyed(), "skey", "true"))

    def _feed_windows(self) -> None:
        """Every report to the findings engine (``InputBuilder.window``), in collection order, with the attributes
        its rules read (``findings_sql.WINDOW_POINT_KEYS``, extracted and typed by DuckDB) and no others."""
        window = self.inputs.window_values
        if self.first_ns is not None:
            self.inputs.origin(self.first_ns)  # build_model's start (unless an agent's record is earlier)
        counts = self._counts
        # (merged by SQL, a group's reports are held in a table while its blocks are summed: half as many at once
        # held ~2 MiB less at the report's peak on 64 x 1M, in the same time)
        if feed_windows_sql(self.inputs, self.engine, "windows", self.where, counts,
                            rank_groups(counts, REPORTS_AT_ONCE // 2)):
            return  # a long regular run: merged by SQL (findings_windows_sql), as the builder would merge it
        for ranks in rank_groups(counts):
            for _, batch in self.engine.stream(
                    f"SELECT rank, pid, wall_ns, {window_values_sql()} FROM (SELECT {ORDER}, wall_ns, "
                    f"{window_fields_sql()} FROM windows WHERE {self.where} AND rank IN {ranks}) ORDER BY {ORDER}"):
                for row in batch:
                    window(row[0], row[1], row[2], row[3:])

    def windows_at(self, flagged: set[tuple[int, int, int]]) -> list[Window]:
        """The (unmerged) report windows of these (rank, first step, last step)s, as ``_Collector.windows_at``: of
        each range, the window(s) ending in it whose slowest iteration is the slowest."""
        if not flagged or self._figures is None or not self._figures.counts:
            return []
        return self._windows_sql.windows_at(flagged)

    def close(self) -> None:
        self.engine.execute("DROP TABLE IF EXISTS report_series")

    # -- what build_model asks for -------------------------------------------------------------------------------

    def window_figures(self) -> WindowFigures:
        assert self._figures is not None, "collect() first"
        return self._figures

    def iteration_span_points(self) -> dict[int, list[tuple[int, float]]]:
        return self._spans

    def system_points(self) -> dict[tuple[str, str], list[tuple[int, float]]]:
        return self._system
