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
loading, lost iteration time, and the rest (time between iterations) idle (``goodput_loop``). Iterations are never
counted from spans (they are sampled).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..store.reader import Run
from .goodput_energy import EnergyAccount, energy_account
from .goodput_loop import _Figures, _figures, _last_save, _running
from .goodput_loop import _warmup_seconds as _warmup_seconds  # (re-exported: imported from here before the split)
from .goodput_model import BADPUT_CATEGORIES, Badput, GoodputReport, RunGoodput
from .goodput_read import _load, _Save, _Session, _Span
from .names import SpanName

__all__ = ["BADPUT_CATEGORIES", "Badput", "GoodputReport", "RunGoodput", "goodput", "goodput_by_rank"]

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


@dataclass
class _Shared:
    """What every rank's report reads of the whole session, gathered once for ``goodput_by_rank``: each report
    walking every process of the session made thousands of ranks cost ~ranks^2."""

    ranks: tuple[int, ...]
    slots: dict[int, list[tuple[int, int]]]  # rank -> (run index, position in its run's processes), session order
    run_saves: list[list[_Save]]
    run_ranks: list[tuple[int, ...]]  # each run's ``Run.ranks`` (a sort of its processes per call)
    batches: list[list[int]]  # the ranks as ``load_rank`` loads them together (SQL), or all in one (Python)
    energy: EnergyAccount | None


def _slots(session: _Session) -> dict[int, list[tuple[int, int]]]:
    """rank -> (run index, position in the run's processes) of each of its processes, in session order."""
    slots: dict[int, list[tuple[int, int]]] = {}
    for i, d in enumerate(session.runs):
        for n, p in enumerate(d.processes):
            slots.setdefault(p.rank, []).append((i, n))
    return slots


def _shared(session: _Session) -> _Shared:
    slots = _slots(session)
    run_saves = [[s for p in d.processes for s in p.saves] for d in session.runs]
    ranks = sorted(slots)
    batches = session.rank_batches(ranks) if session.rank_batches is not None else [ranks]
    # the job's energy, not one rank's: one account (on the SQL path it loads each batch once, not every rank once
    # per report)
    energy = _energy(session, run_saves, None, slots, batches)
    return _Shared(tuple(ranks), slots, run_saves, [tuple(d.run.ranks) for d in session.runs], batches, energy)


def _report(session: _Session, rank: int, shared: _Shared | None = None) -> GoodputReport:
    if session.load_rank is not None:
        session.load_rank(session, rank)
    if shared is None:
        ranks: Sequence[int] = sorted({p.rank for d in session.runs for p in d.processes})
        processes = [p for d in session.runs for p in d.processes if p.rank == rank and p.first_ns is not None]
    else:  # (the processes themselves are read now: ``load_rank`` replaced the rank's light ones by whole ones)
        ranks = shared.ranks
        processes = [p for i, n in shared.slots.get(rank, ()) if (p := session.runs[i].processes[n]).first_ns
                     is not None]
    if not processes:
        from ..analysis.findings.fmt import ranges  # (a formatting helper of the readers': ``0..1023``)

        raise ValueError(
            f"{session.path}: rank {rank} wrote no training lifecycle record in this session (ranks with records: "
            f"{ranges([p.rank for d in session.runs for p in d.processes if p.first_ns]) or 'none'})"
        )
    notes = list(session.notes)
    run_saves = shared.run_saves if shared is not None else \
        [[s for p in d.processes for s in p.saves] for d in session.runs]
    loops = sorted(((loop, p) for p in processes for loop in p.loops), key=lambda lp: lp[0].span.start_ns)
    figures: list[_Figures] = []
    for i, (loop, p) in enumerate(loops):
        later = [other.start for other, _ in loops[i + 1:]]
        figures.append(_figures(loop, p, run_saves[p.run], min(later) if later else None,
                                loop.span.end_ns is None and _running(session, p.run)))

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
        last_ckpt = _last_save(checkpoints)
        ends = [f.end for f in mine]
        first = mine[0].start if mine else None
        last = max(ends) - 1 if mine and max(ends) > min(f.start for f in mine) else None
        restart_count = d.run.meta.get("restart_count")
        runs.append(RunGoodput(
            run_id=d.run.run_id,
            restart_order=i,
            restart_count=restart_count if isinstance(restart_count, int) else None,
            ranks=shared.run_ranks[i] if shared is not None else tuple(d.run.ranks),
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
            open_loop=bool(mine) and mine[-1].loop.span.end_ns is None,
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
    energy = shared.energy if shared is not None else _energy(session, run_saves, rank)
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


def _energy(session: _Session, run_saves: list[list[_Save]], reported: int | None,
            slots: Mapping[int, list[tuple[int, int]]] | None = None,
            batches: Sequence[Sequence[int]] | None = None) -> EnergyAccount | None:
    """Every rank's loops, kept and lost as goodput counts them (energy is the job's, not one rank's). On the SQL
    path (a batch of ranks' lifecycles in memory at a time) each batch is loaded in turn when the reports carry
    energy, then ``reported`` (the rank being reported, if any) again; the windows kept are those with energy's
    figures."""
    if session.load_rank is not None and not session.energy:
        return None
    loops = []
    if slots is None:
        slots = _slots(session)
    if batches is None:
        batches = session.rank_batches(sorted(slots)) if session.rank_batches is not None else [sorted(slots)]
    for batch in batches:  # (consecutive ranks: the loops in rank order)
        if session.load_rank is not None:
            session.load_rank(session, batch)
        for rank in batch:
            # (read after ``load_rank``: it replaced the rank's light processes by whole ones)
            procs = [session.runs[i].processes[n] for i, n in slots[rank]]
            mine = sorted(((loop, p) for p in procs for loop in p.loops), key=lambda lp: lp[0].span.start_ns)
            if not any(w.energy_J is not None for loop, _ in mine for w in loop.windows):
                continue
            for i, (loop, p) in enumerate(mine):
                later = [other.start for other, _ in mine[i + 1:]]
                f = _figures(loop, p, run_saves[p.run], min(later) if later else None,
                             loop.span.end_ns is None and _running(session, p.run))
                loops.append((session.runs[p.run].run.run_id, p.run, loop.windows, f.start, f.kept, f.end))
    if session.load_rank is not None and reported is not None:
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
    shared = _shared(session)
    if session.load_rank is None or session.rank_batches is None:
        return {rank: _report(session, rank, shared) for rank in ranks}
    out: dict[int, GoodputReport] = {}
    wanted = set(ranks)
    for batch in shared.batches:  # by SQL: short ranks loaded together (a query a batch)
        session.load_rank(session, batch)
        out.update((rank, _report(session, rank, shared)) for rank in batch if rank in wanted)
    return out
