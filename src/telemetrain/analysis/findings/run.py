"""The findings of a loaded run: every process's records through ``InputBuilder``, the session's attempts from
goodput, then ``analyse``."""

from __future__ import annotations

from typing import Any

from ...store.reader import Run
from .builder import InputBuilder
from .engine import analyse
from .inputs import Attempt
from .model import Findings
from .thresholds import Thresholds

__all__ = ["attempts_of", "feed_agent_events", "run_findings"]


def feed_agent_events(builder: InputBuilder, run: Run) -> None:
    """The launcher agents' events (a few per agent: read in Python by every reader)."""
    for log in run.agents:
        for record in log.records:
            if record.kind == "event":
                builder.add(record)


def attempts_of(report: Any, run_id: str) -> tuple[Attempt, ...]:
    """The runs of a ``training.goodput.GoodputReport`` as attempts (``run_id`` marks the one being reported)."""
    if report is None:
        return ()
    return tuple(Attempt(r.run_id, r.restart_order, r.status, r.first_iteration, r.last_iteration,
                         r.checkpointed_iterations, r.lost_iterations, r.run_id == run_id) for r in report.runs)


def run_findings(run: Run, *, goodput_report: Any = None, thresholds: Thresholds | None = None) -> Findings:
    """The findings of ``run``: its training processes' records, and the launcher's agents' events (their worker
    exits and stalls; they hold no training figures). Pass the session's goodput report to get its crashes and
    restarts."""
    builder = InputBuilder()
    for log in run.processes:
        for record in log.records:
            builder.add(record)
    feed_agent_events(builder, run)
    return analyse(builder.build(attempts=attempts_of(goodput_report, run.run_id)), thresholds)
