"""bench_stats.py's pieces section: where the time of one ``add`` goes."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import _stats_state as state
from _method import NOTES, row_of
from _stats_harness import LOGN, LOGN_NARROW, _stat, bench, derived
from _stats_state import EXTRA, MEAN_COUNT, QUANTILES

if TYPE_CHECKING:
    from telemetrain import Telemetry


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

    per_call = max(state.ARGS.min_n // 10, 2000)
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
