"""Prometheus: the latest value of each metric, served over HTTP for a Prometheus server to scrape.

Needs the ``prometheus`` extra (``pip install 'telemetrain[prometheus]'``: prometheus_client). The sink runs behind
the dispatcher like every I/O sink: its ``write`` folds a batch into an in-memory table under one lock, and a scrape
(prometheus_client's HTTP server, in its own thread, on a private ``CollectorRegistry``) copies the table under the
same lock, so a scrape sees whole batches. With ``push_to`` the sink also pushes the table to a Pushgateway at each
``flush`` and at ``close``, in the sink's thread (short jobs). Mapping and names: ``docs/backends/prometheus.md``.
"""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..extras import missing_extra

try:
    from prometheus_client import CollectorRegistry, push_to_gateway, start_http_server
    from prometheus_client.metrics_core import Metric
except ImportError as exc:  # one clear message naming the extra
    raise missing_extra("telemetrain.sinks.prometheus", "prometheus_client", "prometheus", exc) from None

from ..cumulative import CUMULATIVE_METRICS, CUMULATIVE_UNITS
from ..dispatch import warn_safely
from ..identity import Identity, identity_from_env
from ..training.reports import METRICS as TRAINING_METRICS
from .base import Sink

__all__ = ["DEFAULT_BASE_PORT", "DEFAULT_PUSH_JOB", "PUSH_GROUPING_KEY", "PrometheusSink", "metric_name"]

# 9464 is the port Prometheus' exporter list gives OpenTelemetry's in-process Prometheus exporter: an application's
# own metrics endpoint, which is what this is. Daemons usually found on a GPU node (node exporter 9100, DCGM exporter
# 9400) stay clear of 9464..9471 for 8 ranks a node.
DEFAULT_BASE_PORT = 9464
DEFAULT_MAX_SERIES = 10_000
DEFAULT_PUSH_JOB = "telemetrain"
DEFAULT_PUSH_TIMEOUT_S = 3.0
PUSH_GROUPING_KEY = ("run_id", "rank")  # a Pushgateway group per process of a run: its pushes replace only its own
PREFIX = "telemetrain_"
OTEL_NAMESPACES = ("system.", "process.", "hw.")  # OpenTelemetry's own namespaces keep their names, unprefixed
DEVICE_GROUPS = ("system.gpu.", "system.cuda.", "system.filesystem.")  # groups naming a device: a `group` label
IDENTITY_LABELS = ("run_id", "session_tag", "perf_tag", "rank", "local_rank", "host")

# UCUM unit on the record -> Prometheus suffix (base units, plural). Annotations ({thing}) and other units add none.
UNIT_SUFFIXES = {
    "s": "seconds",
    "By": "bytes",
    "J": "joules",
    "W": "watts",
    "Hz": "hertz",
    "Cel": "celsius",
    "1": "ratio",
}
TRAINING_EVENT = ("training", "training_metrics_update")
_CACHE_MAX = 4096
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def _sanitise(text: str) -> str:
    out = _INVALID.sub("_", text)
    return "_" + out if out[:1].isdigit() else out


def _unit_suffix(unit: str) -> str:
    if unit in UNIT_SUFFIXES:
        return UNIT_SUFFIXES[unit]
    if unit == "1/s" or (unit.startswith("{") and unit.endswith("}/s")):
        return "per_second"
    return ""


def metric_name(name: str, unit: str = "") -> str:
    """The Prometheus name of a metric (without ``_total``): dots to underscores, the ``telemetrain_`` prefix unless
    the name is in an OpenTelemetry namespace, the unit's suffix unless the name already ends with it."""
    base = _sanitise(name)
    if not name.startswith(OTEL_NAMESPACES) and not base.startswith(PREFIX):
        base = PREFIX + base
    suffix = _unit_suffix(unit)
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    return base


def _event_metric(attribute: str) -> tuple[str, str]:
    """(metric name, unit) of a numeric attribute of ``training_metrics_update``: the twin metric record's name and
    unit where the recorder emits one (so both land in one series), else ``train.<attribute>`` with its unit read
    from the attribute's suffix."""
    twin = TRAINING_METRICS.get(attribute)
    if twin is not None:
        return twin
    if attribute.endswith("_sec"):
        return "train." + attribute[: -len("_sec")], "s"
    if attribute.endswith("_fraction"):
        return "train." + attribute, "1"
    return "train." + attribute, ""


def _labels(identity: Identity, group: str) -> dict[str, str]:
    labels = {
        "run_id": identity.run_id,
        "session_tag": identity.session_tag,
        "perf_tag": identity.perf_tag,
        "rank": str(identity.rank),
        "local_rank": str(identity.local_rank),
        "host": identity.host,
    }
    if group.startswith(DEVICE_GROUPS):
        labels["group"] = group
    return labels


class _Family:
    __slots__ = ("doc", "samples", "type")

    def __init__(self, type_: str, doc: str) -> None:
        self.type = type_
        self.doc = doc
        self.samples: dict[int, float] = {}  # label set id -> value


class _Table:
    """The latest value per (family, label set), and the collector prometheus_client's registry calls at a scrape.

    A label set is an int id into ``label_sets`` (a tuple of label pairs would be re-hashed at every value)."""

    def __init__(self, max_series: int) -> None:
        self.lock = threading.Lock()
        self.families: dict[str, _Family] = {}
        self.label_sets: list[dict[str, str]] = []
        self.group_keys: list[tuple[str, ...]] = []  # per label set: its values of PUSH_GROUPING_KEY
        self._label_ids: dict[tuple[tuple[str, str], ...], int] = {}
        self.max_series = max_series
        self.series = 0
        self.dropped_series = 0  # values of new series refused above max_series

    def label_id(self, labels: dict[str, str]) -> int:
        key = tuple(labels.items())
        found = self._label_ids.get(key)
        if found is None:
            found = self._label_ids[key] = len(self.label_sets)
            self.label_sets.append(labels)
            self.group_keys.append(tuple(labels.get(k, "") for k in PUSH_GROUPING_KEY))
        return found

    def set(self, name: str, type_: str, doc: str, label_id: int, value: float) -> None:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = _Family(type_, doc)
        samples = family.samples
        if label_id not in samples:
            if self.series >= self.max_series:
                self.dropped_series += 1
                return
            self.series += 1
        samples[label_id] = value

    def add(self, name: str, doc: str, label_id: int, amount: float) -> None:
        family = self.families.get(name)
        self.set(name, "counter", doc, label_id, amount + (family.samples.get(label_id, 0.0) if family else 0.0))

    def clear(self) -> None:
        self.families.clear()
        self.label_sets.clear()
        self.group_keys.clear()
        self._label_ids.clear()
        self.series = 0
        self.dropped_series = 0

    def collect(self) -> Iterator[Metric]:
        return self.collect_group(None)

    def push_groups(self) -> list[tuple[str, ...]]:
        """The distinct values of PUSH_GROUPING_KEY among the label sets in use, first seen first."""
        with self.lock:
            return list(dict.fromkeys(self.group_keys))

    def collect_group(self, group: tuple[str, ...] | None) -> Iterator[Metric]:
        """The families, with only the samples of one push group (``None``: all of them)."""
        with self.lock:  # copy only: the exposition is encoded outside the lock
            snapshot = [(n, f.type, f.doc, list(f.samples.items())) for n, f in self.families.items()]
            label_sets = list(self.label_sets)  # label dicts are never changed once made
            group_keys = list(self.group_keys)
            dropped = self.dropped_series
        for name, type_, doc, samples in snapshot:
            if group is not None:
                samples = [s for s in samples if group_keys[s[0]] == group]
                if not samples:
                    continue
            metric = Metric(name, doc, type_)
            sample_name = name + "_total" if type_ == "counter" else name
            for label_id, value in samples:
                metric.add_sample(sample_name, label_sets[label_id], value)
            yield metric
        metric = Metric("telemetrain_prometheus_dropped_series", "new series refused above max_series", "counter")
        metric.add_sample("telemetrain_prometheus_dropped_series_total", {}, float(dropped))
        yield metric


class _PushGroup:
    """What one push sends (prometheus_client's push takes any object with ``collect``): one group's series."""

    def __init__(self, table: _Table, group: tuple[str, ...]) -> None:
        self.table = table
        self.group = group

    def collect(self) -> Iterator[Metric]:
        return self.table.collect_group(self.group)


def _gateway_url(push_to: object) -> str:
    if not isinstance(push_to, str):
        raise TypeError(f"push_to must be a str (the Pushgateway's URL) or None, got {push_to!r}")
    url = push_to if "://" in push_to else "http://" + push_to
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number or out of range
    except ValueError as exc:
        raise ValueError(f"push_to is not a URL: {push_to!r} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"push_to must be an http(s) URL with a host, like 'http://127.0.0.1:9091', got {push_to!r}")
    return url.rstrip("/")


class PrometheusSink(Sink):
    """Serves the latest value of each metric on ``http://<addr>:<port>/metrics``.

    ``port``: ``None`` -> ``base_port + local_rank`` (one endpoint per rank on a node; ``local_rank`` defaults to this
    process's, from the same environment variables as the run identity); ``0`` -> a free port. The bound port is
    ``sink.port``. ``addr`` is ``127.0.0.1`` unless you choose to expose the endpoint. ``counters``: names of your
    own cumulative metrics, exported as counters (``_total``). ``max_series`` bounds memory: values of further new
    series are refused and counted (``telemetrain_prometheus_dropped_series_total``, one warning).

    The server starts here. If it cannot bind (the port is taken), nothing is raised here: each ``write`` retries the
    bind and raises while it fails, so the dispatcher counts the failure, reports it and backs off (training goes
    on); the values stay current in memory and are served once the bind succeeds.

    ``push_to``: a Pushgateway's URL (``"http://127.0.0.1:9091"``): a ``flush`` (``Telemetry.flush()``, and the final
    one at close) or ``close`` that follows new records pushes the current values there with ``push_to_gateway``
    (replacing the group's series), one group per ``run_id``/``rank`` (``PUSH_GROUPING_KEY``) under job ``push_job``,
    each push bounded by ``push_timeout`` seconds. A push that fails raises from ``flush`` (``close``) so the
    dispatcher counts and reports it; the values stay and the next flush after new records pushes them.
    ``serve=False``: push only, no endpoint (needs ``push_to``).
    """

    name = "prometheus"
    background = True

    def __init__(
        self,
        port: int | None = None,
        *,
        addr: str = "127.0.0.1",
        base_port: int = DEFAULT_BASE_PORT,
        local_rank: int | None = None,
        counters: Iterable[str] = (),
        max_series: int = DEFAULT_MAX_SERIES,
        push_to: str | None = None,
        push_job: str = DEFAULT_PUSH_JOB,
        push_timeout: float = DEFAULT_PUSH_TIMEOUT_S,
        serve: bool = True,
    ) -> None:
        for arg, value in (("port", port), ("base_port", base_port), ("local_rank", local_rank)):
            if value is not None and (type(value) is not int or not 0 <= value <= 65535):
                raise ValueError(f"{arg} must be an int in 0..65535, got {value!r}")
        if not isinstance(addr, str) or not addr:
            raise TypeError(f"addr must be a non-empty str, got {addr!r}")
        if type(max_series) is not int or max_series < 1:
            raise ValueError(f"max_series must be a positive int, got {max_series!r}")
        gateway = None if push_to is None else _gateway_url(push_to)
        if not isinstance(push_job, str):
            raise TypeError(f"push_job must be a str, got {push_job!r}")
        if not push_job:
            raise ValueError("push_job must be a non-empty str")
        if type(push_timeout) not in (int, float) or not 0 < push_timeout < float("inf"):
            raise ValueError(f"push_timeout must be a positive number of seconds, got {push_timeout!r}")
        if type(serve) is not bool:
            raise TypeError(f"serve must be a bool, got {serve!r}")
        if not serve and gateway is None:
            raise ValueError("serve=False needs push_to: the sink would neither serve nor push its values")
        if port is None:
            port = base_port + (identity_from_env().local_rank if local_rank is None else local_rank)
            if port > 65535:
                raise ValueError(f"base_port + local_rank = {port} is not a port")
        self.requested_port = port
        self.addr = addr
        self.serve = serve
        self.push_to = gateway  # the gateway's URL (an http:// added when the scheme was left out); None: no push
        self.push_job = push_job
        self.push_timeout = float(push_timeout)
        self.push_error: OSError | None = None  # the last push's failure; None after one that succeeded
        self.pushes = 0  # pushes that succeeded (one per group)
        self._version = 0  # writes so far: a flush pushes only when there were writes since the last push
        self._pushed_version = 0
        self.counters = CUMULATIVE_METRICS | frozenset(counters)  # running totals: counters, `_total`
        self._table = _Table(max_series)
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self._table)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._warned_series = False
        # the names and labels already worked out (the dispatcher thread's work per record stays a few lookups)
        self._label_ids: dict[Identity, dict[str, int]] = {}  # identity -> group -> label set id
        self._specs: dict[tuple[str, str], tuple[str, str, str]] = {}
        self.port: int | None = None  # the bound port; None while not serving
        self.bind_error: OSError | None = None
        if serve:
            self._bind()

    # -- the server ------------------------------------------------------------------------------------------------

    def _bind(self) -> None:
        try:
            server, thread = start_http_server(self.requested_port, addr=self.addr, registry=self._registry)
        except OSError as exc:
            self.bind_error = exc
            return
        thread.name = f"telemetrain-prometheus-{server.server_port}"
        self._server, self._thread = server, thread
        self.port = int(server.server_port)
        self.bind_error = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def address(self) -> tuple[str, int] | None:
        """The listening socket's address (host, port); None while not serving."""
        if self._server is None:
            return None
        host, port = self._server.socket.getsockname()[:2]
        return str(host), int(port)

    # -- records ---------------------------------------------------------------------------------------------------

    def write(self, records: Sequence[Any]) -> None:
        table = self._table
        counts: dict[tuple[int, str], int] = {}
        identity: Any = None
        groups: dict[str, int] = {}
        with table.lock:  # one batch, one lock: a scrape sees all of it or none
            for record in records:
                kind = record.kind
                if record.identity is not identity:  # one identity per batch, as a rule: hash it once
                    identity = record.identity
                    groups = self._label_ids.setdefault(identity, {})
                label_id = groups.get(record.group)
                if label_id is None:
                    label_id = groups[record.group] = table.label_id(_labels(identity, record.group))
                counted = (label_id, kind)
                counts[counted] = counts.get(counted, 0) + 1
                if kind == "metric":
                    self._put(record.name, record.unit, label_id, record.value)
                elif kind == "stat":
                    self._put_stat(record, label_id)
                elif kind == "event" and (record.group, record.name) == TRAINING_EVENT and record.attributes:
                    for attribute, value in record.attributes.items():
                        if type(value) in (int, float):  # numbers only: bools, strings and ids are not values
                            name, unit = _event_metric(attribute)
                            self._put(name, unit, label_id, value)
            for (label_id, kind), n in counts.items():
                table.add("telemetrain_records", "records received, by kind", self._kind_label_id(label_id, kind), n)
            dropped = table.dropped_series
        if dropped and not self._warned_series:
            self._warned_series = True
            warn_safely(f"telemetrain: prometheus sink holds max_series={table.max_series} series; new ones dropped")
        self._version += 1
        if self.serve and self._server is None and not self._closed:
            self._bind()
            if self.bind_error is not None:  # raised for the dispatcher to count, report and back off
                raise OSError(f"prometheus endpoint {self.addr}:{self.requested_port} not serving: {self.bind_error}")

    def _kind_label_id(self, label_id: int, kind: str) -> int:
        """The label set of ``telemetrain_records_total``: the record's identity labels and its kind."""
        table = self._table
        labels = {k: v for k, v in table.label_sets[label_id].items() if k != "group"}
        labels["kind"] = kind
        return table.label_id(labels)

    def _put(self, name: str, unit: str, label_id: int, value: float) -> None:
        spec = self._specs.get((name, unit))
        if spec is None:
            if len(self._specs) >= _CACHE_MAX:
                self._specs.clear()
            counter = name in self.counters or unit in CUMULATIVE_UNITS
            doc = f"{name} ({unit})" if unit else name
            spec = self._specs[(name, unit)] = (metric_name(name, unit), "counter" if counter else "gauge", doc)
        self._table.set(spec[0], spec[1], spec[2], label_id, float(value))

    def _put_stat(self, record: Any, label_id: int) -> None:
        base = metric_name(record.name, record.unit)
        doc = f"{record.name} ({record.unit})" if record.unit else record.name
        table = self._table
        table.set(base + "_count", "gauge", f"{record.name}: samples in the last window", label_id, record.sample_count)
        for agg, value in record.values.items():
            if agg != "count" and type(value) in (int, float):
                table.set(f"{base}_{_sanitise(agg)}", "gauge", f"{doc}: {agg} of the last window", label_id, value)

    # -- the push --------------------------------------------------------------------------------------------------

    def _push(self) -> None:
        """Push each group's series to the gateway; raise (for the dispatcher to count) if any push failed."""
        gateway = self.push_to
        if gateway is None or self._pushed_version == self._version:
            return  # nothing new (the close path flushes twice; a failed push is not retried without new records)
        self._pushed_version = self._version
        failure: OSError | None = None
        for group in self._table.push_groups():
            try:
                push_to_gateway(
                    gateway,
                    job=self.push_job,
                    registry=_PushGroup(self._table, group),
                    grouping_key=dict(zip(PUSH_GROUPING_KEY, group, strict=True)),
                    timeout=self.push_timeout,
                )
            except OSError as exc:  # URLError, HTTPError (a rejected push), a timeout
                failure = failure or exc
                if not isinstance(exc, urllib.error.HTTPError):
                    break  # the gateway is unreachable: the other groups would only wait for the same timeout
            else:
                self.pushes += 1
        self.push_error = failure
        if failure is not None:
            raise OSError(f"prometheus push to {gateway} (job {self.push_job!r}) failed: {failure}") from failure

    def flush(self) -> None:
        if not self._closed:
            self._push()

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        server, thread = self._server, self._thread
        self._server = self._thread = None
        self.port = None
        try:
            self._push()  # what the final flush has not pushed yet (a sink used without the dispatcher)
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
            if thread is not None:
                thread.join(5.0)

    def after_fork_in_child(self) -> None:
        # The parent's server thread does not exist here (shutdown() would wait for it forever): close only our copy
        # of the listening socket, so the parent keeps serving. The child binds anew at its next write.
        server = self._server
        self._server = self._thread = None
        self.port = None
        self._table.lock = threading.Lock()
        self._table.clear()
        self._label_ids.clear()
        # The push groups are keyed by run_id/rank, which a child shares with its parent: a push from here would
        # replace the parent's series with the child's. The child does not push.
        self.push_to = None
        if server is not None:
            server.socket.close()
