"""Goodput across restarts: how much of a session's wall time became training progress that was kept.

``goodput(session_dir)`` reads one session folder of the run store (``<root>/<session_tag>/``: the runs -- restart
attempts -- of one job) and splits the session's wall time, on one rank's timeline, into productive time and badput
by cause::

    productive + initialization + checkpoint_load + checkpoint_save + data_wait + lost_progress + validation + idle
        == wall time of the session

Productive work is the iterations that a successful checkpoint persisted (and that no later run redid), or that a
run which finished completed; lost progress is the iterations a run that did not finish completed after its last
successful checkpoint. docs/goodput.md defines every term, the sources of each number, and the limits.

How it is computed, in short: every second of the session (first to last training-lifecycle timestamp, all ranks) is
given one label by the spans of the chosen rank that cover it, the most specific winning (checkpoint save >
checkpoint load > validation/testing > initialisation phases > training loop > application start to training start >
nothing: idle). The seconds labelled "training loop" are then split, per loop, by the iteration figures the recorder
reported (``training_metrics_update`` windows, ``save_checkpoint_success``): productive iteration time, data
loading, lost iteration time, and the rest (time between iterations) idle. Iterations are never counted from spans
(they are sampled).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store.reader import ProcessLog, Run, find_runs, open_run
from .goodput_energy import EnergyAccount, energy_account
from .names import EventName, SpanName

__all__ = ["BADPUT_CATEGORIES", "Badput", "GoodputReport", "RunGoodput", "goodput", "goodput_by_rank"]

GROUP = "training"
BADPUT_CATEGORIES = (
    "initialization",
    "checkpoint_load",
    "checkpoint_save",
    "data_wait",
    "lost_progress",
    "validation",
    "idle",
)

# the spans whose start and end times make up a process's timeline (the sub-phases are left out: they live inside
# iterations, and are often timed with the context managers while the iterations get explicit times)
_LIFECYCLE = frozenset(
    s.value
    for s in (
        SpanName.APPLICATION,
        SpanName.DIST_INIT,
        SpanName.MODEL_INIT,
        SpanName.DATA_LOADER_INIT,
        SpanName.OPTIMIZER_INIT,
        SpanName.CHECKPOINT_LOAD,
        SpanName.CHECKPOINT_SAVE_SYNC,
        SpanName.CHECKPOINT_SAVE_ASYNC,
        SpanName.TRAINING_LOOP,
        SpanName.TRAINING_SINGLE_ITERATION,
        SpanName.VALIDATION_LOOP,
        SpanName.VALIDATION_SINGLE_ITERATION,
        SpanName.TESTING_LOOP,
        SpanName.TESTING_SINGLE_ITERATION,
    )
)
_TRACKED = _LIFECYCLE | {SpanName.DATA_LOADING.value}

# span name -> (badput category, priority); a second covered by several spans goes to the highest priority
_PRIO_SAVE, _PRIO_LOAD, _PRIO_VALIDATION, _PRIO_INIT, _PRIO_LOOP, _PRIO_APP_INIT = 6, 5, 4, 3, 2, 1
_CATEGORY_OF: dict[str, tuple[str, int]] = {
    SpanName.CHECKPOINT_SAVE_SYNC.value: ("checkpoint_save", _PRIO_SAVE),
    SpanName.CHECKPOINT_SAVE_ASYNC.value: ("checkpoint_save", _PRIO_SAVE),
    SpanName.CHECKPOINT_LOAD.value: ("checkpoint_load", _PRIO_LOAD),
    SpanName.VALIDATION_LOOP.value: ("validation", _PRIO_VALIDATION),
    SpanName.TESTING_LOOP.value: ("validation", _PRIO_VALIDATION),
    SpanName.DIST_INIT.value: ("initialization", _PRIO_INIT),
    SpanName.MODEL_INIT.value: ("initialization", _PRIO_INIT),
    SpanName.DATA_LOADER_INIT.value: ("initialization", _PRIO_INIT),
    SpanName.OPTIMIZER_INIT.value: ("initialization", _PRIO_INIT),
}

_CLIP_TOLERANCE_S = 1e-6  # float noise allowed before an over-full training loop is noted


# -- the report ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Badput:
    """Seconds of the session's wall time lost, by cause (docs/goodput.md defines each)."""

    initialization: float = 0.0
    checkpoint_load: float = 0.0
    checkpoint_save: float = 0.0
    data_wait: float = 0.0
    lost_progress: float = 0.0
    validation: float = 0.0
    idle: float = 0.0

    @property
    def total(self) -> float:
        return math.fsum(getattr(self, name) for name in BADPUT_CATEGORIES)

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in BADPUT_CATEGORIES}


@dataclass(frozen=True)
class RunGoodput:
    """One run (restart attempt) of the session, as the chosen rank saw it.

    ``status``: ``finished`` (its training loop ended with status ok), ``interrupted`` (the loop ended with status
    error or terminated: an exception, exit or SIGTERM; its last iterations were reported at close, so the figures are
    exact), ``killed`` (the loop never ended: SIGKILL, OOM kill, node failure -- or still running; the figures stop
    at its last report and are approximate), ``no_training`` (the rank never started a training loop in this run),
    ``absent`` (the rank wrote no training lifecycle record in this run).

    Iterations are global and zero-based, as in the recorder's events: the run ran iterations ``first_iteration`` to
    ``last_iteration``; ``checkpointed_iterations`` is the number of global iterations its last successful checkpoint
    holds (``productive_train_iterations`` of the save), ``last_checkpoint_step`` the step that save was given.
    """

    run_id: str
    restart_order: int
    restart_count: int | None
    ranks: tuple[int, ...]
    status: str
    finished: bool
    start_time_sec: float | None
    end_time_sec: float | None
    first_iteration: int | None
    last_iteration: int | None
    last_checkpoint_step: int | None
    checkpointed_iterations: int | None
    productive_iterations: int
    lost_iterations: int
    productive_seconds: float
    data_wait_seconds: float
    lost_seconds: float
    approximate: bool
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["ranks"] = list(self.ranks)
        out["notes"] = list(self.notes)
        return out


@dataclass(frozen=True)
class GoodputReport:
    """Goodput of a session on one rank's timeline. ``productive_seconds + badput.total == wall_seconds`` (up to float
    rounding): every second of the session is counted once."""

    session_tag: str
    session_dir: str
    rank: int
    ranks: tuple[int, ...]
    start_time_sec: float
    end_time_sec: float
    wall_seconds: float
    productive_seconds: float
    productive_iterations: int
    lost_iterations: int
    goodput: float
    badput: Badput
    runs: tuple[RunGoodput, ...]
    approximate: bool
    notes: tuple[str, ...] = ()
    energy: EnergyAccount | None = None  # the session's training-loop energy, all ranks (GPU jobs)

    @property
    def badput_seconds(self) -> float:
        return self.badput.total

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON types only (``json.dumps`` takes it as is)."""
        return {
            "session_tag": self.session_tag,
            "session_dir": self.session_dir,
            "rank": self.rank,
            "ranks": list(self.ranks),
            "start_time_sec": self.start_time_sec,
            "end_time_sec": self.end_time_sec,
            "wall_seconds": self.wall_seconds,
            "productive_seconds": self.productive_seconds,
            "productive_iterations": self.productive_iterations,
            "lost_iterations": self.lost_iterations,
            "goodput": self.goodput,
            "badput_seconds": self.badput_seconds,
            "badput": self.badput.as_dict(),
            "runs": [r.as_dict() for r in self.runs],
            "approximate": self.approximate,
            "notes": list(self.notes),
            **({"energy": self.energy.as_dict()} if self.energy is not None else {}),
        }


# -- what the store holds, per process -----------------------------------------------------------------------------


@dataclass
class _Span:
    name: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int | None = None
    status: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Window:
    """One ``training_metrics_update``."""

    completed: int  # global iterations completed at the window's end (current_iteration + 1)
    iterations: int  # iterations in the window, warm-up included
    timed: int  # iterations whose time is in total_sec (the recorder leaves warm-up iterations out)
    total_sec: float
    avg_sec: float | None
    data_sec: float
    window_sec: float
    final: bool
    energy_J: float | None = None  # the rank's share of its GPUs' energy over the window (goodput_energy)


@dataclass
class _Save:
    """One ``save_checkpoint_success``."""

    completed: int | None  # productive_train_iterations: global iterations completed when the save started
    step: int | None  # current_iteration: the global step the checkpoint was saved as
    sec: float | None  # productive_train_iterations_sec: this loop's iteration seconds when the save started


@dataclass
class _Loop:
    span: _Span
    start: int  # train_iterations_start
    index: int  # position among its process's loops
    windows: list[_Window] = field(default_factory=list)
    saves: list[_Save] = field(default_factory=list)
    iteration_spans: list[_Span] = field(default_factory=list)
    progress: tuple[int, float] | None = None  # the last heartbeat (training_progress): (completed, iteration s)


@dataclass
class _Process:
    run: int
    rank: int
    pid: int
    spans: list[_Span]
    loops: list[_Loop]
    saves: list[_Save]  # every successful save of the process, whatever loop it followed
    first_ns: int | None
    last_ns: int | None
    data_outside: bool  # data loading is timed outside the iteration spans (so not inside the iteration times)
    orphan_reports: int = 0  # training_metrics_update events with no training_loop span before them


@dataclass
class _RunData:
    run: Run
    processes: list[_Process]
    first_ns: int | None
    last_ns: int | None


@dataclass
class _Session:
    path: Path
    tag: str
    runs: list[_RunData]
    start_ns: int
    end_ns: int
    notes: list[str]
    # the SQL path reads every process's figures but only one rank's whole lifecycle at a time: this loads the
    # lifecycle of a rank's processes into ``runs`` (and lets the previous rank's go)
    load_rank: Callable[[_Session, int], None] | None = None
    energy: bool = False  # the SQL path: the reports carry energy (``_energy`` then loads every rank in turn)


def _num(attributes: Mapping[str, Any], key: str) -> float | None:
    value = attributes.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _int(attributes: Mapping[str, Any], key: str) -> int | None:
    value = attributes.get(key)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _stamp(attributes: Mapping[str, Any], key: str) -> int | None:
    """A ``*_timestamp_sec`` attribute (wall seconds) in wall ns."""
    value = _num(attributes, key)
    if value is None or value <= 0 or not math.isfinite(value * 1e9):
        return None
    return round(value * 1e9)


def _window_of(attributes: Mapping[str, Any]) -> _Window | None:
    current = _int(attributes, "current_iteration")
    if current is None:
        return None
    iterations = _int(attributes, "window_iterations") or 0
    total = _num(attributes, "total_iteration_time_sec")
    avg = _num(attributes, "avg_iteration_time_sec")
    if total is None:
        timed = 0  # no iteration of the window was timed: all warm-up
    elif avg is not None and avg > 0 and math.isfinite(total / avg):
        timed = min(round(total / avg), iterations)
    else:
        timed = iterations
    data_avg = _num(attributes, "avg_dataloader_time_sec")
    return _Window(
        completed=current + 1,
        iterations=iterations,
        timed=timed,
        total_sec=total or 0.0,
        avg_sec=avg,
        data_sec=(data_avg or 0.0) * iterations,
        window_sec=_num(attributes, "window_seconds") or 0.0,
        final=attributes.get("final") is True,
        energy_J=_num(attributes, "window_energy_J"),
    )


def _read_process(log: ProcessLog, run_index: int) -> _Process:
    """The training lifecycle of one process file, in the order it was written (the order of the calls: events are
    stamped when emitted, spans at their explicit times, so file order is the one to trust for "which loop")."""
    return read_records(log.records, log.rank, log.pid, run_index)


def read_records(records: Iterable[Any], rank: int, pid: int, run_index: int) -> _Process:
    """``_read_process`` of a process's records in file order (any objects with the records' fields: the SQL path
    hands rows of the group ``training`` only)."""
    by_id: dict[str, _Span] = {}
    early_ends: dict[str, Any] = {}
    spans: list[_Span] = []
    loops: list[_Loop] = []
    loop_of: dict[str, _Loop] = {}
    saves: list[_Save] = []
    stamps: list[int] = []
    orphans = 0
    for rec in records:
        if rec.group != GROUP:
            continue
        kind = rec.kind
        if kind == "span_start":
            if rec.name not in _TRACKED:
                continue
            s = _Span(rec.name, rec.span_id, rec.parent_id, rec.wall_ns, attributes=dict(rec.attributes or {}))
            by_id[s.span_id] = s
            spans.append(s)
            if s.name in _LIFECYCLE:
                stamps.append(s.start_ns)
            early = early_ends.pop(s.span_id, None)
            if early is not None:  # its end came first (the tracer's tick wrote the start as the span ended)
                s.end_ns, s.status = max(early.wall_ns, s.start_ns), early.status
            if s.name == SpanName.TRAINING_LOOP.value:
                start = _int(s.attributes, "train_iterations_start") or 0
                loop = _Loop(span=s, start=max(start, 0), index=len(loops))
                loops.append(loop)
                loop_of[s.span_id] = loop
            elif s.name == SpanName.TRAINING_SINGLE_ITERATION.value and s.parent_id in loop_of:
                loop_of[s.parent_id].iteration_spans.append(s)
        elif kind == "span_end":
            found = by_id.get(rec.span_id)
            if found is None:
                if rec.name in _TRACKED:
                    early_ends[rec.span_id] = rec
                continue
            if found.end_ns is not None:
                continue
            found.end_ns = max(rec.wall_ns, found.start_ns)
            found.status = rec.status
            if found.name in _LIFECYCLE:
                stamps.append(found.end_ns)
        elif kind == "event":
            attributes = rec.attributes or {}
            if rec.name == EventName.TRAINING_METRICS_UPDATE.value:
                window = _window_of(attributes)
                if window is not None and loops:
                    loops[-1].windows.append(window)
                elif window is not None:
                    orphans += 1
                ts = _stamp(attributes, "last_logged_train_iterations_finish_timestamp_sec")
                if ts is not None:
                    stamps.append(ts)
            elif rec.name == "training_progress":  # the stall watchdog's heartbeat (distributed.watchdog)
                current, seconds = _int(attributes, "current_iteration"), _num(attributes,
                                                                               "cumulative_iteration_time_sec")
                if current is not None and seconds is not None and loops:
                    loops[-1].progress = (current + 1, seconds)
                ts = _stamp(attributes, "last_logged_train_iterations_finish_timestamp_sec")
                if ts is not None:
                    stamps.append(ts)
            elif rec.name == EventName.SAVE_CHECKPOINT_SUCCESS.value:
                save = _Save(
                    completed=_int(attributes, "productive_train_iterations"),
                    step=_int(attributes, "current_iteration"),
                    sec=_num(attributes, "productive_train_iterations_sec"),
                )
                saves.append(save)
                if loops:
                    loops[-1].saves.append(save)
                ts = _stamp(attributes, "latest_successful_save_checkpoint_timestamp_sec")
                if ts is not None:
                    stamps.append(ts)
    iteration_ids = {s.span_id for s in spans if s.name == SpanName.TRAINING_SINGLE_ITERATION.value}
    data_outside = any(s.name == SpanName.DATA_LOADING.value and s.parent_id not in iteration_ids for s in spans)
    return _Process(
        run=run_index,
        rank=rank,
        pid=pid,
        spans=spans,
        loops=loops,
        saves=saves,
        first_ns=min(stamps) if stamps else None,
        last_ns=max(stamps) if stamps else None,
        data_outside=data_outside,
        orphan_reports=orphans,
    )


def _load(session_dir: str | os.PathLike[str], opened: Sequence[Run] = (), engine: Any = None) -> _Session:
    path = Path(session_dir)
    if not path.exists():
        raise FileNotFoundError(f"no such session folder: {path}")
    if not path.is_dir():
        raise ValueError(f"{path} is a file; goodput needs a session folder (<root>/<session_tag>/) of the run store")
    run_dirs = find_runs(path)
    if not run_dirs:
        raise ValueError(
            f"{path}: empty session, no runs in it (a session folder holds <run_id>/ folders with run.json and "
            "rank-<R>.<pid>.jsonl files)"
        )
    already = {Path(r.path).resolve(): r for r in opened}
    # (``is None``: a Run's truth is its length, which would read it)
    runs = [r if (r := already.get(d.resolve())) is not None else open_run(d) for d in run_dirs]
    tags = sorted({r.session_tag for r in runs})
    if len(tags) > 1:
        shown = ", ".join(tags[:5]) + (", ..." if len(tags) > 5 else "")
        raise ValueError(
            f"{path} holds runs of {len(tags)} sessions ({shown}): goodput is computed per session; pass one "
            "session folder, <root>/<session_tag>"
        )
    notes: list[str] = []
    datas: list[_RunData] = []
    load_rank = None
    energy = False
    if engine is None:
        from ..store.engine import engine_for

        engine = engine_for(run_dirs)
    if engine is not None:
        from .goodput_sql import load_session

        datas, load_rank, energy = load_session(engine, runs)
    for i, run in enumerate(runs):
        if engine is None:
            processes = [_read_process(log, i) for log in run.processes]
            firsts = [p.first_ns for p in processes if p.first_ns is not None]
            lasts = [p.last_ns for p in processes if p.last_ns is not None]
            datas.append(_RunData(run, processes, min(firsts) if firsts else None, max(lasts) if lasts else None))
        if run.torn or run.corrupt:
            notes.append(
                f"run {run.run_id}: {run.corrupt} corrupt and {run.torn} torn line(s) were skipped by the reader"
            )
    timed = [d for d in datas if d.first_ns is not None and d.last_ns is not None]
    if not timed:
        raise ValueError(
            f"{path}: empty session, its {len(runs)} run(s) hold no training lifecycle record (group 'training' "
            "spans from a TrainingRecorder): nothing to compute goodput from"
        )

    def order(d: _RunData) -> tuple[int, int, str]:
        created = d.run.meta.get("created_wall_ns")
        created_ns = created if isinstance(created, int) and not isinstance(created, bool) else 0
        return (d.first_ns if d.first_ns is not None else created_ns, created_ns, d.run.run_id)

    datas.sort(key=order)
    for i, d in enumerate(datas):
        for p in d.processes:
            p.run = i
    start = min(d.first_ns for d in timed if d.first_ns is not None)
    end = max(d.last_ns for d in timed if d.last_ns is not None)
    return _Session(path=path, tag=tags[0], runs=datas, start_ns=start, end_ns=end, notes=notes,
                    load_rank=load_rank, energy=energy)


# -- the figures of one training loop ------------------------------------------------------------------------------


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
    spans = sorted((s for s in loop.iteration_spans if s.end_ns is not None and s.status == "ok"),
                   key=lambda s: s.start_ns)
    iterations = sum(w.iterations for w in loop.windows)
    if spans and ((loop.index == 0 and warm == 1) or len(spans) >= iterations >= warm):
        # the first iteration span of a process is always exported (sampling keeps the first, then every N-th)
        return sum((s.end_ns or s.start_ns) - s.start_ns for s in spans[:warm]) / 1e9, None
    for w in loop.windows:
        if w.timed and w.avg_sec is not None:
            return (warm * w.avg_sec,
                    f"the {warm} warm-up iteration(s), left out of the reported iteration times, are estimated at "
                    "the mean of the timed ones")
    window_sec = sum(w.window_sec for w in loop.windows)
    return (window_sec,
            f"only warm-up iterations were reported ({warm}); their time is estimated by the windows' wall time")


def _figures(loop: _Loop, process: _Process, run_saves: list[_Save], later_start: int | None) -> _Figures:
    notes: list[str] = []
    approximate = False
    span = loop.span
    if span.end_ns is None:
        status = "killed"
        approximate = True
        notes.append("its training loop never ended (SIGKILL, OOM kill, node failure, or still running): no final "
                     "report, the figures stop at its last report and are approximate")
    elif span.status == "ok":
        status = "finished"
    else:
        status = "interrupted"
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
    if status == "killed" and loop.progress is not None and loop.progress[0] > c_pairs[-1][0]:
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
    checkpoint = max(candidates, key=lambda s: s.completed or 0) if candidates else None
    if not own and checkpoint is not None:
        notes.append("its checkpoints are known from another rank of the run")
    if status == "finished":
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


# -- the timeline --------------------------------------------------------------------------------------------------


def _sweep(intervals: list[tuple[int, int, int, object]], start: int, end: int) -> dict[object, int]:
    """Nanoseconds of [start, end) under each label: at every instant the covering interval of highest priority wins
    (ties: the later start), an instant no interval covers goes to ``"idle"``."""
    totals: dict[object, int] = {"idle": 0}
    edges: dict[int, list[tuple[int, int]]] = {}
    for i, (a, b, _, _) in enumerate(intervals):
        a, b = max(a, start), min(b, end)
        if b > a:
            edges.setdefault(a, []).append((1, i))
            edges.setdefault(b, []).append((-1, i))
    times = sorted({start, end, *edges})
    active: set[int] = set()
    for t0, t1 in itertools.pairwise(times):
        for delta, i in edges.get(t0, ()):
            if delta > 0:
                active.add(i)
            else:
                active.discard(i)
        if t1 <= t0:
            continue
        if active:
            best = max(active, key=lambda i: (intervals[i][2], intervals[i][0], i))
            label = intervals[best][3]
        else:
            label = "idle"
        totals[label] = totals.get(label, 0) + (t1 - t0)
    return totals


def _report(session: _Session, rank: int) -> GoodputReport:
    if session.load_rank is not None:
        session.load_rank(session, rank)
    ranks = sorted({p.rank for d in session.runs for p in d.processes})
    processes = [p for d in session.runs for p in d.processes if p.rank == rank and p.first_ns is not None]
    if not processes:
        raise ValueError(
            f"{session.path}: rank {rank} wrote no training lifecycle record in this session (ranks with records: "
            f"{', '.join(map(str, sorted({p.rank for d in session.runs for p in d.processes if p.first_ns})))})"
        )
    notes = list(session.notes)
    run_saves = [[s for p in d.processes for s in p.saves] for d in session.runs]
    loops = sorted(((loop, p) for p in processes for loop in p.loops), key=lambda lp: lp[0].span.start_ns)
    figures: list[_Figures] = []
    for i, (loop, p) in enumerate(loops):
        later = [other.start for other, _ in loops[i + 1:]]
        figures.append(_figures(loop, p, run_saves[p.run], min(later) if later else None))

    intervals: list[tuple[int, int, int, object]] = []
    for p in processes:
        assert p.first_ns is not None and p.last_ns is not None
        app: _Span | None = None
        for s in p.spans:
            end = s.end_ns if s.end_ns is not None else p.last_ns
            if s.name in _CATEGORY_OF:
                category, priority = _CATEGORY_OF[s.name]
                intervals.append((s.start_ns, end, priority, category))
            elif s.name == SpanName.APPLICATION.value and app is None:
                app = s
        for loop in p.loops:
            end = loop.span.end_ns if loop.span.end_ns is not None else p.last_ns
            intervals.append((loop.span.start_ns, end, _PRIO_LOOP, id(loop)))
        begin = app.start_ns if app is not None else p.first_ns
        if p.loops:
            stop = min(loop.span.start_ns for loop in p.loops)
        else:
            stop = app.end_ns if app is not None and app.end_ns is not None else p.last_ns
        intervals.append((begin, stop, _PRIO_APP_INIT, "initialization"))
    totals = _sweep(intervals, session.start_ns, session.end_ns)

    seconds = {name: totals.get(name, 0) / 1e9 for name in ("initialization", "checkpoint_load", "checkpoint_save",
                                                            "validation", "idle")}
    idle_parts = [seconds["idle"]]
    productive_parts: list[float] = []
    data_parts: list[float] = []
    lost_parts: list[float] = []
    assigned: dict[int, tuple[float, float, float]] = {}
    for f in figures:
        room = totals.get(id(f.loop), 0) / 1e9
        lost = min(f.lost_sec, room)
        data = min(f.data_sec, room - lost)
        productive = min(f.productive_sec, room - lost - data)
        over = f.lost_sec + f.data_sec + f.productive_sec - room
        if over > _CLIP_TOLERANCE_S:
            f.notes.append(f"its iteration times exceed its training loop's own time by {over:.6f} s (iterations "
                           "overlapping a checkpoint save or validation?): cut to fit, productive time first")
            f.approximate = True
        assigned[id(f.loop)] = (productive, data, lost)
        productive_parts.append(productive)
        data_parts.append(data)
        lost_parts.append(lost)
        idle_parts.append(room - productive - data - lost)
    productive_seconds = math.fsum(productive_parts)
    badput = Badput(
        initialization=seconds["initialization"],
        checkpoint_load=seconds["checkpoint_load"],
        checkpoint_save=seconds["checkpoint_save"],
        data_wait=math.fsum(data_parts),
        lost_progress=math.fsum(lost_parts),
        validation=seconds["validation"],
        idle=math.fsum(idle_parts),
    )

    runs: list[RunGoodput] = []
    for i, d in enumerate(session.runs):
        mine = [f for f in figures if f.process.run == i]
        rank_procs = [p for p in processes if p.run == i]
        run_notes = [n for f in mine for n in f.notes]
        if mine:
            status = mine[-1].status
        elif rank_procs:
            status = "no_training"
        else:
            status = "absent"
            run_notes.append(f"rank {rank} wrote no training lifecycle record in this run: its time is idle here")
        checkpoints = [f.checkpoint for f in mine if f.checkpoint is not None]
        last_ckpt = max(checkpoints, key=lambda s: s.completed or 0) if checkpoints else None
        ends = [f.end for f in mine]
        first = mine[0].start if mine else None
        last = max(ends) - 1 if mine and max(ends) > min(f.start for f in mine) else None
        restart_count = d.run.meta.get("restart_count")
        runs.append(RunGoodput(
            run_id=d.run.run_id,
            restart_order=i,
            restart_count=restart_count if isinstance(restart_count, int) else None,
            ranks=tuple(d.run.ranks),
            status=status,
            finished=status == "finished",
            start_time_sec=d.first_ns / 1e9 if d.first_ns is not None else None,
            end_time_sec=d.last_ns / 1e9 if d.last_ns is not None else None,
            first_iteration=first,
            last_iteration=last,
            last_checkpoint_step=last_ckpt.step if last_ckpt is not None else None,
            checkpointed_iterations=last_ckpt.completed if last_ckpt is not None else None,
            productive_iterations=sum(f.kept - f.start for f in mine),
            lost_iterations=sum(f.end - f.kept for f in mine),
            productive_seconds=math.fsum(assigned[id(f.loop)][0] for f in mine),
            data_wait_seconds=math.fsum(assigned[id(f.loop)][1] for f in mine),
            lost_seconds=math.fsum(assigned[id(f.loop)][2] for f in mine),
            approximate=any(f.approximate for f in mine),
            notes=tuple(run_notes),
        ))
        for n in run_notes:
            notes.append(f"run {d.run.run_id}: {n}")
    orphans = sum(p.orphan_reports for p in processes)
    if orphans:
        notes.append(f"{orphans} training_metrics_update event(s) with no training_loop span before them in their "
                     "file (a lost line?) were left out")
    if any(len(p.loops) > 1 for p in processes):
        notes.append("a process ran several training loops: each is counted on its own")
    wall = (session.end_ns - session.start_ns) / 1e9
    energy = _energy(session, run_saves, rank)
    return GoodputReport(
        session_tag=session.tag,
        session_dir=str(session.path),
        rank=rank,
        ranks=tuple(ranks),
        start_time_sec=session.start_ns / 1e9,
        end_time_sec=session.end_ns / 1e9,
        wall_seconds=wall,
        productive_seconds=productive_seconds,
        productive_iterations=sum(r.productive_iterations for r in runs),
        lost_iterations=sum(r.lost_iterations for r in runs),
        goodput=productive_seconds / wall if wall > 0 else 0.0,
        badput=badput,
        runs=tuple(runs),
        approximate=any(r.approximate for r in runs),
        notes=tuple(notes),
        energy=energy,
    )


def _energy(session: _Session, run_saves: list[list[_Save]], reported: int) -> EnergyAccount | None:
    """Every rank's loops, kept and lost as goodput counts them (energy is the job's, not one rank's). On the SQL
    path (one rank's lifecycle in memory at a time) each rank is loaded in turn when the reports carry energy, then
    ``reported`` (the rank being reported) again; the windows kept are those with energy's figures."""
    if session.load_rank is not None and not session.energy:
        return None
    loops = []
    for rank in sorted({p.rank for d in session.runs for p in d.processes}):
        if session.load_rank is not None:
            session.load_rank(session, rank)
        mine = sorted(((loop, p) for d in session.runs for p in d.processes if p.rank == rank for loop in p.loops),
                      key=lambda lp: lp[0].span.start_ns)
        if not any(w.energy_J is not None for loop, _ in mine for w in loop.windows):
            continue
        for i, (loop, p) in enumerate(mine):
            later = [other.start for other, _ in mine[i + 1:]]
            f = _figures(loop, p, run_saves[p.run], min(later) if later else None)
            loops.append((session.runs[p.run].run.run_id, p.run, loop.windows, f.start, f.kept, f.end))
    if session.load_rank is not None:
        session.load_rank(session, reported)
    return energy_account(loops, [d.run.run_id for d in session.runs])


# -- the API ---------------------------------------------------------------------------------------------------------


def goodput(session_dir: str | os.PathLike[str], *, rank: int = 0, opened: Sequence[Run] = (),
            engine: Any = None) -> GoodputReport:
    """Goodput and badput of a session folder of the run store (``<root>/<session_tag>/``: every restart of one job),
    on ``rank``'s timeline (rank 0 by default; ``goodput_by_rank`` gives every rank).

    The session's wall time runs from its first training-lifecycle timestamp to its last, over every run and rank;
    ``productive_seconds + badput.total == wall_seconds``. docs/goodput.md defines each term.

    ``opened``: runs of the session the caller has read already (the report's), used instead of reading them again.
    ``engine``: a ``store.engine.Engine`` to read the session with (the session's runs are added to it); by default
    one is opened when DuckDB is installed (the ``columnar`` extra), and the records are read in Python otherwise.
    By SQL, only the chosen rank's training lifecycle is loaded; of the other ranks and runs only the figures goodput
    needs (their first and last timestamps, their checkpoints), whatever their length.

    Raises ``FileNotFoundError`` for a missing folder and ``ValueError`` for an empty session (no runs, or runs
    without any training lifecycle record), a folder holding several sessions, or a rank with no record.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")
    return _report(_load(session_dir, opened, engine), rank)


def goodput_by_rank(session_dir: str | os.PathLike[str], *, engine: Any = None) -> dict[int, GoodputReport]:
    """``goodput`` for every rank that wrote training lifecycle records in the session (the store is read once)."""
    session = _load(session_dir, engine=engine)
    ranks = sorted({p.rank for d in session.runs for p in d.processes if p.first_ns is not None})
    return {rank: _report(session, rank) for rank in ranks}
