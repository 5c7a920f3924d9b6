"""``LoggerExporter``: one-logger's records as log lines (``nv_one_logger.exporter.logger_exporter``): one
``logger.info`` per record, ``[key=value | parent.child=value | ...]`` with keys in reverse order and values
JSON-encoded. ``deserialize_log`` reads a line back -- also when a value holds ``" | "`` or ``=``, which one-logger's
own reader splits wrongly."""

from __future__ import annotations

import json
import logging
from typing import Any

from ..errors import ExportError
from .json_records import BaseJsonExporter

__all__ = ["LoggerExporter"]


class LoggerExporter(BaseJsonExporter):
    """Logs each record at INFO on ``logger`` (a ``logging.Logger``, or a logger name)."""

    def __init__(self, logger: logging.Logger | str) -> None:
        if isinstance(logger, str):
            logger = logging.getLogger(logger)
        if not isinstance(logger, logging.Logger):
            raise TypeError(f"logger must be a logging.Logger or a logger name, got {type(logger).__name__}")
        super().__init__()
        self._logger = logger

    def _format_log(self, json_dict: dict[str, Any], prefix: str = "") -> str:
        items: list[str] = []
        for key, value in sorted(json_dict.items(), reverse=True):
            if "." in key:
                raise ExportError(f"keys cannot contain dots: {key}")
            name = f"{prefix}.{key}" if prefix else key
            if isinstance(value, dict):
                nested = self._format_log(value, name)
                if nested:
                    items.append(nested)
            else:
                items.append(f"{name}={json.dumps(value, default=str)}")
        if prefix:
            return " | ".join(items)
        return "[" + " | ".join(items) + "]" if items else ""

    @staticmethod
    def deserialize_log(text: str) -> dict[str, Any]:
        """The record of one log line (the text may carry a logging prefix before the ``[``)."""
        start, end = text.find("["), text.rfind("]")
        if start < 0 or end < start:
            raise ExportError(f"Log string must be enclosed in square brackets: {text}")
        body, pos, out = text[start + 1:end], 0, {}  # type: ignore[var-annotated]
        decoder = json.JSONDecoder()
        while pos < len(body):
            eq = body.index("=", pos)
            key = body[pos:eq]
            value, pos = decoder.raw_decode(body, eq + 1)
            target = out
            *parents, leaf = key.split(".")
            for parent in parents:
                target = target.setdefault(parent, {})
            target[leaf] = value
            if body.startswith(" | ", pos):
                pos += 3
            elif pos < len(body):
                raise ExportError(f"unexpected text at {pos} in log string: {body[pos:pos + 20]!r}")
        return out

    def _write(self, json_dict: dict[str, Any]) -> None:
        self._logger.info(self._format_log(json_dict))
