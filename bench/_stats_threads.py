"""bench_stats.py's section 3: two threads adding to one stat, against torch.monitor."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from datetime import timedelta
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

import _stats_state as state
from _method import NOTES, compile_stmt, progress
from _stats_harness import _empty, _row, _stat
from _stats_state import EXTRA, MEAN_COUNT, QUANTILES, S

if TYPE_CHECKING:
    import torch.monitor

    from telemetrain import Telemetry
    from telemetrain.stats import Stat as AnyStat


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
    n = state.ARGS.thread_n
    fns = [compile_stmt("s.add(1.0)", {"s": None}) for _ in range(2)]
    warm = make(-1)
    for f in fns:
        f.__globals__["s"] = warm
        f(2000)  # specialise the bytecode on a throwaway stat
    if hasattr(warm, "close"):
        warm.close()
    per_thread, aggregate, verdicts = [], [], []
    for r in range(state.ARGS.repeats):
        s = make(r)
        for f in fns:
            f.__globals__["s"] = s
        if state.ARGS.collect:
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
    for _ in range(state.ARGS.repeats):
        if state.ARGS.collect:
            gc.collect()
        p, a = _run_threads([g, g], state.ARGS.thread_n)
        pt.extend(p)
        agg.append(a)
    _row(lib2, "2 threads x empty call `f()` (GIL reference): per thread", pt, state.ARGS.thread_n, None)
    _row(
        lib2, "2 threads x empty call `f()` (GIL reference): aggregate (wall / all ops)", agg, state.ARGS.thread_n, None
    )

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
