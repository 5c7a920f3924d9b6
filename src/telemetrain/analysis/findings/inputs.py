"""The engine's input: plain in-memory series, whatever read them (the pure-Python reader, a SQL engine, a live
tail). Nothing here knows about files or records; ``builder.InputBuilder`` makes one from typed records.

Units: seconds and bytes; steps are global iterations (zero-based, ``current_iteration``); times on a run's axis are
seconds since its first record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .checkpoints import CheckpointSave
from .worker_exits import WorkerExit

__all__ = [
    "Attempt",
    "FindingsInput",
    "HostMemory",
    "MemorySeries",
    "NonFinite",
    "SpanFailure",
    "SpikeSelection",
    "ValueSeries",
    "WindowPoint",
    "contention_share",
]


OUTSIDE_SHARE = 1.5  # a window whose wall time is this many times its iterations' ran something else inside it


@dataclass(frozen=True, slots=True)
class WindowPoint:
    """One rank's report window (a ``training_metrics_update``): the iterations since its previous report."""

    rank: int
    step: int  # current_iteration: the global step of the window's last iteration
    iterations: int  # iterations in the window
    iteration_time: float  # mean seconds per iteration (avg_iteration_time_sec), finite and > 0
    phases: Mapping[str, float] = field(default_factory=dict)  # phase -> mean seconds per iteration
    max_iteration_time: float | None = None
    p50: float | None = None
    wall_seconds: float | None = None  # the window's wall time (window_seconds)
    cpu_wait_seconds: float | None = None  # the process's threads' wait for a CPU in the window (cpu_wait_sec)
    cpu_seconds: float | None = None  # the process's threads' time on a CPU in the window (cpu_time_sec)
    # the training thread's own (train_thread_cpu_wait_sec, train_thread_cpu_time_sec): the straggler rule's
    thread_cpu_wait_seconds: float | None = None
    thread_cpu_seconds: float | None = None
    comm_wait: float | None = None  # seconds per iteration waiting in communication (avg_comm_wait_time_sec)
    # where that wait was (avg_<phase>_comm_wait_sec: the phase open when the collective was launched, or "other")
    comm_wait_by_phase: Mapping[str, float] = field(default_factory=dict)
    warmup: bool = False  # the first window of its training loop (compilation, allocator growth): left out
    time_s: float = 0.0  # the window's end on the run's axis
    # the clock of ``phases``: "device" (CUDA events, avg_<phase>_device_time_sec) when the window has device times,
    # else "host" (phase_times.py); and the mean iteration time on that clock (None: ``iteration_time``), which the
    # time outside the phases is taken from
    phase_clock: str = "host"
    phase_iteration_time: float | None = None
    # the reports this window stands for: more than 1 when the run's windows were merged to fit the findings engine's
    # budget (window_budget.py; consecutive windows of one loop, their figures iteration-weighted)
    windows: int = 1
    # the part of ``comm_wait`` in collectives that span every rank (avg_comm_world_wait_time_sec): the late-rank
    # rule's basis (a wait in a pair or a pipeline's send/recv is a wait for that peer, not for the job)
    world_wait: float | None = None

    @property
    def phase_total(self) -> float:
        """The iteration time the phases split: on the phases' clock."""
        return self.phase_iteration_time if self.phase_iteration_time is not None else self.iteration_time

    @property
    def ran_outside(self) -> bool:
        """Whether the window ran something else than its iterations (a checkpoint, a validation loop, an
        evaluation): its wall time is ``OUTSIDE_SHARE`` times its iterations' time, at least."""
        return (self.wall_seconds is not None
                and self.wall_seconds > OUTSIDE_SHARE * max(self.iterations, 1) * self.iteration_time)

    @property
    def first_step(self) -> int:
        return self.step - max(self.iterations, 1) + 1

    @property
    def wait_fraction(self) -> float | None:
        """Contention: the share of the process's runnable time (its threads on a CPU or waiting for one) spent
        waiting, ``wait / (cpu + wait)`` (training/cpu_wait.py)."""
        return contention_share(self.cpu_seconds, self.cpu_wait_seconds)

    def busy_free(self, value: float) -> float:
        """``value`` (seconds per iteration) without the contention: what it would have been had every runnable
        thread had a CPU (taking the wait as spread evenly over the window)."""
        w = self.wait_fraction
        return value if w is None else value * (1.0 - w)


@dataclass(frozen=True, slots=True)
class SpikeSelection:
    """How a reader chose the points of a ``ValueSeries`` that holds only those the spike rule needs
    (``values.spike_selection``): the spike candidates and their neighbours, selected for these thresholds."""

    index: Sequence[int]  # each point's position among the series' finite points (increasing)
    candidate: Sequence[bool]  # whether the point passed the exact prefilter (values.py)
    finite: int  # the series' finite points in all
    history: int  # the thresholds it was selected for: spike_history, spike_min_history, spike_ratio
    min_history: int
    ratio: float


@dataclass(frozen=True, slots=True)
class ValueSeries:
    """A training value of one rank over steps: a loss or a gradient norm (``kind`` ``loss`` or ``grad_norm``)."""

    name: str
    kind: str
    rank: int
    points: Sequence[tuple[int, float]]  # (step, value) in step order; non-finite values included
    # None: ``points`` is the whole series; else it holds only the finite points this selection names
    selection: SpikeSelection | None = None


@dataclass(frozen=True, slots=True)
class MemorySeries:
    """A memory gauge over time: a rank's resident set (``kind`` ``rss``) or its CUDA allocator's live bytes
    (``cuda``)."""

    kind: str
    rank: int
    host: str
    device: str  # "" for host memory, else the CUDA device ("cuda:0")
    points: Sequence[tuple[float, float]]  # (seconds on the run's axis, bytes)
    limit: float | None = None  # bytes it can reach: the device's total memory (cuda); None: unknown
    # None: every point; else (steady_from, n): a reader kept only the points the memory rule reads of the n at or
    # after steady_from (memory.thin_indices), sorted by time
    thinned: tuple[float, int] | None = None


@dataclass(frozen=True, slots=True)
class HostMemory:
    """A host's memory at the end of the run, for projecting when growing processes exhaust it."""

    host: str
    total: float
    available: float


@dataclass(frozen=True, slots=True)
class ContainerMemory:
    """A host's container memory against its cgroup limit (the sampler's ``container.memory.*``): the limit, the
    last working-set (else usage) samples and the range of the cgroup's OOM-kill counter over the run."""

    host: str
    limit: float
    last: Sequence[tuple[int, float]]  # (wall_ns, bytes): the latest few samples, in time order
    oom_kills: tuple[float, float] | None = None  # (least, most) of the counter: it only grows
    working_set: bool = False  # ``last`` is the working set (usage less inactive file cache), else the usage


@dataclass(frozen=True, slots=True)
class NonFinite:
    """NaN or inf values of one metric (or NaN/inf counts of a stat window)."""

    group: str
    name: str
    count: int
    first_step: int | None
    rank: int
    example: float


@dataclass(frozen=True, slots=True)
class SpanFailure:
    """A ``training_loop`` or ``application`` span of this run that did not end ``ok``: ``status`` is ``error``,
    ``terminated`` or ``never ended`` (the process was killed)."""

    name: str
    rank: int
    status: str
    error: str = ""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of the session (a restart attempt), as goodput classifies it."""

    run_id: str
    restart_order: int
    status: str  # finished, crash, interrupted (Ctrl-C), killed, running, no_training, absent
    first_iteration: int | None
    last_iteration: int | None
    checkpointed_iterations: int | None
    lost_iterations: int
    current: bool  # the run being reported
    exits: tuple[Any, ...] = ()  # an earlier attempt's worker exits (worker_exits.WorkerExit), as its agent saw them


def contention_share(cpu: float | None, wait: float | None) -> float | None:
    """``wait / (cpu + wait)``, in [0, 1]; None when either is unknown or both are 0."""
    if cpu is None or wait is None or cpu + wait <= 0:
        return None
    return min(max(wait / (cpu + wait), 0.0), 1.0)


def finite(value: Any) -> float | None:
    """``value`` as a finite float, else None (bools are not numbers here)."""
    if type(value) is float:  # the common case first (each report's window reads ~14 of them)
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class FindingsInput:
    """Everything the rules read. Any part may be empty: a rule without its input finds nothing (and says so in a
    note where that is a surprise)."""

    windows: Sequence[WindowPoint] = ()
    values: Sequence[ValueSeries] = ()
    memory: Sequence[MemorySeries] = ()
    hosts_memory: Sequence[HostMemory] = ()
    containers: Sequence[ContainerMemory] = ()  # per host, where a cgroup memory limit applied
    nonfinite: Sequence[NonFinite] = ()
    # the live detectors' events (group cross_rank, name straggler: the cross-rank detector's, and late-rank
    # attribution's), as attribute dicts with "rank", "phase" (or "cause"), "step"
    straggler_events: Sequence[Mapping[str, Any]] = ()
    hosts: Mapping[int, str] = field(default_factory=dict)  # rank -> host
    span_failures: Sequence[SpanFailure] = ()
    attempts: Sequence[Attempt] = ()  # the session's runs in restart order (empty: not known)
    worker_exits: Sequence[WorkerExit] = ()  # the launcher agent's failed workers (its ``worker_failed`` events)
    stalls: Sequence[Mapping[str, Any]] = ()  # the launcher agent's ``stall`` events' attributes
    stall_evidence: Sequence[tuple[int, Mapping[str, Any]]] = ()  # (rank, a ``stall_evidence`` event's attributes)
    checkpoint_saves: Sequence[CheckpointSave] = ()  # every rank's checkpoint saves that ended ok
    # loss/grad-norm name -> (ranks with a finite point of it, the most finite points of one rank): from a reader that
    # gives only some series (SQL: those with spike candidates); the spike rule counts the series it has otherwise
    value_families: Mapping[str, tuple[int, int]] = field(default_factory=dict)
