"""What ``telemetrain show`` needs besides its summary (``summary.summarize_sql``), by SQL (``store.engine``): the
findings engine's input and the events of the distributed diagnosis. The pure-Python path feeds every record of the
run to ``findings.InputBuilder`` and every event to ``distributed.summary.diagnosis_lines``; here DuckDB selects the
few rows those read (reports, stragglers, crash spans, stats with non-finite samples, the metrics the rules read and
every non-finite value) and Python decodes only those, in the order the Python path meets them, so that both paths
give the same lines. The input holds the report windows within the findings engine's budget, merged past it, as on
the Python path (``findings.window_budget``): see docs/scale.md.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..store.codec import loads_column
from ..store.reader import Run
from ..store.views import first_int_sql, insert_rows
from ..training.names import CHECKPOINT_STEP_KEYS
from .findings.builder import (
    CONTAINER_MEMORY,
    CRASH_SPANS,
    CUDA_ALLOCATED,
    GPU_MEMORY_LIMIT,
    HOST_MEMORY_LIMIT,
    HOST_MEMORY_USAGE,
    REPORT,
    RSS,
    STALL_EVIDENCE,
    STRAGGLER,
    VALUE_SERIES_NAME_SQL,
    InputBuilder,
    value_series_kind,
)
from .findings.checkpoints import CHECKPOINT_SAVES
from .findings.run import feed_agent_events
from .findings_sql import (
    by_start_sql,
    feed_memory_series_sql,
    feed_value_series_sql,
    gauges_relation,
    rank_groups,
    window_fields_sql,
    window_values_sql,
)
from .findings_windows_sql import feed_windows_sql
from .summary import _where

__all__ = ["diagnosis_events_sql", "feed_builder_sql", "findings_builder_sql"]

ORDER = "rank, pid, segment, line"  # the Python path's order: process by process (rank, pid), file order
RECORDS_ORDER = "wall_ns, rank, pid, mono_ns, segment, line"  # Run.records()'s order


def _read_by_builder(group: str, name: str) -> bool:
    """Whether ``InputBuilder.metric`` keeps a finite value of this series (its non-finite values are all read)."""
    if name == RSS and group == "system":
        return True
    if name == CUDA_ALLOCATED and group.startswith("system.cuda."):
        return True
    if name == GPU_MEMORY_LIMIT:
        return True
    if name in (HOST_MEMORY_LIMIT, HOST_MEMORY_USAGE, *CONTAINER_MEMORY) and group == "system":
        return True
    return value_series_kind(group, name) is not None


def _records(engine: Any, query: str) -> Any:
    """The rows of ``query`` (a ``record_kind`` column naming each row's kind) as records, in batches."""
    from ..store.row_records import identity_of_row, record_from_row

    for names, batch in engine.stream(query):
        for row in batch:
            r = dict(zip(names, row, strict=True))
            yield record_from_row(r["record_kind"], identity_of_row(r, r["session"], r["run"]), row, names)


class _Identity(NamedTuple):
    rank: int
    pid: int
    host: str


class _Span(NamedTuple):
    """A span record's fields that ``InputBuilder.add`` reads."""

    kind: str
    identity: _Identity
    name: str
    span_id: str
    status: str
    error: str


def feed_builder_sql(builder: InputBuilder, engine: Any, w: str, *, span_tables: tuple[str, ...],
                     span_names: frozenset[str] = CRASH_SPANS, stats: bool) -> None:
    """Feed ``builder`` the reports, straggler events, stall evidence, crash spans (``span_names`` from
    ``span_tables``) and, with ``stats``, the stats with non-finite samples of the rows ``w`` selects, each kind in
    the Python path's order (process by process, file order): by narrow rows, so that DuckDB sorts little (whole rows
    of a long run's reports would outgrow its memory). The kinds are fed apart: the builder's state of one kind never
    depends on another's."""
    # (each rank's reports, typed: the engine's ``reports`` table, store.report_rows; a group of ranks at a time,
    # sorted by DuckDB)
    counts = engine.rows(f"SELECT rank, count(*) FROM reports WHERE {w} GROUP BY rank ORDER BY rank")
    if not feed_windows_sql(builder, engine, "reports", w, counts, rank_groups(counts)):
        # (a long regular run's reports are merged by SQL, findings_windows_sql; any other run's one by one)
        for ranks in rank_groups(counts):
            for _, batch in engine.stream(
                    f"SELECT rank, pid, host, wall_ns, {window_values_sql()} FROM (SELECT {ORDER}, host, wall_ns, "
                    f"{window_fields_sql()} FROM reports WHERE {w} AND rank IN {ranks}) ORDER BY {ORDER}"):
                for row in batch:
                    builder.host(row[0], row[2])
                    builder.window_values(row[0], row[1], row[3], row[4:])
    straggler = f"group_name = '{STRAGGLER[0]}' AND name = '{STRAGGLER[1]}'"
    for _, batch in engine.stream(f"SELECT attributes FROM events WHERE {w} AND {straggler} ORDER BY {ORDER}"):
        for (text,) in batch:
            builder.straggler(_attributes(text))
    evidence = f"group_name = '{STALL_EVIDENCE[0]}' AND name = '{STALL_EVIDENCE[1]}'"
    for _, batch in engine.stream(f"SELECT rank, attributes FROM events WHERE {w} AND {evidence} ORDER BY {ORDER}"):
        for rank, text in batch:
            builder.stall_evidence(rank, _attributes(text))
    crash = "(" + ", ".join(f"'{n}'" for n in sorted(span_names)) + ")"
    parts = " UNION ALL ".join(
        f"SELECT '{'span_start' if table == 'span_starts' else 'span_end'}' AS kind, {ORDER}, host, name, span_id, "
        f"{'NULL, NULL' if table == 'span_starts' else 'status, error'} FROM {table} WHERE {w} AND name IN {crash}"
        for table in span_tables)
    for _, batch in engine.stream(f"SELECT * FROM ({parts}) ORDER BY {ORDER}"):
        for kind, rank, pid, _, _, host, name, span_id, status, error in batch:
            builder.add(_Span(kind, _Identity(rank, pid, host), name, span_id, status or "", error or ""))
    if stats:
        from ..store.codec import _f as number_of

        for _, batch in engine.stream(f"SELECT rank, group_name, name, \"values\" FROM stats WHERE {w} AND "
                                      "(contains(\"values\", 'nan_count') OR contains(\"values\", 'inf_count')) "
                                      f"ORDER BY {ORDER}"):
            for rank, group, name, text in batch:
                values = _attributes(text)
                builder.stat(rank, group, name, {k: number_of(v) for k, v in values.items()})


def feed_checkpoint_saves_sql(builder: InputBuilder, engine: Any, w: str) -> None:
    """The checkpoint saves that ended ok, each with the iteration its end or else its start named, in the Python
    path's order (``InputBuilder.add`` of their span records)."""
    names = "(" + ", ".join(f"'{n}'" for n in sorted(CHECKPOINT_SAVES)) + ")"
    same = "s.rank = e.rank AND s.pid = e.pid AND s.span_id = e.span_id AND (s.segment, s.line) < (e.segment, e.line)"
    for _, batch in engine.stream(
            f"""SELECT e.rank, any_value(e.name), any_value(e.duration_ns),
                   coalesce({first_int_sql("any_value(e.attributes)", CHECKPOINT_STEP_KEYS)},
                            {first_int_sql("arg_max_null(s.attributes, (s.segment, s.line))", CHECKPOINT_STEP_KEYS)})
                FROM (SELECT * FROM span_ends WHERE {w} AND name IN {names} AND status = 'ok') e
                LEFT JOIN (SELECT * FROM span_starts WHERE {w} AND name IN {names}) s ON {same}
                GROUP BY e.rank, e.pid, e.segment, e.line ORDER BY e.rank, e.pid, e.segment, e.line"""):
        for rank, name, duration_ns, step in batch:
            builder.checkpoint_save(rank, name, step, duration_ns / 1e9)


def _attributes(text: Any) -> dict[str, Any]:
    value = loads_column(text)
    return value if isinstance(value, dict) else {}


def findings_builder_sql(engine: Any, run: Run) -> InputBuilder:
    """``InputBuilder`` fed as ``findings.run_findings`` feeds it from every record of the run's processes."""
    engine.attach(run)
    w = _where(run)
    builder = InputBuilder()
    pairs = engine.rows(f"SELECT DISTINCT group_name, name FROM metrics WHERE {w}")
    engine.execute("CREATE OR REPLACE TEMP TABLE show_findings_series (group_name VARCHAR, name VARCHAR)")
    gauges = {(RSS, "system")}
    kept = [(g, n) for g, n in pairs if _read_by_builder(g, n) and value_series_kind(g, n) is None
            and (n, g) not in gauges and not (n == CUDA_ALLOCATED and g.startswith("system.cuda."))]
    values = [(g, n) for g, n in pairs if value_series_kind(g, n) is not None]
    insert_rows(engine.con, "show_findings_series", kept)
    number = "value_bool IS NULL AND value IS NOT NULL"
    report = f"group_name = '{REPORT[0]}' AND name = '{REPORT[1]}'"
    # the builder's time origin (its first record: the earliest numeric metric or report) and each rank's host (of
    # its first numeric metric or report, in the Python path's order), set before the rows are fed
    # (one pass: within a rank, the Python path's order is (pid, segment, line); a process writes one host, so a
    # rank's first host is its lowest pid's: a narrow hash aggregate, no struct ordering of every row; should that pid
    # have written several hosts, the rank's first row is looked up)
    rows = (f"(SELECT {ORDER}, host, wall_ns FROM metrics WHERE {w} AND {number} UNION ALL SELECT {ORDER}, host, "
            f"wall_ns FROM events WHERE {w} AND {report})")
    processes = engine.rows(f"SELECT rank, pid, host, min(wall_ns) FROM {rows} GROUP BY ALL")
    first = min((f for *_, f in processes if f is not None), default=None)
    if first is not None:
        builder.seen(int(first))
    lowest: dict[int, int] = {}
    for rank, pid, _, _ in processes:
        lowest[rank] = min(lowest.get(rank, pid), pid)
    hosts: dict[int, set[str]] = {}
    for rank, pid, host, _ in processes:
        if pid == lowest[rank]:
            hosts.setdefault(rank, set()).add(host)
    for rank in sorted(hosts):
        host = next(iter(hosts[rank])) if len(hosts[rank]) == 1 else engine.scalar(
            f"SELECT arg_min(host, (pid, segment, line)) FROM {rows} WHERE rank = {int(rank)}")
        builder.host(int(rank), str(host))
    feed_builder_sql(builder, engine, w, span_tables=("span_starts", "span_ends"), stats=True)
    feed_checkpoint_saves_sql(builder, engine, w)
    metric = builder.metric
    # a rank's processes by their start, as run_findings reads them (the first NaN's step)
    read = by_start_sql(f"(SELECT * FROM metrics WHERE {w} AND {number} AND (NOT isfinite(value) OR (group_name, name) "
                        "IN (SELECT group_name, name FROM show_findings_series)))")
    for _, batch in engine.stream(
            f"SELECT rank, host, group_name, name, step, value, value_int, wall_ns FROM {read} ORDER BY {ORDER}"):
        for rank, host, group, name, step, value, value_int, wall in batch:
            metric(rank, host, group, name, step, int(value_int) if value_int is not None else value, wall,
                   series=False)
    if values:  # the loss and gradient-norm series: the points that settle their spikes
        engine.execute("CREATE OR REPLACE TEMP TABLE show_value_series (group_name VARCHAR, name VARCHAR)")
        insert_rows(engine.con, "show_value_series", values)
        feed_value_series_sql(
            builder, engine, by_start_sql(
                f"(SELECT {VALUE_SERIES_NAME_SQL.format(name='name')} AS vkey, rank, step, value, pid, segment, line, "
                f"wall_ns FROM metrics WHERE {w} AND {number} "
                "AND (group_name, name) IN (SELECT group_name, name FROM show_value_series))", engine), "vkey")
    feed_memory_series_sql(builder, engine, gauges_relation("metrics", "name", w))  # (after the reports)
    feed_agent_events(builder, run)
    return builder


def diagnosis_events_sql(engine: Any, run: Run) -> list[Any]:
    """The events ``distributed.summary.diagnosis_lines`` reads, in ``Run.records()``'s order (agents' included,
    read in Python: a few records each): each rank's last report with communication times, stragglers and clock
    offsets."""
    engine.attach(run)
    w = _where(run)
    report = f"group_name = '{REPORT[0]}' AND name = '{REPORT[1]}'"
    wanted = (f"(group_name = '{STRAGGLER[0]}' AND name = '{STRAGGLER[1]}') OR (group_name = 'clock' AND "
              "name = 'clock_offset')")
    # (a text test first: the reports without the key, a job without communication times, are not parsed)
    comm = "contains(attributes, 'avg_comm_time_sec') AND json_exists(attributes, '$.avg_comm_time_sec')"
    # each rank's last report with communication times: its position by a streaming aggregate (no sort of the
    # reports), then that row
    last = engine.rows(f"SELECT max(({RECORDS_ORDER})) FROM events WHERE {w} AND {report} AND {comm} GROUP BY rank")
    keys = " OR ".join(f"(rank = {int(k[1])} AND pid = {int(k[2])} AND segment = {int(k[4])} AND line = {int(k[5])})"
                       for (k,) in last)
    query = (f"SELECT 'event' AS record_kind, * FROM events WHERE {w} AND (({wanted})"
             + (f" OR ({report} AND ({keys}))" if keys else "") + f") ORDER BY {RECORDS_ORDER}")
    events = list(_records(engine, query))
    agents = [r for log in run.agents for r in log.records if r.kind == "event"]
    # stable: the rank rows keep their order among ties, as Run.records() merges the processes
    return sorted(events + agents, key=lambda r: (r.wall_ns, r.identity.rank, r.identity.pid, r.mono_ns))
