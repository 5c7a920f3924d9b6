"""The report windows the findings engine holds, bounded whatever the run's length (``InputBuilder`` keeps them here,
so the pure-Python reader and the SQL path hold the same windows).

**The budget.** Up to ``WINDOW_BUDGET`` windows for all ranks together (65,536: ~30 MB of ``WindowPoint``), and never
fewer than ``MIN_WINDOWS_PER_RANK`` per rank: a run holds at most ``max(WINDOW_BUDGET, MIN_WINDOWS_PER_RANK x ranks)``
(plus each training loop's warm-up window and a few partial windows at its end), so memory grows with the ranks past
1,024 ranks only, and never with the run's length. A run within the budget (8 ranks x 400,000 iterations at the
recorder's 50-iteration windows, every run of the planted suite) is held as it was written.

**Merging.** Past the budget, every rank's resolution is halved at once: consecutive windows are merged pairwise, in
blocks aligned on each training loop's report count (the ``k``-th report after the warm-up window is in block
``k >> level``), so the ranks' merged windows still end at the same steps and the rules still compare ranks window by
window. Never merged: a loop's warm-up window (the first report of a (rank, pid, train_iterations_start)), windows of
different loops (a restart, another pid), windows with a gap between them (a report without a usable mean between
them, or steps that do not follow on: ``first_step != previous step + 1``), or windows that are not alike (other
phases, another phase clock, communication waits by other phases). A merged window (``merge_windows``): iterations
summed; the mean iteration time, the phases, the communication waits and the phases' iteration time weighted by
iterations; wall, CPU and CPU-wait seconds summed; the slowest iteration the largest; step and time those of the
last; ``p50`` the iterations-weighted mean of the parts' medians (a median of medians cannot be merged again, and the
slow-iteration rule reads the median of these over the rank's windows as its typical iteration); an optional figure
one part lacks is unknown (None); ``windows`` counts the reports merged.

**The same result whatever the feeding order.** A block's value is defined as a binary tree over its reports (a block
of level ``l + 1`` is its two halves of level ``l`` merged), computed incrementally: a loop keeps its complete blocks
and, for the reports since, the binary-counter stack of complete sub-blocks; raising the level merges neighbouring
blocks. The level is the lowest one at which the complete blocks' windows and the loops fit the budget; both only
grow as windows are fed, so the level reached is the same whether the ranks are fed one after another or
interleaved, and so are the merged windows, to the last bit.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from .inputs import WindowPoint

__all__ = ["MIN_WINDOWS_PER_RANK", "WINDOW_BUDGET", "WindowStore", "merge_windows", "mergeable", "merged_window"]

WINDOW_BUDGET = 65_536  # windows held for all ranks together, past which they are merged
MIN_WINDOWS_PER_RANK = 64  # ... but not below this many per rank (past 1,024 ranks the total grows with the ranks)

_NONE: Mapping[str, float] = MappingProxyType({})


class _Sums:
    """A merged window as it is built, in place: its means as sums over its iterations (mean x iterations), the
    rest as ``merge_windows`` says. It has the attributes ``mergeable`` reads (``phases``, ``comm_wait_by_phase`` and
    ``phase_iteration_time`` as sums: only their keys and None-ness are read there)."""

    __slots__ = ("comm", "comm_wait_by_phase", "cpu", "cpu_wait", "iterations", "max", "p50", "phase_clock",
                 "phase_iteration_time", "phases", "rank", "step", "thread_cpu", "thread_cpu_wait", "time", "time_s",
                 "wall", "windows")
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
            pit = None if pit is None else pit * n
            for k, v in o.phases.items():
                self.phases[k] += v * n
            for k, v in o.comm_wait_by_phase.items():
                self.comm_wait_by_phase[k] += v * n
            wall, cpu_wait, cpu, slowest = o.wall_seconds, o.cpu_wait_seconds, o.cpu_seconds, o.max_iteration_time
            thread_cpu_wait, thread_cpu = o.thread_cpu_wait_seconds, o.thread_cpu_seconds
        else:
            n, time, p50, comm, pit = o.iterations, o.time, o.p50, o.comm, o.phase_iteration_time
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
            windows=self.windows)


def merged_window(w: WindowPoint, sums: Mapping[str, Any]) -> WindowPoint:
    """The merged window of a block whose ``_Sums`` another engine computed (``findings_sql``'s SQL merge, pairwise as
    this module's tree merges): ``w``, the block's last window, gives what is not summed (rank, step, time, clock);
    ``sums`` the figures as ``_Sums`` holds them (iterations, windows, time, phases, max, p50, wall, cpu_wait, cpu,
    thread_cpu_wait, thread_cpu, comm, comm_wait_by_phase, phase_iteration_time)."""
    s = _Sums(w)
    for name, value in sums.items():
        setattr(s, name, value)
    return s.window()


def mergeable(a: WindowPoint | _Sums, b: WindowPoint | _Sums) -> bool:
    """Whether ``b`` follows ``a`` with no gap (its first step is the one after ``a``'s last) and holds the same
    figures (phases, phase clock, communication waits by phase), neither a warm-up window."""
    return (b.first_step == a.step + 1 and not a.warmup and not b.warmup and a.rank == b.rank
            and a.phase_clock == b.phase_clock and a.phases.keys() == b.phases.keys()
            and a.comm_wait_by_phase.keys() == b.comm_wait_by_phase.keys()
            and (a.phase_iteration_time is None) == (b.phase_iteration_time is None))


def merge_windows(a: WindowPoint, b: WindowPoint) -> WindowPoint:
    """One window for ``a`` and then ``b`` (``mergeable``): see the module's docstring."""
    s = _Sums(a)
    s.add(b)
    return s.window()


# a run of consecutive windows merged into one: [its first report's position in the loop, its last's, the wall time
# of its last report, the window (a WindowPoint as fed, or the _Sums of a merged one)]
_Piece = list[Any]


def _joins(x: _Piece, y: _Piece) -> bool:
    return bool(x[1] + 1 == y[0] and mergeable(x[3], y[3]))


def _merge_into(x: _Piece, y: _Piece) -> None:
    """``y`` into ``x``, which is the store's own (the tree's left operand, consumed)."""
    s = x[3]
    if isinstance(s, WindowPoint):
        s = x[3] = _Sums(s)
    s.add(y[3])
    x[1], x[2] = y[1], y[2]


def _combine(left: list[_Piece], right: list[_Piece], *, copy: bool = False) -> list[_Piece]:
    """The pieces of two neighbouring blocks as one block's: the last of ``left`` and the first of ``right`` merged
    when they join (the pieces within a block do not: a gap or a change parts them). ``copy``: leave ``left``'s
    pieces as they are (else ``left`` is consumed)."""
    if left and right and _joins(left[-1], right[0]):
        last = left[-1]
        if copy:
            value = last[3]
            last = [last[0], last[1], last[2], value.copy() if isinstance(value, _Sums) else value]
        _merge_into(last, right[0])
        return [*left[:-1], last, *right[1:]]
    return left + right


class _Node:
    """A block of ``2 ** level`` report positions of one loop, from ``pos``, as its pieces (none: every report in it
    had no usable mean)."""

    __slots__ = ("level", "pieces", "pos")

    def __init__(self, level: int, pos: int, pieces: list[_Piece]) -> None:
        self.level = level
        self.pos = pos
        self.pieces = pieces


class _Loop:
    """One training loop's windows: its warm-up window, the pieces of its complete blocks at the store's level, and
    the stack of complete sub-blocks since (their levels decreasing: the binary digits of the reports since)."""

    __slots__ = ("done", "positions", "rank", "tail", "warmup")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.warmup: tuple[int, WindowPoint] | None = None
        self.done: list[_Piece] = []
        self.tail: list[_Node] = []
        self.positions = 0  # the reports after the warm-up window fed so far (with or without a usable mean)


class WindowStore:
    """The windows of every rank and loop, merged past the budget (the module's docstring). ``add`` each report in
    its loop's order; ``windows()`` gives what is held, as (wall_ns of its last report, window)."""

    def __init__(self, budget: int | None = None, min_per_rank: int | None = None) -> None:
        self.budget = WINDOW_BUDGET if budget is None else budget
        self.min_per_rank = MIN_WINDOWS_PER_RANK if min_per_rank is None else min_per_rank
        self.level = 0  # blocks of 2 ** level reports make one window
        self._loops: dict[Hashable, _Loop] = {}
        self._ranks: dict[int, list[_Loop]] = {}
        self._held = 0  # pieces of complete blocks, and one for each loop (its warm-up and its partial block)
        self._by_rank: dict[int, int] = {}  # the same per rank
        self._most = 0  # the largest of _by_rank
        self._longest = 0  # the most reports of one loop

    def __contains__(self, key: Hashable) -> bool:
        return key in self._loops

    def add(self, key: Hashable, rank: int, wall_ns: int, window: WindowPoint | None) -> None:
        """One report of the loop ``key`` (rank, pid, train_iterations_start): its first is the warm-up window;
        ``window`` None when the report has no usable mean (it parts the windows around it)."""
        loop = self._loops.get(key)
        if loop is None:
            self._loops[key] = loop = _Loop(rank)
            self._ranks.setdefault(rank, []).append(loop)
            self._count(rank, 1)
            if window is not None:
                loop.warmup = (wall_ns, window)
            return
        p = loop.positions
        loop.positions = p + 1
        if p >= self._longest:
            self._longest = p + 1
        pieces: list[_Piece] = [] if window is None else [[p, p, wall_ns, window]]
        if self.level:
            level = 0
            tail = loop.tail
            while level < self.level and tail and tail[-1].level == level:  # its left sibling (a binary carry)
                pieces = _combine(tail.pop().pieces, pieces)
                level += 1
            if level < self.level:
                tail.append(_Node(level, p + 1 - (1 << level), pieces))
                return
        loop.done += pieces
        self._count(rank, len(pieces))
        while (self._held > self.budget and self._most > self.min_per_rank
               and (1 << self.level) < self._longest):
            self._raise()

    def _count(self, rank: int, n: int) -> None:
        self._held += n
        held = self._by_rank[rank] = self._by_rank.get(rank, 0) + n
        if held > self._most:
            self._most = held

    def _raise(self) -> None:
        """Every loop's complete blocks at the next level: neighbouring blocks merged pairwise; the last one, whose
        pair is not complete yet, goes to the bottom of its loop's stack."""
        self.level += 1
        level = self.level
        self._held, self._by_rank, self._most = 0, {}, 0
        for loop in self._loops.values():
            boundary = (loop.positions >> level) << level  # the reports in the complete blocks at the new level
            done: list[_Piece] = []
            left: list[_Piece] = []
            for piece in loop.done:
                if piece[0] >= boundary:
                    left.append(piece)
                elif done and done[-1][0] >> level == piece[0] >> level and _joins(done[-1], piece):
                    _merge_into(done[-1], piece)
                else:
                    done.append(piece)
            if (loop.positions >> (level - 1)) & 1:  # a complete block at the old level, half of a partial one now
                loop.tail.insert(0, _Node(level - 1, boundary, left))
            loop.done = done
            self._count(loop.rank, len(done) + 1)

    def put_loop(self, key: Hashable, rank: int, warmup: tuple[int, WindowPoint] | None,
                 windows: list[tuple[int, WindowPoint]], positions: int) -> None:
        """A loop whose windows another engine merged at this store's ``level`` (``regular_level``; its reports after
        the warm-up all usable and each joining the one before): held as ``windows()`` gives them. No ``add`` to this
        store afterwards (its blocks in progress are not kept)."""
        self._loops[key] = loop = _Loop(rank)
        self._ranks.setdefault(rank, []).append(loop)
        loop.warmup = warmup
        loop.done = [[0, 0, wall, w] for wall, w in windows]
        loop.positions = positions
        self._longest = max(self._longest, positions)
        self._count(rank, len(windows) + 1)

    def regular_level(self, loops: list[tuple[int, int]]) -> int:
        """The level this (empty) store reaches when fed, in this order, loops given as (rank, reports after the
        warm-up) whose reports all have a usable mean and each join the one before (``mergeable``): a complete block
        is then one piece, so the level follows from the counts alone. Each loop's reports are taken as fed one after
        another; the store's checks (``add``: at each block completed at the current level) are replayed."""
        level = 0
        held, most, longest = 0, 0, 0
        by_rank: dict[int, int] = {}
        fed: list[list[int]] = []  # [rank, positions]
        for rank, n in loops:
            loop = [rank, 0]
            fed.append(loop)
            held += 1
            by_rank[rank] = by_rank.get(rank, 0) + 1
            most = max(most, by_rank[rank])
            pos = 0
            while True:
                step = 1 << level
                pos = (pos // step + 1) * step  # the next report that completes a block at this level
                if pos > n:
                    break
                loop[1] = pos
                longest = max(longest, pos)
                held += 1
                by_rank[rank] += 1
                most = max(most, by_rank[rank])
                while held > self.budget and most > self.min_per_rank and (1 << level) < longest:
                    level += 1
                    by_rank = {}
                    for r, p in fed:
                        by_rank[r] = by_rank.get(r, 0) + (p >> level) + 1
                    held, most = sum(by_rank.values()), max(by_rank.values())
            loop[1] = n
            longest = max(longest, n)
        return level

    def windows(self) -> Iterator[tuple[int, WindowPoint]]:
        """Every window held, rank by rank (in the order first fed), loop by loop: the warm-up window, the complete
        blocks', then the partial block's (its sub-blocks merged as the tree would: the right ones first)."""
        for loops in self._ranks.values():
            for loop in loops:
                if loop.warmup is not None:
                    yield loop.warmup
                pieces = loop.done
                if loop.tail:
                    last = loop.tail[-1].pieces
                    for node in reversed(loop.tail[:-1]):
                        last = _combine(node.pieces, last, copy=True)
                    pieces = pieces + last
                for _, _, wall, w in pieces:
                    yield wall, w.window() if isinstance(w, _Sums) else w

    def __len__(self) -> int:
        """The windows held (``windows()``'s count, the partial blocks' sub-blocks apart)."""
        return sum((loop.warmup is not None) + len(loop.done) + sum(len(n.pieces) for n in loop.tail)
                   for loop in self._loops.values())
