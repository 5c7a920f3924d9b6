"""Late-rank attribution: in each window, which rank the others waited for, why, and what it cost them.

With synchronous data parallelism every rank leaves a collective together, so phase times look alike; what differs
is how long each rank *waited* in the collectives (``avg_comm_wait_time_sec``, ``distributed.comm``). The rank that
arrives last waits least. So, per window (one exchanged report per rank):

- **who**: the rank with the least wait; ranks within ``group_share`` of the gap from it are late with it (two slow
  ranks are named together, not one at random);
- **what it cost**: the median wait of the other ranks minus its own, per iteration (``cost_per_iteration_sec``) and
  over the window (``cost_sec``: the wall seconds every other rank spent waiting for it);
- **why**: the phase in which it spent the most more *compute* than the median other rank: ``dataloader``, ``h2d``,
  ``forward``, ``backward``, ``optimizer``, ``zero_grad`` (each phase's time minus the communication waited in it),
  or ``outside`` (outside any phase: the step interval less the phases and the waits);
- **which waits**: only the waits in collectives that span every rank (``world_wait``:
  ``avg_comm_world_wait_time_sec``). A wait in a subgroup (a pipeline's send/recv, a TP or DP pair) is a wait for
  that group's peers, and the rank that waits least there is not late for the job: a job with no collective over
  every rank in the window is not attributed at all. A rank that arrives late at the job's collective because it had
  waited for a late peer in a subgroup (its wait elsewhere covers its lateness) is not named: it was held up;
- it counts when the cost is at least ``min_share`` of the step interval, and becomes a finding after ``patience``
  windows in a row with the same rank and cause (a ``stragglers.Finding`` of kind ``late``, whose ``evidence``
  carries the figures above and every phase's excess).

Needs the wait of every rank: the ranks' DDP/FSDP communication instrumented (``comm.instrument_ddp``...).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from .stragglers import Episodes, Finding

__all__ = ["CAUSES", "WORK_PHASES", "LateRankAttributor", "Verdict"]

WORK_PHASES = ("dataloader", "h2d", "forward", "backward", "optimizer", "zero_grad")
OUTSIDE = "outside"
CAUSES = (*WORK_PHASES, OUTSIDE)


def _f(value: float | None) -> float:
    return float(value) if value is not None and math.isfinite(value) else 0.0


def has_waits(values: Mapping[int, Mapping[str, float]]) -> bool:
    """Whether every rank of the window reported its communication wait."""
    return len(values) >= 2 and all(math.isfinite(v.get("comm_wait", math.nan)) for v in values.values())


def compute_times(v: Mapping[str, float]) -> dict[str, float]:
    """A rank's compute time per cause: each phase less the communication waited in it; ``outside``: the step
    interval (else the iteration) less the phases and the waits outside them."""
    raw = {p: _f(v.get(p)) for p in WORK_PHASES}
    waits = {p: _f(v.get(f"wait_{p}")) for p in WORK_PHASES}
    out = {p: max(raw[p] - waits[p], 0.0) for p in WORK_PHASES}
    interval = v.get("interval", math.nan)
    if not math.isfinite(interval):
        interval = _f(v.get("iteration"))
    wait_elsewhere = max(_f(v.get("comm_wait")) - sum(waits.values()), 0.0)
    out[OUTSIDE] = max(interval - sum(raw.values()) - wait_elsewhere, 0.0)
    return out


def sync_waits(values: Mapping[int, Mapping[str, float]]) -> dict[int, float] | None:
    """Each rank's wait in the collectives that span every rank (``world_wait``), or None where a rank lacks it.
    Only those compare: in a subgroup or a send/recv, the rank that waits least waited for its peers, not for the
    job (a pipeline's first stage always waits least). Values without ``world_wait`` at all (a caller that knows its
    ranks all synchronise together) are read by their whole wait, ``comm_wait``."""
    if len(values) < 2:
        return None
    key = "world_wait" if any("world_wait" in v for v in values.values()) else "comm_wait"
    waits = {r: v.get(key, math.nan) for r, v in values.items()}
    return {r: float(w) for r, w in waits.items()} if all(math.isfinite(w) for w in waits.values()) else None


@dataclass(frozen=True)
class Verdict:
    """One window: the late ranks, each one's cause, and the evidence."""

    step: int
    late: tuple[int, ...]
    causes: dict[int, str]
    cost_per_iteration: float
    evidence: dict[int, dict[str, float]]


@dataclass
class LateRankAttributor:
    min_share: float = 0.05
    patience: int = 2
    group_share: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.min_share, bool) or not isinstance(self.min_share, (int, float)) or \
                not 0 <= self.min_share < 1:
            raise ValueError(f"min_share must be a fraction in [0, 1), got {self.min_share!r}")
        if type(self.patience) is not int or self.patience < 1:
            raise ValueError(f"patience must be an int >= 1, got {self.patience!r}")
        if isinstance(self.group_share, bool) or not isinstance(self.group_share, (int, float)) or \
                not 0 < self.group_share < 1:
            raise ValueError(f"group_share must be a fraction in (0, 1), got {self.group_share!r}")
        self._episodes = Episodes(self.patience)

    @property
    def active(self) -> list[Finding]:
        return list(self._episodes.active.values())

    def analyse(self, step: int, values: Mapping[int, Mapping[str, float]]) -> Verdict | None:
        """The late ranks of one window, or None (no waits, or nobody made the others wait long enough)."""
        waits = sync_waits(values)
        if waits is None:
            return None
        intervals = [v.get("interval", math.nan) for v in values.values()]
        intervals = [x for x in intervals if math.isfinite(x) and x > 0] or [
            _f(v.get("iteration")) for v in values.values()]
        interval = statistics.median(intervals) if intervals else 0.0
        first = min(waits, key=lambda r: (waits[r], r))
        others = [w for r, w in waits.items() if r != first]
        cost = statistics.median(others) - waits[first]
        if not cost > 0 or cost < self.min_share * interval:
            return None
        late = tuple(sorted(r for r, w in waits.items() if w - waits[first] < self.group_share * cost))
        # a rank that arrived late at the job's collective because it had waited for a late partner in a subgroup
        # (its pair's all-reduce, a recv) was held up, not holding up: its wait elsewhere covers its lateness
        late = tuple(r for r in late if _f(values[r].get("comm_wait")) - waits[r] < self.group_share * cost)
        if not late:
            return None  # every early arrival was itself waiting elsewhere: the cause is not among them
        waiting = [r for r in waits if r not in late]
        if not waiting:
            return None  # everyone waited alike: no one rank held the others up
        cost = statistics.median(waits[r] for r in waiting) - statistics.fmean(waits[r] for r in late)
        compute = {r: compute_times(v) for r, v in values.items()}
        causes: dict[int, str] = {}
        evidence: dict[int, dict[str, float]] = {}
        for r in late:
            excess = {c: compute[r][c] - statistics.median(compute[o][c] for o in waiting) for c in CAUSES}
            cause = max(CAUSES, key=lambda c: excess[c])
            causes[r] = cause if excess[cause] > 0 else "unknown"
            mine = waits[r]
            evidence[r] = {
                "cost_per_iteration_sec": statistics.median(waits[o] for o in waiting) - mine,
                "wait_sec": mine,
                "others_wait_median_sec": statistics.median(waits[o] for o in waiting),
                "others_wait_min_sec": min(waits[o] for o in waiting),
                "interval_sec": interval,
                "cause_excess_sec": excess[cause],
                "explained": excess[cause] / cost if cost > 0 else math.nan,
                **{f"excess_{c}_sec": excess[c] for c in CAUSES},
            }
        return Verdict(step, late, causes, cost, evidence)

    def update(self, step: int, values: Mapping[int, Mapping[str, float]],
               window_iterations: int = 0) -> tuple[list[Finding], Verdict | None]:
        """Feed one exchanged window; returns the findings that start or end with it, and the window's verdict."""
        verdict = self.analyse(step, values)
        flagged: dict[tuple[int, str], Finding] = {}
        if verdict is not None:
            threshold = 1 / (1 - self.min_share)
            for r in verdict.late:
                ev = dict(verdict.evidence[r])
                per = ev["cost_per_iteration_sec"]
                ev["cost_sec"] = per * window_iterations
                ev["window_iterations"] = float(window_iterations)
                interval = ev["interval_sec"]
                score = interval / (interval - per) if interval > per > 0 else math.inf
                flagged[(r, verdict.causes[r])] = Finding(r, verdict.causes[r], "late", score, threshold, step,
                                                          ev["others_wait_median_sec"], ev["wait_sec"], evidence=ev)
        def ended(old: Finding) -> Finding:
            now = values.get(old.rank, {}).get("comm_wait", math.nan)
            return Finding(old.rank, old.phase, old.kind, math.nan, old.threshold, step, old.reference, float(now),
                           ended=True)

        return self._episodes.update(flagged, ended), verdict
