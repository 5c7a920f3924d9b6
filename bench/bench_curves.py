"""Cost of the report's curve builder (report/curves.py) per point, and its memory as the run grows.

    python bench/bench_curves.py

Feeds ``CurveBuilder.add`` one (rank, group, name, step, value, wall_ns) tuple at a time, as the report's record pass
does: CPU time per point (process time, so a busy machine inflates it less than wall time), then the memory the
builder holds (tracemalloc) after 10k, 100k and 1M points of one series and of 8 ranks x 4 series, and the time to
build the charts' curves from it; then the same 1M points of one series with 10 rollbacks (each attempt goes back 5%
of its steps and logs them again: the abandoned buckets are kept too, within the same bound).
"""

from __future__ import annotations

import argparse
import math
import time
import tracemalloc

from telemetrain.report.curves import CurveBuilder


def _steps(per: int, rollbacks: int) -> list[int]:
    """``per`` steps in the order logged: ``rollbacks`` times, going back 5% of an attempt's steps."""
    if not rollbacks:
        return list(range(per))
    out: list[int] = []
    attempt = per // (rollbacks + 1)
    step = 0
    for i in range(rollbacks + 1):
        end = step + (attempt if i < rollbacks else per - len(out))  # (the last attempt: the rest)
        out.extend(range(step, end))
        step = end - attempt // 20
    return out


def feed(points: int, ranks: int = 1, series: int = 1, rollbacks: int = 0) -> tuple[float, int, float]:
    """(CPU ns per point, bytes held, CPU ms to build the curves)."""
    names = [f"loss{i}" for i in range(series)]
    per = points // (ranks * series)
    steps = _steps(per, rollbacks)
    held = elapsed = 0
    for traced in (False, True):  # timed without tracemalloc (it slows every allocation), then measured with it
        if traced:
            tracemalloc.start()
        b = CurveBuilder()
        t0 = time.process_time_ns()
        for step in steps:
            v = 2.0 + 1.0 / (step + 1)
            for rank in range(ranks):
                for name in names:
                    b.add(rank, "train", name, step, v, step * 1_000_000)
        if traced:
            held = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
        else:
            elapsed = time.process_time_ns() - t0
    t2 = time.process_time_ns()
    curves = b.curves()
    t3 = time.process_time_ns()
    assert curves and all(len(line.points) <= b.capacity for c in curves for line in (*c.lines, *c.abandoned))
    assert all(len(c.rollbacks) == rollbacks for c in curves)
    return elapsed / (per * ranks * series), held, (t3 - t2) / 1e6


def main() -> None:
    print("| points | series x ranks | ns/point (CPU) | builder memory | curves() ms (CPU) |")
    print("|---:|---:|---:|---:|---:|")
    for points in (10_000, 100_000, 1_000_000):
        for ranks, series in ((1, 1), (8, 4)):
            ns, held, ms = feed(points, ranks, series)
            print(f"| {points:,} | {series} x {ranks} | {ns:,.0f} | {held / 1024:,.0f} KiB | {ms:,.1f} |")
    ns, held, ms = feed(1_000_000, rollbacks=10)
    print(f"| 1,000,000, 10 rollbacks | 1 x 1 | {ns:,.0f} | {held / 1024:,.0f} KiB | {ms:,.1f} |")
    assert math.isfinite(ns)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # no options; --help answers
    main()
