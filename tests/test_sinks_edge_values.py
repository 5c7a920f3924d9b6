"""Values at the edge are data. An int metric beyond a float's range (or OTLP's int64): every float-based backend
gets +-inf (or the float), read back with its own reader, and the batch around it is delivered; it failed the whole
batch before (an ``OverflowError`` in MLflow, Prometheus, TensorBoard and OpenTelemetry: the losses beside it were
lost). NaN and inf in OpenTelemetry, whose SDK refuses them: counted where a dashboard can see them."""

from __future__ import annotations

import math
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")
pytest.importorskip("prometheus_client")
pytest.importorskip("tensorboard")
pytest.importorskip("opentelemetry.exporter.otlp.proto.common")

from mlflow.tracking import MlflowClient
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing import event_accumulator  # type: ignore[import-untyped]

import telemetrain
from telemetrain.sinks.mlflow import MLflowSink
from telemetrain.sinks.otel import OTelSink
from telemetrain.sinks.prometheus import PrometheusSink
from telemetrain.sinks.tensorboard import TensorBoardSink

VALUES: dict[str, int] = {"big": 10**400, "neg": -(10**400), "u64": 2**64}
EXPECTED = {"big": math.inf, "neg": -math.inf, "u64": float(2**64), "loss": 0.5}


def test_an_int_beyond_float_range_is_inf_in_every_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    t = telemetrain.Telemetry(store=tmp_path / "store")
    mlflow_sink = MLflowSink((tmp_path / "mlruns").as_uri())
    prometheus = PrometheusSink(port=0)
    reader = InMemoryMetricReader()
    otel_sink = OTelSink(meter_provider=MeterProvider(metric_readers=[reader]), span_exporter=InMemorySpanExporter())
    for sink in (mlflow_sink, prometheus, TensorBoardSink(tmp_path / "tb"), otel_sink):
        t.add_sink(sink)
    t.metric("loss", 1.0, step=1)
    for name, value in VALUES.items():
        t.metric(name, value, step=1)
    t.metric("loss", 0.5, step=2)
    with pytest.warns(RuntimeWarning, match="NaN or infinite"):
        assert t.flush()

    text = urllib.request.urlopen(f"http://127.0.0.1:{prometheus.port}/metrics", timeout=10).read().decode()
    served = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    data: Any = reader.get_metrics_data()
    otel = {m.name: m.data.data_points[0].value for rm in data.resource_metrics for sm in rm.scope_metrics
            for m in sm.metrics}
    assert encode_metrics(data).ByteSize() > 0  # OTLP's encoder takes them (2**64 failed it: beyond int64)
    t.close()

    assert {s["sink"]: s["failures"] for s in t.health()["sinks"]} == {
        "jsonl": 0, "mlflow": 0, "prometheus": 0, "tensorboard": 0, "otel": 0}
    assert mlflow_sink.run_id is not None
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    assert {k: client.get_metric_history(mlflow_sink.run_id, k)[-1].value for k in EXPECTED} == EXPECTED
    assert {k: served[f"telemetrain_{k}"] for k in EXPECTED} == EXPECTED
    # OpenTelemetry's SDK refuses infinities: counted per series instead (test_a_nan_loss_is_counted_in_otel)
    assert {k: otel[f"telemetrain.{k}"] for k in ("u64", "loss")} == {"u64": float(2**64), "loss": 0.5}
    assert "telemetrain.big" not in otel and otel_sink.non_finite_values == 2
    ea = event_accumulator.EventAccumulator(str(tmp_path / "tb" / t.identity.run_id / "rank0"))
    ea.Reload()
    tb = {k: ea.Scalars(k)[-1].value for k in EXPECTED}
    assert (tb["big"], tb["neg"], tb["loss"]) == (math.inf, -math.inf, 0.5)
    assert tb["u64"] == pytest.approx(2**64, rel=1e-6)  # float32


def test_a_nan_loss_is_counted_in_otel_not_silently_stale(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The SDK's gauge drops a NaN (logging a warning per value): the loss series kept showing its last finite value
    # with nothing to tell the run diverged. The sink counts them per series in telemetrain.non_finite, warns once.
    reader = InMemoryMetricReader()
    t = telemetrain.Telemetry(store=tmp_path)
    sink = OTelSink(meter_provider=MeterProvider(metric_readers=[reader]), span_exporter=InMemorySpanExporter())
    t.add_sink(sink)
    t.metric("loss", 2.0, step=1)
    assert t.flush()
    with pytest.warns(RuntimeWarning, match="'telemetrain.loss' had a NaN") as caught:
        for step in range(2, 5):
            t.metric("loss", math.nan, step=step)
            t.metric("grad_norm", math.inf, step=step)
            assert t.flush()
    t.close()
    assert len([w for w in caught if "NaN" in str(w.message)]) == 1
    assert [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")] == []  # no SDK line per value
    data: Any = reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    counted = {p.attributes["telemetrain.metric"]: p.value for p in metrics["telemetrain.non_finite"].data.data_points}
    assert counted == {"telemetrain.loss": 3, "telemetrain.grad_norm": 3}
    assert metrics["telemetrain.non_finite"].data.is_monotonic and sink.non_finite_values == 6
