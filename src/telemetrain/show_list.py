"""``telemetrain show --list``: the runs under a folder, oldest first, each with its status, duration and last
report (``analysis.summary``'s figures: by SQL when DuckDB is installed)."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .cli_common import CLIError, existing_dir, fmt_duration, is_number, iso, json_value, table
from .liveness import same_process
from .store.reader import NotARunError, Run, find_runs, open_run
from .text import printable

__all__ = ["list_runs", "liveness", "still_running"]


@dataclass(frozen=True)
class _Listed:
    """One run of ``show --list``: what the listing says of it."""

    path: Path
    created_wall_ns: int | None
    status: str  # finished, crash, interrupted (Ctrl-C), killed, running, no training, unreadable: ...
    start_ns: int | None
    end_ns: int | None
    iterations: int | None  # the last report of the lowest rank
    samples_per_second: float | None
    records: int
    no_news_s: float | None = None  # a loop never ended and no process of it could be checked: its silence


RUNNING_WITHIN_S = 60.0  # a run whose training loop never ended but which wrote this recently is still running


def liveness(run: Run, last_ns: int, now_ns: int | None = None) -> tuple[bool, bool]:
    """Whether a run whose training loop never ended is still going, and whether that is known rather than guessed.
    Known: a process of it alive on this host -- its pid held by the process that started when its header says
    (``liveness.same_process``) -- is running however long it is silent (a long checkpoint save, a slow validation);
    every process of it on this host and gone (a pid reused by another process counts gone) is killed. Guessed, for
    a run of another host or written before headers held ``process_start``: running while it wrote within
    ``RUNNING_WITHIN_S`` and no process of it is known gone (else killed: SIGKILL, OOM, a lost node)."""
    now = time.time_ns() if now_ns is None else now_ns
    host = socket.gethostname()
    states: list[bool | None] = []
    for log in run.processes:
        if log.identity.host != host:
            states.append(None)  # another machine's: no telling
            continue
        alive = same_process(log.process_start)
        if alive is None:  # no start recorded (an older run): the pid's existence, as before
            try:
                os.kill(log.pid, 0)
            except ProcessLookupError:
                alive = False
            except OSError:  # another user's process, alive
                pass
        elif alive and log.agent:
            alive = None  # a launcher agent outlives its workers' runs: its life proves no run's
        states.append(alive)
    if any(state is True for state in states):
        return True, True
    if states and all(state is False for state in states):
        return False, True
    return now - last_ns < RUNNING_WITHIN_S * 1e9, False


def still_running(run: Run, last_ns: int, now_ns: int | None = None) -> bool:
    """Whether a run whose training loop never ended is still going (``liveness``)."""
    return liveness(run, last_ns, now_ns)[0]


def _listed(path: Path, run: Run, now_ns: int, engine: Any = None) -> _Listed:
    """The listing's figures of a run, from its summary (``analysis.summary``: by SQL with ``engine``)."""
    from .analysis.summary import summarize_run, summarize_sql

    summary = summarize_sql(engine, run) if engine is not None else summarize_run(run)
    # the duration: from the first span to the last (the lifecycle's own timestamps), else of all records
    start, end = summary.span_start_ns, summary.span_end_ns
    if start is None:
        start, end = summary.start_ns, summary.end_ns
    statuses = [status for ended in summary.loop_states.values() for status in ended]
    no_news: float | None = None
    if not statuses:
        status = "no training"
    elif "" in statuses:  # a loop that never ended: SIGKILL, OOM, a lost node -- or still going
        running, known = liveness(run, summary.end_ns or 0, now_ns)
        status = "running" if running else "killed"
        if not known:  # a guess from its silence (another host's run, or an older one): say how long
            no_news = max(now_ns - (summary.end_ns or 0), 0) / 1e9
    elif "killed" in statuses:  # a SIGTERM ended a loop, whatever exit followed (span_lifecycle.end_status)
        status = "killed"
    elif any(s not in ("ok", "interrupt") for s in statuses):  # goodput's and the findings' words
        status = "crash"
    elif "interrupt" in statuses:  # a Ctrl-C (span_lifecycle.end_status)
        status = "interrupted"
    else:
        status = "finished"
    created = run.meta.get("created_wall_ns")
    last_update = summary.updates_by_rank[min(summary.updates_by_rank)][1] if summary.updates_by_rank else {}
    iterations = last_update.get("num_iterations")
    rate = last_update.get("samples_per_second")
    return _Listed(path, created if isinstance(created, int) else None, status, start, end,
                   int(iterations) if is_number(iterations) else None,
                   float(rate) if is_number(rate) else None, summary.records, no_news)


def _listing_row(item: _Listed) -> tuple[str, ...]:
    when = iso(item.created_wall_ns) if item.created_wall_ns is not None else "?"
    took = (fmt_duration((item.end_ns - item.start_ns) / 1e9)
            if item.start_ns is not None and item.end_ns is not None else "-")
    if item.iterations is not None:
        figure = f"{item.iterations:,} iterations" + (
            f", {item.samples_per_second:,.4g} samples/s" if item.samples_per_second is not None else "")
    else:
        figure = f"{item.records:,} records"
    status = item.status if item.no_news_s is None else f"{item.status} (no news for {item.no_news_s:,.0f} s)"
    return (when, status, took, figure, str(item.path))


def _listing_dict(item: _Listed) -> dict[str, Any]:
    return {"run": str(item.path), "created": iso(item.created_wall_ns) if item.created_wall_ns is not None else None,
            "status": item.status, "start": iso(item.start_ns) if item.start_ns is not None else None,
            "end": iso(item.end_ns) if item.end_ns is not None else None,
            "duration_s": (item.end_ns - item.start_ns) / 1e9
            if item.start_ns is not None and item.end_ns is not None else None,
            "iterations": item.iterations, "samples_per_second": item.samples_per_second, "records": item.records,
            "no_news_s": item.no_news_s}


def list_runs(target: str | None, out: TextIO, *, as_json: bool = False) -> int:
    from .store.engine import engine_for

    base = existing_dir(target)
    runs = find_runs(base)
    if not runs:
        raise CLIError(f"no telemetrain runs under {base}")
    now = time.time_ns()
    rows: list[tuple[str, ...]] = [("created", "status", "duration", "last report (lowest rank)", "run")]
    listed: list[dict[str, Any]] = []
    engine = engine_for(runs)  # with DuckDB the listing's figures come by SQL, the runs are not read
    try:
        for path in runs:
            try:
                item = _listed(path, open_run(path), now, engine)
                rows.append(_listing_row(item))
                listed.append(_listing_dict(item))
            except (OSError, NotARunError) as exc:
                rows.append(("?", "unreadable", "-", str(exc), str(path)))
                listed.append({"run": str(path), "status": "unreadable", "error": str(exc)})
    finally:
        if engine is not None:
            engine.close()
    if as_json:
        print(json.dumps(json_value(listed), indent=2, allow_nan=False), file=out)
    else:
        print("\n".join(printable(line) for line in table(rows, indent="")), file=out)
    return 0
