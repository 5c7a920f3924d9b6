"""OTelSink against the real OpenTelemetry SDK: in-memory span exporter and metric reader, the OTLP encoder."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry import trace as trace_api
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from conftest import run_dir_of
from telemetrain import Telemetry
from telemetrain.records import Event, SpanEnd, SpanStart, StatWindow
from telemetrain.sinks.otel import OTelSink, otel_resource
from telemetrain.spans import Tracer
from telemetrain.store import open_run


class Otel:
    """A Telemetry with a run store and an OTelSink on in-memory SDK providers."""

    def __init__(self, tmp_path: Path, **sink_kwargs: Any) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.t = Telemetry(store=tmp_path)
        self.sink = OTelSink(self.tracer_provider, self.meter_provider, **sink_kwargs)
        self.t.add_sink(self.sink)
        self.tracer = Tracer(self.t)

    def finished(self) -> dict[str, ReadableSpan]:
        assert self.t.flush()
        spans = self.spans.get_finished_spans()
        by_name = {s.name: s for s in spans}
        assert len(by_name) == len(spans), "span names are unique in these tests"
        return by_name

    def stored(self, kind: str) -> list[Any]:
        assert self.t.flush()
        return open_run(run_dir_of(self.t)).records(kind)

    def metrics(self) -> dict[str, Any]:
        assert self.t.flush()
        data = self.reader.get_metrics_data()
        assert data is not None
        return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}

    def close(self) -> None:
        self.t.close()
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture
def otel(tmp_path: Path) -> Iterator[Otel]:
    o = Otel(tmp_path)
    try:
        yield o
    finally:
        o.close()


def _span_hex(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.span_id:016x}"


def _parent_hex(span: ReadableSpan) -> str:
    return f"{span.parent.span_id:016x}" if span.parent is not None else ""


def _point(metric: Any, group: str) -> Any:
    points = [p for p in metric.data.data_points if p.attributes.get("telemetrain.group") == group]
    assert len(points) == 1, points
    return points[0]


# -- spans -------------------------------------------------------------------------------------------------------


def test_ids_parents_times_and_attributes_equal_the_run_store(otel: Otel) -> None:
    with otel.tracer.span("application", job="demo"):
        with otel.tracer.span("training_loop") as loop:
            with otel.tracer.span("model_forward", micro=1) as fwd:
                fwd.set_attribute("tokens", 4096)
            loop.set_attributes({"epochs": 2, "tags": ["a", "b"], "cfg": {"lr": 0.1}, "big": 2**70})
    spans = otel.finished()
    starts = {r.span_id: r for r in otel.stored("span_start")}
    ends = {r.span_id: r for r in otel.stored("span_end")}
    assert set(spans) == {"application", "training_loop", "model_forward"}
    for name, span in spans.items():
        sid = _span_hex(span)
        start, end = starts[sid], ends[sid]
        assert start.name == name
        assert span.context is not None and f"{span.context.trace_id:032x}" == start.trace_id
        assert _parent_hex(span) == start.parent_id
        assert span.start_time == start.wall_ns and span.end_time == end.wall_ns
        assert span.status.status_code is StatusCode.OK
        assert span.attributes is not None and span.attributes["telemetrain.group"] == "spans"
    assert spans["application"].parent is None
    assert _parent_hex(spans["model_forward"]) == _span_hex(spans["training_loop"])
    assert _parent_hex(spans["training_loop"]) == _span_hex(spans["application"])
    # start attributes and end attributes; values OTLP cannot hold become strings
    fwd_attrs = dict(spans["model_forward"].attributes or {})
    assert fwd_attrs["micro"] == 1 and fwd_attrs["tokens"] == 4096
    loop_attrs = dict(spans["training_loop"].attributes or {})
    assert loop_attrs["epochs"] == 2 and tuple(cast(Sequence[str], loop_attrs["tags"])) == ("a", "b")
    assert loop_attrs["cfg"] == repr({"lr": 0.1}) and loop_attrs["big"] == str(2**70)
    assert dict(spans["application"].attributes or {})["job"] == "demo"


def test_statuses_error_and_terminated(otel: Otel) -> None:
    with pytest.raises(ValueError):
        with otel.tracer.span("failing"):
            raise ValueError("boom")
    otel.tracer.start("left_open", make_current=False)  # still open when the Telemetry closes: "terminated"
    with otel.tracer.span("fine"):
        pass
    otel.t.close()
    spans = {s.name: s for s in otel.spans.get_finished_spans()}
    assert spans["failing"].status.status_code is StatusCode.ERROR
    assert spans["failing"].status.description == "ValueError: boom"
    assert spans["left_open"].status.status_code is StatusCode.ERROR
    # with why it was ended (an explicit close here; "... stopped by SIGTERM" when the process dies of it)
    assert spans["left_open"].status.description == "terminated: still open when telemetry closed (exit or signal)"
    assert spans["fine"].status.status_code is StatusCode.OK


def test_sampled_out_middle_span(otel: Otel) -> None:
    """Parent-based sampling: a span inside a sampled-out one is not exported and its events go to the nearest
    exported ancestor; a failure inside one exports the chain, so every parent link still resolves."""
    otel.tracer.sample("middle", every=2)
    with otel.tracer.span("outer_ok"):
        with otel.tracer.span("middle"):  # the first: exported
            pass
        with otel.tracer.span("middle"):  # the second: sampled out
            with otel.tracer.span("inner_ok") as inner:
                inner.add_event("seen_in_inner", {"k": 1})
    with pytest.raises(RuntimeError):
        with otel.tracer.span("outer_fail"):
            with otel.tracer.span("middle"):  # the third: exported
                pass
            with otel.tracer.span("middle"):  # the fourth: sampled out, until its child fails
                with otel.tracer.span("inner_fail"):
                    raise RuntimeError("inside a sampled-out span")
    assert otel.t.flush()
    spans = otel.spans.get_finished_spans()
    names = [s.name for s in spans]
    assert "inner_ok" not in names
    assert names.count("middle") == 3  # two sampled in, one exported with its failing child
    outer_ok = next(s for s in spans if s.name == "outer_ok")
    assert [e.name for e in outer_ok.events] == ["seen_in_inner"]  # linked to the grandparent
    assert dict(outer_ok.events[0].attributes or {})["k"] == 1
    inner_fail = next(s for s in spans if s.name == "inner_fail")
    by_id = {_span_hex(s): s for s in spans}
    middle = by_id[_parent_hex(inner_fail)]
    assert middle.name == "middle"
    assert by_id[_parent_hex(middle)].name == "outer_fail"
    starts = {r.span_id: r.parent_id for r in otel.stored("span_start")}
    assert {_span_hex(s): _parent_hex(s) for s in spans} == starts  # every link as in the run store


def test_parent_by_id_when_the_parent_record_comes_later_or_never(otel: Otel) -> None:
    """A 3-level chain given as records: the child names its nearest exported ancestor (the grandparent; the middle
    was sampled out), and arrives before it (short spans travel at their end, children first)."""
    ident = otel.t.identity
    trace = "0af7651916cd43dd8448eb211c80319c"
    grand, child = "b7ad6b7169203331", "00f067aa0ba902b7"
    t0 = 1_700_000_000_000_000_000
    records = [
        Event(t0 + 5, t0 + 5, ident, "spans", "early_event", span_id=child),  # before its span's start
        SpanStart(t0 + 2, t0 + 2, ident, "spans", "child", child, grand, trace, {"level": 3}),
        SpanEnd(t0 + 8, t0 + 8, ident, "spans", "child", child, 6),
        SpanStart(t0, t0, ident, "spans", "grandparent", grand, "", trace),
        SpanEnd(t0 + 10, t0 + 10, ident, "spans", "grandparent", grand, 10),
        SpanEnd(t0 + 11, t0 + 11, ident, "spans", "never_started", "1111111111111111", 3),
    ]
    for r in records:
        otel.t.emit(r)
    spans = otel.finished()
    assert _parent_hex(spans["child"]) == grand and _span_hex(spans["child"]) == child
    assert spans["child"].context is not None and f"{spans['child'].context.trace_id:032x}" == trace
    assert spans["child"].start_time == t0 + 2 and spans["child"].end_time == t0 + 8
    assert [e.name for e in spans["child"].events] == ["early_event"]
    assert spans["child"].events[0].timestamp == t0 + 5
    assert spans["grandparent"].parent is None
    assert otel.sink.unmatched_ends == 1


def test_pending_events_are_bounded(tmp_path: Path) -> None:
    o = Otel(tmp_path, max_pending_events=3)
    try:
        ident = o.t.identity
        for i in range(5):  # linked to spans this sink never sees
            o.t.emit(Event(i, i, ident, "spans", "orphan", span_id=f"{i + 1:016x}"))
        assert o.t.flush()
        assert o.sink.dropped_events == 2
    finally:
        o.close()


def test_the_applications_current_otel_span_is_untouched(otel: Otel) -> None:
    """The sink never attaches a context: the application's current span is the same after our spans are built in
    its own thread, and our root spans do not become children of it."""
    app_provider = TracerProvider()
    app_tracer = app_provider.get_tracer("app")
    with app_tracer.start_as_current_span("app_request") as app_span:
        with otel.tracer.span("ours_root"):
            with otel.tracer.span("ours_child"):
                pass
        records = otel.stored("span_start") + otel.stored("span_end")
        direct = OTelSink(otel.tracer_provider, otel.meter_provider)
        records.sort(key=lambda r: (r.wall_ns, r.kind != "span_start"))
        direct.write(records)  # in this thread, under the application's current span
        direct.flush()
        assert trace_api.get_current_span() is app_span
    assert trace_api.get_current_span() is trace_api.INVALID_SPAN
    roots = [s for s in otel.spans.get_finished_spans() if s.name == "ours_root"]
    assert len(roots) == 2 and all(s.parent is None for s in roots)
    app_trace = app_span.get_span_context().trace_id
    assert all(s.context is not None and s.context.trace_id != app_trace for s in otel.spans.get_finished_spans())
    app_provider.shutdown()


def test_spans_encode_as_otlp_protobuf(otel: Otel) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    with otel.tracer.span("root", n=1, ratio=0.5, flag=True, name_list=["x"]):
        with pytest.raises(KeyError):
            with otel.tracer.span("child") as child:
                child.add_event("note", {"detail": "d"})
                raise KeyError("k")
    assert otel.t.flush()
    spans = otel.spans.get_finished_spans()
    request = encode_spans(spans)
    encoded = request.SerializeToString()
    assert encoded
    proto_spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert {s.span_id.hex() for s in proto_spans} == {r.span_id for r in otel.stored("span_start")}
    child_proto = next(s for s in proto_spans if s.name == "child")
    assert child_proto.parent_span_id.hex() == next(r.parent_id for r in otel.stored("span_start") if r.name == "child")
    assert child_proto.status.code == 2 and [e.name for e in child_proto.events] == ["note"]


# -- metrics -----------------------------------------------------------------------------------------------------


def test_metric_points_become_gauges_and_counters(otel: Otel) -> None:
    otel.t.metric("loss", 0.75, group="train", step=3)
    otel.t.metric("loss", 0.5, group="train", step=4)  # a gauge: the latest value
    otel.t.metric("system.memory.usage", 1024, group="system", unit="By", attributes={"system.memory.state": "used"})
    for gpu, value in (("0", 10.0), ("0", 25.0), ("1", 7.0)):  # a cumulative reading per device
        otel.t.metric("hw.energy", value, group=f"system.gpu.{gpu}", unit="J", attributes={"hw.id": gpu,
                                                                                         "hw.type": "gpu"})
    otel.t.metric("nan_seen", True, group="train")
    otel.t.metric("train.phase.duration", 0.1, group="training", unit="s", attributes={"train.phase": "forward"})
    otel.t.metric("node.energy", 1.5, group="power", unit="kWh")  # joules in another scale: a counter too
    metrics = otel.metrics()
    node_energy = metrics["telemetrain.node.energy"]
    assert node_energy.unit == "kWh" and node_energy.data.is_monotonic
    assert _point(node_energy, "power").value == 1.5
    loss = metrics["telemetrain.loss"]
    assert _point(loss, "train").value == 0.5
    assert set(_point(loss, "train").attributes) == {"telemetrain.group"}  # no step label
    mem = metrics["system.memory.usage"]  # an OTel namespace: no prefix; the convention's attributes, no group
    ((attrs, value),) = [(dict(p.attributes), p.value) for p in mem.data.data_points]
    assert mem.unit == "By" and value == 1024 and attrs == {"system.memory.state": "used"}
    energy = metrics["hw.energy"]
    assert energy.unit == "J" and energy.data.is_monotonic  # a Sum: a counter
    by_gpu = {p.attributes["hw.id"]: p.value for p in energy.data.data_points}
    assert by_gpu == {"0": 25.0, "1": 7.0}
    assert {p.attributes["hw.type"] for p in energy.data.data_points} == {"gpu"}
    assert _point(metrics["telemetrain.nan_seen"], "train").value == 1
    phase = _point(metrics["telemetrain.train.phase.duration"], "training")
    assert dict(phase.attributes) == {"telemetrain.group": "training", "train.phase": "forward"}


def test_stat_windows_become_gauges_per_aggregation(otel: Otel) -> None:
    ident = otel.t.identity
    mono, wall = otel.t.now()
    histogram = {"scale": 6, "zero_count": 0, "positive": {"offset": 10, "counts": [1, 2]}, "negative": {}}
    otel.t.emit(
        StatWindow(mono, wall, ident, "stats", "step_time", mono - 10**9, 100,
                   {"count": 100, "mean": 0.013, "p99": 0.02, "rate": 100.0}, "s", histogram)
    )
    metrics = otel.metrics()
    assert _point(metrics["telemetrain.step_time.mean"], "stats").value == 0.013
    assert _point(metrics["telemetrain.step_time.p99"], "stats").value == 0.02
    assert metrics["telemetrain.step_time.p99"].unit == "s"
    assert metrics["telemetrain.step_time.count"].unit == "{sample}"
    rate = metrics["telemetrain.step_time.rate"]  # samples per second of the window: not seconds per second
    assert rate.unit == "{sample}/s" and _point(rate, "stats").value == 100.0


# -- own providers, failures, packaging --------------------------------------------------------------------------


class _FailingSpans(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        return SpanExportResult.FAILURE


class _RaisingMetrics(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.calls += 1
        raise ConnectionError("collector down")

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def test_own_providers_carry_the_identity_resource(tmp_path: Path) -> None:
    spans = InMemorySpanExporter()
    t = Telemetry(store=False)
    t.set_identity(run_id="run-7", session_tag="sess-1", perf_tag="llama", rank=0, local_rank=0, host="node-a")
    t.add_sink(OTelSink(span_exporter=spans, metric_exporter=_RaisingMetrics()), kinds="span_start,span_end".split(","))
    with Tracer(t).span("step"):
        pass
    assert t.flush()
    (span,) = spans.get_finished_spans()
    attrs = dict(span.resource.attributes)
    assert attrs["service.name"] == "llama"
    assert attrs["telemetrain.run_id"] == "run-7" and attrs["telemetrain.session_tag"] == "sess-1"
    assert attrs["telemetrain.rank"] == 0 and attrs["telemetrain.local_rank"] == 0 and attrs["host.name"] == "node-a"
    assert dict(otel_resource(t.identity).attributes)["telemetrain.perf_tag"] == "llama"
    t.close()


def test_a_failing_exporter_is_counted_and_training_goes_on(tmp_path: Path) -> None:
    spans, metrics = _FailingSpans(), _RaisingMetrics()
    t = Telemetry(store=tmp_path)
    t.add_sink(OTelSink(span_exporter=spans, metric_exporter=metrics))
    tr = Tracer(t)
    with pytest.warns(RuntimeWarning, match="otel"):
        for step in range(3):
            with tr.span("iteration"):
                t.metric("loss", 1.0 / (step + 1), group="train")
            assert t.flush()
    health = next(s for s in t.health()["sinks"] if s["sink"] == "otel")
    assert spans.calls >= 1 and metrics.calls >= 1
    assert health["failures"] >= 2 and health["failed"] >= 1
    assert "failed" in health["last_error"] or "collector down" in health["last_error"]
    t.close()
    # the run store is whole: training and its other sink never saw the failure
    assert len(open_run(run_dir_of(t)).records("span_end")) == 3
    assert len(open_run(run_dir_of(t)).records("metric")) == 3


def test_a_collector_that_never_answers_does_not_outlast_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    # The default OTLP exporters, against a collector that takes the connection and never answers: the first export
    # gives up at export_timeout (10 s by default, the exporters' own; 2 s here), the later ones, while exports fail,
    # after 1 s, so the final flush (spans, metrics) stays inside close's 5 s and the sink is not abandoned.
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    for var in ("", "_TRACES", "_METRICS"):
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP{var}_TIMEOUT", raising=False)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # connections complete in the kernel's backlog; nothing reads or answers them
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        t = Telemetry(store=tmp_path)
        sink = OTelSink(export_timeout=2.0)
        t.add_sink(sink)
        tr = Tracer(t)
        with pytest.warns(RuntimeWarning, match="otel"):
            for step in range(3):
                with tr.span("iteration"):
                    t.metric("loss", 1.0 / (step + 1), group="train")
            t.flush(timeout=30)  # the first failure, at the full timeout
            assert "timeout" in t.health()["sinks"][-1]["last_error"].lower()  # why, from the exporter's complaint
            t.close()
    health = next(s for s in t.health()["sinks"] if s["sink"] == "otel")
    assert health["abandoned"] is False and health["failures"] >= 1
    assert sink.dropped_spans == 3 and "3 spans and 0 histogram points" in health["last_error"]
    assert [th.name for th in threading.enumerate() if th.name.startswith("telemetrain-otel")] == []
    assert len(open_run(run_dir_of(t)).records("span_end")) == 3
    # warned once (above), not once more per retry and per batch by the exporters' own logging
    assert [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry.exporter")] == []
    logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter").warning("the application's own")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry.exporter")] == [
        "the application's own"]  # only the sink's exports are quiet


def test_export_timeout_is_checked_and_the_standard_variables_win(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="export_timeout"):
        OTelSink(span_exporter=InMemorySpanExporter(), metric_exporter=_CapturingMetrics(), export_timeout=0)
    for var in ("", "_TRACES", "_METRICS"):
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP{var}_TIMEOUT", raising=False)
    sink = OTelSink(span_exporter=InMemorySpanExporter(), metric_exporter=_CapturingMetrics(), export_timeout=2.5)
    assert (sink._otlp_timeout("TRACES"), sink._otlp_timeout("METRICS")) == (2.5, 2.5)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "7")  # the exporter reads it (None: not overridden)
    assert (sink._otlp_timeout("TRACES"), sink._otlp_timeout("METRICS")) == (None, 2.5)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "7")
    assert sink._otlp_timeout("METRICS") is None


def test_without_the_sdk_one_import_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['opentelemetry.sdk.trace'] = None\n"
        "try:\n    import telemetrain.sinks.otel\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'telemetrain[otel]'" in out


def test_without_the_otlp_exporter_defaults_need_the_extra() -> None:
    code = (
        "import sys; sys.modules['opentelemetry.exporter.otlp.proto.http.trace_exporter'] = None\n"
        "from telemetrain.sinks.otel import OTelSink\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "OTelSink(TracerProvider(), metric_exporter=None, meter_provider=None)\n"
        "try:\n    OTelSink()\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "telemetrain[otel]" in out


class _CapturingMetrics(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.exported: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.exported.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def test_a_stat_histogram_is_an_otel_exponential_histogram(tmp_path: Path) -> None:
    """A stat with the histogram aggregation: each window goes out, through the sink's own reader, as a delta
    exponential-histogram data point with the window's buckets, count, sum, min and max, and encodes as OTLP."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.sdk.metrics.export import ExponentialHistogram

    from telemetrain.stats import Stat

    exporter = _CapturingMetrics()
    t = Telemetry(store=tmp_path)
    t.add_sink(OTelSink(TracerProvider(), metric_exporter=exporter))
    stat = Stat("step_time", ["histogram", "sum", "min", "max"], samples=50, unit="s", telemetry=t)
    for k in range(100):  # two windows
        stat.add(0.01 + 0.001 * (k % 17))
    assert t.flush()
    windows = [r for r in open_run(tmp_path / t.identity.session_tag / t.identity.run_id).records("stat")
               if r.name == "step_time"]
    points = [(m, p) for data in exporter.exported for rm in data.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics if isinstance(m.data, ExponentialHistogram) for p in m.data.data_points]
    assert len(windows) == 2 and len(points) == 2
    for window, (metric, point) in zip(windows, points, strict=True):
        assert metric.name == "telemetrain.step_time" and metric.unit == "s"
        h = window.histogram
        assert (point.scale, point.zero_count) == (h["scale"], h["zero_count"])
        assert (point.positive.offset, list(point.positive.bucket_counts)) == (h["positive"]["offset"],
                                                                                h["positive"]["counts"])
        assert point.count == 50 and point.sum == pytest.approx(window.values["sum"])
        assert (point.min, point.max) == (window.values["min"], window.values["max"])
        assert point.time_unix_nano == window.wall_ns
    assert encode_metrics(exporter.exported[-1]).resource_metrics  # OTLP protobuf
    t.close()


def test_a_histogram_without_min_and_max_leaves_them_unset_in_otlp(tmp_path: Path) -> None:
    """A stat that keeps no min or max: OTLP's optional min/max are left unset (not NaN, which a backend would show
    as the minimum), as the OTLP encoder writes them and opentelemetry-proto reads them back."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from telemetrain.stats import Stat

    exporter = _CapturingMetrics()
    t = Telemetry(store=tmp_path)
    t.add_sink(OTelSink(TracerProvider(), metric_exporter=exporter))
    stat = Stat("step_time", ["histogram", "sum"], samples=10, unit="s", telemetry=t)
    for k in range(10):
        stat.add(0.01 * (k + 1))
    assert t.flush()
    t.close()
    wire = [ExportMetricsServiceRequest.FromString(encode_metrics(data).SerializeToString())
            for data in exporter.exported]
    (point,) = [p for request in wire for rm in request.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics if m.WhichOneof("data") == "exponential_histogram"
                for p in m.exponential_histogram.data_points]
    assert point.count == 10 and point.sum == pytest.approx(0.55)
    assert not point.HasField("min") and not point.HasField("max")


def test_the_gauges_of_an_export_with_histograms_reach_the_wire(tmp_path: Path) -> None:
    """A stat's histogram points go out in the SDK's own scope of the same export: the OTLP encoder keys scopes by
    name and version, so a second ``telemetrain`` scope replaced the first, and with it every gauge and counter."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    from telemetrain.stats import Stat

    exporter = _CapturingMetrics()
    t = Telemetry(store=tmp_path)
    t.add_sink(OTelSink(TracerProvider(), metric_exporter=exporter))
    stat = Stat("step_time", ["histogram", "sum"], samples=4, unit="s", telemetry=t)
    t.metric("loss", 0.5, group="train")
    t.metric("train.samples", 32, unit="{sample}", group="train")
    for k in range(4):
        stat.add(0.01 * (k + 1))
    assert t.flush()
    t.close()
    wire = [sorted((sm.scope.name, m.name) for rm in encode_metrics(data).resource_metrics
                   for sm in rm.scope_metrics for m in sm.metrics) for data in exporter.exported]
    assert wire[0] == [("telemetrain", "telemetrain.loss"), ("telemetrain", "telemetrain.step_time"),
                       ("telemetrain", "telemetrain.step_time.sum"), ("telemetrain", "telemetrain.train.samples")]
