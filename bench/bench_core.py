#!/usr/bin/env python3
"""telemetrain's hot paths next to its peers', measured side by side in one process run.

Rows (ns per operation, median and best of ``--repeats``):

  baseline         empty loop, empty function call ``f()``
  torchelastic     ``put_metric`` (NullMetricHandler), ``@metrics.prof`` overhead, ``events.record`` ("null")
  prometheus       ``Counter.inc()`` (private CollectorRegistry)
  opentelemetry    SDK ``counter.add(1)`` (MeterProvider + InMemoryMetricReader, never set globally)
  telemetrain      ``put_metric`` to a muted group; ``put_metric``, ``@prof`` overhead, ``events.record`` and
                   ``Telemetry.metric`` through the async JSONL run-store sink (caller-side cost, see below)
  pieces           the ``put_metric`` hot path taken apart (call, default lookup, route lookup, clock, tuple,
                   enqueue, garbage collector), to explain where its time goes

plus the JSONL writer's sustained throughput (records/s from the first emit to the end of ``flush()``, file line
count checked) and a flood into a 10,000-record queue (drops counted, peak RSS growth).

Method: the peers method (``_method.py`` beside this script, that of the peer benchmark): each statement compiled
into its own loop, ``n`` calibrated to about ``--target-ms`` per repeat, GC enabled with ``gc.collect()`` before
each repeat, a busy loop first. Numbers include the loop overhead (the "empty loop" row).

Caller-side cost: telemetrain's writer thread encodes and writes on its own thread. In a training step that
overlaps with GPU/C++ work that releases the GIL; in a pure-Python loop it would steal the GIL from the
measuring loop instead. So the telemetrain rows use a Telemetry whose writer sleeps during a repeat
(``flush_interval`` = 3600 s, a queue large enough that nothing is dropped) and ``flush()`` between repeats,
outside the timed region, so every record is really written. The writer's own cost is the throughput row.

Usage:
    python bench/bench_core.py                 # full run (~90 s), markdown on stdout, progress on stderr
    python bench/bench_core.py --quick         # short smoke run
    python bench/bench_core.py --json out.json # also write the raw results
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import shutil
import statistics
import sys
import tempfile
import warnings
from collections import deque
from collections.abc import Callable
from itertools import repeat
from pathlib import Path
from time import monotonic_ns, perf_counter_ns
from typing import TYPE_CHECKING, Any

import _method
from _method import NOTES, RESULTS, difference_row, measure, new_row, progress, row_of

if TYPE_CHECKING:
    from telemetrain import Telemetry

warnings.filterwarnings("ignore")  # torch's "Failed to initialize NumPy", telemetrain's drop warning in the flood

ARGS: argparse.Namespace
EXTRA: dict[str, dict[str, Any]] = {}  # throughput / flood measurements
SHORT_N = 10_000  # ops per repeat of the "short queue" rows
DISTS = ("torch", "prometheus-client", "opentelemetry-sdk", "telemetrain", "psutil")  # versions reported


# -- harness (the peers method: _method.py) --------------------------------------------------------------------------


def bench(
    lib: str,
    op: str,
    stmt: str,
    names: dict[str, Any] | None = None,
    *,
    between: Callable[[], None] | None = None,
    gc_off: bool = False,
    max_n: int | None = None,
) -> dict[str, Any]:
    """Measure ``stmt``; ``between()`` runs after calibration and after every repeat, outside the timed region."""
    samples, n = measure(stmt, names, between=between, gc_off=gc_off, max_n=max_n)
    row = new_row(lib, op, samples, n)
    RESULTS.append(row)
    progress(f"{lib:<18} {op:<72} {row['median_ns']:9.1f} ns  (n={n})")
    return row


def derived(lib: str, op: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Row ``a - b`` (median - median, best - best; repeats: the differences of the paired repeats)."""
    row = difference_row(lib, op, a, b)
    RESULTS.append(row)
    progress(f"{lib:<18} {op:<72} {row['median_ns']:9.1f} ns")
    return row


# -- baseline and peers -------------------------------------------------------------------------------------------


def _empty() -> None:
    pass


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


# -- telemetrain: caller-side cost ----------------------------------------------------------------------------------


def _caller_side_telemetry(tmpdir: str) -> Telemetry:
    import telemetrain

    # The prof row emits 2 records per call: room for 2 full repeats' worth, nothing is dropped within a repeat.
    t = telemetrain.Telemetry(
        store=os.path.join(tmpdir, "caller"), queue_capacity=4 * ARGS.max_n + 10_000, flush_interval=3600.0
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
        short = min(SHORT_N, ARGS.max_n)
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


def _capture(routes: dict[str, Any], group: str, call: Callable[[], None]) -> tuple[Any, ...]:
    """The packed record a hot path hands to its route, captured by swapping the cached route for a moment (so
    these rows follow whatever layout ``src`` uses today)."""
    got: list[tuple[Any, ...]]
    real, got = routes[group], []
    routes[group] = got.append
    try:
        call()
    finally:
        routes[group] = real
    return got[0]


def _tracked_after_gc(rec: tuple[Any, ...]) -> str:
    """CPython creates every tuple GC-tracked and untracks it at a collection if no item can hold a reference
    cycle; a record that stays tracked is traversed again by every later collection while it is queued."""
    when_built = gc.is_tracked(rec)
    gc.collect()
    return (
        f"GC-tracked when built: {when_built}, after a collection: {gc.is_tracked(rec)} "
        "(CPython untracks a tuple whose items are all atomic: str, int, float, None, untracked tuples)"
    )


def _clock_slots(rec: tuple[Any, ...]) -> tuple[set[int], set[int]]:
    """Positions of the monotonic and the wall-clock readings in a packed record (ints within a minute of now)."""
    from time import time_ns

    now_mono, now_wall = monotonic_ns(), time_ns()
    ints = [(i, v) for i, v in enumerate(rec) if type(v) is int]
    return (
        {i for i, v in ints if abs(v - now_mono) < 60 * 10**9},
        {i for i, v in ints if abs(v - now_wall) < 60 * 10**9},
    )


def section_pieces(tmpdir: str) -> None:
    """The hot paths taken apart, each piece as its own statement (same harness, GC on unless stated).

    Uses telemetrain internals (``_default``, ``Telemetry._metric_routes``): if they change, this section is
    skipped with a note and the rest of the run is unaffected.
    """
    import telemetrain
    from telemetrain import events as tevents
    from telemetrain import metrics as tmetrics
    from telemetrain.telemetry import _default, get_telemetry

    lib = "pieces"
    t = _caller_side_telemetry(tmpdir)
    flush = _flusher(t)
    try:
        pm = tmetrics.put_metric
        pm("m", 1, "grp")  # resolve the route, start the writer
        flush()
        route = t._metric_routes["grp"]
        rec = _capture(t._metric_routes, "grp", lambda: pm("m", 1, "grp"))
        mono_at, wall_at = _clock_slots(rec)
        fields = {f"a{i}": v for i, v in enumerate(rec)}  # as variables: no constant folding

        def layout(rec_len: int, mono_expr: str, wall_expr: str) -> str:
            items = (mono_expr if i in mono_at else wall_expr if i in wall_at else f"a{i}" for i in range(rec_len))
            return "(" + ", ".join(items) + ")"

        tup, fresh = layout(len(rec), "v", "v + off"), layout(len(rec), "mono()", "0")
        shape = ", ".join(type(x).__name__ for x in rec)
        NOTES.append(
            f"pieces: put_metric hands its route a packed {len(rec)}-tuple ({shape}; monotonic clock at "
            f"{sorted(mono_at)}, wall clock at {sorted(wall_at)}); {_tracked_after_gc(rec)}"
        )

        def f3(a: object, b: object, c: object) -> None:
            pass

        bench(lib, 'call of an empty 3-argument function `f3("m", 1, "grp")`', 'f3("m", 1, "grp")', {"f3": f3})
        bench(
            lib,
            "default instance `_default.telemetry or get_telemetry()`",
            "_default.telemetry or get_telemetry()",
            {"_default": _default, "get_telemetry": get_telemetry},
        )
        bench(lib, 'route lookup `t._metric_routes.get("grp")`', 't._metric_routes.get("grp")', {"t": t})
        bench(lib, "clock read `time.monotonic_ns()`", "mono()", {"mono": monotonic_ns})
        wall_txt = ", wall = mono + offset" if wall_at else ""
        bench(
            lib,
            f"build the packed {len(rec)}-tuple{wall_txt} (discarded at once)",
            f"x = {tup}",
            dict(fields, v=123_456_789_012, off=987_654_321),
        )
        bench(
            lib,
            "enqueue: the real route called with one prebuilt record (same object queued n times)",
            "route(rec)",
            {"route": route, "rec": rec},
            between=flush,
        )
        q: deque[tuple[Any, ...]] = deque()  # a private queue: its append is a C call, whatever the real route is today
        names = dict(fields, enqueue=q.append, mono=monotonic_ns)
        bench(
            lib,
            "private deque.append of a fresh record as put_metric builds it, the queue keeps it",
            f"enqueue({fresh})",
            names,
            between=q.clear,
        )
        bench(lib, "same, GC disabled during the repeat", f"enqueue({fresh})", names, between=q.clear, gc_off=True)
        bench(
            lib,
            "same with one GC-tracked item (a class object in place of the kind) in the tuple",
            f"enqueue({fresh})",
            dict(names, a0=type(t)),
            between=q.clear,
        )
        bench(
            lib,
            'full put_metric("m", 1, "grp") -> async JSONL, GC disabled during the repeat',
            'put_metric("m", 1, "grp")',
            {"put_metric": pm},
            between=flush,
            gc_off=True,
        )

        # events.record: is its record still GC-tracked after a collection (it is if it holds a dict)?
        ev = tevents.Event(name="bench", source=tevents.EventSource.WORKER, metadata={"k": "v", "step": 1})
        tevents.record(ev)
        erec = _capture(t._event_routes, tevents.ELASTIC_GROUP, lambda: tevents.record(ev))
        NOTES.append(
            f"pieces: events.record hands its route a packed {len(erec)}-tuple "
            f"({', '.join(type(x).__name__ for x in erec)}); {_tracked_after_gc(erec)}"
        )
        bench(
            lib,
            "full events.record(prebuilt Event) -> async JSONL, GC disabled during the repeat",
            "record(ev)",
            {"record": tevents.record, "ev": ev},
            between=flush,
            gc_off=True,
        )
        flush()
        if t.health()["dropped"] or t.health()["failed"]:
            raise RuntimeError(f"pieces: records lost: {t.health()}")
    finally:
        t.close()
    telemetrain.set_telemetry(telemetrain.Telemetry(store=False))


# -- telemetrain: writer throughput and flood ---------------------------------------------------------------------


def _segments(path: str | os.PathLike[str]) -> list[Path]:
    """Every segment file of the process that writes ``path`` (the writer rolls to a new segment past 64 MiB)."""
    from telemetrain.store.segments import parse_segment_name, process_segments

    name = parse_segment_name(Path(path).name)
    groups = process_segments(Path(path).parent.iterdir())
    return groups.get((name.agent, name.rank, name.pid), [Path(path)]) if name is not None else [Path(path)]


def _count_lines(path: str | os.PathLike[str]) -> int:
    """Lines of the process's segments, less the header each segment after the first begins with."""
    total, files = 0, _segments(path)
    for f in files:
        with open(f, "rb") as fh:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return total - (len(files) - 1)


def _count_kind(path: str | os.PathLike[str], kind: str) -> int:
    needle = f'"kind":"{kind}"'.encode()
    total = 0
    for f in _segments(path):
        with open(f, "rb") as fh:
            total += sum(1 for line in fh if needle in line)
    return total


def _emit_loop(put_metric: Callable[[str, float, str], None]) -> Callable[[int], None]:
    def emit(n: int, pm: Callable[[str, float, str], None] = put_metric, _repeat: type[repeat[None]] = repeat) -> None:
        for _ in _repeat(None, n):
            pm("m", 1, "grp")

    return emit


def section_throughput(tmpdir: str) -> None:
    import telemetrain
    from telemetrain import metrics as tmetrics

    n = ARGS.throughput_n
    emit = _emit_loop(tmetrics.put_metric)
    runs = []
    for i in range(ARGS.throughput_runs):
        t = telemetrain.Telemetry(store=os.path.join(tmpdir, f"tput{i}"), queue_capacity=n + 10_000, flush_interval=0.2)
        telemetrain.set_telemetry(t)
        assert t.store is not None  # made with store=
        try:
            t.metric("warm", 0.0, "warm")  # open the file, start the writer, outside the timed region
            t.flush()
            base_bytes = t.store.bytes_written
            gc.collect()
            t0 = perf_counter_ns()
            emit(n)
            t1 = perf_counter_ns()
            ok = t.flush(timeout=600)
            t2 = perf_counter_ns()
            health = t.health()
            assert t.store.path is not None  # the warm-up record opened the file
            lines = _count_lines(t.store.path)
            metric_lines = _count_kind(t.store.path, "metric") - 1  # minus the warm-up record
            runs.append(
                {
                    "n": n,
                    "emit_s": (t1 - t0) / 1e9,
                    "total_s": (t2 - t0) / 1e9,
                    "records_per_s": n / ((t2 - t0) / 1e9),
                    "bytes": t.store.bytes_written - base_bytes,
                    "dropped": health["dropped"],
                    "flushed": ok,
                    "file_lines": lines,
                    "metric_lines": metric_lines,
                }
            )
            progress(f"throughput run {i + 1}: {runs[-1]['records_per_s']:,.0f} records/s, {lines:,} lines")
        finally:
            t.close()
    rates = [r["records_per_s"] for r in runs]
    EXTRA["throughput"] = {
        "runs": runs,
        "median_records_per_s": statistics.median(rates),
        "best_records_per_s": max(rates),
        "all_written": all(r["metric_lines"] == r["n"] and r["dropped"] == 0 for r in runs),
    }
    telemetrain.set_telemetry(telemetrain.Telemetry(store=False))


def section_flood(tmpdir: str) -> None:
    import psutil

    import telemetrain
    from telemetrain import metrics as tmetrics

    proc = psutil.Process()
    m, chunk = ARGS.flood_n, 50_000
    emit = _emit_loop(tmetrics.put_metric)
    t = telemetrain.Telemetry(store=os.path.join(tmpdir, "flood"), queue_capacity=10_000, flush_interval=0.2)
    telemetrain.set_telemetry(t)
    try:
        t.metric("warm", 0.0, "warm")
        t.flush()
        gc.collect()
        rss0 = peak = proc.memory_info().rss
        t0 = perf_counter_ns()
        done = 0
        while done < m:
            k = min(chunk, m - done)
            emit(k)
            done += k
            peak = max(peak, proc.memory_info().rss)
        t1 = perf_counter_ns()
        t.flush(timeout=120)
        t2 = perf_counter_ns()
        peak = max(peak, proc.memory_info().rss)
        health = t.health()
    finally:
        t.close()  # also writes the last "dropped" diagnostic record
    assert t.store is not None  # made with store=
    path = t.store.path
    assert path is not None  # the warm-up record opened the file
    written = _count_kind(path, "metric") - 1  # minus the warm-up record
    EXTRA["flood"] = {
        "offered": m,
        "queue_capacity": 10_000,
        "emit_s": (t1 - t0) / 1e9,
        "flush_s": (t2 - t1) / 1e9,
        "written": written,
        "dropped": health["dropped"],
        "diagnostic_lines": _count_kind(path, "diagnostic"),
        "bytes": t.store.bytes_written,
        "rss_before_mb": rss0 / 2**20,
        "rss_peak_growth_mb": (peak - rss0) / 2**20,
    }
    progress(f"flood: {EXTRA['flood']}")
    telemetrain.set_telemetry(telemetrain.Telemetry(store=False))


# -- checks and output ----------------------------------------------------------------------------------------------


def checks() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def med(lib: str, op: str) -> float | None:
        r = row_of(lib, op)
        return r["median_ns"] if r else None

    def ratio_check(
        num: int, title: str, ours: float | None, peer: float | None, limit: float, peer_name: str, limit_txt: str
    ) -> None:
        if ours is None or peer is None:
            out.append({"num": num, "title": title, "status": "SKIP", "text": f"{peer_name} not measured"})
            return
        ratio = ours / peer
        status = "PASS" if ratio <= limit else "GAP"
        out.append(
            {
                "num": num,
                "title": title,
                "status": status,
                "ours_ns": ours,
                "peer_ns": peer,
                "ratio": ratio,
                "limit": limit,
                "text": f"{ours:.1f} ns vs {peer_name} {peer:.1f} ns = {ratio:.3f}x (limit {limit_txt})",
            }
        )

    ratio_check(
        1,
        "put_metric to a muted group <= 3x empty call",
        med("telemetrain", "(a)"),
        med("baseline", "empty function call"),
        3.0,
        "empty call",
        "3x",
    )
    ratio_check(
        2,
        "put_metric through async JSONL <= 0.5x torchelastic put_metric (NullMetricHandler)",
        med("telemetrain", "(b)"),
        med("torchelastic", "metrics.put_metric"),
        0.5,
        "torchelastic",
        "0.5x",
    )
    ratio_check(
        3,
        "@prof overhead <= 0.3x torchelastic @prof overhead",
        med("telemetrain", "(c)"),
        med("torchelastic", "@metrics.prof overhead"),
        0.3,
        "torchelastic",
        "0.3x",
    )
    ratio_check(
        4,
        "event to async JSONL <= 1/25 of torchelastic events.record",
        med("telemetrain", "(d)"),
        med("torchelastic", "events.record"),
        1 / 25,
        "torchelastic",
        "1/25 = 0.04x",
    )

    tp, fl = EXTRA.get("throughput"), EXTRA.get("flood")
    title5 = "JSONL sustained >= 300k records/s; flood memory flat (growth < 50 MB) with drops counted"
    if tp is None or fl is None:
        out.append({"num": 5, "title": title5, "status": "SKIP", "text": "throughput or flood not measured"})
    else:
        rate = tp["median_records_per_s"]
        accounted = fl["written"] + fl["dropped"]
        ok_rate = rate >= 300_000 and tp["all_written"]
        ok_mem = fl["rss_peak_growth_mb"] < 50
        ok_drops = fl["dropped"] > 0 and accounted >= fl["offered"]
        status = "PASS" if ok_rate and ok_mem and ok_drops else "GAP"
        why = [
            w
            for ok, w in (
                (ok_rate, "throughput below 300k/s or lines missing"),
                (ok_mem, "RSS growth >= 50 MB"),
                (fl["dropped"] > 0, "no drops counted"),
                (
                    accounted >= fl["offered"],
                    f"{fl['offered'] - accounted:,} records neither written nor counted as dropped",
                ),
            )
            if not ok
        ]
        out.append(
            {
                "num": 5,
                "title": title5,
                "status": status,
                "records_per_s": rate,
                "rss_growth_mb": fl["rss_peak_growth_mb"],
                "dropped": fl["dropped"],
                "text": f"{rate:,.0f} records/s (median of {len(tp['runs'])} runs, all lines written: "
                f"{tp['all_written']}); "
                f"flood: RSS growth {fl['rss_peak_growth_mb']:.1f} MB, {fl['dropped']:,} dropped + "
                f"{fl['written']:,} written = {accounted:,} of {fl['offered']:,} offered"
                + (f" [{'; '.join(why)}]" if why else ""),
            }
        )
    return out


def render_table() -> str:
    base = row_of("baseline", "empty function call")
    base_ns = base["median_ns"] if base else math.nan
    return _method.render_table([("ratio to empty call", "---:")], lambda r: [f"{r['median_ns'] / base_ns:.1f}x"])


def render_writer() -> str:
    lines = []
    tp = EXTRA.get("throughput")
    if tp:
        lines += [
            "| JSONL writer | records | emit s | emit -> flush done s | records/s | bytes | file lines | dropped |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for i, r in enumerate(tp["runs"], 1):
            lines.append(
                f"| throughput run {i} (flush_interval 0.2 s) | {r['n']:,} | {r['emit_s']:.2f} | "
                f"{r['total_s']:.2f} | {r['records_per_s']:,.0f} | {r['bytes']:,} | {r['file_lines']:,} | "
                f"{r['dropped']} |"
            )
    fl = EXTRA.get("flood")
    if fl:
        lines += [
            "",
            "| flood (queue_capacity 10,000) | offered | emit s | written | dropped | diagnostic lines "
            "| bytes | RSS before MB | peak RSS growth MB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| put_metric as fast as possible | {fl['offered']:,} | {fl['emit_s']:.2f} | {fl['written']:,} | "
            f"{fl['dropped']:,} | {fl['diagnostic_lines']} | {fl['bytes']:,} | {fl['rss_before_mb']:.1f} | "
            f"{fl['rss_peak_growth_mb']:.1f} |",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    global ARGS
    ap = _method.parser(__doc__, "short smoke run (2 repeats of ~20 ms, small throughput runs)")
    ap.add_argument("--throughput-n", type=int, default=1_000_000)
    ap.add_argument("--throughput-runs", type=int, default=3)
    ap.add_argument("--flood-n", type=int, default=3_000_000)
    ARGS = _method.parse_args(ap, argv)
    if ARGS.quick:
        ARGS.repeats, ARGS.target_ms, ARGS.min_n, ARGS.max_n = 2, 20.0, 500, 200_000
        ARGS.warmup_s, ARGS.throughput_n, ARGS.throughput_runs, ARGS.flood_n = 0.2, 100_000, 1, 300_000

    tmpdir = tempfile.mkdtemp(prefix="bench_core_")
    load_before = _method.loadavg()
    _method.spin(ARGS.warmup_s)
    sections = [
        ("baseline", section_baseline),
        ("torchelastic", section_torchelastic),
        ("prometheus_client", section_prometheus),
        ("opentelemetry-sdk", section_otel),
        ("telemetrain", lambda: section_telemetrain(tmpdir)),
        ("pieces", lambda: section_pieces(tmpdir)),
        ("throughput", lambda: section_throughput(tmpdir)),
        ("flood", lambda: section_flood(tmpdir)),
    ]
    try:
        # a peer failing is a note; our own sections failing fails the run (pieces read internals: a note)
        failed = _method.run_sections(sections, lambda name: name in ("baseline", "telemetrain", "throughput", "flood"))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    load_after = _method.loadavg()
    results_checks = checks()

    _method.print_header(DISTS, load_before, load_after)
    print(
        f"method: median and best of {ARGS.repeats} repeats, n calibrated to ~{ARGS.target_ms:.0f} ms per repeat "
        f"(n in [{ARGS.min_n:,}, {ARGS.max_n:,}]), GC enabled, gc.collect() before each repeat, perf_counter_ns"
    )
    print()
    print(render_table())
    print()
    print(render_writer())
    print()
    NOTES.append(
        "throughput: records/s = N / (first emit -> flush() returned), flush_interval 0.2 s, queue big enough "
        "not to drop; the writer shares the GIL with the emitting loop. Line counts include 1 header line "
        "and 1 warm-up record."
    )
    _method.print_notes()
    print()
    print("ratio checks (medians of this run):")
    for c in results_checks:
        print(f"check {c['num']}: {c['status']}: {c['title']}: {c['text']}")
    if ARGS.json:
        fields = {
            "load_before": load_before,
            "load_after": load_after,
            "args": vars(ARGS),
            "results": RESULTS,
            "writer": EXTRA,
        }
        _method.write_json(ARGS.json, DISTS, fields, results_checks)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    sys.exit(main())
