"""bench_stats.py's per-call sections: the baseline, 1. add, 2. quantile stats and 4. time()."""

from __future__ import annotations

import contextlib
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import _stats_state as state
from _method import NOTES, paired, row_of, skip
from _stats_harness import LOGN, LOGN_NARROW, _empty, _nx, _stat, bench, derived
from _stats_state import EMITTED, MEAN_COUNT, QUANTILES

if TYPE_CHECKING:
    import torch.monitor

    from telemetrain import Telemetry


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
            collect=state.ARGS.collect,
        )
        paired(
            "paired",
            f"{label} Stat({cls_label}).add(nx()), interleaved with torch's add(nx())",
            "s.add(nx())",
            {"s": stat, "nx": _nx(LOGN)},
            t_vary,
            "s.add(nx())",
            {"s": st, "nx": _nx(LOGN)},
            collect=state.ARGS.collect,
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
