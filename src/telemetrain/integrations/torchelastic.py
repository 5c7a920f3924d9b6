"""Route torch's own ``torch.distributed.elastic`` metrics and events into telemetrain.

Code that keeps torch's imports (``from torch.distributed.elastic import metrics, events``) and the elastic agent
itself emit into module-level handlers that default to ``/dev/null`` (torch's ``distributed/elastic/metrics/api.py``:
``NullMetricHandler``; ``events/handlers.py``: the ``"null"`` destination).
``install()`` points them at a Telemetry:

- metrics: a ``torch.distributed.elastic.metrics.MetricHandler`` configured as torch's default handler. Each
  ``put_metric``/``@prof`` value becomes a metric record in the metric's own group (``torchelastic`` by default).
  The agent's monitor loop emits the same few metrics ten times a second; those are recorded when their value
  changes and otherwise once per ``heartbeat_s``, so an hour-long job does not store 150k identical lines.
- events: a ``logging.Handler`` registered as the event destination ``"telemetrain"`` and, unless told otherwise, in
  place of the default ``"null"`` destination, so ``events.record(event)`` lands too. The JSON that torch serialises
  is turned back into a structured event: the inner JSON-in-JSON ``metadata`` is unpacked into
  ``worker.<key>`` attributes, one-element lists are unwrapped, and the severity follows the state.
- rendezvous events (``rendezvous=True``): the ``"dynamic_rendezvous"`` destination, which torch skips while it is a
  ``NullHandler``.

``uninstall()`` restores what was there. This module imports torch; ``import telemetrain`` does not import it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from torch.distributed.elastic import events as te_events
from torch.distributed.elastic.events import handlers as te_handlers
from torch.distributed.elastic.metrics import api as te_metrics_api
from torch.distributed.elastic.metrics.api import MetricHandler

from ..dispatch import describe, warn_safely
from ..events import ELASTIC_GROUP as EVENT_GROUP
from ..events import RDZV_GROUP as RENDEZVOUS_GROUP
from ..telemetry import Telemetry, get_telemetry

__all__ = ["ElasticBridge", "ElasticEventHandler", "ElasticMetricHandler", "install"]

DESTINATION = "telemetrain"
# the agent's monitor loop: workers.<role>.remaining_restarts, workers.<role>.<state>, LocalElasticAgent._monitor_*
_MONITOR_STATES = frozenset({"healthy", "unhealthy", "failed", "succeeded", "unknown", "init", "stopped"})
_SEVERITY_OF_STATE = {"FAILED": "error", "TERMINATED": "warning", "UNHEALTHY": "warning"}


def _is_monitor_metric(name: str) -> bool:
    if name.startswith("LocalElasticAgent._monitor_workers."):
        return True
    parts = name.split(".")
    return len(parts) == 3 and parts[0] == "workers" and (
        parts[2] == "remaining_restarts" or parts[2] in _MONITOR_STATES
    )


class _Contained:
    """Counts and warns once: a bridge failure never reaches the agent or the training loop."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failures = 0

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        if self.failures == 1:
            warn_safely(f"telemetrain: the torchelastic {self.what} bridge failed ({describe(exc)}); "
                        "further failures are counted, not shown")


class ElasticMetricHandler(MetricHandler):
    """A torchelastic ``MetricHandler`` writing into a Telemetry."""

    def __init__(
        self,
        telemetry: Telemetry | None = None,
        *,
        heartbeat_s: float = 10.0,
        on_metric: Callable[[str, str, Any], None] | None = None,
    ) -> None:
        if telemetry is not None and not isinstance(telemetry, Telemetry):
            raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
        if not isinstance(heartbeat_s, (int, float)) or isinstance(heartbeat_s, bool) or heartbeat_s < 0:
            raise ValueError(f"heartbeat_s must be a number of seconds >= 0, got {heartbeat_s!r}")
        self.telemetry = telemetry if telemetry is not None else get_telemetry()
        self.heartbeat_s = float(heartbeat_s)
        self.on_metric = on_metric
        self._last: dict[tuple[str, str], tuple[Any, float, bool]] = {}  # value, when recorded, recorded?
        self._lock = threading.Lock()
        self.contained = _Contained("metric")

    def emit(self, metric_data: Any) -> None:
        try:
            group, name, value = str(metric_data.group_name), str(metric_data.name), metric_data.value
            if self._should_record(group, name, value):
                self._record(group, name, value)
            if self.on_metric is not None:
                self.on_metric(group, name, value)
        except Exception as exc:  # noqa: BLE001 - contained: torch calls this inline, in the agent's monitor loop
            self.contained.failed(exc)

    def _should_record(self, group: str, name: str, value: Any) -> bool:
        if not _is_monitor_metric(name):
            return True
        now = time.monotonic()
        key = (group, name)
        with self._lock:
            last = self._last.get(key)
            due = (
                last is None
                or now - last[1] >= self.heartbeat_s
                or (value != last[0] and not name.endswith(".duration.ms"))
            )
            self._last[key] = (value, now, True) if due else (value, last[1], False)  # type: ignore[index]
        return due

    def _record(self, group: str, name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            # torchelastic does not check; a non-number becomes an event rather than a lost value
            self.telemetry.event("non_numeric_metric", {"name": name, "value": repr(value)}, group=group,
                                 severity="warning")
            return
        unit = "ms" if name.endswith(".duration.ms") else ""
        self.telemetry.metric(name, value, group=group, unit=unit)

    def flush_throttled(self) -> None:
        """Record the latest value of every monitor-loop metric whose last value was held back (at uninstall)."""
        with self._lock:
            pending = [(k, v[0]) for k, v in self._last.items() if not v[2]]
            for key, _ in pending:
                value, when, _ = self._last[key]
                self._last[key] = (value, when, True)
        for (group, name), value in pending:
            try:
                self._record(group, name, value)
            except Exception as exc:  # noqa: BLE001 - contained
                self.contained.failed(exc)


def _unwrap(value: Any) -> Any:
    """torchelastic writes some per-worker values as one-element lists (a stray tuple in the agent)."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def event_attributes(data: Mapping[str, Any]) -> dict[str, Any]:
    """A torchelastic ``Event``'s metadata as flat attributes: the JSON string under ``metadata`` is unpacked."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "metadata" and isinstance(value, str):
            try:
                inner = json.loads(value)
            except ValueError:
                out["worker.metadata"] = value
                continue
            if isinstance(inner, dict):
                for k, v in inner.items():
                    out[f"worker.{k}"] = _unwrap(v)
                continue
        out[key] = _unwrap(value)
    return out


class ElasticEventHandler(logging.Handler):
    """A ``logging.Handler`` for torchelastic's event loggers: each line is an ``Event`` or ``RdzvEvent`` as JSON."""

    def __init__(self, telemetry: Telemetry | None = None) -> None:
        super().__init__(level=logging.NOTSET)
        if telemetry is not None and not isinstance(telemetry, Telemetry):
            raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
        self.telemetry = telemetry if telemetry is not None else get_telemetry()
        self.contained = _Contained("event")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._forward(record.getMessage())
        except Exception as exc:  # noqa: BLE001 - contained: torch logs inline, in the agent
            self.contained.failed(exc)

    def _forward(self, message: str) -> None:
        try:
            data = json.loads(message)
        except ValueError:
            data = None
        if not isinstance(data, dict) or "name" not in data:
            self.telemetry.event("torchelastic_log", {"message": message}, group=EVENT_GROUP)
            return
        if "node_state" in data:  # an RdzvEvent
            name = str(data.pop("name"))
            state = str(data.get("node_state", ""))
            # every field, empty or None ones too: the record is the one the drop-in's record_rdzv_event makes
            attributes = {k: _unwrap(v) for k, v in data.items()}
            severity = "error" if state == "FAILED" else "info"
            self.telemetry.event(name, attributes, group=RENDEZVOUS_GROUP, severity=severity)
            return
        name = str(data["name"])
        attributes = event_attributes(data.get("metadata") or {})
        # the event's own fields under the drop-in's namespaced keys (telemetrain.events), and under the short ones
        # unless the metadata has a key of that name: a metadata "source" or "timestamp_ms" was overwritten
        source = str(data.get("source", ""))
        attributes["torchelastic.source"] = source
        attributes.setdefault("source", source)
        if data.get("timestamp"):  # torch leaves it 0; keep it when someone set it
            attributes["torchelastic.timestamp"] = data["timestamp"]
            attributes.setdefault("timestamp_ms", data["timestamp"])
        state = str(attributes.get("state", ""))
        severity = _SEVERITY_OF_STATE.get(state, "info")
        self.telemetry.event(name, attributes, group=EVENT_GROUP, severity=severity)


class ElasticBridge:
    """What ``install()`` changed in torch's modules, and how to put it back."""

    def __init__(self, metric_handler: Any, event_handler: ElasticEventHandler) -> None:
        self.metric_handler = metric_handler
        self.event_handler = event_handler
        self._restore: list[Callable[[], None]] = []
        self.installed = False

    def uninstall(self) -> None:
        """Restore torch's handlers; record the latest held-back monitor-loop values first. Idempotent."""
        if not self.installed:
            return
        self.installed = False
        if self.metric_handler is not None:
            self.metric_handler.flush_throttled()
        for restore in reversed(self._restore):
            try:
                restore()
            except Exception as exc:  # noqa: BLE001 - a torch internal moved: leave it, say so once
                self.event_handler.contained.failed(exc)
        self._restore.clear()

    def __enter__(self) -> ElasticBridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def install(
    telemetry: Telemetry | None = None,
    *,
    metrics: bool = True,
    events: bool = True,
    default_destination: bool = True,
    rendezvous: bool = False,
    heartbeat_s: float = 10.0,
    on_metric: Callable[[str, str, Any], None] | None = None,
) -> ElasticBridge:
    """Send torch's torchelastic metrics and events to ``telemetry`` (default: the default Telemetry).

    ``default_destination``: also take over the ``"null"`` event destination (where ``events.record(e)`` and the
    agent's events go unless ``--event-log-handler`` names another). ``rendezvous``: also the rendezvous events.
    ``on_metric(group, name, value)`` sees every metric, throttled or not (the launcher follows restarts with it).
    """
    for arg, value in (("metrics", metrics), ("events", events), ("default_destination", default_destination),
                       ("rendezvous", rendezvous)):
        if not isinstance(value, bool):
            raise TypeError(f"{arg} must be a bool, got {type(value).__name__}")
    if telemetry is None:
        telemetry = get_telemetry()
    metric_handler = ElasticMetricHandler(telemetry, heartbeat_s=heartbeat_s, on_metric=on_metric) if metrics else None
    event_handler = ElasticEventHandler(telemetry)
    bridge = ElasticBridge(metric_handler, event_handler)

    if metric_handler is not None:
        previous = te_metrics_api._default_metrics_handler
        te_metrics_api.configure(metric_handler)
        bridge._restore.append(lambda: te_metrics_api.configure(previous))

    destinations = []
    if events:
        destinations.append(DESTINATION)
        if default_destination:
            destinations.append("null")
    if rendezvous:
        destinations.append("dynamic_rendezvous")
    registry = te_handlers._log_handlers
    loggers = te_events._events_loggers
    for dest in destinations:
        had = dest in registry
        old = registry.get(dest)
        registry[dest] = event_handler
        # torch binds a destination's handler when its logger is first made; one made already gets ours added
        logger = loggers.get(dest)
        if logger is None:
            logger = logging.getLogger(f"torchelastic-events-{dest}")
            logger.propagate = False
            loggers[dest] = logger
        # torch sets the level from $LOGLEVEL, and LOGLEVEL=WARNING would silently drop every event: ours are INFO
        old_level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(event_handler)

        def restore(dest: str = dest, had: bool = had, old: Any = old, logger: logging.Logger = logger,
                    old_level: int = old_level) -> None:
            logger.removeHandler(event_handler)
            logger.setLevel(old_level)
            if had:
                registry[dest] = old
            else:
                registry.pop(dest, None)

        bridge._restore.append(restore)
    bridge.installed = True
    return bridge
