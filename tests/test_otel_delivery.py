"""OTelSink's delivery to a collector that is slow, restarting or gone: the SDK's own OTLP/HTTP exporters against a
receiver built on ``opentelemetry-proto`` (``test_otel_conventions._Receiver``) that answers late or with 503."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="needs the otel extra")
pytest.importorskip("opentelemetry.semconv._incubating.metrics", reason="needs opentelemetry-semantic-conventions")

from conftest import run_dir_of
from telemetrain import Telemetry
from telemetrain.sinks.otel import OTelSink
from telemetrain.spans import Tracer
from telemetrain.store import open_run
from test_otel_conventions import _Receiver


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Receiver]:
    for var in ("", "_TRACES", "_METRICS"):
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP{var}_TIMEOUT", raising=False)
    server = _Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.base)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _otel_health(t: Telemetry) -> dict[str, Any]:
    return next(s for s in t.health()["sinks"] if s["sink"] == "otel")


def _while_down(tmp_path: Path, receiver: _Receiver) -> tuple[Telemetry, OTelSink, Tracer]:
    """A Telemetry exporting to ``receiver``, which answers 503 (a collector restarting) until told otherwise."""
    receiver.unavailable = True
    t = Telemetry(store=tmp_path)
    sink = OTelSink(export_timeout=2.0)
    t.add_sink(sink)
    return t, sink, Tracer(t)


def _spans(tr: Tracer, n: int) -> None:
    for step in range(n):
        with tr.span(f"down-{step}"):
            pass


def test_a_slow_collector_gets_every_batch(tmp_path: Path, receiver: _Receiver) -> None:
    # A collector that takes 1.5 s to answer: within the OTLP exporters' own default timeout (10 s), so nothing is
    # lost (the former 1 s default failed every export and dropped every batch).
    receiver.delay_s = 1.5
    t = Telemetry(store=tmp_path)
    sink = OTelSink()
    assert sink.export_timeout == 10.0
    t.add_sink(sink)
    tr = Tracer(t)
    for step in range(3):
        with tr.span(f"iteration-{step}"):
            t.metric("loss", 1.0 / (step + 1), group="train")
    assert t.close(timeout=30)
    health = _otel_health(t)
    assert health["failures"] == 0, health["last_error"]
    assert sorted(span.name for _, span in receiver.spans()) == ["iteration-0", "iteration-1", "iteration-2"]
    assert "telemetrain.loss" in receiver.metric_points()


def test_a_restarting_collector_gets_the_spans_of_its_outage(tmp_path: Path, receiver: _Receiver) -> None:
    # 503 while the collector restarts: the exports fail (counted, warned once) but their spans are kept and sent
    # with the first export after it is back, in order; nothing is dropped.
    t, sink, tr = _while_down(tmp_path, receiver)
    with pytest.warns(RuntimeWarning, match="otel"):
        _spans(tr, 2)
        t.flush(timeout=30)
    down = _otel_health(t)
    assert down["failures"] >= 1 and "2 spans kept" in str(down["last_error"])
    receiver.unavailable = False
    with tr.span("up"):
        pass
    assert t.close(timeout=30)
    assert [span.name for _, span in receiver.spans()] == ["down-0", "down-1", "up"]
    assert sink.dropped_spans == 0 and _otel_health(t)["abandoned"] is False


def test_kept_spans_are_bounded_and_the_loss_at_close_is_counted(tmp_path: Path, receiver: _Receiver,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("telemetrain.sinks.otel.export.MAX_KEPT_SPANS", 3)
    t, sink, tr = _while_down(tmp_path, receiver)
    with pytest.warns(RuntimeWarning, match="otel"):
        _spans(tr, 5)
        t.flush(timeout=30)
        assert sink.dropped_spans == 2  # the two oldest: the bound holds while the collector is down
        assert t.close(timeout=30)  # the collector never came back: the three kept spans are lost, and counted
    assert sink.dropped_spans == 5
    health = _otel_health(t)
    assert health["abandoned"] is False and "3 spans and 0 histogram points" in str(health["last_error"])
    assert receiver.spans() == []


def test_a_rejected_batch_is_dropped_and_counted_not_sent_again(tmp_path: Path, receiver: _Receiver) -> None:
    # 400: the collector will never take that batch, so keeping it would block every later span behind it
    receiver.rejecting = True
    t = Telemetry(store=tmp_path)
    sink = OTelSink(export_timeout=2.0)
    t.add_sink(sink)
    tr = Tracer(t)
    with pytest.warns(RuntimeWarning, match="otel"):
        with tr.span("rejected"):
            pass
        t.flush(timeout=30)
    assert sink.dropped_spans == 1 and "code: 400" in _otel_health(t)["last_error"]
    receiver.rejecting = False
    with tr.span("after"):
        pass
    assert t.close(timeout=30)
    assert [span.name for _, span in receiver.spans()] == ["after"]
    assert sink.dropped_spans == 1


def test_a_slow_collector_after_a_transient_error_gets_the_full_timeout_again(
        tmp_path: Path, receiver: _Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    # One 503 puts the sink on its 1 s exporters; a collector that answers in 1.5 s would then fail every export for
    # good. The full timeout is tried again every FULL_RETRY_S (0 here: at once).
    monkeypatch.setattr("telemetrain.sinks.otel.export.FULL_RETRY_S", 0.0)
    receiver.delay_s, receiver.unavailable = 1.5, True
    t = Telemetry(store=tmp_path)
    sink = OTelSink(export_timeout=3.0)
    t.add_sink(sink)
    tr = Tracer(t)
    with pytest.warns(RuntimeWarning, match="otel"):
        with tr.span("during-the-error"):
            pass
        t.flush(timeout=30)
    assert _otel_health(t)["failures"] >= 1
    receiver.unavailable = False
    with tr.span("after"):
        pass
    assert t.close(timeout=30)
    # at least once: a request the collector took but answered after the client's timeout is sent again (the same
    # span ids, which a backend can deduplicate)
    assert {span.name for _, span in receiver.spans()} == {"during-the-error", "after"}
    assert sink.dropped_spans == 0


def _sent(receiver: _Receiver) -> list[tuple[str, Any, Any]]:
    """(metric name, data kind, the metric's data) of every metric of every metrics request, in order."""
    with receiver.lock:
        requests = list(receiver.metrics)
    return [(m.name, m.WhichOneof("data"), getattr(m, m.WhichOneof("data"))) for request in requests
            for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]


def test_a_batch_stored_but_answered_too_late_comes_again_with_the_same_ids(tmp_path: Path,
                                                                           receiver: _Receiver) -> None:
    # The collector stores the first request of each signal but answers after the client's timeout: the sink sends
    # it again (at least once). The receiver can tell the copies: each span keeps the run store's trace and span ids,
    # each stat window's histogram point its window (start, end); counters are cumulative from one start, so a copy
    # or a lost export changes nothing.
    from telemetrain.stats import Stat

    receiver.late_once, receiver.late_s = {"/v1/traces", "/v1/metrics"}, 3.0
    t = Telemetry(store=tmp_path)
    sink = OTelSink(export_timeout=1.0)
    t.add_sink(sink)
    tr = Tracer(t)
    stat = Stat("step_time", ["histogram", "sum"], samples=4, unit="s", telemetry=t)

    def steps(first: int, last: int) -> None:
        for step in range(first, last):
            with tr.span(f"it-{step}"):
                t.metric("train.samples", 8.0 * (step + 1), unit="{sample}", group="train")
                t.metric("loss", 1.0 / (step + 1), group="train")
                for k in range(4):
                    stat.add(0.01 * (k + 1))

    with pytest.warns(RuntimeWarning, match="otel"):
        steps(0, 3)
        t.flush(timeout=30)
    assert "timeout" in str(_otel_health(t)["last_error"]).lower()
    steps(3, 5)
    assert t.close(timeout=30)
    assert sink.dropped_spans == 0 and sink.dropped_histograms == 0

    store = open_run(run_dir_of(t))
    ours = {(r.trace_id, r.span_id): r.name for r in store.records("span_start")}
    copies: dict[tuple[str, str], list[bytes]] = {}
    for _, span in receiver.spans():
        copies.setdefault((span.trace_id.hex(), span.span_id.hex()), []).append(span.SerializeToString())
    assert {key: ours.get(key) for key in copies} == ours  # the run store's ids, every span
    assert max(len(c) for c in copies.values()) == 2  # the late batch came twice ...
    assert all(len(set(c)) == 1 for c in copies.values())  # ... each copy the same span

    windows = [r for r in store.records("stat") if r.name == "step_time"]
    points: dict[tuple[int, int], list[bytes]] = {}
    for name, kind, data in _sent(receiver):
        if name == "telemetrain.step_time" and kind == "exponential_histogram":
            assert data.aggregation_temporality == 1  # delta, each point one window
            for p in data.data_points:
                points.setdefault((p.start_time_unix_nano, p.time_unix_nano), []).append(p.SerializeToString())
    assert len(points) == len(windows) == 5 and max(len(c) for c in points.values()) == 2
    assert all(len(set(c)) == 1 for c in points.values())

    samples = [d for name, kind, d in _sent(receiver) if name == "telemetrain.train.samples"]
    assert len(samples) == len(receiver.metrics) >= 2  # in every export, the late one included
    assert {(d.aggregation_temporality, d.is_monotonic) for d in samples} == {(2, True)}  # cumulative
    assert len({p.start_time_unix_nano for d in samples for p in d.data_points}) == 1
    assert samples[-1].data_points[0].as_double == 40.0
    # the gauges go out with the histograms of the same export (one scope), not replaced by them
    assert len([d for name, _, d in _sent(receiver) if name == "telemetrain.loss"]) == len(receiver.metrics)


def test_delta_counters_of_a_failed_export_are_sent_again(tmp_path: Path, receiver: _Receiver,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # A backend that asks for delta sums (OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta): each export
    # carries only the increase since the last, so the increase of an export that failed (503 while the collector
    # restarts) was lost for good. It is kept and sent again, like the histogram points: the deltas received add up.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    t, sink, _ = _while_down(tmp_path, receiver)
    with pytest.warns(RuntimeWarning, match="otel"):
        for step in range(3):
            t.metric("train.samples", 8.0 * (step + 1), unit="{sample}", group="train")
        t.flush(timeout=30)
    assert _otel_health(t)["failures"] >= 1
    receiver.unavailable = False
    for step in range(3, 5):
        t.metric("train.samples", 8.0 * (step + 1), unit="{sample}", group="train")
    assert t.close(timeout=30)
    samples = [d for name, _, d in _sent(receiver) if name == "telemetrain.train.samples"]
    assert {d.aggregation_temporality for d in samples} == {1}  # delta, as asked
    windows = sorted((p.start_time_unix_nano, p.time_unix_nano, p.as_double) for d in samples for p in d.data_points)
    assert sum(value for _, _, value in windows) == 40.0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(windows))  # adjacent windows, none twice
    assert sink.dropped_histograms == 0
