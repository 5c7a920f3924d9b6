"""bench_core.py's writer sections: the background writer's throughput into the run store, and a flood."""

from __future__ import annotations

import gc
import os
import statistics
from collections.abc import Callable
from itertools import repeat
from pathlib import Path
from time import perf_counter_ns

import _core_state as state
from _core_state import EXTRA
from _method import progress

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

    n = state.ARGS.throughput_n
    emit = _emit_loop(tmetrics.put_metric)
    runs = []
    for i in range(state.ARGS.throughput_runs):
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
    m, chunk = state.ARGS.flood_n, 50_000
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
