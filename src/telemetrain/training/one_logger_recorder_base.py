"""The part of ``OneLoggerTrainingRecorder`` (``training_recorder``) that its callbacks build on: one-logger's
training state (``_TrainingState``: the job-cumulative timers and counters, and what each checkpoint save holds), the
helpers that find a lifecycle span, record misuse and drive telemetrain's recorder, the mirroring of custom spans
and events into telemetrain, and one-logger's rules for starting and stopping a standard span."""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Any

from ..dispatch import describe
from .attributes import Attributes
from .config import TrainingTelemetryConfig
from .default_recorder import DefaultRecorder
from .events import ErrorEvent, Event
from .names import EventName, SpanName
from .one_logger_config import OneLoggerConfig, OneLoggerErrorHandlingStrategy
from .recorder import TrainingRecorder as TelemetrainRecorder
from .spans import Span, span_name_str
from .spans import SpanName as AnySpanName
from .timers import MetricSummarizer, MultiWindowTimer
from .timestamps import TracingTimestamp

S = SpanName
# spans driven by a lifecycle callback (telemetrain's recorder makes its own span for them); any other span started
# on this recorder (timed_span, recorder.start) is mirrored into telemetrain's tracer as it is
_LIFECYCLE = frozenset(s.value for s in (
    S.APPLICATION, S.DIST_INIT, S.DATA_LOADER_INIT, S.MODEL_INIT, S.OPTIMIZER_INIT, S.CHECKPOINT_LOAD,
    S.TRAINING_LOOP, S.TRAINING_SINGLE_ITERATION, S.VALIDATION_LOOP, S.VALIDATION_SINGLE_ITERATION, S.TESTING_LOOP,
    S.CHECKPOINT_SAVE_SYNC, S.CHECKPOINT_SAVE_ASYNC))
_STANDARD_SPANS = frozenset(s.value for s in S)
_STANDARD_EVENTS = frozenset(e.value for e in EventName)
_TIMED = (S.TRAINING_SINGLE_ITERATION, S.VALIDATION_SINGLE_ITERATION, S.CHECKPOINT_SAVE_SYNC,
          S.CHECKPOINT_SAVE_ASYNC, S.CHECKPOINT_LOAD)
_EXPLICIT_S = 0.002  # a timestamp further than this from now is the caller's own time (forwarded to telemetrain)


def _timers() -> dict[SpanName, MultiWindowTimer]:
    return {name: MultiWindowTimer() for name in _TIMED}


@dataclasses.dataclass
class _ProductivityState:
    """What a checkpoint saved at a step holds (captured at the save's start, reported at its success)."""

    productive_train_iterations: int
    productive_train_samples: int
    productive_train_iterations_sec: float
    productive_validation_iterations_sec: float
    productive_train_tflops: float | None = None


@dataclasses.dataclass
class _TrainingState:
    """one-logger's training state, field for field."""

    multi_iteration_timers: dict[SpanName, MultiWindowTimer] = dataclasses.field(default_factory=_timers)
    train_iterations_start: int = 0
    completed_training_iterations_overall: int = 0
    train_samples_start: int = 0
    train_samples_processed_current_job: int = 0
    total_flops_current_job: int = 0
    train_tokens_current_job: int | None = None
    completed_floating_point_operations_overall: int | None = None
    training_loop_start_time: TracingTimestamp | None = None
    first_logged_train_iterations_finish_time: TracingTimestamp | None = None
    last_logged_train_iterations_finish_time: TracingTimestamp | None = None
    first_save_checkpoint_success_time: TracingTimestamp | None = None
    latest_save_checkpoint_success_time: TracingTimestamp | None = None
    validation_interval_start: int = 0
    testing_interval_start: int = 0
    tflops_per_gpu: MetricSummarizer[float] = dataclasses.field(default_factory=MetricSummarizer)
    successful_save_checkpoint_count_current_job: int = 0
    productivity_state: dict[int, _ProductivityState] = dataclasses.field(default_factory=dict)
    max_reported_productive_train_iterations: int = -1


class OneLoggerRecorderBase(DefaultRecorder):
    """The state and helpers of ``OneLoggerTrainingRecorder`` (which sets them in its ``__init__``)."""

    training: TelemetrainRecorder  # telemetrain's recorder, driven by every lifecycle callback
    _config: OneLoggerConfig
    _training_state: _TrainingState

    # -- helpers ---------------------------------------------------------------------------------------------------

    def _training_config(self, where: str) -> TrainingTelemetryConfig | None:
        config = self._config.telemetry_config
        if config is None:
            self._misuse(where, "no training telemetry config set (set_training_telemetry_config): the metrics that "
                                "need it are left out")
        return config

    def _get_active_span(self, span_name: AnySpanName) -> Span | None:
        spans = self._by_name.get(span_name)  # type: ignore[arg-type]  # (a str Enum member hashes as its str)
        return spans[-1] if spans else None

    def _open(self, where: str, name: SpanName) -> Span | None:
        span = self._get_active_span(name)
        if span is None:
            self._misuse(where, f"Expected to have one and only one span named {name.value} but found 0: nothing to "
                                "end")
        return span

    def _after_misuse(self) -> None:
        if self._config.error_handling_strategy \
                is OneLoggerErrorHandlingStrategy.DISABLE_QUIETLY_AND_REPORT_METRIC_ERROR:
            self.force_disable_exporting()

    @staticmethod
    def _msec(ts: TracingTimestamp | None) -> float | None:
        """The time to give telemetrain's recorder: None (its own, finer clock) unless the caller chose it."""
        if ts is None or abs(ts.seconds_since_epoch - time.time()) <= _EXPLICIT_S:
            return None
        return ts.seconds_since_epoch * 1000.0

    def _ours(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Drive telemetrain's recorder (whose own misuse handling never raises; a bug there is recorded)."""
        try:
            return getattr(self.training, method)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks training
            self._misuse(f"telemetrain.{method}", f"failed: {describe(exc)}")
            return None

    def _lifecycle_start(self, name: SpanName, start_time: TracingTimestamp | None, ours: str,
                         *args: Any, attributes: Attributes | None = None, **kwargs: Any) -> Span | None:
        existing = self._get_active_span(name)
        if existing is not None:
            self._misuse(f"on_{name.value}_start", f"Cannot start span {name.value} while a span with the same name "
                                                   "is already active: the open span is returned")
            return existing
        span = self.start(name, span_attributes=attributes, start_time=start_time)
        if span is not None:
            span._ours = self._ours(ours, *args, self._msec(start_time), **kwargs)
        return span

    def _lifecycle_end(self, name: SpanName, stop_time: TracingTimestamp | None, ours: str, **kwargs: Any) -> None:
        span = self._open(f"on_{name.value}_end", name)
        self._ours(ours, self._msec(stop_time), **kwargs)
        if span is not None:
            self.stop(span, stop_time=stop_time)

    # -- mirroring custom spans and events into telemetrain ------------------------------------------------------

    def _on_start(self, span: Span) -> None:
        if span.name_str in _LIFECYCLE:
            return
        attributes = span.initial_attributes.to_json() or None
        span._ours = self._guard("start", lambda: self.training.tracer.start(
            span.name_str, group="training", attributes=attributes))

    def _on_stop(self, span: Span) -> None:
        ours = span._ours
        if span.name_str in _LIFECYCLE or ours is None:
            return
        failed = any(isinstance(e, ErrorEvent) for e in span.events)
        error = next((e.error_message for e in span.events if isinstance(e, ErrorEvent)), "")
        self._guard("stop", lambda: ours.end("error" if failed else None, error))

    def _on_event(self, span: Span, event: Event) -> None:
        name = event.name_str
        if name in _STANDARD_EVENTS and not isinstance(event, ErrorEvent):
            return  # telemetrain's recorder emits its own version of each standard event
        ours = span._ours
        attributes = {k: v for k, v in event.attributes.to_json().items() if k != "timestamp_msec" and v is not None}
        self._guard("event", lambda: self.telemetry.event(
            name, attributes, severity="error" if isinstance(event, ErrorEvent) else "info", group="training",
            span_id=ours.span_id_hex if ours is not None else ""))
        if isinstance(event, ErrorEvent) and ours is not None and span.name_str not in _LIFECYCLE:
            self._guard("error", lambda: ours.set_status("error", event.error_message))

    # -- overrides: one-logger's standard-span rules ---------------------------------------------------------------

    def start(self, span_name: AnySpanName, span_attributes: Attributes | None = None,
              start_event_attributes: Attributes | None = None, start_time: TracingTimestamp | None = None,
              parent_span: Span | None = None) -> Span | None:
        name = span_name_str(span_name) if isinstance(span_name, (str, enum.Enum)) else span_name
        if name in _STANDARD_SPANS and name not in _LIFECYCLE:
            pass  # a standard sub-phase (data_loading, ...) may repeat
        elif name in _STANDARD_SPANS:
            existing = self._get_active_span(name)
            if existing is not None:
                self._misuse("start", f"Cannot start span {name} while a span with the same name is already active: "
                                      "the open span is returned")
                return existing
        return super().start(span_name, span_attributes, start_event_attributes, start_time, parent_span)

    def stop(self, span: Span, stop_event_attributes: Attributes | None = None,
             stop_time: TracingTimestamp | None = None) -> None:
        if isinstance(span, Span) and span.active and span.name_str in self._training_state.multi_iteration_timers:
            timer = self._training_state.multi_iteration_timers[span.name]  # type: ignore[index]
            if timer.is_active:
                self._guard("stop", lambda: timer.stop(stop_time or TracingTimestamp.now()))
                self.error(span, f"Timer for span {span.name_str} was automatically stopped because the span is "
                                 "being stopped. This may indicate that the corresponding on_xxx_end method was not "
                                 "called correctly. If the program exited properly, please double-check your "
                                 "on_xxx_end callback. If the program exited abnormally (e.g., due to an exception), "
                                 "this is expected.")
        super().stop(span, stop_event_attributes, stop_time)

    @staticmethod
    def _throughput(config: TrainingTelemetryConfig) -> bool:
        return bool(config.is_log_throughput_enabled and config.flops_per_sample)


def _stop(timer: MultiWindowTimer, stop_time: TracingTimestamp) -> bool:
    timer.stop(stop_time)
    return True
