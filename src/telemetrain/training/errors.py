"""The exception types of the one-logger-compatible API (``nv_one_logger.core.exceptions``'s names).

telemetrain raises them only for a programming error at the call site -- an invalid configuration value, an argument
of the wrong type -- never for misuse during training (a callback twice, an end without a start): that is recorded
as an ``error`` event, counted and warned once, and the call returns normally."""

from __future__ import annotations

from typing import Any

__all__ = ["ExportError", "InvalidConfigError", "OneLoggerError", "assert_that"]


class OneLoggerError(Exception):
    """An error of the one-logger-compatible API (one-logger's own base class, same name)."""

    def __init__(self, message: str) -> None:  # one-logger's signature: ``OneLoggerError(message=...)`` works
        super().__init__(message)


class ExportError(OneLoggerError):
    """What an exporter raises when it cannot export (a closed or uninitialised exporter, an unwritable record)."""


class InvalidConfigError(OneLoggerError, ValueError):
    """An invalid configuration value: a ``ValueError`` (the project's rule for bad input) that one-logger code
    catching ``OneLoggerError`` also catches."""


def assert_that(condition: Any, message: str) -> None:
    """one-logger's invariant check (exporters written for it import it): raise ``OneLoggerError(message)`` unless
    ``condition`` holds."""
    if not condition:
        raise OneLoggerError(message)
