"""one-logger's ``TrainingRecorder`` (``nv_one_logger.training_telemetry.api.training_recorder``), as
``OneLoggerTrainingRecorder``: the training lifecycle on one-logger's span/event model, with one-logger's derived
metrics (the job-cumulative ``MultiWindowTimer`` arithmetic its dashboards expect), delivered to one-logger
exporters -- and, at the same time, driving telemetrain's own ``TrainingRecorder``, so every span and event also
lands in the run store, the report and telemetrain's sinks with telemetrain's metrics (windowed, percentiles, MFU).

Its methods take ``TracingTimestamp``s (the ``callbacks`` module converts ``*_time_msec``). Where it departs from
one-logger: misuse never raises (see ``default_recorder``): a start of a lifecycle span that is already open returns
the open span, an end without a start does nothing, an iteration started while the previous one is open ends the
previous one first (its timer too, with an error event), each recorded as an error; a missing training config is
recorded and the metrics that need it are left out; throughput needs ``flops_per_sample`` but not the iteration and
sample targets.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import socket
import threading
import time
from typing import Any

from ..dispatch import describe
from ..telemetry import Telemetry
from .attributes import (
    Attributes,
    CheckpointSaveSpanAttributes,
    OneLoggerInitializationAttributes,
    SaveCheckpointSuccessEventAttributes,
    SyncCheckpointMetricsUpdateAttributes,
    TestingMetricsUpdateAttributes,
    TrainingLoopAttributes,
    TrainingMetricsUpdateAttributes,
    TrainingTelemetryAttributes,
    ValidationMetricsUpdateAttributes,
)
from .checkpoint import CheckPointStrategy
from .config import TrainingTelemetryConfig
from .default_recorder import DefaultRecorder, ExportCustomizationMode
from .events import ErrorEvent, Event
from .names import EventName, SpanName
from .one_logger_config import OneLoggerConfig, OneLoggerErrorHandlingStrategy
from .recorder import TrainingRecorder as TelemetrainRecorder
from .spans import Span, span_name_str
from .spans import SpanName as AnySpanName
from .timers import MetricSummarizer, MultiWindowTimer
from .timestamps import TracingTimestamp

__all__ = ["OneLoggerTrainingRecorder", "TrainingRecorder"]

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


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


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


class OneLoggerTrainingRecorder(DefaultRecorder):
    """See the module docstring. ``training``: telemetrain's recorder to drive (default: ``telemetry``'s);
    ``drives_lifecycle=False``: only custom spans and events go through this one (``timed_span`` before any provider
    is configured), so telemetrain's recorder keeps warning about its own misuse."""

    def __init__(self, config: OneLoggerConfig, exporters: list[Any],
                 export_customization_mode: ExportCustomizationMode = ExportCustomizationMode.EXPORT_ALL_SPANS,
                 span_name_filter: list[AnySpanName] | None = None, *, telemetry: Telemetry | None = None,
                 training: TelemetrainRecorder | None = None, wait_s: float = 1.0,
                 drives_lifecycle: bool = True) -> None:
        if not isinstance(config, OneLoggerConfig):
            raise TypeError(f"config must be a OneLoggerConfig, got {type(config).__name__}")
        if training is not None and telemetry is None:
            telemetry = training.telemetry
        super().__init__(exporters, export_customization_mode, span_name_filter, telemetry=telemetry, wait_s=wait_s)
        if training is None:
            from .default import get_recorder

            training = get_recorder(self.telemetry)
        self.training = training
        if drives_lifecycle:  # this recorder warns (once) for both: the caller calls it, not that one
            training.warn_misuse = False
        self._config = config
        self._training_state = _TrainingState()
        if config.telemetry_config is not None and training.config is None:
            self._set_telemetrain_config(config.telemetry_config)
        self.telemetry.add_producer(self)

    def _set_telemetrain_config(self, training_config: TrainingTelemetryConfig) -> None:
        """Give telemetrain's recorder the training config, with the application config's session tag, world size,
        baseline flag and custom metadata where the training config leaves them unset (one-logger keeps those in
        ``OneLoggerConfig``; telemetrain's recorder reads them from its training config)."""
        app = self._config
        update: dict[str, Any] = {}
        if training_config.session_tag_or_fn is None:
            update["session_tag_or_fn"] = app.session_tag_or_fn
        if training_config.world_size_or_fn is None:
            update["world_size_or_fn"] = app.world_size_or_fn
        if training_config.is_baseline_run_or_fn is False:
            update["is_baseline_run_or_fn"] = app.is_baseline_run_or_fn
        if app.custom_metadata:
            update["custom_metadata"] = {**app.custom_metadata, **(training_config.custom_metadata or {})}
        self._guard("set_training_telemetry_config", lambda: self.training.set_training_telemetry_config(
            training_config.model_copy(update=update) if update else training_config))

    # -- the Telemetry producer protocol: exit and SIGTERM -----------------------------------------------------------

    def collect(self, final: bool) -> None:
        """When the Telemetry closes (exit, SIGTERM) before ``on_app_end``: stop the open spans and close the
        exporters, so they get what one-logger loses on a crash (a file's held-back start record included)."""
        if final and not self._closed:
            self.close()

    def after_fork_in_child(self) -> None:
        self._lock = threading.RLock()
        self._spans = {}  # the parent's: a forked worker is not the training job
        self._pending = {}

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

    def close(self) -> None:
        """Stop what is open and close the exporters; closed before ``on_app_end`` (a reset, the Telemetry closing),
        it ends telemetrain's application span too, so the two recorders agree."""
        if not self._closed and self._get_active_span(S.APPLICATION) is not None:
            self._ours("on_app_end")
        super().close()
        self.training.warn_misuse = True  # telemetrain's recorder is on its own again
        self._guard("close", lambda: self.telemetry.flush())

    # -- application and initialisation ----------------------------------------------------------------------------

    def on_app_start(self, start_time: TracingTimestamp | None = None) -> Span | None:
        start_time = start_time or TracingTimestamp.now()
        span = self._lifecycle_start(S.APPLICATION, start_time, "on_app_start")
        if span is None or not span.active or len(span.events) > 1:
            return span
        config = self._config
        self._guard("on_app_start", lambda: self.telemetry.event(
            "application_name", {"application_name": config.application_name}, group="training",
            span_id=span._ours.span_id_hex if span._ours is not None else ""))
        attributes = self._guard("on_app_start", lambda: OneLoggerInitializationAttributes.create(
            one_logger_training_telemetry_version=_version(), enable_for_current_rank=config.enable_for_current_rank,
            session_tag=config.session_tag, world_size=config.world_size, is_baseline_run=config.is_baseline_run,
            summary_data_schema_version=config.summary_data_schema_version, rank=_rank(),
            custom_metadata=config.custom_metadata, node_name=socket.gethostname()))
        if attributes is not None:
            self.event(span, Event.create(EventName.ONE_LOGGER_INITIALIZATION, attributes, timestamp=start_time))
        if config.telemetry_config is not None:
            self._update_application_span_with_training_telemetry_config(config.telemetry_config)
        return span

    def on_app_end(self, stop_time: TracingTimestamp | None = None) -> None:
        span = self._open("on_app_end", S.APPLICATION)
        self._ours("on_app_end", self._msec(stop_time))
        if span is not None:
            self.stop(span, stop_time=stop_time or TracingTimestamp.now())
        self.close()

    def _update_application_span_with_training_telemetry_config(
            self, training_telemetry_config: TrainingTelemetryConfig) -> None:
        """Emit ``update_training_telemetry_config`` on the application span."""
        config = training_telemetry_config
        if not isinstance(config, TrainingTelemetryConfig):
            self._misuse("set_training_telemetry_config", "Please set the training telemetry config before calling "
                                                          "this method.")
            return
        app = self._get_active_span(S.APPLICATION)
        if app is None:
            return  # before on_app_start: on_app_start emits it (the config is set by then)
        if config.is_log_throughput_enabled:  # (one-logger's rule: counted from here)
            self._training_state.completed_floating_point_operations_overall = 0
        attributes = self._guard("update_training_telemetry_config", lambda: TrainingTelemetryAttributes.create(
            perf_tag=config.perf_tag, global_batch_size=config.global_batch_size,
            log_every_n_train_iterations=config.log_every_n_train_iterations,
            micro_batch_size=config.micro_batch_size, seq_length=config.seq_length,
            flops_per_sample=_int_if_whole(config.flops_per_sample),
            train_iterations_target=config.train_iterations_target, train_samples_target=config.train_samples_target,
            checkpoint_strategy=CheckPointStrategy(config.save_checkpoint_strategy),
            is_train_iterations_enabled=config.is_train_iterations_enabled,
            is_validation_iterations_enabled=config.is_validation_iterations_enabled,
            is_test_iterations_enabled=config.is_test_iterations_enabled,
            is_save_checkpoint_enabled=config.is_save_checkpoint_enabled,
            is_log_throughput_enabled=config.is_log_throughput_enabled, custom_metadata=config.custom_metadata))
        if attributes is not None:
            self.event(app, Event.create(EventName.UPDATE_TRAINING_TELEMETRY_CONFIG, attributes))

    def on_distributed_init_start(self, start_time: TracingTimestamp | None = None) -> Span | None:
        return self._lifecycle_start(S.DIST_INIT, start_time, "on_distributed_init_start")

    def on_distributed_init_end(self, stop_time: TracingTimestamp | None = None) -> None:
        self._lifecycle_end(S.DIST_INIT, stop_time, "on_distributed_init_end")

    def on_model_init_start(self, start_time: TracingTimestamp | None = None) -> Span | None:
        return self._lifecycle_start(S.MODEL_INIT, start_time, "on_model_init_start")

    def on_model_init_end(self, stop_time: TracingTimestamp | None = None) -> None:
        self._lifecycle_end(S.MODEL_INIT, stop_time, "on_model_init_end")

    def on_dataloader_init_start(self, start_time: TracingTimestamp | None = None) -> Span | None:
        return self._lifecycle_start(S.DATA_LOADER_INIT, start_time, "on_dataloader_init_start")

    def on_dataloader_init_end(self, stop_time: TracingTimestamp | None = None) -> None:
        self._lifecycle_end(S.DATA_LOADER_INIT, stop_time, "on_dataloader_init_end")

    def on_optimizer_init_start(self, start_time: TracingTimestamp | None = None) -> Span | None:
        return self._lifecycle_start(S.OPTIMIZER_INIT, start_time, "on_optimizer_init_start")

    def on_optimizer_init_end(self, stop_time: TracingTimestamp | None = None) -> None:
        self._lifecycle_end(S.OPTIMIZER_INIT, stop_time, "on_optimizer_init_end")

    def on_load_checkpoint_start(self, start_time: TracingTimestamp | None = None) -> Span | None:
        start_time = start_time or TracingTimestamp.now()
        timer = self._training_state.multi_iteration_timers[S.CHECKPOINT_LOAD]
        if not timer.is_active:
            timer.start(start_time)
        return self._lifecycle_start(S.CHECKPOINT_LOAD, start_time, "on_load_checkpoint_start")

    def on_load_checkpoint_end(self, stop_time: TracingTimestamp | None = None, *, path: Any = None) -> None:
        stop_time = stop_time or TracingTimestamp.now()
        timer = self._training_state.multi_iteration_timers[S.CHECKPOINT_LOAD]
        if timer.is_active:
            self._guard("on_load_checkpoint_end", lambda: timer.stop(stop_time))
        self._lifecycle_end(S.CHECKPOINT_LOAD, stop_time, "on_load_checkpoint_end", path=path)

    # -- training loop and iterations ------------------------------------------------------------------------------

    def on_training_loop_start(self, train_iterations_start: int, train_samples_start: int,
                               train_iterations_target: int | None = None, train_samples_target: int | None = None,
                               train_tokens_target: int | None = None,
                               start_time: TracingTimestamp | None = None) -> Span | None:
        for arg, value in (("train_iterations_start", train_iterations_start),
                           ("train_samples_start", train_samples_start)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{arg} must be an int >= 0, got {value!r}")
        start_time = start_time or TracingTimestamp.now()
        existing = self._get_active_span(S.TRAINING_LOOP)
        if existing is not None:
            self._misuse("on_train_start", "training_loop is already open: the open span is returned")
            return existing
        config = self._training_config("on_train_start")
        state = self._training_state
        state.training_loop_start_time = start_time
        state.train_iterations_start = train_iterations_start
        state.train_samples_start = train_samples_start
        state.completed_training_iterations_overall = train_iterations_start
        state.validation_interval_start = state.testing_interval_start = train_iterations_start
        if config is not None and self._throughput(config):
            state.completed_floating_point_operations_overall = int(
                train_iterations_start * config.global_batch_size * (config.flops_per_sample or 0))
            state.total_flops_current_job = 0
        attributes = TrainingLoopAttributes.create(
            train_iterations_start=train_iterations_start, train_samples_start=train_samples_start,
            train_tokens_target=train_tokens_target,
            completed_floating_point_operations_overall=state.completed_floating_point_operations_overall,
            train_iterations_target=train_iterations_target, train_samples_target=train_samples_target)
        return self._lifecycle_start(S.TRAINING_LOOP, start_time, "on_train_start", train_iterations_start,
                                     train_samples_start, train_iterations_target, train_samples_target,
                                     attributes=attributes)

    def on_training_loop_end(self, stop_time: TracingTimestamp | None = None) -> None:
        self._lifecycle_end(S.TRAINING_LOOP, stop_time, "on_train_end")

    @staticmethod
    def _throughput(config: TrainingTelemetryConfig) -> bool:
        return bool(config.is_log_throughput_enabled and config.flops_per_sample)

    def on_training_single_iteration_start(self, start_time: TracingTimestamp | None = None) -> Span | None:
        start_time = start_time or TracingTimestamp.now()
        stale = self._get_active_span(S.TRAINING_SINGLE_ITERATION)
        timer = self._training_state.multi_iteration_timers[S.TRAINING_SINGLE_ITERATION]
        if stale is not None or timer.is_active:
            self._misuse("on_training_single_iteration_start", "Cannot start timer since it is already active: the "
                         "previous iteration was not ended; it is ended now and not counted")
            if stale is not None:
                self.stop(stale, stop_time=start_time)  # (stops its timer, with an error event)
            timer._current_window_start = None
        timer.start(start_time)
        span = self.start(S.TRAINING_SINGLE_ITERATION, start_time=start_time)
        if span is not None:
            span._ours = self._ours("on_training_single_iteration_start", self._msec(start_time))
        return span

    def on_training_single_iteration_end(self, stop_time: TracingTimestamp | None = None) -> None:
        stop_time = stop_time or TracingTimestamp.now()
        state = self._training_state
        timer = state.multi_iteration_timers[S.TRAINING_SINGLE_ITERATION]
        span = self._get_active_span(S.TRAINING_SINGLE_ITERATION)
        self._ours("on_training_single_iteration_end", self._msec(stop_time))
        if not timer.is_active or span is None:
            self._misuse("on_training_single_iteration_end", "Cannot stop timer since it is not active: nothing to "
                                                             "end")
            return
        stopped = self._guard("on_training_single_iteration_end", lambda: _stop(timer, stop_time))
        config = self._training_config("on_training_single_iteration_end") if stopped else None
        if config is not None:
            self._count_iteration(config, timer, stop_time)
            self._maybe_send_training_metrics_update()
        self.stop(span, stop_time=stop_time)

    def _count_iteration(self, config: TrainingTelemetryConfig, timer: MultiWindowTimer,
                         stop_time: TracingTimestamp) -> None:
        state = self._training_state
        gbs = config.global_batch_size
        state.completed_training_iterations_overall += 1
        state.train_samples_processed_current_job += gbs
        seq = config.seq_length
        if seq:
            state.train_tokens_current_job = seq * state.train_samples_processed_current_job
        state.last_logged_train_iterations_finish_time = stop_time
        if state.first_logged_train_iterations_finish_time is None:
            state.first_logged_train_iterations_finish_time = stop_time
        if self._throughput(config):
            flops = int(gbs * (config.flops_per_sample or 0))
            state.completed_floating_point_operations_overall = (
                (state.completed_floating_point_operations_overall or 0) + flops)
            state.total_flops_current_job += flops
            total_sec = timer.total_time_sec
            if total_sec > 0:
                state.tflops_per_gpu.add_value(
                    float(state.total_flops_current_job) / (total_sec * 10**12 * self._config.world_size))

    def _maybe_send_training_metrics_update(self) -> None:
        """Every ``log_every_n_train_iterations`` iterations, aligned to the global step (one-logger's rule)."""
        state = self._training_state
        config = self._config.telemetry_config
        latest = state.completed_training_iterations_overall - 1
        if config is None or not (latest > 0 and (latest + 1) % config.log_every_n_train_iterations == 0):
            return
        loop = self._get_active_span(S.TRAINING_LOOP)
        if loop is None:
            self._misuse("on_training_single_iteration_end", "no training_loop open: the metrics update is dropped")
            return
        timer = state.multi_iteration_timers[S.TRAINING_SINGLE_ITERATION]
        first, last = state.first_logged_train_iterations_finish_time, state.last_logged_train_iterations_finish_time
        tflops = state.tflops_per_gpu
        attributes = TrainingMetricsUpdateAttributes.create(
            train_iterations_start=state.train_iterations_start, current_iteration=latest,
            num_iterations=timer.total_window_count, train_samples_start=state.train_samples_start,
            num_train_samples=state.train_samples_processed_current_job,
            interval=config.log_every_n_train_iterations, avg_iteration_time_sec=timer.avg_window_duration_sec,
            min_iteration_time_sec=timer.min_window_duration_sec,
            max_iteration_time_sec=timer.max_window_duration_sec, total_iteration_time_sec=timer.total_time_sec,
            train_tokens=state.train_tokens_current_job,
            completed_floating_point_operations_overall=state.completed_floating_point_operations_overall,
            total_flops=state.total_flops_current_job if self._throughput(config) else None,
            train_throughput_per_gpu=tflops.latest_value, train_throughput_per_gpu_max=tflops.max_value,
            train_throughput_per_gpu_min=tflops.min_value,
            first_logged_train_iterations_finish_timestamp_sec=first.seconds_since_epoch if first else None,
            last_logged_train_iterations_finish_timestamp_sec=last.seconds_since_epoch if last else None)
        self.event(loop, Event.create(EventName.TRAINING_METRICS_UPDATE, attributes))

    # -- validation and testing ------------------------------------------------------------------------------------

    def on_validation_start(self, start_time: TracingTimestamp | None = None) -> Span | None:
        return self._lifecycle_start(S.VALIDATION_LOOP, start_time, "on_validation_start")

    def on_validation_end(self, stop_time: TracingTimestamp | None = None) -> None:
        span = self._open("on_validation_end", S.VALIDATION_LOOP)
        state = self._training_state
        if span is not None:
            done = state.completed_training_iterations_overall
            timer = state.multi_iteration_timers[S.VALIDATION_SINGLE_ITERATION]
            measured = timer.total_window_count > 0
            attributes = ValidationMetricsUpdateAttributes.create(
                current_iteration=max(0, done - 1), interval=done - state.validation_interval_start,
                avg_iteration_time_sec=timer.avg_window_duration_sec if measured else None,
                min_iteration_time_sec=timer.min_window_duration_sec if measured else None,
                max_iteration_time_sec=timer.max_window_duration_sec if measured else None,
                total_iteration_time_sec=timer.total_time_sec if measured else None)
            self.event(span, Event.create(EventName.VALIDATION_METRICS_UPDATE, attributes))
            state.validation_interval_start = done
        self._ours("on_validation_end", self._msec(stop_time))
        if span is not None:
            self.stop(span, stop_time=stop_time)

    def on_validation_single_iteration_start(self, start_time: TracingTimestamp | None = None) -> Span | None:
        start_time = start_time or TracingTimestamp.now()
        timer = self._training_state.multi_iteration_timers[S.VALIDATION_SINGLE_ITERATION]
        stale = self._get_active_span(S.VALIDATION_SINGLE_ITERATION)
        if stale is not None or timer.is_active:
            self._misuse("on_validation_single_iteration_start", "the previous validation iteration was not ended: "
                                                                 "it is ended now")
            if stale is not None:
                self.stop(stale, stop_time=start_time)
            timer._current_window_start = None
        timer.start(start_time)
        span = self.start(S.VALIDATION_SINGLE_ITERATION, start_time=start_time)
        if span is not None:
            span._ours = self._ours("on_validation_single_iteration_start", self._msec(start_time))
        return span

    def on_validation_single_iteration_end(self, stop_time: TracingTimestamp | None = None) -> None:
        stop_time = stop_time or TracingTimestamp.now()
        timer = self._training_state.multi_iteration_timers[S.VALIDATION_SINGLE_ITERATION]
        if timer.is_active:
            self._guard("on_validation_single_iteration_end", lambda: timer.stop(stop_time))
        self._lifecycle_end(S.VALIDATION_SINGLE_ITERATION, stop_time, "on_validation_single_iteration_end")

    def on_testing_start(self, start_time: TracingTimestamp | None = None) -> Span | None:
        return self._lifecycle_start(S.TESTING_LOOP, start_time, "on_testing_start")

    def on_testing_end(self, stop_time: TracingTimestamp | None = None) -> None:
        span = self._open("on_testing_end", S.TESTING_LOOP)
        state = self._training_state
        if span is not None:
            done = state.completed_training_iterations_overall
            attributes = TestingMetricsUpdateAttributes.create(current_iteration=max(0, done - 1),
                                                               interval=done - state.testing_interval_start)
            self.event(span, Event.create(EventName.TESTING_METRICS_UPDATE, attributes))
            state.testing_interval_start = done
        self._ours("on_testing_end", self._msec(stop_time))
        if span is not None:
            self.stop(span, stop_time=stop_time)

    # -- checkpoints -----------------------------------------------------------------------------------------------

    def _save_span(self, config: TrainingTelemetryConfig | None) -> SpanName:
        if config is not None and CheckPointStrategy(config.save_checkpoint_strategy) is CheckPointStrategy.ASYNC:
            return S.CHECKPOINT_SAVE_ASYNC
        return S.CHECKPOINT_SAVE_SYNC

    def create_sync_checkpoint_metrics_event(self, span_name: SpanName) -> Event:
        timer = self._training_state.multi_iteration_timers[span_name]
        return Event.create(EventName.SYNC_CHECKPOINT_METRICS_UPDATE, SyncCheckpointMetricsUpdateAttributes.create(
            save_checkpoint_sync_time_total_sec=timer.total_time_sec,
            save_checkpoint_sync_time_min_sec=timer.min_window_duration_sec,
            save_checkpoint_sync_time_max_sec=timer.max_window_duration_sec))

    def on_save_checkpoint_start(self, current_iteration: int, start_time: TracingTimestamp | None = None
                                 ) -> Span | None:
        if isinstance(current_iteration, bool) or not isinstance(current_iteration, int):
            raise TypeError(f"global_step must be an int, got {type(current_iteration).__name__}")
        start_time = start_time or TracingTimestamp.now()
        config = self._training_config("on_save_checkpoint_start")
        name = self._save_span(config)
        existing = self._get_active_span(name)
        if existing is not None:
            self._misuse("on_save_checkpoint_start", f"{name.value} is already open (the previous save has not "
                                                     "ended): the open span is returned")
            return existing
        attributes = None
        if config is not None and config.is_save_checkpoint_enabled:
            state = self._training_state
            timers = state.multi_iteration_timers
            flops = state.completed_floating_point_operations_overall
            state.productivity_state[current_iteration] = _ProductivityState(
                productive_train_iterations=state.completed_training_iterations_overall,
                productive_train_samples=state.train_samples_start + state.train_samples_processed_current_job,
                productive_train_iterations_sec=timers[S.TRAINING_SINGLE_ITERATION].total_time_sec,
                productive_validation_iterations_sec=timers[S.VALIDATION_SINGLE_ITERATION].total_time_sec,
                productive_train_tflops=float(flops) / 10**12 if flops is not None else None)
            for step in [s for s in state.productivity_state if s < current_iteration]:
                del state.productivity_state[step]  # saves that never succeeded (one-logger keeps them forever)
            timer = timers[name]
            if timer.is_active:
                timer._current_window_start = None
            timer.start(start_time)
            attributes = CheckpointSaveSpanAttributes.create(
                CheckPointStrategy(config.save_checkpoint_strategy), current_iteration=current_iteration,
                save_checkpoint_attempt_count=timer.total_window_count)
        span = self.start(name, span_attributes=attributes, start_time=start_time)
        if span is not None:
            span._ours = self._ours("on_save_checkpoint_start", current_iteration, self._msec(start_time))
        return span

    def on_save_checkpoint_success(self, current_iteration: int, timestamp: TracingTimestamp | None = None, *,
                                   path: Any = None) -> None:
        timestamp = timestamp or TracingTimestamp.now()
        config = self._training_config("on_save_checkpoint_success")
        self._ours("on_save_checkpoint_success", current_iteration, self._msec(timestamp), path=path)
        if config is None or not config.is_save_checkpoint_enabled:
            return
        asynchronous = self._save_span(config) is S.CHECKPOINT_SAVE_ASYNC
        parent = self._get_active_span(S.APPLICATION if asynchronous else S.CHECKPOINT_SAVE_SYNC)
        if parent is None and asynchronous:
            parent = self._get_active_span(S.TRAINING_LOOP)
        if parent is None:
            self._misuse("on_save_checkpoint_success", "no span to attach the checkpoint success to (no save open, no "
                                                       "application): the success event is not exported")
        state = self._training_state
        state.successful_save_checkpoint_count_current_job += 1
        state.latest_save_checkpoint_success_time = timestamp
        if state.first_save_checkpoint_success_time is None:
            state.first_save_checkpoint_success_time = timestamp
        productivity = state.productivity_state.pop(current_iteration, None) or _ProductivityState(0, 0, 0, 0, 0)
        loop_start = state.training_loop_start_time
        attributes = SaveCheckpointSuccessEventAttributes.create(
            checkpoint_strategy=CheckPointStrategy(config.save_checkpoint_strategy),
            current_iteration=current_iteration,
            first_successful_save_checkpoint_timestamp_sec=state.first_save_checkpoint_success_time.seconds_since_epoch,
            latest_successful_save_checkpoint_timestamp_sec=timestamp.seconds_since_epoch,
            save_checkpoint_success_count=state.successful_save_checkpoint_count_current_job,
            productive_train_iterations=productivity.productive_train_iterations,
            productive_train_samples=productivity.productive_train_samples,
            productive_train_iterations_sec=productivity.productive_train_iterations_sec,
            productive_validation_iterations_sec=productivity.productive_validation_iterations_sec,
            training_start_timestamp_sec=loop_start.seconds_since_epoch if loop_start else None,
            productive_train_tflops=productivity.productive_train_tflops)
        if parent is not None:
            self.event(parent, Event.create(EventName.SAVE_CHECKPOINT_SUCCESS, attributes, timestamp=timestamp))

    def on_save_checkpoint_end(self, stop_time: TracingTimestamp | None = None, *, path: Any = None) -> None:
        stop_time = stop_time or TracingTimestamp.now()
        config = self._config.telemetry_config
        name = self._save_span(config)
        span = self._open("on_save_checkpoint_end", name)
        if span is not None and config is not None and config.is_save_checkpoint_enabled:
            timer = self._training_state.multi_iteration_timers[name]
            if timer.is_active and self._guard("on_save_checkpoint_end", lambda: _stop(timer, stop_time)):
                self.event(span, self.create_sync_checkpoint_metrics_event(name))
        self._ours("on_save_checkpoint_end", self._msec(stop_time), path=path)
        if span is not None:
            self.stop(span, stop_time=stop_time)


TrainingRecorder = OneLoggerTrainingRecorder  # one-logger's name, in one-logger's module path


# the one-logger version whose events this recorder produces (telemetrain's own version is in the run store)
ONE_LOGGER_COMPAT_VERSION = "2.3.1"


def _version() -> str:
    return ONE_LOGGER_COMPAT_VERSION


def _stop(timer: MultiWindowTimer, stop_time: TracingTimestamp) -> bool:
    timer.stop(stop_time)
    return True


def _int_if_whole(value: float | None) -> float | int | None:
    return int(value) if value is not None and float(value).is_integer() else value
