"""OpenTelemetry backend: spans with our ids, metrics as gauges and counters (``pip install 'telemetrain[otel]'``).

See ``docs/backends/opentelemetry.md``.
"""

from __future__ import annotations

try:
    import opentelemetry.sdk.trace  # noqa: F401 - the one check, so a missing SDK gives one clear error
except ImportError as exc:  # pragma: no cover - exercised in an environment without the extra
    raise ImportError(
        "telemetrain.sinks.otel needs the OpenTelemetry SDK: pip install 'telemetrain[otel]'"
    ) from exc

from .convert import otel_resource, resource_attributes
from .sink import OTelExportError, OTelSink

__all__ = ["OTelExportError", "OTelSink", "otel_resource", "resource_attributes"]
