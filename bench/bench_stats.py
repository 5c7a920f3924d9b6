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

import gc
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

# the sections, their harness, shared state and checks: the sibling modules bench/_stats_*.py, one job each
import _method
import _stats_state as state
from _method import RESULTS
from _stats_calls import section_add, section_baseline, section_quantiles, section_time
from _stats_checks import check_store, checks, render_memory, render_table
from _stats_memory import section_close, section_memory
from _stats_pieces import section_pieces
from _stats_state import DISTS, EXTRA
from _stats_threads import section_threads

warnings.filterwarnings("ignore")  # torch's "Failed to initialize NumPy" where numpy is absent


def main(argv: list[str] | None = None) -> int:
    ap = _method.parser(__doc__, "short smoke run (< 15 s)")
    ap.add_argument("--thread-n", type=int, default=300_000, help="adds per thread and repeat")
    ap.add_argument("--mem-n", type=int, default=1_000_000, help="samples of the big memory scenarios")
    ap.add_argument("--close-windows", type=int, default=100, help="windows closed per close row")
    ap.add_argument("--only", help="comma-separated sections to run (baseline always runs first)")
    args = state.ARGS = _method.parse_args(ap, argv)  # the sections read state.ARGS
    args.collect = not args.quick  # gc.collect() takes ~75 ms with torch loaded: the smoke run skips it
    if args.quick:
        args.repeats, args.target_ms, args.min_n, args.max_n, args.warmup_s = 2, 15.0, 500, 100_000, 0.1
        args.thread_n, args.mem_n, args.close_windows = 10_000, 50_000, 10

    import telemetrain

    tmpdir = tempfile.mkdtemp(prefix="bench_stats_")
    load_before = _method.loadavg()
    _method.spin(args.warmup_s)
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
        failed = _method.run_sections(sections, lambda name: name != "pieces", args.only)
        gc.collect()
        t.close(timeout=60)
        EXTRA["store"] = check_store(t)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    load_after = _method.loadavg()
    results_checks = checks()

    _method.print_header(DISTS, load_before, load_after)
    collect = "gc.collect() before each repeat" if args.collect else "no gc.collect() between repeats (--quick)"
    print(
        f"method: median and best of {args.repeats} repeats, n calibrated to ~{args.target_ms:.0f} ms per repeat "
        f"(n in [{args.min_n:,}, {args.max_n:,}]), GC enabled, {collect}, perf_counter_ns; "
        f"threads: {args.thread_n:,} adds per thread and repeat"
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
    if args.json:
        fields = {
            "source": _method.source_state(),
            "load_before": load_before,
            "load_after": load_after,
            "args": vars(args),
            "results": RESULTS,
            "threads": EXTRA["threads"],
            "memory": EXTRA["memory"],
            "window_close": EXTRA["window_close"],
            "store": EXTRA.get("store"),
            "fold_ns_per_sample": EXTRA.get("fold_ns_per_sample"),
            "numpy_loaded": EXTRA.get("numpy_loaded"),
        }
        _method.write_json(args.json, DISTS, fields, results_checks)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    sys.exit(main())
