"""``OTelSink``: telemetrain records -> OpenTelemetry spans (with our ids) and metrics.

Spans: each ``SpanStart`` starts an SDK span with the record's trace and span ids (a per-thread id generator hands
them to the SDK's tracer), parented by an explicit ``Context`` built here -- never the application's current one, and
nothing is attached to it -- and each ``SpanEnd`` ends it with the record's time, attributes and status. Parents are
by id, so a child whose parent's record comes later (the tracer's short spans travel start and end together, at
their end, children first) still gets the right parent.

Metrics (``metrics.MetricSide``): a ``MetricPoint`` sets a synchronous gauge, or feeds an observable counter when it is
a cumulative reading (``convert.is_counter``); each aggregation of a ``StatWindow`` sets a gauge
``<name>.<aggregation>``. A data point's attributes are the record's (the semantic conventions' ``disk.io.direction``,
``hw.id``...) and, outside the system sampler's groups, ``telemetrain.group``; the run identity and config are in the
resource.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.metrics import Meter, MeterProvider, _Gauge
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import Metric, MetricExporter
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TracerProvider,
    set_span_in_context,
)

from ..._version import __version__
from ...hparams import is_hyperparameters
from ...identity import Identity
from ..base import Sink
from .convert import (
    CONFIG_PREFIX,
    GROUP_KEY,
    HPARAM_PREFIX,
    attributes,
    otel_resource,
    prefixed,
)
from .export import (
    DirectSpanExport,
    GivenIds,
    OTelExportError,
    PushMetricReader,
    force_flush_provider,
    otlp_exporter,
    quiet_own_exports,
)
from .metrics import SCOPE, MetricSide

__all__ = ["OTelExportError", "OTelSink"]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
# One for all sinks: providers cache their tracer per scope, so sinks sharing a provider share a tracer (per thread)
_IDS = GivenIds()
_CONFIG_DONE = ""  # a key of _root_attrs: the run's config is in it
# The OTLP exporters retry a failed export (with backoff, on retryable codes) until their timeout: the spec's
# default, 10 s, so a slow collector still gets every batch. While exports fail, the sink's default exporters are
# replaced by twins that give up after QUICK_EXPORT_TIMEOUT_S: a collector that is down costs the sink's thread a
# second per try, not ten, and the last exports of a close (spans, metrics) stay inside Telemetry.close(timeout=5.0).
DEFAULT_EXPORT_TIMEOUT_S = 10.0
QUICK_EXPORT_TIMEOUT_S = 1.0


def _hex(value: str) -> int:
    try:
        return int(value, 16) if value else 0
    except ValueError:  # a record built elsewhere with a malformed id: let the SDK draw one
        return 0


class OTelSink(MetricSide, Sink):
    """Send spans and metrics to OpenTelemetry.

    ``tracer_provider`` / ``meter_provider``: yours (any processors, readers and exporters; the sink never shuts them
    down, it only force-flushes them on ``flush``). ``None`` builds the sink's own provider, lazily, with the
    resource of the first record's identity (``otel_resource``) and ``span_exporter`` / ``metric_exporter``
    (default: OTLP over HTTP, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables). The sink's own
    providers export in the sink's thread, spans after every batch and metrics every ``metric_interval`` seconds and
    on flush; a failed export raises, so the dispatcher counts it, and its spans (and stats' histogram points, delta
    sums) are sent again with the next export (at most ``MAX_KEPT_SPANS``; beyond, the oldest are dropped and counted in
    ``dropped_spans``). The default OTLP exporters give up after ``export_timeout`` seconds (unless
    ``OTEL_EXPORTER_OTLP_*TIMEOUT`` says otherwise), and after ``QUICK_EXPORT_TIMEOUT_S`` while exports fail, so a
    dead collector cannot keep ``Telemetry.close()`` waiting past its timeout.
    """

    name = "otel"
    background = True
    kinds = frozenset({"metric", "stat", "span_start", "span_end", "event"})

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        *,
        span_exporter: SpanExporter | None = None,
        metric_exporter: MetricExporter | None = None,
        metric_interval: float = 10.0,
        metric_prefix: str = "telemetrain.",
        max_pending_events: int = 10_000,
        flush_timeout: float = 10.0,
        export_timeout: float = DEFAULT_EXPORT_TIMEOUT_S,
    ) -> None:
        if not metric_interval > 0 or not flush_timeout > 0:
            raise ValueError("metric_interval and flush_timeout must be > 0 seconds")
        if type(export_timeout) not in (int, float) or not 0 < export_timeout < float("inf"):
            raise ValueError(f"export_timeout must be a positive number of seconds, got {export_timeout!r}")
        if type(max_pending_events) is not int or max_pending_events < 0:
            raise ValueError(f"max_pending_events must be an int >= 0, got {max_pending_events!r}")
        if tracer_provider is None and span_exporter is None:
            otlp_exporter("trace_exporter", "OTLPSpanExporter")  # fail here, not at the first record
        if meter_provider is None and metric_exporter is None:
            otlp_exporter("metric_exporter", "OTLPMetricExporter")
        self._user_tp = tracer_provider
        self._user_mp = meter_provider
        self._span_exporter = span_exporter
        self._metric_exporter = metric_exporter
        self.metric_interval = float(metric_interval)
        self.metric_prefix = metric_prefix
        self.max_pending_events = max_pending_events
        self._timeout_ms = int(flush_timeout * 1000)
        self.export_timeout = float(export_timeout)
        self._ids = _IDS
        self._handlers: dict[str, Callable[[Any], None]] = {
            "metric": self._metric,
            "stat": self._stat,
            "span_start": self._span_start,
            "span_end": self._span_end,
            "event": self._event,
        }
        # traces
        self._tracer: Tracer | None = None
        self._own_tp: SdkTracerProvider | None = None
        self._direct: DirectSpanExport | None = None
        self._open: dict[str, Span] = {}  # span id -> its OTel span, from its start record to its end record
        self._pending: dict[str, list[Any]] = {}  # span id -> events that came before the span's start record
        self._n_pending = 0
        # metrics
        self._meter: Meter | None = None
        self._own_mp: SdkMeterProvider | None = None
        self._reader: PushMetricReader | None = None
        self._histograms: list[Metric] = []  # stats' exponential histograms, for the own reader's next export
        self._gauges: dict[tuple[str, str], _Gauge] = {}
        self._counters: dict[tuple[str, str], dict[Any, float]] = {}  # instrument -> data point key -> latest total
        self._point_attrs: dict[Any, dict[str, Any]] = {}  # (group, attributes) -> a data point's attributes
        # a gauge keeps only its last value: set once per batch, with the batch's latest (the SDK's set costs ~10 us)
        self._latest: dict[tuple[str, str, Any], tuple[Identity, float]] = {}
        self._root_attrs: dict[str, Any] = {}  # the run's config and logged hyperparameters, on every root span
        self.non_ucum_units: set[str] = set()  # units seen that are not UCUM (exported as they are, warned once)
        # (record name, unit) -> (OTel name, instrument: "counter", "updown" or "gauge")
        self._names: dict[tuple[str, str], tuple[str, str]] = {}
        self._last_collect = time.monotonic()
        # what could not be exported (also in docs/backends/opentelemetry.md)
        self.dropped_events = 0  # span events whose span never started here (buffer full)
        self.unmatched_ends = 0  # end records whose start this sink never saw (attached mid-span)
        self.non_finite_values = 0  # NaN/inf values, which the SDK's instruments refuse: counted, not set
        self._non_finite: dict[str, int] = {}  # OTel name -> its count, the telemetrain.non_finite counter's
        self._non_finite_made = False

    # -- the Sink interface ----------------------------------------------------------------------------------------

    def write(self, records: Sequence[Any]) -> None:
        handlers = self._handlers
        for record in records:
            handler = handlers.get(record.kind)
            if handler is not None:
                handler(record)
        if self._latest:
            self._set_latest()
        self._export(self._reader is not None and time.monotonic() - self._last_collect >= self.metric_interval)

    def flush(self) -> None:
        if self._direct is None and self._tracer is not None:
            force_flush_provider(self._user_tp, self._timeout_ms)
        if self._reader is None and self._meter is not None:
            force_flush_provider(self._user_mp, self._timeout_ms)
        self._export(self._reader is not None)

    def _export(self, metrics: bool) -> None:
        """The own providers' spans, then (``metrics``) metrics: the metrics go out even when the spans fail (kept
        spans fail every export until the collector is back), and the first failure is raised after both."""
        failed: OTelExportError | None = None
        if self._direct is not None:
            try:
                self._direct.export()
            except OTelExportError as exc:
                failed = exc
        if metrics:
            try:
                self._collect()
            except OTelExportError as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    @property
    def dropped_spans(self) -> int:
        """Spans of failed exports that were never delivered: over ``MAX_KEPT_SPANS``, or still waiting at close."""
        return self._direct.dropped if self._direct is not None else 0

    @property
    def dropped_histograms(self) -> int:
        """Stats' histogram points (and delta sums) of failed exports never delivered (as ``dropped_spans``)."""
        return self._reader.dropped if self._reader is not None else 0

    def close(self) -> None:
        # our own providers only: the application's are its own to shut down
        before = self.dropped_spans, self.dropped_histograms
        if self._own_tp is not None:
            self._own_tp.shutdown()
        if self._own_mp is not None:
            self._own_mp.shutdown(timeout_millis=self._timeout_ms)
        spans, histograms = self.dropped_spans - before[0], self.dropped_histograms - before[1]
        if spans or histograms:  # the final flush failed too: raised, so the dispatcher counts and reports the loss
            raise OTelExportError(f"{spans} spans and {histograms} histogram points of failed exports were never "
                                  "delivered (the collector still failed at close)")

    def after_fork_in_child(self) -> None:
        # the parent's open spans and buffered events are the parent's; its own providers' exporters (HTTP sessions)
        # too: rebuilt at the child's first record. Instruments on the application's meter stay (re-creating one
        # would return the parent's with its callback), their latest values go.
        self._open.clear()
        self._pending.clear()
        self._latest.clear()
        self._n_pending = 0
        if self._own_tp is not None:
            self._tracer = self._own_tp = self._direct = None
        if self._own_mp is not None:
            self._meter = self._own_mp = self._reader = None
            self._gauges = {}
            self._counters = {}
            self._non_finite, self._non_finite_made = {}, False
        else:
            for values in self._counters.values():
                values.clear()

    def _otlp_timeout(self, signal: str) -> float | None:
        """The default exporter's timeout: ``export_timeout``, unless the standard variables set one (None: the
        exporter reads them)."""
        if os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_TIMEOUT") or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT"):
            return None
        return self.export_timeout

    def _default_exporters(self, signal: str, module: str, cls: str) -> tuple[Any, Any]:
        """The default OTLP exporter and its quick twin (used while exports fail)."""
        make = otlp_exporter(module, cls)
        timeout = self._otlp_timeout(signal)
        quick = QUICK_EXPORT_TIMEOUT_S if timeout is None else min(QUICK_EXPORT_TIMEOUT_S, timeout)
        return make(timeout=timeout), make(timeout=quick)

    # -- spans -----------------------------------------------------------------------------------------------------

    def _tracer_for(self, identity: Identity) -> Tracer:
        if self._tracer is None:
            provider = self._user_tp
            if provider is None:
                exporter, quick = (self._span_exporter, None) if self._span_exporter is not None else \
                    self._default_exporters("TRACES", "trace_exporter", "OTLPSpanExporter")
                quiet_own_exports()
                self._direct = DirectSpanExport(exporter, quick)
                resource = otel_resource(identity, self.run_config)
                own = SdkTracerProvider(resource=resource, id_generator=self._ids, shutdown_on_exit=False)
                own.add_span_processor(self._direct)
                self._own_tp = provider = own
            tracer = provider.get_tracer(SCOPE, __version__)
            if isinstance(tracer, SdkTracer):  # another SDK's tracer draws its own ids (documented)
                tracer.id_generator = self._ids
            self._tracer = tracer
        return self._tracer

    def _span_start(self, record: Any) -> None:
        if not record.span_id:
            return
        tracer = self._tracer_for(record.identity)
        parent = self._open.get(record.parent_id) if record.parent_id else None
        trace_id = _hex(record.trace_id)
        if parent is not None:
            context = set_span_in_context(parent, Context())
        elif record.parent_id:
            # the parent's record is not here yet (short spans arrive children first) or went elsewhere: by id
            ref = SpanContext(trace_id, _hex(record.parent_id), is_remote=False, trace_flags=_SAMPLED)
            context = set_span_in_context(NonRecordingSpan(ref), Context())
        else:
            context = Context()  # a root: an empty context, not the caller's current one
        extra: dict[str, Any] = {GROUP_KEY: record.group}
        if not record.parent_id:  # a root: the run's hyperparameters, so a trace can be found by them
            if self.run_config and not self._root_attrs.get(_CONFIG_DONE):
                self._root_attrs.update(prefixed(CONFIG_PREFIX, self.run_config))
                self._root_attrs[_CONFIG_DONE] = True
            extra.update((k, v) for k, v in self._root_attrs.items() if k != _CONFIG_DONE)
        self._ids.give(trace_id, _hex(record.span_id))
        try:
            span = tracer.start_span(
                record.name,
                context=context,
                attributes=attributes(record.attributes, extra),
                start_time=record.wall_ns,
            )
        finally:
            self._ids.give(0, 0)
        self._open[record.span_id] = span
        early = self._pending.pop(record.span_id, None)
        if early:
            self._n_pending -= len(early)
            for event in early:
                _add_event(span, event)

    def _span_end(self, record: Any) -> None:
        span = self._open.pop(record.span_id, None)
        if span is None:
            self.unmatched_ends += 1
            return
        if record.attributes:
            span.set_attributes(attributes(record.attributes))
        if record.status == "ok":
            span.set_status(Status(StatusCode.OK))
        elif record.status == "terminated":
            # with why (spans._closed_because: "... stopped by SIGINT"): a backend's only clue to how the job ended
            span.set_status(Status(StatusCode.ERROR, f"terminated: {record.error}" if record.error else "terminated"))
        else:
            span.set_status(Status(StatusCode.ERROR, record.error or record.status))
        span.end(end_time=record.wall_ns)

    def _event(self, record: Any) -> None:
        """An event linked to a span becomes a span event; one that comes before its span's start record (a short
        span's start travels with its end) waits for it, within ``max_pending_events``. Unlinked events are not
        exported (they stay in the run store), but hyperparameters become attributes of the root spans after them."""
        if is_hyperparameters(record):
            self._root_attrs.update(prefixed(HPARAM_PREFIX, record.attributes))
        if not record.span_id:
            return
        span = self._open.get(record.span_id)
        if span is not None:
            _add_event(span, record)
            return
        if self._n_pending >= self.max_pending_events:  # the oldest waiting span's events go
            if not self._pending:
                self.dropped_events += 1
                return
            oldest = next(iter(self._pending))
            self.dropped_events += len(self._pending[oldest])
            self._n_pending -= len(self._pending.pop(oldest))
            if self._n_pending >= self.max_pending_events:
                self.dropped_events += 1
                return
        self._pending.setdefault(record.span_id, []).append(record)
        self._n_pending += 1


def _add_event(span: Span, record: Any) -> None:
    extra: dict[str, Any] = {"telemetrain.severity": record.severity, GROUP_KEY: record.group}
    if record.event_id:
        extra["telemetrain.event_id"] = record.event_id
    span.add_event(record.name, attributes(record.attributes, extra), timestamp=record.wall_ns)
