"""Spans: timed, nested units of work (``application`` > ``training_loop`` > an iteration > ``model_forward``...).

``span(name, **attributes)`` is a context manager and a decorator. The current span lives in a ``ContextVar``, so
nesting follows threads and asyncio tasks; a span started in a fresh thread has no parent unless one is passed.
Each exported span writes a start record when it opens (so a span still open at a crash is visible) and an end record
with its duration, status (``ok``; ``error`` with the exception's type and message; ``terminated`` when it was still
open when its ``Telemetry`` closed: at exit, on SIGTERM) and the attributes set after the start. ``Span.add_event``
records an event linked to it.

Ids are OpenTelemetry-shaped: a 128-bit trace id shared by a root span and its descendants and a 64-bit span id
(written as 32 and 16 hex digits). In flight they are ints -- a random per-process high half over a counter, so no
``os.urandom`` per span -- formatted by the consumer.

Sampling, per span name (``Tracer.sample(name, every=N)``): only every N-th span of that name is exported; the others
still time themselves and call their ``on_end`` listeners (which is how every training iteration feeds the stats
while one in N is written). A span inside an unexported one is not exported either (parent-based, so the parent of
every exported span is in the store); an event inside one is linked to the nearest exported ancestor. A span that
ends with an error is exported anyway (its start record is written then, with its real start time).

"terminated": at close, the Tracer ends the spans started with ``Tracer.start`` that are still open, and the ``with``
spans open in the closing thread's context (the main thread, for atexit and signal handlers). A ``with`` span open in
another thread at that moment is not seen; its start record stays without an end (the reader shows it open).

The hot path (enter + exit) is three Python calls, two clock reads, two appended tuples and a ContextVar set/reset;
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

from .dispatch import describe, warn_safely
from .records import span_hex
from .telemetry import Telemetry, check_name, get_telemetry

__all__ = ["Span", "Tracer", "current_span", "span", "tracer"]

F = TypeVar("F", bound=Callable[..., Any])
_mono = time.monotonic_ns
_current: ContextVar[Span | None] = ContextVar("telemetrain_current_span", default=None)
_current_get = _current.get
_current_set = _current.set
_current_reset = _current.reset

STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_TERMINATED = "terminated"
_STATUSES = (STATUS_OK, STATUS_ERROR, STATUS_TERMINATED)
_UNSET: Any = object()

# -- ids: a random 32-bit process salt above a 32-bit counter; redrawn in a forked child ---------------------------

_rng = random.Random()
_salt = 0
_trace_base = 0
_next_id: Callable[[], int] = itertools.count(1).__next__


def _reseed() -> None:
    global _salt, _next_id, _trace_base
    _rng.seed(int.from_bytes(os.urandom(16), "big") ^ os.getpid())
    _salt = _rng.getrandbits(32) << 32
    _trace_base = _rng.getrandbits(64) << 64  # a root span's trace id: this over its own span id
    _next_id = itertools.count(1).__next__


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
        "_export_id",
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
    span_id: int
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
    _route: Any  # the end record's route; False when not exported
    _token: Any
    _restore: Span | None  # started with make_current: the span to make current again at its end

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def __enter__(self, parent: Any = _UNSET, start_ns: int | None = None, make_current: bool = True) -> Span:
        # (Tracer.start calls this with its arguments: one body for both ways of starting a span)
        if self.start_ns:
            raise RuntimeError(f"span {self.name!r} was already started: a span is entered once")
        tracer = self._tracer
        if parent is _UNSET:
            parent = _current_get()
        self.parent = parent
        n = _next_id()
        self.span_id = span_id = _salt | n if n < 0xFFFFFFFF else _new_span_id()
        if parent is None:
            self.trace_id = trace_id = _trace_base | span_id  # unique per root span, no random draw per span
            parent_id = 0
            exported = True
        else:
            self.trace_id = trace_id = parent.trace_id
            parent_id = parent.span_id
            exported = parent._route is not False
        if tracer._every and exported:
            exported = tracer._sampled(self.name)
        self.start_ns = start = start_ns if start_ns is not None else _mono()
        if exported:
            self._export_id = span_id
            group = self.group
            route = tracer._start_routes.get(group)
            if route is None:
                route = tracer.telemetry.route("span_start", group)
            if route:
                attributes = self.start_attributes
                if attributes:
                    route(("span_start", start, tracer.telemetry._token, group, self.name, span_id, parent_id,
                           trace_id, *attributes, *attributes.values()))
                else:
                    route(("span_start", start, tracer.telemetry._token, group, self.name, span_id, parent_id,
                           trace_id))
            route = tracer._end_routes.get(group)
            if route is None:
                route = tracer.telemetry.route("span_end", group)
            self._route = route or None  # None: exported, but nobody listens to its end (still an exported parent)
        else:
            self._export_id = parent._export_id if parent is not None else 0
            self._route = False
        self._token = _current_set(self) if make_current else None
        return self

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
        if route:
            attributes = self.attributes
            if attributes:
                route(("span_end", end, self._tracer.telemetry._token, self.group, self.name, self.span_id,
                       end - self.start_ns, self.status, self.error, *attributes, *attributes.values()))
            else:
                route(("span_end", end, self._tracer.telemetry._token, self.group, self.name, self.span_id,
                       end - self.start_ns, self.status, self.error))
        elif route is False and self.status == STATUS_ERROR:
            self._tracer._export_late(self)  # failures are always visible, sampled or not
        tracer = self._tracer
        if tracer._listeners:
            tracer._notify(self)
        if tracer._started:
            tracer._started.pop(self.span_id, None)

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
        return span_hex(self.span_id) if self.start_ns else ""

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}" if self.start_ns else ""

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
        return f"Span({self.name!r}, {self.span_id_hex}, {state})"


_new_span = object.__new__


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
        self._started: dict[int, Span] = {}  # open spans started with start() (``with`` spans: the context chain)
        # the Telemetry's route tables (cleared in place, never replaced): one dict lookup per record
        self._start_routes = telemetry._router.routes["span_start"]
        self._end_routes = telemetry._router.routes["span_end"]
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

    def span(self, name: str, *, group: str = "spans", **attributes: Any) -> Span:
        """A span to enter with ``with`` (once), or to decorate a function with."""
        if type(name) is not str or not name:
            name = check_name(name, "name")
        if type(group) is not str or not group:
            group = check_name(group, "group")
        s: Span = _new_span(Span)
        s._tracer = self
        s.name = name
        s.group = group
        s.start_attributes = attributes or None
        s.attributes = None
        s.status = STATUS_OK
        s.error = ""
        s.start_ns = s.end_ns = 0
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
    ) -> Span:
        """Start a span to end later with ``Span.end`` (callback-style APIs). ``parent`` defaults to the current span;
        ``start_ns`` (monotonic ns) backdates it; ``make_current``: spans started after it in this context are its
        children until it ends."""
        if parent is not None and not isinstance(parent, Span):
            raise TypeError(f"parent must be a Span, got {type(parent).__name__}")
        if attributes is not None and not isinstance(attributes, Mapping):
            raise TypeError(f"attributes must be a mapping, got {type(attributes).__name__}")
        if start_ns is not None and type(start_ns) is not int:
            raise TypeError(f"start_ns must be an int (monotonic ns), got {type(start_ns).__name__}")
        s = self.span(name, group=group)
        s.start_attributes = dict(attributes) if attributes else None
        current = _current_get()
        s.__enter__(parent if parent is not None else current, start_ns, False)
        if make_current:
            s._restore = current
            _current_set(s)
        self._started[s.span_id] = s
        return s

    def _new(self, name: str, group: str, attributes: dict[str, Any] | None) -> Span:
        s: Span = _new_span(Span)
        s._tracer = self
        s.name = name
        s.group = group
        s.start_attributes = attributes
        s.attributes = None
        s.status = STATUS_OK
        s.error = ""
        s.start_ns = s.end_ns = 0
        return s

    def _sampled(self, name: str) -> bool:
        every = self._every.get(name)
        if every is None:
            return True
        n = self._seen.get(name, 0)
        self._seen[name] = n + 1
        return n % every == 0

    def _notify(self, s: Span) -> None:
        for listener in self._listeners.get(s.name, ()):
            try:
                listener(s)
            except Exception as exc:  # noqa: BLE001 - a listener never breaks the traced code
                if not self._warned:
                    self._warned = True
                    warn_safely(f"telemetrain: a span listener failed: {describe(exc)}")

    def _export_late(self, s: Span) -> None:
        """An unexported span failed: export it (start and end, with its real times), and its unexported ancestors
        too (their start now, their end when they end), so its parent is in the store as for any exported span."""
        telemetry = self.telemetry
        chain = [s]
        parent = s.parent
        while parent is not None and parent._route is False:
            chain.append(parent)
            parent = parent.parent
        start_route = telemetry.route("span_start", s.group)
        offset = telemetry.wall_offset_ns
        for span in reversed(chain):  # outermost first, so each parent's start precedes its children's
            span_parent = span.parent
            if start_route:
                attributes = span.start_attributes or {}
                _write_start(start_route, span, span_parent, offset, attributes)
            span._export_id = span.span_id
            if span is not s:
                end_route = telemetry.route("span_end", span.group)
                span._route = end_route or None
        end_route = telemetry.route("span_end", s.group)
        if end_route:
            updated = s.attributes or {}
            end_route(("span_end", s.end_ns, telemetry._token, s.group, s.name, s.span_id, s.end_ns - s.start_ns,
                       s.status, s.error, *updated, *updated.values()))

    # -- the Telemetry producer protocol ---------------------------------------------------------------------------

    def collect(self, final: bool) -> None:
        """At close (exit, SIGTERM): end what is still open with status ``terminated``, innermost first."""
        if not final:
            return
        open_spans = {id(s): s for s in self._started.values() if not s.end_ns}
        for s in iter_ancestors(_current_get()):
            if s._tracer is self and not s.end_ns:
                open_spans[id(s)] = s
        for s in sorted(open_spans.values(), key=lambda s: s.start_ns, reverse=True):
            s.status = STATUS_TERMINATED
            s.error = s.error or "still open when telemetry closed (exit or signal)"
            s._token = None
            s.__exit__(None, None, None)

    def after_fork_in_child(self) -> None:
        self._started = {}  # the parent's spans: the parent ends them
        self._lock = threading.Lock()

    @property
    def open_spans(self) -> list[Span]:
        """Spans started with ``start()`` and not ended yet, oldest first."""
        return sorted((s for s in self._started.values() if not s.end_ns), key=lambda s: s.start_ns)


def _write_start(start_route: Any, s: Span, parent: Span | None, offset: int, attributes: Mapping[str, Any]) -> None:
    """Write ``s``'s start record now, with its own (past) start time."""
    start_route(("span_start", (s.start_ns, s.start_ns + offset), s._tracer.telemetry._token, s.group, s.name,
                 s.span_id, parent.span_id if parent is not None else 0, s.trace_id, *attributes,
                 *attributes.values()))


def tracer(telemetry: Telemetry | None = None) -> Tracer:
    """The ``Tracer`` of ``telemetry`` (default: the default instance), created on first use."""
    t = telemetry if telemetry is not None else get_telemetry()
    found: Tracer = t.extension("tracer", Tracer)
    return found


def span(name: str, *, group: str = "spans", telemetry: Telemetry | None = None, **attributes: Any) -> Span:
    """``with span("model_forward", batch=3) as s:`` or ``@span("evaluate")``: see the module docstring."""
    return tracer(telemetry).span(name, group=group, **attributes)


def current_span() -> Span | None:
    """The span current in this thread or task (None outside any)."""
    return _current_get()


def iter_ancestors(s: Span | None) -> Iterator[Span]:
    """``s``, its parent, and so on up to the root."""
    while s is not None:
        yield s
        s = s.parent
