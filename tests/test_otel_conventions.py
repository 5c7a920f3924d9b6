"""OpenTelemetry's conventions, checked with the real parts: an OTLP/HTTP receiver built on ``opentelemetry-proto``
receives what ``OTelSink`` exports through the SDK's own OTLP exporters. The system sampler's names, attributes and
units are checked against the ``opentelemetry-semantic-conventions`` package's own constants (and its instrument
factories: units and instrument kinds); root spans carry random W3C trace ids, which a ``TraceIdRatioBased`` sampler
splits; the run's config is in the resource.

The checks of the sampler's names and samples need the [system] extra (psutil) too, and skip without it; the rest
runs with the [otel] extra alone (CI runs this module in a venv that has only that extra)."""

from __future__ import annotations

import gzip
import importlib
import inspect
import pkgutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="needs the otel extra")
pytest.importorskip("opentelemetry.semconv._incubating.metrics", reason="needs opentelemetry-semantic-conventions")

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.semconv._incubating import metrics as semconv_metrics
from opentelemetry.semconv._incubating.attributes import (
    disk_attributes,
    hw_attributes,
    network_attributes,
    system_attributes,
)
from opentelemetry.semconv.attributes import error_attributes

from telemetrain import Telemetry, semconv
from telemetrain.sinks.otel import OTelSink
from telemetrain.spans import Tracer

SPANS = 400


def _value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value"))


class _Receiver(ThreadingHTTPServer):
    """OTLP/HTTP (protobuf) on 127.0.0.1: every request decoded with opentelemetry-proto's own messages."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.traces: list[Any] = []
        self.metrics: list[Any] = []
        self.lock = threading.Lock()
        self.delay_s = 0.0  # a slow collector: each answer waits this long
        self.unavailable = False  # a collector restarting: 503, which the OTLP exporters retry
        self.rejecting = False  # a collector that rejects what it gets: 400, which no one sends again
        # paths (/v1/traces, /v1/metrics) whose next request is stored, then answered only after late_s: the client
        # has timed out meanwhile and sends it again (at-least-once delivery's duplicate)
        self.late_once: set[str] = set()
        self.late_s = 0.0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) of every span received."""
        with self.lock:
            requests = list(self.traces)
        return [({a.key: _value(a.value) for a in rs.resource.attributes}, span)
                for request in requests for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]

    def metric_points(self) -> dict[str, list[tuple[Any, str, dict[str, Any], float]]]:
        """name -> [(metric, data kind, point attributes, value)] of the metrics received (the last export of each)."""
        with self.lock:
            requests = list(self.metrics)
        out: dict[str, list[tuple[Any, str, dict[str, Any], float]]] = {}
        for request in requests:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        kind = metric.WhichOneof("data")
                        points = getattr(metric, kind).data_points
                        out[metric.name] = [
                            (metric, kind, {a.key: _value(a.value) for a in p.attributes},
                             p.as_double if p.WhichOneof("value") == "as_double" else p.as_int)
                            for p in points
                        ] if kind in ("gauge", "sum") else [(metric, kind, {}, 0.0)]
        return out

    def resources(self) -> list[dict[str, Any]]:
        with self.lock:
            requests = list(self.metrics)
        return [{a.key: _value(a.value) for a in rm.resource.attributes}
                for request in requests for rm in request.resource_metrics]


class _Handler(BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.server.delay_s:
            time.sleep(self.server.delay_s)
        if self.server.unavailable or self.server.rejecting:
            self.send_error(503 if self.server.unavailable else 400)
            return
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path == "/v1/traces":
            request: Any = ExportTraceServiceRequest.FromString(body)
            response: Any = ExportTraceServiceResponse()
            target = self.server.traces
        elif self.path == "/v1/metrics":
            request = ExportMetricsServiceRequest.FromString(body)
            response = ExportMetricsServiceResponse()
            target = self.server.metrics
        else:
            self.send_error(404)
            return
        with self.server.lock:
            target.append(request)
            late = self.path in self.server.late_once
            self.server.late_once.discard(self.path)
        if late:
            time.sleep(self.server.late_s)
            return  # the client gave up long ago: no one to answer
        payload = response.SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    server = _Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _package_metrics() -> dict[str, Any]:
    """Every metric the semantic-conventions package defines: name -> the instrument its own factory creates on an
    SDK meter (its kind, unit and description are the package's)."""
    meter = MeterProvider().get_meter("semconv-check")
    out: dict[str, Any] = {}
    for module_info in pkgutil.iter_modules(semconv_metrics.__path__):
        module = importlib.import_module(f"{semconv_metrics.__name__}.{module_info.name}")
        for constant, name in vars(module).items():
            factory = getattr(module, f"create_{constant.lower()}", None)
            if constant.isupper() and isinstance(name, str) and factory is not None:
                takes_callbacks = len(inspect.signature(factory).parameters) > 1
                out[name] = factory(meter, None) if takes_callbacks else factory(meter)
    return out


_KINDS = {"_Counter": ("sum", True), "_UpDownCounter": ("sum", False), "_ObservableGauge": ("gauge", None),
          "_Gauge": ("gauge", None), "_ObservableCounter": ("sum", True), "_ObservableUpDownCounter": ("sum", False)}


def test_our_convention_strings_are_the_packages() -> None:
    assert semconv.DISK_IO_DIRECTION == disk_attributes.DISK_IO_DIRECTION
    assert semconv.NETWORK_IO_DIRECTION == network_attributes.NETWORK_IO_DIRECTION
    assert semconv.SYSTEM_MEMORY_STATE == system_attributes.SYSTEM_MEMORY_STATE
    assert semconv.SYSTEM_PAGING_STATE == system_attributes.SYSTEM_PAGING_STATE
    assert semconv.SYSTEM_FILESYSTEM_STATE == system_attributes.SYSTEM_FILESYSTEM_STATE
    assert semconv.SYSTEM_FILESYSTEM_MOUNTPOINT == system_attributes.SYSTEM_FILESYSTEM_MOUNTPOINT
    assert semconv.SYSTEM_DEVICE == system_attributes.SYSTEM_DEVICE
    assert semconv.HW_ID == hw_attributes.HW_ID and semconv.HW_TYPE == hw_attributes.HW_TYPE
    assert semconv.ERROR_TYPE == error_attributes.ERROR_TYPE
    enums = {
        semconv.DISK_IO_DIRECTION: disk_attributes.DiskIoDirectionValues,
        semconv.NETWORK_IO_DIRECTION: network_attributes.NetworkIoDirectionValues,
        semconv.SYSTEM_MEMORY_STATE: system_attributes.SystemMemoryStateValues,
        semconv.SYSTEM_PAGING_STATE: system_attributes.SystemPagingStateValues,
        semconv.SYSTEM_FILESYSTEM_STATE: system_attributes.SystemFilesystemStateValues,
    }
    for _, attributes in semconv.SYSTEM_SERIES.values():
        for key, value in attributes.items():
            if key in enums:
                assert value in {member.value for member in enums[key]}, (key, value)
    # every convention metric we name: defined by the package, not deprecated, with the package's unit and kind
    package = _package_metrics()
    for name in semconv.SEMCONV_METRICS:
        instrument = package[name]
        assert not instrument.description.startswith("Deprecated"), name
        kind, monotonic = _KINDS[type(instrument).__name__]
        ours = ("sum", True) if name in semconv.SEMCONV_COUNTERS else ("sum", False) if (
            name in semconv.SEMCONV_UPDOWN) else ("gauge", None)
        assert (kind, monotonic) == ours, name


def test_the_system_samplers_names_are_the_packages() -> None:
    pytest.importorskip("psutil", reason="the system sampler's names: telemetrain.system needs the [system] extra")
    from telemetrain.system.names import CATALOGUE, device_attributes, record_series

    gpu = device_attributes("system.gpu.3")
    assert gpu == {hw_attributes.HW_ID: "3", hw_attributes.HW_TYPE: hw_attributes.HwTypeValues.GPU.value}
    package = _package_metrics()
    for key, (unit, _) in CATALOGUE.items():
        name, record_unit, _ = record_series("system", key)
        assert record_unit == unit
        if name in package:
            assert name in semconv.SEMCONV_METRICS, f"{name}: a convention metric the backends would prefix"
            assert package[name].unit == unit, name
        elif name.startswith(("system.", "process.", "hw.", "container.")):
            assert name not in semconv.SEMCONV_METRICS  # ours, in a reserved namespace: the backends prefix it
    assert "process.open_file_descriptor.count" not in {record_series("system", k)[0] for k in CATALOGUE}


def test_an_otlp_receiver_sees_the_system_samples_under_the_conventions(tmp_path: Path,
                                                                        receiver: _Receiver) -> None:
    pytest.importorskip("psutil", reason="the system sampler: telemetrain.system needs the [system] extra")
    from telemetrain.system import Sampler

    t = Telemetry(store=tmp_path)
    t.add_sink(OTelSink(span_exporter=OTLPSpanExporter(endpoint=f"{receiver.base}/v1/traces"),
                        metric_exporter=OTLPMetricExporter(endpoint=f"{receiver.base}/v1/metrics")))
    sampler = Sampler(t, interval=60.0, host=True, disk_paths=[str(tmp_path)])
    try:
        sampler.sample_now()
        sampler.sample_now()  # the second sample has utilisations (deltas) too
        assert t.flush()
    finally:
        sampler.stop()
        t.close()

    # metrics: the conventions' names, kinds, units and attributes, as the package defines them
    package = _package_metrics()
    points = receiver.metric_points()
    for name, entries in points.items():
        if name.startswith(("system.", "process.", "hw.")):
            assert name in package, f"{name}: not a convention name, yet in OpenTelemetry's namespace"
            metric, kind, _, _ = entries[0]
            instrument = package[name]
            assert not instrument.description.startswith("Deprecated"), name
            assert metric.unit == instrument.unit, name
            want_kind, monotonic = _KINDS[type(instrument).__name__]
            assert kind == want_kind, name
            if kind == "sum":
                assert metric.sum.is_monotonic is monotonic, name
    disk = {p[2][disk_attributes.DISK_IO_DIRECTION] for p in points["system.disk.io"]}
    assert disk <= {v.value for v in disk_attributes.DiskIoDirectionValues} and disk == {"read", "write"}
    network = points.get("system.network.io")
    if network:  # a machine with a physical or virtual interface besides loopback
        assert {p[2][network_attributes.NETWORK_IO_DIRECTION] for p in network} == {"receive", "transmit"}
    (memory,) = points["system.memory.usage"]
    assert memory[2] == {system_attributes.SYSTEM_MEMORY_STATE: system_attributes.SystemMemoryStateValues.USED.value}
    (filesystem,) = points["system.filesystem.usage"]
    assert filesystem[2][system_attributes.SYSTEM_FILESYSTEM_STATE] == "used"
    assert Path(filesystem[2][system_attributes.SYSTEM_FILESYSTEM_MOUNTPOINT]) in (tmp_path, *tmp_path.parents)
    assert "process.unix.file_descriptor.count" in points and "process.open_file_descriptor.count" not in points
    assert "telemetrain.process.tree.memory.usage" in points  # ours: prefixed, out of the reserved namespace
    assert not any("telemetrain.group" in p[2] for e in points.values() for p in e if p[0].name.startswith("system"))


def test_an_otlp_receiver_sees_the_config_and_random_trace_ids(tmp_path: Path, receiver: _Receiver) -> None:
    config = {"lr": 3e-4, "model": {"layers": 12}}
    t = Telemetry(store=tmp_path, config=config)
    t.add_sink(OTelSink(span_exporter=OTLPSpanExporter(endpoint=f"{receiver.base}/v1/traces"),
                        metric_exporter=OTLPMetricExporter(endpoint=f"{receiver.base}/v1/metrics")))
    # the application's own provider, sampling half of the traces by trace id, exporting to the same receiver
    sampled = TracerProvider(sampler=TraceIdRatioBased(0.5), resource=Resource.create({"service.name": "sampled"}))
    sampled.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.base}/v1/traces")))
    t.add_sink(OTelSink(tracer_provider=sampled, meter_provider=MeterProvider()))
    try:
        t.metric("loss", 0.5, "train", step=1)  # a metric export, which carries the resource
        tracer = Tracer(t)
        for i in range(SPANS):
            with tracer.span("step", i=i):
                pass
        assert t.flush()
    finally:
        t.close()
        sampled.shutdown()

    (resource,) = {tuple(sorted(r.items())) for r in receiver.resources()}
    assert dict(resource)["telemetrain.config.lr"] == pytest.approx(3e-4)
    assert dict(resource)["telemetrain.config.model.layers"] == 12

    # traces: every root span a trace of its own, with random ids that a ratio sampler splits
    spans = receiver.spans()
    ours = [s for resource, s in spans if resource.get("service.name") != "sampled"]
    kept = [s for resource, s in spans if resource.get("service.name") == "sampled"]
    assert len(ours) == SPANS
    trace_ids = [int.from_bytes(s.trace_id, "big") for s in ours]
    assert len(set(trace_ids)) == SPANS
    stored = {r.trace_id for r in _stored(tmp_path, "span_start")}
    assert {f"{i:032x}" for i in trace_ids} == stored  # the receiver's ids are the run store's
    assert {a.key: _value(a.value) for a in ours[0].attributes}["telemetrain.config.lr"] == pytest.approx(3e-4)
    ratio = TraceIdRatioBased(0.5)
    decisions = [ratio.should_sample(None, tid, "step").decision.is_sampled() for tid in trace_ids]  # type: ignore[no-untyped-call]
    assert 0.35 * SPANS < sum(decisions) < 0.65 * SPANS  # ids from one process are split, not all-or-none
    # the application's sampler kept exactly the traces its ratio keeps
    assert sorted(int.from_bytes(s.trace_id, "big") for s in kept) == sorted(
        tid for tid, keep in zip(trace_ids, decisions, strict=True) if keep)


def _stored(root: Path, kind: str) -> list[Any]:
    from telemetrain.store import find_runs, open_run

    (run,) = find_runs(root)
    return list(open_run(run).records(kind))
