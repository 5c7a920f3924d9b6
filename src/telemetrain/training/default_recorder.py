"""one-logger's recorder (``nv_one_logger.api.recorder.Recorder`` and ``nv_one_logger.recorder.default_recorder``):
``start``/``stop`` spans, ``event``/``error`` on a span, ``telemetry_data_error``, ``close``, with its parenting (a
span started without a parent is a child of the latest active span of this thread or task; when a span stops, the
latest active span goes back to its nearest active ancestor), its export customization (all spans, a whitelist or a
blacklist of span names) and its per-exporter failure accounting (``training.delivery``).

What differs, on purpose:
- misuse -- stopping a span twice or one never started, an event on an ended span, anything after ``close`` -- is
  recorded (an ``error`` event in the run store, ``errors`` counted, warned once) and reported to the exporters as a
  telemetry data error, as one-logger's error guard does; it is never raised. A call after ``close`` gets an
  unexported span, so the caller's code keeps working.
- a child of a filtered span is exported under the filtered span's nearest exported ancestor (``Span.parent_span``),
  never with a parent its exporters did not see.
- exporters run on their own threads (``training.delivery``); a public call returns once its exports are done or
  after the delivery wait, whichever comes first.
- ``EXPORT_ALL_SPANS`` accepts an empty filter and ``BLACKLIST_SPANS`` an empty list (export everything).
- the recorder is thread-safe (one-logger's has no lock).
"""

from __future__ import annotations

import abc
import contextvars
import enum
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from ..dispatch import describe, warn_safely
from ..telemetry import Telemetry, get_telemetry
from .attributes import Attributes
from .delivery import TELEMETRY_DATA_ERROR, ExporterChannel
from .events import ErrorEvent, Event
from .exporters.base import check_exporter
from .exporters.otel import OTelExporter
from .names import E
from .spans import Span, SpanName, span_name_str
from .timestamps import TracingTimestamp

__all__ = ["DefaultRecorder", "ExportCustomizationMode", "Recorder"]

GROUP = "training"


class ExportCustomizationMode(enum.Enum):
    EXPORT_ALL_SPANS = enum.auto()
    WHITELIST_SPANS = enum.auto()
    BLACKLIST_SPANS = enum.auto()


class Recorder(abc.ABC):
    """The recorder interface (one-logger's): what ``timed_span`` and the training recorder are built on."""

    @abc.abstractmethod
    def start(self, span_name: SpanName, span_attributes: Attributes | None = None,
              start_event_attributes: Attributes | None = None, start_time: TracingTimestamp | None = None,
              parent_span: Span | None = None) -> Span | None: ...

    @abc.abstractmethod
    def stop(self, span: Span, stop_event_attributes: Attributes | None = None,
             stop_time: TracingTimestamp | None = None) -> None: ...

    @abc.abstractmethod
    def event(self, span: Span | Event, event: Event | None = None) -> Event | None: ...

    @abc.abstractmethod
    def error(self, span: Span, error_message: str, exception: BaseException | None = None) -> ErrorEvent | None: ...

    @abc.abstractmethod
    def telemetry_data_error(self, error_message: str, attributes: Attributes | None = None) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...


def _filter_names(mode: ExportCustomizationMode, span_name_filter: Sequence[SpanName] | None) -> frozenset[str]:
    if not isinstance(mode, ExportCustomizationMode):
        raise TypeError(f"export_customization_mode must be an ExportCustomizationMode, got {type(mode).__name__}")
    if span_name_filter is None:
        if mode is ExportCustomizationMode.WHITELIST_SPANS:
            raise ValueError("span_name_filter: a whitelist needs the names of the spans to export")
        return frozenset()
    if isinstance(span_name_filter, (str, bytes)) or not isinstance(span_name_filter, Iterable):
        raise TypeError(f"span_name_filter must be a list of span names, got {type(span_name_filter).__name__}")
    names = []
    for name in span_name_filter:
        if not isinstance(name, (str, enum.Enum)):
            raise TypeError(f"span_name_filter holds {name!r}: span names are str or Enum members")
        names.append(span_name_str(name))
    return frozenset(names)


class DefaultRecorder(Recorder):
    """Spans, events and errors, delivered to ``exporters`` (see the module docstring). ``telemetry``: where misuse
    is recorded (default: the default ``Telemetry``); ``wait_s``: how long a call waits for its exports."""

    def __init__(self, exporters: Sequence[Any], export_customization_mode: ExportCustomizationMode =
                 ExportCustomizationMode.EXPORT_ALL_SPANS, span_name_filter: Sequence[SpanName] | None = None, *,
                 telemetry: Telemetry | None = None, wait_s: float = 1.0) -> None:
        if isinstance(exporters, (str, bytes)) or not isinstance(exporters, Iterable):
            raise TypeError(f"exporters must be a list of exporters, got {type(exporters).__name__}")
        exporters = list(exporters)
        for index, exporter in enumerate(exporters):
            check_exporter(exporter, f"exporters[{index}]")
        if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not wait_s >= 0:
            raise ValueError(f"wait_s must be a number of seconds >= 0, got {wait_s!r}")
        self._filter = _filter_names(export_customization_mode, span_name_filter)
        self._export_customization_mode = export_customization_mode
        self._span_name_filter = span_name_filter
        self.telemetry = telemetry if telemetry is not None else get_telemetry()
        self._exporters = exporters
        self._lock = threading.RLock()
        self._latest_active_span: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
            "telemetrain_latest_active_span", default=None)
        self._spans: dict[int, Span] = {}
        self._by_name: dict[str, list[Span]] = {}  # the active spans by name, oldest first
        self._closed = False
        self._exporting = True  # False: force-disabled (no exporter is called again)
        self.errors = 0
        self._pending: dict[ExporterChannel, int] = {}
        self._channels: list[ExporterChannel] = []
        for exporter in exporters:
            if isinstance(exporter, OTelExporter):  # routed to our OTel sink: no calls to deliver
                self._guard("OTelExporter", lambda e=exporter: e.attach(self.telemetry))
                continue
            self._channels.append(ExporterChannel(exporter, wait_s=float(wait_s), on_failure=self._exporter_failed))
        self._export_all("initialize")
        self._sync()

    # -- exporting -------------------------------------------------------------------------------------------------

    def _should_export(self, span: Span) -> bool:
        mode = self._export_customization_mode
        if mode is ExportCustomizationMode.EXPORT_ALL_SPANS:
            return True
        inside = span.name_str in self._filter
        return inside if mode is ExportCustomizationMode.WHITELIST_SPANS else not inside

    def _export_all(self, method: str, *args: Any) -> None:
        if not self._exporting:
            return
        pending = self._pending
        for channel in self._channels:
            seq = channel.submit(method, *args)
            if seq:
                pending[channel] = seq
        self._sync()

    def _sync(self) -> None:
        """Wait for the exports queued so far (each channel bounded by its wait)."""
        pending = self._pending
        if pending:
            items = list(pending.items())
            pending.clear()
            for channel, seq in items:
                channel.wait(seq)

    def _exporter_failed(self, where: str, text: str) -> None:
        try:
            self.telemetry.event("exporter_error", {"exporter": where, "error": text}, severity="error", group=GROUP)
        except Exception:  # noqa: BLE001 - (called from a delivery thread)
            pass

    def export_stats(self) -> list[dict[str, Any]]:
        """Per exporter: calls delivered, failures, calls dropped, whether it is disabled or detached, pending."""
        return [channel.stats() for channel in self._channels]

    def force_disable_exporting(self) -> None:
        self._exporting = False

    # -- misuse ----------------------------------------------------------------------------------------------------

    def _misuse(self, where: str, message: str) -> None:
        """Recorded (run store), counted, warned once, told to the exporters -- never raised."""
        self.errors += 1
        if self.errors == 1:
            warn_safely(f"telemetrain.training: {where}: {message} (recorded as an error event; later misuse is not "
                        "warned about)", stacklevel=4)
        try:
            self.telemetry.event(E.ERROR, {"error_message": message, "callback": where}, severity="error",
                                 group=GROUP)
        except Exception:  # noqa: BLE001
            pass
        if self._channels and self._exporting:
            self._telemetry_data_error(f"Exception in telemetry code when calling {where}: {message}", None)
        self._after_misuse()

    def _after_misuse(self) -> None:
        """Hook: the training recorder applies the configured error-handling strategy."""

    def _guard(self, where: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a bug of ours or a user callable: recorded, never raised
            self._misuse(where, f"failed: {describe(exc)}")
            return None

    # -- the recorder interface ------------------------------------------------------------------------------------

    def start(self, span_name: SpanName, span_attributes: Attributes | None = None,
              start_event_attributes: Attributes | None = None, start_time: TracingTimestamp | None = None,
              parent_span: Span | None = None) -> Span | None:
        if not isinstance(span_name, (str, enum.Enum)):
            raise TypeError(f"span_name must be a str or an Enum member, got {type(span_name).__name__}")
        if parent_span is not None and not isinstance(parent_span, Span):
            raise TypeError(f"parent_span must be a Span, got {type(parent_span).__name__}")
        with self._lock:
            parent = parent_span if parent_span is not None else self._latest_active_span.get()
            span = Span.create(name=span_name, parent_span=parent, span_attributes=span_attributes,
                               start_event_attributes=start_event_attributes, start_time=start_time)
            if self._closed:
                self._misuse("start", f"the recorder is closed: span {span.name_str} is not recorded")
                return span
            exported = span._shown = self._should_export(span)
            ancestor = parent
            while ancestor is not None and not ancestor._shown:
                ancestor = ancestor._parent_span
            span._export_parent = ancestor
            self._spans[id(span)] = span
            same = self._by_name.get(span._name_str)
            if same is None:
                self._by_name[span._name_str] = [span]
            else:
                same.append(span)
            self._latest_active_span.set(span)
            self._on_start(span)
            if exported:
                self._export_all("export_start", span)
            return span

    def _on_start(self, span: Span) -> None:
        """Hook: the training recorder mirrors the span into telemetrain's own tracer."""

    def _on_stop(self, span: Span) -> None:
        """Hook (after the span has stopped)."""

    def stop(self, span: Span, stop_event_attributes: Attributes | None = None,
             stop_time: TracingTimestamp | None = None) -> None:
        if not isinstance(span, Span):
            raise TypeError(f"span must be a Span, got {type(span).__name__}")
        with self._lock:
            if self._spans.pop(id(span), None) is None:
                self._misuse("stop", f"span {span.name_str} is not active (already stopped, never started here, "
                                     "or the recorder is closed): nothing to stop")
                return
            same = self._by_name.get(span._name_str)
            if same is not None:
                same.remove(span)
                if not same:
                    del self._by_name[span._name_str]
            span.stop(stop_event_attributes, stop_time)
            latest = self._latest_active_span.get()
            if latest is span:
                ancestor = span._parent_span
                while ancestor is not None and not ancestor.active:
                    ancestor = ancestor._parent_span
                self._latest_active_span.set(ancestor)
            self._on_stop(span)
            if span._shown:
                self._export_all("export_stop", span)

    def event(self, span: Span | Event, event: Event | None = None) -> Event | None:
        """Add ``event`` to ``span`` and export it. ``recorder.event(event)`` (one-logger's README writes it so):
        on the latest active span of this thread."""
        if event is None and isinstance(span, Event):
            span, event = self._latest_active_span.get(), span  # type: ignore[assignment]
            if span is None:
                self._misuse("event", f"event {event.name_str} without a span, and no span is active: not recorded")
                return None
        if not isinstance(event, Event):
            raise TypeError(f"event must be an Event, got {type(event).__name__}")
        if not isinstance(span, Span):
            raise TypeError(f"span must be a Span, got {type(span).__name__}")
        with self._lock:
            if not span.active or self._closed:
                self._misuse("event", f"event {event.name_str} on span {span.name_str}, which has ended: not recorded")
                return None
            span.add_event(event)
            self._on_event(span, event)
            if span._shown:
                self._export_all("export_error" if isinstance(event, ErrorEvent) else "export_event", event, span)
            return event

    def _on_event(self, span: Span, event: Event) -> None:
        """Hook: the training recorder records the event in telemetrain's run store."""

    def error(self, span: Span, error_message: str, exception: BaseException | None = None) -> ErrorEvent | None:
        if not isinstance(error_message, str):
            raise TypeError(f"error_message must be a str, got {type(error_message).__name__}")
        if exception is not None and not isinstance(exception, BaseException):
            raise TypeError(f"exception must be an exception, got {type(exception).__name__}")
        return self.event(span, ErrorEvent.create(error_message=error_message, exception=exception))  # type: ignore[return-value]

    def telemetry_data_error(self, error_message: str, attributes: Attributes | None = None) -> None:
        """Tell every exporter (once each, as one-logger) that telemetry data is missing or incomplete."""
        if not isinstance(error_message, str):
            raise TypeError(f"error_message must be a str, got {type(error_message).__name__}")
        with self._lock:
            self._telemetry_data_error(error_message, attributes)
        try:
            record = {"error_message": error_message, **(attributes.to_json() if attributes else {})}
            self.telemetry.event(E.ERROR, record, severity="error", group=GROUP)
        except Exception:  # noqa: BLE001
            pass

    def _telemetry_data_error(self, message: str, attributes: Attributes | None) -> None:
        self._export_all(TELEMETRY_DATA_ERROR, message, attributes)

    def close(self) -> None:
        """Stop every active span (newest first, now), then close the exporters (waiting up to 5 s for each). An
        exporter its owner closed already gets neither."""
        with self._lock:
            if self._closed:
                return
            for channel in self._channels:
                channel.retire_if_closed()
            for span in reversed(list(self._spans.values())):
                self.stop(span)
            self._spans.clear()
            self._by_name.clear()
            self._sync()
            self._closed = True
        for channel in self._channels:
            channel.close()

    # -- one-logger's queries --------------------------------------------------------------------------------------

    def get_active_spans_by_name(self, span_name: SpanName) -> list[Span]:
        return list(self._by_name.get(span_name_str(span_name), ()))

    @property
    def closed(self) -> bool:
        return self._closed
