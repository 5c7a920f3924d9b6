#!/usr/bin/env python3
"""telemetrain's training telemetry (``telemetrain.training``) and spans (``telemetrain.spans``) next to
nv-one-logger's training telemetry and OpenTelemetry SDK spans, and the overhead of full lifecycle telemetry on a small
CPU training run.

Sections (ns per operation, median and best of ``--repeats``; every row names the row it is compared with):

  baseline     empty loop, empty call, ``with contextlib.nullcontext(): pass``
  one-logger   one training iteration, ``on_training_single_iteration_start(); on_training_single_iteration_end()``,
               nv-one-logger configured as its README shows (``TrainingTelemetryProvider.instance().with_base_config(
               ...).with_exporter(FileExporter(...)).configure_provider()``, ``on_app_start``,
               ``set_training_telemetry_config``, ``on_train_start``; global batch 8,
               ``log_every_n_train_iterations=50``, flops per sample given, throughput logging at its default, off).
               one-logger is a process singleton whose per-iteration cost grows with the loop's length, so each repeat
               is a fresh child process that times fixed blocks at known positions of one loop: iterations 0-1k (first
               calls, no warm-up) and 10k-11k
               Iteration rows are the training thread's CPU time (``time.thread_time_ns``: the caller side, what the
               step pays; one-logger does all its work there), with a wall-time row beside (all-in on this CPU-only
               machine, where our reporter and writer threads share the GIL with the loop; on a GPU job they run
               while the training thread waits for the device)
  iteration    the same two calls on ``TrainingRecorder(config, telemetry=Telemetry(store=<tmp>))`` (global batch 8,
               ``log_every_n_train_iterations=50``, flops per sample given; the run store's writer at its normal 0.2 s
               ``flush_interval``: it keeps up, the loop emits ~0.2 records an iteration), a fresh child process per
               repeat: iterations 0-1k (target 1a: <= 1/40 of one-logger's); then, at 1k, 10k, 100k and 1M iterations of
               the same loop, ``--block-pairs`` blocks of ``--block`` iterations (ns/iteration per block), each adjacent
               to the same block of a fresh reference loop at its iterations 1k.. (same process, alternating order):
               target 1b, every position within +-10% of the reference (the median of the per-block ratios; comparing
               blocks timed seconds apart on a shared 2-vCPU machine does not resolve 10%). The same through the
               module-level ``telemetrain.training.callbacks`` (default recorder): information. Each child checks its
               run store afterwards (every metrics update and sampled iteration span written, nothing dropped, no misuse
               recorded). The children import torch first, as a training process has: the recorder's first metrics
               report looks up the device's peak FLOP/s for MFU, which imports torch (measured apart, in a child without
               torch loaded: the "first report" row)
  spans        ``with span("it"): pass`` (``telemetrain.spans.span``, default Telemetry = an async JSONL run store),
               root spans and child spans inside an open parent, against the OpenTelemetry SDK's ``with
               tracer.start_as_current_span("it"): pass`` (``TracerProvider`` + ``BatchSpanProcessor(no-op
               SpanExporter)``), root and child; target 2: ours <= 1/15 of OTel's. Caller side, as bench_core.py's rows
               (BENCHMARKS.md, "Caller side versus writer"): the store's writer sleeps during a repeat
               (``flush_interval`` 3600 s, a queue that holds a whole repeat) and ``flush()`` runs between repeats,
               outside the timed region; a row with the writer awake (normal ``flush_interval``: its encoding shares the
               GIL with the loop) shows the all-in cost. "paired" rows time ours and OTel's in adjacent, alternating
               repeats and give the median of the per-pair ratios
  training     a small CPU training run (an MLP on synthetic data generated in-process, ``torch.set_num_threads(1)``, ~7
               ms a step): ``training.application`` > model/optimizer/data-loader init > ``training_loop`` >
               ``training_iteration`` > ``data_loading``, ``forward``, ``zero_grad``, ``backward``,
               ``optimizer_update``; every K steps a ``validation_loop`` of ``validation_iteration``s and a
               ``checkpoint_save`` (``torch.save`` to a temp file) -- against the same loop without telemetry. Rounds of
               three runs, plain / telemetry / plain, in rotating order; target 3: the median over rounds of telemetry /
               mean(plain, plain) <= 1.01. The two plain runs of a round give a control (their ratio: the method's noise
               floor), and the same telemetry calls around empty bodies give telemetry's direct cost
  pieces       where the time of an iteration and of a span goes: the recorder's iteration without metrics reports, the
               report amortised, the tracer span inside it, an Enum ``.value`` read, an ``RLock``; a span's build, its
               tracer lookup, the clock, a ContextVar set/reset, a packed tuple appended to a deque

Target 4: every telemetrain measurement wrote what it should (run store complete, nothing dropped, no misuse).

Method: the peers method (``_method.py`` beside this script; BENCHMARKS.md, "Method") for the in-process rows; the
per-position rows time fixed blocks with the same compiled loop in child processes (median and best over
``--repeats`` processes). Numbers include the loop overhead (the "empty loop" row). A peer that is not installed
(nv-one-logger, OpenTelemetry SDK, torch) has its rows skipped with a note.

Usage:
    python bench/bench_training.py                 # full run (~3-4 min), markdown on stdout, progress on stderr
    python bench/bench_training.py --quick         # short smoke run (< 20 s)
    python bench/bench_training.py --json out.json # also write the raw results
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

# the sections, their harness, shared state and checks: the sibling modules bench/_training_*.py, one job each
import _method
import _training_state as state
from _training_checks import TARGETS, checks, render_table
from _training_children import _child_main
from _training_iteration import section_baseline, section_iteration, section_one_logger
from _training_pieces import section_pieces
from _training_small_run import section_training
from _training_spans import _STORES, section_otel_spans, section_spans
from _training_state import DISTS, EXTRA

warnings.filterwarnings("ignore")  # torch's "Failed to initialize NumPy" where numpy is absent


def main(argv: list[str] | None = None) -> int:
    ap = _method.parser(__doc__, "short smoke run (< 20 s)")
    ap.add_argument("--block", type=int, default=3000, help="iterations per flatness block")
    ap.add_argument("--block-pairs", type=int, default=3, help="flatness blocks (each with a reference) per position")
    ap.add_argument(
        "--positions",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1000, 10_000, 100_000, 1_000_000],
        help="comma-separated iteration positions of the flatness blocks",
    )
    ap.add_argument("--train-steps", type=int, default=200)
    ap.add_argument("--train-every", type=int, default=50, help="validation + checkpoint every K steps")
    ap.add_argument("--val-iters", type=int, default=10)
    ap.add_argument("--train-pairs", type=int, default=13, help="rounds of three runs (plain, telemetry, plain)")
    ap.add_argument("--only", help="comma-separated sections to run (baseline always runs first)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-dir", help=argparse.SUPPRESS)
    ap.add_argument("--child-spec", help=argparse.SUPPRESS)
    args = state.ARGS = _method.parse_args(ap, argv)  # the sections read state.ARGS
    if args.child:
        print(json.dumps(_child_main(args.child, json.loads(args.child_spec), args.child_dir)))
        return 0
    args.collect = not args.quick
    args.processes = args.callback_processes = args.repeats
    if args.quick:
        args.repeats, args.target_ms, args.min_n, args.max_n, args.warmup_s = 2, 15.0, 500, 100_000, 0.1
        args.block, args.block_pairs, args.positions = 1000, 2, [1000, 10_000, 20_000]
        args.train_steps, args.train_every, args.val_iters, args.train_pairs = 30, 15, 4, 2
        args.processes = args.callback_processes = 1  # one child process of each kind

    tmpdir = tempfile.mkdtemp(prefix="bench_training_")
    load_before = _method.loadavg()
    _method.spin(args.warmup_s)
    sections = [
        ("baseline", section_baseline),
        ("one-logger", lambda: section_one_logger(tmpdir)),
        ("iteration", lambda: section_iteration(tmpdir)),
        ("spans", lambda: section_spans(tmpdir)),
        ("otel-spans", lambda: section_otel_spans(tmpdir)),
        ("training", lambda: section_training(tmpdir)),
        ("pieces", lambda: section_pieces(tmpdir)),
    ]
    try:
        # a section of ours failing fails the run; a peer not installed is an ImportError (skipped with a note);
        # the pieces read internals (a note)
        optional = ("pieces", "one-logger", "otel-spans")
        failed = _method.run_sections(sections, lambda name: name not in optional, args.only)
        for stores in _STORES:
            EXTRA["span_store"] = stores.close()
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    load_after = _method.loadavg()
    results_checks = checks()

    _method.print_header(DISTS, load_before, load_after)
    collect = "gc.collect() before each repeat" if args.collect else "no gc.collect() between repeats (--quick)"
    print(
        f"method: median and best of {args.repeats} repeats (in-process rows: n calibrated to ~{args.target_ms:.0f} "
        f"ms per repeat, n in [{args.min_n:,}, {args.max_n:,}]; per-position rows: {args.processes} child "
        f"process(es), fixed blocks), GC enabled, {collect}, perf_counter_ns"
    )
    print()
    print(render_table())
    print()
    _method.print_notes()
    print()
    _method.print_checks(results_checks)
    for key, title in TARGETS.items():
        mine = [c for c in results_checks if c["id"].startswith(key) and c["status"] != "INFO"]
        if not mine or all(c["status"] == "SKIP" for c in mine):
            status = "SKIP"
        else:
            status = "FAIL" if any(c["status"] in ("FAIL", "SKIP") for c in mine) else "PASS"
        print(f"target {key}: {status}: {title} ({sum(c['status'] == 'PASS' for c in mine)}/{len(mine)} checks pass)")
    _method.write_run_json(args.json, DISTS, (load_before, load_after), args, EXTRA, results_checks)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    sys.exit(main())
