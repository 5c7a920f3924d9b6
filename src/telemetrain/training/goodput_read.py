"""Goodput's input: the training lifecycle of each process of a session, read from the run store (the pure-Python
reader here; ``goodput_sql`` gives the same objects from DuckDB). ``goodput`` computes the figures from them."""

from __future__ import annotations

import itertools
import math
import os
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..span_lifecycle import end_status
from ..store.reader import ProcessLog, Run, find_runs, open_run
from .goodput_windows import WindowList, _Window
from .names import EventName, SpanName

GROUP = "training"


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
# the spans of which a rank of a long run has one per (exported) iteration: goodput reads no _Span of them, only
# a loop's ok iterations' times (the warm-up's, ``_Loop.iteration_times``), which iterations exist (for
# ``data_outside``) and their lifecycle timestamps
_ITERATION = frozenset(
    s.value
    for s in (
        SpanName.TRAINING_SINGLE_ITERATION,
        SpanName.VALIDATION_SINGLE_ITERATION,
        SpanName.TESTING_SINGLE_ITERATION,
    )
)
_TRAINING_LOOP = SpanName.TRAINING_LOOP.value
_TRAINING_ITERATION = SpanName.TRAINING_SINGLE_ITERATION.value
_DATA_LOADING = SpanName.DATA_LOADING.value
_NO_ATTRIBUTES: Mapping[str, Any] = MappingProxyType({})  # a span whose attributes nothing reads: shared, read-only


@dataclass(slots=True)
class _Span:
    name: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int | None = None
    status: str | None = None
    # kept for training_loop only (train_iterations_start); the others share _NO_ATTRIBUTES
    attributes: Mapping[str, Any] = field(default_factory=lambda: _NO_ATTRIBUTES)


@dataclass(slots=True)
class _Open:
    """An iteration span (``_ITERATION``) until its end is read."""

    start_ns: int
    loop: _Loop | None  # a training_single_iteration's training loop: it times its ok iterations
    index: int  # its place among the iteration spans (file order of the starts)


# ``read_records``'s ``by_id`` entry of a span whose end nothing reads any more (an iteration span once ended, a
# data_loading span): its end is not None, so a further end of the same id is passed over as before
_ENDED = _Span("", "", "", 0, 0)


@dataclass(slots=True)
class _Save:
    """One ``save_checkpoint_success``."""

    completed: int | None  # productive_train_iterations: global iterations completed when the save started
    step: int | None  # current_iteration: the global step the checkpoint was saved as
    sec: float | None  # productive_train_iterations_sec: this loop's iteration seconds when the save started


@dataclass(slots=True)
class _Loop:
    span: _Span
    start: int  # train_iterations_start
    index: int  # position among its process's loops
    windows: WindowList = field(default_factory=WindowList)  # packed (goodput_windows)
    saves: list[_Save] = field(default_factory=list)
    # (start ns, end ns) of each of its training_single_iteration spans that ended ok, flat, in the file order of
    # their starts: all goodput reads of them (``goodput._warmup_seconds``)
    iteration_times: array[int] = field(default_factory=lambda: array("q"))
    progress: tuple[int, float] | None = None  # the last heartbeat (training_progress): (completed, iteration s)


@dataclass(slots=True)
class _Process:
    run: int
    rank: int
    pid: int
    spans: list[_Span]  # its tracked spans but the iteration spans (_ITERATION) and data_loading, in file order
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
    live: bool | None = None  # still being written (``goodput._running``), once asked


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
    load_rank: Callable[[_Session, int | Sequence[int]], None] | None = None
    # the SQL path: ranks in batches that ``load_rank`` loads at once (short ranks together: a query a batch)
    rank_batches: Callable[[Sequence[int]], list[list[int]]] | None = None
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


def _end_status(rec: Any) -> str:
    """A span end's status, ``interrupt`` for one a Ctrl-C ended: goodput's ``interrupted``, not a crash (the SQL
    path's rows, which have no error, come mapped by ``span_lifecycle.END_STATUS_SQL``)."""
    return end_status(rec.status, getattr(rec, "error", None))


def read_records(records: Iterable[Any], rank: int, pid: int, run_index: int) -> _Process:
    """``_read_process`` of a process's records in file order (any objects with the records' fields: the SQL path
    hands rows of the group ``training`` only).

    Of the spans of which there is one per (exported) iteration, only what goodput reads is kept (a rank of a long
    run has tens of thousands): an iteration span is an ``_Open`` until its end, a data_loading span only its parent;
    ``spans`` holds the others."""
    by_id: dict[str, _Span | _Open] = {}
    early_ends: dict[str, Any] = {}
    spans: list[_Span] = []
    loops: list[_Loop] = []
    loop_of: dict[str, _Loop] = {}
    saves: list[_Save] = []
    first_ns: int | None = None
    last_ns: int | None = None
    orphans = 0
    iteration_ids: set[str] = set()  # every training_single_iteration's id
    data_parents: set[str] = set()  # data_loading spans' parents not (yet) among them
    starts = 0  # iteration spans started: their order
    order: dict[int, array[int]] = {}  # loop index -> the order of each of its ok iterations, as they ended

    def stamp(ns: int) -> None:
        nonlocal first_ns, last_ns
        if first_ns is None or ns < first_ns:
            first_ns = ns
        if last_ns is None or ns > last_ns:
            last_ns = ns

    def timed(loop: _Loop, index: int, start_ns: int, end_ns: int) -> None:
        loop.iteration_times.extend((start_ns, end_ns))
        order.setdefault(loop.index, array("q")).append(index)

    for rec in records:
        if rec.group != GROUP:
            continue
        kind = rec.kind
        if kind == "span_start":
            name = rec.name
            if name not in _TRACKED:
                continue
            span_id, start_ns = rec.span_id, rec.wall_ns
            # its end came first (the tracer's tick wrote the start as the span ended)
            early = early_ends.pop(span_id, None)
            if name == _DATA_LOADING:
                by_id[span_id] = _ENDED
                if rec.parent_id not in iteration_ids:
                    data_parents.add(rec.parent_id)
                continue
            stamp(start_ns)  # (every tracked span but data_loading is a lifecycle span)
            if name in _ITERATION:
                loop = None
                if name == _TRAINING_ITERATION:
                    iteration_ids.add(span_id)
                    loop = loop_of.get(rec.parent_id)
                if early is None:
                    by_id[span_id] = _Open(start_ns, loop, starts)
                else:
                    by_id[span_id] = _ENDED
                    if loop is not None and early.status == "ok":
                        timed(loop, starts, start_ns, max(early.wall_ns, start_ns))
                starts += 1
                continue
            attributes = dict(rec.attributes or {}) if name == _TRAINING_LOOP else _NO_ATTRIBUTES
            s = _Span(name, span_id, rec.parent_id, start_ns, attributes=attributes)
            by_id[span_id] = s
            spans.append(s)
            if early is not None:
                s.end_ns, s.status = max(early.wall_ns, start_ns), _end_status(early)
            if name == _TRAINING_LOOP:
                start = _int(attributes, "train_iterations_start") or 0
                loop = _Loop(span=s, start=max(start, 0), index=len(loops))
                loops.append(loop)
                loop_of[span_id] = loop
        elif kind == "span_end":
            found = by_id.get(rec.span_id)
            if found is None:
                if rec.name in _TRACKED:
                    early_ends[rec.span_id] = rec
            elif isinstance(found, _Open):
                end_ns = max(rec.wall_ns, found.start_ns)
                by_id[rec.span_id] = _ENDED
                stamp(end_ns)
                if found.loop is not None and rec.status == "ok":
                    timed(found.loop, found.index, found.start_ns, end_ns)
            elif found.end_ns is None:
                found.end_ns = max(rec.wall_ns, found.start_ns)
                found.status = _end_status(rec)
                if found.name in _LIFECYCLE:
                    stamp(found.end_ns)
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
                    stamp(ts)
            elif rec.name == "training_progress":  # the stall watchdog's heartbeat (distributed.watchdog)
                current, seconds = _int(attributes, "current_iteration"), _num(attributes,
                                                                               "cumulative_iteration_time_sec")
                if current is not None and seconds is not None and loops:
                    loops[-1].progress = (current + 1, seconds)
                ts = _stamp(attributes, "last_logged_train_iterations_finish_timestamp_sec")
                if ts is not None:
                    stamp(ts)
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
                    stamp(ts)
    for index, ended in order.items():  # in the order of their starts (an iteration may end after the next one)
        if any(a > b for a, b in itertools.pairwise(ended)):
            times = loops[index].iteration_times
            pairs = sorted(zip(ended, times[0::2], times[1::2], strict=True))
            loops[index].iteration_times = array("q", (t for _, start_ns, end_ns in pairs for t in (start_ns, end_ns)))
    return _Process(
        run=run_index,
        rank=rank,
        pid=pid,
        spans=spans,
        loops=loops,
        saves=saves,
        first_ns=first_ns,
        last_ns=last_ns,
        data_outside=any(p not in iteration_ids for p in data_parents),
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
    load_rank = rank_batches = None
    energy = False
    if engine is None:
        from ..store.engine import engine_for

        engine = engine_for(run_dirs)
    if engine is not None:
        from .goodput_sql import load_session

        datas, load_rank, rank_batches, energy = load_session(engine, runs)
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
                    load_rank=load_rank, rank_batches=rank_batches, energy=energy)
