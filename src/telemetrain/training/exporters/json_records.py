"""``BaseJsonExporter``: one-logger's JSON record format (``nv_one_logger.exporter.base_json_exporter``), for the
file and logger exporters.

Records: ``{"type": "start"|"stop"|"complete", "id", "name", "attributes", "start_event"/"stop_event":
{"name", "attributes"}}`` for spans (a start with nothing exported before its stop is held back and written as one
``complete`` record), ``{"type": "event"|"application_error", "span_id", "event": {...}}`` and
``{"type": "telemetry_data_error", "error": {...}}``; each with ``count`` (the record's sequence number) and ``pid``.
telemetrain adds ``parent_id`` to span records (the exported parent's id, so the hierarchy can be rebuilt, which
one-logger's records do not allow) and ``rank``; readers of one-logger's format ignore keys they do not know.
"""

from __future__ import annotations

import abc
import os
import threading
from typing import Any

from ...identity import identity_from_env
from ..errors import ExportError
from ..events import ErrorEvent, Event, TelemetryDataError
from ..spans import Span
from .base import BaseExporter

__all__ = ["BaseJsonExporter", "RecordType"]


class RecordType:
    START = "start"
    STOP = "stop"
    COMPLETE = "complete"
    EVENT = "event"
    APPLICATION_ERROR = "application_error"
    TELEMETRY_DATA_ERROR = "telemetry_data_error"


def _rank() -> int:
    try:
        return identity_from_env().rank
    except (TypeError, ValueError):
        return 0


class BaseJsonExporter(BaseExporter):
    """Builds one-logger's records; a subclass implements ``_write(record)``."""

    def __init__(self) -> None:
        super().__init__()
        self._record_count = 0
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._rank = _rank()
        self._last_start_span: Span | None = None

    def initialize(self) -> None:
        super().initialize()
        self._last_start_span = None

    def export_start(self, span: Span) -> None:
        super().export_start(span)
        with self._lock:
            self._flush_held_start()
            self._last_start_span = span

    def export_stop(self, span: Span) -> None:
        super().export_stop(span)
        if span.stop_event is None:
            raise ExportError(f"Span {span.name_str} has no stop event")
        with self._lock:
            held = self._last_start_span
            if held is span:
                self._last_start_span = None
                self._record_span(span, RecordType.COMPLETE)
                return
            self._flush_held_start()
            self._record_span(span, RecordType.STOP)

    def export_event(self, event: Event, span: Span) -> None:
        super().export_event(event, span)
        with self._lock:
            self._flush_held_start()
            self._export_json_dict({"type": RecordType.EVENT, "span_id": str(span.id), "event": _event(event)})

    def export_error(self, event: ErrorEvent, span: Span) -> None:
        super().export_error(event, span)
        with self._lock:
            self._flush_held_start()
            self._export_json_dict({"type": RecordType.APPLICATION_ERROR, "span_id": str(span.id),
                                    "event": _event(event)})

    def export_telemetry_data_error(self, error: TelemetryDataError) -> None:
        super().export_telemetry_data_error(error)
        with self._lock:
            self._flush_held_start()
            self._export_json_dict({"type": RecordType.TELEMETRY_DATA_ERROR, "error": _event(error)})

    def close(self) -> None:
        with self._lock:
            if self.ready:
                self._flush_held_start()
        super().close()

    def _flush_held_start(self) -> None:
        held = self._last_start_span
        if held is not None:
            self._last_start_span = None
            self._record_span(held, RecordType.START)

    def _record_span(self, span: Span, record_type: str) -> None:
        record: dict[str, Any] = {"type": record_type, "id": str(span.id), "name": span.name_str}
        parent = span.parent_span
        if parent is not None:
            record["parent_id"] = str(parent.id)
        attributes = span.attributes
        if attributes:
            record["attributes"] = attributes.to_json()
        if record_type != RecordType.STOP:
            record["start_event"] = _event(span.start_event)
        if record_type != RecordType.START:
            stop = span.stop_event
            if stop is None:
                raise ExportError(f"Span {span.name_str} has no stop event")
            record["stop_event"] = _event(stop)
        self._export_json_dict(record)

    def _export_json_dict(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._record_count += 1
            record["count"] = self._record_count
            record["pid"] = self._pid
            record["rank"] = self._rank
            self._write(record)

    @abc.abstractmethod
    def _write(self, json_dict: dict[str, Any]) -> None:
        """Write one record (raise ``ExportError`` when it cannot be written: the recorder counts it)."""


def _event(event: Event) -> dict[str, Any]:
    return {"name": event.name_str, "attributes": event.attributes.to_json()}
