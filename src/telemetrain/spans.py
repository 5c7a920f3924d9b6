"""Spans: timed, nested units of work (``application`` > ``training_loop`` > an iteration > ``model_forward``...).

``span(name, **attributes)`` is a context manager and a decorator. The current span lives in a ``ContextVar``, so
nesting follows threads and asyncio tasks; a span started in a fresh thread has no parent unless one is passed.
Each exported span writes a start record and an end record with its duration, status (``ok``; ``error`` with the
exception's type and message; ``terminated`` when it was still open when its ``Telemetry`` closed: at exit, on
SIGTERM) and the attributes set after the start. A callback-style span (``Tracer.start``) writes its start when it
opens; a ``with`` span's start travels with its end in one tuple (``records.SPAN_PAIR``) unless it is still open at
the tracer's next tick (every flush interval), which writes it then: so a span open at a crash is in the store unless
it began within the last tick or two, like any record still queued. ``Span.add_event``
records an event linked to it.

Ids are OpenTelemetry-shaped: a 128-bit trace id shared by a root span and its descendants and a 64-bit span id
(written as 32 and 16 hex digits). In flight they are ints, formatted by the consumer: a span id is a random
per-process high half over a counter (no ``os.urandom`` per span); a root's trace id is 128 random bits from a
generator of our own (W3C's random trace ids: a ratio sampler splits them).

Sampling, per span name (``Tracer.sample(name, every=N)``): only every N-th span of that name is exported; the others
still time themselves and call their ``on_end`` listeners (which is how every training iteration feeds the stats
while one in N is written). A span inside an unexported one is not exported either (parent-based, so the parent of
every exported span is in the store); an event inside one is linked to the nearest exported ancestor. A span that
ends with an error is exported anyway (its start record is written then, with its real start time).

"terminated": at close, the Tracer ends every span still open, in any thread (it keeps them: ``open_spans``); a
``with`` span so ended still makes its parent current again when its block exits.

The hot path (enter + exit) is three Python calls, two clock reads, one appended tuple and a ContextVar set/reset;
everything else is deferred to the writer thread (``bench/bench_training.py`` measures it).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar

from .collector import collector
from .dispatch import describe, is_interrupt, warn_safely
from .records import SPAN_PAIR, check_attribute_keys, span_hex, trace_hex
from .telemetry import Telemetry, _default, check_name, get_telemetry

__all__ = ["Span", "Tracer", "current_span", "span", "tracer"]

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
_UNSET: Any = object()

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
            self.error = describe(exc)
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


class Tracer:
    """The spans of one ``Telemetry``: sampling per name, listeners, and the spans to end as ``terminated`` when the
    Telemetry closes."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self._every: dict[str, int] = {}
        self._seen: dict[str, int] = {}
        self._listeners: dict[str, tuple[Callable[[Span], None], ...]] = {}
        # open spans whose start record is written (or that are not exported), and open exported spans whose start
        # waits to travel with their end (by span id): together, every open span of every thread
        self._started: dict[Span, Span] = {}
        self._deferred: set[Span] = set()
        # the Telemetry's span route table (cleared in place, never replaced): one dict lookup per span
        self._span_routes = telemetry._router.span_routes
        self._tick_ns = max(int(telemetry.flush_interval * 1e9), 50_000_000)
        self._ticking = False
        self._lock = threading.Lock()
        self._warned = False
        telemetry.add_producer(self)

    # -- configuration ---------------------------------------------------------------------------------------------

    def sample(self, name: str, every: int) -> None:
        """Export only every ``every``-th span called ``name`` (the first, then every N-th); 1 exports all."""
        name = check_name(name, "name")
        if type(every) is not int or every < 1:
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        with self._lock:
            if every == 1:
                self._every.pop(name, None)
            else:
                self._every[name] = every

    def on_end(self, name: str, listener: Callable[[Span], None]) -> None:
        """Call ``listener(span)`` when any span called ``name`` ends, exported or not (in the thread that ends it)."""
        name = check_name(name, "name")
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {type(listener).__name__}")
        with self._lock:
            self._listeners[name] = (*self._listeners.get(name, ()), listener)

    # -- starting --------------------------------------------------------------------------------------------------

    def span(self, name: str, *, group: str = "spans", device: bool = False, **attributes: Any) -> Span:
        """A span to enter with ``with`` (once), or to decorate a function with. ``device=True``: also timed on the
        device (``training.device_timing``)."""
        if type(name) is not str or not name:
            name = check_name(name, "name")
        if type(group) is not str or not group:
            group = check_name(group, "group")
        if device is not False:
            _device_flag(device, attributes)
        s = self._new(name, group, attributes or None)
        if device is True:
            s.__class__ = _device_span_class()
        return s

    def start(
        self,
        name: str,
        *,
        group: str = "spans",
        parent: Span | None = None,
        start_ns: int | None = None,
        attributes: Mapping[str, Any] | None = None,
        make_current: bool = True,
        device: bool = False,
    ) -> Span:
        """Start a span to end later with ``Span.end`` (callback-style APIs). ``parent`` defaults to the current span;
        ``start_ns`` (monotonic ns) backdates it; ``make_current``: spans started after it in this context are its
        children until it ends; ``device=True``: also timed on the device (``training.device_timing``)."""
        if parent is not None and not isinstance(parent, Span):
            raise TypeError(f"parent must be a Span, got {type(parent).__name__}")
        if attributes is not None and not isinstance(attributes, Mapping):
            raise TypeError(f"attributes must be a mapping, got {type(attributes).__name__}")
        if attributes:
            check_attribute_keys(attributes, "attributes")
        if start_ns is not None and type(start_ns) is not int:
            raise TypeError(f"start_ns must be an int (monotonic ns), got {type(start_ns).__name__}")
        s = self.span(name, group=group, device=device)
        s.start_attributes = dict(attributes) if attributes else None
        current = _current_get()
        if parent is None:
            parent = _effective(current)
        if device is True:
            s._device_start()  # type: ignore[attr-defined]
        s._begin(parent, start_ns)
        if make_current:
            s._restore = current
            _current_set(s)
        return s

    def child(self, name: str, group: str, parent: Span) -> Span:
        """``start(name, group=group, parent=parent)`` without the argument checks and the sampling (the training
        recorder samples its iterations itself). Made current; ``end()`` it."""
        s = Span(self, name, group, None)
        s._restore = _current_get()
        s._begin(parent, None)
        _current_set(s)
        return s

    def quiet(self, name: str, group: str, parent: Span) -> Span:
        """A span under ``parent`` that is not exported, for an owner that restarts it many times: the recorder's
        sampled-out iterations. For each use the owner sets ``start_ns`` and makes it the ``_active`` span of the
        current span -- so it is current wherever that span is, in this thread, without the cost of a ContextVar set
        (~1.5k instructions each way) -- and clears that at its end; it ``end()``s it only to retire it. As for any
        unexported span, spans inside it are not exported, and a failure inside it exports it (it is then ended and
        retired like any span). Other threads, whose current span may be the same, do not see it."""
        s = Span(self, name, group, None)
        s._owner = _thread_id()
        s.parent = s._restore = parent
        s.span_id = 0
        s.trace_id = parent.trace_id
        s._export_id = parent._export_id
        s._route = False
        s._pending = False
        s._token = None
        s.start_ns = _mono()
        return s

    def _new(self, name: str, group: str, attributes: dict[str, Any] | None) -> Span:
        return Span(self, name, group, attributes)

    def _sampled(self, name: str) -> bool:
        every = self._every.get(name)
        if every is None:
            return True
        n = self._seen.get(name, 0)
        self._seen[name] = n + 1
        return n % every == 0

    def _routes_for(self, group: str) -> tuple[Any, Any, bool]:
        """The group's (start route, end route, paired); a paired group's short spans travel as one SPAN_PAIR, so
        the tick that writes the start of a long one must be running."""
        routes: tuple[Any, Any, bool] = self.telemetry.span_routes(group)
        if routes[2] and not self._ticking:
            self._start_ticking()
        return routes

    def _start_ticking(self) -> None:
        with self._lock:
            if not self._ticking:
                self._ticking = True
                collector.schedule(self, _mono() + self._tick_ns)

    def _notify(self, s: Span, listeners: tuple[Callable[[Span], None], ...]) -> None:
        for listener in listeners:
            try:
                listener(s)
            except BaseException as exc:  # a listener never breaks the traced code
                if is_interrupt(exc):
                    raise
                if not self._warned:
                    self._warned = True
                    warn_safely(f"telemetrain: a span listener failed: {describe(exc)}")

    def _export_late(self, s: Span) -> None:
        """An unexported span failed: export it (start and end, with its real times), and its unexported ancestors
        too (their start now, their end when they end), so its parent is in the store as for any exported span."""
        chain = [s]
        parent = s.parent
        while parent is not None and parent._route is False:
            chain.append(parent)
            parent = parent.parent
        for span in reversed(chain):  # outermost first: each parent's start precedes its children's
            span._export(span.start_ns)
        route = s._route
        if route:
            _write_end(route, s, s.end_ns)

    # -- the collector task: the start record of a span that outlives a tick ---------------------------------------

    def tick(self, now_ns: int) -> int | None:
        """Write the start record of every deferred span open for a tick or more, so that a span open at a crash
        is in the store (a shorter one is lost at a crash like any record still in the queue)."""
        deferred = self._deferred
        if deferred:
            started = self._started
            cutoff = now_ns - self._tick_ns
            for s in list(deferred):  # (list() copies in one C call: other threads add and remove spans meanwhile)
                if s.start_ns > cutoff:
                    continue
                try:
                    deferred.remove(s)
                except KeyError:  # its end has taken it
                    continue
                s._pending = False
                started[s] = s
                route = self._routes_for(s.group)[0]
                if route:
                    _write_start(route, s)
            for s in [s for s in list(started.values()) if s.end_ns]:  # ended while this tick held them
                started.pop(s, None)
        return None if self.telemetry.closed else now_ns + self._tick_ns

    # -- the Telemetry producer protocol ---------------------------------------------------------------------------

    def collect(self, final: bool) -> None:
        """At close (exit, SIGTERM): end what is still open with status ``terminated``, innermost first."""
        if not final:
            return
        open_spans = {id(s): s for s in (*self._started.values(), *self._deferred) if not s.end_ns}
        for s in iter_ancestors(_current_get()):
            if s._tracer is self and not s.end_ns:
                open_spans[id(s)] = s
        for s in sorted(open_spans.values(), key=lambda s: s.start_ns, reverse=True):
            s.status = STATUS_TERMINATED
            s.error = s.error or "still open when telemetry closed (exit or signal)"
            token = s._token
            if token is None:  # started with Tracer.start: end() makes what was current at its start current again
                s.end()
                continue
            # a `with` span: ended from here without touching the ContextVar (it may be another thread's context);
            # the token is kept, so the span's own `with` exit still makes its parent current again in its thread
            s._token = None
            s.__exit__(None, None, None)
            s._token = token
        if self._ticking:
            self._ticking = False
            collector.cancel(self)

    def after_fork_in_child(self) -> None:
        self._started = {}  # the parent's spans: the parent ends them
        self._deferred = set()
        self._ticking = False  # the child's collector has no task
        self._lock = threading.Lock()

    @property
    def open_spans(self) -> list[Span]:
        """Every span of this tracer still open, in any thread, oldest first."""
        spans = (*self._started.values(), *self._deferred)
        return sorted((s for s in spans if not s.end_ns), key=lambda s: s.start_ns)


def tracer(telemetry: Telemetry | None = None) -> Tracer:
    """The ``Tracer`` of ``telemetry`` (default: the default instance), created on first use."""
    t = telemetry if telemetry is not None else get_telemetry()
    found: Tracer = t.extension("tracer", Tracer)
    return found


# The last (Telemetry, Tracer) that span() looked up: most programs use one, so most spans skip the lookup.
_last: tuple[Telemetry | None, Tracer | None] = (None, None)


class span(Span):  # (lowercase: it is used as a function, span("name", **attributes))
    """``with span("model_forward", batch=3) as s:`` or ``@span("evaluate")``: a new ``Span`` of ``telemetry``'s
    tracer (default: the default instance's); see the module docstring. ``device=True`` also times it on the device,
    without a sync (``training.device_timing``). (A subclass rather than a function returning a Span: one Python call
    less per span.)"""

    __slots__ = ()

    def __init__(self, name: str, *, group: str = "spans", telemetry: Telemetry | None = None,
                 device: bool = False, **attributes: Any) -> None:
        global _last
        t = telemetry if telemetry is not None else _default.telemetry
        last = _last
        if t is last[0] and t is not None:
            tr: Tracer = last[1]  # type: ignore[assignment]
        else:
            tr = tracer(t)
            _last = (tr.telemetry, tr)
        if type(name) is not str or not name:
            name = check_name(name, "name")
        if type(group) is not str or not group:
            group = check_name(group, "group")
        if device is not False:
            _device_flag(device, attributes)
            if device is True:
                self.__class__ = _device_span_class()  # type: ignore[assignment]
        # Span.__init__'s fields, set here: calling it would cost the Python call this subclass exists to save
        self._tracer = tr
        self.name = name
        self.group = group
        self.start_attributes = attributes or None
        self.attributes = None
        self.status = STATUS_OK
        self.error = ""
        self.start_ns = 0
        self.end_ns = 0
        self._active = None


def _device_flag(device: Any, attributes: dict[str, Any]) -> None:
    """``device=`` of a span: ``True`` times it on the device too; any other value is an attribute named ``device``,
    as it was before the flag existed (``span("copy", device="cuda:0")``)."""
    if device is not True:
        attributes["device"] = device


_device_span: list[type[Span]] = []


def _device_span_class() -> type[Span]:
    if not _device_span:
        from .training.device_spans import DeviceSpan  # imported only by programs that ask for device timing

        _device_span.append(DeviceSpan)
    return _device_span[0]


def current_span() -> Span | None:
    """The span current in this thread or task (None outside any)."""
    return _effective(_current_get())


def _effective(s: Span | None) -> Span | None:
    """The span new spans take as parent where ``s`` is current: its quiet child when it has one active in this
    thread (``Tracer.quiet``), else ``s``."""
    if s is not None:
        active = s._active
        if active is not None and active._owner == _thread_id():
            return active
    return s


def iter_ancestors(s: Span | None) -> Iterator[Span]:
    """``s``, its parent, and so on up to the root."""
    while s is not None:
        yield s
        s = s.parent
