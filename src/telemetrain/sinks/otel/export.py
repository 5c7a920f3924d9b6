"""Exporting from the sink's own thread, for the providers the sink builds itself.

The SDK's batch span processor and periodic metric reader each run a thread of their own and only log an export
failure. The sink already runs behind telemetrain's dispatcher (batched, off the training thread), so its own
providers export synchronously in that thread instead, and a failed export raises: the dispatcher counts it
(``Telemetry.health()``), reports it and backs off, like any sink failure.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

_OTLP = "opentelemetry.exporter.otlp.proto.http"


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
        if str(record.msg).startswith(_PERMANENT):
            _exporting.permanent = True
        return False


# What the OTLP exporters log when sending the batch again cannot help (a code they do not retry: 400, 401, 413...;
# a batch that does not encode or is over the size limit). Other failures (refused, timed out, 429/502/503/504 past
# the timeout) are worth another try, as are failures whose log is not known (a later exporter's wording).
_PERMANENT = ("Failed to export %s batch code", "Failed to encode", "Dropping span batch", "Dropping metric")


_FILTER = _OwnExports()


def quiet_own_exports() -> None:
    """Install the filter on the OTLP exporters' loggers (once; idempotent)."""
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


@contextmanager
def _own_export() -> Iterator[None]:
    _exporting.on, _exporting.cause, _exporting.permanent = True, "", False
    try:
        yield
    finally:
        _exporting.on = False


def _cause() -> str:
    """What the exporter first logged about the export just made (its reason), as ``: <line>``, or nothing."""
    cause = str(getattr(_exporting, "cause", "")).split("\n", 1)[0]
    return f": {cause[:300]}" if cause else ""


# A failed export's spans are sent again with the next export, oldest first, in chunks of the SDK batch processor's
# default size (so a backlog never becomes one request over the collector's size limit), up to this many spans: past
# it the oldest are dropped and counted. A stats' histogram points and delta sums likewise (gauges and cumulative
# counters need nothing: each export carries their latest values).
MAX_KEPT_SPANS = 20_000
MAX_KEPT_HISTOGRAMS = 10_000
CHUNK_SPANS = 512
# While exports fail, the full-timeout exporter is still tried this often: a collector that is up but slower than the
# quick twin's timeout (a transient error put the sink on the twin) gets its data again.
FULL_RETRY_S = 60.0


class _Failover:
    """Which exporter the next export uses: ``quick`` while exports fail, but ``full`` at least every FULL_RETRY_S."""

    def __init__(self, full: Any, quick: Any) -> None:
        self.full, self.quick = full, quick
        self.failing = False
        self._last_full = 0.0

    def pick(self) -> Any:
        now = time.monotonic()
        if self.failing and self.quick is not None and now - self._last_full < FULL_RETRY_S:
            return self.quick
        self._last_full = now
        return self.full


class DirectSpanExport(SpanProcessor):
    """Collects ended spans; ``export()`` hands them to the exporter in the calling thread.

    ``quick``: the same exporter with a short timeout, used instead while exports fail (a collector that is down or
    restarting costs the sink's thread ~1 s per try, not the full timeout, and the final flush of ``close()`` stays
    inside its timeout), but for one try with ``exporter`` every FULL_RETRY_S; the first success goes back to
    ``exporter``."""

    def __init__(self, exporter: SpanExporter, quick: SpanExporter | None = None,
                 max_kept: int | None = None) -> None:
        self.exporter = exporter
        self.quick = quick
        self.route = _Failover(exporter, quick)
        self.max_kept = MAX_KEPT_SPANS if max_kept is None else max_kept
        self.kept: list[ReadableSpan] = []  # spans of failed exports, oldest first, for the next export
        self.dropped = 0  # spans dropped from ``kept`` (over ``max_kept``, or still there at shutdown)
        self._ended: list[ReadableSpan] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        self._ended.append(span)

    def export(self) -> None:
        pending = self.kept + self._ended if self.kept else self._ended
        self.kept, self._ended = [], []
        for start in range(0, len(pending), CHUNK_SPANS):
            exporter = self.route.pick()
            with _own_export():
                result = exporter.export(pending[start:start + CHUNK_SPANS])
            if result is not SpanExportResult.SUCCESS:
                self.route.failing = True
                if getattr(_exporting, "permanent", False):  # the collector rejected it: sending it again cannot help
                    self.dropped += len(pending[start:start + CHUNK_SPANS])
                    start += CHUNK_SPANS
                self._keep(pending[start:])
                raise OTelExportError(
                    f"span exporter {type(exporter).__name__} failed ({len(self.kept)} spans kept for the next "
                    f"export, {self.dropped} dropped so far){_cause()}")
            self.route.failing = False

    def _keep(self, spans: list[ReadableSpan]) -> None:
        over = len(spans) - self.max_kept
        if over > 0:
            self.dropped += over
            spans = spans[over:]
        self.kept = spans

    def shutdown(self) -> None:
        self.dropped += len(self.kept) + len(self._ended)
        self.kept, self._ended = [], []
        self.exporter.shutdown()
        if self.quick is not None:
            self.quick.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class PushMetricReader(MetricReader):
    """A reader that exports when the sink calls ``collect()`` (every ``metric_interval`` seconds and on flush).

    ``quick``: as ``DirectSpanExport``'s. The histogram points and delta sums of a failed export are kept for the
    next one."""

    def __init__(self, exporter: MetricExporter, quick: MetricExporter | None = None) -> None:
        # the exporter's preferences (OTLP: cumulative), as the SDK's periodic reader takes them
        super().__init__(
            preferred_temporality=getattr(exporter, "_preferred_temporality", None),
            preferred_aggregation=getattr(exporter, "_preferred_aggregation", None),
        )
        self.exporter = exporter
        self.quick = quick
        self.route = _Failover(exporter, quick)
        # metrics the SDK cannot build from instruments (our stats' exponential histograms, already aggregated),
        # added to each export: (scope, resource, take the pending ones)
        self.extra: tuple[InstrumentationScope, Resource, Callable[[], list[Metric]]] | None = None
        self.kept: list[Metric] = []  # histogram points of failed exports
        self.dropped = 0  # histogram points dropped (over MAX_KEPT_HISTOGRAMS, or kept at shutdown)

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> None:
        extra: list[Metric] = []
        sdk_data = metrics_data
        if self.extra is not None:
            scope, resource, take = self.extra
            extra, self.kept = self.kept + take(), []
            if extra:
                metrics_data = _with_extra(metrics_data, scope, resource, extra)
        if metrics_data is None:
            return
        exporter = self.route.pick()
        with _own_export():
            result = exporter.export(metrics_data, timeout_millis=timeout_millis)
        self.route.failing = result is not MetricExportResult.SUCCESS
        if self.route.failing:
            extra += _delta_sums(sdk_data)  # their increase is in no later export: sent again too
            if getattr(_exporting, "permanent", False):
                self.dropped += len(extra)
                extra = []
            over = len(extra) - MAX_KEPT_HISTOGRAMS
            if over > 0:
                self.dropped += over
                extra = extra[over:]
            self.kept = extra
            raise OTelExportError(f"metric exporter {type(exporter).__name__} failed{_cause()}")

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.dropped += len(self.kept)
        self.kept = []
        self.exporter.shutdown(timeout_millis=timeout_millis)
        if self.quick is not None:
            self.quick.shutdown(timeout_millis=timeout_millis)


def _delta_sums(data: MetricsData | None) -> list[Metric]:
    """The delta sums of an export (counters, when the exporter prefers delta: OTLP's
    ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``). Cumulative sums and gauges need nothing kept: the next
    export carries their latest values."""
    if data is None:
        return []
    return [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if isinstance(m.data, Sum) and m.data.aggregation_temporality is AggregationTemporality.DELTA]


def _with_extra(data: MetricsData | None, scope: InstrumentationScope, resource: Resource,
                extra: list[Metric]) -> MetricsData:
    """``data`` with ``extra`` added to its first resource, in the ScopeMetrics of ``scope`` when the SDK's export
    has one: the OTLP encoder keys scopes by their InstrumentationScope, so a second ScopeMetrics of the same scope
    would replace the first on the wire (every gauge and counter of the export lost)."""
    if data is None or not data.resource_metrics:
        return MetricsData([ResourceMetrics(resource, [ScopeMetrics(scope, extra, "")], "")])
    first, *rest = data.resource_metrics
    scopes = list(first.scope_metrics)
    for i, sm in enumerate(scopes):
        if sm.scope == scope:
            scopes[i] = ScopeMetrics(sm.scope, [*sm.metrics, *extra], sm.schema_url)
            break
    else:
        scopes.append(ScopeMetrics(scope, extra, ""))
    return MetricsData([ResourceMetrics(first.resource, scopes, first.schema_url), *rest])


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


def otlp_exporter(module: str, cls: str) -> Any:
    """An OTLP/HTTP exporter class (the default exporters), or one ImportError naming the extra."""
    try:
        return getattr(importlib.import_module(f"{_OTLP}.{module}"), cls)
    except ImportError as exc:
        raise ImportError(
            "OTelSink's default exporters need opentelemetry-exporter-otlp-proto-http: pip install "
            "'telemetrain[otel]' (or pass tracer_provider/meter_provider or span_exporter/metric_exporter)"
        ) from exc


def force_flush_provider(provider: Any, timeout_ms: int) -> None:
    """Force-flush the application's provider (the API's providers have no ``force_flush``; the SDK's do)."""
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_millis=timeout_ms)
