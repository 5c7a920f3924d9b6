"""Goodput's reading of a session by SQL (``store.engine``): every run and process of the session contributes the
few figures goodput takes from it (its first and last training-lifecycle timestamps, its successful checkpoints),
computed by DuckDB; the whole training lifecycle (spans, windows) is loaded only for the rank whose timeline is
reported, one rank at a time. So a restarted session costs its number of attempts in small queries, not their
records in Python, and memory follows one rank's lifecycle, not the session's size.

The rules are ``goodput_read.read_records``'s (the tests compare both paths on the same sessions): a timestamp is a
lifecycle span's start, the end of a lifecycle span whose start came before it in the file (later than its start),
and the wall-clock stamps of the windows and checkpoint events; a save's figures are read as ``_int``/``_num`` read
them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import groupby
from typing import Any

from ..span_lifecycle import END_STATUS_SQL
from ..store.codec import loads_column
from ..store.engine import Engine
from ..store.rank_groups import rank_groups
from ..store.reader import Run
from ..store.views import insert_rows
from .goodput_read import (
    _LIFECYCLE,
    _TRACKED,
    GROUP,
    _Process,
    _RunData,
    _Save,
    _Session,
    read_records,
)
from .names import EventName, SpanName

__all__ = ["load_session"]

_SAVE = EventName.SAVE_CHECKPOINT_SUCCESS.value
_UPDATE = EventName.TRAINING_METRICS_UPDATE.value
_LOOP = SpanName.TRAINING_LOOP.value  # the one span whose attributes goodput reads (train_iterations_start)
_PROGRESS = "training_progress"  # the stall watchdog's heartbeat (distributed.watchdog)
# lifecycle spans whose first start and end one query groups (~100 bytes each in DuckDB's hash table): a rank of the
# scale runs (20,000 spans) at a time; two at a time held ~7 MiB more at compare's peak on 64 x 1M, for ~1 s less
SPANS_AT_ONCE = 24_576
# a rank's lifecycle rows fetched at a time: a report's row is ~1 KiB of Python objects (its attributes' JSON texts),
# and two batches live at once (the last one read while the next is fetched): 10,000 held +10 MiB at 1M iterations
ROWS_AT_ONCE = 2_000
# a process's latest span ends whose spans are grouped to find its last timestamp (``_process_bounds``): a run that
# ended its application span has it among them
LATEST_ENDS = 8
# a segment's lifecycle rows sorted and typed in one query: DuckDB's working memory for them (their reports' JSON
# parsed, the rows sorted by line) grew with the segment, +21 MiB for a segment of 11,700 rows (64 x 1M), +14 for a
# quarter of it
SEGMENT_ROWS_AT_ONCE = 4_096
# lifecycle rows of the ranks ``goodput_by_rank`` loads together when they are short: one query a batch, its rows
# sorted (as a segment's, SEGMENT_ROWS_AT_ONCE, in bounded memory); ~500 ranks of 200 iterations
BATCH_ROWS = 8_192


def _names(names: Any) -> str:
    return "(" + ", ".join("'" + str(n).replace("'", "''") + "'" for n in sorted(names)) + ")"


def _int_sql(x: str) -> str:
    """``goodput_read._int`` of the JSON column ``x``: an integer, or a float with an integral value; NULL otherwise."""
    return (f"(CASE WHEN json_type({x}) IN ('BIGINT', 'UBIGINT') THEN TRY_CAST({x} AS BIGINT) "
            f"WHEN json_type({x}) = 'DOUBLE' AND isfinite({x}::DOUBLE) AND {x}::DOUBLE = floor({x}::DOUBLE) "
            f"THEN TRY_CAST({x}::DOUBLE AS BIGINT) END)")


def _num_sql(x: str) -> str:
    """``goodput_read._num`` of the JSON column ``x``: a finite number (not a bool); NULL otherwise (a non-finite float
    is tagged ``{"$float": ...}``, an object: NULL too)."""
    number = f"json_type({x}) IN ('BIGINT', 'UBIGINT', 'DOUBLE')"
    return f"(CASE WHEN {number} AND isfinite({x}::DOUBLE) THEN {x}::DOUBLE END)"


def _stamp_sql(x: str) -> str:
    """``goodput_read._stamp`` of the DOUBLE column ``x`` (a ``_num``): wall seconds -> ns."""
    return f"(CASE WHEN {x} > 0 AND isfinite({x} * 1e9) THEN round({x} * 1e9)::BIGINT END)"


def _position_sql() -> str:
    """A row's place in its process's log, (segment, line), as one BIGINT in the same order: both are INTEGERs, so
    ``segment * 2**32 + (line + 2**31)`` is exact and increases with (segment, line)."""
    return "(segment::BIGINT * 4294967296 + (line::BIGINT + 2147483648))"


def _attribute(key: str) -> str:
    return f"json_extract(attributes, '$.{key}')"


# The attributes read_records looks at: only these are fetched (a report's attributes are ~40 keys, and a rank of a
# long run has tens of thousands of them).
KEYS = ("current_iteration", "window_iterations", "total_iteration_time_sec", "avg_iteration_time_sec",
        "avg_dataloader_time_sec", "window_seconds", "final", "last_logged_train_iterations_finish_timestamp_sec",
        "productive_train_iterations", "productive_train_iterations_sec",
        "latest_successful_save_checkpoint_timestamp_sec", "train_iterations_start", "window_energy_J",
        "cumulative_iteration_time_sec")
_KEY_PATHS = "[" + ", ".join(f"'$.{k}'" for k in KEYS) + "]"


class _Row:
    """A row as ``read_records`` reads a record."""

    __slots__ = ("attributes", "group", "kind", "name", "parent_id", "span_id", "status", "wall_ns")

    def __init__(self, kind: str, name: str, wall_ns: int, span_id: str, parent_id: str, status: str,
                 values: Any) -> None:
        self.kind, self.group, self.name, self.wall_ns = kind, GROUP, name, wall_ns
        self.span_id, self.parent_id, self.status = span_id, parent_id, status
        self.attributes = None if values is None else {
            k: loads_column(v) for k, v in zip(KEYS, values, strict=True) if v is not None}


def _line_ranges(lo: int, hi: int, n: int, most: int | None = None) -> list[tuple[int, int]]:
    """[first, end) ranges of the lines ``lo..hi`` of a segment's ``n`` rows, each ~``most`` rows or fewer if the
    rows are spread evenly (by default ``SEGMENT_ROWS_AT_ONCE``); one range for a segment within it."""
    parts = max(1, -(-n // (most or SEGMENT_ROWS_AT_ONCE)))
    width = (hi - lo) // parts + 1
    return [(lo + k * width, min(lo + (k + 1) * width, hi + 1)) for k in range(parts) if lo + k * width <= hi]


def _run_filter(runs: Sequence[Run], alias: str = "") -> str:
    a = f"{alias}." if alias else ""
    pairs = ", ".join("('" + r.session_tag.replace("'", "''") + "', '" + r.run_id.replace("'", "''") + "')"
                      for r in runs)
    return f"({a}session, {a}run) IN ({pairs}) AND {a}role <> 'agent' AND {a}group_name = '{GROUP}'"


_Key = tuple[str, str, int, int]  # a process's rows: (session, run, rank, pid)


def _exact_stamps_sql(where: str) -> str:
    """Each process's first and last timestamps, exactly as ``read_records`` stamps them: a lifecycle span's end is a
    timestamp when its start came before it in the file (the first end only), found per span by a grouped aggregate
    of the first start's and the first end's positions (a join of every start with every end would have to hold one
    side). The position is one BIGINT (``_position_sql``), not a (segment, line) struct: an aggregate whose state is
    a struct cannot spill, and at 64 ranks x 1M iterations (1.3 M spans) it needed more than the readers' memory
    limit."""
    lifecycle, tracked, pos = _names(_LIFECYCLE), _names(_TRACKED), _position_sql()
    spans = f"""
      SELECT session, run, rank, pid, span_id,
             min({pos}) FILTER (WHERE k = 0) AS s_pos,
             arg_min(wall_ns, {pos}) FILTER (WHERE k = 0) AS s_wall,
             min({pos}) FILTER (WHERE k = 1) AS e_pos,
             arg_min(wall_ns, {pos}) FILTER (WHERE k = 1) AS e_wall,
             bool_or(k = 0 AND name IN {lifecycle}) AS lifecycle
      FROM (SELECT session, run, rank, pid, span_id, segment, line, wall_ns, name, 0 AS k FROM span_starts
            WHERE {where} AND name IN {tracked}
            UNION ALL
            SELECT session, run, rank, pid, span_id, segment, line, wall_ns, name, 1 FROM span_ends WHERE {where})
      GROUP BY session, run, rank, pid, span_id"""
    return f"""
    WITH st AS (
      SELECT session, run, rank, pid, wall_ns AS t FROM span_starts WHERE {where} AND name IN {lifecycle}
      UNION ALL
      SELECT session, run, rank, pid, greatest(e_wall, s_wall) FROM ({spans})
      WHERE lifecycle AND s_pos IS NOT NULL AND e_pos IS NOT NULL AND e_pos > s_pos
      UNION ALL
      SELECT session, run, rank, pid, t FROM ({_event_stamps_sql(where)})
      UNION ALL
      SELECT session, run, rank, pid, t FROM ({_report_stamps_sql(where)}))
    SELECT session, run, rank, pid, min(t), max(t) FROM st WHERE t IS NOT NULL GROUP BY ALL"""


def _event_stamps_sql(where: str) -> str:
    """The wall-clock stamps (ns) the checkpoint successes and the watchdog's heartbeats carry: column ``t``."""
    return f"""
      SELECT session, run, rank, pid, {_stamp_sql('x')} AS t FROM (
        SELECT session, run, rank, pid, {_num_sql('j')} AS x FROM (
          SELECT session, run, rank, pid,
                 CASE WHEN name = '{_PROGRESS}'
                   THEN {_attribute('last_logged_train_iterations_finish_timestamp_sec')}
                 ELSE {_attribute('latest_successful_save_checkpoint_timestamp_sec')} END AS j
          FROM events WHERE {where} AND name IN ('{_SAVE}', '{_PROGRESS}')))"""


def _report_stamps_sql(where: str) -> str:
    """The reports' stamps (ns), typed already (store.report_rows: _num_sql's number, or non-finite): column ``t``."""
    return f"""
      SELECT session, run, rank, pid, {_stamp_sql('x')} AS t FROM (
        SELECT session, run, rank, pid, CASE WHEN isfinite(last_logged_train_iterations_finish_timestamp_sec)
          THEN last_logged_train_iterations_finish_timestamp_sec END AS x
        FROM reports WHERE {where})"""


def _process_bounds(engine: Engine, where: str) -> dict[_Key, tuple[int, int]]:
    """Each process's first and last timestamps (``_exact_stamps_sql``'s), without grouping the spans where they
    cannot matter. A span's timestamp is the later of its first start's and first end's walls, so it is never below
    the earliest tracked start: it cannot lower a process's first timestamp unless a tracked start precedes the
    other timestamps. And a span none of whose ends is among the process's ``LATEST_ENDS`` latest ends is stamped
    no later than the last of those, or its start: so only the spans of those ends are grouped (a few rows), and the
    last timestamp is exact when it reaches that bound. Per process: four small aggregates (one table each, one
    thread, no per-span state) instead of grouping every span, 20,000 a rank on a long run (+20 MiB and ~0.1 s a
    rank). A process where the bounds do not settle it (a run cut off in its data loading, a span without an id or a
    record without a wall time) is read by the exact query, a group of its ranks at a time."""
    lifecycle, tracked, n = _names(_LIFECYCLE), _names(_TRACKED), LATEST_ENDS
    with engine.one_thread():  # (each query a scan and one row per process)
        starts = {
            (s, r, rank, pid): (lmin, lmax, tmin, tmax, bad) for s, r, rank, pid, lmin, lmax, tmin, tmax, bad in
            engine.rows(f"""
                SELECT session, run, rank, pid, min(wall_ns) FILTER (WHERE name IN {lifecycle}),
                       max(wall_ns) FILTER (WHERE name IN {lifecycle}), min(wall_ns), max(wall_ns),
                       count(*) > count(wall_ns) OR count(*) > count(span_id)
                FROM span_starts WHERE {where} AND name IN {tracked} GROUP BY ALL""")}
        ends = {(s, r, rank, pid): (ids, walls, bad) for s, r, rank, pid, ids, walls, bad in engine.rows(f"""
                SELECT session, run, rank, pid, arg_max(span_id, wall_ns, {n}), max(wall_ns, {n}),
                       count(*) > count(wall_ns) OR count(*) > count(span_id)
                FROM span_ends WHERE {where} GROUP BY ALL""")}
        others: dict[_Key, list[int]] = {}
        for part in (_event_stamps_sql(where), _report_stamps_sql(where)):
            for s, r, rank, pid, lo, hi in engine.rows(f"SELECT session, run, rank, pid, min(t), max(t) FROM ({part}) "
                                                       "WHERE t IS NOT NULL GROUP BY ALL"):
                others.setdefault((s, r, rank, pid), []).extend((lo, hi))
        latest = _latest_spans(engine, where, [(key, i) for key, (ids, _, _) in ends.items() if key in starts
                                               for i in ids])
    bounds: dict[_Key, tuple[int, int]] = {}
    exact: set[int] = set()  # the ranks the exact query reads
    for key in {*starts, *others}:
        start = starts.get(key, (None, None, None, None, False))
        found = [t for t in (*start[:2], *others.get(key, ()), *latest.get(key, ())) if t is not None]
        if start[0] is not None and not _settled(found, start, ends.get(key, ([], [], False)), n):
            exact.add(key[2])
        elif found:
            bounds[key] = (min(found), max(found))
    if exact:
        ranks = "(" + ", ".join(map(str, sorted(exact))) + ")"
        with engine.one_thread():  # (a group's spans: a few ten thousand)
            for group in rank_groups(_span_counts(engine, f"{where} AND rank IN {ranks}"), SPANS_AT_ONCE):
                for s, r, rank, pid, lo, hi in engine.rows(_exact_stamps_sql(f"{where} AND rank IN {group}")):
                    bounds[(s, r, rank, pid)] = (lo, hi)
    return bounds


def _settled(found: list[int], start: tuple[Any, ...], end: tuple[Any, ...], n: int) -> bool:
    """Whether the timestamps ``found`` (the lifecycle starts', the events' and reports', the latest ends' spans') are
    the first and last of a process with lifecycle spans: ``start`` its tracked starts' (lifecycle min, max, any min,
    max, a row without a wall or id), ``end`` its ends' (the ``n`` latest ends' span ids and walls, a row without)."""
    _, _, tmin, tmax, bad_start = start
    _, walls, bad_end = end
    if bad_start or bad_end or tmin < min(found):  # (a span's stamp is at least its start's: the earliest start's)
        return False
    # every other span's ends are no later than the n-th latest end, and its start no later than the last start
    return len(walls) < n or max(found) >= max(min(walls), tmax)


def _latest_spans(engine: Engine, where: str, spans: list[tuple[_Key, str]]) -> dict[_Key, list[int]]:
    """The timestamps of the spans ``spans`` ((process, span id)) as ``_exact_stamps_sql`` stamps them: their
    first start's and first end's positions and walls, from their rows alone."""
    if not spans:
        return {}
    engine.execute("CREATE OR REPLACE TEMP TABLE goodput_latest (session VARCHAR, run VARCHAR, rank BIGINT, "
                   "pid BIGINT, span_id VARCHAR)")
    insert_rows(engine.con, "goodput_latest", [(*key, i) for key, i in spans])
    pos, lifecycle, tracked = _position_sql(), _names(_LIFECYCLE), _names(_TRACKED)
    firsts: dict[tuple[_Key, str], list[Any]] = {}  # -> [start pos, start wall, end pos, end wall, lifecycle]
    for s, r, rank, pid, span_id, k, at, wall, life in engine.rows(f"""
            SELECT session, run, rank, pid, span_id, 0, {pos}, wall_ns, name IN {lifecycle} FROM span_starts
            SEMI JOIN goodput_latest USING (session, run, rank, pid, span_id) WHERE {where} AND name IN {tracked}
            UNION ALL
            SELECT session, run, rank, pid, span_id, 1, {pos}, wall_ns, false FROM span_ends
            SEMI JOIN goodput_latest USING (session, run, rank, pid, span_id) WHERE {where}"""):
        first = firsts.setdefault(((s, r, rank, pid), span_id), [None, None, None, None, False])
        if first[2 * k] is None or at < first[2 * k]:
            first[2 * k], first[2 * k + 1] = at, wall
        first[4] = first[4] or life
    engine.execute("DROP TABLE goodput_latest")
    out: dict[_Key, list[int]] = {}
    for (key, _), (s_pos, s_wall, e_pos, e_wall, life) in firsts.items():
        if life and s_pos is not None and e_pos is not None and e_pos > s_pos:
            out.setdefault(key, []).append(max(s_wall, e_wall))  # (no wall is NULL: _process_bounds checked)
    return out


def _span_counts(engine: Engine, where: str) -> list[tuple[Any, ...]]:
    """(rank, lifecycle rows) by rank, of every rank with a row the exact stamps read: its lifecycle spans, or only
    its reports and checkpoints."""
    return engine.rows(f"""
        SELECT rank, sum(n) FROM (
          SELECT rank, count(*) AS n FROM span_starts WHERE {where} AND name IN {_names(_TRACKED)} GROUP BY rank
          UNION ALL
          SELECT DISTINCT rank, 0 FROM events WHERE {where} AND name IN ('{_UPDATE}', '{_SAVE}', '{_PROGRESS}'))
        GROUP BY rank ORDER BY rank""")


def load_session(engine: Engine, runs: Sequence[Run]) -> tuple[list[Any], Any, Any, bool]:
    """The ``_RunData`` of each run (in ``runs`` order) with every process's light figures, the loader of ranks'
    whole lifecycles (``_Session.load_rank``), their batches (``_Session.rank_batches``), and whether the reports
    carry energy."""
    engine.add_runs([r.path for r in runs])
    for run in runs:
        engine.attach(run)
    index = {(r.session_tag, r.run_id): i for i, r in enumerate(runs)}
    where = _run_filter(runs)
    tracked = _names(_TRACKED)
    bounds = {(index[(s, r)], rank, pid): span for (s, r, rank, pid), span in _process_bounds(engine, where).items()
              if (s, r) in index}
    saves: dict[tuple[int, int, int], list[_Save]] = {}
    for s, r, rank, pid, completed, step, sec in engine.rows(f"""
            SELECT session, run, rank, pid, {_int_sql('a')}, {_int_sql('b')}, {_num_sql('c')} FROM (
              SELECT session, run, rank, pid, segment, line, {_attribute('productive_train_iterations')} AS a,
                     {_attribute('current_iteration')} AS b, {_attribute('productive_train_iterations_sec')} AS c
              FROM events WHERE {where} AND name = '{_SAVE}')
            ORDER BY session, run, rank, pid, segment, line"""):
        if (s, r) in index:
            saves.setdefault((index[(s, r)], rank, pid), []).append(_Save(completed, step, sec))
    datas = []
    # the rows carry the identity of their file's header; a process is named by its file (they differ when a file
    # was renamed): each process's rows are found by its header's rank and pid
    row_pid: dict[tuple[str, str, int, int], int] = {}
    for i, run in enumerate(runs):
        processes = []
        for log in run.processes:
            ident = log.identity
            row_pid[(run.session_tag, run.run_id, log.rank, log.pid)] = ident.pid
            lo, hi = bounds.get((i, ident.rank, ident.pid), (None, None))
            processes.append(_Process(run=i, rank=log.rank, pid=log.pid, spans=[], loops=[],
                                        saves=saves.get((i, ident.rank, ident.pid), []), first_ns=lo, last_ns=hi,
                                        data_outside=False))
        firsts = [p.first_ns for p in processes if p.first_ns is not None]
        lasts = [p.last_ns for p in processes if p.last_ns is not None]
        datas.append(_RunData(run, processes, min(firsts) if firsts else None, max(lasts) if lasts else None))

    def lifecycle_rows(attributes: str) -> str:
        return f"""
              SELECT session, run, rank, pid, segment, line, 'span_start' AS kind, name, wall_ns, span_id,
                     parent_id, NULL AS status, CASE WHEN name = '{_LOOP}' THEN {attributes} END AS attributes
              FROM span_starts WHERE {where} AND name IN {tracked}
              UNION ALL
              SELECT session, run, rank, pid, segment, line, 'span_end', name, wall_ns, span_id, NULL,
                     {END_STATUS_SQL}, NULL FROM span_ends WHERE {where} AND name IN {tracked}
              UNION ALL
              SELECT session, run, rank, pid, segment, line, 'event', name, wall_ns, NULL, NULL, NULL,
                     {attributes} FROM events WHERE {where}
                AND name IN ('{_UPDATE}', '{_SAVE}', '{_PROGRESS}')"""


    loaded: set[int] = set()  # the ranks whose lifecycle is in ``session.runs`` now

    def load_rank(session: _Session, ranks: int | Sequence[int]) -> None:
        """Replace the light processes of ``ranks`` (one rank, or a batch of ``rank_batches``) by their whole
        lifecycle (and the other ranks' by light ones); nothing to do for ranks loaded already."""
        want = {ranks} if isinstance(ranks, int) else set(ranks)
        if want <= loaded:
            return
        loaded.clear()
        # the other ranks' lifecycles are let go first; these ranks' rows are streamed into ``read_records`` (in the
        # query's order, a process's rows follow on), not held as a whole: memory is the lifecycle read, once
        wanted: dict[tuple[int, str, str, int], list[tuple[_RunData, int, _Process]]] = {}
        for d in session.runs:
            for n, p in enumerate(d.processes):
                if p.rank in want:
                    tag, run_id = d.run.session_tag, d.run.run_id
                    wanted.setdefault((p.rank, tag, run_id, row_pid.get((tag, run_id, p.rank, p.pid), p.pid)),
                                      []).append((d, n, p))
                elif p.spans or p.loops:
                    d.processes[n] = _Process(run=p.run, rank=p.rank, pid=p.pid, spans=[], loops=[],
                                                saves=p.saves, first_ns=p.first_ns, last_ns=p.last_ns,
                                                data_outside=False)
        among = f"rank IN ({', '.join(str(int(r)) for r in sorted(want))})"
        segments = engine.rows(
            f"SELECT rank, session, run, pid, segment, count(*), min(line), max(line) FROM "
            f"({lifecycle_rows('NULL')}) WHERE {among} GROUP BY ALL ORDER BY rank, session, run, pid, segment")
        attributes = lifecycle_rows(f"json_extract(attributes, {_KEY_PATHS})")
        rows: Iterable[tuple[Any, ...]]
        if len(want) > 1 and sum(int(row[5]) for row in segments) <= BATCH_ROWS:
            # a batch of short ranks: one query sorts their rows; two queries per rank cost ~1 s a rank at 2,048
            # ranks, whatever its size (each plans over every file of the run)
            stream = engine.stream(f"""
                SELECT rank, session, run, pid, kind, name, wall_ns, span_id, parent_id, status, attributes
                FROM ({attributes}) WHERE {among} ORDER BY rank, session, run, pid, segment, line""", None,
                                   ROWS_AT_ONCE)
            rows = ((rank_, s, r, pid, _Row(kind, name, wall, span_id or "", parent_id or "", status or "", attrs))
                    for _, batch in stream
                    for rank_, s, r, pid, kind, name, wall, span_id, parent_id, status, attrs in batch)
        else:
            # one segment of one process at a time (in the order of the whole: rank, session, run, pid, segment,
            # line), so that DuckDB sorts one segment's rows, not the rank's: a rank of 1M iterations held ~50 MiB
            # while sorted whole; and a segment of more than SEGMENT_ROWS_AT_ONCE rows in even ranges of its lines
            parts = [(rank, session_, run_id, pid, segment, first, end)
                     for rank, session_, run_id, pid, segment, n, lo, hi in segments
                     for first, end in _line_ranges(int(lo), int(hi), int(n))]
            query = f"""
                    SELECT rank, session, run, pid, kind, name, wall_ns, span_id, parent_id, status, attributes FROM (
                      {attributes})
                    WHERE rank = $rank AND session = $session AND run = $run AND pid = $pid AND segment = $segment
                      AND line >= $first AND line < $end
                    ORDER BY line"""
            rows = ((rank_, s, r, pid, _Row(kind, name, wall, span_id or "", parent_id or "", status or "", attrs))
                    for rank, session_, run_id, pid_, segment, first, end in parts
                    for _, batch in engine.stream(query, {"rank": rank, "session": session_, "run": run_id,
                                                          "pid": pid_, "segment": segment, "first": first,
                                                          "end": end}, ROWS_AT_ONCE)
                    for rank_, s, r, pid, kind, name, wall, span_id, parent_id, status, attrs in batch)
        for key, group in groupby(rows, key=lambda row: row[:4]):
            records: Iterable[_Row] = (row[4] for row in group)
            processes = wanted.pop(key, [])
            if len(processes) > 1:  # two files of one process (a renamed file): each reads its rows
                records = list(records)
            for d, n, p in processes:
                full = read_records(records, p.rank, p.pid, p.run)
                full.first_ns, full.last_ns = p.first_ns, p.last_ns  # the same, from the figures above
                d.processes[n] = full
            for _ in records:  # rows of no process asked for: passed over
                pass
        for processes in wanted.values():  # processes without a row of the lifecycle
            for d, n, p in processes:
                full = read_records([], p.rank, p.pid, p.run)
                full.first_ns, full.last_ns = p.first_ns, p.last_ns
                d.processes[n] = full
        loaded.update(want)

    def rank_batches(ranks: Sequence[int]) -> list[list[int]]:
        """``ranks`` in batches of consecutive ranks of at most ``BATCH_ROWS`` lifecycle rows together (a rank of
        more: alone), for ``goodput_by_rank``: one count over the run, then a query per batch, not two per rank."""
        counts = dict(engine.rows(f"SELECT rank, count(*) FROM ({lifecycle_rows('NULL')}) GROUP BY rank"))
        batches: list[list[int]] = []
        total = 0
        for rank in ranks:
            n = int(counts.get(rank, 0))
            if batches and total + n <= BATCH_ROWS:
                batches[-1].append(rank)
                total += n
            else:
                batches.append([rank])
                total = n
        return batches

    # a GPU job's reports carry their window's energy: goodput's energy account then reads every rank's loops, one
    # rank at a time (``goodput._energy``)
    # (the key's text first: a report without it is not parsed; the writer never escapes a key's plain letters)
    energy = bool(engine.scalar(f"SELECT count(*) > 0 FROM events WHERE {where} AND name = '{_UPDATE}' AND "
                                "contains(attributes, 'window_energy_J') AND "
                                "json_exists(attributes, '$.window_energy_J')"))
    return datas, load_rank, rank_batches, energy
