"""``Gauge``: a function read at collection time (allocator memory, a queue length, a passive counter).

Nothing is sampled on the training thread: the collector thread calls the function every ``interval`` seconds (and
once more at flush and exit) and emits the value as a metric record; ``read()`` samples it on demand (a Prometheus
scrape does). A function that raises, or returns something that is not a number, is counted in ``errors``, warned
about once and recorded as a diagnostic; that reading is absent, never 0. ``None`` means "no value now".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..collector import collector
from ..dispatch import describe, is_interrupt, warn_safely
from ..records import Diagnostic
from ..telemetry import Telemetry, check_name, get_telemetry

__all__ = ["Gauge"]

_mono = time.monotonic_ns


class Gauge:
    """``Gauge("cuda.memory_allocated", torch.cuda.memory_allocated, unit="bytes")``. ``interval=None``: read only
    on demand and at flush/exit."""

    def __init__(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        unit: str = "",
        help: str = "",
        group: str = "gauges",
        interval: float | None = 10.0,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.name = check_name(name, "name")
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        for arg, text in (("unit", unit), ("help", help)):
            if not isinstance(text, str):
                raise TypeError(f"{arg} must be a str, got {type(text).__name__}")
        if interval is not None:
            if isinstance(interval, bool) or not isinstance(interval, (int, float)):
                raise TypeError(f"interval must be seconds or None, got {type(interval).__name__}")
            if not interval >= 0.001 or interval == float("inf"):
                raise ValueError(f"interval must be at least 0.001 s, got {interval!r}")
        if telemetry is not None and not isinstance(telemetry, Telemetry):
            raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
        self.fn = fn
        self.unit = unit
        self.help = help
        self.group = check_name(group, "group")
        self.interval = None if interval is None else float(interval)
        self.errors = 0
        self.last_value: int | float | None = None
        self._telemetry = telemetry if telemetry is not None else get_telemetry()
        self._closed = False
        self._lock = threading.Lock()
        from .registry import registry

        registry(self._telemetry).register(self)
        self._schedule()

    def _schedule(self) -> None:
        if self.interval is not None and not self._closed:
            collector.schedule(self, _mono())  # first reading at start

    def read(self) -> int | float | None:
        """Call the function now: its value, or ``None`` (no value, or it failed: see ``errors``)."""
        try:
            value = self.fn()
        except BaseException as exc:  # a gauge never breaks its caller, SystemExit included
            if is_interrupt(exc):
                raise
            self._failed(f"raised {describe(exc)}")
            return None
        if value is None:
            return None
        number: int | float
        if type(value) is bool:
            number = int(value)
        elif isinstance(value, (int, float)):
            number = value
        else:
            item = getattr(value, "item", None)  # a numpy scalar (a tensor would need a device sync: refused)
            try:
                scalar = item() if getattr(value, "dim", None) is None and callable(item) else None
            except BaseException as exc:  # an array of several values, say: not a number
                if is_interrupt(exc):
                    raise
                scalar = None
            if not isinstance(scalar, (int, float)) or isinstance(scalar, bool):
                self._failed(f"returned {type(value).__name__}, not a number")
                return None
            number = scalar
        self.last_value = number
        return number

    def collect(self) -> None:
        """Read and emit one value (the collector calls this; so do flush and exit)."""
        value = self.read()
        if value is not None and not self._closed:
            try:
                self._telemetry.metric(self.name, value, self.group, unit=self.unit)
            except BaseException as exc:  # the pipeline closed meanwhile, say
                if is_interrupt(exc):
                    raise
                warn_safely(f"telemetrain: gauge {self.name!r} could not emit: {describe(exc)}")

    def tick(self, now_ns: int) -> int | None:
        if self._closed or self.interval is None:
            return None
        self.collect()
        return now_ns + round(self.interval * 1e9)

    def close(self) -> None:
        """Stop reading it and take it out of the registry."""
        self._closed = True
        collector.cancel(self)
        from .registry import registry

        registry(self._telemetry).unregister(self)

    def _failed(self, what: str) -> None:
        with self._lock:
            self.errors += 1
            first = self.errors == 1
        if first:
            message = f"gauge {self.name!r} {what}; it is absent from the data until it reads again"
            warn_safely(f"telemetrain: {message}")
            telemetry = self._telemetry
            try:
                mono, wall = telemetry.now()
                telemetry.emit(
                    Diagnostic(mono, wall, telemetry.identity, "telemetrain", "gauge_error", self.name, 1, message)
                )
            except BaseException as exc:  # reporting must never fail the caller
                if is_interrupt(exc):
                    raise

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._schedule()

    def __repr__(self) -> str:
        return f"Gauge({self.name!r}, interval={self.interval})"

