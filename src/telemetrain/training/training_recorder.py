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
sample targets. The checkpoint save callbacks are in ``one_logger_checkpoints``.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from ..telemetry import Telemetry
from .attributes import (
    OneLoggerInitializationAttributes,
    TestingMetricsUpdateAttributes,
    TrainingLoopAttributes,
    TrainingMetricsUpdateAttributes,
    TrainingTelemetryAttributes,
    ValidationMetricsUpdateAttributes,
)
from .checkpoint import CheckPointStrategy
from .config import TrainingTelemetryConfig
from .default_recorder import ExportCustomizationMode
from .events import Event
from .names import EventName
from .one_logger_checkpoints import OneLoggerCheckpointCallbacks
from .one_logger_config import OneLoggerConfig
from .one_logger_recorder_base import S, _stop, _TrainingState
from .one_logger_recorder_base import _ProductivityState as _ProductivityState  # (one-logger's tests import it)
from .recorder import TrainingRecorder as TelemetrainRecorder
from .spans import Span
from .spans import SpanName as AnySpanName
from .timers import MultiWindowTimer
from .timestamps import TracingTimestamp

__all__ = ["OneLoggerTrainingRecorder", "TrainingRecorder"]


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


class OneLoggerTrainingRecorder(OneLoggerCheckpointCallbacks):
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
        self._drives_lifecycle = drives_lifecycle
        if drives_lifecycle:  # its one_logger_initialization in the run store carries this config's values, as the
            training.app_defaults = {  # exported one does, also before a training config is set
                "session_tag_or_fn": config.session_tag_or_fn, "world_size_or_fn": config.world_size_or_fn,
                "is_baseline_run_or_fn": config.is_baseline_run_or_fn, "custom_metadata": config.custom_metadata}
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


    def close(self) -> None:
        """Stop what is open and close the exporters; closed before ``on_app_end`` (a reset, the Telemetry closing),
        it ends telemetrain's application span too, so the two recorders agree."""
        if not self._closed and self._get_active_span(S.APPLICATION) is not None:
            self._ours("on_app_end")
        super().close()
        self.training.warn_misuse = True  # telemetrain's recorder is on its own again
        if self._drives_lifecycle:
            self.training.app_defaults = {}
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


TrainingRecorder = OneLoggerTrainingRecorder  # one-logger's name, in one-logger's module path


# the one-logger version whose events this recorder produces (telemetrain's own version is in the run store)
ONE_LOGGER_COMPAT_VERSION = "2.3.1"


def _version() -> str:
    return ONE_LOGGER_COMPAT_VERSION


def _int_if_whole(value: float | None) -> float | int | None:
    return int(value) if value is not None and float(value).is_integer() else value
