"""one-logger-compatible exporters: the ``Exporter`` interface, ``FileExporter``, ``LoggerExporter``,
``OTelExporter`` (routed to telemetrain's OTel sink) and declarative exporter configs. Every exporter given to
``TrainingTelemetryProvider`` is called from its own delivery thread (``training.delivery``)."""

from __future__ import annotations

from ..errors import ExportError
from .base import BaseExporter, Exporter
from .config import ExporterConfig, ExporterConfigManager
from .file import FileExporter
from .json_records import BaseJsonExporter, RecordType
from .logger import LoggerExporter
from .otel import OTelExporter

__all__ = [
    "BaseExporter",
    "BaseJsonExporter",
    "ExportError",
    "Exporter",
    "ExporterConfig",
    "ExporterConfigManager",
    "FileExporter",
    "LoggerExporter",
    "OTelExporter",
    "RecordType",
]
