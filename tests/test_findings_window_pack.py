"""The findings engine's held windows, packed (``window_budget._pack``): a piece comes back as it went in, to the last
bit (every figure, its type, the order of its phases), whatever is set; a piece that cannot be packed exactly is held
as it is; the store holds its complete blocks packed on both feeds."""

from __future__ import annotations

import math
import random
import struct
from types import MappingProxyType
from typing import Any

import pytest

from telemetrain.analysis.findings import InputBuilder, WindowPoint
from telemetrain.analysis.findings import window_budget as wb
from telemetrain.analysis.findings.builder import WINDOW_POINT_KEYS, window_point_of_values
from telemetrain.analysis.findings.window_merge import _Sums

_SUMS_FIELDS = ("rank", "step", "iterations", "windows", "time", "phases", "max", "p50", "wall", "cpu_wait", "cpu",
                "thread_cpu_wait", "thread_cpu", "comm", "comm_wait_by_phase", "phase_iteration_time", "time_s",
                "phase_clock")
_POINT_FIELDS = tuple(WindowPoint.__dataclass_fields__)


def _bits(v: Any) -> Any:
    """A value as its exact bits: a float's hex (NaN and -0.0 apart), a mapping's type, items and their order."""
    if type(v) is float:
        return ("float", struct.pack("<d", v).hex())
    if isinstance(v, (dict, MappingProxyType)):
        return (type(v).__name__, [(k, _bits(x)) for k, x in v.items()])
    return (type(v).__name__, v)


def _piece_bits(piece: list[Any]) -> Any:
    first, last, wall, w = piece
    names = _SUMS_FIELDS if type(w) is _Sums else _POINT_FIELDS
    return (first, last, wall, type(w).__name__, [(n, _bits(getattr(w, n))) for n in names])


_ODD = [0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, 1e308, 0.1, 1 / 3]


def _window(rng: random.Random) -> WindowPoint:
    def num() -> float:
        return rng.choice(_ODD) if rng.random() < 0.2 else rng.random()

    def opt() -> float | None:
        return None if rng.random() < 0.4 else num()

    phases: Any = {p: num() for p in rng.sample(["forward", "backward", "h2d", "optimizer"], rng.randrange(0, 5))}
    waits: Any = {p: num() for p in rng.sample(["forward", "backward", "other"], rng.randrange(0, 4))}
    if not phases and rng.random() < 0.5:
        phases = MappingProxyType({})  # as the readers give a window without phases (shared, read-only)
    return WindowPoint(
        rank=rng.randrange(0, 3000), step=rng.choice([0, 9, 2**40, -5]), iterations=rng.choice([1, 50, 10**6]),
        iteration_time=num(), phases=phases, max_iteration_time=opt(), p50=opt(), wall_seconds=opt(),
        cpu_wait_seconds=opt(), cpu_seconds=opt(), thread_cpu_wait_seconds=opt(), thread_cpu_seconds=opt(),
        comm_wait=opt(), comm_wait_by_phase=waits, warmup=rng.random() < 0.1, time_s=num(),
        phase_clock=rng.choice(["host", "device"]), phase_iteration_time=opt(), windows=rng.choice([1, 2, 64]),
        world_wait=opt())


def test_a_packed_piece_comes_back_to_the_last_bit() -> None:
    rng = random.Random(11)
    packed = 0
    for _ in range(3000):
        w = _window(rng)
        value: Any = w
        if rng.random() < 0.4:  # a merged window's sums, as the store merges them in place
            value = _Sums(w)
            if rng.random() < 0.5:
                value.add(w)
        piece = [rng.randrange(0, 10**6), rng.randrange(0, 10**6), rng.randrange(0, 2**63), value]
        expected = _piece_bits(piece)
        held = wb._pack(piece)
        packed += type(held) is bytes
        back = wb._unpack(held)
        assert _piece_bits(back) == expected
        if type(value) is WindowPoint:
            assert back[3] == w or "nan" in repr(w)  # (NaN is not equal to itself)
            if not w.phases and type(w.phases) is MappingProxyType:
                assert back[3].phases is w.phases  # the shared empty mapping stays the one object
        assert wb._unpack(held) is not back or type(held) is not bytes  # a new piece each time (merged into)
    assert packed == 3000


def test_what_cannot_be_packed_exactly_is_held_as_it_is() -> None:
    w = window_point_of_values(1, [99, 50, 0, 0.1] + [None] * (len(WINDOW_POINT_KEYS) - 4), warmup=False)
    assert w is not None and type(wb._pack([0, 0, 1, w])) is bytes

    class Step(int):
        pass

    for odd in ({"step": Step(99)}, {"iterations": True}, {"step": 2**70}, {"iteration_time": 1},
                {"phases": MappingProxyType({"forward": 0.1})}, {"comm_wait_by_phase": {"other": 1}},
                {"phase_clock": None}):
        v = WindowPoint(**{**{n: getattr(w, n) for n in _POINT_FIELDS}, **odd})
        piece = [0, 0, 1, v]
        assert wb._pack(piece) is piece and wb._unpack(piece) is piece, odd
    assert type(wb._pack([2**31, 0, 1, w])) is list  # a position out of range


def _report(rank: int, k: int) -> list[Any]:
    values: list[Any] = [None] * len(WINDOW_POINT_KEYS)
    values[:4] = [k * 10 + 9, 10, 0, 0.1 + 0.001 * (k % 7)]
    values[WINDOW_POINT_KEYS.index("avg_forward_time_sec")] = 0.03 + 0.0001 * k
    values[WINDOW_POINT_KEYS.index("window_seconds")] = 1.0 + k
    return values


def _windows(monkeypatch: pytest.MonkeyPatch, budget: int, *, pack: bool) -> tuple[wb.WindowStore, list[Any]]:
    with monkeypatch.context() as m:
        if not pack:
            m.setattr(wb, "_pack", lambda piece: piece)
        b = InputBuilder(window_budget=budget)
        for rank in range(3):
            for k in range(200):
                b.window_values(rank, 7, 10**9 * (k + 1), _report(rank, k))
        return b._store, [(wall, [(n, _bits(getattr(w, n))) for n in _POINT_FIELDS])
                          for wall, w in b._store.windows()]


def test_the_store_holds_its_complete_blocks_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fed report by report past the budget (merged: the blocks' sums) and within it (the windows as fed): the
    complete blocks are held as bytes, and read back as the windows held unpacked, to the last bit."""
    for budget in (40, 10_000):
        store, windows = _windows(monkeypatch, budget, pack=True)
        assert (store.level > 0) == (budget == 40)
        assert all(type(p) is bytes for loop in store._loops.values() for p in loop.done)
        assert sum(len(loop.done) for loop in store._loops.values()) > 3 * 10
        assert windows == _windows(monkeypatch, budget, pack=False)[1]
        assert [w for _, w in store.windows()] == [w for _, w in store.windows()]  # reading does not consume
