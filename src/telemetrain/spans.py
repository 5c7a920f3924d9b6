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
everything else is deferred to the writer thread (``bench/bench_training.py`` measures it). The ``Span`` object (that
lifecycle, the ids, the records) is in ``span_lifecycle``; this module has the ``Tracer``, ``span()`` and
``current_span()``, and re-exports ``Span``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .collector import collector
from .dispatch import describe, is_interrupt, warn_safely
from .process_hooks import ending_cause
from .records import check_attribute_keys
from .span_lifecycle import (
    STATUS_OK,
    STATUS_TERMINATED,
    Span,
    _current,
    _mono,
    _thread_id,
    _write_end,
    _write_start,
)
from .telemetry import Telemetry, _default, check_name, get_telemetry

__all__ = ["Span", "Tracer", "current_span", "span", "tracer"]

# (the ContextVar lives with Span, whose enter and exit set it; the recorder and tests reach it through here)
_current_get = _current.get
_current_set = _current.set


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
        why = _closed_because(ending_cause()) if open_spans else ""
        for s in sorted(open_spans.values(), key=lambda s: s.start_ns, reverse=True):
            s.status = STATUS_TERMINATED
            s.error = s.error or why
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


def _closed_because(cause: str | None) -> str:
    """A span's error when telemetry closed it: what was ending the process, where known (the findings tell a user's
    Ctrl-C from a crash by it)."""
    if cause is None:
        return "still open when telemetry closed (exit or signal)"
    if cause.startswith("SIG") or cause.startswith("signal "):
        return f"still open when telemetry closed: the process was stopped by {cause}"
    return f"still open when telemetry closed: the process exited on an uncaught {cause}"
