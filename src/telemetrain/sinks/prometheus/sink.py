"""``PrometheusSink``: the latest value of each metric, served over HTTP for a Prometheus server to scrape.

Needs the ``prometheus`` extra (``pip install 'telemetrain[prometheus]'``: prometheus_client). The sink runs behind
the dispatcher like every I/O sink: its ``write`` folds a batch into an in-memory table under one lock, and a scrape
(prometheus_client's HTTP server, in its own thread, on a private ``CollectorRegistry``) copies the table under the
same lock, so a scrape sees whole batches. With ``push_to`` the sink also pushes the table to a Pushgateway at each
``flush`` and at ``close``, in the sink's thread (short jobs). Mapping and names: ``docs/backends/prometheus.md``.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ...extras import missing_extra

try:
    from prometheus_client import CollectorRegistry, push_to_gateway, start_http_server
    from prometheus_client.metrics_core import Metric
except ImportError as exc:  # one clear message naming the extra
    raise missing_extra("telemetrain.sinks.prometheus", "prometheus_client", "prometheus", exc) from None

from ...cumulative import is_cumulative
from ...dispatch import warn_safely
from ...identity import Identity, identity_from_env
from ...stats.aggregations import quantile_of
from ...ucum import is_ucum
from ..base import Sink, as_float
from .names import labels_of, metric_name, unit_of
from .table import DEFAULT_RANGE, RANGES, Table

__all__ = ["DEFAULT_BASE_PORT", "DEFAULT_PUSH_JOB", "PUSH_GROUPING_KEY", "PrometheusSink"]

# 9464 is the port Prometheus' exporter list gives OpenTelemetry's in-process Prometheus exporter: an application's
# own metrics endpoint, which is what this is. Daemons usually found on a GPU node (node exporter 9100, DCGM exporter
# 9400) stay clear of 9464..9471 for 8 ranks a node.
DEFAULT_BASE_PORT = 9464
DEFAULT_MAX_SERIES = 10_000
DEFAULT_PUSH_JOB = "telemetrain"
DEFAULT_PUSH_TIMEOUT_S = 3.0
PUSH_GROUPING_KEY = ("run_id", "rank")  # a Pushgateway group per process of a run: its pushes replace only its own
RUN_INFO = "telemetrain_run"  # the info metric: telemetrain_run_info{run_id=..., ...} 1
INFO_FIELDS = ("run_id", "session_tag", "perf_tag", "rank", "local_rank", "world_size", "host", "restart_count", "role")
_CACHE_MAX = 4096
# a stat's aggregations served as gauges of the last window, beside its histogram or summary: <name>_<aggregation>
STAT_GAUGES = {"min": "min", "max": "max", "stddev": "stddev", "value": "last"}


class _PushGroup:
    """What one push sends (prometheus_client's push takes any object with ``collect``): one group's series."""

    def __init__(self, table: Table, group: tuple[str, ...]) -> None:
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

    Series carry the label ``rank`` and the record's attributes; the rest of the run identity is in the info metric
    ``telemetrain_run_info{run_id=..., session_tag=..., ...} 1`` (join ``on(instance, rank)``: a rank set after
    start leaves one info series per rank), so a restart does not start a new set of every series. Stats are
    histograms (with the ``histogram`` aggregation) or summaries; values are served in base units (``ms`` ->
    seconds); a unit that is not UCUM is warned about once.

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
        self.counters = frozenset(counters)  # running totals of yours: counters, `_total` (cumulative.py: ours)
        self._table = Table(max_series)
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self._table)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._warned_series = False
        self._warned_unit = False
        self._warned_rename = False
        self.non_ucum_units: set[str] = set()  # units seen that are not UCUM (served without a unit suffix)
        # the names and labels already worked out (the dispatcher thread's work per record stays a few lookups)
        self._label_ids: dict[Identity, int] = {}  # identity -> its label set (no attributes)
        self._info_ids: dict[tuple[str, str], int] = {}  # run_id/rank -> the label set of its info series
        self._attr_label_ids: dict[tuple[Any, ...], int] = {}  # (identity, attributes) -> label set
        self._specs: dict[tuple[str, str], tuple[str, str, str, float]] = {}
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
        base_id = 0
        with table.lock:  # one batch, one lock: a scrape sees all of it or none
            for record in records:
                kind = record.kind
                if record.identity is not identity:  # one identity per batch, as a rule: hash it once
                    identity = record.identity
                    found = self._label_ids.get(identity)
                    base_id = self._identity_labels(identity) if found is None else found
                counted = (base_id, kind)
                counts[counted] = counts.get(counted, 0) + 1
                if kind == "metric":
                    attributes = record.attributes
                    label_id = self._attribute_labels(identity, attributes) if attributes else base_id
                    self._put(record.name, record.unit, label_id, record.value)
                elif kind == "stat":
                    self._put_stat(record, base_id)
            for (label_id, kind), n in counts.items():
                table.add("telemetrain_records", "records received, by kind", self._kind_label_id(label_id, kind), n)
            dropped = table.dropped_series
        if table.renamed and not self._warned_rename:
            self._warned_rename = True
            warn_safely(f"telemetrain: prometheus: {sorted(table.renamed)[0]!r} names two kinds of series (a metric "
                        "and a stat, say); the later kind is served as <name>_<type> (histogram, summary, gauge, "
                        "counter): give them distinct names")
        if dropped and not self._warned_series:
            self._warned_series = True
            warn_safely(f"telemetrain: prometheus sink holds max_series={table.max_series} series; new ones dropped")
        self._version += 1
        if self.serve and self._server is None and not self._closed:
            self._bind()
            if self.bind_error is not None:  # raised for the dispatcher to count, report and back off
                raise OSError(f"prometheus endpoint {self.addr}:{self.requested_port} not serving: {self.bind_error}")

    def _identity_labels(self, identity: Identity) -> int:
        """The label set of an identity's series (``rank``), and its ``telemetrain_run_info`` series."""
        group = (identity.run_id, str(identity.rank))
        table = self._table
        label_id = self._label_ids[identity] = table.label_id({"rank": str(identity.rank)}, group)
        info = table.label_id(_info_labels(identity), group)
        replaced = self._info_ids.get(group)
        if replaced is not None and replaced != info:
            # the identity changed but not its run_id/rank (world_size set once the process group is up): one info
            # series per run_id/rank, the current one, or a join on(instance, rank) finds two and fails
            table.discard(RUN_INFO, replaced)
        self._info_ids[group] = info
        table.set(RUN_INFO, "info", "the run identity of this process (join on instance and rank)", info, 1.0)
        return label_id

    def _attribute_labels(self, identity: Identity, attributes: dict[str, Any]) -> int:
        key = (identity, *attributes.items())
        found = self._attr_label_ids.get(key)
        if found is None:
            if len(self._attr_label_ids) >= 100_000:  # bounded, whatever attributes come (max_series bounds the rest)
                self._attr_label_ids.clear()
            labels = {**labels_of(attributes), "rank": str(identity.rank)}
            found = self._attr_label_ids[key] = self._table.label_id(labels, (identity.run_id, str(identity.rank)))
        return found

    def _kind_label_id(self, label_id: int, kind: str) -> int:
        """The label set of ``telemetrain_records_total``: the record's identity labels and its kind."""
        table = self._table
        return table.label_id({**table.label_sets[label_id], "kind": kind}, table.group_keys[label_id])

    def _check_unit(self, name: str, unit: str) -> None:
        if not is_ucum(unit):
            self.non_ucum_units.add(unit)
            if not self._warned_unit:
                self._warned_unit = True
                warn_safely(f"telemetrain: unit {unit!r} of metric {name!r} is not a UCUM unit (https://ucum.org): "
                            "Prometheus gets no unit suffix for it. Use 's' for seconds, 'By' for bytes, '1' for a "
                            "ratio, '{thing}' for a count, '' for none (further units are not warned about)")

    def _spec(self, name: str, unit: str) -> tuple[str, str, str, float]:
        """(Prometheus name, type, help, factor to the base unit) of a metric."""
        spec = self._specs.get((name, unit))
        if spec is None:
            if len(self._specs) >= _CACHE_MAX:
                self._specs.clear()
            self._check_unit(name, unit)
            counter = name in self.counters or is_cumulative(name, unit)
            base, factor = unit_of(unit)
            # the record's name and unit; a converted value says so, or HELP "(ms)" would sit over seconds
            doc = name if not unit else f"{name} ({unit})" if base == unit else f"{name} ({unit}, served in {base})"
            spec = self._specs[(name, unit)] = (metric_name(name, unit, counter=counter),
                                                "counter" if counter else "gauge", doc, factor)
        return spec

    def _put(self, name: str, unit: str, label_id: int, value: float) -> None:
        prom, type_, doc, factor = self._spec(name, unit)
        self._table.set(prom, type_, doc, label_id, as_float(value) * factor if factor != 1.0 else as_float(value))

    def _put_stat(self, record: Any, label_id: int) -> None:
        """A stat window: its histogram into a classic histogram, else its quantiles into a summary (count and sum
        cumulative either way); min, max, stddev and the last value as gauges of the last window."""
        prom, _, doc, factor = self._spec(record.name, record.unit)
        values = record.values
        total = values.get("sum")
        if total is None and values.get("mean") is not None:
            total = values["mean"] * (record.sample_count - values.get("nan_count", 0) - values.get("inf_count", 0))
        quantiles: dict[float, float] = {}
        if record.histogram is None:
            for agg, value in values.items():
                q = quantile_of(agg)
                if q is not None and type(value) in (int, float):
                    quantiles[round(q, 9)] = as_float(value)  # p99.9 -> 0.999, not 0.9990000000000001
        base = unit_of(record.unit)[0]
        table = self._table
        table.observe(prom, f"{doc}: the samples of every window", label_id, record.sample_count, total,
                      record.histogram, factor, RANGES.get(base, DEFAULT_RANGE), quantiles)
        for agg, suffix in STAT_GAUGES.items():
            value = values.get(agg)
            if type(value) in (int, float):
                table.set(f"{prom}_{suffix}", "gauge", f"{doc}: {agg} of the last window", label_id,
                          as_float(value) * factor)

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
        self._attr_label_ids.clear()  # (their ids point into the table just cleared)
        self._info_ids.clear()
        # The push groups are keyed by run_id/rank, which a child shares with its parent: a push from here would
        # replace the parent's series with the child's. The child does not push.
        self.push_to = None
        if server is not None:
            server.socket.close()


def _info_labels(identity: Identity) -> dict[str, str]:
    return {f: str(getattr(identity, f)) for f in INFO_FIELDS}
