"""Findings as plain-text lines (``telemetrain show``; the caller makes names from the run printable)."""

from __future__ import annotations

from typing import Any

from ...store.reader import Run
from .model import Findings
from .run import run_findings

__all__ = ["findings_lines", "run_findings_lines", "session_goodput"]


def findings_lines(result: Findings, *, limit: int = 20) -> list[str]:
    """``findings  N (...)`` then one line per finding (severity, title), its detail and its evidence, then the
    notes."""
    found = result.findings
    lines = [f"findings    {len(found)}" + (" (most severe first; docs/report.md, Findings)" if found else
                                            ": none (docs/report.md, Findings, says what each rule looks for)")]
    for f in found[:limit]:
        lines.append(f"  {f.severity:<7}  {f.title}")
        lines.append(f"           {f.detail}")
        if f.evidence is not None and f.evidence.summary():
            lines.append(f"           evidence: {f.evidence.summary()}")
    if len(found) > limit:
        lines.append(f"  ... and {len(found) - limit} more")
    lines += [f"  note     {n.text}" for n in result.notes]
    return lines


def session_goodput(run: Run, engine: Any = None) -> Any:
    """The goodput report of the run's session (for its crashes and restarts); None when it cannot be computed.
    ``engine``: a ``store.engine.Engine`` to read the session with (``training.goodput.goodput``)."""
    if not run.processes:
        return None
    from ...training.goodput import goodput

    for session_dir in (run.path.parent, run.path):  # a run folder alone is a session of one run
        try:
            return goodput(session_dir, rank=run.ranks[0], opened=(run,), engine=engine)
        except (ValueError, OSError):
            continue
        except Exception:  # noqa: BLE001 - odd records: the findings stand without the session's restarts
            return None
    return None


def run_findings_lines(run: Run) -> list[str]:
    """The findings of a loaded run, with its session's crashes and restarts (goodput of the session)."""
    return findings_lines(run_findings(run, goodput_report=session_goodput(run)))
