"""Span and event attributes, one-logger's model (``nv_one_logger.core.attributes`` and
``nv_one_logger.training_telemetry.api.attributes``): ``Attribute``, ``Attributes`` and the nine typed attribute sets
of the training spans and events, each with its ``create(...)`` factory and typed getters.

A value is a primitive (``str``, ``bool``, ``int``, ``float``) or a list of one primitive type (``None`` is kept, as
one-logger keeps it); anything else is a ``TypeError`` naming the attribute, at the call that adds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Generic, TypeVar, Union, overload

from .checkpoint import CheckPointStrategy
from .errors import OneLoggerError

__all__ = [
    "Attribute",
    "AttributeValue",
    "Attributes",
    "CheckpointSaveSpanAttributes",
    "OneLoggerInitializationAttributes",
    "SaveCheckpointSuccessEventAttributes",
    "SyncCheckpointMetricsUpdateAttributes",
    "TestingMetricsUpdateAttributes",
    "TrainingLoopAttributes",
    "TrainingMetricsUpdateAttributes",
    "TrainingTelemetryAttributes",
    "ValidationMetricsUpdateAttributes",
]

_Primitive = Union[str, bool, int, float]  # noqa: UP007 - a runtime alias, as one-logger's
AttributeValue = Union[_Primitive, list[_Primitive]]  # noqa: UP007
_PRIMITIVES = (str, bool, int, float)


@dataclasses.dataclass
class Attribute:
    """One named value of a span or an event."""

    name: str
    value: AttributeValue

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"attribute name must be a str, got {type(self.name).__name__}")
        value = self.value
        if isinstance(value, list):
            if value and not all(type(item) is type(value[0]) and isinstance(item, _PRIMITIVES) for item in value):
                raise TypeError(f"attribute {self.name!r}: a list value must hold one primitive type (str, bool, "
                                f"int or float), got {value!r}")
        elif value is not None and not isinstance(value, _PRIMITIVES):
            raise TypeError(f"attribute {self.name!r} must be a str, bool, int, float or a list of one of them, got "
                            f"{type(value).__name__}")


class Attributes(dict[str, Attribute]):
    """The attributes of one span or event, by name. Subclasses (the typed sets below) keep their type through
    ``merge`` and ``add``."""

    def __init__(self, dictionary: Mapping[str, AttributeValue] | None = None) -> None:
        super().__init__()
        if dictionary:
            if not isinstance(dictionary, Mapping):
                raise TypeError(f"attributes must be a mapping of name to value, got {type(dictionary).__name__}")
            for name, value in dictionary.items():
                self.add(name, value.value if isinstance(value, Attribute) else value)

    def add(self, name: str, value: AttributeValue) -> Attributes:
        self.add_attribute(Attribute(name, value))
        return self

    def add_attribute(self, attribute: Attribute) -> Attribute:
        if not isinstance(attribute, Attribute):
            raise TypeError(f"attribute must be an Attribute, got {type(attribute).__name__}")
        self[attribute.name] = attribute
        return attribute

    def add_attributes(self, other_attributes: Mapping[str, Any]) -> None:
        """Add every attribute of another set (or a plain ``{name: value}`` mapping)."""
        for name, attribute in other_attributes.items():
            if isinstance(attribute, Attribute):
                self.add_attribute(attribute)
            else:
                self.add(name, attribute)

    def to_json(self) -> dict[str, Any]:
        return {attribute.name: attribute.value for attribute in self.values()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Attributes:
        attributes = cls()
        for name, value in (data or {}).items():
            attributes.add(name, value)
        return attributes

    @classmethod
    def merge(cls, attributes: Attributes | None = None, other: Attributes | None = None) -> Attributes:
        """A new set of this class with both sets' attributes (``other`` wins on a shared name)."""
        merged = cls()
        for source in (attributes, other):
            if source:
                for attribute in source.values():
                    merged.add_attribute(attribute)
        return merged

    def _typed(self, name: str, types: tuple[type, ...], kind: str) -> Any:
        attribute = self.get(name)
        if attribute is None:
            return None
        value = attribute.value
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise OneLoggerError(f"Attribute {name} must be {kind}. Got {value!r}.")
        return value

    def get_bool_value(self, attribute_name: str) -> bool | None:
        value: bool | None = self._typed(attribute_name, (bool,), "a boolean")
        return value

    def get_int_value(self, attribute_name: str) -> int | None:
        value: int | None = self._typed(attribute_name, (int,), "an integer")
        return value

    def get_float_value(self, attribute_name: str) -> float | None:
        value: float | None = self._typed(attribute_name, (int, float), "a float")
        return value

    def get_str_value(self, attribute_name: str) -> str | None:
        value: str | None = self._typed(attribute_name, (str,), "a string")
        return value


T = TypeVar("T")


class _Field(Generic[T]):
    """A typed getter of one attribute (``attrs.current_iteration``); a required one raises if it is missing."""

    def __init__(self, getter: str, required: bool = False) -> None:
        self.getter, self.required, self.name = getter, required, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> _Field[T]: ...

    @overload
    def __get__(self, obj: Attributes, owner: type) -> T: ...

    def __get__(self, obj: Attributes | None, owner: type) -> Any:
        if obj is None:
            return self
        value = getattr(obj, self.getter)(self.name) if self.getter else _raw(obj, self.name)
        if value is None and self.required:
            raise OneLoggerError(f"{self.name} is required.")
        return value


def _raw(attributes: Attributes, name: str) -> Any:
    attribute = attributes.get(name)
    return None if attribute is None else attribute.value


_A = TypeVar("_A", bound=Attributes)


def _build(cls: type[_A], required: Mapping[str, Any], optional: Mapping[str, Any]) -> _A:
    """An attribute set: every required value (``None`` is a ``TypeError`` naming it), the optional ones given."""
    attributes = cls()
    for name, value in required.items():
        if value is None:
            raise TypeError(f"{cls.__name__}.create: {name} is required")
        attributes.add(name, value)
    for name, value in optional.items():
        if value is not None:
            attributes.add(name, value)
    return attributes


def _metadata(custom_metadata: Mapping[str, Any] | None) -> list[str] | None:
    return None if custom_metadata is None else [f"{k}:{v}" for k, v in custom_metadata.items()]


_int, _float, _str, _bool = "get_int_value", "get_float_value", "get_str_value", "get_bool_value"


class TrainingLoopAttributes(Attributes):
    """The ``training_loop`` span's attributes."""

    train_iterations_start: _Field[int] = _Field(_int, required=True)
    train_samples_start: _Field[int] = _Field(_int, required=True)
    train_tokens_target: _Field[int | None] = _Field(_int)
    completed_floating_point_operations_overall: _Field[int | None] = _Field(_int)
    train_iterations_target: _Field[int | None] = _Field(_int)
    train_samples_target: _Field[int | None] = _Field(_int)

    @classmethod
    def create(cls, train_iterations_start: int, train_samples_start: int, train_tokens_target: int | None = None,
               completed_floating_point_operations_overall: int | None = None,
               train_iterations_target: int | None = None,
               train_samples_target: int | None = None) -> TrainingLoopAttributes:
        return _build(cls, {"train_iterations_start": train_iterations_start,
                            "train_samples_start": train_samples_start},
                      {"train_tokens_target": train_tokens_target,
                       "completed_floating_point_operations_overall": completed_floating_point_operations_overall,
                       "train_iterations_target": train_iterations_target,
                       "train_samples_target": train_samples_target})


class CheckpointSaveSpanAttributes(Attributes):
    """The ``checkpoint_save_sync``/``_async`` span's attributes."""

    current_iteration: _Field[int] = _Field(_int, required=True)
    save_checkpoint_attempt_count: _Field[int] = _Field(_int, required=True)

    @property
    def checkpoint_strategy(self) -> CheckPointStrategy:
        value = self.get_str_value("checkpoint_strategy")
        if value is None:
            raise OneLoggerError("checkpoint_strategy is required.")
        return CheckPointStrategy(value)

    @classmethod
    def create(cls, checkpoint_strategy: CheckPointStrategy | str, current_iteration: int,
               save_checkpoint_attempt_count: int) -> CheckpointSaveSpanAttributes:
        return _build(cls, {"checkpoint_strategy": checkpoint_strategy, "current_iteration": current_iteration,
                            "save_checkpoint_attempt_count": save_checkpoint_attempt_count}, {})


class OneLoggerInitializationAttributes(Attributes):
    """The ``one_logger_initialization`` event's attributes."""

    world_size: _Field[int] = _Field(_int, required=True)
    one_logger_training_telemetry_version: _Field[str] = _Field(_str, required=True)
    enable_for_current_rank: _Field[bool] = _Field(_bool, required=True)
    session_tag: _Field[str] = _Field(_str, required=True)
    is_baseline_run: _Field[bool] = _Field(_bool, required=True)
    summary_data_schema_version: _Field[str] = _Field(_str, required=True)
    node_name: _Field[str] = _Field(_str, required=True)
    rank: _Field[int] = _Field(_int, required=True)
    custom_metadata: _Field[list[str] | None] = _Field("")

    @classmethod
    def create(cls, world_size: int, one_logger_training_telemetry_version: str, enable_for_current_rank: bool,
               session_tag: str, is_baseline_run: bool, summary_data_schema_version: str, node_name: str, rank: int,
               custom_metadata: Mapping[str, Any] | None = None) -> OneLoggerInitializationAttributes:
        return _build(cls, {"world_size": world_size,
                            "one_logger_training_telemetry_version": one_logger_training_telemetry_version,
                            "enable_for_current_rank": enable_for_current_rank, "session_tag": session_tag,
                            "is_baseline_run": is_baseline_run,
                            "summary_data_schema_version": summary_data_schema_version, "node_name": node_name,
                            "rank": rank},
                      {"custom_metadata": _metadata(custom_metadata)})


class TrainingTelemetryAttributes(Attributes):
    """The ``update_training_telemetry_config`` event's attributes."""

    perf_tag: _Field[str | list[str]] = _Field("", required=True)
    global_batch_size: _Field[int] = _Field(_int, required=True)
    log_every_n_train_iterations: _Field[int] = _Field(_int, required=True)
    micro_batch_size: _Field[int | None] = _Field(_int)
    seq_length: _Field[int | None] = _Field(_int)
    flops_per_sample: _Field[float | None] = _Field(_float)
    train_iterations_target: _Field[int | None] = _Field(_int)
    train_samples_target: _Field[int | None] = _Field(_int)
    is_train_iterations_enabled: _Field[bool | None] = _Field(_bool)
    is_validation_iterations_enabled: _Field[bool | None] = _Field(_bool)
    is_test_iterations_enabled: _Field[bool | None] = _Field(_bool)
    is_save_checkpoint_enabled: _Field[bool | None] = _Field(_bool)
    is_log_throughput_enabled: _Field[bool | None] = _Field(_bool)
    app_type: _Field[str | None] = _Field(_str)
    custom_metadata: _Field[list[str] | None] = _Field("")

    @property
    def checkpoint_strategy(self) -> CheckPointStrategy | None:
        value = self.get_str_value("checkpoint_strategy")
        return None if value is None else CheckPointStrategy(value)

    @classmethod
    def create(cls, perf_tag: str | list[str], global_batch_size: int, log_every_n_train_iterations: int,
               micro_batch_size: int | None = None, seq_length: int | None = None,
               flops_per_sample: float | None = None, train_iterations_target: int | None = None,
               train_samples_target: int | None = None, checkpoint_strategy: CheckPointStrategy | str | None = None,
               is_train_iterations_enabled: bool | None = None, is_validation_iterations_enabled: bool | None = None,
               is_test_iterations_enabled: bool | None = None, is_save_checkpoint_enabled: bool | None = None,
               is_log_throughput_enabled: bool | None = None, custom_metadata: Mapping[str, Any] | None = None,
               app_type: str | None = None) -> TrainingTelemetryAttributes:
        return _build(cls, {"perf_tag": perf_tag, "global_batch_size": global_batch_size,
                            "log_every_n_train_iterations": log_every_n_train_iterations},
                      {"micro_batch_size": micro_batch_size, "seq_length": seq_length,
                       "flops_per_sample": flops_per_sample, "train_iterations_target": train_iterations_target,
                       "train_samples_target": train_samples_target, "checkpoint_strategy": checkpoint_strategy,
                       "is_train_iterations_enabled": is_train_iterations_enabled,
                       "is_validation_iterations_enabled": is_validation_iterations_enabled,
                       "is_test_iterations_enabled": is_test_iterations_enabled,
                       "is_save_checkpoint_enabled": is_save_checkpoint_enabled,
                       "is_log_throughput_enabled": is_log_throughput_enabled,
                       "custom_metadata": _metadata(custom_metadata), "app_type": app_type})


class TrainingMetricsUpdateAttributes(Attributes):
    """The ``training_metrics_update`` event's attributes (one-logger's set; the recorder fills what it measures)."""

    train_iterations_start: _Field[int] = _Field(_int, required=True)
    current_iteration: _Field[int] = _Field(_int, required=True)
    num_iterations: _Field[int] = _Field(_int, required=True)
    train_samples_start: _Field[int] = _Field(_int, required=True)
    num_train_samples: _Field[int] = _Field(_int, required=True)
    interval: _Field[int] = _Field(_int, required=True)
    avg_iteration_time_sec: _Field[float] = _Field(_float, required=True)
    min_iteration_time_sec: _Field[float] = _Field(_float, required=True)
    max_iteration_time_sec: _Field[float] = _Field(_float, required=True)
    total_iteration_time_sec: _Field[float] = _Field(_float, required=True)
    avg_forward_time_sec: _Field[float | None] = _Field(_float)
    avg_backward_time_sec: _Field[float | None] = _Field(_float)
    avg_dataloader_time_sec: _Field[float | None] = _Field(_float)
    avg_tflops: _Field[float | None] = _Field(_float)
    train_tokens: _Field[int | None] = _Field(_int)
    avg_tokens_per_second: _Field[float | None] = _Field(_float)
    latest_loss: _Field[float | None] = _Field(_float)
    avg_batch_size: _Field[int | None] = _Field(_int)
    completed_floating_point_operations_overall: _Field[int | None] = _Field(_int)
    total_flops: _Field[int | None] = _Field(_int)
    train_throughput_per_gpu: _Field[float | None] = _Field(_float)
    train_throughput_per_gpu_max: _Field[float | None] = _Field(_float)
    train_throughput_per_gpu_min: _Field[float | None] = _Field(_float)
    first_logged_train_iterations_finish_timestamp_sec: _Field[float | None] = _Field(_float)
    last_logged_train_iterations_finish_timestamp_sec: _Field[float | None] = _Field(_float)

    @classmethod
    def create(cls, train_iterations_start: int, current_iteration: int, num_iterations: int,
               train_samples_start: int, num_train_samples: int, interval: int, avg_iteration_time_sec: float,
               min_iteration_time_sec: float, max_iteration_time_sec: float, total_iteration_time_sec: float,
               avg_forward_time_sec: float | None = None, avg_backward_time_sec: float | None = None,
               avg_dataloader_time_sec: float | None = None, avg_tflops: float | None = None,
               train_tokens: int | None = None, avg_tokens_per_second: float | None = None,
               latest_loss: float | None = None, avg_batch_size: int | None = None,
               completed_floating_point_operations_overall: int | None = None, total_flops: int | None = None,
               train_throughput_per_gpu: float | None = None, train_throughput_per_gpu_max: float | None = None,
               train_throughput_per_gpu_min: float | None = None,
               first_logged_train_iterations_finish_timestamp_sec: float | None = None,
               last_logged_train_iterations_finish_timestamp_sec: float | None = None,
               ) -> TrainingMetricsUpdateAttributes:
        return _build(cls, {"train_iterations_start": train_iterations_start, "current_iteration": current_iteration,
                            "num_iterations": num_iterations, "train_samples_start": train_samples_start,
                            "num_train_samples": num_train_samples, "interval": interval,
                            "avg_iteration_time_sec": avg_iteration_time_sec,
                            "min_iteration_time_sec": min_iteration_time_sec,
                            "max_iteration_time_sec": max_iteration_time_sec,
                            "total_iteration_time_sec": total_iteration_time_sec},
                      {"avg_forward_time_sec": avg_forward_time_sec, "avg_backward_time_sec": avg_backward_time_sec,
                       "avg_dataloader_time_sec": avg_dataloader_time_sec, "avg_tflops": avg_tflops,
                       "train_tokens": train_tokens, "avg_tokens_per_second": avg_tokens_per_second,
                       "latest_loss": latest_loss, "avg_batch_size": avg_batch_size,
                       "completed_floating_point_operations_overall": completed_floating_point_operations_overall,
                       "total_flops": total_flops, "train_throughput_per_gpu": train_throughput_per_gpu,
                       "train_throughput_per_gpu_max": train_throughput_per_gpu_max,
                       "train_throughput_per_gpu_min": train_throughput_per_gpu_min,
                       "first_logged_train_iterations_finish_timestamp_sec":
                           first_logged_train_iterations_finish_timestamp_sec,
                       "last_logged_train_iterations_finish_timestamp_sec":
                           last_logged_train_iterations_finish_timestamp_sec})


class ValidationMetricsUpdateAttributes(Attributes):
    """The ``validation_metrics_update`` event's attributes."""

    current_iteration: _Field[int] = _Field(_int, required=True)
    interval: _Field[int] = _Field(_int, required=True)
    avg_iteration_time_sec: _Field[float | None] = _Field(_float)
    min_iteration_time_sec: _Field[float | None] = _Field(_float)
    max_iteration_time_sec: _Field[float | None] = _Field(_float)
    total_iteration_time_sec: _Field[float | None] = _Field(_float)

    @classmethod
    def create(cls, current_iteration: int, interval: int, avg_iteration_time_sec: float | None = None,
               min_iteration_time_sec: float | None = None, max_iteration_time_sec: float | None = None,
               total_iteration_time_sec: float | None = None) -> ValidationMetricsUpdateAttributes:
        return _build(cls, {"current_iteration": current_iteration, "interval": interval},
                      {"avg_iteration_time_sec": avg_iteration_time_sec,
                       "min_iteration_time_sec": min_iteration_time_sec,
                       "max_iteration_time_sec": max_iteration_time_sec,
                       "total_iteration_time_sec": total_iteration_time_sec})


class TestingMetricsUpdateAttributes(Attributes):
    """The ``testing_metrics_update`` event's attributes."""

    __test__ = False  # (a name pytest would otherwise collect)

    current_iteration: _Field[int] = _Field(_int, required=True)
    interval: _Field[int] = _Field(_int, required=True)

    @classmethod
    def create(cls, current_iteration: int, interval: int) -> TestingMetricsUpdateAttributes:
        return _build(cls, {"current_iteration": current_iteration, "interval": interval}, {})


class SaveCheckpointSuccessEventAttributes(Attributes):
    """The ``save_checkpoint_success`` event's attributes."""

    current_iteration: _Field[int] = _Field(_int, required=True)
    first_successful_save_checkpoint_timestamp_sec: _Field[float] = _Field(_float, required=True)
    latest_successful_save_checkpoint_timestamp_sec: _Field[float] = _Field(_float, required=True)
    save_checkpoint_success_count: _Field[int] = _Field(_int, required=True)
    productive_train_iterations: _Field[int] = _Field(_int, required=True)
    productive_train_samples: _Field[int] = _Field(_int, required=True)
    productive_train_iterations_sec: _Field[float] = _Field(_float, required=True)
    productive_validation_iterations_sec: _Field[float] = _Field(_float, required=True)
    productive_train_tflops: _Field[float | None] = _Field(_float)
    checkpoint_size: _Field[int | None] = _Field(_int)
    checkpoint_directory: _Field[str | None] = _Field(_str)
    training_start_timestamp_sec: _Field[float | None] = _Field(_float)

    @property
    def checkpoint_strategy(self) -> CheckPointStrategy:
        value = self.get_str_value("checkpoint_strategy")
        if value is None:
            raise OneLoggerError("checkpoint_strategy is required.")
        return CheckPointStrategy(value)

    @classmethod
    def create(cls, checkpoint_strategy: CheckPointStrategy | str, current_iteration: int,
               first_successful_save_checkpoint_timestamp_sec: float,
               latest_successful_save_checkpoint_timestamp_sec: float, save_checkpoint_success_count: int,
               productive_train_iterations: int, productive_train_samples: int,
               productive_train_iterations_sec: float, productive_validation_iterations_sec: float,
               productive_train_tflops: float | None = None, checkpoint_size: int | None = None,
               checkpoint_directory: str | None = None,
               training_start_timestamp_sec: float | None = None) -> SaveCheckpointSuccessEventAttributes:
        return _build(cls, {"checkpoint_strategy": checkpoint_strategy, "current_iteration": current_iteration,
                            "first_successful_save_checkpoint_timestamp_sec":
                                first_successful_save_checkpoint_timestamp_sec,
                            "latest_successful_save_checkpoint_timestamp_sec":
                                latest_successful_save_checkpoint_timestamp_sec,
                            "save_checkpoint_success_count": save_checkpoint_success_count,
                            "productive_train_iterations": productive_train_iterations,
                            "productive_train_samples": productive_train_samples,
                            "productive_train_iterations_sec": productive_train_iterations_sec,
                            "productive_validation_iterations_sec": productive_validation_iterations_sec},
                      {"productive_train_tflops": productive_train_tflops, "checkpoint_size": checkpoint_size,
                       "checkpoint_directory": checkpoint_directory,
                       # one-logger leaves out a zero start time (no training loop yet) as well as a missing one
                       "training_start_timestamp_sec": training_start_timestamp_sec or None})


class SyncCheckpointMetricsUpdateAttributes(Attributes):
    """The ``sync_checkpoint_metrics_update`` event's attributes (emitted for sync and async saves, as one-logger)."""

    save_checkpoint_sync_time_total_sec: _Field[float] = _Field(_float, required=True)
    save_checkpoint_sync_time_min_sec: _Field[float] = _Field(_float, required=True)
    save_checkpoint_sync_time_max_sec: _Field[float] = _Field(_float, required=True)

    @classmethod
    def create(cls, save_checkpoint_sync_time_total_sec: float, save_checkpoint_sync_time_min_sec: float,
               save_checkpoint_sync_time_max_sec: float) -> SyncCheckpointMetricsUpdateAttributes:
        return _build(cls, {"save_checkpoint_sync_time_total_sec": save_checkpoint_sync_time_total_sec,
                            "save_checkpoint_sync_time_min_sec": save_checkpoint_sync_time_min_sec,
                            "save_checkpoint_sync_time_max_sec": save_checkpoint_sync_time_max_sec}, {})
