"""Training-lifecycle telemetry, nv-one-logger-compatible: its span and event names, callbacks (``callbacks``),
context managers (``context``) and config (``TrainingTelemetryConfig``), on ``TrainingRecorder`` instances, with the
derived metrics it never filled (percentiles, MFU, the phase split) and without ever raising into training.

    from telemetrain import training
    training.configure(training.TrainingTelemetryConfig(global_batch_size_or_fn=64, perf_tag_or_fn="gpt-small"))
    with training.application(), training.training_loop(train_iterations_start=0):
        for batch in loader:
            with training.training_iteration():
                ...

one-logger's whole API is here too, under its module shape (``callbacks``, ``context``, ``config``, ``attributes``,
``spans``, ``events``, ``checkpoint``, ``training_telemetry_provider``, ``training_recorder``, ``exporters``,
``timed_span``...): a one-logger program switches by changing its imports (docs/compat.md lists the mapping).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import callbacks
from .config import ApplicationType, CheckpointStrategy, TrainingTelemetryConfig
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
    iteration_size,
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

# one-logger's surface, imported on first use (a program that does not use it does not load it)
_LAZY = {
    "Attribute": "attributes", "Attributes": "attributes", "CheckpointSaveSpanAttributes": "attributes",
    "OneLoggerInitializationAttributes": "attributes", "SaveCheckpointSuccessEventAttributes": "attributes",
    "SyncCheckpointMetricsUpdateAttributes": "attributes", "TestingMetricsUpdateAttributes": "attributes",
    "TrainingLoopAttributes": "attributes", "TrainingMetricsUpdateAttributes": "attributes",
    "TrainingTelemetryAttributes": "attributes", "ValidationMetricsUpdateAttributes": "attributes",
    "CheckPointStrategy": "checkpoint", "CheckPointType": "checkpoint",
    "DefaultRecorder": "default_recorder", "ExportCustomizationMode": "default_recorder",
    "ExportError": "errors", "InvalidConfigError": "errors", "OneLoggerError": "errors",
    "ErrorEvent": "events", "Event": "events", "StandardTrainingJobEventName": "events",
    "TelemetryDataError": "events",
    "BaseExporter": "exporters", "Exporter": "exporters", "FileExporter": "exporters", "LoggerExporter": "exporters",
    "OTelExporter": "exporters",
    "OneLoggerConfig": "one_logger_config", "OneLoggerErrorHandlingStrategy": "one_logger_config",
    "StandardTrainingJobSpanName": "spans", "timed_span": "timed_span", "TracingTimestamp": "timestamps",
    "OneLoggerTrainingRecorder": "training_recorder",
    "DEFAULT_SPANS_EXPORT_BLACKLIST": "training_telemetry_provider",
    "TrainingTelemetryProvider": "training_telemetry_provider",
}

if TYPE_CHECKING:
    from .attributes import (
        Attribute,
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
    from .checkpoint import CheckPointStrategy, CheckPointType
    from .default_recorder import DefaultRecorder, ExportCustomizationMode
    from .errors import ExportError, InvalidConfigError, OneLoggerError
    from .events import ErrorEvent, Event, StandardTrainingJobEventName, TelemetryDataError
    from .exporters import BaseExporter, Exporter, FileExporter, LoggerExporter, OTelExporter
    from .one_logger_config import OneLoggerConfig, OneLoggerErrorHandlingStrategy
    from .spans import StandardTrainingJobSpanName
    from .timed_span import timed_span
    from .timestamps import TracingTimestamp
    from .training_recorder import OneLoggerTrainingRecorder
    from .training_telemetry_provider import DEFAULT_SPANS_EXPORT_BLACKLIST, TrainingTelemetryProvider


def __getattr__(name: str) -> Any:
    import importlib
    import importlib.util

    module = _LAZY.get(name)
    if module is None:
        # a submodule not imported yet (``training.flops.flops_per_sample``, one-logger's ``training.attributes``):
        # what ``import telemetrain.training.<name>`` would give, without loading every module up front
        if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # (the next access is an ordinary module attribute)
    return value


__all__ = [
    "DEFAULT_SPANS_EXPORT_BLACKLIST",
    "ApplicationType",
    "Attribute",
    "Attributes",
    "Badput",
    "BaseExporter",
    "CheckPointStrategy",
    "CheckPointType",
    "CheckpointSaveSpanAttributes",
    "CheckpointStrategy",
    "DefaultRecorder",
    "ErrorEvent",
    "Event",
    "EventName",
    "ExportCustomizationMode",
    "ExportError",
    "Exporter",
    "FileExporter",
    "GoodputReport",
    "InvalidConfigError",
    "LoggerExporter",
    "OTelExporter",
    "OneLoggerConfig",
    "OneLoggerError",
    "OneLoggerErrorHandlingStrategy",
    "OneLoggerInitializationAttributes",
    "OneLoggerTrainingRecorder",
    "RunGoodput",
    "SaveCheckpointSuccessEventAttributes",
    "SpanName",
    "StandardTrainingJobEventName",
    "StandardTrainingJobSpanName",
    "SyncCheckpointMetricsUpdateAttributes",
    "TelemetryDataError",
    "TestingMetricsUpdateAttributes",
    "TracingTimestamp",
    "TrainingContexts",
    "TrainingLoopAttributes",
    "TrainingMetricsUpdateAttributes",
    "TrainingRecorder",
    "TrainingTelemetryAttributes",
    "TrainingTelemetryConfig",
    "TrainingTelemetryProvider",
    "ValidationMetricsUpdateAttributes",
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
    "iteration_size",
    "model_init",
    "optimizer_init",
    "optimizer_update",
    "set_training_telemetry_config",
    "testing_iteration",
    "testing_loop",
    "timed_span",
    "training_iteration",
    "training_loop",
    "validation_iteration",
    "validation_loop",
    "zero_grad",
]
