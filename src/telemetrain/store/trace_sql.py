"""The trace's reading of runs by SQL (``store.engine``): for each process, a loader of the records the trace draws
(its span starts and ends, events and diagnostics, and of its metrics only the counters), in the order the Python
path sorts them (wall time, then monotonic time, then file order). ``trace.build_trace`` calls each loader when it
draws that process and lets the records go after, so memory holds one process, not the run."""

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


def process_loaders(runs: Sequence[Any], engine: Any, all_metrics: bool, counters: frozenset[str],
                    throughput: frozenset[str]) -> list[tuple[Any, Any, Callable[[], list[Any]], Any]]:
    """(run, identity, loader, (first wall ns, last wall ns)) of every (run, rank, pid), in the trace's process
    order: run order, ranks before agents, then rank, then pid."""
    engine.add_runs([r.path for r in runs])
    # (a counter's name with other attributes, another series, is loaded and left out by the trace's own filter)
    metric_filter = "" if all_metrics else f" AND name IN {_quoted(counters)}"
    metric_filter += f" AND NOT (group_name = 'training' AND name IN {_quoted(throughput)})"
    found: dict[tuple[int, int, int, int], tuple[dict[str, Any], tuple[int | None, int | None]]] = {}
    for n, run in enumerate(runs):
        session, run_id = (v.replace("'", "''") for v in (run.session_tag, run.run_id))
        where = f"session = '{session}' AND run = '{run_id}'"
        # first and last of all the process's records, drawn or not, as the Python path takes them: the earliest is
        # the trace's origin, the last where a span left open is drawn to end
        parts = " UNION ALL ".join(
            f"SELECT rank, pid, role, min(wall_ns) AS first, max(wall_ns) AS last FROM {table} WHERE {where} "
            "GROUP BY ALL" for table in TABLES.values())
        for rank, pid, role, first, last in engine.rows(
                f"SELECT rank, pid, role, min(first), max(last) FROM ({parts}) GROUP BY ALL"):
            key = (n, int(role == AGENT_ROLE), rank, pid)
            found[key] = ({"session": run.session_tag, "run": run.run_id, "where": where}, (first, last))

    def loader(n: int, rank: int, pid: int, where: str) -> Callable[[], list[Any]]:
        where = f"{where} AND rank = {int(rank)} AND pid = {int(pid)}"

        def load() -> list[Any]:
            records: list[tuple[tuple[Any, ...], Any]] = []
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
                        records.append(((r["wall_ns"], r["mono_ns"], r["segment"], r["line"]), record))
            records.sort(key=lambda kr: kr[0])
            return [record for _, record in records]

        return load

    out = []
    for (n, agent, rank, pid), (info, bounds) in sorted(found.items()):
        where = f"{info['where']} AND ({'' if agent else 'NOT '}role = '{AGENT_ROLE}')"
        cur = engine.execute(f"SELECT * FROM processes WHERE {where} AND rank = {int(rank)} AND pid = {int(pid)} "
                             "ORDER BY segment, line LIMIT 1")
        names = [d[0] for d in cur.description]
        row = cur.fetchone()
        identity = None
        if row is not None:
            identity = identity_of_row(dict(zip(names, row, strict=True)), info["session"], info["run"])
        if identity is None:  # no header row (a file whose header was lost): the first record's identity
            records = loader(n, rank, pid, where)()
            if not records:
                continue
            identity = records[0].identity
        out.append((runs[n], identity, loader(n, rank, pid, where), bounds))
    return out


def clock_offset_events(engine: Any, runs: Iterable[Any]) -> Iterable[tuple[str, int, int, dict[str, Any]]]:
    """(run id, rank, wall ns, attributes) of the ranks' ``clock_offset`` events (group ``clock``) of ``runs``: the
    few records the trace's clock alignment reads, without loading the processes."""
    import json

    from .codec import untag_nonfinite

    for run in runs:
        session, run_id = (v.replace("'", "''") for v in (run.session_tag, run.run_id))
        for rank, wall, text in engine.rows(
                f"SELECT rank, wall_ns, attributes FROM events WHERE session = '{session}' AND run = '{run_id}' AND "
                f"role <> '{AGENT_ROLE}' AND group_name = 'clock' AND name = 'clock_offset' ORDER BY {_ORDER}"):
            attributes = untag_nonfinite(json.loads(text)) if text is not None else None
            yield run.run_id, rank, wall, attributes if isinstance(attributes, dict) else {}
