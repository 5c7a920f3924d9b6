"""One training loop's figures for goodput: of the iterations it completed, which were kept (persisted by a
successful checkpoint that no later run redid, or completed by a run that finished) and which were lost, and the
seconds each took, productive iteration time and data loading apart, read from the recorder's cumulative report
windows (``training_metrics_update``) and checkpoint events (``save_checkpoint_success``). ``goodput`` puts the
loops on the session's timeline."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .goodput_read import _Loop, _Process, _Save, _Session

__all__: list[str] = []


@dataclass
class _Figures:
    loop: _Loop
    process: _Process
    status: str
    start: int
    end: int  # global iterations completed when the loop's figures stop
    kept: int  # ... of which the first `kept` are productive
    checkpoint: _Save | None
    productive_sec: float
    data_sec: float
    lost_sec: float
    approximate: bool
    notes: list[str]


def _points(pairs: Iterable[tuple[int, float]], exact: Mapping[int, float]) -> list[tuple[int, float]]:
    """Sorted (iterations completed, cumulative seconds), ``exact`` winning ties, values made non-decreasing."""
    merged: dict[int, float] = dict(pairs)
    merged.update(exact)
    out: list[tuple[int, float]] = []
    for n in sorted(merged):
        value = merged[n]
        if out and value < out[-1][1]:
            value = out[-1][1]
        out.append((n, value))
    return out


def _at(points: list[tuple[int, float]], n: int) -> tuple[float, bool]:
    """The cumulative value at ``n`` iterations completed, and whether it is known rather than interpolated."""
    if n <= points[0][0]:
        return points[0][1], n == points[0][0]
    for (n0, v0), (n1, v1) in itertools.pairwise(points):
        if n == n1:
            return v1, True
        if n0 < n < n1:
            return v0 + (v1 - v0) * (n - n0) / (n1 - n0), False
    if len(points) < 2:
        return points[-1][1], points[-1][1] == 0.0  # nothing known beyond: no time recorded
    (n0, v0), (n1, v1) = points[-2], points[-1]
    return v1 + (v1 - v0) / (n1 - n0) * (n - n1), False  # beyond the last report: at the last rate


def _warmup_seconds(loop: _Loop, warm: int) -> tuple[float, str | None]:
    """Seconds of the loop's ``warm`` warm-up iterations, which the windows' totals leave out; a note if estimated."""
    total = 0.0
    warm_seen = 0
    exact_saves = {s.completed: s.sec for s in loop.saves if s.completed is not None and s.sec is not None}
    for w in loop.windows:  # a save started right at a window's end: its cumulative seconds include the warm-up
        total += w.total_sec
        warm_seen += w.iterations - w.timed
        sec = exact_saves.get(w.completed)
        if warm_seen >= warm and sec is not None and sec >= total:
            return sec - total, None
    times = loop.iteration_times  # (start, end) of each ok iteration span, flat
    spans = len(times) // 2
    iterations = sum(w.iterations for w in loop.windows)
    if spans and ((loop.index == 0 and warm == 1) or spans >= iterations >= warm):
        # the first iteration span of a process is always exported (sampling keeps the first, then every N-th);
        # the earliest starts, ties in file order (nsmallest is sorted()[:warm])
        first = heapq.nsmallest(warm, range(spans), key=lambda i: times[2 * i])
        return sum((times[2 * i + 1] or times[2 * i]) - times[2 * i] for i in first) / 1e9, None
    for w in loop.windows:
        if w.timed and w.avg_sec is not None:
            return (warm * w.avg_sec,
                    f"the {warm} warm-up iteration(s), left out of the reported iteration times, are estimated at "
                    "the mean of the timed ones")
    window_sec = sum(w.window_sec for w in loop.windows)
    return (window_sec,
            f"only warm-up iterations were reported ({warm}); their time is estimated by the windows' wall time")


def _last_save(saves: list[_Save]) -> _Save | None:
    """The save that holds the most work; of saves holding the same (a second save with no iteration between, under
    another step: an end-of-epoch save after a periodic one), the later one."""
    return max(reversed(saves), key=lambda s: s.completed or 0) if saves else None


def _running(session: _Session, i: int) -> bool:
    """Whether run ``i`` is still being written (``show --list``'s rule), asked once; only the session's last run
    can be: a later run started after it ended."""
    d = session.runs[i]
    if i != len(session.runs) - 1 or d.last_ns is None:
        return False
    if d.live is None:
        from ..show_list import still_running

        d.live = still_running(d.run, d.last_ns)
    return d.live


def _figures(loop: _Loop, process: _Process, run_saves: list[_Save], later_start: int | None,
             running: bool = False) -> _Figures:
    notes: list[str] = []
    approximate = False
    span = loop.span
    if span.end_ns is None and running:
        status = "running"
        approximate = True
        notes.append("still running: the figures are its progress to its last report, its work since its last "
                     "checkpoint counted productive (a kill now would lose it)")
    elif span.end_ns is None:
        status = "killed"
        approximate = True
        notes.append("its training loop never ended (SIGKILL, OOM kill, node failure, or still running): no final "
                     "report, the figures stop at its last report and are approximate")
    elif span.status == "ok":
        status = "finished"
    elif span.status == "interrupt":  # a Ctrl-C (span_lifecycle.end_status): the user's choice, not a crash
        status = "interrupted"
    elif span.status == "killed":  # a SIGTERM (a preemption), whatever exit followed it: as MLflow says
        status = "killed"
        notes.append("its training loop was stopped by SIGTERM (a preemption, or a kill)")
    else:  # an exception, an exit or a signal other than SIGINT ended the loop
        status = "crash"
    start = loop.start
    windows = sorted(loop.windows, key=lambda w: w.completed)
    warm = sum(max(w.iterations - w.timed, 0) for w in windows)
    warm_sec = 0.0
    if warm:
        warm_sec, note = _warmup_seconds(loop, warm)
        if note:
            approximate = True
            notes.append(note)
    c_pairs: list[tuple[int, float]] = [(start, 0.0)]
    d_pairs: list[tuple[int, float]] = [(start, 0.0)]
    total = data = 0.0
    warm_seen = 0
    for w in windows:
        if w.completed < start:
            continue
        total += w.total_sec
        data += w.data_sec
        warm_seen += max(w.iterations - w.timed, 0)
        c_pairs.append((w.completed, total + (warm_sec * warm_seen / warm if warm else 0.0)))
        d_pairs.append((w.completed, data))
    if status in ("killed", "running") and loop.progress is not None and loop.progress[0] > c_pairs[-1][0]:
        c_pairs.append(loop.progress)  # iterations it made after its last report, known from its heartbeat
        notes.append(f"its progress after its last report is known from a heartbeat (iteration "
                     f"{loop.progress[0] - 1}); iterations after the last heartbeat are not seen")
    own = [s for s in loop.saves if s.completed is not None and s.completed >= start]
    exact = {s.completed: s.sec for s in own if s.completed is not None and s.sec is not None}
    c_points = _points(c_pairs, exact)
    d_points = _points(d_pairs, {})
    end = max(n for n, _ in c_points)
    # the checkpoint that holds this loop's work: its own saves, else the run's (another rank reported them)
    candidates = own or [s for s in run_saves if s.completed is not None and s.completed >= start]
    checkpoint = _last_save(candidates)
    if not own and checkpoint is not None:
        notes.append("its checkpoints are known from another rank of the run")
    if status in ("finished", "running"):  # (a running loop's work is not lost yet)
        kept = end
    else:
        kept = checkpoint.completed if checkpoint is not None and checkpoint.completed is not None else start
        if kept > end:
            end = kept  # the job got that far; this rank's last report came earlier
    if later_start is not None and later_start < kept:
        notes.append(f"a later run restarted from iteration {max(later_start, start)}: the iterations after it were "
                     "redone and count as lost progress")
        kept = max(later_start, start)
    c_kept, e1 = _at(c_points, kept)
    c_end, e2 = _at(c_points, end)
    d_kept, e3 = _at(d_points, kept)
    d_end, e4 = _at(d_points, end)
    no_data = all(v == 0.0 for _, v in d_points) and all(w.data_sec == 0.0 for w in windows)
    if not (e1 and e2 and (no_data or (e3 and e4))):
        approximate = True
        notes.append("the checkpointed or last iteration falls between reports: its time is interpolated (or "
                     "extrapolated at the last report's rate)")
    if process.data_outside:
        productive = c_kept
        lost = (c_end - c_kept) + (d_end - d_kept)
    else:
        productive = max(c_kept - d_kept, 0.0)
        lost = c_end - c_kept
    return _Figures(loop, process, status, start, end, kept, checkpoint, productive, d_kept, max(lost, 0.0),
                    approximate, notes)
