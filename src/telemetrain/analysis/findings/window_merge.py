"""The arithmetic of merging report windows (``window_budget``'s docstring, "Merging"): ``_Sums``, a merged window as
it is built (its means as sums over its iterations), and whether two windows may be merged."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .inputs import WindowPoint

__all__ = ["merge_windows", "mergeable"]

_NONE: Mapping[str, float] = MappingProxyType({})


class _Sums:
    """A merged window as it is built, in place: its means as sums over its iterations (mean x iterations), the
    rest as ``merge_windows`` says. It has the attributes ``mergeable`` reads (``phases``, ``comm_wait_by_phase`` and
    ``phase_iteration_time`` as sums: only their keys and None-ness are read there)."""

    __slots__ = ("comm", "comm_wait_by_phase", "cpu", "cpu_wait", "iterations", "max", "p50", "phase_clock",
                 "phase_iteration_time", "phases", "rank", "step", "thread_cpu", "thread_cpu_wait", "time", "time_s",
                 "wall", "windows", "world")
    warmup = False  # a warm-up window is never merged

    def __init__(self, w: WindowPoint) -> None:
        n = max(w.iterations, 1)
        self.rank, self.step, self.iterations, self.windows = w.rank, w.step, n, w.windows
        self.time = w.iteration_time * n
        self.phases = {k: v * n for k, v in w.phases.items()}
        self.max = w.max_iteration_time
        self.p50 = None if w.p50 is None else w.p50 * n
        self.wall, self.cpu_wait, self.cpu = w.wall_seconds, w.cpu_wait_seconds, w.cpu_seconds
        self.thread_cpu_wait, self.thread_cpu = w.thread_cpu_wait_seconds, w.thread_cpu_seconds
        self.comm = None if w.comm_wait is None else w.comm_wait * n
        self.world = None if w.world_wait is None else w.world_wait * n
        self.comm_wait_by_phase = {k: v * n for k, v in w.comm_wait_by_phase.items()}
        self.phase_iteration_time = None if w.phase_iteration_time is None else w.phase_iteration_time * n
        self.time_s, self.phase_clock = w.time_s, w.phase_clock

    @property
    def first_step(self) -> int:
        return self.step - self.iterations + 1

    def copy(self) -> _Sums:
        c = object.__new__(_Sums)
        for name in _Sums.__slots__:
            setattr(c, name, getattr(self, name))
        c.phases, c.comm_wait_by_phase = dict(self.phases), dict(self.comm_wait_by_phase)
        return c

    def add(self, o: WindowPoint | _Sums) -> None:
        """``o``, the window that follows (``mergeable``), into this one."""
        if isinstance(o, WindowPoint):
            n = max(o.iterations, 1)
            time, p50, comm, pit = o.iteration_time * n, o.p50, o.comm_wait, o.phase_iteration_time
            p50 = None if p50 is None else p50 * n
            comm = None if comm is None else comm * n
            world = None if o.world_wait is None else o.world_wait * n
            pit = None if pit is None else pit * n
            for k, v in o.phases.items():
                self.phases[k] += v * n
            for k, v in o.comm_wait_by_phase.items():
                self.comm_wait_by_phase[k] += v * n
            wall, cpu_wait, cpu, slowest = o.wall_seconds, o.cpu_wait_seconds, o.cpu_seconds, o.max_iteration_time
            thread_cpu_wait, thread_cpu = o.thread_cpu_wait_seconds, o.thread_cpu_seconds
        else:
            n, time, p50, comm, pit, world = o.iterations, o.time, o.p50, o.comm, o.phase_iteration_time, o.world
            for k, v in o.phases.items():
                self.phases[k] += v
            for k, v in o.comm_wait_by_phase.items():
                self.comm_wait_by_phase[k] += v
            wall, cpu_wait, cpu, slowest = o.wall, o.cpu_wait, o.cpu, o.max
            thread_cpu_wait, thread_cpu = o.thread_cpu_wait, o.thread_cpu
        self.iterations += n
        self.windows += o.windows
        self.time += time
        self.p50 = None if self.p50 is None or p50 is None else self.p50 + p50
        self.comm = None if self.comm is None or comm is None else self.comm + comm
        self.world = None if self.world is None or world is None else self.world + world
        pit0 = self.phase_iteration_time
        self.phase_iteration_time = None if pit0 is None or pit is None else pit0 + pit
        self.wall = None if self.wall is None or wall is None else self.wall + wall
        self.cpu_wait = None if self.cpu_wait is None or cpu_wait is None else self.cpu_wait + cpu_wait
        self.cpu = None if self.cpu is None or cpu is None else self.cpu + cpu
        tw, tc = self.thread_cpu_wait, self.thread_cpu
        self.thread_cpu_wait = None if tw is None or thread_cpu_wait is None else tw + thread_cpu_wait
        self.thread_cpu = None if tc is None or thread_cpu is None else tc + thread_cpu
        if slowest is not None and (self.max is None or slowest > self.max):
            self.max = slowest
        self.step, self.time_s = o.step, o.time_s

    def window(self) -> WindowPoint:
        n = self.iterations
        return WindowPoint(
            rank=self.rank, step=self.step, iterations=n, iteration_time=self.time / n,
            phases={k: v / n for k, v in self.phases.items()} or _NONE, max_iteration_time=self.max,
            p50=None if self.p50 is None else self.p50 / n, wall_seconds=self.wall, cpu_wait_seconds=self.cpu_wait,
            cpu_seconds=self.cpu, thread_cpu_wait_seconds=self.thread_cpu_wait, thread_cpu_seconds=self.thread_cpu,
            comm_wait=None if self.comm is None else self.comm / n,
            comm_wait_by_phase={k: v / n for k, v in self.comm_wait_by_phase.items()} or _NONE, warmup=False,
            time_s=self.time_s, phase_clock=self.phase_clock,
            phase_iteration_time=None if self.phase_iteration_time is None else self.phase_iteration_time / n,
            windows=self.windows, world_wait=None if self.world is None else self.world / n)


def _sums_of(w: WindowPoint, sums: Mapping[str, Any]) -> _Sums:
    """The ``_Sums`` of a block merged by another engine (``findings_windows_sql``'s SQL merge, pairwise as
    ``window_budget``'s tree merges): ``w``, the block's last window, gives what is not summed (rank, step, time,
    clock); ``sums`` the figures as ``_Sums`` holds them (iterations, windows, time, phases, max, p50, wall, cpu_wait,
    cpu, thread_cpu_wait, thread_cpu, comm, comm_wait_by_phase, phase_iteration_time, world)."""
    s = _Sums(w)
    for name, value in sums.items():
        setattr(s, name, value)
    return s


def mergeable(a: WindowPoint | _Sums, b: WindowPoint | _Sums) -> bool:
    """Whether ``b`` follows ``a`` with no gap (its first step is the one after ``a``'s last) and holds the same
    figures (phases, phase clock, communication waits by phase), neither a warm-up window."""
    return (b.first_step == a.step + 1 and not a.warmup and not b.warmup and a.rank == b.rank
            and a.phase_clock == b.phase_clock and a.phases.keys() == b.phases.keys()
            and a.comm_wait_by_phase.keys() == b.comm_wait_by_phase.keys()
            and (a.phase_iteration_time is None) == (b.phase_iteration_time is None))


def merge_windows(a: WindowPoint, b: WindowPoint) -> WindowPoint:
    """One window for ``a`` and then ``b`` (``mergeable``): see ``window_budget``'s docstring."""
    s = _Sums(a)
    s.add(b)
    return s.window()
