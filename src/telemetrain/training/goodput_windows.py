"""A training loop's ``training_metrics_update`` windows as goodput reads them, and a list that holds them packed.

A rank's loop of 1M iterations reporting every 50 has 20,000 windows; goodput reads a rank's whole lifecycle while
DuckDB reads its next segment, and as objects (with their floats) the windows took ~250 bytes each: 4.7 MiB of the
readers' peak on 64 ranks x 1M iterations, ten times what a 100k-iteration rank holds. ``WindowList`` keeps each in
a 64-byte record and makes the ``_Window`` when it is read.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["WindowList"]


@dataclass(slots=True)
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


# completed, iterations, timed, total_sec, avg_sec, data_sec, window_sec, energy_J, then the flags
_RECORD = struct.Struct("<qqqdddddB7x")
_FINAL, _NO_AVG, _NO_ENERGY, _AS_OBJECT = 1, 2, 4, 8


class WindowList:
    """A loop's windows in the order they were appended; iterating makes each ``_Window`` again, equal field for
    field. A window whose integers do not fit 64 bits (a report can say anything) is kept as it is."""

    __slots__ = ("_data", "_n", "_objects")

    def __init__(self, windows: Iterable[_Window] = ()) -> None:
        self._data = bytearray()
        self._n = 0
        self._objects: dict[int, _Window] = {}
        for w in windows:
            self.append(w)

    def append(self, w: _Window) -> None:
        flags = (_FINAL if w.final else 0) | (_NO_AVG if w.avg_sec is None else 0) | \
            (_NO_ENERGY if w.energy_J is None else 0)
        try:
            record = _RECORD.pack(w.completed, w.iterations, w.timed, w.total_sec,
                                  0.0 if w.avg_sec is None else w.avg_sec, w.data_sec, w.window_sec,
                                  0.0 if w.energy_J is None else w.energy_J, flags)
        except (struct.error, OverflowError, TypeError):
            record = _RECORD.pack(0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, _AS_OBJECT)
            self._objects[self._n] = w
        self._data += record
        self._n += 1

    def _window(self, i: int) -> _Window:
        completed, iterations, timed, total, avg, data, window, energy, flags = \
            _RECORD.unpack_from(self._data, i * _RECORD.size)
        if flags & _AS_OBJECT:
            return self._objects[i]
        return _Window(completed=completed, iterations=iterations, timed=timed, total_sec=total,
                       avg_sec=None if flags & _NO_AVG else avg, data_sec=data, window_sec=window,
                       final=bool(flags & _FINAL), energy_J=None if flags & _NO_ENERGY else energy)

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[_Window]:
        return (self._window(i) for i in range(self._n))

    def __bool__(self) -> bool:
        return self._n > 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (WindowList, list)):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"WindowList({list(self)!r})"
