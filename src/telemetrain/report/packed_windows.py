"""A rank's report windows held packed: one fixed-size record per window in one ``bytearray``.

The SQL path's model keeps every rank's merged windows (up to 1,000 for the charted rank, the budget's share for the
others). As ``Window`` objects, each with its floats and its phases' dict, a window took ~470 bytes of Python objects:
7.8 MiB on 64 ranks x 1M iterations, the report's largest holding at its peak. Packed, a window is 136 bytes, and a
``Window`` is made when one is read (the chart reads one rank's).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from .model_pass import PHASES, Window

__all__ = ["PackedWindows"]

# iteration, wall_ns, iterations, then the floats; None is a bit of ``nones`` (NaN and infinities are data, kept)
_FLOATS = ("avg", "p50", "p90", "p99", "max", "total", "samples_per_second", "phase_avg")
_RECORD = struct.Struct(f"<qqqI?3x{len(_FLOATS) + len(PHASES)}d")
_ITERATION_NONE = 1 << 30  # the window's iteration unknown
_WALL_NONE = 1 << 31  # its wall time unknown
_NO_VALUE = 0.0  # what a None field holds in its slot


class PackedWindows(Sequence[Window]):
    """One rank's windows, in the order they were added; indexing and iterating make ``Window``s. Equal to any
    sequence of the same ``Window``s (a list of them, as the pure-Python path holds)."""

    __slots__ = ("_data", "_n", "rank")

    def __init__(self, rank: int, windows: Iterable[Window] = ()) -> None:
        self.rank = rank
        self._data = bytearray()
        self._n = 0
        for w in windows:
            self.append(w)

    def append(self, w: Window) -> None:
        if w.rank != self.rank:
            raise ValueError(f"window of rank {w.rank} added to rank {self.rank}'s")
        nones = 0
        values: list[float] = []
        for i, name in enumerate(_FLOATS):
            v = getattr(w, name)
            if v is None:
                nones |= 1 << i
            values.append(_NO_VALUE if v is None else float(v))
        for i, phase in enumerate(PHASES, start=len(_FLOATS)):
            v = w.phases.get(phase)
            if v is None:
                nones |= 1 << i
            values.append(_NO_VALUE if v is None else float(v))
        extra = set(w.phases) - set(PHASES)
        if extra:
            raise ValueError(f"phases {sorted(extra)} are not among {PHASES}")
        if w.iteration is None:
            nones |= _ITERATION_NONE
        if w.wall_ns is None:
            nones |= _WALL_NONE
        self._data += _RECORD.pack(w.iteration or 0, w.wall_ns or 0, w.iterations, nones,
                                   w.phase_source == "device", *values)
        self._n += 1

    def _window(self, i: int) -> Window:
        iteration, wall, iterations, nones, device, *values = _RECORD.unpack_from(self._data, i * _RECORD.size)
        floats = [None if nones >> k & 1 else v for k, v in enumerate(values)]
        avg, p50, p90, p99, mx, total, sps, pavg = floats[:len(_FLOATS)]
        phases = {p: v for p, v in zip(PHASES, floats[len(_FLOATS):], strict=True) if v is not None}
        return Window(rank=self.rank, iteration=None if nones & _ITERATION_NONE else iteration,  # type: ignore[arg-type]
                      wall_ns=None if nones & _WALL_NONE else wall,  # type: ignore[arg-type]
                      iterations=iterations, avg=avg, p50=p50, p90=p90, p99=p99, max=mx, total=total,
                      samples_per_second=sps, phases=phases, phase_source="device" if device else "host",
                      phase_avg=pavg)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> Window: ...

    @overload
    def __getitem__(self, index: slice) -> list[Window]: ...

    def __getitem__(self, index: int | slice) -> Window | list[Window]:
        if isinstance(index, slice):
            return [self._window(i) for i in range(*index.indices(self._n))]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("window index out of range")
        return self._window(index)

    def __iter__(self) -> Iterator[Window]:
        return (self._window(i) for i in range(self._n))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedWindows(rank={self.rank}, {self._n} windows)"

    def nbytes(self) -> int:
        """Bytes the records take."""
        return len(self._data)
