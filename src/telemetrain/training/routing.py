"""Which recorder the module-level callbacks and context managers drive: the configured one-logger provider's
(``TrainingTelemetryProvider.instance().configure_provider()``), else telemetrain's default recorder. One dict
lookup per call, so the hot path (``training_iteration()``) pays next to nothing for it."""

from __future__ import annotations

from typing import Any

from .one_logger_provider import OneLoggerProvider
from .singleton import SingletonMeta

__all__ = ["one_logger_callbacks"]

_instances_get = SingletonMeta._instances.get


def one_logger_callbacks() -> Any:
    """The configured process-wide provider's ``OneLoggerCallbacks``, or None."""
    provider = _instances_get(OneLoggerProvider)
    if provider is None:
        return None
    return provider._callbacks
