"""``TrainingTelemetryProvider``: one-logger's builder and entry point
(``nv_one_logger.training_telemetry.api.training_telemetry_provider``)::

    TrainingTelemetryProvider.instance() \\
        .with_base_config(OneLoggerConfig(application_name="app", world_size_or_fn=8, session_tag_or_fn="run-1")) \\
        .with_exporter(FileExporter(file_path=Path("telemetry.jsonl"))) \\
        .configure_provider()
    TrainingTelemetryProvider.instance().set_training_telemetry_config(TrainingTelemetryConfig(...))

Once configured, the module-level callbacks and context managers (``telemetrain.training.callbacks``/``.context``)
drive its ``OneLoggerTrainingRecorder``: one-logger's spans and events to the exporters, and telemetrain's own
recorder (on the provider's ``Telemetry``) for the run store, the report and telemetrain's sinks. Its ``callbacks``
(``OneLoggerCallbacks``) are in ``one_logger_callbacks``.

one-logger's once-only rules are kept -- ``with_base_config``, ``with_export_customization``, ``configure_provider``
and ``set_training_telemetry_config`` once; no builder call after ``configure_provider`` -- but a call that breaks
one is recorded (an ``error`` event), warned once and ignored: it never raises into the job. A configuration that
is invalid (a missing required field, a bad value) is a programming error and raises ``InvalidConfigError`` (a
``ValueError`` and a ``OneLoggerError``). ``reset()`` forgets the process-wide provider (for tests).

Beyond one-logger: ``with_telemetry(t)`` (which ``Telemetry`` backs it), ``with_delivery_wait(seconds)`` (how long a
callback waits for its exports, ``training.delivery``; 0 never waits), export customization ``EXPORT_ALL_SPANS``
(one-logger's provider cannot select it), and a provider built directly (``TrainingTelemetryProvider(telemetry=t)``)
is an independent instance with its own recorder.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..dispatch import describe, warn_safely
from ..telemetry import Telemetry, get_telemetry
from .config import TrainingTelemetryConfig
from .default_recorder import ExportCustomizationMode, _filter_names
from .errors import InvalidConfigError, OneLoggerError
from .exporters.base import check_exporter
from .exporters.config import ExporterConfig, ExporterConfigManager
from .names import E, SpanName
from .one_logger_callbacks import OneLoggerCallbacks, _set_training_config
from .one_logger_config import OneLoggerConfig
from .one_logger_provider import OneLoggerProvider
from .singleton import SingletonMeta
from .spans import SpanName as AnySpanName
from .training_recorder import OneLoggerTrainingRecorder

__all__ = ["DEFAULT_SPANS_EXPORT_BLACKLIST", "OneLoggerCallbacks", "TrainingTelemetryProvider"]

DEFAULT_SPANS_EXPORT_BLACKLIST: list[AnySpanName] = [
    SpanName.TRAINING_SINGLE_ITERATION,
    SpanName.VALIDATION_SINGLE_ITERATION,
    SpanName.TESTING_SINGLE_ITERATION,
    SpanName.DATA_LOADING,
    SpanName.MODEL_FORWARD,
    SpanName.ZERO_GRAD,
    SpanName.MODEL_BACKWARD,
    SpanName.OPTIMIZER_UPDATE,
]


class TrainingTelemetryProvider(metaclass=SingletonMeta):
    """The builder (see the module docstring). ``instance()`` is the process-wide one."""

    def __init__(self, telemetry: Telemetry | None = None) -> None:
        if telemetry is not None and not isinstance(telemetry, Telemetry):
            raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
        self._telemetry = telemetry
        self.__tmp_base_config: OneLoggerConfig | None = None
        self.__tmp_config_overrides: dict[str, Any] = {}
        self.__tmp_exporters: list[Any] = []
        self.__tmp_export_customization_mode: ExportCustomizationMode | None = None
        self.__tmp_span_name_filter: list[AnySpanName] | None = None
        self.__wait_s = 1.0
        self.__fully_configured = False
        self.__config_set_late = False
        self.errors = 0
        self._one_logger: OneLoggerProvider | None = None

    # -- misuse ----------------------------------------------------------------------------------------------------

    def _misuse(self, where: str, message: str) -> None:
        """A broken once-only rule: recorded, counted, warned once; the call is ignored."""
        self.errors += 1
        if self.errors == 1:
            warn_safely(f"telemetrain: TrainingTelemetryProvider.{where}: {message} (ignored; recorded as an error "
                        "event; later misuse is not warned about)", stacklevel=4)
        try:
            self.telemetry.event(E.ERROR, {"error_message": message, "callback": f"TrainingTelemetryProvider.{where}"},
                                 severity="error", group="training")
        except Exception:  # noqa: BLE001
            pass

    def _late(self, where: str) -> bool:
        if self.__fully_configured:
            self._misuse(where, f"{where} can be called only before configure_provider is called.")
            return True
        return False

    @property
    def telemetry(self) -> Telemetry:
        return self._telemetry if self._telemetry is not None else get_telemetry()

    # -- the builder -----------------------------------------------------------------------------------------------

    def with_base_config(self, one_logger_config: OneLoggerConfig) -> TrainingTelemetryProvider:
        if not isinstance(one_logger_config, OneLoggerConfig):
            raise TypeError(f"one_logger_config must be a OneLoggerConfig, got {type(one_logger_config).__name__}")
        if self._late("with_base_config"):
            return self
        if self.__tmp_base_config is not None:
            self._misuse("with_base_config", "You can only call with_base_config once: the first config is kept")
            return self
        self.__tmp_base_config = one_logger_config
        return self

    def with_config_override(self, partial_config: Mapping[str, Any]) -> TrainingTelemetryProvider:
        if not isinstance(partial_config, Mapping):
            raise TypeError(f"partial_config must be a mapping, got {type(partial_config).__name__}")
        if not self._late("with_config_override"):
            _nested_update(self.__tmp_config_overrides, partial_config)
        return self

    def with_config_override_from_json_file(self, file_path: str | os.PathLike[str]) -> TrainingTelemetryProvider:
        """Overrides from a JSON file holding an object (one-logger declares this and raises
        ``NotImplementedError``)."""
        import json

        with open(file_path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise InvalidConfigError(f"{file_path}: the config overrides must be a JSON object")
        return self.with_config_override(data)

    def with_config_override_from_config_server(self, config_server_url: str) -> TrainingTelemetryProvider:
        raise NotImplementedError("config servers are not supported (one-logger does not implement them either); "
                                  "fetch the overrides yourself and pass them to with_config_override")

    def with_exporter(self, exporter: Any) -> TrainingTelemetryProvider:
        check_exporter(exporter)
        if not self._late("with_exporter"):
            self.__tmp_exporters.append(exporter)
        return self

    def with_export_customization(self, export_customization_mode: ExportCustomizationMode,
                                  span_name_filter: Sequence[AnySpanName] | None) -> TrainingTelemetryProvider:
        _filter_names(export_customization_mode, span_name_filter)  # a bad argument is a TypeError now
        if self._late("with_export_customization"):
            return self
        if self.__tmp_export_customization_mode is not None:
            self._misuse("with_export_customization", "You can only call with_export_customization once: the first "
                                                      "customization is kept")
            return self
        self.__tmp_export_customization_mode = export_customization_mode
        self.__tmp_span_name_filter = list(span_name_filter) if span_name_filter is not None else None
        return self

    def with_export_config(self, exporters_config: Sequence[ExporterConfig | Mapping[str, Any]] | None = None,
                           config_file_path: str | os.PathLike[str] | None = None) -> TrainingTelemetryProvider:
        """Exporters from package defaults, a config file and ``exporters_config`` (see ``ExporterConfigManager``)."""
        if self._late("with_export_config"):
            return self
        manager = ExporterConfigManager()
        configs = manager.generate_export_config(exporters_config, config_file_path)
        direct = {c.class_name if isinstance(c, ExporterConfig) else c.get("class_name")
                  for c in exporters_config or ()}
        for config in configs:
            strict = config.class_name in direct  # a config given in code that cannot be built is the caller's bug
            self.__tmp_exporters.extend(manager.create_exporters_from_config([config], strict=strict))
        return self

    def with_telemetry(self, telemetry: Telemetry) -> TrainingTelemetryProvider:
        """Back the provider with ``telemetry`` (default: the default ``Telemetry``)."""
        if not isinstance(telemetry, Telemetry):
            raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
        if not self._late("with_telemetry"):
            self._telemetry = telemetry
        return self

    def with_delivery_wait(self, seconds: float) -> TrainingTelemetryProvider:
        """How long a callback waits for its exports before going on (default 1 s; 0: never waits). An exporter
        that once takes longer is not waited for again (``training.delivery``)."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
            raise ValueError(f"seconds must be a number >= 0, got {seconds!r}")
        if not self._late("with_delivery_wait"):
            self.__wait_s = float(seconds)
        return self

    def configure_provider(self) -> None:
        if self.__fully_configured:
            self._misuse("configure_provider", "You can only call configure_provider once per application: this call "
                                               "is ignored")
            return
        config = self._build_one_logger_config()
        mode = self.__tmp_export_customization_mode or ExportCustomizationMode.BLACKLIST_SPANS
        span_filter = self.__tmp_span_name_filter if self.__tmp_export_customization_mode is not None \
            else DEFAULT_SPANS_EXPORT_BLACKLIST
        exporters = self.__tmp_exporters if config.enable_for_current_rank else []
        recorder = OneLoggerTrainingRecorder(config, exporters, mode, span_filter, telemetry=self.telemetry,
                                             wait_s=self.__wait_s)
        provider = OneLoggerProvider.instance() if SingletonMeta._instances.get(type(self)) is self \
            else OneLoggerProvider()
        provider.configure(config, recorder, OneLoggerCallbacks(provider))
        self._one_logger = provider
        self.__fully_configured = True
        if not config.enable_for_current_rank:
            provider.force_disable_logging()

    def _build_one_logger_config(self) -> OneLoggerConfig:
        base, overrides = self.__tmp_base_config, self.__tmp_config_overrides
        if base is None and not overrides:
            raise InvalidConfigError("No configuration was provided. Please provide a base config and/or config "
                                     "overrides.")
        if not overrides and base is not None:
            return base
        merged = base.model_dump() if base is not None else {}
        _nested_update(merged, copy.copy(overrides))
        try:
            return OneLoggerConfig.model_validate(merged)
        except (TypeError, ValueError) as exc:
            raise InvalidConfigError(f"Invalid configuration! Did you forget some required fields?: {exc}") from exc

    # -- after configuration ---------------------------------------------------------------------------------------

    def _provider(self) -> OneLoggerProvider:
        provider = self._one_logger
        if provider is not None and SingletonMeta._instances.get(type(self)) is self:
            provider = OneLoggerProvider.instance()  # (looked up at each use, as one-logger does)
        if provider is None or not self.__fully_configured:
            raise OneLoggerError("You need to call TrainingTelemetryProvider.instance().configure() once in your "
                                 "application before accessing the recorder.")
        return provider

    @property
    def recorder(self) -> OneLoggerTrainingRecorder:
        recorder: OneLoggerTrainingRecorder = self._provider().recorder
        return recorder

    @property
    def config(self) -> OneLoggerConfig:
        """A copy of the configuration in use (changing it changes nothing)."""
        config: OneLoggerConfig = self._provider().config
        return config.model_copy()

    @property
    def callbacks(self) -> OneLoggerCallbacks:
        """one-logger's callbacks (``*_time_msec`` arguments) bound to this provider's recorder."""
        callbacks: OneLoggerCallbacks = self._provider()._callbacks
        return callbacks

    @property
    def one_logger_ready(self) -> bool:
        return self._one_logger is not None and self._one_logger.one_logger_ready

    def force_disable_logging(self) -> None:
        """Stop exporting for the rest of the process (the run store keeps recording)."""
        if self._one_logger is not None:
            self._one_logger.force_disable_logging()

    def set_training_telemetry_config(self, training_telemetry_config: TrainingTelemetryConfig) -> None:
        """The training config, when it is known only after configuration (once): emits
        ``update_training_telemetry_config`` on the application span."""
        if not isinstance(training_telemetry_config, TrainingTelemetryConfig):
            raise TypeError(f"training_telemetry_config must be a TrainingTelemetryConfig, got "
                            f"{type(training_telemetry_config).__name__}")
        if not self.__fully_configured:
            self._misuse("set_training_telemetry_config", "You need to call TrainingTelemetryProvider.instance()."
                         "configure_provider() once in your application before setting the training config: ignored")
            return
        _set_training_config(self._provider(), training_telemetry_config, self._misuse)

    @classmethod
    def reset(cls) -> None:
        """Forget the process-wide provider (and its ``OneLoggerProvider``); its recorder is closed first, so its
        exporters are flushed (for tests)."""
        with SingletonMeta._lock:
            provider = SingletonMeta._instances.pop(OneLoggerProvider, None)
            SingletonMeta._instances.pop(cls, None)
        recorder = getattr(provider, "_recorder", None)
        if recorder is not None:
            try:
                recorder.close()
            except Exception as exc:  # noqa: BLE001
                warn_safely(f"telemetrain: closing the provider's recorder failed: {describe(exc)}")


def _nested_update(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _nested_update(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
    return base
