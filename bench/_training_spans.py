"""bench_training.py's section 2, spans: telemetrain's spans into a real run store, against OpenTelemetry SDK spans."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import _training_state as state
from _method import NOTES, paired, row_of
from _training_children import _count_store
from _training_harness import _require, bench
from _training_state import EXTRA

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan


# -- 2. spans -----------------------------------------------------------------------------------------------------


class _SpanStore:
    """The default Telemetry for the span rows: a caller-side one (writer asleep) and one with the writer awake."""

    def __init__(self, tmpdir: str) -> None:
        import telemetrain

        self.caller = telemetrain.Telemetry(
            store=os.path.join(tmpdir, "spans_caller"), flush_interval=3600.0, queue_capacity=4_010_000
        )
        self.awake = telemetrain.Telemetry(store=os.path.join(tmpdir, "spans_awake"), queue_capacity=4_010_000)
        self.previous = telemetrain.set_telemetry(self.caller)

    def flush(self) -> None:
        for t in (self.caller, self.awake):
            t.flush(120)

    def close(self) -> dict[str, Any]:
        import telemetrain

        if self.previous is not None:
            telemetrain.set_telemetry(self.previous)
        out = {}
        for label, t in (("caller side", self.caller), ("writer awake", self.awake)):
            ok = t.close(120)
            health = t.health()
            store = _count_store(t.store.path if t.store is not None else None)
            starts = sum(v for k, v in store.items() if k.startswith("span_start:"))
            ends = sum(v for k, v in store.items() if k.startswith("span_end:"))
            out[label] = {
                "span_starts": starts,
                "span_ends": ends,
                "dropped": health["dropped"],
                "failed": health["failed"],
                "ok": ok and starts == ends and starts > 0 and not health["dropped"] and not health["failed"],
            }
        return out


_STORES: list[_SpanStore] = []


def section_spans(tmpdir: str) -> None:
    import telemetrain
    from telemetrain.spans import span

    stores = _SpanStore(tmpdir)
    _STORES.append(stores)
    lib = "telemetrain"
    names = {"span": span}
    root = bench(
        lib,
        '`with span("it"): pass`, root span -> async JSONL (caller side)',
        'with span("it"): pass',
        names,
        between=stores.flush,
    )
    parent = span("parent")
    parent.__enter__()
    try:
        child = bench(
            lib,
            '`with span("it"): pass` inside an open `span("parent")`, child span -> async JSONL (caller side)',
            'with span("it"): pass',
            names,
            between=stores.flush,
        )
    finally:
        parent.__exit__(None, None, None)
    telemetrain.set_telemetry(stores.awake)
    try:
        bench(
            lib,
            '`with span("it"): pass`, root span -> async JSONL, writer awake (normal flush_interval: all-in)',
            'with span("it"): pass',
            names,
            between=stores.flush,
            peer=root,
        )
    finally:
        telemetrain.set_telemetry(stores.caller)
    EXTRA["span_rows"] = {"root": root["median_ns"], "child": child["median_ns"]}
    NOTES.append(
        "telemetrain spans: the default Telemetry is set (set_telemetry) to one whose writer sleeps during a repeat "
        "(flush_interval 3600 s, queue_capacity 4,010,000; flush() between repeats, outside the timed region), as "
        "bench_core.py's caller-side rows; the 'writer awake' row uses the normal 0.2 s flush_interval, so the "
        "writer's JSON encoding of the two records a span writes shares the GIL with the loop. Every span is "
        "exported (no sampling)."
    )


def section_otel_spans(tmpdir: str) -> None:
    _require("opentelemetry.sdk.trace", "opentelemetry-sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from telemetrain.spans import span

    class NoopExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    stores = _STORES[0] if _STORES else None
    flush = stores.flush if stores is not None else None
    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(NoopExporter()))
    tr = tp.get_tracer("bench_training")
    lib = "opentelemetry-sdk"
    stmt = 'with t.start_as_current_span("it"): pass'
    try:
        o_root = bench(
            lib,
            '`with tracer.start_as_current_span("it"): pass`, root, BatchSpanProcessor(no-op exporter)',
            stmt,
            {"t": tr},
        )
        with tr.start_as_current_span("parent"):
            o_child = bench(
                lib,
                '`with tracer.start_as_current_span("it"): pass` inside an open parent span, BatchSpanProcessor(no-op '
                "exporter)",
                stmt,
                {"t": tr},
            )
        for ours_op, peer in (
            ('`with span("it"): pass`, root span', o_root),
            ('`with span("it"): pass` inside an open `span("parent")`', o_child),
        ):
            r = row_of("telemetrain", ours_op)
            if r is not None:
                r["peer"] = f"{peer['library']} | {peer['operation']}"
                r["peer_median_ns"] = peer["median_ns"]
                r["ratio"] = r["median_ns"] / peer["median_ns"]
        if stores is not None:
            paired(
                "paired",
                'telemetrain `with span("it"): pass` root, interleaved with OTel\'s root span',
                'with span("it"): pass',
                {"span": span},
                o_root,
                stmt,
                {"t": tr},
                between=flush,
                collect=state.ARGS.collect,
            )
            with tr.start_as_current_span("parent"):
                parent = span("parent")
                parent.__enter__()
                try:
                    paired(
                        "paired",
                        'telemetrain `with span("it"): pass` child, interleaved with OTel\'s child span',
                        'with span("it"): pass',
                        {"span": span},
                        o_child,
                        stmt,
                        {"t": tr},
                        between=flush,
                        collect=state.ARGS.collect,
                    )
                finally:
                    parent.__exit__(None, None, None)
    finally:
        tp.shutdown()  # stops the processor's worker thread before the later sections
    NOTES.append(
        "OpenTelemetry SDK: a TracerProvider used directly (never set globally) with a BatchSpanProcessor whose "
        "exporter does nothing; shut down after its rows."
    )
