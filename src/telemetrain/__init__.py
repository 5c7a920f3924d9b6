"""telemetrain: telemetry for PyTorch training jobs.

Metrics, events, spans, stats and system samples go through one pipeline (records -> router -> dispatch -> sinks)
to a durable local run store and to the backends you run. Importing telemetrain starts no thread and opens no file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._version import __version__
from .dispatch import FailurePolicy, TelemetryWarning
from .identity import Identity, identity_from_env
from .records import Diagnostic, Event, MetricPoint, SpanEnd, SpanStart, StatWindow
from .telemetry import Telemetry, get_telemetry, reset, set_telemetry

__all__ = [
    "Diagnostic",
    "Event",
    "FailurePolicy",
    "Identity",
    "MetricPoint",
    "SpanEnd",
    "SpanStart",
    "StatWindow",
    "Telemetry",
    "TelemetryWarning",
    "__version__",
    "close",
    "event",
    "flush",
    "get_telemetry",
    "identity_from_env",
    "log",
    "metric",
    "reset",
    "set_telemetry",
]


def metric(
    name: str,
    value: float,
    group: str = "default",
    attributes: Mapping[str, str | int | float | bool] | None = None,
    *,
    unit: str = "",
    step: int | None = None,
) -> None:
    """Record one value on the default instance (see ``Telemetry.metric``)."""
    get_telemetry().metric(name, value, group, attributes, unit=unit, step=step)


def log(
    metrics: Mapping[str, Any],
    step: int | None = None,
    *,
    group: str = "default",
    unit: str = "",
    attributes: Mapping[str, str | int | float | bool] | None = None,
) -> None:
    """Record several values at once on the default instance, ``wandb.log`` style (see ``Telemetry.log``)."""
    get_telemetry().log(metrics, step, group=group, unit=unit, attributes=attributes)


def event(
    name: str, attributes: dict[str, Any] | None = None, *, severity: str = "info", group: str = "events"
) -> None:
    """Record an event on the default instance (see ``Telemetry.event``)."""
    get_telemetry().event(name, attributes, severity=severity, group=group)


def flush(timeout: float | None = 5.0) -> bool:
    """Deliver and flush everything the default instance has queued."""
    return get_telemetry().flush(timeout)


def close(timeout: float | None = 5.0) -> bool:
    """Flush and close the default instance (it is also closed at exit)."""
    return get_telemetry().close(timeout)
