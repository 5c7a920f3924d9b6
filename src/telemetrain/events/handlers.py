"""``torch.distributed.elastic.events.handlers``'s module path: the logging destinations of events (re-exported from
``telemetrain.events``; ``_log_handlers`` is the same dict, so a destination added either way is seen by both)."""

from __future__ import annotations

from . import _log_handlers, get_logging_handler, register_logging_handler

__all__ = ["_log_handlers", "get_logging_handler", "register_logging_handler"]
