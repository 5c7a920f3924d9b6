"""What ``telemetrain show`` says of a run, as data: counts, each series' last value and spread, the training
reports, the system samples' aggregates. ``show.summarize`` formats it.

``summarize_run(run)`` computes it from the records in memory (the pure-Python path), ``summarize_sql(engine, run)``
by SQL over the columnar copy and the JSONL tail, in memory that does not grow with the run; the tests compare both.
"Last" is in the order ``Run.records()`` gives: wall time, then rank, pid, monotonic time, file order. The launcher's
agents (a few records each) are read in Python on both paths.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any

from ..cli_common import is_number
from ..semconv import series_key
from ..span_lifecycle import END_STATUS_SQL, end_status
from ..store.codec import loads_column
from ..store.reader import Run
from ..store.views import first_int_sql
from ..training.names import CHECKPOINT_STEP_KEYS, checkpoint_step
from .counter_totals import COUNTER_NAMES, CounterTotals, lifetimes_sql, merge_lifetimes

__all__ = ["CheckpointSaves", "RunSummary", "SeriesSummary", "SystemSeries", "summarize_run", "summarize_sql"]

UPDATE = "training_metrics_update"
SAVE_SPANS = ("checkpoint_save_sync", "checkpoint_save_async")


@dataclasses.dataclass
class CheckpointSaves:
    """One checkpoint's save spans that ended (a span name and the iteration saved), across the ranks."""

    spans: int = 0
    total_ns: int = 0
    slowest_ns: int = -1
    slowest_rank: int = -1  # the lowest rank of a tie
    not_ok: int = 0

    def add(self, rank: int, duration_ns: int, ok: bool) -> None:
        self.spans += 1
        self.total_ns += duration_ns
        if duration_ns > self.slowest_ns or (duration_ns == self.slowest_ns and rank < self.slowest_rank):
            self.slowest_ns, self.slowest_rank = duration_ns, rank
        self.not_ok += not ok

    @property
    def mean_s(self) -> float:
        return self.total_ns / self.spans / 1e9 if self.spans else 0.0


@dataclasses.dataclass
class SeriesSummary:
    """One (group, name) of metrics or of stats, all ranks."""

    count: int = 0  # points (metrics) or windows (stats)
    samples: int = 0  # stats: the windows' samples
    last: Any = None  # the last record, all ranks
    last_by_rank: dict[int, Any] = dataclasses.field(default_factory=dict)  # rank -> its last record


@dataclasses.dataclass
class SystemSeries:
    """The finite samples of one system metric of one host or process."""

    count: int = 0
    total: float = 0.0
    max: float = -math.inf
    last: float = 0.0

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.max = value if value > self.max else self.max
        self.last = value


@dataclasses.dataclass
class RunSummary:
    records: int = 0
    start_ns: int | None = None
    end_ns: int | None = None
    by_kind: Counter[str] = dataclasses.field(default_factory=Counter)
    by_group_kind: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)
    metrics: dict[tuple[str, str], SeriesSummary] = dataclasses.field(default_factory=dict)
    stats: dict[tuple[str, str], SeriesSummary] = dataclasses.field(default_factory=dict)
    event_counts: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)
    severities: Counter[str] = dataclasses.field(default_factory=Counter)  # warning, error, critical events
    training_events: int = 0  # events of the group "training"
    updates: int = 0  # training_metrics_update events (group training)
    last_update: dict[str, Any] | None = None  # the attributes of the last one
    updates_by_rank: dict[int, tuple[int, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    saves: Counter[int] = dataclasses.field(default_factory=Counter)  # rank -> save_checkpoint_success events
    validations: Counter[int] = dataclasses.field(default_factory=Counter)  # rank -> validation_metrics_update
    errors: int = 0  # training/error events (telemetry misuse)
    # (who, group) -> name -> samples; who: "host H" for host-wide and GPU series, else "rank R pid P"
    system: dict[tuple[str, str], dict[str, SystemSeries]] = dataclasses.field(default_factory=dict)
    # (who, group, name) -> the counter's total over the sampler's lifetimes (``counter_totals``): I/O bytes, GPU J
    counter_totals: dict[tuple[str, str, str], float] = dataclasses.field(default_factory=dict)
    sampler_starts: list[Any] = dataclasses.field(default_factory=list)  # system.sampler.start events
    gpu_unavailable: list[str] = dataclasses.field(default_factory=list)  # their reasons, sorted, unique
    diagnostics: int = 0
    # (span name, iteration) -> that checkpoint's saves across the ranks (the iteration: None when none is named)
    saves_by_step: dict[tuple[str, int | None], CheckpointSaves] = dataclasses.field(default_factory=dict)
    # (group, name, status) -> [spans that ended not ok, their ranks]: a failed checkpoint save, a crashed loop
    failed_spans: dict[tuple[str, str, str], tuple[int, set[int]]] = dataclasses.field(default_factory=dict)
    # (name, sink) -> [diagnostics, records concerned, the last one's message]
    diagnostic_groups: dict[tuple[str, str], list[Any]] = dataclasses.field(default_factory=dict)
    # for a listing of runs: (rank, pid) -> how each training loop ended ("" while open), and the spans' time bounds
    loop_states: dict[tuple[int, int], list[str]] = dataclasses.field(default_factory=dict)
    span_start_ns: int | None = None
    span_end_ns: int | None = None

    def note_loop(self, key: tuple[int, int], status: str | None) -> None:
        """A training loop's start (``None``) or end (its status), in records() order."""
        states = self.loop_states.setdefault(key, [])
        if status is None:
            states.append("")
        elif "" in states:
            states[states.index("")] = status
        else:
            states.append(status)


def _who(group: str, name: str, identity: Any) -> str:
    host_wide = name.startswith(("system.", "container.")) or group.startswith("system.gpu.")
    return f"host {identity.host}" if host_wide else f"rank {identity.rank} pid {identity.pid}"


def summarize_run(run: Run) -> RunSummary:
    """The summary from the records in memory."""
    s = RunSummary()
    counters: CounterTotals[tuple[str, str, str]] = CounterTotals()
    open_saves: dict[tuple[int, int, str], int | None] = {}  # a save span's step from its start, until its end
    for r in run.iter_records():
        kind, group, name = r.kind, r.group, r.name
        s.records += 1
        wall = r.wall_ns
        s.start_ns = wall if s.start_ns is None or wall < s.start_ns else s.start_ns
        s.end_ns = wall if s.end_ns is None or wall > s.end_ns else s.end_ns
        s.by_kind[kind] += 1
        s.by_group_kind[(group, kind)] += 1
        if kind in ("metric", "stat"):
            if kind == "metric" and r.attributes:  # a metric's dimension labels (format v2) make their own series
                name = series_key(name, r.attributes)
            series = (s.metrics if kind == "metric" else s.stats).setdefault((group, name), SeriesSummary())
            series.count += 1
            series.last = r
            series.last_by_rank[r.identity.rank] = r
            if kind == "stat":
                series.samples += r.sample_count
            if kind == "metric" and (group == "system" or group.startswith("system.")) and \
                    is_number(r.value) and math.isfinite(r.value):
                who = _who(group, name, r.identity)
                s.system.setdefault((who, group), {}).setdefault(name, SystemSeries()).add(float(r.value))
                if name in COUNTER_NAMES:
                    process = (r.identity.rank, r.identity.pid, r.identity.restart_count)
                    counters.add((who, group, name), process, r.wall_ns, float(r.value))
        elif kind == "event":
            s.event_counts[(group, name)] += 1
            if r.severity in ("warning", "error", "critical"):
                s.severities[r.severity] += 1
            if group == "training":
                s.training_events += 1
                if name == UPDATE:
                    s.updates += 1
                    s.last_update = r.attributes or {}
                    n, _ = s.updates_by_rank.get(r.identity.rank, (0, {}))
                    s.updates_by_rank[r.identity.rank] = (n + 1, r.attributes or {})
                elif name == "error":
                    s.errors += 1
            if name == "save_checkpoint_success":
                s.saves[r.identity.rank] += 1
            elif name == "validation_metrics_update":
                s.validations[r.identity.rank] += 1
            elif name == "system.sampler.start":
                s.sampler_starts.append(r)
            elif name == "system.gpu.unavailable":
                s.gpu_unavailable.append(str((r.attributes or {}).get("reason")))
        elif kind == "diagnostic":
            s.diagnostics += 1
            entry = s.diagnostic_groups.setdefault((name, r.sink), [0, 0, ""])
            entry[0] += 1
            entry[1] += r.record_count
            entry[2] = r.message
        else:  # span_start, span_end
            s.span_start_ns = wall if s.span_start_ns is None or wall < s.span_start_ns else s.span_start_ns
            s.span_end_ns = wall if s.span_end_ns is None or wall > s.span_end_ns else s.span_end_ns
            if group == "training" and name == "training_loop":
                s.note_loop((r.identity.rank, r.identity.pid),
                            end_status(r.status, r.error) if kind == "span_end" else None)
            if name in SAVE_SPANS:
                key = (r.identity.rank, r.identity.pid, r.span_id)
                if kind == "span_start":
                    open_saves[key] = checkpoint_step(r.attributes or {})
                else:
                    started = open_saves.pop(key, None)
                    step = checkpoint_step(r.attributes or {})  # (the end's attributes first, as the report's)
                    saves = s.saves_by_step.setdefault((name, started if step is None else step), CheckpointSaves())
                    saves.add(r.identity.rank, r.duration_ns, r.status == "ok")
            if kind == "span_end" and r.status != "ok":
                n, ranks = s.failed_spans.get((group, name, r.status), (0, set()))
                ranks.add(r.identity.rank)
                s.failed_spans[(group, name, r.status)] = (n + 1, ranks)
    s.gpu_unavailable = sorted(set(s.gpu_unavailable))
    s.counter_totals = counters.totals()
    return s


def _series(r: Any) -> tuple[str, str]:
    """A metric's or stat's (group, series) as ``summarize_run`` keys it."""
    if r.kind == "metric" and r.attributes:
        return r.group, series_key(r.name, r.attributes)
    return r.group, r.name


# -- by SQL ------------------------------------------------------------------------------------------------------------

ORDER = "wall_ns, rank, pid, mono_ns, segment, line"  # Run.records()'s order


def _attrs(text: Any) -> dict[str, Any]:
    value = loads_column(text)
    return value if isinstance(value, dict) else {}


def _where(run: Run, alias: str = "") -> str:
    """This run's ranks (the engine may hold other runs)."""
    a = f"{alias}." if alias else ""
    session, run_id = (v.replace("'", "''") for v in (run.session_tag, run.run_id))
    return f"{a}session = '{session}' AND {a}run = '{run_id}' AND {a}role <> 'agent'"


def summarize_sql(engine: Any, run: Run) -> RunSummary:
    """The summary by SQL (``store.engine.Engine`` over the run)."""
    from ..store.row_records import identity_of_row, record_from_row

    engine.attach(run)
    w = _where(run)
    s = RunSummary()
    engine.series_keys("summary_series", w)
    # the run's rank metrics with their series key in ``name`` (``semconv.series_key``), as summarize_run keys them
    keyed = ("(SELECT m.* REPLACE (k.skey AS name), m.name AS record_name FROM metrics m JOIN summary_series k ON "
             "m.name = k.name AND "
             f"m.attributes IS NOT DISTINCT FROM k.attributes WHERE {_where(run, 'm')})")
    tables = {"metric": "metrics", "event": "events", "span_start": "span_starts", "span_end": "span_ends",
              "stat": "stats", "diagnostic": "diagnostics"}
    for kind, table in tables.items():  # one pass per table: counts and time bounds (per series and rank for metrics
        per_series = kind in ("metric", "stat")  # and stats, kept for their last records below)
        source = f"{keyed} WHERE true" if kind == "metric" else f"{table} WHERE {w}"
        samples = "sum(sample_count)" if kind == "stat" else "0"
        select = (f"SELECT group_name, NULL, NULL, count(*) AS n, min(wall_ns), max(wall_ns), {samples} FROM {source} "
                  "GROUP BY ALL")
        if per_series:
            # per series and process attempt (a file another host or attempt appended to under the same rank and
            # pid: its monotonic clock is another one): where it starts in the file, and its last record in
            # monotonic time (ties: file order), for the last records below
            engine.execute(
                f"""CREATE OR REPLACE TEMP TABLE summary_{table} AS SELECT group_name, name, rank, pid, host,
                      restart_count, any_value(session) AS session, any_value(run) AS run, count(*) AS n,
                      min(wall_ns) AS lo, max(wall_ns) AS hi, {samples} AS samples, min((segment, line)) AS first,
                      max((mono_ns, segment, line)) AS latest
                    FROM {source} GROUP BY group_name, name, rank, pid, host, restart_count""")
            select = (f"SELECT group_name, name, rank, sum(n), min(lo), max(hi), sum(samples) FROM summary_{table} "
                      "GROUP BY group_name, name, rank")
        for group, name, _, n, lo, hi, samples in engine.rows(f"{select} ORDER BY ALL"):
            s.records += n
            s.by_kind[kind] += n
            s.by_group_kind[(group, kind)] += n
            s.start_ns = lo if s.start_ns is None or lo < s.start_ns else s.start_ns
            s.end_ns = hi if s.end_ns is None or hi > s.end_ns else s.end_ns
            if per_series:
                series = (s.metrics if kind == "metric" else s.stats).setdefault((group, name), SeriesSummary())
                series.count += int(n)
                series.samples += int(samples or 0)

    def records(kind: str, query: str) -> list[tuple[Any, Any]]:
        cur = engine.execute(query)
        names = [d[0] for d in cur.description]
        out = []
        for row in cur.fetchall():
            r = dict(zip(names, row, strict=True))
            identity = identity_of_row(r, r["session"], r["run"])
            out.append((r, record_from_row(kind, identity, row, names)))
        return out

    key = f"({ORDER})"
    for kind, table, into in (("metric", "metrics", s.metrics), ("stat", "stats", s.stats)):
        # each process's last record of each series: the latest in monotonic time of its last attempt (as
        # ``Run.records()`` orders a process: wall time steps back with the clock, NTP's or an operator's), from the
        # per-process pass above; then the rows themselves, read from the files of their segments only
        rows = keyed if kind == "metric" else f"(SELECT * FROM {table} WHERE {w})"
        latest = f"summary_{table}"
        positions = engine.rows(f"SELECT any_value(session), any_value(run), rank, pid, arg_max(latest, first) "
                                f"FROM {latest} GROUP BY group_name, name, rank, pid")
        engine.execute(f"DROP TABLE {latest}")
        names, fetched = engine.fetch(table, [(session_, run_, rank, pid, k[1], k[2])  # k: (mono, segment, line)
                                              for session_, run_, rank, pid, k in positions])
        lasts = []
        for row in fetched:
            r = dict(zip(names, row, strict=True))
            lasts.append((tuple(r[c] for c in ORDER.split(", ")), record_from_row(
                kind, identity_of_row(r, r["session"], r["run"]), row, names)))
        have = {_series(rec) for _, rec in lasts}
        missing = [key for key in into if key not in have]
        for group, name in missing:  # a row its file did not give back (a header naming another rank): the slow way
            select = "* EXCLUDE (name, record_name), record_name AS name" if kind == "metric" else "*"
            cur = engine.execute(f"SELECT {select} FROM {rows} "
                                 "WHERE group_name = $g AND name = $n ORDER BY "
                                 + ", ".join(f"{c} DESC" for c in ORDER.split(", ")) + " LIMIT 1",
                                 {"g": group, "n": name})
            names = [d[0] for d in cur.description]
            for row in cur.fetchall():
                r = dict(zip(names, row, strict=True))
                lasts.append((tuple(r[c] for c in ORDER.split(", ")), record_from_row(
                    kind, identity_of_row(r, r["session"], r["run"]), row, names)))
        for _, rec in sorted(lasts, key=lambda kr: kr[0]):
            series = into[_series(rec)]
            series.last_by_rank[rec.identity.rank] = rec
            series.last = rec  # in records() order: the last one set is the last of all ranks
    host_wide = ("starts_with(name, 'system.') OR starts_with(name, 'container.') OR "
                 "starts_with(group_name, 'system.gpu.')")
    who = f"CASE WHEN {host_wide} THEN 'host ' || host ELSE 'rank ' || rank || ' pid ' || pid END"
    # a process's own series: its last in monotonic time; a host's, of several processes: records() order
    latest = f"(CASE WHEN {host_wide} THEN wall_ns ELSE mono_ns END, {ORDER})"
    finite = f"{w} AND (group_name = 'system' OR starts_with(group_name, 'system.')) AND value_bool IS NULL AND " \
             "isfinite(value)"
    finite = finite.replace(w, "true")
    for label, group, name, n, total, top, last in engine.rows(
            f"SELECT {who} AS who, group_name, name, count(*), sum(value), max(value), arg_max_null(value, {latest}) "
            f"FROM {keyed} WHERE {finite} GROUP BY ALL ORDER BY ALL"):
        s.system.setdefault((label, group), {})[name] = SystemSeries(count=int(n), total=float(total),
                                                                     max=float(top), last=float(last))
    lifetimes: dict[tuple[str, str, str], list[tuple[int, int, float]]] = {}
    for label, group, name, first, last, increase in engine.rows(lifetimes_sql(keyed, who, "name", "true")):
        lifetimes.setdefault((label, group, name), []).append((int(first), int(last), float(increase)))
    s.counter_totals = {k: merge_lifetimes(lives) for k, lives in lifetimes.items()}
    for group, name, severity, n in engine.rows(f"SELECT group_name, name, severity, count(*) FROM events WHERE {w} "
                                                "GROUP BY ALL ORDER BY ALL"):
        s.event_counts[(group, name)] += n
        if severity in ("warning", "error", "critical"):
            s.severities[severity] += n
        if group == "training":
            s.training_events += n
            if name == UPDATE:
                s.updates += n
            elif name == "error":
                s.errors += n
    for rank, name, n in engine.rows(f"SELECT rank, name, count(*) FROM events WHERE {w} AND name IN "
                                     "('save_checkpoint_success', 'validation_metrics_update') GROUP BY ALL"):
        (s.saves if name == "save_checkpoint_success" else s.validations)[rank] += n
    updates = f"{w} AND group_name = 'training' AND name = '{UPDATE}'"
    positions = engine.rows(f"SELECT any_value(session), any_value(run), rank, count(*), max({key}) AS k FROM events "
                            f"WHERE {updates} GROUP BY rank")
    counts_by_rank = {rank: int(n) for _, _, rank, n, _ in positions}
    names, fetched = engine.fetch("events", [(session_, run_, rank, k[2], k[4], k[5])  # k: the ORDER key
                                             for session_, run_, rank, _, k in positions])
    found = [dict(zip(names, row, strict=True)) for row in fetched]
    for r in sorted(found, key=lambda r: tuple(r[c] for c in ORDER.split(", "))):
        s.updates_by_rank[r["rank"]] = (counts_by_rank[r["rank"]], _attrs(r["attributes"]))
        s.last_update = s.updates_by_rank[r["rank"]][1]
    s.sampler_starts = [rec for _, rec in records(
        "event", f"SELECT * FROM events WHERE {w} AND name = 'system.sampler.start' ORDER BY {ORDER}")]
    s.gpu_unavailable = sorted({str(_attrs(a).get("reason")) for (a,) in engine.rows(
        f"SELECT attributes FROM events WHERE {w} AND name = 'system.gpu.unavailable'")})
    for name, sink, n, total, message in engine.rows(
            f"SELECT name, sink, count(*), sum(record_count), arg_max_null(message, {key}) FROM diagnostics "
            f"WHERE {w} GROUP BY ALL ORDER BY ALL"):
        s.diagnostics += n
        s.diagnostic_groups[(name, sink)] = [int(n), int(total), message]
    _saves_sql(s, engine, _where(run, "e"))
    for group, name, status, n, ranks in engine.rows(
            f"SELECT group_name, name, status, count(*), list(DISTINCT rank) FROM span_ends WHERE {w} AND "
            "status <> 'ok' GROUP BY ALL ORDER BY ALL"):
        s.failed_spans[(group, name, status)] = (int(n), set(ranks))
    for lo, hi in engine.rows(f"SELECT min(lo), max(hi) FROM (SELECT min(wall_ns) AS lo, max(wall_ns) AS hi FROM "
                              f"span_starts WHERE {w} UNION ALL SELECT min(wall_ns), max(wall_ns) FROM span_ends "
                              f"WHERE {w})"):
        s.span_start_ns, s.span_end_ns = lo, hi
    for rank, pid, status in engine.rows(
            f"SELECT rank, pid, status FROM (SELECT {ORDER}, NULL AS status FROM span_starts WHERE {w} AND "
            f"group_name = 'training' AND name = 'training_loop' UNION ALL SELECT {ORDER}, {END_STATUS_SQL} FROM "
            f"span_ends WHERE {w} AND group_name = 'training' AND name = 'training_loop') ORDER BY {ORDER}"):
        s.note_loop((rank, pid), status)
    return s


def _saves_sql(s: RunSummary, engine: Any, where: str) -> None:
    """Each checkpoint's save spans across the ranks (``where``: the run's span ends, alias ``e``): an end's step from
    its attributes, else its start's."""
    names = "(" + ", ".join(f"'{n}'" for n in SAVE_SPANS) + ")"
    end_step, start_step = (first_int_sql(f"{t}.attributes", CHECKPOINT_STEP_KEYS) for t in "es")
    same = ("s.session = e.session AND s.run = e.run AND s.rank = e.rank AND s.pid = e.pid AND "
            "s.span_id = e.span_id AND (s.segment, s.line) < (e.segment, e.line)")
    for name, step, n, total, slowest, rank, not_ok in engine.rows(
            f"""WITH ends AS (
                  SELECT e.name, e.rank, e.duration_ns, e.status, coalesce(any_value({end_step}),
                         arg_max_null({start_step}, (s.segment, s.line))) AS step
                  FROM span_ends e LEFT JOIN span_starts s ON {same} AND s.name = e.name
                  WHERE {where} AND e.name IN {names}
                  GROUP BY e.session, e.run, e.rank, e.pid, e.segment, e.line, e.name, e.duration_ns, e.status)
                SELECT name, step, count(*), sum(duration_ns), max(duration_ns), arg_max(rank, (duration_ns, -rank)),
                       count(*) FILTER (WHERE status <> 'ok')
                FROM ends GROUP BY name, step"""):
        s.saves_by_step[(name, None if step is None else int(step))] = CheckpointSaves(
            int(n), int(total), int(slowest), int(rank), int(not_ok))
