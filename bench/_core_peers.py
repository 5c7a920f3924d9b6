"""bench_core.py's baseline and the peers' rows: torchelastic, prometheus_client, the OpenTelemetry SDK."""

from __future__ import annotations

from _core_harness import _empty, bench, derived

# -- baseline and peers -------------------------------------------------------------------------------------------


def section_baseline() -> None:
    bench("baseline", "empty loop (`pass`)", "pass")
    bench("baseline", "empty function call `f()`", "f()", {"f": _empty})


def section_torchelastic() -> None:
    from torch.distributed.elastic import events, metrics

    lib = "torchelastic"
    metrics.configure(metrics.NullMetricHandler(), "grp")
    bench(
        lib,
        'metrics.put_metric("m", 1, "grp"), NullMetricHandler',
        'put_metric("m", 1, "grp")',
        {"put_metric": metrics.put_metric},
    )

    metrics.configure(metrics.NullMetricHandler())  # the default group's handler, used by @prof

    def plain() -> None:
        pass

    @metrics.prof
    def profd() -> None:
        pass

    p0 = bench(lib, "call of empty fn (reference for @prof)", "f()", {"f": plain})
    p1 = bench(lib, "call of @metrics.prof-decorated empty fn", "f()", {"f": profd})
    derived(lib, "@metrics.prof overhead = decorated - plain", p1, p0)

    ev = events.Event(name="bench", source=events.EventSource.WORKER, metadata={"k": "v", "step": 1})
    bench(lib, 'events.record(prebuilt Event) -> "null" destination', "record(ev)", {"record": events.record, "ev": ev})


def section_prometheus() -> None:
    import prometheus_client as pc

    reg = pc.CollectorRegistry()
    c = pc.Counter("bench_c", "c", registry=reg)
    bench("prometheus_client", "Counter.inc() (private CollectorRegistry)", "c.inc()", {"c": c})


def section_otel() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])  # used directly, never set globally
    try:
        counter = provider.get_meter("bench").create_counter("bench.c")
        bench("opentelemetry-sdk", "counter.add(1) (MeterProvider + InMemoryMetricReader)", "c.add(1)", {"c": counter})
        reader.get_metrics_data()  # the pipeline really works
    finally:
        provider.shutdown()
