"""The accumulators behind one-logger's derived metrics (``nv_one_logger.core.internal``'s ``MultiWindowTimer`` and
``MetricSummarizer``), with its arithmetic: every window since the start of the job counts (no reset), so its
"average iteration time" is the job's running mean, not the last N iterations' (telemetrain's own
``training_metrics_update`` in the run store has both, with percentiles)."""

from __future__ import annotations

from typing import Generic, TypeVar

from .errors import OneLoggerError
from .timestamps import TracingTimestamp

__all__ = ["MetricSummarizer", "MultiWindowTimer"]


class MultiWindowTimer:
    """Count, total, min, max, average, latest duration, first start and latest end of successive windows."""

    __slots__ = (
        "_avg_window_duration_sec",
        "_current_window_start",
        "_first_window_start",
        "_latest_window_duration_sec",
        "_latest_window_end",
        "_max_window_duration_sec",
        "_min_window_duration_sec",
        "_total_time_sec",
        "_total_window_count",
    )

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._current_window_start: TracingTimestamp | None = None
        self._first_window_start: TracingTimestamp | None = None
        self._latest_window_end: TracingTimestamp | None = None
        self._latest_window_duration_sec = 0.0
        self._total_window_count = 0
        self._total_time_sec = 0.0
        self._min_window_duration_sec = float("inf")
        self._max_window_duration_sec = 0.0
        self._avg_window_duration_sec = 0.0

    def start(self, start_time: TracingTimestamp | None = None) -> None:
        if self._current_window_start is not None:
            raise OneLoggerError("Cannot start timer since it is already active")
        start = start_time or TracingTimestamp.now()
        self._current_window_start = start
        self._total_window_count += 1
        if self._first_window_start is None:
            self._first_window_start = start

    def stop(self, stop_time: TracingTimestamp | None = None) -> None:
        stop = stop_time or TracingTimestamp.now()
        start = self._current_window_start
        self._current_window_start = None
        if start is None:
            raise OneLoggerError("Cannot stop timer since it is not active")
        if stop.seconds_since_epoch < start.seconds_since_epoch:
            raise OneLoggerError(f"Cannot stop timer with a stop time that is before the start time. stop_time: "
                                 f"{stop}, current_window_start: {start}")
        duration = stop.perf_counter_seconds - start.perf_counter_seconds
        self._latest_window_end = stop
        self._latest_window_duration_sec = duration
        self._min_window_duration_sec = min(self._min_window_duration_sec, duration)
        self._max_window_duration_sec = max(self._max_window_duration_sec, duration)
        self._total_time_sec += duration
        self._avg_window_duration_sec = self._total_time_sec / self._total_window_count

    @property
    def is_active(self) -> bool:
        return self._current_window_start is not None

    @property
    def current_window_start(self) -> TracingTimestamp | None:
        return self._current_window_start

    @property
    def total_window_count(self) -> int:
        return self._total_window_count

    @property
    def total_time_sec(self) -> float:
        return self._total_time_sec

    @property
    def min_window_duration_sec(self) -> float:
        return self._min_window_duration_sec

    @property
    def max_window_duration_sec(self) -> float:
        return self._max_window_duration_sec

    @property
    def avg_window_duration_sec(self) -> float:
        return self._avg_window_duration_sec

    @property
    def latest_window_duration_sec(self) -> float:
        return self._latest_window_duration_sec

    @property
    def first_window_start(self) -> TracingTimestamp | None:
        return self._first_window_start

    @property
    def latest_window_end(self) -> TracingTimestamp | None:
        return self._latest_window_end

    def _key(self) -> tuple[object, ...]:
        return (self._current_window_start, self._first_window_start, self._latest_window_end,
                self._latest_window_duration_sec, self._total_window_count, self._total_time_sec,
                self._min_window_duration_sec, self._max_window_duration_sec, self._avg_window_duration_sec)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MultiWindowTimer) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"MultiWindowTimer(count={self._total_window_count}, total={self._total_time_sec}, "
                f"active={self.is_active})")


T = TypeVar("T", int, float)


class MetricSummarizer(Generic[T]):
    """Latest, min, max, total, average and count of a series of values."""

    def __init__(self) -> None:
        self.latest_value: T | None = None
        self.min_value: T | None = None
        self.max_value: T | None = None
        self.avg_value: float | None = None
        self.total_value: T | None = None
        self.count = 0

    def add_value(self, value: T) -> None:
        self.count += 1
        self.latest_value = value
        self.min_value = value if self.min_value is None else min(self.min_value, value)
        self.max_value = value if self.max_value is None else max(self.max_value, value)
        self.total_value = value if self.total_value is None else self.total_value + value
        self.avg_value = float(self.total_value) / self.count

    def _key(self) -> tuple[object, ...]:
        return (self.latest_value, self.min_value, self.max_value, self.avg_value, self.total_value, self.count)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MetricSummarizer) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())
