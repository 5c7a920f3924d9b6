"""Drop-in for ``torch.distributed.elastic.metrics``: same names, signatures, key naming and console format.

Swap ``from torch.distributed.elastic import metrics`` for ``from telemetrain import metrics`` and existing code,
``MetricHandler`` subclasses included, runs unchanged. Every value also flows into the native pipeline (the run
store and any other sink). Differences from torchelastic, each deliberate, are listed in docs/compat.md: values must
be numbers, a handler that raises is contained, ``@prof`` times on the monotonic clock.
"""

from __future__ import annotations

import abc
import functools
import sys
import time
import warnings
from collections import namedtuple
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast, overload

from ..dispatch import describe, is_interrupt, warn_safely
from ..records import METRIC_PAIR
from ..sinks.base import Sink
from ..telemetry import Telemetry, _default, check_name, check_value, get_telemetry

__all__ = [
    "ConsoleMetricHandler",
    "MetricData",
    "MetricHandler",
    "MetricStream",
    "MetricsConfig",
    "NullMetricHandler",
    "configure",
    "getStream",
    "get_elapsed_time_ms",
    "initialize_metrics",
    "prof",
    "profile",
    "publish_metric",
    "put_metric",
]

F = TypeVar("F", bound=Callable[..., Any])
_monotonic_ns = time.monotonic_ns

MetricData = namedtuple("MetricData", ["timestamp", "group_name", "name", "value"])


class MetricsConfig:
    __slots__ = ["params"]

    def __init__(self, params: dict[str, str] | None = None) -> None:
        self.params = params
        if self.params is None:
            self.params = {}


class MetricHandler(abc.ABC):
    @abc.abstractmethod
    def emit(self, metric_data: MetricData) -> None:
        pass


class ConsoleMetricHandler(MetricHandler):
    def emit(self, metric_data: MetricData) -> None:
        print(f"[{metric_data.timestamp}][{metric_data.group_name}]: {metric_data.name}={metric_data.value}")


class NullMetricHandler(MetricHandler):
    def emit(self, metric_data: MetricData) -> None:
        pass


class _HandlerSink(Sink):
    """A user's MetricHandler as an inline sink: called in the caller's thread, as torchelastic does, but contained."""

    background = False
    kinds = frozenset({"metric"})

    def __init__(self, handler: MetricHandler) -> None:
        self.handler = handler
        self.name = f"metric_handler:{type(handler).__name__}"
        self._emit = handler.emit

    def handle(self, record: Any) -> None:
        self._emit(MetricData(record.wall_ns / 1e9, record.group, record.name, record.value))

    def write(self, records: Sequence[Any]) -> None:
        for r in records:
            self.handle(r)


_HANDLERS_KEY = "telemetrain.metrics.handlers"


def _handlers(t: Telemetry) -> dict[str | None, MetricHandler]:
    return cast("dict[str | None, MetricHandler]", t.extensions.setdefault(_HANDLERS_KEY, {}))


def _is_null(handler: Any) -> bool:
    """Ours or torchelastic's NullMetricHandler (a handler written for torchelastic keeps its meaning here)."""
    if isinstance(handler, NullMetricHandler):
        return True
    theirs = sys.modules.get("torch.distributed.elastic.metrics.api")
    return theirs is not None and isinstance(handler, getattr(theirs, "NullMetricHandler", ()))


def configure(handler: MetricHandler, group: str | None = None) -> None:
    """Send the metrics of ``group`` (all groups without their own handler, if ``None``) to ``handler`` too.

    ``handler`` is a ``MetricHandler``: ours, torchelastic's (a subclass written for torch works unchanged), or any
    object with an ``emit(metric_data)`` method."""
    if not isinstance(handler, MetricHandler) and not callable(getattr(handler, "emit", None)):
        raise TypeError(f"handler must be a MetricHandler (with an emit method), got {type(handler).__name__}")
    if group is not None:
        group = check_name(group, "group")
    t = get_telemetry()
    _handlers(t)[group] = handler
    t.set_hook("metric", group, None if _is_null(handler) else _HandlerSink(handler))


def _handler_for(t: Telemetry, group: str) -> MetricHandler:
    handlers = _handlers(t)
    return handlers.get(group, handlers.get(None, _NULL_HANDLER))


_NULL_HANDLER = NullMetricHandler()


class MetricStream:
    def __init__(self, group_name: str, handler: MetricHandler) -> None:
        self.group_name = group_name
        self.handler = handler

    def add_value(self, metric_name: str, metric_value: float) -> None:
        t = _default.telemetry or get_telemetry()
        if self.handler is _handler_for(t, self.group_name):
            put_metric(metric_name, metric_value, self.group_name)
            return
        # A stream built by hand around another handler: the native sinks, then that handler.
        metric_value = check_value(metric_value, "metric_value")
        check_name(metric_name, "metric_name")
        mono, wall = t.now()
        route = t.native_route("metric", self.group_name)
        if route:
            route(("metric", mono, t._token, self.group_name, metric_name, metric_value))
        if not _is_null(self.handler):
            try:
                self.handler.emit(MetricData(wall / 1e9, self.group_name, metric_name, metric_value))
            except BaseException as exc:  # contained as the configured handlers are
                if is_interrupt(exc):  # the user's Ctrl-C (containment.is_interrupt)
                    raise
                # describe: the exception's own __repr__/__str__ may raise, inside this containment
                warn_safely(f"telemetrain.metrics: handler {type(self.handler).__name__} raised {describe(exc)}",
                            stacklevel=2)


def getStream(group: str) -> MetricStream:
    t = _default.telemetry or get_telemetry()
    return MetricStream(group, _handler_for(t, group))


def put_metric(metric_name: str, metric_value: float, metric_group: str = "torchelastic") -> None:
    """Publish one value to ``metric_group``; returns at once if nobody listens to the group."""
    try:
        route = _default.metric_routes_get(metric_group)
    except TypeError:
        raise TypeError(f"metric_group must be a str, got {type(metric_group).__name__}") from None
    if route is None:
        route = get_telemetry()._resolve("metric", metric_group, "metric_group")
    if not route:
        return
    if type(metric_value) is not int and type(metric_value) is not float:
        metric_value = check_value(metric_value, "metric_value")
    if type(metric_name) is not str or not metric_name:
        metric_name = check_name(metric_name, "metric_name")
    # the token is process-wide: valid in any queue even if the default changed since the lookup above
    route(
        (
            "metric",
            _monotonic_ns(),
            (_default.telemetry or get_telemetry())._token,
            metric_group,
            metric_name,
            metric_value,
        )
    )


def publish_metric(metric_group: str, metric_name: str, metric_value: float) -> None:
    warnings.warn(
        "Deprecated, use put_metric(metric_name, metric_value, metric_group) instead", FutureWarning, stacklevel=2
    )
    put_metric(metric_name, metric_value, metric_group)


def get_elapsed_time_ms(start_time_in_seconds: float) -> int:
    """Milliseconds since a ``time.time()`` reading (wall clock, as torchelastic)."""
    return int((time.time() - start_time_in_seconds) * 1000)


def _get_metric_name(fn: Callable[..., Any]) -> str:
    """torchelastic's rule: ``<module leaf>.<name>`` for a module-level function, else the full ``__qualname__``."""
    qualname = fn.__qualname__
    split = qualname.split(".")
    if len(split) == 1:
        module = fn.__module__
        return module.split(".")[-1] + "." + split[0] if module else split[0]
    return qualname


@overload
def prof(fn: F, group: str = "torchelastic") -> F: ...


@overload
def prof(fn: None = None, group: str = "torchelastic") -> Callable[[F], F]: ...


def prof(fn: F | None = None, group: str = "torchelastic") -> F | Callable[[F], F]:
    """Emit ``<key>.success`` or ``<key>.failure`` (1) and ``<key>.duration.ms`` for each call of the function.

    Usable bare (``@prof``) or with a group (``@prof(group="agent")``). The key is computed once, at decoration.
    ``group=None`` means ``"torchelastic"`` (torchelastic would emit with group ``None``).
    """
    group = check_name(group or "torchelastic", "group")

    def wrap(f: F) -> F:
        key = _get_metric_name(f)
        success, failure, duration = key + ".success", key + ".failure", key + ".duration.ms"

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = _monotonic_ns()
            outcome = duration  # a BaseException that is not an Exception records the duration only
            try:
                result = f(*args, **kwargs)
                outcome = success
                return result
            except Exception:
                outcome = failure
                raise
            finally:
                # inlined rather than a helper call: this runs on every call of the profiled function
                t = _default.telemetry or get_telemetry()
                route = t._metric_routes.get(group)
                if route is None:
                    route = t._resolve("metric", group, "group")
                if route:
                    end = _monotonic_ns()
                    if outcome is duration:
                        route(("metric", end, t._token, group, duration, (end - start) // 1_000_000))
                    else:  # success/failure and duration in one packed tuple (records.METRIC_PAIR)
                        route((METRIC_PAIR, end, t._token, group, outcome, 1, duration, (end - start) // 1_000_000))

        return wrapper  # type: ignore[return-value]

    if fn is not None:
        return wrap(fn)
    return wrap


def profile(group: str | None = None) -> Callable[[F], F]:
    """Deprecated torchelastic decorator: ``<name>.success|.failure|.duration.ms`` through ``publish_metric``."""
    warnings.warn("Deprecated, use @prof instead", FutureWarning, stacklevel=2)
    group = group or "torchelastic"  # torchelastic would emit with group_name None to the default handler

    def wrap(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            try:
                result = func(*args, **kwargs)
                publish_metric(group, f"{func.__name__}.success", 1)
            except Exception:
                publish_metric(group, f"{func.__name__}.failure", 1)
                raise
            finally:
                publish_metric(group, f"{func.__name__}.duration.ms", int((time.monotonic() - start) * 1000))
            return result

        return wrapper  # type: ignore[return-value]

    return wrap


def initialize_metrics(cfg: MetricsConfig | None = None) -> None:
    """A no-op, as in torchelastic."""


# torch's package imports its ``api`` module, so ``metrics.api.put_metric`` works after ``import ...metrics`` alone;
# imported last because api.py re-exports the names defined above.
from . import api  # noqa: E402, F401
