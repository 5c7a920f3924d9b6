"""one-logger's exporter interface (``nv_one_logger.exporter.exporter``): what a recorder calls, in this order --
``initialize()`` once, then ``export_start``/``export_event``/``export_error``/``export_stop`` per span as it
happens, ``export_telemetry_data_error`` when data went missing, and ``close()`` at the end.

telemetrain calls an exporter from that exporter's own thread (see ``training.delivery``), never from the training
step, and contains whatever it raises. An exporter written for one-logger -- a subclass of
``nv_one_logger.exporter.exporter.Exporter`` -- works unchanged: the recorder only needs the seven methods.
"""

from __future__ import annotations

import abc
import enum
from typing import Any

from ..errors import ExportError
from ..events import ErrorEvent, Event, TelemetryDataError
from ..spans import Span

__all__ = ["EXPORTER_METHODS", "BaseExporter", "ExportError", "Exporter", "check_exporter"]

EXPORTER_METHODS = ("initialize", "export_start", "export_stop", "export_event", "export_error",
                    "export_telemetry_data_error", "close")


class Exporter(abc.ABC):
    """The interface: subclass it (or one-logger's own ``Exporter``) and implement all seven methods."""

    @abc.abstractmethod
    def initialize(self) -> None:
        """Called once, before any other call."""

    @abc.abstractmethod
    def export_start(self, span: Span) -> None:
        """A span started (its ``start_event`` and initial ``attributes`` are set)."""

    @abc.abstractmethod
    def export_stop(self, span: Span) -> None:
        """A span ended (its ``stop_event`` is set and ``duration_msec`` added to its attributes)."""

    @abc.abstractmethod
    def export_event(self, event: Event, span: Span) -> None:
        """An event of ``span`` (a metrics update, a checkpoint success, a custom event)."""

    @abc.abstractmethod
    def export_error(self, event: ErrorEvent, span: Span) -> None:
        """An application error in ``span``."""

    @abc.abstractmethod
    def export_telemetry_data_error(self, error: TelemetryDataError) -> None:
        """Part of the telemetry is missing (this exporter failed, or fell behind, or the application said so)."""

    @abc.abstractmethod
    def close(self) -> None:
        """The last call: flush and release."""


class BaseExporter(Exporter):
    """An exporter with one-logger's state machine: calls before ``initialize()`` or after ``close()`` raise
    ``ExportError`` (which the recorder counts, as any failure)."""

    class _State(enum.Enum):
        NOT_INITIALIZED = enum.auto()
        READY = enum.auto()
        CLOSED = enum.auto()

    def __init__(self) -> None:
        self._state = BaseExporter._State.NOT_INITIALIZED

    def initialize(self) -> None:
        self._state = BaseExporter._State.READY

    def export_start(self, span: Span) -> None:
        self._check_state()

    def export_stop(self, span: Span) -> None:
        self._check_state()

    def export_event(self, event: Event, span: Span) -> None:
        self._check_state()

    def export_error(self, event: ErrorEvent, span: Span) -> None:
        self._check_state()

    def export_telemetry_data_error(self, error: TelemetryDataError) -> None:
        self._check_state()

    def close(self) -> None:
        self._state = BaseExporter._State.CLOSED

    @property
    def ready(self) -> bool:
        return self._state is BaseExporter._State.READY

    @property
    def closed(self) -> bool:
        return self._state is BaseExporter._State.CLOSED

    def _check_state(self) -> None:
        if self._state is BaseExporter._State.NOT_INITIALIZED:
            raise ExportError("Exporter not initialized. Call initialize first.")
        if self._state is BaseExporter._State.CLOSED:
            raise ExportError("Exporter is closed and cannot be used anymore.")


def check_exporter(exporter: Any, arg: str = "exporter") -> None:
    """``TypeError`` naming ``arg`` unless ``exporter`` has the seven exporter methods."""
    missing = [m for m in EXPORTER_METHODS if not callable(getattr(exporter, m, None))]
    if missing:
        raise TypeError(f"{arg} must be an Exporter (one-logger's or telemetrain's): {type(exporter).__name__} has no "
                        f"{', '.join(missing)}")
