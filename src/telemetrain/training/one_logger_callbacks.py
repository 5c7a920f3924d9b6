"""``OneLoggerCallbacks``: one-logger's callbacks (``*_time_msec`` arguments, milliseconds since the epoch; a falsy
one means now) on a configured ``TrainingTelemetryProvider``'s recorder, what its ``callbacks`` property and the
module-level ``callbacks`` give; on a rank where one-logger is disabled they drive telemetrain's recorder only. Also
the once-only rule of the training config both share (``_set_training_config``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..telemetry import Telemetry
from .config import TrainingTelemetryConfig, evaluate
from .errors import InvalidConfigError
from .names import SpanName
from .one_logger_config import OneLoggerConfig
from .one_logger_provider import OneLoggerProvider
from .spans import Span
from .timestamps import TracingTimestamp
from .training_recorder import OneLoggerTrainingRecorder

__all__ = ["OneLoggerCallbacks"]


def _set_training_config(provider: OneLoggerProvider, training_telemetry_config: TrainingTelemetryConfig,
                         misuse: Callable[[str, str], None]) -> None:
    """Set the training config once (one-logger's rule); the same object again refreshes its lazy values in
    telemetrain's recorder (an integration re-reading a config whose functions changed)."""
    config: OneLoggerConfig = provider.config
    recorder: OneLoggerTrainingRecorder = provider.recorder
    if config.telemetry_config is training_telemetry_config:
        recorder._set_telemetrain_config(training_telemetry_config)
        return
    if config.telemetry_config is not None:
        misuse("set_training_telemetry_config", "Training telemetry config has already been set: the new one is "
                                                "ignored")
        return
    config.telemetry_config = training_telemetry_config
    recorder._set_telemetrain_config(training_telemetry_config)
    recorder._update_application_span_with_training_telemetry_config(
        training_telemetry_config=training_telemetry_config)


def _timestamp(msec: float | None, arg: str) -> TracingTimestamp:
    """A ``*_time_msec`` argument (ms since the epoch; falsy: now) as a timestamp."""
    if not msec:
        return TracingTimestamp.now()
    if isinstance(msec, bool) or not isinstance(msec, (int, float)):
        raise TypeError(f"{arg} must be milliseconds since the epoch, got {type(msec).__name__}")
    try:
        return TracingTimestamp.for_timestamp(timestamp_sec=msec / 1000.0)
    except InvalidConfigError as exc:
        raise InvalidConfigError(f"{arg}: {exc}") from None


class OneLoggerCallbacks:
    """one-logger's callbacks (``*_time_msec`` arguments; a falsy one means now) on a configured provider's recorder.
    On a rank where one-logger is disabled (``enable_for_current_rank=False`` or ``force_disable_logging``) they
    return ``None`` and export nothing, but telemetrain's recorder still records the rank."""

    def __init__(self, provider: OneLoggerProvider) -> None:
        self._provider = provider

    @property
    def recorder(self) -> OneLoggerTrainingRecorder:
        recorder: OneLoggerTrainingRecorder = self._provider._recorder
        return recorder

    def _enabled(self) -> bool:
        return self._provider.one_logger_enabled

    # -- what an integration written for telemetrain's recorder uses (TelemetrainCallback) --------------------------

    @property
    def telemetry(self) -> Telemetry:
        return self.recorder.telemetry

    @property
    def tracer(self) -> Any:
        """telemetrain's tracer (sub-phase spans: run store only; one-logger has no callbacks for them)."""
        return self.recorder.training.tracer

    @property
    def config(self) -> TrainingTelemetryConfig | None:
        config: TrainingTelemetryConfig | None = self._provider.config.telemetry_config
        return config

    def set_training_telemetry_config(self, config: TrainingTelemetryConfig) -> None:
        """For integrations (a Lightning callback derives one per ``fit``): the first sets one-logger's training
        config (set once, its rule); a later one refreshes telemetrain's recorder only, the one-logger config stays."""
        if not isinstance(config, TrainingTelemetryConfig):
            raise TypeError(f"config must be a TrainingTelemetryConfig, got {type(config).__name__}")
        recorder = self.recorder
        if self._provider.config.telemetry_config is None:
            _set_training_config(self._provider, config, recorder._misuse)
        else:
            recorder._set_telemetrain_config(config)

    def _simple(self, method: str, msec: float | None, arg: str, **kwargs: Any) -> Any:
        ts = _timestamp(msec, arg)
        recorder = self.recorder
        if not self._enabled():
            recorder._ours(_OURS.get(method, method), recorder._msec(ts) if msec else None, **kwargs)
            return None
        return getattr(recorder, method)(ts, **kwargs)

    def on_app_start(self, start_time_msec: float | None = None) -> Span | None:
        return self._simple("on_app_start", start_time_msec, "start_time_msec")  # type: ignore[no-any-return]

    def on_app_end(self, finish_time_msec: float | None = None) -> None:
        self._simple("on_app_end", finish_time_msec, "finish_time_msec")

    def on_distributed_init_start(self, start_time_msec: float | None = None) -> Span | None:
        return self._simple("on_distributed_init_start", start_time_msec, "start_time_msec")  # type: ignore[no-any-return]

    def on_distributed_init_end(self, finish_time_msec: float | None = None) -> None:
        self._simple("on_distributed_init_end", finish_time_msec, "finish_time_msec")

    def on_model_init_start(self, start_time_msec: float | None = None) -> Span | None:
        return self._simple("on_model_init_start", start_time_msec, "start_time_msec")  # type: ignore[no-any-return]

    def on_model_init_end(self, finish_time_msec: float | None = None) -> None:
        self._simple("on_model_init_end", finish_time_msec, "finish_time_msec")

    def on_dataloader_init_start(self, start_time_msec: float | None = None) -> Span | None:
        return self._simple("on_dataloader_init_start", start_time_msec, "start_time_msec")  # type: ignore[no-any-return]

    def on_dataloader_init_end(self, finish_time_msec: float | None = None) -> None:
        self._simple("on_dataloader_init_end", finish_time_msec, "finish_time_msec")

    def on_optimizer_init_start(self, start_time_msec: float | None = None) -> Span | None:
        return self._simple("on_optimizer_init_start", start_time_msec, "start_time_msec")  # type: ignore[no-any-return]

    def on_optimizer_init_end(self, finish_time_msec: float | None = None) -> None:
        self._simple("on_optimizer_init_end", finish_time_msec, "finish_time_msec")

    def on_load_checkpoint_start(self, start_time_msec: float | None = None) -> Span | None:
        return self._simple("on_load_checkpoint_start", start_time_msec, "start_time_msec")  # type: ignore[no-any-return]

    def on_load_checkpoint_end(self, finish_time_msec: float | None = None, *, path: Any = None) -> None:
        self._simple("on_load_checkpoint_end", finish_time_msec, "finish_time_msec", path=path)

    def on_train_start(self, train_iterations_start: int | None = None, train_samples_start: int | None = None,
                       train_iterations_target_or_fn: int | Callable[[], int] | None = None,
                       train_samples_target_or_fn: int | Callable[[], int] | None = None,
                       start_time_msec: float | None = None) -> Span | None:
        if not self._enabled():
            if train_iterations_start is not None:
                self.recorder._ours("on_train_start", train_iterations_start, train_samples_start,
                                    train_iterations_target_or_fn, train_samples_target_or_fn, start_time_msec)
            return None
        if train_iterations_start is None:
            raise TypeError("on_train_start: train_iterations_start is required")
        ts = _timestamp(start_time_msec, "start_time_msec")
        recorder = self.recorder
        config = self._provider.config.telemetry_config
        gbs = recorder._guard("on_train_start", lambda: config.global_batch_size) if config is not None else None
        samples_start = train_samples_start if train_samples_start is not None \
            else train_iterations_start * (gbs or 0)
        iterations_target = recorder._guard("on_train_start", lambda: evaluate(train_iterations_target_or_fn)
                                            if train_iterations_target_or_fn is not None
                                            else (config.train_iterations_target if config else None))
        samples_target = recorder._guard("on_train_start", lambda: evaluate(train_samples_target_or_fn)
                                         if train_samples_target_or_fn is not None
                                         else (config.train_samples_target if config else None))
        seq = recorder._guard("on_train_start", lambda: config.seq_length) if config is not None else None
        tokens_target = seq * samples_target if seq and samples_target else None
        return recorder.on_training_loop_start(
            train_iterations_start=train_iterations_start, train_samples_start=samples_start,
            train_iterations_target=iterations_target, train_samples_target=samples_target,
            train_tokens_target=tokens_target, start_time=ts)

    def on_train_end(self, finish_time_msec: float | None = None) -> None:
        self._simple("on_training_loop_end", finish_time_msec, "finish_time_msec")

    def on_training_single_iteration_start(self, start_time_msec: float | None = None) -> Span | None:
        return self._simple("on_training_single_iteration_start", start_time_msec,  # type: ignore[no-any-return]
                            "start_time_msec")

    def on_training_single_iteration_end(self, finish_time_msec: float | None = None) -> None:
        self._simple("on_training_single_iteration_end", finish_time_msec, "finish_time_msec")

    def on_validation_start(self, start_time_msec: float | None = None) -> Span | None:
        return self._simple("on_validation_start", start_time_msec, "start_time_msec")  # type: ignore[no-any-return]

    def on_validation_end(self, finish_time_msec: float | None = None) -> None:
        self._simple("on_validation_end", finish_time_msec, "finish_time_msec")

    def on_validation_single_iteration_start(self, start_time_msec: float | None = None) -> Span | None:
        return self._simple("on_validation_single_iteration_start", start_time_msec,  # type: ignore[no-any-return]
                            "start_time_msec")

    def on_validation_single_iteration_end(self, finish_time_msec: float | None = None) -> None:
        self._simple("on_validation_single_iteration_end", finish_time_msec, "finish_time_msec")

    def on_testing_start(self, start_time_msec: float | None = None) -> Span | None:
        return self._simple("on_testing_start", start_time_msec, "start_time_msec")  # type: ignore[no-any-return]

    def on_testing_end(self, finish_time_msec: float | None = None) -> None:
        self._simple("on_testing_end", finish_time_msec, "finish_time_msec")

    def on_testing_single_iteration_start(self, start_time_msec: float | None = None) -> Span | None:
        """Ours (one-logger has the span name but no callback): a ``testing_single_iteration`` span."""
        ts = _timestamp(start_time_msec, "start_time_msec")
        recorder = self.recorder
        span = recorder.start(SpanName.TESTING_SINGLE_ITERATION, start_time=ts) if self._enabled() else None
        ours = recorder._ours("on_testing_single_iteration_start", recorder._msec(ts) if start_time_msec else None)
        if span is not None:
            span._ours = ours
        return span

    def on_testing_single_iteration_end(self, finish_time_msec: float | None = None) -> None:
        ts = _timestamp(finish_time_msec, "finish_time_msec")
        recorder = self.recorder
        recorder._ours("on_testing_single_iteration_end", recorder._msec(ts) if finish_time_msec else None)
        span = recorder._get_active_span(SpanName.TESTING_SINGLE_ITERATION) if self._enabled() else None
        if span is not None:
            span._ours = None  # (telemetrain's recorder ended its own span)
            recorder.stop(span, stop_time=ts)

    def on_save_checkpoint_start(self, global_step: int | None = None, start_time_msec: float | None = None
                                 ) -> Span | None:
        if not self._enabled():
            if global_step is not None:
                self.recorder._ours("on_save_checkpoint_start", global_step, start_time_msec)
            return None
        if global_step is None:
            raise TypeError("on_save_checkpoint_start: global_step is required")
        return self.recorder.on_save_checkpoint_start(current_iteration=global_step,
                                                      start_time=_timestamp(start_time_msec, "start_time_msec"))

    def on_save_checkpoint_success(self, global_step: int | None = None, time_msec: float | None = None, *,
                                   path: Any = None) -> None:
        if not self._enabled():
            if global_step is not None:
                self.recorder._ours("on_save_checkpoint_success", global_step, time_msec, path=path)
            return
        if global_step is None:
            raise TypeError("on_save_checkpoint_success: global_step is required")
        self.recorder.on_save_checkpoint_success(current_iteration=global_step,
                                                 timestamp=_timestamp(time_msec, "time_msec"), path=path)

    def on_save_checkpoint_end(self, finish_time_msec: float | None = None, *, path: Any = None) -> None:
        self._simple("on_save_checkpoint_end", finish_time_msec, "finish_time_msec", path=path)


# the recorder's one-logger method names whose telemetrain counterpart is named differently
_OURS = {"on_training_loop_end": "on_train_end"}
