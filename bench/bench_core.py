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

import shutil
import sys
import tempfile
import warnings
from pathlib import Path

# the sections, their harness, shared state and checks: the sibling modules bench/_core_*.py, one job each
import _core_state as state
import _method
from _core_caller import section_telemetrain
from _core_checks import checks, render_table, render_writer
from _core_peers import section_baseline, section_otel, section_prometheus, section_torchelastic
from _core_pieces import section_pieces
from _core_state import DISTS, EXTRA
from _core_writer import section_flood, section_throughput
from _method import NOTES, RESULTS

warnings.filterwarnings("ignore")  # torch's "Failed to initialize NumPy", telemetrain's drop warning in the flood


def main(argv: list[str] | None = None) -> int:
    ap = _method.parser(__doc__, "short smoke run (2 repeats of ~20 ms, small throughput runs)")
    ap.add_argument("--throughput-n", type=int, default=1_000_000)
    ap.add_argument("--throughput-runs", type=int, default=3)
    ap.add_argument("--flood-n", type=int, default=3_000_000)
    args = state.ARGS = _method.parse_args(ap, argv)  # the sections read state.ARGS
    if args.quick:
        args.repeats, args.target_ms, args.min_n, args.max_n = 2, 20.0, 500, 200_000
        args.warmup_s, args.throughput_n, args.throughput_runs, args.flood_n = 0.2, 100_000, 1, 300_000

    tmpdir = tempfile.mkdtemp(prefix="bench_core_")
    load_before = _method.loadavg()
    _method.spin(args.warmup_s)
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
        f"method: median and best of {args.repeats} repeats, n calibrated to ~{args.target_ms:.0f} ms per repeat "
        f"(n in [{args.min_n:,}, {args.max_n:,}]), GC enabled, gc.collect() before each repeat, perf_counter_ns"
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
    if args.json:
        fields = {
            "load_before": load_before,
            "load_after": load_after,
            "args": vars(args),
            "results": RESULTS,
            "writer": EXTRA,
        }
        _method.write_json(args.json, DISTS, fields, results_checks)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    sys.exit(main())
