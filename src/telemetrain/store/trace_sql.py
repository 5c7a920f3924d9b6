"""The trace's reading of runs by SQL (``store.engine``): for each process, a loader of the records the trace draws
(its span starts and ends, events and diagnostics, and of its metrics only the counters), in the order the Python
path sorts them (wall time, then monotonic time, then file order). ``trace.build_trace`` calls each loader when it
draws that process and lets the records go after; a loader reads its group of processes (``GROUP_ROWS``) by one query
a table, so memory holds a group of processes, not the run."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .columnar import TABLES
from .layout import AGENT_ROLE
from .row_records import identity_of_row, record_from_row

__all__ = ["clock_offset_events", "process_loaders"]

_ORDER = "wall_ns, mono_ns, segment, line"


def _quoted(names: Iterable[str]) -> str:
    return "(" + ", ".join("'" + n.replace("'", "''") + "'" for n in sorted(names)) + ")"


# The processes whose records one query loads together (consecutive in the trace's order, one run, ranks or agents):
# at most this many rows, a process holding more alone. A query per process and table cost ~2 ms: 15 s of a
# 1,024-rank trace; memory holds a group, not the run.
GROUP_ROWS = 50_000


def process_loaders(runs: Sequence[Any], engine: Any, all_metrics: bool, counters: frozenset[str],
                    throughput: frozenset[str]) -> list[tuple[Any, Any, Callable[[], list[Any]], Any]]:
    """(run, identity, loader, (first wall ns, last wall ns)) of every (run, rank, pid), in the trace's process
    order: run order, ranks before agents, then rank, then pid."""
    engine.add_runs([r.path for r in runs])
    # (a counter's name with other attributes, another series, is loaded and left out by the trace's own filter)
    metric_filter = "" if all_metrics else f" AND name IN {_quoted(counters)}"
    metric_filter += f" AND NOT (group_name = 'training' AND name IN {_quoted(throughput)})"
    found: dict[tuple[int, int, int, int], tuple[str, tuple[int | None, int | None], int]] = {}
    headers: dict[tuple[int, int, int, int], Any] = {}
    for n, run in enumerate(runs):
        session, run_id = (v.replace("'", "''") for v in (run.session_tag, run.run_id))
        where = f"session = '{session}' AND run = '{run_id}'"
        # first and last of all the process's records, drawn or not, as the Python path takes them: the earliest is
        # the trace's origin, the last where a span left open is drawn to end
        parts = " UNION ALL ".join(
            f"SELECT rank, pid, role, min(wall_ns) AS first, max(wall_ns) AS last, count(*) AS n FROM {table} "
            f"WHERE {where} GROUP BY ALL" for table in TABLES.values())
        for rank, pid, role, first, last, rows in engine.rows(
                f"SELECT rank, pid, role, min(first), max(last), sum(n) FROM ({parts}) GROUP BY ALL"):
            found[(n, int(role == AGENT_ROLE), rank, pid)] = (where, (first, last), int(rows))
        # each process's first header (its identity), by one query
        cur = engine.execute(f"SELECT * FROM processes WHERE {where} QUALIFY row_number() OVER (PARTITION BY rank, "
                             f"pid, role = '{AGENT_ROLE}' ORDER BY segment, line) = 1")
        names = [d[0] for d in cur.description]
        for row in cur.fetchall():
            r = dict(zip(names, row, strict=True))
            headers[(n, int(r["role"] == AGENT_ROLE), r["rank"], r["pid"])] = identity_of_row(
                r, run.session_tag, run.run_id)

    groups: list[list[tuple[int, int, int, int]]] = []
    held = 0
    for key in sorted(found):
        if not groups or groups[-1][0][:2] != key[:2] or held + found[key][2] > GROUP_ROWS:
            groups.append([])
            held = 0
        groups[-1].append(key)
        held += found[key][2]
    loaded: dict[tuple[int, int, int, int], list[Any]] = {}

    def load_group(group: list[tuple[int, int, int, int]]) -> None:
        n, agent = group[0][:2]
        pairs = ", ".join(f"({int(rank)}, {int(pid)})" for _, _, rank, pid in group)
        ranks = ", ".join(sorted({str(int(rank)) for _, _, rank, _ in group}))
        # (rank IN: the partition filter, which a pair does not give DuckDB to prune files with)
        where = (f"{found[group[0]][0]} AND ({'' if agent else 'NOT '}role = '{AGENT_ROLE}') "
                 f"AND rank IN ({ranks}) AND (rank, pid) IN ({pairs})")
        records: dict[tuple[int, int, int, int], list[tuple[tuple[Any, ...], Any]]] = {key: [] for key in group}
        for kind, table in TABLES.items():
            extra = metric_filter if kind == "metric" else ""
            cur = engine.execute(f"SELECT * FROM {table} WHERE {where}{extra}")
            names = [d[0] for d in cur.description]
            while True:
                rows = cur.fetchmany(10_000)
                if not rows:
                    break
                for row in rows:
                    r = dict(zip(names, row, strict=True))
                    record = record_from_row(kind, identity_of_row(r, r["session"], r["run"]), row, names)
                    records[(n, agent, r["rank"], r["pid"])].append(
                        ((r["wall_ns"], r["mono_ns"], r["segment"], r["line"]), record))
        for key, keyed in records.items():
            keyed.sort(key=lambda kr: kr[0])
            loaded[key] = [record for _, record in keyed]

    def loader(key: tuple[int, int, int, int], group: list[tuple[int, int, int, int]]) -> Callable[[], list[Any]]:
        def load() -> list[Any]:
            if key not in loaded:
                load_group(group)
            return loaded.pop(key, [])  # (let go once drawn: a process loaded again reads its group again)

        return load

    out = []
    for group in groups:
        for key in group:
            identity = headers.get(key)
            if identity is None:  # no header row (a file whose header was lost): the first record's identity
                records = loader(key, [key])()
                if not records:
                    continue
                identity = records[0].identity
            out.append((runs[key[0]], identity, loader(key, group), found[key][1]))
    return out


def clock_offset_events(engine: Any, runs: Iterable[Any]) -> Iterable[tuple[str, int, int, dict[str, Any]]]:
    """(run id, rank, wall ns, attributes) of the ranks' ``clock_offset`` events (group ``clock``) of ``runs``: the
    few records the trace's clock alignment reads, without loading the processes."""

    from .codec import loads_column

    for run in runs:
        session, run_id = (v.replace("'", "''") for v in (run.session_tag, run.run_id))
        for rank, wall, text in engine.rows(
                f"SELECT rank, wall_ns, attributes FROM events WHERE session = '{session}' AND run = '{run_id}' AND "
                f"role <> '{AGENT_ROLE}' AND group_name = 'clock' AND name = 'clock_offset' ORDER BY {_ORDER}"):
            attributes = loads_column(text)
            yield run.run_id, rank, wall, attributes if isinstance(attributes, dict) else {}
