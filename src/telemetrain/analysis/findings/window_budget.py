"""The report windows the findings engine holds, bounded whatever the run's length (``InputBuilder`` keeps them here,
so the pure-Python reader and the SQL path hold the same windows).

**The budget.** Up to ``WINDOW_BUDGET`` windows for all ranks together (65,536: ~8-18 MB held, below), and never
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

**Held packed.** A loop's complete blocks (nearly all it holds) are held as one ``bytes`` each (``_pack``): the
window's numbers (its ints, and its floats that are set: the mean, the phases' and the waits' values, ...), and an
id of its *shape*, shared by the windows alike (which figures are set, the phases' and the waits' keys in their
order, the clock, warm-up, a merged block's ``_Sums`` or a window as fed); ``windows()`` makes each ``WindowPoint``
again, the same to the last bit (struct's ``d`` is the float's own 8 bytes). Measured with tracemalloc (10,000
windows of ``window_point_of_values``, their reader's row dropped): a window of the scale runs (mean, slowest,
median, wall seconds) ~0.13 KB held against ~0.48 KB as a ``WindowPoint`` in a 4-item list; with every figure set
(device phases, communication waits, CPU times) ~0.28 KB against ~1.48 KB. What is saved is the objects: a
``WindowPoint`` (20 slots, ~0.19 KB), a 24-byte float per figure, a dict per mapping (~0.2 KB), the list. Not done:
a lighter ``WindowPoint`` (a mapping with shared keys instead of the dicts; its numbers in an array): ``build``
makes them all for the rules anyway, while DuckDB's memory (the merge's, the other series' queries) is the peak,
which the windows held since their loop was read used to add to (64 ranks x 1M iterations: the RSS while the rules
run is ~35 MiB under the peak); and a slotted object's attributes are what the rules read fastest. A piece not
exactly of the types packed (an int subclass, an int for a float, another mapping, a number out of range) is held
as it is.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Hashable, Iterator, Mapping
from operator import attrgetter, itemgetter
from types import MappingProxyType
from typing import Any

from .inputs import WindowPoint
from .window_merge import _Sums, _sums_of, merge_windows, mergeable

__all__ = ["MIN_WINDOWS_PER_RANK", "WINDOW_BUDGET", "Held", "WindowStore", "hold", "hold_sums", "merge_windows",
           "mergeable"]

WINDOW_BUDGET = 65_536  # windows held for all ranks together, past which they are merged
MIN_WINDOWS_PER_RANK = 64  # ... but not below this many per rank (past 1,024 ranks the total grows with the ranks)

# a run of consecutive windows merged into one: [its first report's position in the loop, its last's, the wall time
# of its last report, the window (a WindowPoint as fed, or the _Sums of a merged one)]
_Piece = list[Any]
# a piece as a loop's complete blocks hold it: packed (``_pack``), or as it is where it cannot be
Held = bytes | _Piece

# the numbers a piece packs, after its shape's id: wall time, first and last position, rank, step, iterations, windows
_HEAD = "=IqiiiqqI"
_HEAD_ID = struct.Struct("=I")
# the floats of a window (a WindowPoint's, then the _Sums attributes that hold the same figure): the first two always
# set, the others only where not None
_POINT_FLOATS = ("iteration_time", "time_s", "max_iteration_time", "p50", "wall_seconds", "cpu_wait_seconds",
                 "cpu_seconds", "thread_cpu_wait_seconds", "thread_cpu_seconds", "comm_wait", "phase_iteration_time",
                 "world_wait")
_SUMS_FLOATS = ("time", "time_s", "max", "p50", "wall", "cpu_wait", "cpu", "thread_cpu_wait", "thread_cpu", "comm",
                "phase_iteration_time", "world")


_GET = {WindowPoint: attrgetter(*_POINT_FLOATS), _Sums: attrgetter(*_SUMS_FLOATS)}
_ONLY_FLOATS = frozenset({float}).issuperset  # (of the values' types: exactly floats)
_ONLY_INTS = frozenset({int}).issuperset


class _Shape:
    """What a packed piece's bytes do not hold, shared by the pieces alike: the kind (a WindowPoint or a _Sums),
    which optional floats are set, the phases' and the communication waits' keys (in their order: the rules sum
    their values in it), for each of the two when empty the object it was (a read-only one is shared: kept as the
    very object; None: a new dict), the clock, warm-up."""

    __slots__ = ("clock", "empty", "expand", "id", "n_floats", "n_phases", "phase_keys", "pick", "struct", "sums",
                 "wait_keys", "warmup")

    def __init__(self, id_: int, key: tuple[Any, ...], empty: list[Mapping[str, float] | None]) -> None:
        kind, types, self.phase_keys, self.wait_keys, self.clock, _, self.warmup, _, _, _ = key
        self.sums = kind is _Sums
        self.id = id_
        floats = [i for i, t in enumerate(types) if t is float]  # of _POINT_FLOATS: those packed
        self.n_floats, self.n_phases = len(floats), len(self.phase_keys)
        self.pick = itemgetter(*floats)  # (two at least: the mean and the time are always set)
        # the 12 floats from the numbers unpacked with a None after them
        self.expand = itemgetter(*(floats.index(i) if i in floats else -1 for i in range(len(types))))
        self.empty = empty
        self.struct = struct.Struct(_HEAD + "d" * (len(floats) + len(self.phase_keys) + len(self.wait_keys)))


_SHAPES: dict[tuple[Any, ...], _Shape] = {}  # every shape packed so far: a handful (one per kind of report)
_BY_ID: list[_Shape] = []
_MAX_SHAPES = 4096  # past this many (keys nobody writes), pieces are held unpacked rather than the table grow
_SHAPES_LOCK = threading.Lock()  # (a live view may build in another thread)


def _shape(key: tuple[Any, ...], phases: Mapping[str, float], waits: Mapping[str, float]) -> _Shape | None:
    """The shape of this key, made on its first piece; None where such pieces are held unpacked: a figure neither a
    float nor None, the mean or the time unset, a clock not a str, warm-up not a bool, a mapping neither a dict nor
    an empty read-only one."""
    _, types, _, _, _, clock_type, _, warmup_type, _, _ = key
    empty: list[Mapping[str, float] | None] = []
    for m in (phases, waits):
        if type(m) is not dict and (type(m) is not MappingProxyType or m):
            return None
        empty.append(None if type(m) is dict else m)
    if (not {float, type(None)}.issuperset(types) or types[0] is not float or types[1] is not float
            or clock_type is not str or warmup_type is not bool):
        return None
    with _SHAPES_LOCK:
        shape = _SHAPES.get(key)
        if shape is None:
            if len(_BY_ID) >= _MAX_SHAPES:
                return None
            shape = _SHAPES[key] = _Shape(len(_BY_ID), key, empty)
            _BY_ID.append(shape)
        return shape


def _pack(piece: _Piece) -> Held:
    """A piece of a loop's complete blocks in ~1/4 of the memory or less (the module's docstring): its numbers in one
    ``bytes``, the rest in its shape. Unpacked (``_unpack``) it is the same piece, to the last bit. The piece itself
    where a value is not exactly of the type packed (an int subclass, an int where a float is due, a mapping other
    than a dict or an empty read-only one) or is out of range."""
    first, last, wall, w = piece
    get = _GET.get(type(w))
    if get is None:
        return piece
    values = get(w)
    phases, waits, clock, warmup = w.phases, w.comm_wait_by_phase, w.phase_clock, w.warmup
    # (an empty read-only mapping by identity: its shape keeps it, so that its id is not another's)
    key = (type(w), tuple(map(type, values)), tuple(phases), tuple(waits), clock, type(clock), warmup, type(warmup),
           None if type(phases) is dict else id(phases), None if type(waits) is dict else id(waits))
    try:
        shape = _SHAPES.get(key) or _shape(key, phases, waits)
        if (shape is None or not _ONLY_FLOATS(map(type, phases.values())) or not _ONLY_FLOATS(map(type, waits.values()))
                or not _ONLY_INTS(map(type, (wall, first, last, w.rank, w.step, w.iterations, w.windows)))):
            return piece
        return shape.struct.pack(shape.id, wall, first, last, w.rank, w.step, w.iterations, w.windows,
                                 *shape.pick(values), *phases.values(), *waits.values())
    except (struct.error, TypeError):  # (out of range; a key that cannot be hashed)
        return piece


def _unpack(held: Held) -> _Piece:
    """The piece ``_pack`` packed (a new one each time: a _Sums may be merged into in place)."""
    if type(held) is not bytes:
        return held  # type: ignore[return-value]
    shape = _BY_ID[_HEAD_ID.unpack_from(held)[0]]
    _, wall, first, last, rank, step, iterations, windows, *numbers = shape.struct.unpack(held)
    k, n = shape.n_floats, shape.n_phases
    e_phases, e_waits = shape.empty
    phases: Any = dict(zip(shape.phase_keys, numbers[k:k + n], strict=True)) if n else \
        {} if e_phases is None else e_phases
    waits: Any = dict(zip(shape.wait_keys, numbers[k + n:], strict=True)) if shape.wait_keys else \
        {} if e_waits is None else e_waits
    numbers.append(None)
    f = shape.expand(numbers)
    if shape.sums:
        s = object.__new__(_Sums)
        s.rank, s.step, s.iterations, s.windows = rank, step, iterations, windows
        s.time, s.time_s, s.max, s.p50, s.wall, s.cpu_wait, s.cpu, s.thread_cpu_wait, s.thread_cpu, s.comm, \
            s.phase_iteration_time, s.world = f
        s.phases, s.comm_wait_by_phase, s.phase_clock = phases, waits, shape.clock
        return [first, last, wall, s]
    it, time_s, mx, p50, wall_s, cpu_wait, cpu, tcw, tc, comm, pit, world = f
    return [first, last, wall, WindowPoint(
        rank, step, iterations, it, phases, mx, p50, wall_s, cpu_wait, cpu, tcw, tc, comm, waits, shape.warmup,
        time_s, shape.clock, pit, windows, world)]


def hold(wall_ns: int, window: WindowPoint) -> Held:
    """A final window as ``WindowStore.put_loop`` takes it (packed at once: a reader that gathers many loops before
    it gives them holds them so)."""
    return _pack([0, 0, wall_ns, window])


def hold_sums(wall_ns: int, last: WindowPoint, sums: Mapping[str, Any]) -> Held:
    """``hold`` of the merged window of a block another engine summed (``last``, its last window, and ``sums``: see
    ``window_merge._sums_of``), kept as its sums (the window is made from them when read)."""
    return _pack([0, 0, wall_ns, _sums_of(last, sums)])


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
        self.done: list[Held] = []  # packed (``_pack``): a loop's windows are nearly all here
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
        loop.done += map(_pack, pieces)
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
            for piece in map(_unpack, loop.done):
                if piece[0] >= boundary:
                    left.append(piece)
                elif done and done[-1][0] >> level == piece[0] >> level and _joins(done[-1], piece):
                    _merge_into(done[-1], piece)
                else:
                    done.append(piece)
            if (loop.positions >> (level - 1)) & 1:  # a complete block at the old level, half of a partial one now
                loop.tail.insert(0, _Node(level - 1, boundary, left))
            loop.done = [_pack(p) for p in done]
            self._count(loop.rank, len(done) + 1)

    def put_loop(self, key: Hashable, rank: int, warmup: tuple[int, WindowPoint] | None, windows: list[Held],
                 positions: int) -> None:
        """A loop whose windows another engine merged at this store's ``level`` (``regular_level``; its reports after
        the warm-up all usable and each joining the one before), each as ``hold`` or ``hold_sums`` gave it: held as
        ``windows()`` gives them. No ``add`` to this store afterwards (its blocks in progress are not kept)."""
        self._loops[key] = loop = _Loop(rank)
        self._ranks.setdefault(rank, []).append(loop)
        loop.warmup = warmup
        loop.done = windows
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
                for _, _, wall, w in map(_unpack, loop.done):
                    yield wall, w.window() if isinstance(w, _Sums) else w
                if loop.tail:
                    last = loop.tail[-1].pieces
                    for node in reversed(loop.tail[:-1]):
                        last = _combine(node.pieces, last, copy=True)
                    for _, _, wall, w in last:
                        yield wall, w.window() if isinstance(w, _Sums) else w

    def __len__(self) -> int:
        """The windows held (``windows()``'s count, the partial blocks' sub-blocks apart)."""
        return sum((loop.warmup is not None) + len(loop.done) + sum(len(n.pieces) for n in loop.tail)
                   for loop in self._loops.values())
