"""``OneLoggerProvider``: where the configured one-logger recorder and config live (one-logger's
``nv_one_logger.api.one_logger_provider``). ``TrainingTelemetryProvider.configure_provider`` fills it; ``timed_span``,
``get_recorder`` and the module-level callbacks read it. Configuring it twice is recorded and warned (the second
configuration is ignored), not raised."""

from __future__ import annotations

from typing import Any

from ..dispatch import warn_safely
from .errors import OneLoggerError
from .singleton import SingletonMeta

__all__ = ["OneLoggerProvider"]


class OneLoggerProvider(metaclass=SingletonMeta):
    def __init__(self) -> None:
        self._config: Any = None
        self._recorder: Any = None
        self._callbacks: Any = None  # the callbacks adapter over the recorder (training_telemetry_provider)
        self._logging_force_disabled = False

    def configure(self, config: Any, recorder: Any, callbacks: Any = None) -> None:
        if config is None:
            raise TypeError("config must be a OneLoggerConfig, got None")
        if self._recorder is not None and (self._recorder is not recorder or self._config is not config):
            warn_safely("telemetrain: OneLoggerProvider is already configured: this second configure() is ignored "
                        "(call it once per application)", stacklevel=3)
            return
        self._config, self._recorder, self._callbacks = config, recorder, callbacks

    @property
    def recorder(self) -> Any:
        if self._recorder is None:
            raise OneLoggerError("You need to call OneLoggerProvider.instance().configure() once in your application "
                                 "before accessing the recorder.")
        return self._recorder

    @property
    def config(self) -> Any:
        if self._config is None:
            raise OneLoggerError("You need to call OneLoggerProvider.instance().configure() once in your application "
                                 "before accessing the config.")
        return self._config

    @property
    def one_logger_ready(self) -> bool:
        return self._recorder is not None and self._config is not None

    @property
    def one_logger_enabled(self) -> bool:
        return self.one_logger_ready and not self._logging_force_disabled and bool(self._config.enable_for_current_rank)

    def force_disable_logging(self) -> None:
        """Stop exporting for the rest of the process (telemetrain's own run store keeps recording)."""
        self._logging_force_disabled = True
        recorder = self._recorder
        if recorder is not None:
            recorder.force_disable_exporting()
