"""OpenTelemetry backend: spans with our ids, metrics as gauges and counters (``pip install 'telemetrain[otel]'``).

See ``docs/backends/opentelemetry.md``.
"""

from __future__ import annotations

from ...extras import missing_extra

try:
    import opentelemetry.sdk.trace  # noqa: F401 - the one check, so a missing SDK gives one clear error
except ImportError as exc:  # pragma: no cover - exercised in an environment without the extra
    raise missing_extra("telemetrain.sinks.otel", "the OpenTelemetry SDK", "otel", exc) from None

from .convert import otel_resource, resource_attributes
from .sink import OTelExportError, OTelSink

__all__ = ["OTelExportError", "OTelSink", "otel_resource", "resource_attributes"]
