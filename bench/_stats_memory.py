"""bench_stats.py's sections 5 and 6: the memory a stat holds, and what closing a window costs."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections.abc import Callable, Sequence
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

import _stats_state as state
from _method import NOTES, progress
from _stats_harness import INTS, LOGN, WIDE, _row, _stat
from _stats_state import EXTRA, KIB, MEAN_COUNT, QUANTILES, QUANTILES_HIST, S

if TYPE_CHECKING:
    from telemetrain import Telemetry
    from telemetrain.stats import Stat as AnyStat
    from telemetrain.stats import Summary


# -- 5. memory --------------------------------------------------------------------------------------------------------


def _feed(add: Callable[[float], None], values: Sequence[float], n: int, offset: int = 0) -> None:
    """``n`` fresh objects (``v * 1`` makes a new float or int, as a measured value would be), cycling ``values``."""
    mask = len(values) - 1
    for i in range(offset, offset + n):
        add(values[i & mask] * 1)


def _measure_memory(make: Callable[[], S], steps: Callable[[S], None]) -> tuple[int, int, S]:
    gc.collect()  # cheap: the section runs with everything older frozen (gc.freeze)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        s = make()
        steps(s)
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return held - base, peak - base, s


def section_memory(t: Telemetry) -> None:
    from telemetrain.stats import Stat

    group = "bench.mem"
    gc.collect()
    gc.freeze()  # what exists now is no garbage: the per-scenario gc.collect() only looks at the new objects
    try:
        _memory_scenarios(t, Stat, group)
    finally:
        gc.unfreeze()


def _memory_scenarios(t: Telemetry, Stat: type[AnyStat], group: str) -> None:
    t.mute(group)  # closed windows (the worst cases flush once) are not queued: only what the stat holds counts
    n_big = state.ARGS.mem_n
    # Built first and kept open to the end: the registry exists and the collector thread keeps running (it exits when
    # it has no task left, and would be started again, and counted, by the next stat).
    keep = Stat("bench.mem.keep", MEAN_COUNT, window=600, group=group, telemetry=t)
    keep.add(1.0)

    def scenario(
        label: str,
        aggs: list[str],
        values: Sequence[float],
        n: int,
        *,
        flush_then: int | None = None,
        bound: int = 152 * KIB,
        bound_text: str = "152 KiB (float samples)",
        per_pending: int = 36,
    ) -> None:
        expected_open = n if flush_then is None else flush_then
        for _attempt in range(2):  # a 600 s window that closes at its wall-clock boundary mid-scenario: once more

            def make(aggs: list[str] = aggs) -> AnyStat:
                return Stat("bench.mem", aggs, window=600, group=group, telemetry=t)

            def steps(s: AnyStat, values: Sequence[float] = values, n: int = n) -> None:
                _feed(s.add, values, n)
                if flush_then is not None:
                    s.flush()
                    _feed(s.add, values, flush_then, 7)

            held, peak, s = _measure_memory(make, steps)
            pending_bound = len(s._buf) * per_pending  # the documented bound leaves pending samples apart
            window = s._window  # internals, for the description only (s.count would fold what is pending)
            last = s.last_summary
            ok_window = window.count + len(s._buf) == expected_open
            if flush_then is not None:
                assert last is not None  # flush() closed the window of the first n samples
                ok_window = ok_window and last.count == n
            info = {
                "scenario": label,
                "aggregations": aggs,
                "samples": n if flush_then is None else n + flush_then,
                "pending": len(s._buf),
                "open_window": _describe_summary(window),
                "last_closed_window": None if last is None else _describe_summary(last),
                "held_bytes": held,
                "samples_and_buckets_bytes": _payload_bytes(s),
                "peak_bytes": peak,
                "bound_bytes": bound + pending_bound,
                "bound": f"{bound_text} + {len(s._buf):,} pending x {per_pending} B",
                "ok": held <= bound + pending_bound,
            }
            s.close()
            del s
            if ok_window:
                break
        EXTRA["memory"].append(info)
        progress(f"memory {label}: held {held:,} B, peak {peak:,} B, bound {bound:,} B ({info['open_window']})")

    big = f"{n_big:,}"
    whole = -(-n_big // 2048) * 2048  # a multiple of 2048: with 2047 more, 2047 samples are pending
    no_quantiles: dict[str, Any] = {"bound": 3 * KIB, "bound_text": "3 KiB (no quantiles)"}
    scenario("(a) mean/count, 1e3 lognormal floats", MEAN_COUNT, LOGN, 1000, **no_quantiles)
    scenario(f"(a) mean/count, {big} lognormal floats", MEAN_COUNT, LOGN, n_big, **no_quantiles)
    scenario(
        "(a0) mean/count, 4,096 floats (a multiple of 2048: nothing pending)",
        MEAN_COUNT,
        LOGN,
        4096,
        bound=3 * KIB,
        bound_text="3 KiB (no quantiles)",
    )
    scenario("(b) quantiles+histogram, 1e3 lognormal floats (exact)", QUANTILES_HIST, LOGN, 1000)
    scenario(f"(b) quantiles+histogram, {big} lognormal floats (histogram)", QUANTILES_HIST, LOGN, n_big)
    scenario(
        f"(b) quantiles+histogram, {big} floats of both signs over 2**-32..2**32 (2 x 4096 buckets)",
        QUANTILES_HIST,
        WIDE,
        n_big,
    )
    scenario(
        "(w1) worst case, exact: 2048 floats, flush(), 2048 + 2047 floats (last window + kept + pending)",
        QUANTILES_HIST,
        LOGN,
        2048,
        flush_then=4095,
    )
    scenario(
        "(w2) same with int samples (fresh ints, e.g. durations in ns: 32 B each as allocated, getsizeof 28)",
        QUANTILES_HIST,
        INTS,
        2048,
        flush_then=4095,
        bound=160 * KIB,
        bound_text="160 KiB (int samples)",
        per_pending=44,
    )
    scenario(
        f"(w3) worst case, histogram: {big} wide floats, flush(), {whole:,} + 2047 more",
        QUANTILES_HIST,
        WIDE,
        n_big,
        flush_then=whole + 2047,
    )
    NOTES.append(
        "memory: tracemalloc's traced bytes from before the stat is built to after its samples, gc.collect() first; "
        "each sample is a fresh float/int (`v * 1`), as a measured value is, so pending and kept samples count with "
        "their objects (tracemalloc: 24 B a float, 32 B a one-digit int, plus an 8 B list slot). The stat's group "
        "is muted, so a closed window's record is not queued to the writer. Peak = the transient high-water mark "
        "(a fold's sort and copies, a window's close)."
    )
    keep.close()


def _payload_bytes(s: AnyStat) -> int:
    """sys.getsizeof of what the documented bound counts: the pending list, the kept samples and the histogram
    arrays of the open and of the last closed window, each sample object once."""
    seen: set[int] = set()
    total = 0

    def of_list(items: Sequence[object]) -> None:
        nonlocal total
        total += sys.getsizeof(items)
        for x in items:
            if id(x) not in seen:
                seen.add(id(x))
                total += sys.getsizeof(x)

    of_list(s._buf)
    for summary in (s._window, s.last_summary):
        if summary is None:
            continue
        if summary.raw is not None:
            of_list(summary.raw)
        if summary.histogram is not None:
            total += sys.getsizeof(summary.histogram._positive.counts) + sys.getsizeof(
                summary.histogram._negative.counts
            )
    return total


def _describe_summary(summary: Summary) -> str:
    if summary.raw is None and summary.histogram is None:
        return "no distribution kept"
    if summary.raw is not None:
        return f"exact, {len(summary.raw):,} kept samples"
    h = summary.histogram
    assert h is not None  # neither raw nor None: a histogram
    return (
        f"histogram scale {h.scale}, {len(h._positive.counts):,}+{len(h._negative.counts):,} buckets "
        f"(arrays {h._positive.counts.buffer_info()[1] * 8 + h._negative.counts.buffer_info()[1] * 8:,} B)"
    )


# -- 6. window close --------------------------------------------------------------------------------------------------


def section_close(t: Telemetry) -> None:
    from telemetrain.stats import Stat

    lib = "telemetrain.stats"
    windows = state.ARGS.close_windows

    def close_cost(
        label: str, aggs: list[str], values: Sequence[float], per_window: int, peer: dict[str, Any] | None
    ) -> dict[str, Any]:
        s = _stat(Stat, f"bench.close.{len(EXTRA['window_close'])}", aggs, window=600, telemetry=t)
        add = s.add
        mask = len(values) - 1
        samples: list[float] = []
        offset = 0
        gc.collect()  # once: a collection right before each close would leave it cold (fresh arenas)
        for i in range(windows + 3):
            for j in range(offset, offset + per_window):
                add(values[j & mask])
            offset += per_window
            t0 = perf_counter_ns()
            s.flush()
            dt = perf_counter_ns() - t0
            if i >= 3:  # the first closes warm up
                samples.append(dt)
        s.close()
        row = _row(lib, f"close one window: {label}", samples, windows, peer)
        EXTRA["window_close"].append(
            {
                "window": label,
                "median_us": row["median_ns"] / 1e3,
                "best_us": row["best_ns"] / 1e3,
                "windows": windows,
            }
        )
        return row

    ref = close_cost('2048 samples, ["mean","count"] (reference)', MEAN_COUNT, LOGN, 2048, None)
    close_cost("100 lognormal samples, [count,mean,p50,p90,p99] (as samples=100 closes)", QUANTILES, LOGN, 100, ref)
    close_cost("2048 lognormal samples, [count,mean,p50,p90,p99]", QUANTILES, LOGN, 2048, ref)
    close_cost("2048 lognormal samples, [count,mean,p50,p90,p99,histogram]", QUANTILES_HIST, LOGN, 2048, ref)
    close_cost(
        "20,480 lognormal samples (histogram mode), [count,mean,p50,p90,p99,histogram]",
        QUANTILES_HIST,
        LOGN,
        20480,
        ref,
    )
    NOTES.append(
        "window close: ns per `flush()` of a 600 s stat with the given samples added (every 2048th add folds its "
        "batch, untimed; a window of 100 has its 100 samples folded inside the timed flush): the window's values "
        "(quantiles), its histogram dict, the StatWindow record, its emit to the run "
        "store queue. Ratio = against the mean/count close."
    )
