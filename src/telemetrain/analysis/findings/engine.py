"""The findings engine: every rule over one ``FindingsInput``, the overlaps resolved, most severe first.

One engine for ``telemetrain report``, ``show``, ``tail`` and ``compare`` (and the live cross-rank detector, which
calls ``stragglers.window_outliers``), so they agree. docs/report.md ("Findings") gives each rule, its thresholds and
what it cannot see.
"""

from __future__ import annotations

import dataclasses

from .checkpoints import slow_checkpoint_ranks
from .container import oom_kills
from .crashes import crashes
from .inputs import FindingsInput
from .memory import memory_growth
from .model import Evidence, Finding, Findings, Note, sort_findings
from .rollback import latest_attempt
from .slowdown import slow_iterations, slowdowns
from .stalls import stalls as stall_findings
from .stragglers import stragglers
from .thresholds import DEFAULT_THRESHOLDS, Thresholds
from .values import nonfinite, spikes

__all__ = ["analyse"]


def analyse(data: FindingsInput, thresholds: Thresholds | None = None) -> Findings:
    """Every finding in ``data`` (see the rule modules), and the notes (busy machine, unconfirmed live events)."""
    th = thresholds if thresholds is not None else DEFAULT_THRESHOLDS
    if not isinstance(th, Thresholds):
        raise TypeError(f"thresholds must be a Thresholds, got {type(th).__name__}")
    notes: list[Note] = []
    data = dataclasses.replace(data, windows=latest_attempt(data.windows))  # the steps the final model saw
    found = crashes(data.span_failures, data.attempts, data.worker_exits)
    found += oom_kills(data.span_failures, data.containers, data.hosts)
    found += stall_findings(data.stalls, data.stall_evidence)
    slow, more = slowdowns(data.windows, th)
    notes += more
    late, more = stragglers(data.windows, data.straggler_events, th, data.hosts)
    notes += more
    found += _explained(slow, late) + late
    stalls, more = slow_iterations(data.windows, th)
    found += stalls
    notes += more
    steady = min((w.time_s for w in data.windows if not w.warmup), default=None)
    if steady is not None:  # without a steady report window, warm-up cannot be told from a leak
        found += memory_growth(data.memory, data.hosts_memory, steady, th, data.containers)
    found += slow_checkpoint_ranks(data.checkpoint_saves, th, data.hosts)
    found += nonfinite(data.nonfinite)
    found += spikes(data.values, th, data.value_families)
    return Findings(tuple(sort_findings(found)), tuple(notes))


def _explained(slow: list[Finding], late: list[Finding]) -> list[Finding]:
    """A slowdown is reported once: as itself, or -- when a straggler over the same steps adds at least half of its
    extra time per iteration -- inside that straggler (one late rank slows every rank of a synchronous job)."""
    kept = []
    for s in slow:
        e = s.evidence
        assert e is not None and e.steps is not None and e.value is not None and e.reference is not None
        added = e.value - e.reference
        cause = None
        for f in late:
            fe = f.evidence
            if fe is None or fe.steps is None or fe.value is None or fe.reference is None:
                continue
            overlap = min(e.steps[1], fe.steps[1]) - max(e.steps[0], fe.steps[0])
            if overlap > 0 and fe.value - fe.reference >= 0.5 * added:
                cause = f
                break
        if cause is None:
            kept.append(s)
            continue
        assert cause.evidence is not None
        i = late.index(cause)
        late[i] = Finding(cause.severity, cause.kind, cause.title,
                          cause.detail + f"; it made the whole job slower: {s.title.removeprefix('slowdown: ')}",
                          _with_note(cause, f"job slowdown {e.effect:.2f}x over steps {e.steps[0]}..{e.steps[1]}"))
    return kept


def _with_note(f: Finding, note: str) -> Evidence:
    assert f.evidence is not None
    return dataclasses.replace(f.evidence, notes=(*f.evidence.notes, note))
