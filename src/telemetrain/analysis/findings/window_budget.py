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

from .inputs import WindowPoint

__all__ = ["MIN_WINDOWS_PER_RANK", "WINDOW_BUDGET", "WindowStore", "merge_windows", "mergeable"]

WINDOW_BUDGET = 65_536  # windows held for all ranks together, past which they are merged
MIN_WINDOWS_PER_RANK = 64  # ... but not below this many per rank (past 1,024 ranks the total grows with the ranks)

_NONE: Mapping[str, float] = MappingProxyType({})


def mergeable(a: WindowPoint, b: WindowPoint) -> bool:
    """Whether ``b`` follows ``a`` with no gap (its first step is the one after ``a``'s last) and holds the same
    figures (phases, phase clock, communication waits by phase), neither a warm-up window."""
    return (b.first_step == a.step + 1 and not a.warmup and not b.warmup and a.rank == b.rank
            and a.phase_clock == b.phase_clock and a.phases.keys() == b.phases.keys()
            and a.comm_wait_by_phase.keys() == b.comm_wait_by_phase.keys()
            and (a.phase_iteration_time is None) == (b.phase_iteration_time is None))


def merge_windows(a: WindowPoint, b: WindowPoint) -> WindowPoint:
    """One window for ``a`` and then ``b`` (``mergeable``): see the module's docstring."""
    na, nb = max(a.iterations, 1), max(b.iterations, 1)
    n = na + nb

    def mean(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else (x * na + y * nb) / n

    def total(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else x + y

    slowest = [v for v in (a.max_iteration_time, b.max_iteration_time) if v is not None]
    return WindowPoint(
        rank=b.rank, step=b.step, iterations=n, iteration_time=(a.iteration_time * na + b.iteration_time * nb) / n,
        phases={k: (v * na + b.phases[k] * nb) / n for k, v in a.phases.items()} or _NONE,
        max_iteration_time=max(slowest) if slowest else None, p50=mean(a.p50, b.p50),
        wall_seconds=total(a.wall_seconds, b.wall_seconds),
        cpu_wait_seconds=total(a.cpu_wait_seconds, b.cpu_wait_seconds), cpu_seconds=total(a.cpu_seconds, b.cpu_seconds),
        comm_wait=mean(a.comm_wait, b.comm_wait),
        comm_wait_by_phase={k: (v * na + b.comm_wait_by_phase[k] * nb) / n
                            for k, v in a.comm_wait_by_phase.items()} or _NONE,
        warmup=False, time_s=b.time_s, phase_clock=b.phase_clock,
        phase_iteration_time=mean(a.phase_iteration_time, b.phase_iteration_time), windows=a.windows + b.windows)


# a run of consecutive windows merged into one: (its first report's position in the loop, its last's, the wall time
# of its last report, the window)
_Piece = tuple[int, int, int, WindowPoint]


def _joins(x: _Piece, y: _Piece) -> bool:
    return x[1] + 1 == y[0] and mergeable(x[3], y[3])


def _merge(x: _Piece, y: _Piece) -> _Piece:
    return x[0], y[1], y[2], merge_windows(x[3], y[3])


def _combine(left: list[_Piece], right: list[_Piece]) -> list[_Piece]:
    """The pieces of two neighbouring blocks as one block's: the last of ``left`` and the first of ``right`` merged
    when they join (the pieces within a block do not: a gap or a change parts them)."""
    if left and right and _joins(left[-1], right[0]):
        return [*left[:-1], _merge(left[-1], right[0]), *right[1:]]
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
        loop.positions += 1
        self._longest = max(self._longest, loop.positions)
        node = _Node(0, p, [] if window is None else [(p, p, wall_ns, window)])
        tail = loop.tail
        while node.level < self.level and tail and tail[-1].level == node.level:  # its left sibling (binary carry)
            left = tail.pop()
            node = _Node(node.level + 1, left.pos, _combine(left.pieces, node.pieces))
        if node.level < self.level:
            tail.append(node)
            return
        loop.done += node.pieces
        self._count(rank, len(node.pieces))
        while (self._held > self.budget and self._most > self.min_per_rank
               and (1 << self.level) < self._longest):
            self._raise()

    def _count(self, rank: int, n: int) -> None:
        self._held += n
        held = self._by_rank[rank] = self._by_rank.get(rank, 0) + n
        self._most = max(self._most, held)

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
                    done[-1] = _merge(done[-1], piece)
                else:
                    done.append(piece)
            if (loop.positions >> (level - 1)) & 1:  # a complete block at the old level, half of a partial one now
                loop.tail.insert(0, _Node(level - 1, boundary, left))
            loop.done = done
            self._count(loop.rank, len(done) + 1)

    def windows(self) -> Iterator[tuple[int, WindowPoint]]:
        """Every window held, rank by rank (in the order first fed), loop by loop: the warm-up window, the complete
        blocks', then the partial block's (its sub-blocks merged as the tree would: the right ones first)."""
        for loops in self._ranks.values():
            for loop in loops:
                if loop.warmup is not None:
                    yield loop.warmup
                for _, _, wall, w in loop.done:
                    yield wall, w
                if loop.tail:
                    pieces = loop.tail[-1].pieces
                    for node in reversed(loop.tail[:-1]):
                        pieces = _combine(node.pieces, pieces)
                    for _, _, wall, w in pieces:
                        yield wall, w

    def __len__(self) -> int:
        """The windows held (``windows()``'s count, the partial blocks' sub-blocks apart)."""
        return sum((loop.warmup is not None) + len(loop.done) + sum(len(n.pieces) for n in loop.tail)
                   for loop in self._loops.values())
