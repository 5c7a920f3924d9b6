"""The recorder the module-level callbacks and context managers use: one per ``Telemetry`` (the default instance's
unless told otherwise), created on first use."""

from __future__ import annotations

from typing import Any

from ..telemetry import Telemetry, get_telemetry
from .config import TrainingTelemetryConfig
from .one_logger_provider import OneLoggerProvider
from .recorder import TrainingRecorder
from .singleton import SingletonMeta

__all__ = ["check_recorder_target", "configure", "get_recorder", "get_target", "set_training_telemetry_config"]

_EXTENSION = "training"


def get_recorder(telemetry: Telemetry | None = None) -> TrainingRecorder:
    """The ``TrainingRecorder`` of ``telemetry`` (default: the default instance). Called by every module-level
    context manager and callback, so the found case is one dict lookup."""
    t = telemetry if telemetry is not None else get_telemetry()
    found: TrainingRecorder | None = t.extensions.get(_EXTENSION)
    if found is None:
        found = t.extension(_EXTENSION, _new_recorder)
    return found


_registry = SingletonMeta._instances  # empty unless a one-logger provider exists


def get_target() -> Any:
    """What the module-level context managers drive: the configured one-logger provider's callbacks, else the default
    recorder (``get_recorder()``, inlined: ``training_iteration()`` pays this every step)."""
    if _registry:
        provider = _registry.get(OneLoggerProvider)
        if provider is not None and provider._callbacks is not None:
            return provider._callbacks
    t = get_telemetry()
    found = t.extensions.get(_EXTENSION)
    if found is None:
        found = t.extension(_EXTENSION, _new_recorder)
    return found


def check_recorder_target(recorder: TrainingRecorder | None, telemetry: Telemetry | None) -> None:
    """An integration's ``recorder=``/``telemetry=`` arguments: each of its type, and not two different targets."""
    from .training_telemetry_provider import OneLoggerCallbacks

    if recorder is not None and not isinstance(recorder, (TrainingRecorder, OneLoggerCallbacks)):
        raise TypeError(f"recorder must be a TrainingRecorder (or a one-logger provider's callbacks), got "
                        f"{type(recorder).__name__}")
    if telemetry is not None and not isinstance(telemetry, Telemetry):
        raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
    if recorder is not None and telemetry is not None and recorder.telemetry is not telemetry:
        raise ValueError("recorder and telemetry disagree: the recorder writes to another Telemetry")


def _new_recorder(telemetry: Telemetry) -> TrainingRecorder:
    return TrainingRecorder(telemetry=telemetry)


def configure(config: TrainingTelemetryConfig | None = None, *, telemetry: Telemetry | None = None) -> TrainingRecorder:
    """The default recorder, with ``config`` set (if given)."""
    recorder = get_recorder(telemetry)
    if config is not None:
        recorder.set_training_telemetry_config(config)
    return recorder


def set_training_telemetry_config(config: TrainingTelemetryConfig) -> None:
    """one-logger's late config: set it on the configured one-logger provider if there is one, else on the default
    recorder (emits ``update_training_telemetry_config``)."""
    from .one_logger_provider import OneLoggerProvider
    from .singleton import SingletonMeta
    from .training_telemetry_provider import TrainingTelemetryProvider

    if SingletonMeta._instances.get(OneLoggerProvider) is not None and OneLoggerProvider.instance().one_logger_ready:
        TrainingTelemetryProvider.instance().set_training_telemetry_config(config)
        return
    get_recorder().set_training_telemetry_config(config)
