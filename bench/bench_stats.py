#!/usr/bin/env python3
"""telemetrain's stats (``telemetrain.stats.Stat``, ``telemetrain.monitor.Stat``) next to ``torch.monitor.Stat``,
measured side by side in one process run.

Sections (ns per operation, median and best of ``--repeats``; every row names the row it is compared with):

  baseline     empty loop, empty call, ``nx()`` (the next value of a prebuilt list, used by the "varying" rows),
               ``with contextlib.nullcontext(): pass``
  1 add        ``s.add(1.0)`` and ``s.add(nx())`` (lognormal values): torch.monitor ``Stat("x", [MEAN, COUNT],
               timedelta(seconds=600))`` (no handler; a no-op Python handler), ``telemetrain.monitor.Stat`` (same
               arguments), ``telemetrain.stats.Stat("x", ["mean", "count"], window=600)``; 1 ms windows (closed by
               torch in ``add``, by our collector thread); target: ours <= 0.5x torch's. "paired" rows time ours and
               torch's in adjacent, alternating repeats and give the median of the per-pair ratios (shown beside the
               row-median verdict: on a shared VM a slow spell can hit one row and not its peer)
  2 quantiles  ``Stat(..., ["count", "mean", "p50", "p90", "p99"])`` with a count window of 100 samples (exact
               quantiles, a window closes every 100 adds) and with a 600 s window (histogram past 2048 samples),
               lognormal values; informational ratio against torch's MEAN/COUNT add
  3 threads    2 threads adding to one stat: per-thread and aggregate ns/op, and exactness (sum of the windows' sample
               counts == 2 x N, every count window exactly full); torch.monitor's ``count`` the same way
  4 time       ``with s.time(): pass`` vs ``with contextlib.nullcontext(): pass`` (target <= 2x); ``@s.time`` on an
               empty function vs the plain function; its pieces (``s.time()`` alone, a reused timer, the clock)
  5 memory     tracemalloc: bytes held by one stat after 1e3 / 1e6 samples in one 600 s window, mean/count and
               quantiles + histogram, plus the worst cases of the documented bound (stat.py's module docstring:
               "pending samples apart, ~3 KiB for a stat without quantiles and at most 152 KiB (160 KiB with ints)
               for one with quantiles", pending samples ~36 B each (44 as ints) with the list's spare room)
  6 close      time to close one window (``flush()``) of 2048 samples with quantiles + histogram (informational)
  pieces       ``add`` taken apart (call, type check, append + len check, fold, GC), to explain where its time goes;
               ``Summary.fold`` of a 2048-sample batch for mean/count and for quantiles in histogram mode, and the
               ``min``/``max``/``sorted`` passes of the latter

Method: the peers method of bench_core.py (``_method.py`` beside this script; BENCHMARKS.md, "Method"), with ``n``
at most ``--max-n``. Numbers include the loop overhead (the "empty
loop" row).

Everything inline is included: ``add`` folds its batch every 2048 samples (or at the end of a count window) inside
the call, and that time is inside the timed loops. Background work is included too, because it shares the GIL: the
collector thread (closing time windows) and the run store's writer thread (default ``flush_interval``, 0.2 s) run
while the loops are timed, so the rows are wall time of long loops, not of the calling thread alone. All stats write
to one ``telemetrain.Telemetry(store=<tempdir>)`` passed as ``telemetry=``; at the end every window a stat reported
(counted by a listener) is checked against the stat records in the run store file.

``--quick`` skips the ``gc.collect()`` before each repeat (about 75 ms each with torch loaded). The memory section
runs with everything older frozen (``gc.freeze()``), so its own ``gc.collect()`` calls are cheap and exact. A 600 s
window closes at the wall-clock multiple of 600 s: at most once during a run, it costs one close in one repeat.

Usage:
    python bench/bench_stats.py                 # full run (~2 min), markdown on stdout, progress on stderr
    python bench/bench_stats.py --quick         # short smoke run (< 15 s)
    python bench/bench_stats.py --json out.json # also write the raw results
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from itertools import cycle
from pathlib import Path
from string import ascii_lowercase
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import _method
from _method import NOTES, RESULTS, compile_stmt, difference_row, measure, new_row, paired, progress, row_of, skip

if TYPE_CHECKING:
    import torch.monitor

    from telemetrain import Telemetry
    from telemetrain.records import StatWindow
    from telemetrain.stats import Stat as AnyStat
    from telemetrain.stats import Summary

warnings.filterwarnings("ignore")  # torch's "Failed to initialize NumPy" where numpy is absent

ARGS: argparse.Namespace
EXTRA: dict[str, Any] = {"threads": [], "memory": [], "window_close": []}
EMITTED: Counter[str] = Counter()  # windows reported per stat name (listener), checked against the run store
EMITTED_SAMPLES: Counter[str] = Counter()
DISTS = ("torch", "telemetrain")  # versions reported

KIB = 1024
MEAN_COUNT = ["mean", "count"]
QUANTILES = ["count", "mean", "p50", "p90", "p99"]
QUANTILES_HIST = [*QUANTILES, "histogram"]

P = ParamSpec("P")
S = TypeVar("S")
StatT = TypeVar("StatT", bound="AnyStat")


# -- harness (the peers method: _method.py) --------------------------------------------------------------------------


_record = _method.record_with_peer


def _row(lib: str, op: str, samples: list[float], n: object, peer: dict[str, Any] | None) -> dict[str, Any]:
    return _record(new_row(lib, op, samples, n), peer)


def bench(
    lib: str,
    op: str,
    stmt: str,
    names: dict[str, Any] | None = None,
    *,
    peer: dict[str, Any] | None = None,
    between: Callable[[], None] | None = None,
    gc_off: bool = False,
    max_n: int | None = None,
    warm: int = 2000,
) -> dict[str, Any]:
    """Measure ``stmt``; ``between()`` runs after calibration and after every repeat, outside the timed region."""
    samples, n = measure(stmt, names, between=between, gc_off=gc_off, max_n=max_n, warm=warm, collect=ARGS.collect)
    return _row(lib, op, samples, n, peer)


def derived(
    lib: str, op: str, a: dict[str, Any], b: dict[str, Any], *, peer: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Row ``a - b`` (median - median, best - best; repeats: the differences of the paired repeats)."""
    return _record(difference_row(lib, op, a, b), peer)


# -- values -----------------------------------------------------------------------------------------------------------

_RNG = random.Random(20261121)
LOGN = [_RNG.lognormvariate(0.0, 1.0) for _ in range(1 << 16)]  # "realistic": latencies, step times, losses
LOGN_NARROW = [_RNG.lognormvariate(0.0, 0.25) for _ in range(1 << 16)]
# both signs, magnitudes 2**-32 .. 2**32: fills 2 x 4096 histogram buckets at scale 6 (the documented maximum)
WIDE = [_RNG.choice((-1.0, 1.0)) * 2.0 ** _RNG.uniform(-32.0, 32.0) for _ in range(1 << 16)]
INTS = [_RNG.randrange(10**6, 10**9) for _ in range(1 << 16)]  # e.g. durations in ns: one-digit ints


def _nx(values: Sequence[float]) -> Callable[[], float]:
    return cycle(values).__next__


def _empty() -> None:
    pass


def _stat(cls: Callable[P, StatT], *args: P.args, **kwargs: P.kwargs) -> StatT:
    """A stat whose reported windows are counted (by name) for the final check against the run store."""
    s = cls(*args, **kwargs)

    def count(stat: AnyStat, record: StatWindow) -> None:
        EMITTED[record.name] += 1
        EMITTED_SAMPLES[record.name] += record.sample_count

    s.add_listener(count)
    return s


# -- baseline ---------------------------------------------------------------------------------------------------------


def section_baseline() -> None:
    bench("baseline", "empty loop (`pass`)", "pass")
    bench("baseline", "empty function call `f()`", "f()", {"f": _empty})
    bench(
        "baseline",
        "`nx()`: next of a prebuilt list of floats (cycle), the varying rows' value",
        "nx()",
        {"nx": _nx(LOGN)},
    )


# -- 1. add -----------------------------------------------------------------------------------------------------------


def section_add(t: Telemetry) -> None:
    import torch.monitor as tm

    from telemetrain import monitor as tmon
    from telemetrain.stats import Stat

    lib_t = "torch.monitor"
    agg_t = [tm.Aggregation.MEAN, tm.Aggregation.COUNT]
    w600 = timedelta(seconds=600)
    # torch's stub (_C/_monitor.pyi) types window_size as int; the binding takes a timedelta, as documented
    st = tm.Stat("bench.add", agg_t, w600)  # type: ignore[arg-type]
    t_const = bench(lib_t, "Stat([MEAN,COUNT], 600s).add(1.0), no handler", "s.add(1.0)", {"s": st})
    t_vary = bench(lib_t, "Stat([MEAN,COUNT], 600s).add(nx()), no handler", "s.add(nx())", {"s": st, "nx": _nx(LOGN)})
    calls = [0]

    def noop_handler(event: torch.monitor.Event) -> None:
        calls[0] += 1

    h = tm.register_event_handler(noop_handler)
    try:
        st_h = tm.Stat("bench.add.h", agg_t, w600)  # type: ignore[arg-type]
        bench(lib_t, "Stat([MEAN,COUNT], 600s).add(1.0), no-op handler registered", "s.add(1.0)", {"s": st_h})
        bench(
            lib_t,
            "Stat([MEAN,COUNT], 600s).add(nx()), no-op handler registered",
            "s.add(nx())",
            {"s": st_h, "nx": _nx(LOGN)},
        )
        calls[0] = 0
        st_1ms = tm.Stat("bench.add.1ms", agg_t, timedelta(milliseconds=1))  # type: ignore[arg-type]
        t_1ms = bench(
            lib_t,
            "Stat([MEAN,COUNT], 1ms).add(1.0), no-op handler (window closes ~every ms)",
            "s.add(1.0)",
            {"s": st_1ms},
        )
        NOTES.append(f"torch.monitor: the 1 ms-window Stat called the no-op handler {calls[0]:,} times.")
    finally:
        tm.unregister_event_handler(h)

    lib_m = "telemetrain.monitor"
    ms = _stat(tmon.Stat, "bench.add.monitor", [tmon.MEAN, tmon.COUNT], w600, telemetry=t)
    bench(lib_m, "Stat([MEAN,COUNT], 600s).add(1.0)", "s.add(1.0)", {"s": ms}, peer=t_const)
    bench(lib_m, "Stat([MEAN,COUNT], 600s).add(nx())", "s.add(nx())", {"s": ms, "nx": _nx(LOGN)}, peer=t_vary)

    lib_n = "telemetrain.stats"
    ns = _stat(Stat, "bench.add.native", MEAN_COUNT, window=600, telemetry=t)
    bench(lib_n, 'Stat(["mean","count"], window=600).add(1.0)', "s.add(1.0)", {"s": ns}, peer=t_const)
    bench(lib_n, 'Stat(["mean","count"], window=600).add(nx())', "s.add(nx())", {"s": ns, "nx": _nx(LOGN)}, peer=t_vary)
    bench(lib_n, 'Stat(["mean","count"], window=600).add(1) (an int)', "s.add(1)", {"s": ns}, peer=t_const)
    n1 = _stat(Stat, "bench.add.native.1ms", MEAN_COUNT, window=0.001, telemetry=t)
    before = EMITTED["bench.add.native.1ms"]
    bench(
        lib_n,
        'Stat(["mean","count"], window=0.001).add(1.0) (collector closes a window ~every ms)',
        "s.add(1.0)",
        {"s": n1},
        peer=t_1ms,
    )
    NOTES.append(
        f"telemetrain 1 ms-window stat: the collector thread reported {EMITTED['bench.add.native.1ms'] - before:,} "
        "windows during its row (a waiting thread gets the GIL within sys.getswitchinterval() = "
        f"{sys.getswitchinterval() * 1e3:.0f} ms, so under a busy loop windows close late, as documented)."
    )
    for label, stat, cls_label in ((lib_n, ns, '["mean","count"]'), (lib_m, ms, "[MEAN,COUNT]")):
        paired(
            "paired",
            f"{label} Stat({cls_label}).add(1.0), interleaved with torch's add(1.0)",
            "s.add(1.0)",
            {"s": stat},
            t_const,
            "s.add(1.0)",
            {"s": st},
            collect=ARGS.collect,
        )
        paired(
            "paired",
            f"{label} Stat({cls_label}).add(nx()), interleaved with torch's add(nx())",
            "s.add(nx())",
            {"s": stat, "nx": _nx(LOGN)},
            t_vary,
            "s.add(nx())",
            {"s": st, "nx": _nx(LOGN)},
            collect=ARGS.collect,
        )
    NOTES.append(
        "paired rows: our add and torch's in adjacent repeats (2 x repeats pairs, alternating order); ratio = median "
        "of the per-pair ratios. On a shared VM a slow spell can land on one row's repeats and not on its peer's: the "
        "paired ratio is the steadier estimate of the same quantity."
    )
    for s in (ms, ns, n1):
        s.close()


# -- 2. quantile stats ------------------------------------------------------------------------------------------------


def section_quantiles(t: Telemetry) -> None:
    from telemetrain.stats import Stat

    lib = "telemetrain.stats"
    t_vary = row_of("torch.monitor", "Stat([MEAN,COUNT], 600s).add(nx()), no handler")
    t_const = row_of("torch.monitor", "Stat([MEAN,COUNT], 600s).add(1.0), no handler")
    q100 = _stat(Stat, "bench.q.samples100", QUANTILES, samples=100, telemetry=t)
    before = EMITTED["bench.q.samples100"]
    bench(
        lib,
        "Stat([count,mean,p50,p90,p99], samples=100).add(nx()) lognormal s=1 (exact; closes every 100)",
        "s.add(nx())",
        {"s": q100, "nx": _nx(LOGN)},
        peer=t_vary,
    )
    NOTES.append(f"quantiles, samples=100: {EMITTED['bench.q.samples100'] - before:,} windows reported during its row.")
    q600 = _stat(Stat, "bench.q.window600", QUANTILES, window=600, telemetry=t)
    bench(
        lib,
        "Stat([count,mean,p50,p90,p99], window=600).add(nx()) lognormal s=1 (histogram mode)",
        "s.add(nx())",
        {"s": q600, "nx": _nx(LOGN)},
        peer=t_vary,
    )
    hist = q600._window.histogram  # internals, for the note only
    if hist is not None:
        NOTES.append(
            f"quantiles, window=600, lognormal sigma=1: the open window's histogram has scale {hist.scale}, "
            f"{len(hist._positive.counts):,} positive buckets; a batch of 2048 such values occupies "
            f"{_occupied_buckets(LOGN[:2048]):,} buckets (sigma=0.25: {_occupied_buckets(LOGN_NARROW[:2048]):,})."
        )
    q600n = _stat(Stat, "bench.q.window600.narrow", QUANTILES, window=600, telemetry=t)
    bench(
        lib,
        "same, lognormal sigma=0.25 (fewer occupied buckets per batch)",
        "s.add(nx())",
        {"s": q600n, "nx": _nx(LOGN_NARROW)},
        peer=t_vary,
    )
    q600c = _stat(Stat, "bench.q.window600.const", QUANTILES, window=600, telemetry=t)
    bench(lib, "same, constant 1.0 (one bucket)", "s.add(1.0)", {"s": q600c}, peer=t_const)
    for s in (q100, q600, q600n, q600c):
        s.close()


def _occupied_buckets(values: list[float]) -> int:
    from telemetrain.stats import ExpHistogram

    h = ExpHistogram()
    h.record(values)
    return sum(1 for n in h.to_dict()["positive"]["counts"] if n)


# -- 3. two threads ---------------------------------------------------------------------------------------------------


def _run_threads(timed: list[Callable[[int], int]], n: int) -> tuple[list[float], float]:
    """peers_bench's method: each ``timed(n)`` in its own thread, released together by a barrier; per-thread ns/op
    from the common release to that thread's last op (GIL waits included), aggregate = group wall / all ops."""
    start: list[int] = []
    barrier = threading.Barrier(len(timed), action=lambda: start.append(perf_counter_ns()))
    ends = [0] * len(timed)

    def worker(i: int, fn: Callable[[int], int]) -> None:
        barrier.wait()
        fn(n)
        ends[i] = perf_counter_ns()

    threads = [threading.Thread(target=worker, args=(i, f)) for i, f in enumerate(timed)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t0 = start[0]
    return [(e - t0) / n for e in ends], (max(ends) - t0) / (n * len(timed))


def thread_bench(
    lib: str,
    op: str,
    make: Callable[[int], S],
    check: Callable[[S, int], dict[str, Any]],
    *,
    peer: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """2 threads x ``n`` ``s.add(1.0)`` on one fresh stat per repeat (``make(repeat)``); ``check(stat, expected)``
    returns the exactness verdict of that repeat."""
    n = ARGS.thread_n
    fns = [compile_stmt("s.add(1.0)", {"s": None}) for _ in range(2)]
    warm = make(-1)
    for f in fns:
        f.__globals__["s"] = warm
        f(2000)  # specialise the bytecode on a throwaway stat
    if hasattr(warm, "close"):
        warm.close()
    per_thread, aggregate, verdicts = [], [], []
    for r in range(ARGS.repeats):
        s = make(r)
        for f in fns:
            f.__globals__["s"] = s
        if ARGS.collect:
            gc.collect()
        pt, agg = _run_threads(fns, n)
        per_thread.extend(pt)
        aggregate.append(agg)
        verdicts.append(check(s, 2 * n))
    for f in fns:
        f.__globals__["s"] = None
    a = _row(lib, f"{op}: per thread", per_thread, n, None if peer is None else peer[0])
    b = _row(lib, f"{op}: aggregate (wall / all ops)", aggregate, n, None if peer is None else peer[1])
    exact = all(v["exact"] for v in verdicts)
    summary = {"library": lib, "operation": op, "n_per_thread": n, "repeats": verdicts, "exact": exact}
    EXTRA["threads"].append(summary)
    progress(f"{lib} {op}: exact={exact} {verdicts[-1]}")
    return a, b, summary


def section_threads(t: Telemetry) -> None:
    import torch.monitor as tm

    from telemetrain import monitor as tmon
    from telemetrain.stats import Stat

    windows: dict[int, list[int]] = {}  # the sample counts of the windows each stat reported, by id(stat)

    def make_native(cls: Callable[..., AnyStat], name: str, *args: Any, **kwargs: Any) -> Callable[[int], AnyStat]:
        def make(r: int) -> AnyStat:
            s = _stat(cls, f"{name}.r{r}", *args, telemetry=t, **kwargs)
            windows[id(s)] = got = []
            s.add_listener(lambda _s, rec: got.append(rec.sample_count))
            return s

        return make

    def check_windows(s: AnyStat, expected: int, full: int | None = None) -> dict[str, Any]:
        open_count = s.count  # all samples are in the open window (unless a 600 s boundary passed meanwhile)
        s.flush()
        counts = windows.pop(id(s))
        total = sum(counts)
        s.close()
        out = {
            "expected": expected,
            "open_count_before_flush": open_count,
            "windows": len(counts),
            "sum_sample_count": total,
        }
        exact = total == expected
        if full is not None:
            out["windows_not_full"] = sum(1 for c in counts if c != full)
            exact = exact and not out["windows_not_full"]
        out["exact"] = exact
        return out

    def torch_check(s: torch.monitor.Stat, expected: int) -> dict[str, Any]:
        return {"expected": expected, "count": s.count, "exact": s.count == expected}

    lib2 = "threads (2)"
    g = compile_stmt("f()", {"f": _empty})
    g(2000)
    pt, agg = [], []
    for _ in range(ARGS.repeats):
        if ARGS.collect:
            gc.collect()
        p, a = _run_threads([g, g], ARGS.thread_n)
        pt.extend(p)
        agg.append(a)
    _row(lib2, "2 threads x empty call `f()` (GIL reference): per thread", pt, ARGS.thread_n, None)
    _row(lib2, "2 threads x empty call `f()` (GIL reference): aggregate (wall / all ops)", agg, ARGS.thread_n, None)

    agg_t = [tm.Aggregation.MEAN, tm.Aggregation.COUNT]
    tp, ta, _ = thread_bench(
        "torch.monitor",
        "2 threads x Stat([MEAN,COUNT], 600s).add(1.0), one Stat",
        lambda r: tm.Stat(f"bench.thr.torch.r{r}", agg_t, timedelta(seconds=600)),  # type: ignore[arg-type]
        torch_check,
    )
    thread_bench(
        "telemetrain.stats",
        '2 threads x Stat(["mean","count"], window=600).add(1.0), one Stat',
        make_native(Stat, "bench.thr.native", MEAN_COUNT, window=600),
        check_windows,
        peer=(tp, ta),
    )
    thread_bench(
        "telemetrain.monitor",
        "2 threads x Stat([MEAN,COUNT], 600s).add(1.0), one Stat",
        make_native(tmon.Stat, "bench.thr.monitor", [tmon.MEAN, tmon.COUNT], timedelta(seconds=600)),
        check_windows,
        peer=(tp, ta),
    )
    thread_bench(
        "telemetrain.stats",
        "2 threads x Stat([count,mean,p50,p90,p99], samples=100).add(1.0), one Stat",
        make_native(Stat, "bench.thr.q100", QUANTILES, samples=100),
        lambda s, e: check_windows(s, e, full=100),
        peer=(tp, ta),
    )
    NOTES.append(
        "threads: exactness per repeat = after the threads join, flush() the stat (closes the open window) and sum the "
        "sample counts of every window it reported (a listener); the count-window stat must also report only full "
        "windows of exactly 100 (2 x N is a multiple of 100). torch.monitor: its Stat.count (600 s window, still open)."
    )


# -- 4. time() --------------------------------------------------------------------------------------------------------


def section_time(t: Telemetry) -> None:
    from telemetrain.stats import Stat

    lib = "telemetrain.stats"
    null = bench(
        "baseline",
        "`with contextlib.nullcontext(): pass`",
        "with nullcontext(): pass",
        {"nullcontext": contextlib.nullcontext},
    )
    s = _stat(Stat, "bench.time", MEAN_COUNT, window=600, telemetry=t)
    bench(lib, 'Stat(["mean","count"], window=600): `with s.time(): pass`', "with s.time(): pass", {"s": s}, peer=null)
    sq = _stat(
        Stat, "bench.time.default", ["count", "sum", "mean", "min", "max", "p50", "p90", "p99"], window=600, telemetry=t
    )
    bench(
        lib,
        "Stat(default aggregations, window=600): `with s.time(): pass`",
        "with s.time(): pass",
        {"s": sq},
        peer=null,
    )
    try:
        import torch.monitor as tm

        wc = tm._WaitCounter("bench.waitcounter")
        bench(
            "torch.monitor",
            "`with _WaitCounter(...).guard(): pass` (private API, for reference)",
            "with wc.guard(): pass",
            {"wc": wc},
            peer=null,
        )
    except Exception as exc:  # noqa: BLE001 - a private API may change
        skip("torch.monitor._WaitCounter", exc)

    bench(lib, "`s.time()` alone (builds the timer)", "s.time()", {"s": s})
    timer = s.time()
    bench(
        lib,
        "`with timer: pass`, one prebuilt timer reused (enter + exit + add)",
        "with timer: pass",
        {"timer": timer},
        peer=null,
    )
    bench("baseline", "`monotonic_ns()` (the clock time() reads twice)", "clock()", {"clock": time.monotonic_ns})

    def plain() -> None:
        pass

    @s.time
    def decorated() -> None:
        pass

    p0 = bench(lib, "call of an empty function (reference for @s.time)", "f()", {"f": plain})
    p1 = bench(lib, "call of the @s.time-decorated empty function", "f()", {"f": decorated}, peer=p0)
    derived(lib, "@s.time overhead = decorated - plain", p1, p0)
    for x in (s, sq):
        x.close()


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
    n_big = ARGS.mem_n
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
    windows = ARGS.close_windows

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


# -- pieces -----------------------------------------------------------------------------------------------------------


class _Empty:
    __slots__ = ()

    def add(self, value: float) -> None:
        pass


class _TypeCheck:
    __slots__ = ()

    def add(self, value: float) -> None:
        if type(value) is not float and type(value) is not int:
            raise TypeError


class _Append:
    """add's steps with the fold replaced by a clear (a model of stat.add, not the code itself)."""

    __slots__ = ("_buf", "_limit")

    def __init__(self) -> None:
        self._buf: list[float] = []
        self._limit = 2048

    def add(self, value: float) -> None:
        if type(value) is not float and type(value) is not int:
            raise TypeError
        buf = self._buf
        buf.append(value)
        if len(buf) >= self._limit:
            buf.clear()


def section_pieces(t: Telemetry) -> None:
    from telemetrain.stats import Stat, Summary
    from telemetrain.stats.aggregations import tracking

    lib = "pieces"
    t_const = row_of("torch.monitor", "Stat([MEAN,COUNT], 600s).add(1.0), no handler")
    bench(lib, "method call `o.add(1.0)`, empty body", "o.add(1.0)", {"o": _Empty()}, peer=t_const)
    bench(lib, "method call + type check", "o.add(1.0)", {"o": _TypeCheck()}, peer=t_const)
    bench(
        lib,
        "method call + type check + append + len check (a model: clear instead of fold)",
        "o.add(1.0)",
        {"o": _Append()},
        peer=t_const,
    )

    s = _stat(Stat, "bench.pieces", MEAN_COUNT, window=600, telemetry=t)
    full = bench(lib, 'real Stat(["mean","count"]).add(1.0), measured again here', "s.add(1.0)", {"s": s}, peer=t_const)
    gc_off = bench(
        lib, "real Stat.add(1.0), GC disabled during the repeat", "s.add(1.0)", {"s": s}, gc_off=True, peer=t_const
    )

    def no_fold() -> None:  # internals: no fold at all (the list grows for the whole repeat), emptied in between
        del s._buf[:]
        s._limit = 1 << 62

    no_fold()
    nofold = bench(
        lib,
        "real Stat.add(1.0) with the fold switched off (internals: _limit raised)",
        "s.add(1.0)",
        {"s": s},
        between=no_fold,
        peer=t_const,
    )
    del s._buf[:]
    s._set_limit()
    derived(lib, "fold + lock, amortised per sample = full add - add without fold", full, nofold)
    derived(lib, "garbage collector = full add - add with GC disabled", full, gc_off)

    per_call = max(ARGS.min_n // 10, 2000)
    chunk = [1.0] * 2048
    copy = bench(
        lib, "`c[:]` of 2048 samples, per call (reference for the fold rows)", "c[:]", {"c": chunk}, max_n=per_call
    )
    w = Summary(tracking(MEAN_COUNT))
    fold = bench(
        lib,
        "Summary.fold(c[:]) of 2048 samples, mean/count, per call",
        "w.fold(c[:])",
        {"w": w, "c": chunk},
        max_n=per_call,
        warm=20,
    )
    folds = {"mean/count": fold["median_ns"] - copy["median_ns"]}
    batch = LOGN[:2048]
    minmax = bench(
        lib,
        "`min(c), max(c)` of 2048 lognormal samples, per call (fold's MINMAX part)",
        "min(c), max(c)",
        {"c": batch},
        max_n=per_call,
        warm=20,
    )
    srt = bench(
        lib,
        "`sorted(c)` of 2048 lognormal samples, per call (exact quantiles at a close; the pure-Python histogram path)",
        "sorted(c)",
        {"c": batch},
        max_n=per_call,
        warm=20,
    )
    for label, values in (("lognormal sigma=1", LOGN), ("lognormal sigma=0.25", LOGN_NARROW), ("constant", None)):
        c = values[:2048] if values is not None else chunk
        wq = Summary(tracking(QUANTILES))
        wq.fold(list(c) * 2)  # past RAW_LIMIT: histogram mode from here on
        r = bench(
            lib,
            f"Summary.fold(c[:]) of 2048 samples, quantiles, histogram mode, {label}, per call",
            "w.fold(c[:])",
            {"w": wq, "c": c},
            max_n=per_call,
            warm=20,
        )
        folds[f"quantiles, histogram mode, {label}"] = r["median_ns"] - copy["median_ns"]
    NOTES.append(
        "pieces: Summary.fold of a 2048-sample batch, per sample: "
        + "; ".join(f"{k} {v / 2048:.1f} ns" for k, v in folds.items())
        + f". The real add, GC on / GC off / fold off: {full['median_ns']:.1f} / {gc_off['median_ns']:.1f} / "
        f"{nofold['median_ns']:.1f} ns."
    )
    numpy_loaded = "numpy" in sys.modules
    NOTES.append(
        f"pieces: in every fold of a quantile stat, `min(chunk)` + `max(chunk)` cost {minmax['median_ns'] / 2048:.1f} "
        f"ns per sample (sorting the batch: {srt['median_ns'] / 2048:.1f} ns per sample). numpy loaded in this "
        f"process: {numpy_loaded} (torch imports it), so ExpHistogram.record takes its numpy path for batches of "
        ">= 256 values, where the batch is already a float64 array (its min and max cost ~1 ns a sample there); the "
        "pure-Python path sorts the batch (first and last items)."
    )
    EXTRA["numpy_loaded"] = numpy_loaded
    EXTRA["fold_ns_per_sample"] = {k: v / 2048 for k, v in folds.items()}
    s.close()


# -- the run store: every reported window is there --------------------------------------------------------------------


def check_store(t: Telemetry) -> dict[str, Any]:
    assert t.store is not None  # main() made it with store=
    path = t.store.path
    windows: Counter[str] = Counter()
    samples: Counter[str] = Counter()
    if path is not None:  # the store opens its file at the first record
        with open(path, "rb") as fh:
            for line in fh:
                if b'"kind":"stat"' not in line:
                    continue
                rec = json.loads(line)
                windows[rec["name"]] += 1
                samples[rec["name"]] += rec["count"]
    missing = {name: (n, windows[name]) for name, n in EMITTED.items() if windows[name] != n}
    wrong = {name: (n, samples[name]) for name, n in EMITTED_SAMPLES.items() if samples[name] != n}
    health = t.health()
    out = {
        "stat_records_in_store": sum(windows.values()),
        "samples_in_store": sum(samples.values()),
        "reported_windows": sum(EMITTED.values()),
        "missing": missing,
        "wrong_sample_counts": wrong,
        "dropped": health["dropped"],
        "failed": health["failed"],
    }
    out["ok"] = not missing and not wrong and not health["dropped"] and not health["failed"]
    return out


# -- checks and output ------------------------------------------------------------------------------------------------


def checks() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def ratio_check(
        cid: str, title: str, row: dict[str, Any] | None, limit: float | None, shared: dict[str, Any] | None = None
    ) -> None:
        """``shared``: a baseline row whose cost both sides include (producing the value): the ratio that is checked
        is then of the costs net of it, i.e. of the add itself; the raw ratio is shown too."""
        if row is None or row.get("ratio") is None:
            out.append({"id": cid, "title": title, "status": "SKIP", "text": "not measured"})
            return
        ratio = row["ratio"]
        net = ""
        if shared is not None:
            base = shared["median_ns"]
            raw_ratio = ratio
            ratio = (row["median_ns"] - base) / (row["peer_median_ns"] - base)
            net = f" net of the shared {base:.1f} ns of `nx()` (raw {raw_ratio:.3f}x)"
        status = "INFO" if limit is None else ("PASS" if ratio <= limit else "FAIL")
        lim = net + ("" if limit is None else f" (limit {limit:g}x)")
        out.append(
            {
                "id": cid,
                "title": title,
                "status": status,
                "ours_ns": row["median_ns"],
                "peer_ns": row["peer_median_ns"],
                "ratio": ratio,
                "best_ratio": best_ratio(row),
                "limit": limit,
                "text": f"{row['median_ns']:.1f} ns vs {row['peer']} {row['peer_median_ns']:.1f} ns "
                f"= {ratio:.3f}x{lim}",
            }
        )

    n = "telemetrain.stats"
    m = "telemetrain.monitor"
    before = len(out)
    ratio_check(
        "1a", "stats.Stat.add(1.0) <= 0.5x torch.monitor", row_of(n, 'Stat(["mean","count"], window=600).add(1.0)'), 0.5
    )
    nx_row = row_of("baseline", "`nx()`: next of a prebuilt list of floats (cycle), the varying rows' value")
    ratio_check(
        "1b",
        "stats.Stat.add(varying) <= 0.5x torch.monitor",
        row_of(n, 'Stat(["mean","count"], window=600).add(nx())'),
        0.5,
        nx_row,
    )
    ratio_check(
        "1c", "monitor.Stat.add(1.0) <= 0.5x torch.monitor", row_of(m, "Stat([MEAN,COUNT], 600s).add(1.0)"), 0.5
    )
    ratio_check(
        "1d",
        "monitor.Stat.add(varying) <= 0.5x torch.monitor",
        row_of(m, "Stat([MEAN,COUNT], 600s).add(nx())"),
        0.5,
        nx_row,
    )
    pairs = {
        "1a": 'telemetrain.stats Stat(["mean","count"]).add(1.0)',
        "1b": 'telemetrain.stats Stat(["mean","count"]).add(nx())',
        "1c": "telemetrain.monitor Stat([MEAN,COUNT]).add(1.0)",
        "1d": "telemetrain.monitor Stat([MEAN,COUNT]).add(nx())",
    }
    for c in out[before:]:
        pr = row_of("paired", pairs[c["id"]])
        if pr is not None and c.get("ratio") is not None:
            c["paired_ratio"] = pr["ratio"]
            c["text"] += f"; paired (interleaved) ratio {pr['ratio']:.3f}x; best/best {c['best_ratio']:.3f}x"
    ratio_check(
        "2a",
        "quantile stat, samples=100, lognormal: vs torch MEAN/COUNT add (information)",
        row_of(n, "Stat([count,mean,p50,p90,p99], samples=100)"),
        None,
    )
    ratio_check(
        "2b",
        "quantile stat, window=600 (histogram), lognormal: vs torch MEAN/COUNT add (information)",
        row_of(n, "Stat([count,mean,p50,p90,p99], window=600)"),
        None,
    )

    for i, th in enumerate(EXTRA["threads"]):
        cid = f"3{ascii_lowercase[i]}"
        per = row_of(th["library"], f"{th['operation']}: per thread")
        ratio = f"; per thread {per['median_ns']:.1f} ns/op" if per else ""
        if per and per.get("ratio") is not None:
            ratio += f" = {per['ratio']:.3f}x torch.monitor's"
        last = th["repeats"][-1]
        got = last.get("sum_sample_count", last.get("count"))
        out.append(
            {
                "id": cid,
                "title": f"exact count, {th['library']}: {th['operation']}",
                "status": "PASS" if th["exact"] else "FAIL",
                "exact": th["exact"],
                "ratio": None if not per else per.get("ratio"),
                "text": f"{len(th['repeats'])} repeats, last: {got:,} of {last['expected']:,} samples{ratio}",
            }
        )

    ratio_check(
        "4a",
        "`with s.time(): pass` <= 2x `with nullcontext(): pass`",
        row_of(n, 'Stat(["mean","count"], window=600): `with s.time(): pass`'),
        2.0,
    )
    ratio_check(
        "4b",
        "@s.time-decorated empty call vs plain call (information)",
        row_of(n, "call of the @s.time-decorated empty function"),
        None,
    )

    for i, mem in enumerate(EXTRA["memory"]):
        out.append(
            {
                "id": f"5{ascii_lowercase[i]}",
                "title": f"memory {mem['scenario']}",
                "status": "PASS" if mem["ok"] else "FAIL",
                "held_bytes": mem["held_bytes"],
                "bound_bytes": mem["bound_bytes"],
                "text": f"held {mem['held_bytes']:,} B ({mem['held_bytes'] / KIB:.1f} KiB), "
                f"peak {mem['peak_bytes']:,} B; bound {mem['bound']}",
            }
        )
    for i, wc in enumerate(EXTRA["window_close"]):
        out.append(
            {
                "id": f"6{ascii_lowercase[i]}",
                "title": f"window close: {wc['window']} (information)",
                "status": "INFO",
                "median_us": wc["median_us"],
                "text": f"{wc['median_us']:.1f} us median, {wc['best_us']:.1f} us best over {wc['windows']} windows",
            }
        )
    store = EXTRA.get("store")
    if isinstance(store, dict):
        out.append(
            {
                "id": "7",
                "title": "every reported window is in the run store (nothing dropped)",
                "status": "PASS" if store["ok"] else "FAIL",
                "text": f"{store['stat_records_in_store']:,} stat records, {store['samples_in_store']:,} samples; "
                f"reported {store['reported_windows']:,}; missing {store['missing'] or 'none'}; wrong counts "
                f"{store['wrong_sample_counts'] or 'none'}; dropped {store['dropped']}, failed {store['failed']}",
            }
        )
    return out


def best_ratio(row: dict[str, Any]) -> float:
    """best / best of a row and its peer row."""
    for p in RESULTS:
        if f"{p['library']} | {p['operation']}" == row["peer"]:
            ratio: float = row["best_ns"] / p["best_ns"]
            return ratio
    return math.nan


def render_table() -> str:
    def cells(r: dict[str, Any]) -> list[str]:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}x"
        return [ratio, "" if r["peer"] is None else r["peer"].replace("|", "\\|")]

    return _method.render_table([("ratio to peer", "---:"), ("peer", "---")], cells)


def render_memory() -> str:
    lines = [
        "| memory scenario | samples | pending | open window | last closed window | held bytes (tracemalloc) "
        "| samples + buckets bytes (getsizeof) | peak bytes | bound |",
        "|---|---:|---:|---|---|---:|---:|---:|---|",
    ]
    for m in EXTRA["memory"]:
        lines.append(
            f"| {m['scenario']} | {m['samples']:,} | {m['pending']:,} | {m['open_window']} | "
            f"{m['last_closed_window'] or '-'} | {m['held_bytes']:,} | {m['samples_and_buckets_bytes']:,} | "
            f"{m['peak_bytes']:,} | {m['bound']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    global ARGS
    ap = _method.parser(__doc__, "short smoke run (< 15 s)")
    ap.add_argument("--thread-n", type=int, default=300_000, help="adds per thread and repeat")
    ap.add_argument("--mem-n", type=int, default=1_000_000, help="samples of the big memory scenarios")
    ap.add_argument("--close-windows", type=int, default=100, help="windows closed per close row")
    ap.add_argument("--only", help="comma-separated sections to run (baseline always runs first)")
    ARGS = _method.parse_args(ap, argv)
    ARGS.collect = not ARGS.quick  # gc.collect() takes ~75 ms with torch loaded: the smoke run skips it
    if ARGS.quick:
        ARGS.repeats, ARGS.target_ms, ARGS.min_n, ARGS.max_n, ARGS.warmup_s = 2, 15.0, 500, 100_000, 0.1
        ARGS.thread_n, ARGS.mem_n, ARGS.close_windows = 10_000, 50_000, 10

    import telemetrain

    tmpdir = tempfile.mkdtemp(prefix="bench_stats_")
    load_before = _method.loadavg()
    _method.spin(ARGS.warmup_s)
    t = telemetrain.Telemetry(store=os.path.join(tmpdir, "store"))
    sections = [
        ("baseline", section_baseline),
        ("add", lambda: section_add(t)),
        ("quantiles", lambda: section_quantiles(t)),
        ("threads", lambda: section_threads(t)),
        ("time", lambda: section_time(t)),
        ("memory", lambda: section_memory(t)),
        ("close", lambda: section_close(t)),
        ("pieces", lambda: section_pieces(t)),
    ]
    try:
        # a section failing fails the run, torch not installed apart (pieces read internals: a note)
        failed = _method.run_sections(sections, lambda name: name != "pieces", ARGS.only)
        gc.collect()
        t.close(timeout=60)
        EXTRA["store"] = check_store(t)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    load_after = _method.loadavg()
    results_checks = checks()

    _method.print_header(DISTS, load_before, load_after)
    collect = "gc.collect() before each repeat" if ARGS.collect else "no gc.collect() between repeats (--quick)"
    print(
        f"method: median and best of {ARGS.repeats} repeats, n calibrated to ~{ARGS.target_ms:.0f} ms per repeat "
        f"(n in [{ARGS.min_n:,}, {ARGS.max_n:,}]), GC enabled, {collect}, perf_counter_ns; "
        f"threads: {ARGS.thread_n:,} adds per thread and repeat"
    )
    print()
    print(render_table())
    print()
    print(render_memory())
    print()
    _method.print_notes()
    print()
    _method.print_checks(results_checks)
    targets = {
        "1": "add <= 0.5x torch.monitor",
        "3": "2 threads: exact counts",
        "4": "time() <= 2x nullcontext",
        "5": "memory within the documented bound",
        "7": "records in the run store",
    }
    for key, title in targets.items():
        mine = [c for c in results_checks if c["id"].startswith(key) and c["status"] != "INFO"]
        if not mine:
            status = "SKIP"
        else:
            status = "FAIL" if any(c["status"] in ("FAIL", "SKIP") for c in mine) else "PASS"
        print(f"target {key}: {status}: {title} ({sum(c['status'] == 'PASS' for c in mine)}/{len(mine)} checks pass)")
    if ARGS.json:
        fields = {
            "source": _method.source_state(),
            "load_before": load_before,
            "load_after": load_after,
            "args": vars(ARGS),
            "results": RESULTS,
            "threads": EXTRA["threads"],
            "memory": EXTRA["memory"],
            "window_close": EXTRA["window_close"],
            "store": EXTRA.get("store"),
            "fold_ns_per_sample": EXTRA.get("fold_ns_per_sample"),
            "numpy_loaded": EXTRA.get("numpy_loaded"),
        }
        _method.write_json(ARGS.json, DISTS, fields, results_checks)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    sys.exit(main())
