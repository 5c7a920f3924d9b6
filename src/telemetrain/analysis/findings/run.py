"""The findings of a loaded run: every process's records through ``InputBuilder``, the session's attempts from
goodput, then ``analyse``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...store.reader import ProcessLog, Run, in_start_order, list_processes
from .builder import InputBuilder
from .engine import analyse
from .inputs import Attempt
from .model import Findings
from .thresholds import Thresholds
from .worker_exits import EVENT, worker_exits

__all__ = ["attempts_of", "feed_agent_events", "run_findings"]


def feed_agent_events(builder: InputBuilder, run: Run) -> None:
    """The launcher agents' events (a few per agent: read in Python by every reader)."""
    for log in run.agents:
        for record in log.records:
            if record.kind == "event":
                builder.add(record)


def attempts_of(report: Any, run_id: str) -> tuple[Attempt, ...]:
    """The runs of a ``training.goodput.GoodputReport`` as attempts (``run_id`` marks the one being reported); an
    earlier attempt that failed carries its cause, from its launcher agents' worker exits."""
    if report is None:
        return ()
    return tuple(Attempt(r.run_id, r.restart_order, r.status, r.first_iteration, r.last_iteration,
                         r.checkpointed_iterations, r.lost_iterations, r.run_id == run_id,
                         _exits(Path(report.session_dir) / r.run_id)
                         if r.status in ("interrupted", "killed") and r.run_id != run_id else ())
                 for r in report.runs)


def _exits(run_dir: Path) -> tuple[Any, ...]:
    """What ended an earlier attempt's workers, from its agents' ``worker_failed`` events (small files, read here
    by every reader; the run itself is not read)."""
    try:
        processes = list_processes(run_dir)
    except OSError:
        return ()
    events: list[Any] = []
    for (agent, _, _), paths in sorted(processes.items()):
        if agent:
            events += [r.attributes or {} for r in ProcessLog(paths).records
                       if r.kind == "event" and (r.group, r.name) == EVENT]
    return tuple(worker_exits(events))


def run_findings(run: Run, *, goodput_report: Any = None, thresholds: Thresholds | None = None,
                 open_spans_crashed: bool = True) -> Findings:
    """The findings of ``run``: its training processes' records, and the launcher's agents' events (their worker
    exits and stalls; they hold no training figures). Pass the session's goodput report to get its crashes and
    restarts. ``open_spans_crashed``: False for a run still running (``InputBuilder.build``'s)."""
    builder = InputBuilder()
    for log in in_start_order(run.processes):  # (a series' points as written: a restart's after, whatever its pid)
        for record in log.records:
            builder.add(record)
    feed_agent_events(builder, run)
    return analyse(builder.build(attempts=attempts_of(goodput_report, run.run_id),
                                 open_spans_crashed=open_spans_crashed), thresholds)
