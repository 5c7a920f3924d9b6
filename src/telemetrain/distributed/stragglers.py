"""Straggler detection on per-rank window summaries: which rank is slow, in which phase, by how much.

Two scores per rank and phase, both slowdown factors (1.0 = as fast as the reference, 1.5 = 50% slower):

- **relative**: the rank's time against the other ranks' in the same window, by the findings engine's rule
  (``analysis.findings.stragglers.window_outliers``: a leave-one-out robust z-score, a minimum ratio -- reported as
  the score -- and a minimum share of the iteration; for throughput, the time per iteration the rate implies). It
  finds the one rank that holds the others up.
- **individual**: the rank's time against its own best window so far (the first window, warm-up, excluded). It
  finds a rank getting slower over time; when half the ranks or more get slower in a phase at the same step, that
  is the job getting slower (the findings engine's change-point rule names it once), and none is reported.

A score counts only when it is over its threshold, when the time it adds is a real share of an iteration
(``min_share`` of the rank's iteration time: a phase of 20 us that doubles is noise, not a straggler), and after
``patience`` windows in a row (one slow window is a hiccup). A finding is reported once, when it starts, and again
when it ends.

Synchronous data parallelism hides the cause in one way: while one rank is slow in, say, data loading, every other
rank waits inside the collective (the backward pass's all-reduce, or the optimizer step of sharded optimizers), so
those ranks look slow in that phase. A relative finding in a ``sync_phases`` phase is therefore dropped when, in the
same window, another rank is slow in a phase that is not a sync phase: that rank is the cause, the rest is waiting.

When every rank's communication wait is known (``late_rank``), the aggregator calls ``update`` with
``relative=False`` (the late-rank attribution, which measures the waiting itself, answers "who holds the others
up") and ``waiting=`` the ranks that waited for a late rank: their iteration, throughput and sync-phase times grew
because they waited, so no individual finding is raised on them there.

A busy machine is not a straggler: when every rank's window carries its CPU wait and CPU time per iteration
(``CPU_FIELDS``, the training report's ``train_thread_cpu_wait_sec`` / ``train_thread_cpu_time_sec``, else the
process's ``cpu_wait_sec`` / ``cpu_time_sec``), a relative outlier whose excess is covered by extra CPU wait without
as much extra CPU time was descheduled (``analysis.findings.stragglers.cpu_descheduled``, the findings' rule): it
is not reported, and counted in ``descheduled``; it still explains the others' wait in a sync phase (as a cause
above), so they are not reported either.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..analysis.findings.stragglers import cpu_descheduled, window_outliers
from ..analysis.findings.thresholds import Thresholds
from ..phase_times import DEVICE, phase_times

__all__ = ["CPU_FIELDS", "PHASES", "Episodes", "Finding", "StragglerDetector", "phase_clock", "phases_of"]

# phase -> higher is worse? (times are; a rate is the other way round)
PHASES: dict[str, bool] = {
    "iteration": True,
    "dataloader": True,
    "forward": True,
    "backward": True,
    "optimizer": True,
    "samples_per_second": False,
}
# the phases whose slowness is a cause (work a rank does alone), as opposed to the iteration or its rate
_WORK_PHASES = frozenset({"dataloader", "forward", "backward", "optimizer"})
# a rank's CPU wait and CPU time per iteration of the window: its process's, then its training thread's
CPU_FIELDS = ("cpu_wait", "cpu_time", "thread_cpu_wait", "thread_cpu_time")


@dataclass(frozen=True)
class Finding:
    """A straggler starting (``ended=False``) or ending."""

    rank: int
    phase: str
    kind: str  # "relative" or "individual"
    score: float
    threshold: float
    step: int
    reference: float  # the median rank's value (relative), the rank's best (individual), the others' wait (late)
    value: float
    ended: bool = False
    evidence: Mapping[str, Any] = field(default_factory=dict, compare=False)  # more figures, kept in the event


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


class Episodes:
    """When findings start and end: a finding flagged ``patience`` windows in a row starts (once); an active one
    ends in the first window that does not flag it. Keyed by whatever identifies a finding to its caller."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.streak: dict[Any, int] = {}
        self.active: dict[Any, Finding] = {}

    def update(self, flagged: Mapping[Any, Finding], ended: Callable[[Finding], Finding]) -> list[Finding]:
        """The findings that start with this window (``flagged``: key -> finding), then those that end (each made
        by ``ended(the finding that started)``)."""
        changes: list[Finding] = []
        for key in list(self.streak):
            if key not in flagged:
                del self.streak[key]
        for key, finding in flagged.items():
            self.streak[key] = self.streak.get(key, 0) + 1
            if self.streak[key] >= self.patience and key not in self.active:
                self.active[key] = finding
                changes.append(finding)
        for key in list(self.active):
            if key not in flagged:
                changes.append(ended(self.active.pop(key)))
        return changes


@dataclass
class StragglerDetector:
    relative_threshold: float = 1.3
    individual_threshold: float = 1.5
    min_share: float = 0.05
    patience: int = 2
    sync_phases: tuple[str, ...] = ("backward", "optimizer")
    _best: dict[tuple[int, str], float] = field(default_factory=dict)
    _windows: dict[int, int] = field(default_factory=dict)
    # relative outliers not reported: their rank was waiting for a CPU (a busy machine)
    descheduled: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        for name in ("relative_threshold", "individual_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 1:
                raise ValueError(f"{name} must be a slowdown factor > 1, got {value!r}")
        if isinstance(self.min_share, bool) or not isinstance(self.min_share, (int, float)) or self.min_share < 0:
            raise ValueError(f"min_share must be a fraction >= 0, got {self.min_share!r}")
        if type(self.patience) is not int or self.patience < 1:
            raise ValueError(f"patience must be an int >= 1, got {self.patience!r}")
        self._episodes = Episodes(self.patience)

    @property
    def active(self) -> list[Finding]:
        """The stragglers found and not yet over."""
        return list(self._episodes.active.values())

    def update(self, step: int, values: Mapping[int, Mapping[str, float]], *, relative: bool = True,
               waiting: frozenset[int] | set[int] = frozenset()) -> list[Finding]:
        """Feed one exchanged window (rank -> phase -> value); returns the findings that start or end with it.
        ``relative=False``: no relative scores; ``waiting``: ranks that waited for another (see the module
        docstring)."""
        found = self._relative(step, values) if relative else []
        found += [f for f in self._individual(step, values)
                  if not (f.rank in waiting and (f.phase in self.sync_phases or f.phase not in _WORK_PHASES))]
        def ended(old: Finding) -> Finding:
            now = self._value_of(values, old.rank, old.phase)
            return Finding(old.rank, old.phase, old.kind, now / old.reference if _finite(now) and old.reference > 0
                           else math.nan, old.threshold, step, old.reference, now, ended=True)

        return self._episodes.update({(f.rank, f.phase, f.kind): f for f in found}, ended)

    @staticmethod
    def _value_of(values: Mapping[int, Mapping[str, float]], rank: int, phase: str) -> float:
        v = values.get(rank, {}).get(phase)
        return float(v) if v is not None and math.isfinite(v) else math.nan

    def _iteration_of(self, values: Mapping[int, Mapping[str, float]], rank: int) -> float:
        it = values.get(rank, {}).get("iteration")
        if _finite(it):
            return float(it)  # type: ignore[arg-type]
        present = [v["iteration"] for v in values.values() if _finite(v.get("iteration"))]
        return statistics.median(present) if present else math.nan

    def _relative(self, step: int, values: Mapping[int, Mapping[str, float]]) -> list[Finding]:
        """The findings engine's per-window rule (``analysis.findings.stragglers.window_outliers``: leave-one-out
        robust z against the other ranks, a minimum ratio and share), so that the live events and the report
        agree; a rate is compared as the time per iteration it implies."""
        if len(values) < 2:
            return []
        th = Thresholds(straggler_ratio=self.relative_threshold, straggler_min_share=self.min_share)
        iterations = [v["iteration"] for v in values.values() if _finite(v.get("iteration"))]
        typical = statistics.median(iterations) if iterations else math.nan
        cpu = _cpu_figures(values)
        found: list[Finding] = []
        held_up_by: set[int] = set()  # descheduled ranks: not reported, but the others waited for them all the same
        for phase, worse_high in PHASES.items():
            present = {r: float(v[phase]) for r, v in values.items() if _finite(v.get(phase)) and v[phase] > 0}
            if len(present) < 2 or not math.isfinite(typical):
                continue
            median = statistics.median(present.values())
            as_time = present if worse_high else {r: typical * median / x for r, x in present.items()}
            for o in window_outliers(as_time, typical, phase, th):
                if cpu_descheduled(o.rank, o.value - o.reference, cpu, th):
                    self.descheduled += 1
                    if phase not in self.sync_phases and phase in _WORK_PHASES:
                        held_up_by.add(o.rank)
                    continue
                found.append(Finding(o.rank, phase, "relative", o.ratio, self.relative_threshold, step, median,
                                     present[o.rank]))
        causes = {f.rank for f in found if f.phase not in self.sync_phases and f.phase in _WORK_PHASES} | held_up_by
        return [f for f in found if not (f.phase in self.sync_phases and causes - {f.rank})]

    def _individual(self, step: int, values: Mapping[int, Mapping[str, float]]) -> list[Finding]:
        found: list[Finding] = []
        for rank, phases in values.items():
            seen = self._windows.get(rank, 0)
            self._windows[rank] = seen + 1
            if seen == 0:
                continue  # the first window holds the warm-up
            iteration = self._iteration_of(values, rank)
            for phase, worse_high in PHASES.items():
                x = phases.get(phase)
                if not _finite(x) or not x > 0:  # type: ignore[operator]
                    continue
                x = float(x)  # type: ignore[arg-type]
                key = (rank, phase)
                best = self._best.get(key)
                if best is None:
                    self._best[key] = x
                    continue
                score = x / best if worse_high else best / x
                excess = (x - best) if worse_high else iteration * (1 - x / best)
                if score >= self.individual_threshold and excess >= self.min_share * iteration:
                    found.append(Finding(rank, phase, "individual", score, self.individual_threshold, step, best, x))
                if (x < best) if worse_high else (x > best):
                    self._best[key] = x
        # every rank slower at the same step is the job getting slower, not stragglers: the change-point rule's
        # (analysis.findings.slowdown), reported once, not here once per rank
        per_phase: dict[str, int] = {}
        for f in found:
            per_phase[f.phase] = per_phase.get(f.phase, 0) + 1
        return [f for f in found if not (len(values) >= 2 and 2 * per_phase[f.phase] >= len(values))]



def _cpu_figures(values: Mapping[int, Mapping[str, float]]) -> dict[int, tuple[float, float] | None]:
    """Each rank's (CPU wait, CPU time) per iteration: the training thread's when every rank has them (as the
    findings take them), else the process's; None where unknown."""
    thread = all(_finite(v.get("thread_cpu_wait")) and _finite(v.get("thread_cpu_time")) for v in values.values())
    wait, cpu = ("thread_cpu_wait", "thread_cpu_time") if thread else ("cpu_wait", "cpu_time")
    return {r: (float(v[wait]), float(v[cpu])) if _finite(v.get(wait)) and _finite(v.get(cpu)) else None
            for r, v in values.items()}


def phases_of(report: Mapping[str, object]) -> dict[str, float]:
    """The detector's phases from a ``training_metrics_update`` event's attributes (absent ones are NaN). The work
    phases are the device times when the report has them (``training.phase_times``: on CUDA the host times are
    launches, and the phase holding the sync takes the rest); the iteration and the throughput stay the host's."""
    keys = {
        "iteration": "avg_iteration_time_sec",
        "dataloader": "avg_dataloader_time_sec",
        "forward": "avg_forward_time_sec",
        "backward": "avg_backward_time_sec",
        "optimizer": "avg_optimizer_time_sec",
        "samples_per_second": "samples_per_second",
    }
    out: dict[str, float] = {}
    for phase, key in keys.items():
        v = report.get(key)
        out[phase] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    device, clock = phase_times(report, tuple(_WORK_PHASES))
    if clock == DEVICE:
        for phase in _WORK_PHASES:
            out[phase] = device.get(phase, math.nan)
    return out


def phase_clock(report: Mapping[str, object]) -> str:
    """``"device"`` or ``"host"``: the clock of the work phases ``phases_of`` takes from this report."""
    return phase_times(report, tuple(_WORK_PHASES))[1]

