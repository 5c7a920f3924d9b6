"""How a ``Stat``'s windows fill and close (``StatWindows``, a base class of ``Stat``): the pending samples folded
into the open window a batch at a time, under the stat's lock (``_guard``); count and time windows closed; each closed
window queued, then emitted as a ``StatWindow`` record and handed to the stat's listeners.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..dispatch import describe, is_interrupt, warn_safely
from ..records import StatWindow
from ..telemetry import Telemetry
from .summary import Summary

__all__ = ["BATCH", "StatWindows"]

BATCH = 2048
_mono = time.monotonic_ns


class StatWindows:
    """The open window and its closing, for ``Stat``: the window's state is in these slots; the settings it reads are
    the ``Stat``'s (set by its ``__init__``)."""

    __slots__ = (
        "_active",
        "_buf",
        "_busy",
        "_deadline",
        "_last_summary",
        "_last_values",
        "_limit",
        "_lock",
        "_pending",
        "_start",
        "_window",
    )

    _active: bool
    _buf: list[int | float]
    _busy: bool
    _deadline: int
    _last_summary: Summary | None
    _last_values: dict[str, int | float]
    _limit: int
    _lock: threading.RLock
    _pending: deque[tuple[Any, ...]]
    _start: int
    _window: Summary

    # (the Stat's settings)
    samples: int | None
    report_empty: bool
    group: str
    _telemetry: Telemetry
    _aggregations: tuple[str, ...]
    _track: int
    _unit: str
    _window_ns: int
    _wall_phase: int
    _listeners: tuple[Callable[[Any, StatWindow], None], ...]
    _closed: bool

    if TYPE_CHECKING:  # (the Stat's)
        @property
        def name(self) -> str: ...

    def _full(self) -> None:
        """The batch is full, or a count window reached its N-th sample: fold, and close what is due. (``_guard``
        spelled out: with small count windows this runs every few samples.)"""
        with self._lock:
            if not self._busy:
                self._busy = True
                try:
                    self._drain()
                    if self._window_ns:
                        now = _mono()
                        if now >= self._deadline:  # the collector is late (busy interpreter): close on its behalf
                            self._close(now)
                finally:
                    self._busy = False
        if self._pending:
            self._emit_pending()

    @contextmanager
    def _guard(self) -> Iterator[bool]:
        """The stat's lock. Yields False when this thread already holds it: a signal handler (SIGTERM's flush) that
        interrupted this stat's own fold must not fold again on top of it; the exit flush reports the rest."""
        with self._lock:
            if self._busy:
                yield False
                return
            self._busy = True
            try:
                yield True
            finally:
                self._busy = False

    def _drain(self) -> None:
        """Under the lock: fold the pending samples into the open window, closing count windows as they fill."""
        buf = self._buf
        samples = self.samples
        window = self._window
        left = len(buf)  # what is there now: samples another thread appends meanwhile wait for the next drain
        while left > 0:
            # at most a batch at a time, so that folding a backlog needs no more than a batch of extra memory
            take = min(left, BATCH) if not samples else min(left, samples - window.count, BATCH)
            chunk = buf[:take]  # two steps, each atomic: what is appended meanwhile stays at the end
            del buf[:take]
            left -= take
            window.fold(chunk)
            if samples and window.count >= samples:
                self._close(_mono())
                window = self._window
        self._set_limit()

    def _set_limit(self) -> None:
        self._limit = min(BATCH, self.samples - self._window.count) if self.samples else BATCH

    def _close(self, now: int) -> None:
        """Under the lock: end the open window at ``now`` and start the next."""
        window = self._window
        if window.count:
            self._active = True
        if window.count or (self.report_empty and self._active):
            self._report(window, self._start, now)
            self._last_summary = window
        self._window = Summary(self._track)
        self._start = now
        if self._window_ns and now >= self._deadline:
            self._deadline = self._next_boundary(now)
        self._set_limit()

    def _report(self, window: Summary, start: int, end: int) -> None:
        values = window.values(self._aggregations, (end - start) / 1e9)
        self._last_values = values
        histogram = window.histogram_dict() if "histogram" in self._aggregations else None
        self._pending.append((start, end, window.count, values, histogram))

    def _emit_pending(self) -> None:
        pending = self._pending
        while pending:
            try:
                start, end, count, values, histogram = pending.popleft()
            except IndexError:  # another thread emitted it
                return
            if self._closed:
                continue
            telemetry = self._telemetry
            record = StatWindow(
                end,
                end + telemetry.wall_offset_ns,
                telemetry.identity,
                self.group,
                self.name,
                start,
                count,
                values,
                self._unit,
                histogram,
            )
            try:
                telemetry.emit(record)
            except BaseException as exc:  # a closed or broken pipeline must not reach add()
                if is_interrupt(exc):
                    raise
                warn_safely(f"telemetrain: stat {self.name!r} could not report a window: {describe(exc)}")
            for listener in self._listeners:
                try:
                    listener(self, record)
                except BaseException as exc:  # sys.exit in a torch.monitor handler, say
                    if is_interrupt(exc):
                        raise
                    warn_safely(f"telemetrain: a listener of stat {self.name!r} failed: {describe(exc)}")

    def _report_snapshot(self) -> None:
        """Report the open window and the pending samples without changing either (they are being folded below this
        frame): the batch in the fold's hands at that instant may be missing, the rest of the window is not."""
        snapshot = self._window.copy()
        snapshot.fold(list(self._buf))
        if snapshot.count:
            self._report(snapshot, self._start, _mono())

    def _next_boundary(self, now: int) -> int:
        size = self._window_ns
        phase = self._wall_phase
        return ((now + phase) // size + 1) * size - phase
