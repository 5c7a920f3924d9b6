"""Findings as plain-text lines (``telemetrain show``; the caller makes names from the run printable)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...store.reader import Run
from .model import Findings
from .run import run_findings

__all__ = ["GoodputOf", "findings_lines", "goodput_once", "run_findings_lines", "session_goodput"]


def findings_lines(result: Findings, *, limit: int = 20) -> list[str]:
    """``findings  N (...)`` then one line per finding (severity, title), its detail and its evidence, then the
    notes."""
    found = result.findings
    cite = "`telemetrain docs report findings`"
    lines = [f"findings    {len(found)}" + (f" (most severe first; {cite})" if found else
                                            f": none ({cite} says what each rule looks for)")]
    for f in found[:limit]:
        lines.append(f"  {f.severity:<7}  {f.title}")
        lines.append(f"           {f.detail}")
        if f.evidence is not None and f.evidence.summary():
            lines.append(f"           evidence: {f.evidence.summary()}")
    if len(found) > limit:
        lines.append(f"  ... and {len(found) - limit} more")
    lines += [f"  note     {n.text}" for n in result.notes]
    return lines


GoodputOf = Callable[[Path, int], Any]  # (session folder, rank) -> training.goodput.GoodputReport, or raises


def goodput_once(run: Run, engine: Any = None) -> GoodputOf:
    """``training.goodput.goodput`` of ``run``'s session, computed at most once per (folder, rank): ``show`` reads the
    same report for its goodput line and for its findings' restarts. An error is raised again on each call."""
    from ...training.goodput import goodput

    done: dict[tuple[Path, int], tuple[Any, Exception | None]] = {}

    def of(session_dir: Path, rank: int) -> Any:
        key = (Path(session_dir), rank)
        if key not in done:
            try:
                done[key] = (goodput(session_dir, rank=rank, opened=(run,), engine=engine), None)
            except Exception as exc:  # noqa: BLE001 - kept, and raised to each caller as it would have been
                done[key] = (None, exc)
        report, error = done[key]
        if error is not None:
            raise error
        return report

    return of


def session_goodput(run: Run, engine: Any = None, *, goodput_of: GoodputOf | None = None) -> Any:
    """The goodput report of the run's session (for its crashes and restarts); None when it cannot be computed.
    ``engine``: a ``store.engine.Engine`` to read the session with (``training.goodput.goodput``); ``goodput_of``:
    a ``goodput_once`` to share the report with another reader of it."""
    if not run.processes:
        return None
    of = goodput_of if goodput_of is not None else goodput_once(run, engine)
    for session_dir in (run.path.parent, run.path):  # a run folder alone is a session of one run
        try:
            return of(session_dir, run.ranks[0])
        except (ValueError, OSError):
            continue
        except Exception:  # noqa: BLE001 - odd records: the findings stand without the session's restarts
            return None
    return None


def run_findings_lines(run: Run, *, goodput_of: GoodputOf | None = None) -> list[str]:
    """The findings of a loaded run, with its session's crashes and restarts (goodput of the session)."""
    return findings_lines(run_findings(run, goodput_report=session_goodput(run, goodput_of=goodput_of)))
