"""``OneLoggerConfig``: one-logger's application config (``nv_one_logger.api.config`` and
``nv_one_logger.api.telemetry_config``), the base config of ``TrainingTelemetryProvider``.

Same fields and defaults, the same lazy ``*_or_fn`` values, validated when built (a plain dataclass: no pydantic),
with the pydantic methods code written for one-logger calls (``model_copy``, ``model_dump``, ``model_validate``).
How it maps onto telemetrain: ``world_size`` and ``session_tag`` go into the ``one_logger_initialization`` event and
the training config's defaults (the run identity still comes from the launcher); ``application_name`` is recorded
in the run store (one-logger validates it and never exports it); ``enable_for_current_rank=False`` turns the
exporters off on this rank (telemetrain's own run store still records it, so cross-rank analysis keeps every rank);
``logger_config`` is accepted and ignored (telemetrain writes no ``onelogger.log``/``.err`` files into the working
directory); ``error_handling_strategy``: telemetry errors are never raised (``PROPAGATE_EXCEPTIONS`` records them
like any misuse), ``DISABLE_QUIETLY_AND_REPORT_METRIC_ERROR`` also stops exporting after the first one.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from .attributes import AttributeValue
from .config import ApplicationType, TrainingTelemetryConfig, evaluate, lax_bool, lax_int
from .errors import InvalidConfigError

__all__ = ["ApplicationType", "LoggerConfig", "OneLoggerConfig", "OneLoggerErrorHandlingStrategy", "TelemetryConfig"]


class OneLoggerErrorHandlingStrategy(enum.Enum):
    PROPAGATE_EXCEPTIONS = "propagate_exceptions"
    DISABLE_QUIETLY_AND_REPORT_METRIC_ERROR = "disable_quietly_and_report_metric_error"


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclasses.dataclass
class LoggerConfig:
    """one-logger's internal-logging settings (accepted for compatibility; telemetrain writes no log files)."""

    log_level: str = "INFO"
    log_format: str = "%(name)s - %(levelname)s - %(message)s"
    log_file_path_for_info: Any = "onelogger.log"
    log_file_path_for_err: Any = "onelogger.err"

    def __post_init__(self) -> None:
        if self.log_level not in _LEVELS:
            raise InvalidConfigError(f"log_level must be one of {_LEVELS}, got {self.log_level!r}")


@runtime_checkable
class TelemetryConfig(Protocol):
    """What one-logger needs of a domain config (``TrainingTelemetryConfig`` is one)."""

    @property
    def is_train_iterations_enabled(self) -> bool: ...

    @property
    def is_validation_iterations_enabled(self) -> bool: ...

    @property
    def is_test_iterations_enabled(self) -> bool: ...

    @property
    def is_save_checkpoint_enabled(self) -> bool: ...

    @property
    def app_type(self) -> ApplicationType | str: ...

    @property
    def custom_metadata(self) -> Mapping[str, Any] | None: ...


@dataclasses.dataclass
class OneLoggerConfig:
    """The application's telemetry settings (see the module docstring)."""

    application_name: str
    world_size_or_fn: int | Callable[[], int]
    session_tag_or_fn: str | Callable[[], str]
    is_baseline_run_or_fn: bool | Callable[[], bool] = False
    custom_metadata: dict[str, AttributeValue] | None = None
    error_handling_strategy: OneLoggerErrorHandlingStrategy | None = None
    enable_for_current_rank: bool = True
    logger_config: LoggerConfig | Mapping[str, Any] = dataclasses.field(default_factory=LoggerConfig)
    summary_data_schema_version: str = "1.0.0"
    telemetry_config: TrainingTelemetryConfig | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.application_name, str) or not self.application_name.strip():
            raise InvalidConfigError("application_name cannot be empty or whitespace-only")
        if isinstance(self.logger_config, Mapping):
            self.logger_config = LoggerConfig(**self.logger_config)
        # converted as one-logger's pydantic model does (see config.lax_int): a value read from the environment
        self.world_size_or_fn = lax_int(self.world_size_or_fn)
        self.is_baseline_run_or_fn = lax_bool(self.is_baseline_run_or_fn, "is_baseline_run_or_fn")
        self.enable_for_current_rank = lax_bool(self.enable_for_current_rank, "enable_for_current_rank")
        if self.error_handling_strategy is None:
            # one-logger's "auto-quiet": a rank that does not log does not raise either
            self.error_handling_strategy = (OneLoggerErrorHandlingStrategy.PROPAGATE_EXCEPTIONS
                                            if self.enable_for_current_rank else
                                            OneLoggerErrorHandlingStrategy.DISABLE_QUIETLY_AND_REPORT_METRIC_ERROR)
        elif not isinstance(self.error_handling_strategy, OneLoggerErrorHandlingStrategy):
            try:
                self.error_handling_strategy = OneLoggerErrorHandlingStrategy(self.error_handling_strategy)
            except ValueError:
                raise InvalidConfigError(f"error_handling_strategy must be a OneLoggerErrorHandlingStrategy, got "
                                         f"{self.error_handling_strategy!r}") from None
        if not isinstance(self.enable_for_current_rank, bool):
            raise TypeError("enable_for_current_rank must be a bool, got "
                            f"{type(self.enable_for_current_rank).__name__}")
        world = self.world_size
        if isinstance(world, bool) or not isinstance(world, int) or world <= 0:
            raise InvalidConfigError(f"world_size must be set to a positive value, got {world!r}")
        if self.custom_metadata is not None:
            if not isinstance(self.custom_metadata, Mapping):
                raise TypeError(f"custom_metadata must be a mapping, got {type(self.custom_metadata).__name__}")
            if any(not isinstance(k, str) or not k.strip() for k in self.custom_metadata):
                raise InvalidConfigError("custom_metadata keys must be non-empty strings")
        telemetry = self.telemetry_config
        if isinstance(telemetry, Mapping):
            self.telemetry_config = TrainingTelemetryConfig(**telemetry)
        elif telemetry is not None and not isinstance(telemetry, TrainingTelemetryConfig):
            raise TypeError(f"telemetry_config must be a TrainingTelemetryConfig, got {type(telemetry).__name__}")

    @property
    def world_size(self) -> int:
        value: int = evaluate(self.world_size_or_fn)
        return value

    @property
    def session_tag(self) -> str:
        value: str = evaluate(self.session_tag_or_fn)
        return value

    @property
    def is_baseline_run(self) -> bool:
        return bool(evaluate(self.is_baseline_run_or_fn))

    def model_dump(self) -> dict[str, Any]:
        """The fields as a dict, nested configs as dicts (values and functions as given)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if isinstance(self.telemetry_config, TrainingTelemetryConfig):
            out["telemetry_config"] = self.telemetry_config.model_dump()
        if isinstance(self.logger_config, LoggerConfig):
            out["logger_config"] = dataclasses.asdict(self.logger_config)
        return out

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> OneLoggerConfig:
        """A copy (shallow, as pydantic's: the telemetry config object is shared unless ``deep``)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if deep:
            fields = copy.deepcopy(fields)
        fields.update(update or {})
        return OneLoggerConfig(**fields)

    @classmethod
    def model_validate(cls, data: Mapping[str, Any]) -> OneLoggerConfig:
        """Build from a dict (nested ``telemetry_config`` / ``logger_config`` dicts too). The known fields are
        validated first; then any unknown key is an error naming it (pydantic would drop it silently)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"config must be a mapping, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        config = cls(**{k: v for k, v in data.items() if k in names})
        unknown = sorted(set(data) - names)
        if unknown:
            raise InvalidConfigError(f"unknown OneLoggerConfig field(s): {', '.join(unknown)}")
        return config
