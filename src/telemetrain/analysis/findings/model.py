"""What the findings engine returns: findings (problems, each with its evidence) and notes (context that is not a
problem of the job: the machine was busy)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SEVERITIES", "Evidence", "Finding", "Findings", "Note"]

SEVERITIES = ("error", "warning", "info")


def _json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    return value


@dataclass(frozen=True)
class Evidence:
    """Why a finding was made: the size of the effect, where, and how sure.

    ``effect`` is a ratio (2.0: twice the reference) unless ``effect_unit`` says otherwise (``B/s`` for a memory
    trend, ``z`` for a robust z-score); ``confidence`` is 1 - p of the rule's test (``test`` names it), ``None`` for
    facts that need no test (a NaN is a NaN)."""

    effect: float | None = None
    effect_unit: str = "x"
    confidence: float | None = None
    steps: tuple[int, int] | None = None  # first and last step of the range
    ranks: tuple[int, ...] = ()
    phase: str | None = None
    value: float | None = None  # what was seen
    reference: float | None = None  # what it was compared with
    windows: int = 0  # report windows supporting it
    test: str = ""
    cost_seconds: float | None = None  # wall seconds it cost (a straggler: the others' wait)
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: ``effect 2.01x; steps 300..999; 70 windows; confidence 99.9% (Pettitt ...)``."""
        parts = []
        if self.effect is not None and math.isfinite(self.effect):
            if self.effect_unit == "B/s":
                parts.append(f"effect {_per_minute(self.effect)}")
            else:
                parts.append(f"effect {self.effect:.3g}{'x' if self.effect_unit == 'x' else ' ' + self.effect_unit}")
        if self.steps is not None:
            parts.append(f"steps {self.steps[0]}..{self.steps[1]}")
        if self.windows:
            parts.append(f"{self.windows} window(s)")
        if self.cost_seconds is not None:
            parts.append(f"cost {self.cost_seconds:.3g} s")
        if self.confidence is not None:
            parts.append(f"confidence {_percent(self.confidence)}" + (f" ({self.test})" if self.test else ""))
        elif self.test:
            parts.append(self.test)
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"effect": _json(self.effect), "effect_unit": self.effect_unit, "confidence": _json(self.confidence),
                "steps": list(self.steps) if self.steps else None, "ranks": list(self.ranks), "phase": self.phase,
                "value": _json(self.value), "reference": _json(self.reference), "windows": self.windows,
                "test": self.test, "cost_seconds": _json(self.cost_seconds), "notes": list(self.notes)}


def _per_minute(bytes_per_s: float) -> str:
    from .fmt import bytes_

    return f"{'+' if bytes_per_s >= 0 else ''}{bytes_(bytes_per_s * 60)}/min"


def _percent(confidence: float) -> str:
    """99.9%, 99.99%, ...: enough nines to tell confidences apart, never ``100%``."""
    if confidence > 0.999999:
        return ">99.9999%"
    digits = 1
    while digits < 4 and confidence >= 1 - 10 ** -(digits + 2):
        digits += 1
    return f"{confidence * 100:.{digits}f}%"


@dataclass(frozen=True)
class Finding:
    """One problem, most severe first: ``severity`` is ``error``, ``warning`` or ``info``; ``kind`` a stable name
    (docs/report.md lists them); ``title`` one line; ``detail`` the sentence a person reads."""

    severity: str
    kind: str
    title: str
    detail: str
    evidence: Evidence | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"severity": self.severity, "kind": self.kind, "title": self.title, "detail": self.detail,
                "evidence": self.evidence.as_dict() if self.evidence is not None else None}


@dataclass(frozen=True)
class Note:
    """Context, not a problem of the job: ``kind`` ``contention`` (the machine was busy), ``brief`` (a change short of
    a finding's floors, or a slowdown or straggler for a while after each checkpoint or validation), ``unconfirmed``
    (a live detector's event that the offline rule did not confirm)."""

    kind: str
    text: str
    evidence: Evidence | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text,
                "evidence": self.evidence.as_dict() if self.evidence is not None else None}


@dataclass(frozen=True)
class Findings:
    """The engine's answer: findings most severe first, and notes."""

    findings: tuple[Finding, ...] = ()
    notes: tuple[Note, ...] = field(default=())

    def kinds(self) -> list[str]:
        return [f.kind for f in self.findings]

    def as_dict(self) -> dict[str, Any]:
        return {"findings": [f.as_dict() for f in self.findings], "notes": [n.as_dict() for n in self.notes]}


def sort_findings(findings: list[Finding]) -> list[Finding]:
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: order.get(f.severity, len(order)))
