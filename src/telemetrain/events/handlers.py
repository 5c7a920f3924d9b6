"""``torch.distributed.elastic.events.handlers``'s module path, and where the logging destinations of events are, as
in torch: the handler table (``_log_handlers``: ``console``, ``dynamic_rendezvous``, ``null`` and the registered
ones), a ``torchelastic-events-<destination>`` logger per destination used, shared with torchelastic when both log
there, and ``_log_to``, which logs an event's JSON and never raises (``telemetrain.events`` exports the public names).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import Any

from ..dispatch import warn_safely
from .api import Event

__all__ = ["_log_handlers", "get_logging_handler", "register_logging_handler"]

_log_handlers: dict[str, logging.Handler] = {
    "console": logging.StreamHandler(),
    "dynamic_rendezvous": logging.NullHandler(),
    "null": logging.NullHandler(),
}
_events_loggers: dict[str, logging.Logger] = {}
_attached: dict[str, logging.Handler] = {}  # the handler we attached to each destination's logger
_warned_destinations: set[str] = set()
_lock = threading.Lock()


def _reset_lock_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a fork while another thread held it must not leave the child stuck


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock_after_fork)


def get_logging_handler(destination: str = "null") -> logging.Handler:
    """The logging handler of a destination (``console``, ``dynamic_rendezvous``, ``null`` or registered)."""
    try:
        return _log_handlers[destination]
    except KeyError:
        raise KeyError(
            f"unknown event destination {destination!r}; known: {', '.join(sorted(_log_handlers))} "
            "(add one with register_logging_handler)"
        ) from None


def register_logging_handler(destination: str, handler: logging.Handler) -> None:
    """Add or replace a destination. The logger of a destination already used is re-pointed too."""
    if not isinstance(destination, str) or not destination:
        raise TypeError("destination must be a non-empty str")
    if not isinstance(handler, logging.Handler):
        raise TypeError(f"handler must be a logging.Handler, got {type(handler).__name__}")
    with _lock:
        _log_handlers[destination] = handler
        logger = _events_loggers.get(destination)
        if logger is not None:
            attached = _attached.pop(destination, None)
            if attached is not None:
                logger.removeHandler(attached)
            _attached[destination] = _shared_builtin_handler(destination)
            logger.addHandler(_attached[destination])


_BUILTIN_HANDLERS = dict(_log_handlers)


def _torch_handler(destination: str) -> logging.Handler | None:
    """torchelastic's own handler object for a destination, if its events module is loaded."""
    torch_handlers = sys.modules.get("torch.distributed.elastic.events.handlers")
    theirs = getattr(torch_handlers, "_log_handlers", {}).get(destination) if torch_handlers is not None else None
    return theirs if isinstance(theirs, logging.Handler) else None


class _YieldToTorch(logging.Handler):
    """Our built-in handler on the logger torchelastic shares with us (``torchelastic-events-<destination>``): if
    torchelastic attaches its own handler there too (its module imported after we logged), ours stands aside, so
    each event, theirs and ours, is printed once."""

    def __init__(self, destination: str, inner: logging.Handler) -> None:
        super().__init__()
        self.destination = destination
        self.inner = inner

    def handle(self, record: logging.LogRecord) -> bool:
        theirs = _torch_handler(self.destination)
        logger = _events_loggers.get(self.destination)
        if theirs is not None and logger is not None and theirs in logger.handlers:
            return False
        return bool(self.inner.handle(record))

    def emit(self, record: logging.LogRecord) -> None:  # handle() above does the work
        self.inner.emit(record)


def _shared_builtin_handler(destination: str) -> logging.Handler:
    """The handler to attach for a destination: torchelastic's own object for a built-in destination when its
    module is loaded (so the shared logger has one), else ours (standing aside if torchelastic comes later)."""
    handler = get_logging_handler(destination)
    if handler is not _BUILTIN_HANDLERS.get(destination):
        return handler  # registered by the user: theirs to keep
    theirs = _torch_handler(destination)
    return theirs if theirs is not None else _YieldToTorch(destination, handler)


def _get_or_create_logger(destination: str = "null") -> logging.Logger:
    logger = _events_loggers.get(destination)
    if logger is not None:
        return logger
    with _lock:
        logger = _events_loggers.get(destination)
        if logger is None:
            handler = _attached[destination] = _shared_builtin_handler(destination)
            logger = logging.getLogger(f"torchelastic-events-{destination}")
            logger.setLevel(os.environ.get("LOGLEVEL", "INFO"))
            logger.propagate = False
            logger.addHandler(handler)
            _events_loggers[destination] = logger
    return logger


def _elastic_json(event: Any) -> str:
    """What torchelastic logs: its own four keys for an Event (so its ``Event.deserialize`` reads our lines), the
    event's own ``serialize()`` otherwise."""
    if isinstance(event, Event):
        source = getattr(event.source, "_value_", event.source)
        return json.dumps(
            {"name": event.name, "source": source, "timestamp": event.timestamp, "metadata": event.metadata}
        )
    return str(event.serialize())


def _log_to(destination: str, event: Any) -> None:
    """Log the event's JSON to a destination, unless it is null. Never raises."""
    handler = _log_handlers.get(destination)
    if handler is None:
        if destination not in _warned_destinations:
            _warned_destinations.add(destination)
            warn_safely(
                f"telemetrain.events: unknown destination {destination!r}; the event is kept in telemetrain's own "
                "sinks only (register one with register_logging_handler)",
                RuntimeWarning,
                stacklevel=3,
            )
        return
    if isinstance(handler, logging.NullHandler):
        return
    try:
        _get_or_create_logger(destination).info(_elastic_json(event))
    except Exception as exc:  # noqa: BLE001 - a logging failure must not reach the caller
        if destination not in _warned_destinations:
            _warned_destinations.add(destination)
            warn_safely(f"telemetrain.events: logging to {destination!r} failed: {exc!r}", RuntimeWarning, stacklevel=3)
