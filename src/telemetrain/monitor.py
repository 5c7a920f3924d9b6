"""Drop-in for ``torch.monitor``: change the import, keep the code, lose the bugs.

Same names and signatures: ``Aggregation`` (and its members at module level), ``Stat(name, aggregations,
window_size, max_samples=...)`` with ``add``, ``get``, ``count`` and ``name``; ``Event(name, timestamp, data)``;
``log_event``; ``register_event_handler``/``unregister_event_handler``; ``TensorboardEventHandler``;
``STAT_EVENT``. A stat window still reaches handlers as a ``"torch.monitor.Stat"`` event with ``"<name>.<agg>"``
float data keys, so existing handlers keep working. And everything also lands in the pipeline: each window as a stat
record (group ``torch.monitor``), each logged event as an event record.

Fixed (each in docs/compat.md, each tested):
- ``Aggregation.VALUE`` records the last value (torch binds it to NONE, so it records nothing);
- windows close at their time boundary (the collector thread), not at the next ``add``, and at flush and exit;
- ``max_samples`` closes the window and starts the next: no sample is dropped;
- a window of 0, negative or under 1 ms, or ``max_samples < 1``, is a ``ValueError`` (torch: SIGFPE, or silently
  one sample per window for the stub's documented ``-1``);
- ``bool`` data stays ``bool``, ``event.data`` is a real dict (mutations stick), timezone-aware timestamps are kept;
- handlers run without any lock held: a handler may log, register or unregister; one that raises is counted and
  warned about once, and neither the other handlers nor the caller see it; unregistering twice does nothing.
Ours on top: aggregations ``STDDEV``, ``P50``, ``P90``, ``P95``, ``P99``, ``RATE``, ``HISTOGRAM``, and quantile names
as strings (``"p99.9"``); ``report_empty=True`` reports empty windows with count 0.
"""

from __future__ import annotations

import datetime
import enum
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .dispatch import describe, is_interrupt, warn_safely
from .records import Diagnostic, StatWindow
from .stats import stat as _stat
from .stats.summary import _as_float
from .telemetry import Telemetry, check_name, get_telemetry

__all__ = [
    "COUNT",
    "HISTOGRAM",
    "MAX",
    "MEAN",
    "MIN",
    "P50",
    "P90",
    "P95",
    "P99",
    "RATE",
    "STAT_EVENT",
    "STDDEV",
    "SUM",
    "VALUE",
    "Aggregation",
    "Event",
    "EventHandlerHandle",
    "Stat",
    "TensorboardEventHandler",
    "log_event",
    "register_event_handler",
    "unregister_event_handler",
]

STAT_EVENT = "torch.monitor.Stat"
GROUP = "torch.monitor"
INT64_MAX = 2**63 - 1
MAX_HANDLER_DEPTH = 8


class Aggregation(enum.IntEnum):
    """torch.monitor's aggregations (with torch's C++ values; VALUE is 1 here, as in C++) and ours."""

    VALUE = 1
    MEAN = 2
    COUNT = 3
    SUM = 4
    MAX = 5
    MIN = 6
    STDDEV = 7
    P50 = 8
    P90 = 9
    P95 = 10
    P99 = 11
    RATE = 12
    HISTOGRAM = 13

    # torch's pybind11 enum prints as "Aggregation.SUM"; an IntEnum would print "4" (log lines, f-strings, dict keys)
    def __str__(self) -> str:
        return f"Aggregation.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


VALUE, MEAN, COUNT, SUM, MAX, MIN = (Aggregation.VALUE, Aggregation.MEAN, Aggregation.COUNT, Aggregation.SUM,
                                     Aggregation.MAX, Aggregation.MIN)
STDDEV, P50, P90, P95, P99, RATE, HISTOGRAM = (Aggregation.STDDEV, Aggregation.P50, Aggregation.P90, Aggregation.P95,
                                               Aggregation.P99, Aggregation.RATE, Aggregation.HISTOGRAM)
_BY_KEY = {member.name.lower(): member for member in Aggregation}

DataValue = str | float | int | bool


def _check_data(data: Any) -> dict[str, DataValue]:
    if not isinstance(data, Mapping):
        raise TypeError(f"data must be a dict of str to str/float/int/bool, got {type(data).__name__}")
    out: dict[str, DataValue] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise TypeError(f"data keys must be str, got {type(key).__name__}: {key!r}")
        if not isinstance(value, (str, float, int, bool)):
            item = getattr(value, "item", None)  # numpy scalars, as torch accepts them
            if getattr(value, "dim", None) is None and callable(item) and isinstance(item(), (float, int, bool)):
                value = item()
            else:
                raise TypeError(f"data[{key!r}] must be a str, float, int or bool, got {type(value).__name__}")
        out[key] = value
    return out


class Event:
    """``Event(name, timestamp, data)``: ``data`` values are str, float, int or bool (bool stays bool)."""

    __slots__ = ("_data", "_name", "_timestamp")

    def __init__(self, name: str, timestamp: datetime.datetime, data: Mapping[str, DataValue]) -> None:
        self.name = name
        self.timestamp = timestamp
        self.data = data

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"name must be a str, got {type(value).__name__}")
        self._name = value

    @property
    def timestamp(self) -> datetime.datetime:
        return self._timestamp

    @timestamp.setter
    def timestamp(self, value: datetime.datetime) -> None:
        if not isinstance(value, datetime.datetime):
            raise TypeError(f"timestamp must be a datetime.datetime, got {type(value).__name__}")
        self._timestamp = value

    @property
    def data(self) -> dict[str, DataValue]:
        return self._data

    @data.setter
    def data(self, value: Mapping[str, DataValue]) -> None:
        self._data = _check_data(value)

    def __repr__(self) -> str:
        return f"Event(name={self._name!r}, timestamp={self._timestamp!r}, data={self._data!r})"


_HANDLE_TOKEN = object()


class EventHandlerHandle:
    """What ``register_event_handler`` returns; pass it to ``unregister_event_handler``."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[Event], None], _token: object = None) -> None:
        if _token is not _HANDLE_TOKEN:
            raise TypeError("EventHandlerHandle cannot be created directly: use register_event_handler")
        self.callback = callback

    def __repr__(self) -> str:
        return f"EventHandlerHandle({self.callback!r})"


class _Handlers:
    """The handlers of one Telemetry. Registration swaps an immutable tuple, so delivery needs no lock and a handler
    may register or unregister (itself included) while events are being delivered."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.handles: tuple[EventHandlerHandle, ...] = ()
        self.lock = threading.Lock()
        self.local = threading.local()
        self.errors = 0
        self.skipped = 0

    def deliver(self, event: Event) -> None:
        depth = getattr(self.local, "depth", 0)
        if depth >= MAX_HANDLER_DEPTH:  # a handler that logs an event that makes it log an event that...
            self.skipped += 1
            if self.skipped == 1:
                self._report("handler_recursion", f"events logged {depth} handlers deep were not delivered")
            return
        self.local.depth = depth + 1
        try:
            for handle in self.handles:
                try:
                    handle.callback(event)
                except BaseException as exc:  # a raising handler stops nothing, sys.exit included
                    if is_interrupt(exc):
                        raise
                    self.errors += 1
                    if self.errors == 1:
                        self._report("handler_error", f"a torch.monitor event handler raised {describe(exc)}")
        finally:
            self.local.depth = depth

    def _report(self, what: str, message: str) -> None:
        warn_safely(f"telemetrain.monitor: {message}; counted, and later ones are not warned about", stacklevel=4)
        t = self.telemetry
        try:
            mono, wall = t.now()
            t.emit(Diagnostic(mono, wall, t.identity, "telemetrain", what, "torch.monitor", 1, message))
        except BaseException as exc:  # reporting must never fail the caller
            if is_interrupt(exc):
                raise


def _handlers(telemetry: Telemetry | None = None) -> _Handlers:
    if telemetry is not None and not isinstance(telemetry, Telemetry):
        raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
    t = telemetry if telemetry is not None else get_telemetry()
    found: _Handlers = t.extension("monitor", _Handlers)
    return found


def register_event_handler(
    callback: Callable[[Event], None], *, telemetry: Telemetry | None = None
) -> EventHandlerHandle:
    """Call ``callback(event)`` for every logged event and every stat window, in registration order. ``telemetry``
    (ours): the instance whose stats and events it hears (default: the default instance)."""
    if not callable(callback):
        raise TypeError(f"callback must be callable, got {type(callback).__name__}")
    state = _handlers(telemetry)
    handle = EventHandlerHandle(callback, _HANDLE_TOKEN)
    with state.lock:
        state.handles = (*state.handles, handle)
    return handle


def unregister_event_handler(handler: EventHandlerHandle, *, telemetry: Telemetry | None = None) -> None:
    """Stop calling a handler. Unregistering one that is not registered (again) does nothing."""
    if not isinstance(handler, EventHandlerHandle):
        raise TypeError(f"handler must be an EventHandlerHandle, got {type(handler).__name__}")
    state = _handlers(telemetry)
    with state.lock:
        state.handles = tuple(h for h in state.handles if h is not handler)


def log_event(event: Event, *, telemetry: Telemetry | None = None) -> None:
    """Deliver ``event`` to every handler (synchronously, in this thread) and record it in the pipeline (of
    ``telemetry``, ours: default the default instance)."""
    if not isinstance(event, Event):
        raise TypeError(f"event must be a telemetrain.monitor.Event, got {type(event).__name__}")
    _check_data(event.data)  # again: the dict may have been changed in place since it was set
    if telemetry is not None and not isinstance(telemetry, Telemetry):
        raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
    state = _handlers(telemetry)
    try:
        timestamp = event.timestamp.timestamp()
    except (OverflowError, OSError, ValueError):
        timestamp = float("nan")
    state.telemetry.event(event.name or "unnamed", {**event.data, "torch.monitor.timestamp": timestamp}, group=GROUP)
    state.deliver(event)


def _aggregation_names(aggregations: Any) -> list[str]:
    if isinstance(aggregations, (str, bytes)) or not isinstance(aggregations, Iterable):
        raise TypeError(f"aggregations must be a list of Aggregation, got {type(aggregations).__name__}")
    names = []
    for agg in aggregations:
        # ours, torch.monitor's own members (matched by name), or names such as "p99.9"
        name = agg if isinstance(agg, str) else getattr(agg, "name", None)
        if not isinstance(name, str):
            raise TypeError(f"aggregations must be Aggregation members, got {type(agg).__name__}: {agg!r}")
        names.append(name)
    return names


class Stat(_stat.Stat):
    """``Stat(name, aggregations, window_size, max_samples=2**63-1)``: ``window_size`` is a ``timedelta`` or float
    seconds (at least 1 ms); the window closes at its time boundary or at ``max_samples`` samples, whichever comes
    first, and the next one starts at once."""

    __slots__ = ("_requested",)

    def __init__(
        self,
        name: str,
        aggregations: Iterable[Any],
        window_size: datetime.timedelta | float,
        max_samples: int = INT64_MAX,
        *,
        report_empty: bool = False,
        telemetry: Telemetry | None = None,
    ) -> None:
        check_name(name, "name")
        if isinstance(max_samples, bool) or not isinstance(max_samples, int):
            raise TypeError(f"max_samples must be an int, got {type(max_samples).__name__}")
        if max_samples < 1:
            raise ValueError(
                f"max_samples must be >= 1, got {max_samples} (torch.monitor's stub documents -1, which there means"
                " 'keep one sample per window and drop the rest'; leave it out for no limit)"
            )
        names = _aggregation_names(aggregations)
        super().__init__(
            name,
            names,
            window=_stat.window_seconds(window_size, "window_size"),
            samples=None if max_samples >= INT64_MAX else max_samples,
            group=GROUP,
            report_empty=report_empty,
            telemetry=telemetry,
        )
        self._requested = [(key, _BY_KEY.get(key)) for key in self.aggregations]
        self.add_listener(_deliver_window)

    def get(self) -> dict[Any, float]:
        """The last closed window, keyed by ``Aggregation`` (quantiles not among its members by name), as floats;
        zeros before the first window closes, as torch.monitor returns."""
        values = self._last_values
        out: dict[Any, float] = {}
        for key, member in self._requested:
            if key == "histogram":
                continue
            out[member if member is not None else key] = _as_float(values.get(key, 0.0))
        return out


def _deliver_window(stat: _stat.Stat, record: StatWindow) -> None:
    handlers = _handlers(stat.telemetry)
    if not handlers.handles:
        return
    data: dict[str, DataValue] = {f"{stat.name}.{key}": _as_float(value) for key, value in record.values.items()}
    timestamp = datetime.datetime.fromtimestamp(record.wall_ns / 1e9)  # naive local time, as torch returns it
    handlers.deliver(Event(STAT_EVENT, timestamp, data))


class TensorboardEventHandler:
    """Writes every stat event's data as TensorBoard scalars (``writer``: a ``torch.utils.tensorboard``
    ``SummaryWriter`` or anything with its ``add_scalar``)."""

    def __init__(self, writer: Any) -> None:
        if not callable(getattr(writer, "add_scalar", None)):
            raise TypeError(f"writer must have add_scalar (a SummaryWriter), got {type(writer).__name__}")
        self._writer = writer

    def __call__(self, event: Event) -> None:
        if event.name == STAT_EVENT:
            walltime = event.timestamp.timestamp()
            for key, value in event.data.items():
                self._writer.add_scalar(key, value, walltime=walltime)


class _WaitCounter:
    """torch's private ``_WaitCounter(key).guard()`` (its own tests use it): each guarded block's duration becomes a
    metric named ``key`` (milliseconds, group ``torch.monitor.wait_counter``). ``TORCH_DISABLE_WAIT_COUNTERS=1``
    turns it off, as in torch."""

    def __init__(self, key: str) -> None:
        self.key = check_name(key, "key")

    def guard(self) -> _WaitGuard:
        return _WaitGuard(self.key)


class _WaitGuard:
    __slots__ = ("_key", "_start")

    def __init__(self, key: str) -> None:
        self._key, self._start = key, 0

    def __enter__(self) -> None:
        import time  # (imported here: this block is appended to a module others edit)

        self._start = time.monotonic_ns()

    def __exit__(self, *exc: object) -> None:
        import os
        import time

        if os.environ.get("TORCH_DISABLE_WAIT_COUNTERS") == "1":
            return
        try:
            get_telemetry().metric(self._key, (time.monotonic_ns() - self._start) / 1e6, "torch.monitor.wait_counter",
                                   unit="ms")
        except Exception as exc:  # noqa: BLE001 - never break the guarded code
            warn_safely(f"telemetrain.monitor: recording wait counter {self._key!r} failed: {describe(exc)}")
