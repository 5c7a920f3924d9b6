"""Clocks for timing communication: marks taken when a collective starts and ends, resolved later into seconds.

Two kinds, behind one small interface (``IntervalClock``), so that a device-timing module (CUDA events for compute
kernels, issue 18's) can share the CUDA one:

- ``HOST``: a mark is ``time.monotonic_ns()``. Right for CPU collectives (gloo), which complete on the host: the
  completion callback runs in gloo's thread when the work is done.
- ``CudaEventClock``: a mark is a CUDA event recorded on the current stream (no synchronisation: recording is
  asynchronous). A NCCL collective "returns" when it is enqueued, so only the device knows when it ran; the events
  are read when the window is reported, in the reporter's thread (``resolve`` waits for an event that has not
  completed yet there, never in the training thread). Events are pooled: one is created per mark only until the
  pool has enough.

Both resolve a list of marks to seconds on an axis of their own (the first mark is 0): intervals of one clock can be
compared with each other, not with another clock's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["HOST", "CudaEventClock", "HostClock", "IntervalClock"]


class IntervalClock(Protocol):
    """Takes marks now (any thread, cheap, never a device sync) and resolves them later."""

    name: str

    def mark(self) -> Any:
        """A point in time, now (on the device: when the current stream gets there)."""

    def resolve(self, marks: Sequence[Any]) -> list[float]:
        """The marks, in seconds from the first one. Called off the training thread."""

    def release(self, marks: Sequence[Any]) -> None:
        """The marks are no longer needed (a pooled clock reuses them)."""


class HostClock:
    name = "host"

    def mark(self) -> int:
        return time.monotonic_ns()

    def resolve(self, marks: Sequence[Any]) -> list[float]:
        if not marks:
            return []
        origin = marks[0]
        return [(m - origin) / 1e9 for m in marks]

    def release(self, marks: Sequence[Any]) -> None:
        pass


HOST = HostClock()


class CudaEventClock:
    """CUDA events with timing, recorded on the current stream of the current device. Requires torch with CUDA; the
    caller checks ``torch.cuda.is_available()`` and that the tensors are on the device."""

    name = "cuda"

    def __init__(self, pool_limit: int = 4096) -> None:
        import torch

        self._torch = torch
        self._pool: list[Any] = []
        self._pool_limit = pool_limit

    def mark(self) -> Any:
        pool = self._pool
        try:
            event = pool.pop()
        except IndexError:
            event = self._torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        return event

    def resolve(self, marks: Sequence[Any]) -> list[float]:
        if not marks:
            return []
        origin = marks[0]
        out = []
        for event in marks:
            if not event.query():
                event.synchronize()  # the reporter's thread waits for this event; the training thread never does
            out.append(origin.elapsed_time(event) / 1e3)  # ms -> s
        return out

    def release(self, marks: Sequence[Any]) -> None:
        room = self._pool_limit - len(self._pool)
        if room > 0:
            self._pool.extend(list(marks)[:room])
