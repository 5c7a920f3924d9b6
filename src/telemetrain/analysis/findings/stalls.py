"""Stalls: facts, no statistics. The launcher agent's ``stall`` events (``distributed.stall_view``: which ranks were
stuck where while the others waited); without one (a job not under ``telemetrain launch``, or a stall the agent did
not see end), the ranks' own ``stall_evidence`` records (``distributed.watchdog``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .fmt import ranges
from .model import Finding

__all__ = ["stalls"]

_EVIDENCE_SHOWN = 20  # ranks named in the evidence finding's text (a job of thousands names the first ones)


def stalls(events: Sequence[Mapping[str, Any]], evidence: Sequence[tuple[int, Mapping[str, Any]]]) -> list[Finding]:
    """One finding per agent ``stall`` event; else one for the ranks' evidence."""
    found = []
    for s in events:
        ranks = s.get("ranks")
        if not isinstance(ranks, list):
            continue
        named = sorted(r for r in ranks if type(r) is int)
        phase = s.get("phase")
        found.append(Finding("error", "stall", "stall: rank(s) " + (ranges(named) if named else "?")
                             + (f" ({phase})" if phase else ""), str(s.get("message", ""))))
    if found or not evidence:
        return found
    said = {(r, f"rank {r}: {a.get('phase', '?')}" + (f", in {a['collective']} #{a.get('collective_seq')}"
                                                      + _group(a)
                                                      if a.get("collective_state") in ("waiting", "failed") else ""))
            for r, a in evidence}
    where = [text for _, text in sorted(said)]  # by rank (rank 2 before rank 10)
    shown = "; ".join(where[:_EVIDENCE_SHOWN]) + (f"; and {len(where) - _EVIDENCE_SHOWN} more"
                                                  if len(where) > _EVIDENCE_SHOWN else "")
    return [Finding("error", "stall", f"stall evidence: {len({r for r, _ in evidence})} rank(s)",
                    "stall_evidence records (distributed.watchdog): " + shown)]


def _group(attributes: Mapping[str, Any]) -> str:
    """`` on ranks 0..1``: the process group whose count the number is (evidence of this version on)."""
    members = attributes.get("collective_group_ranks")
    return f" on ranks {members}" if isinstance(members, str) and members else ""
