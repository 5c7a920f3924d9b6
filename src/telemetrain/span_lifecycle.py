"""The ``Span`` object: one span's lifecycle (``with``: enter/exit; callback-style: begin/end; exported late when it
fails unsampled), its ids and its ``span_start``/``span_end``/``SPAN_PAIR`` records. ``spans`` builds on it: the
``Tracer`` (sampling, listeners, open spans, the tick, ``terminated`` at close), ``span()`` and ``current_span()``;
import them from there (its docstring describes spans as users see them).

The hot path of ``with span(...)`` (``Span.__enter__``/``__exit__``) reads only this module's globals: the ids' salt
and counter, which ``_reseed`` rebinds (after a fork), live here with it.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from .dispatch import describe
from .process_hooks import received_signal
from .records import SPAN_PAIR, span_hex, trace_hex

if TYPE_CHECKING:
    from .spans import Tracer

__all__ = ["STATUS_ERROR", "STATUS_OK", "STATUS_TERMINATED", "Span", "describe_end", "is_signal_kill",
           "is_user_interrupt"]

F = TypeVar("F", bound=Callable[..., Any])
_mono = time.monotonic_ns
_current: ContextVar[Span | None] = ContextVar("telemetrain_current_span", default=None)
_current_get = _current.get
_current_set = _current.set
_current_reset = _current.reset
_thread_id = threading.get_ident

STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_TERMINATED = "terminated"
_STATUSES = (STATUS_OK, STATUS_ERROR, STATUS_TERMINATED)


def is_user_interrupt(error: str) -> bool:
    """A span's error saying a Ctrl-C ended it: a ``KeyboardInterrupt`` raised through its ``with`` block, one that
    was uncaught when telemetry closed it at exit, or our handler dying of SIGINT (``spans._closed_because``). The
    findings and goodput call such a span's run interrupted, not a crash."""
    return error.startswith("KeyboardInterrupt") or error.endswith(("uncaught KeyboardInterrupt", "stopped by SIGINT"))


def is_signal_kill(error: str) -> bool:
    """A span's error saying a SIGTERM ended it (a preemption): our handler dying of it, or an exit or exception
    after it (``describe_end``). Goodput, ``show --list`` and the findings call its run killed, as MLflow does."""
    return error.endswith("stopped by SIGTERM")


def describe_end(exc: BaseException) -> str:
    """The error of a span an exception ended: ``describe``'s, and, after a SIGTERM/SIGINT that a Python handler
    got (``process_hooks.received_signal``), ``...; the process was stopped by SIGTERM``: the ``sys.exit(1)`` of
    a user's handler or Lightning's ``SIGTERMException`` is the signal's doing, not a crash."""
    signal = received_signal()
    text = describe(exc)
    return text if signal is None else f"{text}; the process was stopped by {signal}"


# ``end_status`` in SQL, over a span end's ``status`` and ``error`` columns (the readers' SQL paths say what their
# Python paths say)
END_STATUS_SQL = ("CASE WHEN status = 'ok' THEN status WHEN error LIKE 'KeyboardInterrupt%' OR error LIKE "
                  "'%uncaught KeyboardInterrupt' OR error LIKE '%stopped by SIGINT' THEN 'interrupt' "
                  "WHEN error LIKE '%stopped by SIGTERM' THEN 'killed' ELSE status END")


def end_status(status: str, error: str | None) -> str:
    """A span end's status: ``interrupt`` for one a Ctrl-C ended, ``killed`` for one a SIGTERM ended (a
    preemption), else its own (``END_STATUS_SQL`` in Python)."""
    if status == STATUS_OK:
        return status
    if is_user_interrupt(error or ""):
        return "interrupt"
    return "killed" if is_signal_kill(error or "") else status

# -- ids: span ids a random 32-bit process salt above a 32-bit counter; trace ids random (W3C); redrawn after fork -----

_rng = random.Random()  # our own generator: a program's random.seed(0) must not make every rank's trace ids equal
_random_bits = _rng.getrandbits
_salt = 0
_next_id: Callable[[], int] = itertools.count(1).__next__


def _reseed() -> None:
    global _salt, _next_id
    _rng.seed(int.from_bytes(os.urandom(16), "big") ^ os.getpid())
    _salt = _rng.getrandbits(32) << 32
    _next_id = itertools.count(1).__next__


def _new_trace_id() -> int:
    """A root span's trace id: 128 random bits, as W3C Trace Context (level 2, the ``random`` flag) asks, so a
    ``TraceIdRatioBased`` sampler (which reads the low 64 bits) keeps the ratio of a process's traces, not all or
    none of them. Only root spans draw one (~0.1 us)."""
    return _random_bits(128) or 1


_reseed()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed)


def _new_span_id() -> int:
    n = _next_id()
    if n >= 1 << 32:  # four billion spans in one process: a new salt
        _reseed()
        n = _next_id()
    return _salt | n


class Span:
    """One span: ``with`` it once, or decorate a function with it (every call is then a new span with its name,
    group and attributes). ``Tracer.start`` returns one to ``end()`` later."""

    __slots__ = (
        "__weakref__",
        "_active",
        "_export_id",
        "_owner",
        "_pending",
        "_restore",
        "_route",
        "_token",
        "_tracer",
        "attributes",
        "end_ns",
        "error",
        "group",
        "name",
        "parent",
        "span_id",
        "start_attributes",
        "start_ns",
        "status",
        "trace_id",
    )

    name: str
    group: str
    span_id: int  # 0 while not exported (drawn when it is)
    trace_id: int
    parent: Span | None
    start_ns: int
    end_ns: int
    status: str
    error: str
    start_attributes: dict[str, Any] | None
    attributes: dict[str, Any] | None
    _tracer: Tracer
    _export_id: int  # its own id when exported, else the nearest exported ancestor's (0: none)
    _route: Any  # the end record's route; None: exported, nobody listens; False: not exported
    _pending: bool  # exported, and its start record is not written yet (it travels with the end: SPAN_PAIR)
    _token: Any
    _restore: Span | None  # started with make_current: the span to make current again at its end
    _active: Span | None  # a quiet span current, in its owner thread, wherever this one is (Tracer.quiet)
    _owner: int  # a quiet span's thread (threading.get_ident)

    def __init__(self, tracer: Tracer, name: str, group: str, attributes: dict[str, Any] | None) -> None:
        # (built by span(), Tracer.span/start/child: an __init__ is cheaper than setting slots from outside)
        self._tracer = tracer
        self.name = name
        self.group = group
        self.start_attributes = attributes
        self.attributes = None
        self.status = STATUS_OK
        self.error = ""
        self.start_ns = 0
        self.end_ns = 0
        self._active = None

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def __enter__(self) -> Span:
        # The hot path of ``with span(...)``: kept flat (every call and attribute counts; bench_training.py).
        if self.start_ns:
            raise RuntimeError(f"span {self.name!r} was already started: a span is entered once")
        tracer = self._tracer
        parent = _current_get()
        if parent is not None and parent._active is not None and parent._active._owner == _thread_id():
            parent = parent._active
        self.parent = parent
        exported = parent is None or parent._route is not False
        if exported and tracer._every and self.name in tracer._every:
            exported = tracer._sampled(self.name)
        if exported:
            n = _next_id()
            self.span_id = self._export_id = _salt | n if n < 0xFFFFFFFF else _new_span_id()
            self.trace_id = _new_trace_id() if parent is None else parent.trace_id
            group = self.group
            routes = tracer._span_routes.get(group)
            if routes is None:
                routes = tracer._routes_for(group)
            if routes[2]:  # the start travels with the end, unless the span outlives a tick (Tracer.tick)
                self._route = routes[1]
                self._pending = True
                tracer._deferred.add(self)
                if not tracer._ticking:
                    tracer._start_ticking()
                self.start_ns = _mono()
            else:
                self._route = routes[1] or None
                self._pending = False
                self.start_ns = _mono()
                if routes[0]:
                    _write_start(routes[0], self)
                tracer._started[self] = self
        else:
            self.span_id = 0
            if parent is None:
                self.trace_id = self._export_id = 0
            else:
                self.trace_id = parent.trace_id
                self._export_id = parent._export_id
            self._route = False
            self._pending = False
            self.start_ns = _mono()
        self._token = _current_set(self)
        return self

    def _begin(self, parent: Span | None, start_ns: int | None) -> None:
        """Start a callback-style span (``Tracer.start``): its start record is written now (such spans are the long
        ones: application, training loop, checkpoint save)."""
        tracer = self._tracer
        self.parent = parent
        exported = parent is None or parent._route is not False
        if exported and tracer._every:
            exported = tracer._sampled(self.name)
        self._pending = False
        self._token = None
        if exported:
            self._export(start_ns if start_ns is not None else _mono())
        else:
            self.span_id = 0
            self.trace_id = parent.trace_id if parent is not None else 0
            self._export_id = parent._export_id if parent is not None else 0
            self._route = False
            self.start_ns = start_ns if start_ns is not None else _mono()
        tracer._started[self] = self

    def _export(self, start_ns: int) -> None:
        """Draw its ids and write its start record (at ``start_ns``, a past time when exported late)."""
        parent = self.parent
        self.span_id = self._export_id = _new_span_id()
        self.trace_id = _new_trace_id() if parent is None else parent.trace_id
        self.start_ns = start_ns
        start_route, end_route, _ = self._tracer._routes_for(self.group)
        self._route = end_route or None
        if start_route:
            _write_start(start_route, self)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any, end_ns: int | None = None) -> None:
        end = _mono() if end_ns is None else end_ns
        token = self._token
        if token is not None:
            self._token = None
            try:
                _current_reset(token)
            except ValueError:  # exited in another context than it entered (a generator moved across tasks)
                _current_set(self.parent)
        if self.end_ns:
            return
        self.end_ns = end
        if exc is not None and self.status == STATUS_OK:
            self.status = STATUS_ERROR
            self.error = describe_end(exc)
        route = self._route
        tracer = self._tracer
        if route:
            if self._pending:
                # set.remove decides, atomically, between this end and a tick writing the start (Tracer.tick)
                try:
                    tracer._deferred.remove(self)
                except KeyError:  # the tick took it: its start record is written
                    _write_end(route, self, end)
                else:
                    start = self.start_ns
                    parent = self.parent
                    before = self.start_attributes
                    after = self.attributes
                    if before or after:
                        before = before or {}
                        after = after or {}
                        route((SPAN_PAIR, start, tracer.telemetry._token, self.group, self.name, self.span_id,
                               parent.span_id if parent is not None else 0, self.trace_id, end - start, self.status,
                               self.error, len(before), *before, *before.values(), *after, *after.values()))
                    elif self.status == STATUS_OK:  # the short form: status ok and no error are left out
                        route((SPAN_PAIR, start, tracer.telemetry._token, self.group, self.name, self.span_id,
                               parent.span_id if parent is not None else 0, self.trace_id, end - start))
                    else:
                        route((SPAN_PAIR, start, tracer.telemetry._token, self.group, self.name, self.span_id,
                               parent.span_id if parent is not None else 0, self.trace_id, end - start, self.status,
                               self.error))
                    if tracer._listeners:
                        listeners = tracer._listeners.get(self.name)
                        if listeners:
                            tracer._notify(self, listeners)
                    return  # (a deferred span is not in _started)
            else:
                _write_end(route, self, end)
        elif route is False and self.status == STATUS_ERROR:
            tracer._export_late(self)  # failures are always visible, sampled or not
        listeners = tracer._listeners.get(self.name)
        if listeners:
            tracer._notify(self, listeners)
        if tracer._started:
            tracer._started.pop(self, None)

    def end(self, status: str | None = None, error: str = "", *, end_ns: int | None = None) -> None:
        """End a span started with ``Tracer.start`` (a second end is ignored); ``end_ns`` (monotonic) backdates the
        end. If it is the current span, its parent becomes current again."""
        if self.end_ns or not self.start_ns:
            return
        if end_ns is not None:
            if type(end_ns) is not int:
                raise TypeError(f"end_ns must be an int (monotonic ns), got {type(end_ns).__name__}")
            end_ns = max(end_ns, self.start_ns)  # never a negative duration
        if status is not None:
            self.set_status(status, error)
        if self._token is None and _current_get() is self:
            # what was current when it started (or its parent), skipping spans that have ended meanwhile
            restore = getattr(self, "_restore", self.parent)
            while restore is not None and restore.end_ns:
                restore = restore.parent
            _current_set(restore)
        self.__exit__(None, None, None, end_ns)

    # -- reading ---------------------------------------------------------------------------------------------------

    @property
    def span_id_hex(self) -> str:
        """16 hex digits; "" before the start and while not exported (sampled out)."""
        return span_hex(self.span_id) if self.start_ns else ""

    @property
    def trace_id_hex(self) -> str:
        return trace_hex(self.trace_id) if self.start_ns else ""

    @property
    def parent_id(self) -> int:
        return self.parent.span_id if self.start_ns and self.parent is not None else 0

    @property
    def exported(self) -> bool:
        return bool(self.start_ns) and self._route is not False

    @property
    def ended(self) -> bool:
        return self.end_ns != 0

    @property
    def duration_ns(self) -> int:
        """Nanoseconds from start to end (to now while open; 0 before the start)."""
        if not self.start_ns:
            return 0
        return (self.end_ns or _mono()) - self.start_ns

    # -- updating --------------------------------------------------------------------------------------------------

    def set_attribute(self, key: str, value: Any) -> None:
        """Set (or replace) an attribute; written with the end record."""
        if type(key) is not str:
            raise TypeError(f"attribute keys must be str, got {type(key).__name__}")
        if self.attributes is None:
            self.attributes = {key: value}
        else:
            self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def add_attribute(self, name: str, value: Any) -> None:
        """one-logger's name for ``set_attribute`` (its README calls it on the span a context manager yields)."""
        self.set_attribute(name, value)

    def add_attributes(self, attributes: Mapping[str, Any]) -> None:
        """one-logger's name for ``set_attributes``; also takes one-logger ``Attributes`` (``{name: Attribute}``)."""
        from .training.attributes import Attribute

        for key, value in attributes.items():
            self.set_attribute(key, value.value if isinstance(value, Attribute) else value)

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None, *, severity: str = "info") -> None:
        """Record an event that happened inside this span (linked to it, or to its nearest exported ancestor)."""
        export_id = self._export_id if self.start_ns else 0
        self._tracer.telemetry.event(name, attributes, severity=severity, group=self.group,
                                     span_id=span_hex(export_id))

    def set_status(self, status: str, error: str = "") -> None:
        if status not in _STATUSES:
            raise ValueError(f"status must be ok, error or terminated, got {status!r}")
        if type(error) is not str:
            raise TypeError(f"error must be a str, got {type(error).__name__}")
        self.status = status
        self.error = error

    def __call__(self, fn: F) -> F:
        """``@span("name")``: every call of ``fn`` is a new span with this one's name, group and attributes."""
        if self.start_ns:
            raise RuntimeError("a span that was entered cannot decorate; use span(...) itself as the decorator")
        return _decorate(self._tracer, self.name, self.group, self.start_attributes, fn)

    def __repr__(self) -> str:
        if not self.start_ns:
            return f"Span({self.name!r}, not started)"
        state = "open" if not self.end_ns else f"{self.status} {self.duration_ns / 1e6:.3f} ms"
        return f"Span({self.name!r}, {self.span_id_hex or 'not exported'}, {state})"


def _write_start(route: Any, s: Span) -> None:
    """``s``'s start record, at its own start time (``(mono, wall)`` when that is in the past: exported late)."""
    parent = s.parent
    attributes = s.start_attributes or {}
    route(("span_start", s.start_ns, s._tracer.telemetry._token, s.group, s.name, s.span_id,
           parent.span_id if parent is not None else 0, s.trace_id, *attributes, *attributes.values()))


def _write_end(route: Any, s: Span, end: int) -> None:
    attributes = s.attributes
    if attributes:
        route(("span_end", end, s._tracer.telemetry._token, s.group, s.name, s.span_id, end - s.start_ns, s.status,
               s.error, *attributes, *attributes.values()))
    else:
        route(("span_end", end, s._tracer.telemetry._token, s.group, s.name, s.span_id, end - s.start_ns, s.status,
               s.error))


def _decorate(tracer: Tracer, name: str, group: str, attributes: dict[str, Any] | None, fn: F) -> F:
    if not callable(fn):
        raise TypeError(f"span(...) decorates a function, got {type(fn).__name__}")

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            with tracer._new(name, group, attributes):
                return await fn(*args, **kwargs)

        return traced_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        with tracer._new(name, group, attributes):
            return fn(*args, **kwargs)

    return traced  # type: ignore[return-value]
