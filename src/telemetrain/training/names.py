"""The span and event names of a training job: nv-one-logger's strings, so its dashboards and queries still apply."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

__all__ = ["CHECKPOINT_STEP_KEYS", "EventName", "SpanName", "checkpoint_step"]

# the attributes that name the iteration a checkpoint span saved or loaded: one-logger's, then other writers'
CHECKPOINT_STEP_KEYS = ("current_iteration", "global_step")


class SpanName(str, enum.Enum):
    """one-logger's ``StandardTrainingJobSpanName`` plus ``StandardSpanName.APPLICATION`` (same values; one-logger's
    testing iteration is the upper-case ``"TESTING_SINGLE_ITERATION"``, written here in the lower case of the rest)."""

    APPLICATION = "application"
    TRAINING_LOOP = "training_loop"
    TRAINING_SINGLE_ITERATION = "training_single_iteration"
    VALIDATION_LOOP = "validation_loop"
    VALIDATION_SINGLE_ITERATION = "validation_single_iteration"
    TESTING_LOOP = "testing_loop"
    TESTING_SINGLE_ITERATION = "testing_single_iteration"
    DIST_INIT = "distributed_code_initialization"
    DATA_LOADER_INIT = "data_loader_initialization"
    MODEL_INIT = "model_initialization"
    OPTIMIZER_INIT = "optimizer_initialization"
    CHECKPOINT_LOAD = "checkpoint_load"
    CHECKPOINT_SAVE_SYNC = "checkpoint_save_sync"
    CHECKPOINT_SAVE_ASYNC = "checkpoint_save_async"
    CHECKPOINT_SAVE_FINALIZATION = "checkpoint_save_finalization"
    DATA_LOADING = "data_loading"
    MODEL_FORWARD = "model_forward"
    ZERO_GRAD = "zero_grad"
    MODEL_BACKWARD = "model_backward"
    OPTIMIZER_UPDATE = "optimizer_update"
    HOST_TO_DEVICE = "host_to_device"  # ours: copying the batch to the device (one-logger has no such span)

    def __str__(self) -> str:
        return self.value


class EventName(str, enum.Enum):
    """one-logger's ``StandardTrainingJobEventName`` (same values), plus ``error`` for misuse and failures."""

    ONE_LOGGER_INITIALIZATION = "one_logger_initialization"
    UPDATE_TRAINING_TELEMETRY_CONFIG = "update_training_telemetry_config"
    TRAINING_METRICS_UPDATE = "training_metrics_update"
    VALIDATION_METRICS_UPDATE = "validation_metrics_update"
    TESTING_METRICS_UPDATE = "testing_metrics_update"
    SAVE_CHECKPOINT_SUCCESS = "save_checkpoint_success"
    SYNC_CHECKPOINT_METRICS_UPDATE = "sync_checkpoint_metrics_update"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


# the sub-phases of an iteration, and the name each has in the iteration's split
PHASES = {
    SpanName.DATA_LOADING.value: "dataloader",
    SpanName.HOST_TO_DEVICE.value: "h2d",
    SpanName.MODEL_FORWARD.value: "forward",
    SpanName.MODEL_BACKWARD.value: "backward",
    SpanName.OPTIMIZER_UPDATE.value: "optimizer",
    SpanName.ZERO_GRAD.value: "zero_grad",
}


class S:
    """The span names as plain strings (an Enum member's ``.value`` costs a descriptor call; the hot path avoids it)."""

    APPLICATION = SpanName.APPLICATION.value
    TRAINING_LOOP = SpanName.TRAINING_LOOP.value
    TRAINING_SINGLE_ITERATION = SpanName.TRAINING_SINGLE_ITERATION.value
    VALIDATION_LOOP = SpanName.VALIDATION_LOOP.value
    VALIDATION_SINGLE_ITERATION = SpanName.VALIDATION_SINGLE_ITERATION.value
    TESTING_LOOP = SpanName.TESTING_LOOP.value
    TESTING_SINGLE_ITERATION = SpanName.TESTING_SINGLE_ITERATION.value
    DIST_INIT = SpanName.DIST_INIT.value
    DATA_LOADER_INIT = SpanName.DATA_LOADER_INIT.value
    MODEL_INIT = SpanName.MODEL_INIT.value
    OPTIMIZER_INIT = SpanName.OPTIMIZER_INIT.value
    CHECKPOINT_LOAD = SpanName.CHECKPOINT_LOAD.value
    CHECKPOINT_SAVE_SYNC = SpanName.CHECKPOINT_SAVE_SYNC.value
    CHECKPOINT_SAVE_ASYNC = SpanName.CHECKPOINT_SAVE_ASYNC.value
    CHECKPOINT_SAVE_FINALIZATION = SpanName.CHECKPOINT_SAVE_FINALIZATION.value
    DATA_LOADING = SpanName.DATA_LOADING.value
    MODEL_FORWARD = SpanName.MODEL_FORWARD.value
    ZERO_GRAD = SpanName.ZERO_GRAD.value
    MODEL_BACKWARD = SpanName.MODEL_BACKWARD.value
    OPTIMIZER_UPDATE = SpanName.OPTIMIZER_UPDATE.value
    HOST_TO_DEVICE = SpanName.HOST_TO_DEVICE.value


class E:
    """The event names as plain strings."""

    ONE_LOGGER_INITIALIZATION = EventName.ONE_LOGGER_INITIALIZATION.value
    UPDATE_TRAINING_TELEMETRY_CONFIG = EventName.UPDATE_TRAINING_TELEMETRY_CONFIG.value
    TRAINING_METRICS_UPDATE = EventName.TRAINING_METRICS_UPDATE.value
    VALIDATION_METRICS_UPDATE = EventName.VALIDATION_METRICS_UPDATE.value
    TESTING_METRICS_UPDATE = EventName.TESTING_METRICS_UPDATE.value
    SAVE_CHECKPOINT_SUCCESS = EventName.SAVE_CHECKPOINT_SUCCESS.value
    SYNC_CHECKPOINT_METRICS_UPDATE = EventName.SYNC_CHECKPOINT_METRICS_UPDATE.value
    ERROR = EventName.ERROR.value


def checkpoint_step(attributes: Mapping[str, Any]) -> int | None:
    """The iteration a checkpoint span saved or loaded: the first of ``CHECKPOINT_STEP_KEYS`` that holds an int (not
    a bool); None when none does."""
    for key in CHECKPOINT_STEP_KEYS:
        value = attributes.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
