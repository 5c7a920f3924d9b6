"""Drop-in for ``torch.distributed.elastic.events``, plus the native event call.

``record(event, destination)`` stamps the event (torchelastic leaves ``timestamp`` at 0), puts it in the native
pipeline (run store, console, ...) and, for a destination other than ``"null"``, logs its JSON to the
``torchelastic-events-<destination>`` logger as torchelastic does. An unknown destination is warned about once and
does not raise. Differences from torchelastic are listed in docs/compat.md.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Mapping
from itertools import count
from typing import Any

from ..dispatch import describe, is_interrupt, warn_safely
from ..records import check_attribute_keys
from ..telemetry import _default, get_telemetry
from .api import _EVENT_FIELDS, _RDZV_FIELDS, _looks_like
from .api import Event as Event
from .api import EventMetadataValue as EventMetadataValue
from .api import EventSource as EventSource
from .api import NodeState as NodeState
from .api import RdzvEvent as RdzvEvent

_monotonic_ns = time.monotonic_ns

__all__ = [
    "Event",
    "EventHandler",
    "EventMetadataValue",
    "EventSource",
    "NodeState",
    "NullEventHandler",
    "RdzvEvent",
    "configure",
    "construct_and_record_rdzv_event",
    "event",
    "get_logging_handler",
    "record",
    "record_rdzv_event",
    "register_logging_handler",
]


ELASTIC_GROUP = "torchelastic"
# torch gives events no group; it sends rendezvous events to its "dynamic_rendezvous" destination, from the
# torch.distributed.elastic.rendezvous package. One group for them, whether they come through this drop-in or through
# torch's own module bridged by integrations.torchelastic (the launcher's agent).
RDZV_GROUP = "torchelastic.rendezvous"
_id_prefix = f"{os.getpid():x}-{time.monotonic_ns() & 0xFFFFFF:06x}"
_id_counter = count(1)


def _next_event_id() -> str:
    return f"{_id_prefix}-{next(_id_counter):x}"


def _reset_ids_after_fork() -> None:
    global _id_prefix, _id_counter, _lock
    _id_prefix = f"{os.getpid():x}-{time.monotonic_ns() & 0xFFFFFF:06x}"
    _id_counter = count(1)
    _lock = threading.Lock()  # a fork while another thread held it must not leave the child stuck


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_ids_after_fork)


# -- destinations (torchelastic's logging handlers) ------------------------------------------------------------------

_log_handlers: dict[str, logging.Handler] = {
    "console": logging.StreamHandler(),
    "dynamic_rendezvous": logging.NullHandler(),
    "null": logging.NullHandler(),
}
_events_loggers: dict[str, logging.Logger] = {}
_attached: dict[str, logging.Handler] = {}  # the handler we attached to each destination's logger
_warned_destinations: set[str] = set()
_lock = threading.Lock()


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
            warn_safely(f"telemetrain.events: logging to {destination!r} failed: {describe(exc)}", RuntimeWarning,
                        stacklevel=3)


# -- handlers (the API the TorchElastic customization doc describes) -------------------------------------------------


class EventHandler:
    """Receives every recorded ``Event`` (in the caller's thread; a handler that raises is contained)."""

    def record(self, event: Event) -> None:
        raise NotImplementedError


class NullEventHandler(EventHandler):
    def record(self, event: Event) -> None:
        pass


_HANDLER_KEY = "telemetrain.events.handler"
# handlers whose failure was warned: id -> a weak reference (or the handler, if it takes none), so that a new handler
# reusing a dead one's id is still warned about
_warned_handlers: dict[int, Any] = {}


def _first_failure(handler: EventHandler) -> bool:
    seen = _warned_handlers.get(id(handler))
    if seen is not None and (seen() if isinstance(seen, weakref.ref) else seen) is handler:
        return False
    try:
        _warned_handlers[id(handler)] = weakref.ref(handler)
    except TypeError:  # no weak references (``__slots__``): kept alive, as a configured handler is anyway
        _warned_handlers[id(handler)] = handler
    return True


def configure(handler: EventHandler) -> None:
    """Send every recorded ``Event`` to ``handler`` too (the default is ``NullEventHandler``)."""
    if not isinstance(handler, EventHandler):
        raise TypeError(f"handler must be an EventHandler, got {type(handler).__name__}")
    t = get_telemetry()
    t.extensions[_HANDLER_KEY] = handler
    global _configured
    # record() checks this pair instead of a dict lookup: (the Telemetry it was configured on, the handler)
    _configured = None if isinstance(handler, NullEventHandler) else (t, handler)


_configured: tuple[Any, EventHandler] | None = None


def _call_handler(handler: EventHandler, ev: Any) -> None:
    try:
        handler.record(ev)
    except BaseException as exc:  # contained like a sink's failure, whatever it is
        if is_interrupt(exc):  # the user's Ctrl-C (containment.is_interrupt)
            raise
        if _first_failure(handler):
            warn_safely(
                f"telemetrain.events: handler {type(handler).__name__} raised {describe(exc)}; the event is kept, "
                "further failures of this handler are not warned",
                RuntimeWarning,
                stacklevel=4,
            )


def record(event: Event, destination: str = "null") -> None:
    """Record a torchelastic ``Event`` (ours, or torchelastic's own class): stamp it, send it to telemetrain's sinks,
    the configured handler and the logging destination.

    In the run store it is an ``event`` record of group ``torchelastic`` whose attributes are the metadata plus
    ``torchelastic.source`` and ``torchelastic.timestamp`` (the event's own time, in ms)."""
    ours = type(event) is Event or isinstance(event, Event)
    if not ours and not _looks_like(event, _EVENT_FIELDS):
        raise TypeError(f"event must be a telemetrain.events.Event, got {type(event).__name__}")
    # what the run store writes must be valid JSON: a name or metadata of another type is the caller's error
    if type(event.name) is not str and not isinstance(event.name, str):
        raise TypeError(f"event.name must be a str, got {type(event.name).__name__}")
    md = event.metadata
    if type(md) is not dict:
        if md is not None and not isinstance(md, Mapping):
            raise TypeError(f"event.metadata must be a dict, got {type(md).__name__}")
        md = dict(md or {})
    for key in md:  # keys must be str (see Telemetry.event)
        if type(key) is not str:
            check_attribute_keys(md, "event.metadata")  # a str subclass passes; anything else raises
    t = _default.telemetry or get_telemetry()
    mono = _monotonic_ns()
    if ours:
        if not event.id:  # first record of this Event object: id, and the times the caller left unset
            event.id = _next_event_id()
            if not event.timestamp:
                event.timestamp = (mono + t._wall_offset_ns) // 1_000_000
            if not event.mono_ns:
                event.mono_ns = mono
        event_id = event.id
    else:  # torchelastic's own Event: stamped as ours are, but it has no id field to keep one in
        if not event.timestamp:
            event.timestamp = (mono + t._wall_offset_ns) // 1_000_000
        event_id = _next_event_id()
    route = t._event_routes.get(ELASTIC_GROUP)
    if route is None:
        route = t._resolve("event", ELASTIC_GROUP)
    if route:
        # attributes flattened to the end of the packed record, keys then values (see records.ATTRIBUTE_LAYOUT);
        # ``_value_`` directly because Enum's ``.value`` is a slow descriptor, and a plain str source passes through
        source = getattr(event.source, "_value_", event.source)
        route(
            (
                "event",
                mono,
                t._token,
                ELASTIC_GROUP,
                event.name,
                "info",
                event_id,
                "",
                *md,
                "torchelastic.source",
                "torchelastic.timestamp",
                *md.values(),
                source,
                event.timestamp,
            )
        )
    configured = _configured
    if configured is not None and configured[0] is t:
        _call_handler(configured[1], event)
    if destination != "null":
        _log_to(destination, event)


def record_rdzv_event(event: RdzvEvent) -> None:
    """Record a rendezvous event (ours, or torchelastic's own class): telemetrain's sinks (group
    ``torchelastic.rendezvous``, severity ``error`` for ``FAILED``) and the ``dynamic_rendezvous`` destination."""
    if not isinstance(event, RdzvEvent) and not _looks_like(event, _RDZV_FIELDS):
        raise TypeError(f"event must be an RdzvEvent, got {type(event).__name__}")
    t = _default.telemetry or get_telemetry()
    route = t.route("event", RDZV_GROUP)
    if route:
        fields = {
            f: getattr(event, f, None) for f in (*_RDZV_FIELDS, "master_endpoint", "rank", "local_id", "error_trace")
        }
        attributes = {k: getattr(v, "_value_", v) for k, v in fields.items() if k != "name"}
        failed = getattr(event.node_state, "_value_", event.node_state) == NodeState.FAILED.value
        # packed directly: torchelastic allows an empty name, which the native event() call refuses
        route(
            (
                "event",
                _monotonic_ns(),
                t._token,
                RDZV_GROUP,
                str(event.name or ""),
                "error" if failed else "info",
                _next_event_id(),
                "",
                *attributes,
                *attributes.values(),
            )
        )
    _log_to("dynamic_rendezvous", event)


@functools.lru_cache(maxsize=1)
def _fqdn() -> str:
    """``socket.getfqdn()`` can take a DNS round trip; rendezvous heartbeats would pay it every time."""
    return socket.getfqdn()


def construct_and_record_rdzv_event(
    run_id: str,
    message: str,
    node_state: NodeState,
    name: str = "",
    hostname: str = "",
    pid: int | None = None,
    master_endpoint: str = "",
    local_id: int | None = None,
    rank: int | None = None,
) -> None:
    """Build and record a rendezvous event named ``<caller file>:<name or caller function>``.

    Returns at once when neither telemetrain's sinks nor the ``dynamic_rendezvous`` destination would take it.
    The caller is found with ``sys._getframe`` (torchelastic uses ``inspect.stack()``, which reads every file).
    """
    t = _default.telemetry or get_telemetry()
    if not t.listening("event", RDZV_GROUP) and isinstance(
        get_logging_handler("dynamic_rendezvous"), logging.NullHandler
    ):
        return
    try:
        caller = sys._getframe(1)
    except ValueError:  # no Python caller (a thread's entry point): torchelastic's own fallback
        file_name = "no_file"
    else:
        file_name = os.path.basename(caller.f_code.co_filename)
        if not name:
            name = caller.f_code.co_name
        del caller
    event = RdzvEvent(
        name=f"{file_name}:{name}",
        run_id=run_id,
        message=message,
        hostname=hostname or _fqdn(),
        pid=pid or os.getpid(),  # as torchelastic: 0 means "this process" too
        node_state=node_state,
        master_endpoint=master_endpoint,
        rank=rank,
        local_id=local_id,
        error_trace=traceback.format_exc() if node_state == NodeState.FAILED else "",
    )
    record_rdzv_event(event)


# -- the native call ---------------------------------------------------------------------------------------------------


def event(
    name: str,
    attributes: dict[str, Any] | None = None,
    *,
    severity: str = "info",
    group: str = "events",
) -> None:
    """Record a native event on the default ``Telemetry``: a name, attributes and a severity."""
    (_default.telemetry or get_telemetry()).event(name, attributes, severity=severity, group=group)


# as torch's package: ``events.handlers`` works after ``import ...events`` (last: it re-exports this module's names)
from . import api, handlers  # noqa: E402, F401
