"""``SingletonMeta``: the process-wide instance behind ``OneLoggerProvider.instance()`` and
``TrainingTelemetryProvider.instance()`` (one-logger's ``nv_one_logger.core.internal.singleton``).

Unlike one-logger's, it does not forbid building an instance directly: ``TrainingTelemetryProvider(telemetry=t)``
is an independent provider (for a second Telemetry, a test, a notebook), and ``.instance()`` is the one the
module-level callbacks use. ``_instances`` / ``_lock`` keep one-logger's names, so a test that resets its
singletons by hand (``SingletonMeta._instances.pop(cls)``) resets ours; ``TrainingTelemetryProvider.reset()`` is the
public way.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, TypeVar

__all__ = ["SingletonMeta"]

T = TypeVar("T")


class SingletonMeta(type):
    _lock: ClassVar[threading.RLock] = threading.RLock()
    _instances: ClassVar[dict[type, Any]] = {}

    def instance(cls: type[T]) -> T:
        """The process-wide instance (built on first use)."""
        found = SingletonMeta._instances.get(cls)
        if found is None:
            with SingletonMeta._lock:
                found = SingletonMeta._instances.get(cls)
                if found is None:
                    found = SingletonMeta._instances[cls] = cls()
        return found
