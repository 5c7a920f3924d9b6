"""one-logger's callbacks (``nv_one_logger.training_telemetry.api.callbacks``), as module-level functions with its
signatures. Once ``TrainingTelemetryProvider.instance().configure_provider()`` has run they drive its one-logger
recorder (one-logger's spans to its exporters, and telemetrain's recorder for the run store) and return one-logger
``Span``s -- ``None`` on a rank where one-logger is disabled; otherwise they drive the default ``TrainingRecorder``
(``get_recorder()``) and return telemetrain spans. Each ``*_time_msec`` is milliseconds since the epoch; a falsy value
means now. None of them ever raises into training for a telemetry reason (misuse becomes an error event); a wrong
argument type at the call site is a ``TypeError``/``ValueError``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..default_instance import _default
from .default import _EXTENSION, get_recorder
from .one_logger_provider import OneLoggerProvider
from .recorder import TrainingRecorder
from .singleton import SingletonMeta

_registry = SingletonMeta._instances  # empty unless a one-logger provider exists: one truth test on the hot path


def _one_logger() -> Any:
    """The configured one-logger provider's callbacks, or None."""
    provider = _registry.get(OneLoggerProvider)
    return None if provider is None else provider._callbacks

__all__ = [
    "on_app_end",
    "on_app_start",
    "on_dataloader_init_end",
    "on_dataloader_init_start",
    "on_distributed_init_end",
    "on_distributed_init_start",
    "on_load_checkpoint_end",
    "on_load_checkpoint_start",
    "on_model_init_end",
    "on_model_init_start",
    "on_optimizer_init_end",
    "on_optimizer_init_start",
    "on_save_checkpoint_end",
    "on_save_checkpoint_start",
    "on_save_checkpoint_success",
    "on_testing_end",
    "on_testing_single_iteration_end",
    "on_testing_single_iteration_start",
    "on_testing_start",
    "on_train_end",
    "on_train_start",
    "on_training_single_iteration_end",
    "on_training_single_iteration_start",
    "on_validation_end",
    "on_validation_single_iteration_end",
    "on_validation_single_iteration_start",
    "on_validation_start",
]


def on_app_start(start_time_msec: float | None = None) -> Any:
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_app_start(start_time_msec)
    return get_recorder().on_app_start(start_time_msec)


def on_app_end(finish_time_msec: float | None = None) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_app_end(finish_time_msec)
        return
    get_recorder().on_app_end(finish_time_msec)


def on_distributed_init_start(start_time_msec: float | None = None) -> Any:
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_distributed_init_start(start_time_msec)
    return get_recorder().on_distributed_init_start(start_time_msec)


def on_distributed_init_end(finish_time_msec: float | None = None) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_distributed_init_end(finish_time_msec)
        return
    get_recorder().on_distributed_init_end(finish_time_msec)


def on_model_init_start(start_time_msec: float | None = None) -> Any:
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_model_init_start(start_time_msec)
    return get_recorder().on_model_init_start(start_time_msec)


def on_model_init_end(finish_time_msec: float | None = None) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_model_init_end(finish_time_msec)
        return
    get_recorder().on_model_init_end(finish_time_msec)


def on_dataloader_init_start(start_time_msec: float | None = None) -> Any:
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_dataloader_init_start(start_time_msec)
    return get_recorder().on_dataloader_init_start(start_time_msec)


def on_dataloader_init_end(finish_time_msec: float | None = None) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_dataloader_init_end(finish_time_msec)
        return
    get_recorder().on_dataloader_init_end(finish_time_msec)


def on_optimizer_init_start(start_time_msec: float | None = None) -> Any:
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_optimizer_init_start(start_time_msec)
    return get_recorder().on_optimizer_init_start(start_time_msec)


def on_optimizer_init_end(finish_time_msec: float | None = None) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_optimizer_init_end(finish_time_msec)
        return
    get_recorder().on_optimizer_init_end(finish_time_msec)


def on_load_checkpoint_start(start_time_msec: float | None = None) -> Any:
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_load_checkpoint_start(start_time_msec)
    return get_recorder().on_load_checkpoint_start(start_time_msec)


def on_load_checkpoint_end(
    finish_time_msec: float | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_load_checkpoint_end(finish_time_msec, path=path)
        return
    get_recorder().on_load_checkpoint_end(finish_time_msec, path=path)


def on_train_start(
    train_iterations_start: int | None = None,
    train_samples_start: int | None = None,
    train_iterations_target_or_fn: int | Callable[[], int] | None = None,
    train_samples_target_or_fn: int | Callable[[], int] | None = None,
    start_time_msec: float | None = None,
) -> Any:
    """``train_iterations_start`` is required (its default lets a rank where one-logger is disabled call it bare,
    as one-logger allows)."""
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_train_start(train_iterations_start, train_samples_start,
                                            train_iterations_target_or_fn, train_samples_target_or_fn, start_time_msec)
    return get_recorder().on_train_start(train_iterations_start,  # type: ignore[arg-type]
                                         train_samples_start, train_iterations_target_or_fn,
                                         train_samples_target_or_fn, start_time_msec)


def on_train_end(finish_time_msec: float | None = None) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_train_end(finish_time_msec)
        return
    get_recorder().on_train_end(finish_time_msec)


def on_training_single_iteration_start(start_time_msec: float | None = None) -> Any:
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_training_single_iteration_start(start_time_msec)
    t = _default.telemetry  # get_recorder(), inlined for the found case: every step pays it, twice
    recorder: TrainingRecorder | None = t.extensions.get(_EXTENSION) if t is not None else None
    return (recorder or get_recorder()).on_training_single_iteration_start(start_time_msec)


def on_training_single_iteration_end(finish_time_msec: float | None = None, *, samples: int | None = None,
                                     tokens: int | None = None) -> None:
    """``samples``/``tokens``: what this step processed, when not the global batch size (and x seq_length):
    ``TrainingRecorder.iteration_size``. (A one-logger provider's exporters keep one-logger's count.)"""
    if _registry and (ol := _one_logger()) is not None:
        if samples is not None or tokens is not None:
            ol.recorder.training.iteration_size(samples, tokens)
        ol.on_training_single_iteration_end(finish_time_msec)
        return
    t = _default.telemetry  # (get_recorder(), inlined)
    recorder: TrainingRecorder | None = t.extensions.get(_EXTENSION) if t is not None else None
    (recorder or get_recorder()).on_training_single_iteration_end(finish_time_msec, samples=samples, tokens=tokens)


def on_validation_start(start_time_msec: float | None = None) -> Any:
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_validation_start(start_time_msec)
    return get_recorder().on_validation_start(start_time_msec)


def on_validation_end(finish_time_msec: float | None = None) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_validation_end(finish_time_msec)
        return
    get_recorder().on_validation_end(finish_time_msec)


def on_validation_single_iteration_start(start_time_msec: float | None = None) -> Any:
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_validation_single_iteration_start(start_time_msec)
    return get_recorder().on_validation_single_iteration_start(start_time_msec)


def on_validation_single_iteration_end(finish_time_msec: float | None = None) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_validation_single_iteration_end(finish_time_msec)
        return
    get_recorder().on_validation_single_iteration_end(finish_time_msec)


def on_testing_start(start_time_msec: float | None = None) -> Any:
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_testing_start(start_time_msec)
    return get_recorder().on_testing_start(start_time_msec)


def on_testing_end(finish_time_msec: float | None = None) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_testing_end(finish_time_msec)
        return
    get_recorder().on_testing_end(finish_time_msec)


def on_testing_single_iteration_start(start_time_msec: float | None = None) -> Any:
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_testing_single_iteration_start(start_time_msec)
    return get_recorder().on_testing_single_iteration_start(start_time_msec)


def on_testing_single_iteration_end(finish_time_msec: float | None = None) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_testing_single_iteration_end(finish_time_msec)
        return
    get_recorder().on_testing_single_iteration_end(finish_time_msec)


def on_save_checkpoint_start(global_step: int | None = None, start_time_msec: float | None = None) -> Any:
    """``global_step`` is required (see ``on_train_start``)."""
    if _registry and (ol := _one_logger()) is not None:
        return ol.on_save_checkpoint_start(global_step, start_time_msec)
    return get_recorder().on_save_checkpoint_start(global_step, start_time_msec)  # type: ignore[arg-type]


def on_save_checkpoint_success(
    global_step: int | None = None, time_msec: float | None = None, *, path: str | os.PathLike[str] | None = None
) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_save_checkpoint_success(global_step, time_msec, path=path)
        return
    if global_step is None:
        raise TypeError("on_save_checkpoint_success: global_step is required")
    get_recorder().on_save_checkpoint_success(global_step, time_msec, path=path)


def on_save_checkpoint_end(
    finish_time_msec: float | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
) -> None:
    if _registry and (ol := _one_logger()) is not None:
        ol.on_save_checkpoint_end(finish_time_msec, path=path)
        return
    get_recorder().on_save_checkpoint_end(finish_time_msec, path=path)
