"""bench_core.py's telemetrain rows: what one call costs the calling (training) thread."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import _core_state as state
from _core_harness import bench, derived
from _core_state import EXTRA, SHORT_N
from _core_writer import _count_lines
from _method import NOTES

if TYPE_CHECKING:
    from telemetrain import Telemetry


# -- telemetrain: caller-side cost ----------------------------------------------------------------------------------


def _caller_side_telemetry(tmpdir: str) -> Telemetry:
    import telemetrain

    # The prof row emits 2 records per call: room for 2 full repeats' worth, nothing is dropped within a repeat.
    t = telemetrain.Telemetry(
        store=os.path.join(tmpdir, "caller"), queue_capacity=4 * state.ARGS.max_n + 10_000, flush_interval=3600.0
    )
    telemetrain.set_telemetry(t)
    return t


def _flusher(t: Telemetry) -> Callable[[], None]:
    def between() -> None:
        if not t.flush(timeout=300):
            raise RuntimeError("telemetrain flush timed out")

    return between


def section_telemetrain(tmpdir: str) -> None:
    import telemetrain
    from telemetrain import events as tevents
    from telemetrain import metrics as tmetrics

    lib = "telemetrain"
    t = _caller_side_telemetry(tmpdir)
    flush = _flusher(t)
    try:
        t.mute("quiet")
        bench(
            lib,
            '(a) metrics.put_metric("m", 1, "quiet"), group muted (nobody listens)',
            'put_metric("m", 1, "quiet")',
            {"put_metric": tmetrics.put_metric},
        )
        bench(
            lib,
            '(b) metrics.put_metric("m", 1, "grp") -> async JSONL (caller side)',
            'put_metric("m", 1, "grp")',
            {"put_metric": tmetrics.put_metric},
            between=flush,
        )

        def plain() -> None:
            pass

        @tmetrics.prof
        def profd() -> None:
            pass

        p0 = bench(lib, "call of empty fn (reference for @prof)", "f()", {"f": plain})
        p1 = bench(
            lib,
            "call of @metrics.prof-decorated empty fn -> async JSONL (caller side)",
            "f()",
            {"f": profd},
            between=flush,
        )
        derived(lib, "(c) @metrics.prof overhead = decorated - plain", p1, p0)

        ev = tevents.Event(name="bench", source=tevents.EventSource.WORKER, metadata={"k": "v", "step": 1})
        bench(
            lib,
            "(d) events.record(prebuilt Event) -> async JSONL (caller side)",
            "record(ev)",
            {"record": tevents.record, "ev": ev},
            between=flush,
        )
        bench(
            lib,
            '(e) t.metric("m", 1.0, "grp") -> async JSONL (caller side)',
            't.metric("m", 1.0, "grp")',
            {"t": t},
            between=flush,
        )

        # The same rows with a short queue: n = 10,000 per repeat, i.e. what the 0.2 s writer lets pile up at
        # 50,000 records/s. Records that pile up by the hundred thousand cost the garbage collector more (see pieces).
        short = min(SHORT_N, state.ARGS.max_n)
        sfx = f", n={short:,} per repeat (short queue)"
        bench(
            lib,
            "short (b) put_metric -> async JSONL" + sfx,
            'put_metric("m", 1, "grp")',
            {"put_metric": tmetrics.put_metric},
            between=flush,
            max_n=short,
        )
        s1 = bench(
            lib,
            "short: call of @metrics.prof-decorated empty fn" + sfx,
            "f()",
            {"f": profd},
            between=flush,
            max_n=short,
        )
        derived(lib, "short (c) @metrics.prof overhead = decorated - plain" + sfx, s1, p0)
        bench(
            lib,
            "short (d) events.record(prebuilt Event) -> async JSONL" + sfx,
            "record(ev)",
            {"record": tevents.record, "ev": ev},
            between=flush,
            max_n=short,
        )
        bench(
            lib,
            "short (e) t.metric -> async JSONL" + sfx,
            't.metric("m", 1.0, "grp")',
            {"t": t},
            between=flush,
            max_n=short,
        )

        flush()
        health = t.health()
        jsonl = next(s for s in health["sinks"] if s["sink"] == "jsonl")
        assert t.store is not None and t.store.path is not None  # made with store=; records written
        lines = _count_lines(t.store.path)
        EXTRA["caller_side"] = {
            "dropped": health["dropped"],
            "failed": health["failed"],
            "delivered": jsonl["delivered"],
            "file_lines": lines,
        }
        NOTES.append(
            f"telemetrain caller-side rows: Telemetry(queue_capacity={t.queue_capacity:,}, flush_interval=3600 s), "
            f"flush() between repeats outside the timed region; health(): dropped={health['dropped']}, "
            f"failed={health['failed']}, delivered={jsonl['delivered']:,} records, file has {lines:,} lines "
            "(1 header). These rows are the cost on the calling thread; the writer's cost is the throughput row."
        )
        if health["dropped"] or health["failed"] or lines != jsonl["delivered"] + 1:
            raise RuntimeError(f"caller-side run lost records: {health}, {lines} lines")
        if ev.id == "":
            raise RuntimeError("telemetrain events.record did not stamp the event")
    finally:
        t.close()
    telemetrain.set_telemetry(telemetrain.Telemetry(store=False))  # leave no closed instance as the default
