"""``Stat``: a named series of samples aggregated over windows (by count, by time, both, or cumulative).

The hot path only appends: ``add`` puts the sample on a list (atomic under the GIL, so concurrent threads lose
nothing) and checks its length. Every ``BATCH`` samples, or at the N-th sample of a count window, the list is folded
into the open window's ``Summary`` (C-level ``sum``/``min``/``max``, ~2-5 ns a sample); quantile stats keep their
samples until a window has more than ``RAW_LIMIT`` (exact quantiles) and fold them into the histogram beyond. The
folding and the closing of windows are ``Stat``'s base class, ``stat_windows.StatWindows``.

Windows close:
- by count at the N-th sample (``samples=N``); no sample is ever dropped, the next window starts at once;
- by time (``window=``) at the boundary, by the process's collector thread, even if ``add`` is never called again.
  Boundaries fall on wall-clock multiples of the window (a 60 s window closes on the minute), so the windows of
  every stat and every rank line up. A late close (busy interpreter, suspended process) ends the window when it
  actually closes; no empty windows are invented for the boundaries it missed;
- with both, at whichever comes first (a count close does not move the time boundaries);
- at ``flush()``/``close()`` of the stat or of its ``Telemetry`` (which happens at exit and on SIGTERM/SIGINT).
A cumulative stat (neither) never resets; it reports its totals at each flush and at exit.

Each closed window becomes a ``StatWindow`` record (start, end, sample count, one value per aggregation, and the
histogram when asked). An empty time window is reported as count 0 when ``report_empty`` (the default) -- in a
forked child only once the stat has had a sample there, so DataLoader workers do not report the parent's stats.

Memory per stat is bounded whatever the rate or the window (measured by ``bench/bench_stats.py``):
- pending samples: fewer than ``BATCH`` (2048), 32 bytes each as Python floats (a list slot and the float; up to 1/8
  more of spare list room), 40 as ints: at most ~72 KiB;
- the open window: a few hundred bytes, plus for quantile stats either its kept samples (at most ``RAW_LIMIT``, 2048,
  32 bytes each) or its histogram (at most 2 x 4096 buckets of 8 bytes): 64 KiB at most;
- the last closed window (``last_summary``, for merging across ranks): the same again.
So, pending samples apart, ~3 KiB for a stat without quantiles and at most 152 KiB (160 KiB with ints) for one with
quantiles. Closing a window whose histogram uses all 2 x 4096 buckets needs ~1.5 MB more for
a moment (the bucket counts as Python ints).
"""

from __future__ import annotations

import datetime
import functools
import inspect
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

from ..collector import collector
from ..records import StatWindow
from ..telemetry import Telemetry, check_name, check_value, get_telemetry
from .aggregations import DEFAULT_AGGREGATIONS, parse_aggregations, tracking
from .stat_windows import BATCH, StatWindows
from .summary import Summary

__all__ = ["BATCH", "MIN_WINDOW_S", "Stat"]

MIN_WINDOW_S = 0.001
_mono = time.monotonic_ns
_TIME_SCALE = {"s": 1e-9, "ms": 1e-6, "us": 1e-3, "µs": 1e-3, "ns": 1}
F = TypeVar("F", bound=Callable[..., Any])


def window_seconds(window: Any, arg: str = "window") -> float:
    """A window as float seconds: a ``timedelta`` or a number of seconds, at least 1 ms."""
    if isinstance(window, datetime.timedelta):
        seconds = window.total_seconds()
    elif isinstance(window, (int, float)) and not isinstance(window, bool):
        seconds = float(window)
    else:
        raise TypeError(f"{arg} must be a datetime.timedelta or seconds, got {type(window).__name__}")
    if not seconds >= MIN_WINDOW_S:  # also refuses NaN
        raise ValueError(f"{arg} must be at least 1 ms, got {seconds!r} s")
    if math.isinf(seconds):
        raise ValueError(f"{arg} must be finite (leave it out for a cumulative stat)")
    return seconds


def _number(value: Any) -> int | float:
    checked = check_value(value, "value")
    return int(checked) if type(checked) is bool else checked


class Stat(StatWindows):
    """A stat: ``add(v)`` samples, read closed windows with ``get()``, time code with ``time()``.

    ``aggregations``: names among value, count, sum, mean, min, max, stddev, rate, histogram and quantiles ``pNN``
    (``p50``, ``p99.9``...). ``window``: seconds or a ``timedelta`` (>= 1 ms). ``samples``: close every N samples.
    Neither: cumulative. ``group`` routes the records (mute it to silence them; the stat still aggregates).
    """

    __slots__ = (  # (and the open window's, in StatWindows)
        "__weakref__",
        "_aggregations",
        "_closed",
        "_emitted_count",
        "_listeners",
        "_name",
        "_pid",
        "_telemetry",
        "_time_scale",
        "_track",
        "_unit",
        "_wall_phase",
        "_window_ns",
        "group",
        "help",
        "report_empty",
        "samples",
        "window",
    )

    def __init__(
        self,
        name: str,
        aggregations: Iterable[Any] = DEFAULT_AGGREGATIONS,
        *,
        window: float | datetime.timedelta | None = None,
        samples: int | None = None,
        unit: str = "",
        help: str = "",
        group: str = "stats",
        report_empty: bool = True,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._name = check_name(name, "name")
        self._aggregations = parse_aggregations(aggregations)
        self.window = None if window is None else window_seconds(window)
        if samples is not None and (type(samples) is not int or samples < 1):
            raise ValueError(f"samples must be an int >= 1, got {samples!r}")
        self.samples = samples
        for arg, text in (("unit", unit), ("help", help)):
            if not isinstance(text, str):
                raise TypeError(f"{arg} must be a str, got {type(text).__name__}")
        self._unit = unit
        self._time_scale: float | None = _TIME_SCALE.get(unit)
        self.help = help
        self.group = check_name(group, "group")
        self.report_empty = bool(report_empty)
        if telemetry is not None and not isinstance(telemetry, Telemetry):
            raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
        self._telemetry = telemetry if telemetry is not None else get_telemetry()
        self._track = tracking(self._aggregations)
        self._window_ns = 0 if self.window is None else round(self.window * 1e9)
        self._listeners: tuple[Callable[[Stat, StatWindow], None], ...] = ()
        self._closed = False
        self._last_values: dict[str, int | float] = {}
        self._last_summary: Summary | None = None
        self._buf: list[int | float] = []
        self._init_state(active=True)
        from .registry import registry  # the registry module imports this one

        registry(self._telemetry).register(self)

    def _init_state(self, active: bool) -> None:
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._busy = False  # set while a locked region runs: a signal handler re-entering it skips (see _guard)
        self._pending: deque[tuple[Any, ...]] = deque()
        del self._buf[:]
        self._active = active
        self._start = _mono()
        self._window = Summary(self._track)
        # a cumulative stat reports at a flush when its count changed; an empty one once, if it reports empties
        self._emitted_count = -1 if self.report_empty and active else 0
        self._wall_phase = self._telemetry.wall_offset_ns
        self._deadline = self._next_boundary(self._start) if self._window_ns else 0
        self._set_limit()

    # -- the hot path ----------------------------------------------------------------------------------------------

    def add(self, value: float) -> None:
        """Add one sample (an int or a float; NaN and infinities are counted apart, see ``Summary``)."""
        if type(value) is not float and type(value) is not int:
            value = _number(value)
        buf = self._buf
        buf.append(value)
        if len(buf) >= self._limit:
            self._full()

    @overload
    def time(self, fn: None = None) -> _Timer: ...
    @overload
    def time(self, fn: F) -> F: ...

    def time(self, fn: Any = None) -> Any:
        """``with stat.time():`` adds the block's duration (monotonic clock) in the stat's time unit (``s`` unless
        the unit is ``ms``, ``us`` or ``ns``; a stat without a unit gets ``s``). As a decorator (``@stat.time`` or
        ``@stat.time()``) it times every call, coroutines included. Exceptions are timed too, and propagate."""
        if self._time_scale is None:
            if self._unit:
                raise ValueError(f"stat {self._name!r} has unit {self._unit!r}: time() needs s, ms, us or ns")
            self._unit, self._time_scale = "s", 1e-9
        timer = _new_timer(_Timer)
        timer._stat = self
        return timer if fn is None else timer(fn)

    # -- reading ---------------------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """Read-only: renaming a stat mid-run would split its series."""
        return self._name

    @property
    def unit(self) -> str:
        return self._unit

    @property
    def aggregations(self) -> tuple[str, ...]:
        return self._aggregations

    @property
    def telemetry(self) -> Telemetry:
        return self._telemetry

    def get(self) -> dict[str, int | float]:
        """The last closed window's values (empty before the first). A cumulative stat: its totals so far."""
        if self._window_ns or self.samples:
            return dict(self._last_values)
        with self._guard() as ok:
            if ok:
                self._drain()
            return self._window.values(self._aggregations, (_mono() - self._start) / 1e9)

    @property
    def count(self) -> int:
        """Samples in the open window (a cumulative stat: all of them)."""
        with self._guard() as ok:
            if ok:
                self._drain()
            return self._window.count + len(self._buf)

    @property
    def last_summary(self) -> Summary | None:
        """The last closed window as a mergeable ``Summary`` (for merging across ranks); ``None`` before one."""
        return self._last_summary

    def add_listener(self, listener: Callable[[Stat, StatWindow], None]) -> None:
        """Call ``listener(stat, record)`` for every window this stat reports (after the record is emitted)."""
        self._listeners = (*self._listeners, listener)

    # -- closing windows -------------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Close the open window now if it has samples (a cumulative stat reports its totals if they changed)."""
        if self._pid != os.getpid():
            self._after_fork_in_child()
        with self._guard() as ok:
            if not ok:  # a signal handler's close, in the middle of this stat's own fold: report what is there
                self._report_snapshot()
            else:
                self._drain()
                now = _mono()
                if not (self._window_ns or self.samples):
                    if self._window.count != self._emitted_count:
                        self._report(self._window, self._start, now)
                        self._last_summary = self._window.copy()
                        self._emitted_count = self._window.count
                elif self._window.count:
                    self._close(now)
        self._emit_pending()

    def close(self) -> None:
        """Report what is open and stop reporting. Later ``add`` calls are still aggregated (and ``get`` works), but
        nothing more is emitted."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        collector.cancel(self)
        from .registry import registry

        registry(self._telemetry).unregister(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def tick(self, now_ns: int) -> int | None:
        """The collector's call at a time boundary. Returns the next boundary."""
        if self._closed or self._pid != os.getpid():
            return None
        with self._guard() as ok:
            if ok:
                self._drain()
                if now_ns >= self._deadline:
                    self._close(now_ns)
        self._emit_pending()
        return self._deadline

    # -- process lifecycle -----------------------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        """A forked child starts with empty windows (the parent reports its own samples) and stays quiet until its
        first sample."""
        self._last_values = {}
        self._last_summary = None
        self._init_state(active=False)

    def __del__(self) -> None:
        try:
            if sys.is_finalizing():  # too late: no thread can start to write it (atexit already reported it)
                return
            if not self._closed and self._pid == os.getpid() and (self._buf or self._window.count):
                self.flush()
        except Exception:  # noqa: BLE001 - interpreter shutdown, half-built object
            pass

    def __repr__(self) -> str:
        if self._window_ns:
            how = f"window={self.window}s" + (f", samples={self.samples}" if self.samples else "")
        else:
            how = f"samples={self.samples}" if self.samples else "cumulative"
        return f"Stat({self.name!r}, {list(self._aggregations)}, {how})"


_new_timer = object.__new__


class _Timer:
    """One ``with stat.time():`` block, or a decorator."""

    __slots__ = ("_start", "_stat")
    _stat: Stat
    _start: int

    def __enter__(self) -> _Timer:
        self._start = _mono()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = _mono() - self._start
        stat = self._stat
        buf = stat._buf
        buf.append(elapsed * stat._time_scale)  # type: ignore[operator]  # set by time()
        if len(buf) >= stat._limit:
            stat._full()

    def __call__(self, fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"time() decorates a function, got {type(fn).__name__}")
        stat = self._stat
        scale: float = stat._time_scale  # type: ignore[assignment]  # set by time()

        def record(start: int) -> None:
            buf = stat._buf
            buf.append((_mono() - start) * scale)
            if len(buf) >= stat._limit:
                stat._full()

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                start = _mono()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    record(start)

            return timed_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = _mono()
            try:
                return fn(*args, **kwargs)
            finally:
                record(start)

        return timed  # type: ignore[return-value]
