"""Which timer a ``Telemetry``'s device-timed spans use, and the span class that records their marks.

``timer_of`` gives a ``Telemetry`` its one ``DeviceTimer`` (the recorder's phases and ``span(..., device=True)``
share it); ``DeviceSpan`` is the ``Span`` whose enter and exit also mark the device (``spans.span`` and
``Tracer.span/start`` switch to it for ``device=True``; the recorder builds its phases as it while device timing is
on).
"""

from __future__ import annotations

from typing import Any

from ..spans import Span
from ..telemetry import Telemetry
from .device_clock import resolve_clock
from .device_timing import DEFAULT_CAPACITY, EXTENSION, GROUP, DeviceTimer

__all__ = ["DeviceSpan", "span_timer", "timer_of"]


def timer_of(telemetry: Telemetry, setting: Any = "auto", *, capacity: int = DEFAULT_CAPACITY
             ) -> tuple[DeviceTimer | None, str]:
    """``telemetry``'s device timer, created on first use with the clock ``setting`` gives (``resolve_clock``), and
    why there is none. One per Telemetry: the recorder's phases and ``span(..., device=True)`` share it."""
    if isinstance(setting, str) and setting == "host":
        return None, "device_timing='host'"
    found = telemetry.extensions.get(EXTENSION)
    if isinstance(found, DeviceTimer):
        return (found, "") if found.enabled else (None, found.failure)
    clock, reason = resolve_clock(setting)
    if clock is None:
        return None, reason
    timer: DeviceTimer = telemetry.extension(EXTENSION, lambda t: DeviceTimer(t, clock, capacity=capacity))
    return timer, ""


def span_timer(telemetry: Telemetry) -> DeviceTimer | None:
    """The timer for a ``span(..., device=True)`` of ``telemetry`` (``"auto"``: CUDA when the program uses it), or
    None: the span is then timed on the host only (said once per Telemetry, in an ``info`` event)."""
    timer, reason = timer_of(telemetry)
    if timer is None and telemetry.extensions.get(EXTENSION + ".host") is None:
        telemetry.extensions[EXTENSION + ".host"] = reason
        try:
            telemetry.event("device_timing", {"mode": "host", "reason": reason, "for": "span(device=True)"},
                            group=GROUP)
        except Exception:  # noqa: BLE001
            pass
    return timer


class DeviceSpan(Span):
    """A span also timed on the device: ``span(..., device=True)``, ``Tracer.span/start(..., device=True)``, and the
    recorder's phases while device timing is on. Its device start mark is recorded just before its host start, its
    end mark just after its host end, so the host time does not include them."""

    __slots__ = ()

    def _device_start(self) -> None:
        timer = span_timer(self._tracer.telemetry)
        if timer is not None:
            timer.span_start(self)

    def __enter__(self) -> Span:
        timer = self._tracer.telemetry.extensions.get(EXTENSION)
        if timer is not None:
            timer.span_start(self)
        else:
            self._device_start()
        return Span.__enter__(self)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any, end_ns: int | None = None) -> None:
        Span.__exit__(self, exc_type, exc, tb, end_ns)
        timer = self._tracer.telemetry.extensions.get(EXTENSION)
        if timer is not None:
            timer.span_end(self)
