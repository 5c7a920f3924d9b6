"""``telemetrain tail``'s first frame by SQL (``store.engine``): the state ``TailState.poll`` builds by reading every
file from its start, computed by DuckDB over the columnar copy and the JSONL tail; then each file is followed from the
offset where the engine stopped reading it. Records are taken in the order polling meets them: by rank, process (by
its start, ``findings_sql.by_start_sql``, for the reports, the loss and the findings' metrics), segment, then line."""

from __future__ import annotations

from typing import Any

from ..store.codec import loads_column
from ..store.rank_groups import rank_groups
from .findings.checkpoints import CHECKPOINT_SAVES
from .findings_sql import by_start_sql
from .tail import _NOTABLE_SEVERITIES, _NOTABLE_TRAINING, RECENT_EVENTS, FileFollower, TailState, _brief, _number
from .tail_progress import target_of

__all__ = ["catch_up"]

ORDER = "rank, pid, segment, line"
METRICS_AT_ONCE = 65_536  # the findings' metric rows one query sorts (a group of ranks)


def _attrs(text: Any) -> dict[str, Any]:
    value = loads_column(text)
    return value if isinstance(value, dict) else {}


def catch_up(state: TailState, engine: Any) -> None:
    from .samples import open_run_meta

    meta = open_run_meta(state.path)
    state.run_id = str(meta.get("run_id") or state.path.name)
    state.perf_tag = str(meta.get("perf_tag") or state.perf_tag)
    w = "role <> 'agent'"
    loop = "group_name = 'training' AND name = 'training_loop'"
    update = "group_name = 'training' AND name = 'training_metrics_update'"
    saves = "name IN (" + ", ".join(f"'{n}'" for n in sorted(CHECKPOINT_SAVES)) + ")"
    counts = engine.rows(f"""SELECT
        (SELECT count(*) FROM events WHERE {w}), (SELECT count(*) FROM diagnostics WHERE {w}),
        (SELECT count(*) FROM span_ends WHERE {w} AND (name = 'training_loop' OR status <> 'ok' OR {saves}))
          + (SELECT count(*) FROM span_starts WHERE {w} AND {saves}),
        (SELECT count(*) FROM span_ends WHERE {w} AND status <> 'ok'),
        (SELECT count(*) FROM events WHERE {w} AND severity IN ('error', 'critical')),
        (SELECT count(*) FROM events WHERE {w} AND severity = 'warning'),
        (SELECT coalesce(sum(corrupt), 0) FROM damage WHERE NOT agent)""")[0]
    events, diagnostics, span_ends, not_ok, errors, warnings, corrupt = (int(v) for v in counts)
    # (the spans polling decodes: loops' ends, those not ok, checkpoint saves' starts and ends)
    state.records += events + diagnostics + span_ends
    state.spans_not_ok += not_ok
    state.errors += errors
    state.warnings += warnings
    state.diagnostics += diagnostics
    state.corrupt_before += corrupt
    key = f"({ORDER})"
    for rank, n, attributes, wall in engine.rows(
            f"SELECT rank, count(*), arg_max_null(attributes, {key}), arg_max_null(wall_ns, {key}) FROM "
            f"{by_start_sql(f'(SELECT * FROM events WHERE {w} AND {update})')} GROUP BY rank ORDER BY rank"):
        s = state._rank(rank)
        a = _attrs(attributes)
        iteration = a.get("current_iteration")
        s.iteration = iteration if isinstance(iteration, int) and not isinstance(iteration, bool) else None
        s.wall_ns = wall
        s.samples_per_second = _number(a.get("samples_per_second"))
        s.p50 = _number(a.get("p50_iteration_time_sec"))
        s.p99 = _number(a.get("p99_iteration_time_sec"))
        s.mean = _number(a.get("avg_iteration_time_sec"))
        s.final = bool(a.get("final"))
        s.reports = int(n)
    # how each rank's last training loop stands: its last loop end, unless a report came after it (open again)
    ends = by_start_sql(f"""(SELECT rank, pid, segment, line, wall_ns, status FROM span_ends WHERE {w} AND {loop}
                  UNION ALL SELECT rank, pid, segment, line, wall_ns, NULL FROM events WHERE {w} AND {update})""")
    for rank, status in engine.rows(
            f"SELECT rank, arg_max_null(status, ({ORDER})) FROM {ends} GROUP BY rank ORDER BY rank"):
        state._rank(rank).loop_status = status
    names = "(" + ", ".join(f"'{n}'" for n in _NOTABLE_TRAINING) + ")"
    severities = "(" + ", ".join(f"'{s}'" for s in _NOTABLE_SEVERITIES) + ")"
    # the latest notable events by wall time: every row at or after the RECENT_EVENTS-th latest time (ties
    # included), which RecentEvents narrows as polling does
    recent = engine.rows(
        f"""WITH notable AS (
              SELECT 0 AS src, rank, wall_ns, severity, group_name || '/' || name AS what, attributes,
                     NULL AS message FROM events
              WHERE {w} AND NOT ({update})
                AND (severity IN {severities} OR (group_name = 'training' AND name IN {names}))
              UNION ALL
              SELECT 1, rank, wall_ns, 'diagnostic', name || ' ' || sink, NULL, message FROM diagnostics WHERE {w}
              UNION ALL
              SELECT 1, rank, wall_ns, CASE WHEN status = 'error' THEN 'error' ELSE 'warning' END,
                     'span ' || group_name || '/' || name, NULL,
                     CASE WHEN coalesce(error, '') = '' THEN status ELSE status || ': ' || error END
                FROM span_ends WHERE {w} AND status <> 'ok')
            SELECT src, rank, wall_ns, severity, what, attributes, message FROM notable
            WHERE wall_ns >= (SELECT min(wall_ns) FROM (SELECT wall_ns FROM notable ORDER BY wall_ns DESC
                                                         LIMIT {RECENT_EVENTS}))""")
    for src, rank, wall, severity, what, attributes, message in recent:
        state.recent.add((wall, rank, severity, what, message if src == 1 else _brief(_attrs(attributes))))
    state.records += _feed_findings(state, engine, w)
    for path, (offset, identity) in engine.read_to.items():
        if path.parent.resolve() != state.path.resolve() or path.name.startswith("agent-"):
            continue
        follower = state.followers[path] = FileFollower(path, meta)
        follower.offset = offset
        follower.identity = identity
    state.records += state.poll_agents(meta)  # (the agents' few records: read whole, as polling does)


def _feed_findings(state: TailState, engine: Any, w: str) -> int:
    """The findings engine's input (``state.inputs``) from the records polling would have decoded and fed it: the
    reports and straggler events, the training loops' ends, the checkpoint saves, and the metric lines holding one of
    the words polling looks for (memory gauges, losses, gradient norms), in the order polling meets them. One query
    sorted by DuckDB (it spills to disk past its memory limit) and read in batches: Python holds a batch, and the
    input keeps the last ``FINDINGS_HISTORY`` windows and points per series (``InputBuilder(limit=...)``). Returns
    how many metric records were fed (polling counts them among its records)."""
    from .tail import _METRIC_WORDS

    loss_word = (state.loss.rsplit("/", 1)[-1].encode(),) if state.loss else ()  # as polling's metric filter
    words = " OR ".join(f"contains(group_name || name || coalesce(unit, '') || coalesce(attributes, ''), "
                        f"'{word.decode().replace(chr(39), chr(39) * 2)}')" for word in _METRIC_WORDS + loss_word)
    from .show_sql import feed_builder_sql, feed_checkpoint_saves_sql

    feed_builder_sql(state.inputs, engine, w, span_tables=("span_ends",), span_names=frozenset({"training_loop"}),
                     stats=False)
    feed_checkpoint_saves_sql(state.inputs, engine, w)
    _feed_pace(state, engine, w)
    metrics = 0
    metric, curve = state.inputs.metric, state.curves.add
    where = f"{w} AND ({words})"
    counts = engine.rows(f"SELECT rank, count(*) FROM metrics WHERE {where} GROUP BY rank ORDER BY rank")
    # a group of ranks a query: DuckDB sorts that group's rows, not the run's (the loss of 2,048 ranks sorted at once
    # added ~110 MiB to the peak); groups of consecutive ranks, each sorted by ORDER: the same order as the whole
    for ranks in rank_groups(counts, METRICS_AT_ONCE):
        for _, batch in engine.stream(
                f"SELECT rank, host, group_name, name, step, value, value_int, value_bool, wall_ns, unit FROM "
                f"{by_start_sql(f'(SELECT * FROM metrics WHERE {where} AND rank IN {ranks})')} ORDER BY {ORDER}"):
            for rank, host, group, name, step, value, value_int, value_bool, wall, unit in batch:
                metrics += 1
                value = bool(value_bool) if value_bool is not None else \
                    int(value_int) if value_int is not None else value
                metric(rank, host, group, name, step, value, wall)
                curve(rank, group, name, step, value, wall, unit or "")
    # the target from the training config's events (polling reads it from any training event that has it)
    for (attributes,) in engine.rows(
            f"SELECT attributes FROM events WHERE {w} AND group_name = 'training' AND name <> "
            f"'training_metrics_update' AND contains(attributes, 'train_iterations_target') ORDER BY {ORDER}"):
        state.target = target_of(_attrs(attributes)) or state.target
    return metrics


def _feed_pace(state: TailState, engine: Any, w: str) -> None:
    """The reports' part of the ETA (``TailState._report``'s: the pace of the leading rank, the target): each rank's
    last ``PACE_REPORTS`` reports, in polling order (the pace keeps no more; a restart among them starts it over as
    polling's would)."""
    from .tail_progress import PACE_REPORTS

    for rank, wall, attributes in engine.rows(
            f"""SELECT rank, wall_ns, attributes FROM (
                  SELECT rank, pid, segment, line, wall_ns, attributes, row_number() OVER (
                    PARTITION BY rank ORDER BY pid DESC, segment DESC, line DESC) AS nth
                  FROM {by_start_sql(f"(SELECT * FROM events WHERE {w} AND group_name = 'training' AND name = "
                                     "'training_metrics_update')")})
                WHERE nth <= {PACE_REPORTS} ORDER BY {ORDER}"""):
        a = _attrs(attributes)
        iteration = a.get("current_iteration")
        if isinstance(iteration, int) and not isinstance(iteration, bool):
            n, seconds = a.get("window_iterations"), _number(a.get("window_seconds"))
            state.pace.report(rank, wall, iteration, n if isinstance(n, int) else None, seconds)
        state.target = target_of(a) or state.target
