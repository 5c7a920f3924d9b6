"""Training-lifecycle telemetry, nv-one-logger-compatible: its span and event names, callbacks (``callbacks``),
context managers (``context``) and config (``TrainingTelemetryConfig``), on ``TrainingRecorder`` instances, with the
derived metrics it never filled (percentiles, MFU, the phase split) and without ever raising into training.

    from telemetrain import training
    training.configure(training.TrainingTelemetryConfig(global_batch_size_or_fn=64, perf_tag_or_fn="gpt-small"))
    with training.application(), training.training_loop(train_iterations_start=0):
        for batch in loader:
            with training.training_iteration():
                ...
"""

from __future__ import annotations

from . import callbacks
from .config import CheckpointStrategy, TrainingTelemetryConfig
from .context import (
    TrainingContexts,
    application,
    backward,
    checkpoint_load,
    checkpoint_save,
    data_loading,
    dataloader_init,
    distributed_init,
    forward,
    model_init,
    optimizer_init,
    optimizer_update,
    testing_iteration,
    testing_loop,
    training_iteration,
    training_loop,
    validation_iteration,
    validation_loop,
    zero_grad,
)
from .default import configure, get_recorder, set_training_telemetry_config
from .goodput import Badput, GoodputReport, RunGoodput, goodput, goodput_by_rank
from .names import EventName, SpanName
from .recorder import TrainingRecorder

__all__ = [
    "Badput",
    "CheckpointStrategy",
    "EventName",
    "GoodputReport",
    "RunGoodput",
    "SpanName",
    "TrainingContexts",
    "TrainingRecorder",
    "TrainingTelemetryConfig",
    "application",
    "backward",
    "callbacks",
    "checkpoint_load",
    "checkpoint_save",
    "configure",
    "data_loading",
    "dataloader_init",
    "distributed_init",
    "forward",
    "get_recorder",
    "goodput",
    "goodput_by_rank",
    "model_init",
    "optimizer_init",
    "optimizer_update",
    "set_training_telemetry_config",
    "testing_iteration",
    "testing_loop",
    "training_iteration",
    "training_loop",
    "validation_iteration",
    "validation_loop",
    "zero_grad",
]
