"""Exporting from the sink's own thread, for the providers the sink builds itself.

The SDK's batch span processor and periodic metric reader each run a thread of their own and only log an export
failure. The sink already runs behind telemetrain's dispatcher (batched, off the training thread), so its own
providers export synchronously in that thread instead, and a failed export raises: the dispatcher counts it
(``Telemetry.health()``), reports it and backs off, like any sink failure.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.metrics.export import (
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope


class OTelExportError(RuntimeError):
    """An exporter reported a failure (the dispatcher counts it)."""


# The OTLP exporters log every failed attempt (a warning per retry, an error per batch): from the sink's own exports,
# which the dispatcher already counts, reports and warns about once, those records are dropped. Only while this
# module's export runs in this thread: the application's own exporters, in their threads, still log.
QUIET_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
)
_exporting = threading.local()


class _OwnExports(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(_exporting, "on", False):
            return True
        if record.levelno >= logging.WARNING and not getattr(_exporting, "cause", ""):
            _exporting.cause = record.getMessage()  # the first says why (refused, timed out): the error names it
        return False


_FILTER = _OwnExports()


def quiet_own_exports() -> None:
    """Install the filter on the OTLP exporters' loggers (once; idempotent)."""
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


@contextmanager
def _own_export() -> Iterator[None]:
    _exporting.on, _exporting.cause = True, ""
    try:
        yield
    finally:
        _exporting.on = False


def _cause() -> str:
    """What the exporter first logged about the export just made (its reason), as ``: <line>``, or nothing."""
    cause = str(getattr(_exporting, "cause", "")).split("\n", 1)[0]
    return f": {cause[:300]}" if cause else ""


class DirectSpanExport(SpanProcessor):
    """Collects ended spans; ``export()`` hands them to the exporter in the calling thread."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self._ended: list[ReadableSpan] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        self._ended.append(span)

    def export(self) -> None:
        batch, self._ended = self._ended, []
        if not batch:
            return
        with _own_export():
            result = self.exporter.export(batch)
        if result is not SpanExportResult.SUCCESS:
            raise OTelExportError(
                f"span exporter {type(self.exporter).__name__} failed ({len(batch)} spans lost){_cause()}")

    def shutdown(self) -> None:
        self._ended = []
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class PushMetricReader(MetricReader):
    """A reader that exports when the sink calls ``collect()`` (every ``metric_interval`` seconds and on flush)."""

    def __init__(self, exporter: MetricExporter) -> None:
        # the exporter's preferences (OTLP: cumulative), as the SDK's periodic reader takes them
        super().__init__(
            preferred_temporality=getattr(exporter, "_preferred_temporality", None),
            preferred_aggregation=getattr(exporter, "_preferred_aggregation", None),
        )
        self.exporter = exporter
        # metrics the SDK cannot build from instruments (our stats' exponential histograms, already aggregated),
        # added to each export: (scope, resource, take the pending ones)
        self.extra: tuple[InstrumentationScope, Resource, Callable[[], list[Metric]]] | None = None

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> None:
        if self.extra is not None:
            scope, resource, take = self.extra
            extra = take()
            if extra:
                ours = ScopeMetrics(scope, extra, "")
                if metrics_data is not None and metrics_data.resource_metrics:
                    first, *rest = metrics_data.resource_metrics
                    merged = ResourceMetrics(first.resource, [*first.scope_metrics, ours], first.schema_url)
                    metrics_data = MetricsData([merged, *rest])
                else:
                    metrics_data = MetricsData([ResourceMetrics(resource, [ours], "")])
        if metrics_data is None:
            return
        with _own_export():
            result = self.exporter.export(metrics_data, timeout_millis=timeout_millis)
        if result is not MetricExportResult.SUCCESS:
            raise OTelExportError(f"metric exporter {type(self.exporter).__name__} failed{_cause()}")

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.exporter.shutdown(timeout_millis=timeout_millis)


class GivenIds(IdGenerator):
    """Hands out the ids the sink gives just before it starts a span (ours, so OTel's ids equal the run store's);
    random ones otherwise (another thread using the same tracer, a record without ids). Per thread."""

    def __init__(self) -> None:
        self._given = threading.local()
        self._random = RandomIdGenerator()

    def give(self, trace_id: int, span_id: int) -> None:
        self._given.ids = (trace_id, span_id)

    def _take(self, which: int) -> int:
        ids = getattr(self._given, "ids", None)
        return ids[which] if ids is not None else 0

    def generate_span_id(self) -> int:
        return self._take(1) or self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        return self._take(0) or self._random.generate_trace_id()

    def is_trace_id_random(self) -> bool:
        return True  # ours are 128 random bits too (span_lifecycle._new_trace_id), as W3C asks
