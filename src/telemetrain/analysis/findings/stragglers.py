"""Stragglers: a rank slower than the other ranks *in the same window*, in one phase, window after window.

**Per window** (``window_outliers``, also the live cross-rank detector's rule): for each phase (the sub-phases, the
time outside them as ``other``, or the iteration itself when no phase is timed) each rank is compared with the other
ranks of that window, leave-one-out: ``z = (x - median(others)) / max(1.4826 MAD(others), floor x median)``. It is
flagged when ``z >= straggler_z``, ``x / median >= straggler_ratio`` and the excess is at least
``straggler_min_share`` of the window's iteration time and ``straggler_min_added_s``. A job-wide slowdown moves
every rank together and so flags nobody: it is the change-point rule's. With synchronous data parallelism the ranks
waiting for a late one wait in the collective (backward), so *they* look slow there: the comparison is per phase,
and the late rank is the outlier in the phase that made it late.

**Late-rank attribution.** When every rank's wait in the collectives that span every rank is known
(``avg_comm_world_wait_time_sec``: distributed.comm), the rank that waited least there arrived last; if the others
waited at least ``straggler_min_share`` of an iteration longer, it is flagged in the phase where it computed most
more than them (a phase's time less the wait in it, ``avg_<phase>_comm_wait_sec``; ``other``: outside any phase).
This sees what the per-phase comparison cannot: slow compute in the phase that holds the collective, which every rank
leaves together. Its flags join the same episodes and test. Only those waits compare, as in the live attribution
(distributed.late_rank): in a pair's all-reduce or a pipeline's send/recv the rank that waits least waited for its
peers, not for the job (a clean pipeline's last stage always waits least), and a rank that reached the job's
collective late because it had waited for a late peer in its subgroup was held up, not late. Windows without that
figure (runs recorded before it) are not attributed: their whole wait cannot tell a pipeline from a late rank.

**Waiting is not slowness.** A rank whose excess is mostly time waiting in communication (when the windows carry the
ranks' communication wait, ``avg_comm_wait_time_sec``), or whose excess is in a phase that holds the collective
(backward, optimizer) while another rank is flagged in one that does not, was waiting for the late rank: not flagged.

**Busy machine.** A flagged rank whose CPU wait in that window exceeds the others' by ``contention_share`` of its
excess, while its CPU time does not exceed theirs by ``contention_work_share`` of it, was descheduled, not slow: not
flagged (counted in a note); the ranks that waited for it in a sync phase were waiting, not slow, all the same.

**Over windows.** Flags of one (rank, phase) form episodes (flagged windows, gaps of up to ``straggler_gap``); an
episode with at least ``straggler_patience`` flagged windows is tested: over its ``n`` windows, the rank was the
slowest ``k`` times; if ranks were exchangeable some rank would be that often with ``p <= ranks x P(Binomial(n,
1/ranks) >= k)`` (the union bound: every rank is tested); it is a straggler when ``p < straggler_alpha``. Two
episodes of one rank and phase are one when the test still holds over both and the lull between them; episodes of
one rank and phase further apart are still one finding (its test over their windows, the lulls left out). The
episodes of one rank that overlap are one finding, named by its costliest phase; the cost is the excess time summed
over the flagged windows (what the other ranks waited). An episode that starts in or just after a window that ran a
checkpoint or a validation (``WindowPoint.ran_outside``) and ends before the run does is the aftermath of that work
(the rank that wrote the checkpoint runs slower for a while): a note, not a straggler.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .fmt import ranges, seconds
from .inputs import WindowPoint
from .model import Evidence, Finding, Note
from .stats import MAD_TO_SD, binomial_tail, mad, median
from .thresholds import Thresholds

__all__ = ["Outlier", "cpu_descheduled", "stragglers", "window_outliers", "window_phases"]

WORK_PHASES = ("dataloader", "h2d", "forward", "backward", "optimizer", "zero_grad")
SYNC_PHASES = frozenset({"backward", "optimizer"})  # where data-parallel collectives wait (DDP; sharded optimizers)
EXACT_BELOW = 64  # up to this many ranks the others' MAD is computed without the rank itself


@dataclass(frozen=True)
class Outlier:
    rank: int
    phase: str
    z: float
    value: float
    reference: float  # the other ranks' median

    @property
    def ratio(self) -> float:
        return self.value / self.reference if self.reference > 0 else float("inf")


def window_outliers(values: Mapping[int, float], iteration_time: float, phase: str,
                    th: Thresholds) -> list[Outlier]:
    """The ranks flagged in one phase of one window (``values``: rank -> seconds per iteration; ``iteration_time``:
    the window's typical iteration time, for the minimum share)."""
    out: list[Outlier] = []
    n = len(values)
    if n < 2:
        return out
    ordered = sorted(values.values())
    # with many ranks, the others' spread is the spread of all: one rank hardly moves a MAD (exact below that)
    shared_mad = mad(ordered) if n > EXACT_BELOW else None
    # a necessary condition first: without any one rank, the median is at least this
    low = ordered[(n - 2) // 2]
    cut = max(low + max(th.straggler_min_share * iteration_time, th.straggler_min_added_s),
              low * th.straggler_ratio if low > 0 else low)
    for rank, x in values.items():
        if x < cut:
            continue
        reference = _median_without(ordered, x)
        if x - reference < max(th.straggler_min_share * iteration_time, th.straggler_min_added_s) or x <= reference:
            continue
        if shared_mad is None:
            spread = mad([v for r, v in values.items() if r != rank], reference)
        else:
            spread = shared_mad
        scale = max(MAD_TO_SD * spread, th.straggler_scale_floor * reference, 1e-9)
        z = (x - reference) / scale
        if z >= th.straggler_z and (reference <= 0 or x / reference >= th.straggler_ratio):
            out.append(Outlier(rank, phase, z, x, reference))
    return out


def _median_without(ordered: Sequence[float], x: float) -> float:
    """The median of ``ordered`` (sorted) without one occurrence of ``x``: O(log n)."""
    i = bisect.bisect_left(ordered, x)
    m = len(ordered) - 1

    def at(k: int) -> float:  # the k-th of the others
        return ordered[k] if k < i else ordered[k + 1]

    return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2


def window_phases(w: WindowPoint) -> dict[str, float]:
    """The phases a window is compared in: its timed sub-phases and the rest (``other``), or the iteration alone."""
    if not w.phases:
        return {"iteration": w.iteration_time}
    phases = {p: v for p, v in w.phases.items() if p in WORK_PHASES}
    phases["other"] = max(w.phase_total - sum(phases.values()), 0.0)
    return phases


@dataclass
class _Flag:
    index: int  # position of the window among the steps
    outlier: Outlier
    iterations: int
    slowest: bool


def _steps(windows: Sequence[WindowPoint]) -> list[dict[int, WindowPoint]]:
    by_step: dict[int, dict[int, WindowPoint]] = {}
    for w in windows:
        if not w.warmup:
            by_step.setdefault(w.step, {})[w.rank] = w
    return [by_step[s] for s in sorted(by_step) if len(by_step[s]) >= 2]


def stragglers(windows: Sequence[WindowPoint], events: Sequence[Mapping[str, object]], th: Thresholds,
               hosts: Mapping[int, str] | None = None) -> tuple[list[Finding], list[Note]]:
    steps = _steps(windows)
    if not steps:
        return [], _unconfirmed(events, [])
    world = max(len(s) for s in steps)
    flags: dict[tuple[int, str], list[_Flag]] = {}
    busy = 0
    for index, ranks in enumerate(steps):
        typical = median([w.iteration_time for w in ranks.values()])
        per_phase: dict[str, dict[int, float]] = {}
        for rank, w in ranks.items():
            for phase, value in window_phases(w).items():
                per_phase.setdefault(phase, {})[rank] = value
        window_flags: list[tuple[Outlier, bool]] = []
        held_up_by: set[int] = set()  # descheduled ranks: not stragglers, but the others waited for them all the same
        for phase, values in per_phase.items():
            slowest = max(values, key=lambda r: values[r])
            for o in window_outliers(values, typical, phase, th):
                if _descheduled(o, ranks, th):
                    busy += 1
                    if o.phase not in SYNC_PHASES:
                        held_up_by.add(o.rank)
                    continue
                window_flags.append((o, slowest == o.rank))
        confirmed = _not_waiting(window_flags, ranks, th, held_up_by)
        # the rank the others waited for in the job's collectives held them up in this window, whichever rank's phase
        # ran longest (a partner that waited for it in their subgroup can be, by a hair): that counts in its test
        late = {(o.rank, o.phase): o for o in _late(ranks, typical, th)}
        confirmed = [(o, slowest or (o.rank, o.phase) in late) for o, slowest in confirmed]
        seen = {(o.rank, o.phase) for o, _ in confirmed}
        confirmed += [(o, True) for key, o in late.items() if key not in seen]
        for o, slowest_rank in confirmed:
            flags.setdefault((o.rank, o.phase), []).append(_Flag(index, o, ranks[o.rank].iterations, slowest_rank))
    episodes: dict[int, list[tuple[str, list[_Flag], int, float]]] = {}

    def family(k: int, n: int) -> float:
        # any of ``world`` ranks could have been the slowest this often: the union bound over them (at 1,024 ranks
        # "the slowest once in 3 windows" is p = 0.003 for one rank, and some rank of a clean job always is)
        return min(1.0, world * binomial_tail(k, n, 1 / world))

    def test(flagged: list[_Flag]) -> tuple[int, float]:
        n = flagged[-1].index - flagged[0].index + 1
        return n, family(sum(f.slowest for f in flagged), n)

    def aftermath(episode: list[_Flag]) -> bool:
        # it starts in or just after a window that ran a checkpoint or a validation and ends before the run does:
        # that rank's iterations after the work between them (rank 0 wrote the checkpoint), not a straggler
        first, last = episode[0].index, episode[-1].index
        return last + 1 < len(steps) and any(w.ran_outside for k in (first - 1, first) if k >= 0
                                             for w in steps[k].values())

    after: set[int] = set()
    for (rank, phase), fl in flags.items():
        kept: list[list[_Flag]] = []
        for episode in _episodes(fl, th.straggler_gap):
            if len(episode) < th.straggler_patience or test(episode)[1] >= th.straggler_alpha:
                continue
            if aftermath(episode):
                after.add(rank)
                continue
            if kept and test(kept[-1] + episode)[1] < th.straggler_alpha:  # one straggler with a lull inside
                kept[-1] = kept[-1] + episode
            else:
                kept.append(episode)
        if kept:  # one finding per rank and phase: episodes apart are tested over their own windows, not the lull
            flagged = [f for episode in kept for f in episode]
            n = sum(episode[-1].index - episode[0].index + 1 for episode in kept)
            episodes.setdefault(rank, []).append((phase, flagged, n, family(sum(f.slowest for f in flagged), n)))
    findings = []
    for rank, eps in sorted(episodes.items()):
        for group in _overlapping(eps):
            findings.append(_finding(rank, group, steps, events, hosts or {}))
    notes = _unconfirmed(events, findings)
    if after - set(episodes):
        notes.append(Note("brief", f"rank(s) {ranges(sorted(after - set(episodes)))} slower than the other ranks for "
                          "a while after checkpoints or validations, then back: the work between iterations (a rank "
                          "that writes the checkpoint), not counted as stragglers"))
    if busy:
        notes.append(Note("contention", f"{busy} rank-window(s) slower than the other ranks came with as much extra "
                          "CPU wait on that rank (descheduled by a busy machine): not counted as stragglers"))
    return findings, notes


def _compute(w: WindowPoint) -> dict[str, float]:
    """A rank's compute per phase (the phase's time less the communication waited in it) and ``other`` (the
    iteration less the phases and the wait outside them)."""
    waits = w.comm_wait_by_phase
    out = {p: max(v - waits.get(p, 0.0), 0.0) for p, v in w.phases.items() if p in WORK_PHASES}
    outside = max((w.comm_wait or 0.0) - sum(waits.get(p, 0.0) for p in out), 0.0)
    out["other"] = max(w.phase_total - sum(w.phases.get(p, 0.0) for p in out) - outside, 0.0)
    return out


def _late(ranks: Mapping[int, WindowPoint], typical: float, th: Thresholds) -> list[Outlier]:
    """Late-rank attribution from the ranks' waits in the collectives over every rank (``world_wait``), when every
    rank reported its own: the rank that waited least arrived last (the others waited for it); it counts when the
    others waited at least ``straggler_min_share`` of an iteration longer. Ranks within half of that of it are late
    with it, unless their wait elsewhere (a subgroup, a send/recv) covers their lateness: held up by a late peer. Its
    cause is the phase in which it computed the most more than the waiting ranks -- what the per-phase comparison
    cannot see when the slow compute is in the phase that holds the collective (every rank leaves the all-reduce
    together)."""
    waits = {r: w.world_wait for r, w in ranks.items()}
    if len(waits) < 2 or any(v is None for v in waits.values()):
        return []
    known = {r: float(v) for r, v in waits.items() if v is not None}
    first = min(known, key=lambda r: (known[r], r))
    cost = median([v for r, v in known.items() if r != first]) - known[first]
    if cost < max(th.straggler_min_share * typical, th.straggler_min_added_s) or cost <= 0:
        return []
    late = [r for r, v in known.items() if v - known[first] < 0.5 * cost]
    waiting = [r for r in known if r not in late]
    late = [r for r in late if (ranks[r].comm_wait or 0.0) - known[r] < 0.5 * cost]
    if not waiting or not late:
        return []
    compute = {r: _compute(w) for r, w in ranks.items()}
    out = []
    for r in late:
        excess = {c: v - median([compute[o].get(c, 0.0) for o in waiting]) for c, v in compute[r].items()}
        cause = max(excess, key=lambda c: excess[c])
        if excess[cause] > 0:
            reference = median([compute[o].get(cause, 0.0) for o in waiting])
            out.append(Outlier(r, cause, math.inf, compute[r][cause], reference))
    return out


def _not_waiting(flags: list[tuple[Outlier, bool]], ranks: Mapping[int, WindowPoint], th: Thresholds,
                 held_up_by: set[int] | frozenset[int] = frozenset()) -> list[tuple[Outlier, bool]]:
    """Drop the flags of ranks that were waiting for a late one, not late themselves: an excess mostly spent
    waiting in communication (in that phase, when the ranks' waits by phase are known, else in all), or an excess in a
    phase holding the collective (``SYNC_PHASES``) while another rank is flagged in a phase that does not, or was
    slow there but descheduled (``held_up_by``): it is the cause; with two or three ranks the waiting ones stand out
    too."""
    kept = []
    causes = {o.rank for o, _ in flags if o.phase not in SYNC_PHASES} | held_up_by
    waits = {r: w.comm_wait for r, w in ranks.items() if w.comm_wait is not None}
    for o, slowest in flags:
        # the wait in the flagged phase where every rank says it (a partner waiting in its pair's all-reduce waited
        # there, while the others waited elsewhere -- at the job's barrier), else the whole wait
        mine = {r: w.comm_wait_by_phase.get(o.phase, 0.0) for r, w in ranks.items() if w.comm_wait_by_phase} \
            if o.phase != "iteration" and all(w.comm_wait_by_phase for w in ranks.values()) else waits
        if o.rank in mine and len(mine) > 1:
            others = median([v for r, v in mine.items() if r != o.rank])
            if mine[o.rank] - others >= th.contention_share * (o.value - o.reference):
                continue
        if o.phase in SYNC_PHASES and causes - {o.rank}:
            continue
        kept.append((o, slowest))
    return kept


def _cpu_figures(w: WindowPoint, thread: bool) -> tuple[float, float] | None:
    """(CPU wait, CPU time) per iteration of the window: the training thread's (``thread``) or the process's."""
    wait, cpu = (w.thread_cpu_wait_seconds, w.thread_cpu_seconds) if thread else (w.cpu_wait_seconds, w.cpu_seconds)
    if wait is None or cpu is None:
        return None
    n = max(w.iterations, 1)
    return wait / n, cpu / n


def _descheduled(o: Outlier, ranks: Mapping[int, WindowPoint], th: Thresholds) -> bool:
    """``cpu_descheduled`` on the window's figures: the training thread's own when every rank has them
    (training/cpu_wait.py: a rank that sleeps or blocks on I/O every iteration -- a slow data loader -- wakes its
    process's threads each time, and on a busy machine their summed wait grows with the sleeping, the training
    thread's much less), else the process's."""
    thread = all(r.thread_cpu_wait_seconds is not None and r.thread_cpu_seconds is not None for r in ranks.values())
    return cpu_descheduled(o.rank, o.value - o.reference, {r: _cpu_figures(w, thread) for r, w in ranks.items()}, th)


def cpu_descheduled(rank: int, excess: float, figures: Mapping[int, tuple[float, float] | None],
                    th: Thresholds) -> bool:
    """The rank's ``excess`` (seconds per iteration) came from waiting for a CPU, not from doing more: its CPU wait
    per iteration (``figures``: rank -> (CPU wait, CPU time) per iteration, None when unknown) exceeds the other
    ranks' median by ``contention_share`` of the excess, and its CPU time by less than ``contention_work_share`` of
    it. (A rank given more work on an oversubscribed machine waits more too, but it also runs more: a straggler.)
    False when any rank's figures are unknown. The live detector (distributed.stragglers) applies it too."""
    mine = figures.get(rank)
    others = [f for r, f in figures.items() if r != rank]
    if mine is None or not others or any(f is None for f in others):
        return False
    extra_wait = mine[0] - median([f[0] for f in others if f is not None])
    extra_cpu = mine[1] - median([f[1] for f in others if f is not None])
    return extra_wait >= th.contention_share * excess and extra_cpu < th.contention_work_share * excess


def _episodes(flags: list[_Flag], gap: int) -> list[list[_Flag]]:
    out: list[list[_Flag]] = []
    for f in sorted(flags, key=lambda f: f.index):
        if out and f.index - out[-1][-1].index <= gap + 1:
            out[-1].append(f)
        else:
            out.append([f])
    return out


def _overlapping(eps: list[tuple[str, list[_Flag], int, float]]) -> list[list[tuple[str, list[_Flag], int, float]]]:
    groups: list[list[tuple[str, list[_Flag], int, float]]] = []
    for ep in sorted(eps, key=lambda e: e[1][0].index):
        if groups and ep[1][0].index <= max(e[1][-1].index for e in groups[-1]):
            groups[-1].append(ep)
        else:
            groups.append([ep])
    return groups


def _cost(flags: Sequence[_Flag]) -> float:
    return sum((f.outlier.value - f.outlier.reference) * f.iterations for f in flags)


def _finding(rank: int, group: list[tuple[str, list[_Flag], int, float]], steps: list[dict[int, WindowPoint]],
             events: Sequence[Mapping[str, object]], hosts: Mapping[int, str]) -> Finding:
    group = sorted(group, key=lambda e: -_cost(e[1]))
    phase, flags, n, p = group[0]
    first = min(e[1][0].index for e in group)
    last = max(e[1][-1].index for e in group)
    first_step = min(w.first_step for w in steps[first].values())
    last_step = next(iter(steps[last].values())).step  # every rank's window there ends at that step
    ratios = sorted(f.outlier.ratio for f in flags)
    value = median([f.outlier.value for f in flags])
    reference = median([f.outlier.reference for f in flags])
    cost = sum(_cost(e[1]) for e in group)
    host = hosts.get(rank, "")
    phases = [e[0] for e in group]
    lull = flags[-1].index - flags[0].index + 1 - n
    apart = f" (its episodes {lull} window(s) apart, those not counted)" if lull > 0 else ""
    also = [f"also {ph} ({len(fl)} window(s), {seconds(_cost(fl))})" for ph, fl, _, _ in group[1:]]
    notes = list(also)
    confirmed = _matching(events, rank, set(phases), steps[first], steps[last])
    if confirmed:
        notes.append(f"the live cross-rank detector reported it too ({confirmed} event(s))")
    comm = _comm_evidence(rank, steps[first:last + 1])
    if comm:
        notes.append(comm)
    clock = " (device time)" if any(w.phase_clock == "device" for ranks in steps[first:last + 1]
                                    for w in ranks.values()) and phase != "iteration" else ""
    detail = (f"rank {rank}{f' on {host}' if host else ''} was slower than the other ranks in {phase}{clock} in "
              f"{len(flags)} of {n} windows{apart} (steps {first_step}..{last_step}): {seconds(value)} per iteration "
              "against "
              f"their {seconds(reference)} ({median(ratios):.2f}x); it was the slowest rank there "
              f"{sum(f.slowest for f in flags)} time(s), binomial p={p:.1g}; the others waited about {seconds(cost)} "
              "for it in all")
    if also:
        detail += "; " + "; ".join(also)
    return Finding("warning", "straggler", f"straggler: rank {rank} ({phase})", detail, Evidence(
        effect=median(ratios), confidence=1 - p, steps=(first_step, last_step), ranks=(rank,), phase=phase,
        value=value, reference=reference, windows=len(flags), cost_seconds=cost,
        test="robust z against the other ranks per window; binomial test over the episode", notes=tuple(notes)))


def _comm_evidence(rank: int, steps: Sequence[dict[int, WindowPoint]]) -> str:
    """With the ranks' waits in the collectives over every rank (late-rank attribution's figure): the late rank waits
    least."""
    less = []
    for ranks in steps:
        w = ranks.get(rank)
        others = [o.world_wait for r, o in ranks.items() if r != rank and o.world_wait is not None]
        if w is not None and w.world_wait is not None and others:
            less.append(median(others) - w.world_wait)
    if not less:
        return ""
    return (f"it waited {seconds(median(less))} per iteration less than the others in the collectives over every rank "
            "(it arrived last)")


def _event_phase(e: Mapping[str, object]) -> str:
    """The phase an event names; late-rank attribution's ``outside`` is this engine's ``other``."""
    phase = str(e.get("cause") or e.get("phase") or "")
    return "other" if phase == "outside" else phase


def _matching(events: Sequence[Mapping[str, object]], rank: int, phases: set[str], first: dict[int, WindowPoint],
              last: dict[int, WindowPoint]) -> int:
    lo = min(w.first_step for w in first.values())
    hi = max(w.step for w in last.values())
    count = 0
    for e in events:
        step = e.get("step")
        if e.get("rank") == rank and (_event_phase(e) in phases or _event_phase(e) == "iteration") and \
                isinstance(step, int) and lo <= step <= hi:
            count += 1
    return count


def _unconfirmed(events: Sequence[Mapping[str, object]], findings: Sequence[Finding]) -> list[Note]:
    """Live straggler events that no finding confirms: one note (the live detector saw fewer windows, or ran an older
    rule), never findings of their own."""
    confirmed = {(f.evidence.ranks[0], f.evidence.steps) for f in findings if f.evidence and f.evidence.ranks}
    left: dict[object, set[str]] = {}
    steps: list[int] = []
    count = 0
    for e in events:
        rank, step = e.get("rank"), e.get("step")
        if any(r == rank and isinstance(step, int) and s is not None and s[0] <= step <= s[1] for r, s in confirmed):
            continue
        count += 1
        left.setdefault(rank, set()).add(_event_phase(e))
        if isinstance(step, int):
            steps.append(step)
    if not count:
        return []
    who = "; ".join(f"rank {rank}" + (f" ({', '.join(sorted(p for p in phases if p))})" if any(phases) else "")
                    for rank, phases in sorted(left.items(), key=str))
    return [Note("unconfirmed", f"{count} live straggler event(s) that the offline rule did not confirm: {who}"
                 + (f", at steps {ranges(steps)}" if steps else ""))]
