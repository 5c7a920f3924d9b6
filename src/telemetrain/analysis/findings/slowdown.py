""""Got slower at step N": change points in the job's iteration time, and slow single iterations.

**The series.** For each step at which ranks reported, the median over ranks of the window's mean iteration time
(warm-up windows left out). When the windows carry the process's CPU time and wait (``cpu_time_sec``,
``cpu_wait_sec``, Linux), that time is first reduced by the share of the runnable time spent waiting for a CPU --
the largest share of the ranks: data-parallel ranks step together, so a job waits for its most descheduled rank. A
machine that got busy is not a job that got slower.

**The rule.** PELT (``stats.pelt``: optimal partitioning of the log series, a penalty of ``changepoint_penalty x
noise variance x log(windows)`` per change, the noise from the first differences) splits the series into segments
of at least ``slowdown_min_windows`` windows: where to cut, not yet a decision. A segment whose median is at least
``slowdown_effect`` times the reference -- the median of every window before it since the start of the run or the
end of the previous slowdown (not just the segment before: a short fast stretch is no baseline) -- opens a slowdown;
it lasts while the following segments stay above halfway between the two levels. It is reported when at least
``slowdown_min_windows`` of its windows are above that halfway mark and the shift of the medians, in robust standard
errors (``stats.median_shift``), gives
``p < slowdown_alpha``. The threshold grows with the machine's contention: ``slowdown_effect x (1 +
contention_inflation x`` the rise in the share of runnable time spent waiting for a CPU ``)``, because a process
also runs slower on a busier CPU (shared caches and memory bandwidth), which the wait does not capture.
Each slowdown is reported once for the job, with the phases whose time grew; where the busy-free series shows no
slowdown but the raw one does, a ``contention`` note says so instead.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .fmt import ranges, seconds
from .inputs import WindowPoint
from .model import Evidence, Finding, Note
from .stats import median, median_shift, noise_scale, pelt
from .thresholds import Thresholds

__all__ = ["StepPoint", "job_series", "slow_iteration_windows", "slow_iterations", "slowdowns"]

PHASES = ("dataloader", "forward", "backward", "optimizer", "zero_grad")
SPREAD_FLOOR = 0.01  # the spread of window medians is taken as at least 1% of the level (timer and rounding jitter)


@dataclass(frozen=True)
class StepPoint:
    """The ranks' windows ending at one step, reduced to one observation."""

    step: int
    first_step: int
    raw: float  # median over ranks of the window mean
    busy_free: float | None  # the same with the contention taken out (None: no wait figures)
    wait_fraction: float | None  # the largest contention share of the ranks (the one the others wait for)
    phases: dict[str, float] = field(default_factory=dict)  # phase -> median over ranks
    by_rank: dict[int, float] = field(default_factory=dict)


def job_series(windows: Sequence[WindowPoint]) -> list[StepPoint]:
    by_step: dict[int, list[WindowPoint]] = {}
    for w in windows:
        if not w.warmup:
            by_step.setdefault(w.step, []).append(w)
    points = []
    for step in sorted(by_step):
        ws = by_step[step]
        waits = [w.wait_fraction for w in ws]
        known = [f for f in waits if f is not None]
        phases = {}
        for phase in PHASES:
            values = [w.phases[phase] for w in ws if phase in w.phases]
            if values:
                phases[phase] = median(values)
        raw = median([w.iteration_time for w in ws])
        # ranks step together: the job waits for its most contended rank, so its share is the job's
        share = max(known) if len(known) == len(ws) else None
        points.append(StepPoint(
            step=step, first_step=min(w.first_step for w in ws), raw=raw,
            busy_free=raw * (1 - share) if share is not None else None, wait_fraction=share, phases=phases,
            by_rank={w.rank: w.iteration_time for w in ws}))
    return points


@dataclass(frozen=True)
class _Episode:
    start: int  # index of the first slow point
    end: int  # index after the last slow point
    before: int  # index of the first point of the reference (the start, or the end of the previous slowdown)
    ratio: float
    p: float
    level: float
    reference: float


def _episodes(series: Sequence[float], waits: Sequence[float | None], th: Thresholds) -> list[_Episode]:
    n = len(series)
    logs = [math.log(max(v, 1e-12)) for v in series]
    sigma = max(noise_scale(logs), SPREAD_FLOOR)
    cuts = pelt(logs, min_size=th.slowdown_min_windows, penalty=th.changepoint_penalty * sigma ** 2 * math.log(n))
    bounds = [0, *cuts, n]
    segs = list(itertools.pairwise(bounds))
    levels = [median(series[a:b]) for a, b in segs]
    found = []
    origin = 0  # the reference is everything since the start, or since the last slowdown ended
    i = 1
    while i < len(segs):
        before = series[origin:segs[i][0]]
        if len(before) < th.slowdown_min_windows:
            i += 1
            continue
        reference = median(before)
        effect = th.slowdown_effect * _allowance(waits, (origin, segs[i][0]), segs[i], th)
        if reference > 0 and levels[i] >= effect * reference:
            halfway = reference + (levels[i] - reference) / 2
            j = i
            while j + 1 < len(segs) and levels[j + 1] >= halfway:
                j += 1
            slow = series[segs[i][0]:segs[j][1]]
            level = median(slow)
            _, p = median_shift(before, slow, floor=SPREAD_FLOOR * reference)
            high = sum(v >= halfway for v in slow)  # patience: that many windows really were slow
            if level >= effect * reference and p < th.slowdown_alpha and high >= th.slowdown_min_windows:
                found.append(_Episode(segs[i][0], segs[j][1], origin, level / reference, p, level, reference))
                origin = segs[j][1]
            i = j + 1
        else:
            i += 1
    return found


def _allowance(waits: Sequence[float | None], before: tuple[int, int], after: tuple[int, int],
               th: Thresholds) -> float:
    """How much more a slowdown must be when the machine got busier between two segments: a process also runs
    slower *on* the CPU then (shared caches, memory bandwidth, SMT siblings), which the CPU wait does not capture;
    ``1 + contention_inflation x`` the rise in the share of time waiting for a CPU."""
    b = [w for w in waits[before[0]:before[1]] if w is not None]
    a = [w for w in waits[after[0]:after[1]] if w is not None]
    if not a or not b:
        return 1.0
    return 1.0 + th.contention_inflation * max(median(a) - median(b), 0.0)


def _added_by_phase(points: Sequence[StepPoint], ep: _Episode) -> list[tuple[str, float]]:
    before, slow = points[ep.before:ep.start], points[ep.start:ep.end]
    added = []
    for phase in (*PHASES, "other"):
        def value(p: StepPoint, phase: str = phase) -> float | None:
            if phase == "other":
                return p.raw - sum(p.phases.values()) if p.phases else None
            return p.phases.get(phase)
        b = [v for v in map(value, before) if v is not None]
        s = [v for v in map(value, slow) if v is not None]
        if b and s:
            added.append((phase, median(s) - median(b)))
    return sorted(((ph, d) for ph, d in added if d > 0), key=lambda x: -x[1])


def slowdowns(windows: Sequence[WindowPoint], th: Thresholds) -> tuple[list[Finding], list[Note]]:
    points = job_series(windows)
    if len(points) < 2 * th.slowdown_min_windows:
        return [], []
    use_busy_free = sum(p.busy_free is not None for p in points) >= len(points) / 2
    series = [p.busy_free if use_busy_free and p.busy_free is not None else p.raw for p in points]
    findings = []
    ranks = sorted({r for p in points for r in p.by_rank})
    waits = [p.wait_fraction for p in points]
    episodes = _episodes(series, waits, th)
    for ep in episodes:
        findings.append(_finding(points, ep, ranks, use_busy_free, th))
    notes = []
    if use_busy_free:
        slow_steps = {i for ep in episodes for i in range(ep.start, ep.end)}
        for ep in _episodes([p.raw for p in points], [None] * len(points), th):
            span = range(ep.start, ep.end)
            if sum(i in slow_steps for i in span) >= len(span) / 2:
                continue
            before = [points[i].wait_fraction for i in range(ep.before, ep.start)]
            during = [points[i].wait_fraction for i in span]
            wb = median([w for w in before if w is not None] or [0.0])
            wd = median([w for w in during if w is not None] or [0.0])
            first, last = points[ep.start].first_step, points[ep.end - 1].step
            notes.append(Note("contention", (
                f"the machine was busy at steps {first}..{last}: iteration time {ep.ratio:.2f}x "
                f"({seconds(ep.reference)} -> {seconds(ep.level)}), while its threads waited for a CPU {wd:.0%} of "
                f"their runnable time (against {wb:.0%} before); with that wait taken out it did not slow down, so "
                "this is not counted as a finding"),
                Evidence(effect=ep.ratio, confidence=1 - ep.p, steps=(first, last), value=ep.level,
                         reference=ep.reference, windows=ep.end - ep.start, test="change point on raw times")))
    return findings, notes


def _finding(points: Sequence[StepPoint], ep: _Episode, ranks: list[int], busy_free: bool,
             th: Thresholds) -> Finding:
    first, last = points[ep.start].first_step, points[ep.end - 1].step
    until = "the end of the run" if ep.end == len(points) else f"step {last}"
    slow_ranks = []
    for r in ranks:
        before = [p.by_rank[r] for p in points[ep.before:ep.start] if r in p.by_rank]
        during = [p.by_rank[r] for p in points[ep.start:ep.end] if r in p.by_rank]
        if before and during and median(during) >= th.slowdown_effect * median(before):
            slow_ranks.append(r)
    where = ("" if len(ranks) < 2 else " on every rank (job-wide)" if slow_ranks == ranks
             else f" on rank(s) {ranges(slow_ranks)}")
    added = _added_by_phase(points, ep)
    total = sum(d for _, d in added)
    split = ", ".join(f"{ph} +{seconds(d)}" for ph, d in added[:5])
    spread = (" (spread over phases)" if added and total > 0 and added[0][1] < 0.6 * total else "")
    busy = "; CPU wait taken out" if busy_free else "; no CPU-wait figures: a busy machine could not be told apart"
    detail = (f"the iteration time went from {seconds(ep.reference)} to {seconds(ep.level)} ({ep.ratio:.2f}x) at "
              f"step {first}{where}, until {until}"
              + (f"; added per iteration: {split}{spread}" if split else "")
              + f" (median of each window's mean over ranks{busy}; p={ep.p:.1g})")
    title = f"slowdown: {ep.ratio:.2f}x from step {first}" + ("" if ep.end == len(points) else f" to {last}")
    phase = added[0][0] if added else None
    return Finding("warning", "slowdown", title, detail, Evidence(
        effect=ep.ratio, confidence=1 - ep.p, steps=(first, last), ranks=tuple(slow_ranks or ranks), phase=phase,
        value=ep.level, reference=ep.reference, windows=ep.end - ep.start,
        test="change point (Pettitt segmentation), shift of medians" + (", busy-free" if busy_free else ""),
        notes=tuple(f"{ph} +{seconds(d)}" for ph, d in added)))


def _slow_iteration_hits(windows: Sequence[WindowPoint], th: Thresholds) -> tuple[list[tuple[WindowPoint, float]],
                                                                                  list[WindowPoint]]:
    by_rank: dict[int, list[WindowPoint]] = {}
    for w in windows:
        if not w.warmup:
            by_rank.setdefault(w.rank, []).append(w)
    hits: list[tuple[WindowPoint, float]] = []
    busy: list[WindowPoint] = []
    for ws in by_rank.values():
        typical = median([w.p50 if w.p50 is not None else w.iteration_time for w in ws])
        for w in ws:
            if w.max_iteration_time is None or typical <= 0:
                continue
            excess = w.max_iteration_time - typical
            if w.max_iteration_time >= th.slow_iteration_factor * typical and excess >= th.slow_iteration_min_s:
                if w.cpu_wait_seconds is not None and w.cpu_wait_seconds >= th.contention_share * excess:
                    busy.append(w)
                else:
                    hits.append((w, typical))
    return hits, busy


def slow_iteration_windows(windows: Sequence[WindowPoint], thresholds: Thresholds | None = None) -> list[WindowPoint]:
    """The windows ``slow_iterations`` names (for a chart's markers)."""
    from .thresholds import DEFAULT_THRESHOLDS

    return [w for w, _ in _slow_iteration_hits(windows, thresholds or DEFAULT_THRESHOLDS)[0]]


def slow_iterations(windows: Sequence[WindowPoint], th: Thresholds) -> tuple[list[Finding], list[Note]]:
    """Windows whose slowest iteration took ``slow_iteration_factor`` times the rank's median and at least
    ``slow_iteration_min_s`` more: a stall inside one iteration (a GC pause, a slow shard, a hung read). A window
    whose CPU wait covers half the excess is a busy machine: a note."""
    hits, busy = _slow_iteration_hits(windows, th)
    findings = []
    if hits:
        worst, typical = max(hits, key=lambda h: h[0].max_iteration_time or 0.0)
        assert worst.max_iteration_time is not None
        steps = sorted(w.step for w, _ in hits)
        findings.append(Finding(
            "warning", "slow iterations", f"slow iterations: {len(hits)} window(s)",
            f"windows whose slowest iteration took >= {th.slow_iteration_factor:g}x the rank's median and "
            f"{seconds(th.slow_iteration_min_s)} more; worst: {seconds(worst.max_iteration_time)} on rank "
            f"{worst.rank} in the window ending at step {worst.step} (median {seconds(typical)})",
            Evidence(effect=worst.max_iteration_time / typical, steps=(steps[0], steps[-1]),
                     ranks=tuple(sorted({w.rank for w, _ in hits})), value=worst.max_iteration_time,
                     reference=typical, windows=len(hits), test="max iteration against the rank's median p50")))
    notes = [Note("contention", f"slow iterations in {len(busy)} window(s) (steps {ranges([w.step for w in busy])}) "
                  "came with as much CPU wait: the machine was busy")] if busy else []
    return findings, notes
