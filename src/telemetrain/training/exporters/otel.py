"""``OTelExporter``: one-logger's OTel exporter's construction (``OTelExporter(otel_span_exporter)``,
``nv_one_logger.otel.exporter.otel_exporter``), routed to telemetrain's OpenTelemetry sink.

Given to the provider (``with_exporter(OTelExporter(span_exporter))``), it attaches an ``OTelSink`` exporting to
that ``SpanExporter`` to the provider's ``Telemetry``: OTel receives telemetrain's own spans (the training lifecycle
with correct parents, hex span ids, sampled iteration spans, custom spans) and their events, exported off the
training thread in batches. What one-logger's exporter did and this does not: one fake child span per event (events
are span events here), a 128-bit ``one_logger_span_id`` attribute the OTLP encoder rejects, a never-detached OTel
context, and children of filtered spans sent with a parent OTel never saw. Needs ``pip install 'telemetrain[otel]'``.
"""

from __future__ import annotations

from typing import Any

from ..events import ErrorEvent, Event, TelemetryDataError
from ..spans import Span
from .base import Exporter

__all__ = ["OTelExporter"]


class OTelExporter(Exporter):
    """A one-logger exporter whose data reaches OpenTelemetry through telemetrain's ``OTelSink``; its exporter
    calls do nothing (the sink receives the records)."""

    def __init__(self, otel_span_exporter: Any, **sink_options: Any) -> None:
        if not callable(getattr(otel_span_exporter, "export", None)):
            raise TypeError("otel_span_exporter must be an OpenTelemetry SpanExporter, got "
                            f"{type(otel_span_exporter).__name__}")
        self._otel_span_exporter = otel_span_exporter
        self._sink_options = sink_options
        self.sink: Any = None

    def attach(self, telemetry: Any) -> Any:
        """Attach the sink to ``telemetry`` (once); returns it."""
        if self.sink is None:
            from opentelemetry.sdk.metrics import MeterProvider  # the otel extra; imported only when used

            from ...sinks.otel import OTelSink

            options = {"meter_provider": MeterProvider(), **self._sink_options}
            self.sink = OTelSink(span_exporter=self._otel_span_exporter, **options)
            telemetry.add_sink(self.sink)
        return self.sink

    def initialize(self) -> None:
        pass

    def export_start(self, span: Span) -> None:
        pass

    def export_stop(self, span: Span) -> None:
        pass

    def export_event(self, event: Event, span: Span) -> None:
        pass

    def export_error(self, event: ErrorEvent, span: Span) -> None:
        pass

    def export_telemetry_data_error(self, error: TelemetryDataError) -> None:
        pass

    def close(self) -> None:
        pass
