""""Got slower at step N": change points in the job's iteration time, and slow single iterations.

**The series**, one point per step at which ranks reported (warm-up windows left out): the iteration time (the
median over ranks of each window's mean) and, when the windows carry the process's CPU figures (``cpu_time_sec``,
``cpu_wait_sec``: Linux, training/cpu_wait.py), the *contention* (the share of runnable time spent waiting for a CPU,
``wait / (cpu + wait)``, the largest of the ranks, since data-parallel ranks wait for their most descheduled one) and
the *work* (the median over ranks of CPU seconds per iteration). A window whose wall time is half again its
iterations' (a checkpoint, a validation loop or an evaluation ran inside it) has CPU figures that are not its
iterations': its contention is taken as the run's median. The series searched is the iteration time **net of the
contention** (``time x (1 - contention)``: what it would have been had every runnable thread had a CPU); without CPU
figures, the iteration time itself (and a finding says that a busy machine could not be told apart). The *work* is
searched too, with the same tests: where ranks share cores they wait for a CPU most of their runnable time, and the
net time -- a small remainder of the iteration -- swings with every point of that wait, while the CPU work per
iteration stays steady; a job that computes more per iteration is slower however busy the machine. Where both find
the same steps the net series' episode is the finding; where the net series found only fragments of the work's
episode, the work's is.

**Where it changed.** PELT (``stats.pelt``: optimal partitioning of the log series, a penalty of
``changepoint_penalty x noise variance x log(points)`` per change) splits the series into segments of at least
``slowdown_min_windows`` points: where to cut, not yet a decision. A segment whose median clears the effect needed
over the reference -- the median of every point before it since the start or the end of the previous slowdown (a
short fast stretch is no baseline) -- opens an episode, which lasts while the following segments stay above halfway
between the two levels; leading segments below halfway between the reference and the episode's own level are not its
start (a smaller bump just before a change).

**When it counts** -- every test on the numbers the finding reports (the episode's median over the reference's, on
the series searched; and the iteration time's own ratio over the same steps, which the title gives):

- the effect: at least ``slowdown_effect``, times ``1 + contention_inflation x`` the rise of the contention from the
  reference to the episode (a busier machine also computes slower: caches, memory bandwidth, a hypervisor's steal);
- at least ``slowdown_noise_z`` times the run's own noise: ``exp(z x sigma)``, ``sigma`` the robust scale (MAD) of the
  first differences of the log series -- an erratic run needs a larger change;
- at least ``slowdown_min_added_s`` more per iteration: below a few milliseconds a step's time moves with the
  scheduler's time slices on a shared machine (a 1 ms hiccup is 30% of a 3 ms step);
- persistent: at least ``slowdown_min_windows`` of its points above the halfway mark, and at least
  ``slowdown_min_seconds`` of wall time (its iterations' time): another tenant of a shared machine slows every step
  for a second or so, a burst the guest's own series cannot tell from a change of the job;
- not chance: the shift of the medians in robust standard errors (``stats.median_shift``) has ``p < slowdown_alpha``;
- slower: the iteration time itself grew at least ``slowdown_effect`` over the same steps (where the contention fell,
  a quieter machine, the net series rises while every step got faster).

**Slower, or a busy machine?** An episode of the raw iteration time (the same tests, bar the noise and added-time
floors) that the net series does not confirm is a note, not a finding: ``contention`` (the machine was busy) when
the CPU wait explains it, else ``brief`` (it missed the floors above: too little added time, too short, or within
the run's noise; the note says which). Each slowdown is one finding for the job, with whether the CPU work per
iteration grew (the job computes more) or not (it waits more: I/O, data, a peer, a sleep), and the phases whose time
grew.

**After a checkpoint or a validation.** An episode that starts in or just after a window that ran something else
between its iterations (its wall time half again its iterations': a checkpoint, a validation loop) and ends (the time
goes back) is the aftermath of that work -- cold caches, an asynchronous save still writing -- which recurs at every
save: one ``brief`` note, not findings. A slowdown that starts there and stays is still one.
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

__all__ = ["StepPoint", "job_series", "net_series", "slow_iteration_windows", "slow_iterations", "slowdowns"]

PHASES = ("dataloader", "h2d", "forward", "backward", "optimizer", "zero_grad")
SPREAD_FLOOR = 0.01  # the spread of window medians is taken as at least 1% of the level (timer and rounding jitter)
MAX_POINTS = 1000  # longer series are reduced to this many blocks of consecutive points (PELT's cost)
# the series an episode was found on (a finding says which)
NET_BASIS = "net of the CPU wait (the time its threads waited for a CPU)"
WORK_BASIS = "the CPU work per iteration"


@dataclass(frozen=True)
class StepPoint:
    """The ranks' windows ending at one step (or a block of steps), reduced to one observation."""

    step: int
    first_step: int
    raw: float  # median over ranks of the window mean iteration time
    work: float | None  # median over ranks of CPU seconds per iteration (None: no CPU figures)
    contention: float | None  # the largest share of runnable time a rank spent waiting for a CPU
    phases: dict[str, float] = field(default_factory=dict)  # phase -> median over ranks
    by_rank: dict[int, float] = field(default_factory=dict)
    phase_total: float | None = None  # median over ranks of the iteration time on the phases' clock
    phase_clock: str = "host"  # "device" when a rank's phases are device times (WindowPoint.phase_clock)
    outside: bool = False  # a rank's window ran something else between its iterations (a checkpoint, a validation)


def _window_contention(w: WindowPoint) -> float | None:
    """The window's contention, unless its CPU figures cover more than its iterations (``ran_outside``: their CPU
    and sleep are not the iterations')."""
    return None if w.ran_outside else w.wait_fraction


def job_series(windows: Sequence[WindowPoint]) -> list[StepPoint]:
    by_step: dict[int, list[WindowPoint]] = {}
    for w in windows:
        if not w.warmup:
            by_step.setdefault(w.step, []).append(w)
    points = []
    for step in sorted(by_step):
        ws = by_step[step]
        known = [s for s in map(_window_contention, ws) if s is not None]
        work = [w.cpu_seconds / max(w.iterations, 1) for w in ws if w.cpu_seconds is not None]
        phases = {}
        for phase in PHASES:
            values = [w.phases[phase] for w in ws if phase in w.phases]
            if values:
                phases[phase] = median(values)
        points.append(StepPoint(
            step=step, first_step=min(w.first_step for w in ws), raw=median([w.iteration_time for w in ws]),
            work=median(work) if len(work) == len(ws) and len(known) == len(ws) else None,
            contention=max(known) if len(known) == len(ws) else None, phases=phases,
            by_rank={w.rank: w.iteration_time for w in ws}, phase_total=median([w.phase_total for w in ws]),
            phase_clock="device" if any(w.phase_clock == "device" for w in ws) else "host",
            outside=any(w.ran_outside for w in ws)))
    return _reduce(points)


def _reduce(points: list[StepPoint]) -> list[StepPoint]:
    """At most ``MAX_POINTS`` points: consecutive points merged into blocks (medians), the change points then found to
    within a block."""
    if len(points) <= MAX_POINTS:
        return points
    size = math.ceil(len(points) / MAX_POINTS)
    out = []
    for i in range(0, len(points), size):
        block = points[i:i + size]
        works = [p.work for p in block if p.work is not None]
        shares = [p.contention for p in block if p.contention is not None]
        phases = {ph: median([p.phases[ph] for p in block if ph in p.phases])
                  for ph in {ph for p in block for ph in p.phases}}
        ranks = {r for p in block for r in p.by_rank}
        out.append(StepPoint(
            step=block[-1].step, first_step=block[0].first_step, raw=median([p.raw for p in block]),
            work=median(works) if len(works) == len(block) else None,
            contention=median(shares) if len(shares) == len(block) else None, phases=phases,
            by_rank={r: median([p.by_rank[r] for p in block if r in p.by_rank]) for r in ranks},
            phase_total=median([p.phase_total if p.phase_total is not None else p.raw for p in block]),
            phase_clock="device" if any(p.phase_clock == "device" for p in block) else "host",
            outside=any(p.outside for p in block)))
    return out


@dataclass(frozen=True)
class _Episode:
    start: int  # index of the first slow point
    end: int  # index after the last slow point
    before: int  # index of the first point of the reference (the start, or the end of the previous slowdown)
    ratio: float  # level / reference on the series searched: what the floors test (the title: the raw ratio)
    p: float
    level: float  # the episode's median of the series searched
    reference: float  # the reference's median of the same series
    needed: float  # the effect it had to clear


def _median_of(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return median(known) if known else None


def _rise(points: Sequence[StepPoint], before: tuple[int, int], after: tuple[int, int]) -> float:
    """How much the median contention rose from one stretch to the other (0 when it fell or is unknown)."""
    b = _median_of([p.contention for p in points[before[0]:before[1]]])
    a = _median_of([p.contention for p in points[after[0]:after[1]]])
    return max((a or 0.0) - (b or 0.0), 0.0)


def net_series(points: Sequence[StepPoint]) -> list[float] | None:
    """The iteration time net of the contention, ``time x (1 - contention)``; a point without a contention of its own
    (a checkpoint in its window) takes the run's median. None when fewer than half the points have one."""
    known = [p.contention for p in points if p.contention is not None]
    if len(known) < len(points) / 2 or not known:
        return None
    typical = median(known)
    return [p.raw * (1 - (p.contention if p.contention is not None else typical)) for p in points]


def work_series(points: Sequence[StepPoint]) -> list[float] | None:
    """The CPU work per iteration (the median over ranks of CPU seconds per iteration); a point without it of its own
    (a checkpoint in its window: its CPU is not its iterations') takes the run's median. None when fewer than half
    the points have it."""
    known = [p.work for p in points if p.work is not None]
    if len(known) < len(points) / 2 or not known or median(known) <= 0:
        return None
    typical = median(known)
    return [p.work if p.work is not None else typical for p in points]


def _wall_seconds(points: Sequence[StepPoint], start: int, end: int) -> float:
    """The iterations' time of ``points[start:end]``: each point's mean iteration time x the steps it covers."""
    total = 0.0
    for k in range(start, end):
        p = points[k]
        since = points[k - 1].step if k > 0 else p.first_step - 1
        total += max(p.step - since, 1) * p.raw
    return total


def _episodes(series: Sequence[float], points: Sequence[StepPoint], th: Thresholds, *,
              floors: bool = True) -> list[_Episode]:
    """The episodes of ``series`` that count (see the module docstring); ``floors=False`` leaves out the noise,
    added-time and duration floors (the raw series' episodes, for the busy-machine notes)."""
    n = len(series)
    if n < 2 * th.slowdown_min_windows:  # no reference and episode of that many points each
        return []
    logs = [math.log(max(v, 1e-12)) for v in series]
    sigma = max(noise_scale(logs), SPREAD_FLOOR)
    cuts = pelt(logs, min_size=th.slowdown_min_windows, penalty=th.changepoint_penalty * sigma ** 2 * math.log(n))
    bounds = [0, *cuts, n]
    segs = list(itertools.pairwise(bounds))
    levels = [median(series[a:b]) for a, b in segs]
    noise_effect = math.exp(th.slowdown_noise_z * sigma) if floors else 1.0
    min_added = th.slowdown_min_added_s if floors else 0.0
    min_seconds = th.slowdown_min_seconds if floors else 0.0

    def needed(origin: int, first: int, last: int) -> float:
        rise = _rise(points, (origin, segs[first][0]), (segs[first][0], segs[last][1]))
        return max(th.slowdown_effect * (1 + th.contention_inflation * rise), noise_effect)

    found = []
    origin = 0  # the reference is everything since the start, or since the last slowdown ended
    i = 1
    while i < len(segs):
        before = series[origin:segs[i][0]]
        if len(before) < th.slowdown_min_windows:
            i += 1
            continue
        reference = median(before)
        if not (reference > 0 and levels[i] >= needed(origin, i, i) * reference):
            i += 1
            continue
        halfway = reference + (levels[i] - reference) / 2
        j = i
        while j + 1 < len(segs) and levels[j + 1] >= halfway:
            j += 1
        # a smaller bump just before the change is not its start: leading segments below halfway to the episode's
        # own level join the reference
        first = i
        while first < j and levels[first] < reference + (median(series[segs[first][0]:segs[j][1]]) - reference) / 2:
            first += 1
        before = series[origin:segs[first][0]]
        reference = median(before)
        slow = series[segs[first][0]:segs[j][1]]
        level = median(slow)
        effect = needed(origin, first, j)
        _, p = median_shift(before, slow, floor=SPREAD_FLOOR * reference)
        halfway = reference + (level - reference) / 2
        high = sum(v >= halfway for v in slow)  # patience: that many windows really were slow
        if (level >= effect * reference and level - reference >= min_added and p < th.slowdown_alpha
                and high >= th.slowdown_min_windows
                and _wall_seconds(points, segs[first][0], segs[j][1]) >= min_seconds):
            found.append(_Episode(segs[first][0], segs[j][1], origin, level / reference, p, level, reference,
                                  effect))
            origin = segs[j][1]
        i = j + 1
    return found


def _added_by_phase(points: Sequence[StepPoint], ep: _Episode) -> list[tuple[str, float]]:
    before, slow = points[ep.before:ep.start], points[ep.start:ep.end]
    added = []
    for phase in (*PHASES, "other"):
        def value(p: StepPoint, phase: str = phase) -> float | None:
            if phase == "other":
                total = p.phase_total if p.phase_total is not None else p.raw
                return total - sum(p.phases.values()) if p.phases else None
            return p.phases.get(phase)
        b = [v for v in map(value, before) if v is not None]
        s = [v for v in map(value, slow) if v is not None]
        if b and s:
            added.append((phase, median(s) - median(b)))
    return sorted(((ph, d) for ph, d in added if d > 0), key=lambda x: -x[1])


def _ratio(points: Sequence[StepPoint], ep: _Episode, get: str) -> float | None:
    b = _median_of([getattr(p, get) for p in points[ep.before:ep.start]])
    a = _median_of([getattr(p, get) for p in points[ep.start:ep.end]])
    return a / b if a is not None and b else None


def slowdowns(windows: Sequence[WindowPoint], th: Thresholds) -> tuple[list[Finding], list[Note]]:
    points = job_series(windows)
    if len(points) < 2 * th.slowdown_min_windows:
        return [], []
    ranks = sorted({r for p in points for r in p.by_rank})
    raw = [p.raw for p in points]
    net = net_series(points)
    if net is None:
        eps = _episodes(raw, points, th)
        after = [ep for ep in eps if _aftermath(points, ep)]
        return ([_finding(points, ep, ranks, th, net=False) for ep in eps if ep not in after],
                [_aftermath_note(points, after)] if after else [])
    # a slowdown is slower: the iteration time itself must have grown too (net of a wait that fell, a quieter machine
    # makes the net series rise while every step got faster)
    found = [(ep, NET_BASIS) for ep in _episodes(net, points, th)
             if (_ratio(points, ep, "raw") or 0.0) >= th.slowdown_effect]
    work = work_series(points)
    for ep in _episodes(work, points, th) if work is not None else []:
        # the job computes more per iteration: slower however busy the machine, where the net series (the time less
        # a large wait) is too noisy to tell -- ranks sharing cores wait most of their runnable time, and a few
        # points of it more or less swing the net time far more than the work. Where both series find the same
        # steps, the net series' episode stands; where the net series found only fragments of the work's, the
        # work's replaces them.
        if (_ratio(points, ep, "raw") or 0.0) < th.slowdown_effect:
            continue
        overlapping = [f for f in found if f[0].start < ep.end and ep.start < f[0].end]
        if sum(f[0].end - f[0].start for f in overlapping) < ep.end - ep.start:
            found = [f for f in found if f not in overlapping] + [(ep, WORK_BASIS)]
    found.sort(key=lambda f: f[0].start)
    taken = {i for ep, _ in found for i in range(ep.start, ep.end)}
    after = [ep for ep, _ in found if _aftermath(points, ep)]
    found = [f for f in found if f[0] not in after]
    findings = [_finding(points, ep, ranks, th, net=True, basis=basis) for ep, basis in found]
    notes = [_aftermath_note(points, after)] if after else []
    for ep in _episodes(raw, points, th, floors=False):
        span = range(ep.start, ep.end)
        if sum(i in taken for i in span) >= len(span) / 2:
            continue
        first, last = points[ep.start].first_step, points[ep.end - 1].step
        cb = _median_of([p.contention for p in points[ep.before:ep.start]]) or 0.0
        cd = _median_of([p.contention for p in points[ep.start:ep.end]]) or 0.0
        net_ratio = median(net[ep.start:ep.end]) / max(median(net[ep.before:ep.start]), 1e-12)
        change = f"iteration time {ep.ratio:.2f}x ({seconds(ep.reference)} -> {seconds(ep.level)})"
        rise = _rise(points, (ep.before, ep.start), (ep.start, ep.end))
        if net_ratio >= th.slowdown_effect * (1 + th.contention_inflation * rise):
            # the busier machine explains none of it: the floors kept it from a finding
            notes.append(Note("brief", f"a brief slowdown at steps {first}..{last}: {change}, net of the CPU wait "
                                       f"{net_ratio:.2f}x; {_below_floors(points, ep, net, th)}: not counted as a "
                                       "finding", Evidence(
                effect=ep.ratio, confidence=1 - ep.p, steps=(first, last), value=ep.level, reference=ep.reference,
                windows=ep.end - ep.start, test="change point on iteration times")))
            continue
        notes.append(Note("contention", (
            f"the machine was busy at steps {first}..{last}: {change} while the ranks' threads waited for a CPU "
            f"{cd:.0%} of their runnable time (against {cb:.0%} before); net of that wait {net_ratio:.2f}x: not "
            "counted as a finding"),
            Evidence(effect=ep.ratio, confidence=1 - ep.p, steps=(first, last), value=ep.level,
                     reference=ep.reference, windows=ep.end - ep.start, test="change point on iteration times",
                     notes=(f"net of the CPU wait {net_ratio:.2f}x",))))
    return findings, notes


def _aftermath(points: Sequence[StepPoint], ep: _Episode) -> bool:
    """A slowdown that starts in or just after a window that ran a checkpoint or a validation, and ends (the time went
    back): the iterations after a save or an evaluation run slower for a while (cold caches, an asynchronous save
    still writing, the allocator), periodically -- the work between iterations, not a slowdown of the job."""
    return ep.end < len(points) and any(points[k].outside for k in (ep.start - 1, ep.start) if k >= 0)


def _aftermath_note(points: Sequence[StepPoint], eps: list[_Episode]) -> Note:
    where = ", ".join(f"{points[ep.start].first_step}..{points[ep.end - 1].step}" for ep in eps[:6])
    worst = max(eps, key=lambda ep: ep.ratio)
    return Note("brief", (
        f"slower for a while after {len(eps)} checkpoint(s) or validation(s) (steps {where}"
        f"{', ...' if len(eps) > 6 else ''}): up to {worst.ratio:.2f}x ({seconds(worst.reference)} -> "
        f"{seconds(worst.level)}), then back: the work between iterations leaves them slower (cold caches, an "
        "asynchronous save still writing), not counted as a finding; compare shows the checkpoints' cost"),
        Evidence(effect=worst.ratio, confidence=1 - worst.p, steps=(points[eps[0].start].first_step,
                                                                     points[eps[-1].end - 1].step),
                 value=worst.level, reference=worst.reference, windows=sum(ep.end - ep.start for ep in eps),
                 test="change point on iteration times"))


def _below_floors(points: Sequence[StepPoint], ep: _Episode, net: Sequence[float], th: Thresholds) -> str:
    """Which of a finding's floors an episode of the raw series missed (the busy-machine notes' other case)."""
    missed = []
    if ep.level - ep.reference < th.slowdown_min_added_s:
        missed.append(f"{seconds(ep.level - ep.reference)} more per iteration (a finding needs "
                      f"{seconds(th.slowdown_min_added_s)})")
    wall = _wall_seconds(points, ep.start, ep.end)
    if wall < th.slowdown_min_seconds:
        missed.append(f"{seconds(wall)} of iterations (a finding needs {seconds(th.slowdown_min_seconds)})")
    if not missed:
        sigma = max(noise_scale([math.log(max(v, 1e-12)) for v in net]), SPREAD_FLOOR)
        missed.append(f"within the run's own noise (a finding needs {math.exp(th.slowdown_noise_z * sigma):.2f}x)")
    return "; ".join(missed)


def _finding(points: Sequence[StepPoint], ep: _Episode, ranks: list[int], th: Thresholds, *, net: bool,
             basis: str = NET_BASIS) -> Finding:
    """``net``: the series searched was the iteration time net of the contention, or ``basis`` says which (else the
    iteration time: no CPU figures). The effect in the title and the evidence is the one tested."""
    first, last = points[ep.start].first_step, points[ep.end - 1].step
    until = "the end of the run" if ep.end == len(points) else f"step {last}"
    before_t = median([p.raw for p in points[ep.before:ep.start]])
    during_t = median([p.raw for p in points[ep.start:ep.end]])
    time_ratio = during_t / before_t if before_t > 0 else ep.ratio
    slow_ranks = []
    for r in ranks:
        before = [p.by_rank[r] for p in points[ep.before:ep.start] if r in p.by_rank]
        during = [p.by_rank[r] for p in points[ep.start:ep.end] if r in p.by_rank]
        if before and during and median(during) >= min(th.slowdown_effect, time_ratio) * median(before) * 0.9:
            slow_ranks.append(r)
    where = ("" if len(ranks) < 2 else " on every rank (job-wide)" if slow_ranks == ranks
             else f" on rank(s) {ranges(slow_ranks)}")
    added = _added_by_phase(points, ep)
    total = sum(d for _, d in added)
    split = ", ".join(f"{ph} +{seconds(d)}" for ph, d in added[:5])
    if split and any(p.phase_clock == "device" for p in points[ep.before:ep.end]):
        split += " (device time)"
    spread = (" (spread over phases)" if added and total > 0 and added[0][1] < 0.6 * total else "")
    work_ratio = _ratio(points, ep, "work")
    if not net:
        why = "; no CPU figures in this run: a busy machine could not be told apart"
        tested = ""
    else:
        tested = (f"; {basis} {seconds(ep.reference)} -> {seconds(ep.level)}, {ep.ratio:.2f}x (at least "
                  f"{ep.needed:.2f}x needed)")
        why = ("; the job computes more per iteration" if basis == WORK_BASIS else
               f"; the CPU work per iteration grew {work_ratio:.2f}x" if work_ratio and work_ratio >= th.slowdown_effect
               else "; the time outside computation grew (I/O, data, a peer, a sleep), not the CPU work")
    effect = time_ratio if net else ep.ratio  # both tested: the iteration time's (>= slowdown_effect), and the net's
    detail = (f"the iteration time went from {seconds(before_t)} to {seconds(during_t)} ({time_ratio:.2f}x) at step "
              f"{first}{where}, until {until}{tested}"
              + (f"; added per iteration: {split}{spread}" if split else "") + f"{why} (p={ep.p:.1g})")
    title = f"slowdown: {effect:.2f}x from step {first}" + ("" if ep.end == len(points) else f" to {last}")
    phase = added[0][0] if added else None
    return Finding("warning", "slowdown", title, detail, Evidence(
        effect=effect, confidence=1 - ep.p, steps=(first, last), ranks=tuple(slow_ranks or ranks), phase=phase,
        value=during_t, reference=before_t, windows=ep.end - ep.start,
        test=_test_text(net, basis),
        notes=(*(f"{ph} +{seconds(d)}" for ph, d in added),
               *((f"{basis.split(' (')[0]} {ep.ratio:.2f}x (at least {ep.needed:.2f}x needed)",) if net else ()))))


def _test_text(net: bool, basis: str) -> str:
    if not net:
        return "change points (PELT) and a shift of medians on the iteration time"
    searched = "the iteration time net of the CPU wait" if basis == NET_BASIS else basis
    return f"change points (PELT) and a shift of medians on {searched}, and the iteration time's own ratio"


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
