"""The checkpoint callbacks of ``OneLoggerTrainingRecorder`` (``training_recorder``), one-logger's rules: the
checkpoint save span (sync or async, by the config's strategy), the productive work each save holds until it succeeds
(``_ProductivityState``), the ``save_checkpoint_success`` event with the productive iterations, samples, seconds and
TFLOPs of that save, and the sync save's ``sync_checkpoint_metrics_update`` (its total, min and max time). Each
callback also drives telemetrain's recorder (``_ours``). Misuse never raises (``default_recorder``)."""

from __future__ import annotations

from typing import Any

from .attributes import (
    CheckpointSaveSpanAttributes,
    SaveCheckpointSuccessEventAttributes,
    SyncCheckpointMetricsUpdateAttributes,
)
from .checkpoint import CheckPointStrategy
from .config import TrainingTelemetryConfig
from .events import Event
from .names import EventName, SpanName
from .one_logger_recorder_base import OneLoggerRecorderBase, S, _ProductivityState, _stop
from .spans import Span
from .timestamps import TracingTimestamp

__all__ = ["OneLoggerCheckpointCallbacks"]


class OneLoggerCheckpointCallbacks(OneLoggerRecorderBase):
    """The checkpoint save callbacks (``on_save_checkpoint_start/success/end``); ``OneLoggerTrainingRecorder`` is
    one (the load callbacks are with the other lifecycle spans there)."""

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
