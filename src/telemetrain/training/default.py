"""The recorder the module-level callbacks and context managers use: one per ``Telemetry`` (the default instance's
unless told otherwise), created on first use."""

from __future__ import annotations

from ..telemetry import Telemetry, get_telemetry
from .config import TrainingTelemetryConfig
from .recorder import TrainingRecorder

__all__ = ["configure", "get_recorder", "set_training_telemetry_config"]

_EXTENSION = "training"


def get_recorder(telemetry: Telemetry | None = None) -> TrainingRecorder:
    """The ``TrainingRecorder`` of ``telemetry`` (default: the default instance)."""
    t = telemetry if telemetry is not None else get_telemetry()
    found: TrainingRecorder = t.extension(_EXTENSION, lambda t: TrainingRecorder(telemetry=t))
    return found


def configure(config: TrainingTelemetryConfig | None = None, *, telemetry: Telemetry | None = None) -> TrainingRecorder:
    """The default recorder, with ``config`` set (if given)."""
    recorder = get_recorder(telemetry)
    if config is not None:
        recorder.set_training_telemetry_config(config)
    return recorder


def set_training_telemetry_config(config: TrainingTelemetryConfig) -> None:
    """one-logger's late config: set it on the default recorder (emits ``update_training_telemetry_config``)."""
    get_recorder().set_training_telemetry_config(config)
