"""``TracingTimestamp`` and ``Timer``: one-logger's pair of clocks (``nv_one_logger.core.time``).

A timestamp holds the wall clock (``time.time()``, for exported times) and the perf counter
(``time.perf_counter()``, for durations). Both are read through the ``time`` module at each call, so a test that
patches ``time.time`` / ``time.perf_counter`` sees its values in every span and event.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from .errors import InvalidConfigError

__all__ = ["Timer", "TracingTimestamp"]

# how far from now an explicit timestamp may be: one-logger's code rejects 10 minutes while its comment says 10 hours
# (a job whose startup took longer could not report its launch time); telemetrain allows the documented 10 hours
_TOLERANCE_SEC = 10 * 3600.0


# The clocks' offset, read once and kept while a fresh reading stays within 1 ms of it. Inferring each explicit time's
# perf counter from a fresh pair of readings (one-logger's way) adds microseconds of noise to every one: a span given
# start and finish 50 ms apart then measured 49 ms. A clock step over 1 ms (NTP) still moves the offset.
_reference: tuple[float, float] | None = None  # (wall seconds, perf counter seconds) read together


def _perf_counter_at(wall_now: float, perf_now: float, timestamp_sec: float) -> float:
    global _reference
    ref = _reference
    if ref is None or abs((perf_now - ref[1]) - (wall_now - ref[0])) > 1e-3:
        ref = _reference = (wall_now, perf_now)
    # wall times that close are subtracted exactly; only then added to the (small) perf counter
    return ref[1] + (timestamp_sec - ref[0])


@dataclasses.dataclass(frozen=True, slots=True)
class TracingTimestamp:
    """A point in time on both clocks. Immutable; equal when both readings are equal."""

    _seconds_since_epoch: float
    _perf_counter_seconds: float

    @property
    def seconds_since_epoch(self) -> float:
        return self._seconds_since_epoch

    @property
    def milliseconds_since_epoch(self) -> int:
        return int(self._seconds_since_epoch * 1000)

    @property
    def perf_counter_seconds(self) -> float:
        return self._perf_counter_seconds

    @classmethod
    def now(cls) -> TracingTimestamp:
        return cls(time.time(), time.perf_counter())

    @classmethod
    def for_timestamp(
        cls, timestamp_sec: float, perf_counter: float | None = None, validate_timestamp: bool = True
    ) -> TracingTimestamp:
        """A timestamp for a wall-clock time (seconds since the epoch). Without ``perf_counter``, the perf counter
        is inferred from the current offset between the clocks. ``validate_timestamp`` rejects a time more than 10
        hours from now (a unit mistake: milliseconds or a perf-counter value passed as seconds)."""
        if isinstance(timestamp_sec, bool) or not isinstance(timestamp_sec, (int, float)) \
                or not math.isfinite(timestamp_sec):
            raise TypeError(f"timestamp_sec must be a finite number of seconds since the epoch, got {timestamp_sec!r}")
        now = time.time()
        if validate_timestamp and abs(timestamp_sec - now) > _TOLERANCE_SEC:
            raise InvalidConfigError(
                f"timestamp_sec={timestamp_sec!r} is more than 10 hours from now ({now:.3f}): it must be seconds "
                "since the epoch")
        if not perf_counter:
            perf_counter = _perf_counter_at(now, time.perf_counter(), float(timestamp_sec))
        return cls(float(timestamp_sec), float(perf_counter))

    def to_json(self) -> dict[str, float]:
        return {"seconds_since_epoch": self._seconds_since_epoch, "perf_counter_seconds": self._perf_counter_seconds}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TracingTimestamp:
        if not isinstance(data, dict) or "seconds_since_epoch" not in data or "perf_counter_seconds" not in data:
            raise TypeError(f"TracingTimestamp data must have seconds_since_epoch and perf_counter_seconds: {data!r}")
        return cls(float(data["seconds_since_epoch"]), float(data["perf_counter_seconds"]))

    def __repr__(self) -> str:
        return f"TracingTimestamp(seconds_since_epoch={self._seconds_since_epoch}, " \
               f"perf_counter_seconds={self._perf_counter_seconds})"


class Timer:
    """A start/stop accumulator on the perf counter (one-logger's ``Timer``)."""

    def __init__(self) -> None:
        self._start_time: TracingTimestamp | None = None
        self._elapsed_time_since_last_reset = 0.0
        self._running = False

    @property
    def running(self) -> bool:
        return self._running

    def start(self, start_time: TracingTimestamp | None = None) -> None:
        if self._running:
            raise RuntimeError("start called when the timer was already running")
        self._start_time = start_time or TracingTimestamp.now()
        self._running = True

    def stop(self, reset: bool = False) -> float:
        if not self._running or self._start_time is None:
            raise RuntimeError("stop called when the timer was not running")
        self._running = False
        self._elapsed_time_since_last_reset += time.perf_counter() - self._start_time.perf_counter_seconds
        elapsed = self._elapsed_time_since_last_reset
        if reset:
            self.reset()
        return elapsed

    def reset(self, start: bool = False) -> None:
        self._start_time = None
        self._elapsed_time_since_last_reset = 0.0
        self._running = False
        if start:
            self.start()
