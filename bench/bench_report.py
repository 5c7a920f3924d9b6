#!/usr/bin/env python3
"""How long ``telemetrain report`` takes on a big run: 8 ranks x 100,000 iterations must report in <= 10 s.

The run is written once, before timing, by real ``Telemetry`` instances (one per rank, one after the other) driving
real ``TrainingRecorder``s at explicit times (``*_time_msec``; explicit monotonic ns for the sub-phase spans), as a
training job would write it: a ``training_metrics_update`` event and its ``train.*`` metric records every 50
iterations (2,000 windows per rank), the exported iteration spans (one in 50) with their sub-phases, a checkpoint
save every 10,000 iterations, and a few straggler events. Rank ``r``'s iterations take ``100 + 2r`` ms; rank 5 is
30% slower from iteration 40,000 on (``--quick``: the last rank, from 40% of the iterations), so the heatmap and
the findings have something to show.

Timed, each ``--repeats`` times (median and best; ``gc.collect()`` before each), on the pure-Python path
(``TELEMETRAIN_ENGINE=python``: ``bench_scale.py`` times the DuckDB readers):

  read            ``store.open_run``: the reader alone (the floor: every report reads every line)
  load            ``report.load.load_run`` with a progress callback (the report's own, file-by-file read)
  analyse         ``report.model.build_model`` on the loaded run (the goodput of the session included: it reads the
                  run again, through its own ``open_run``)
  render          ``report.html.render`` of the model
  report, total   ``write_report(run_dir, out)``: all of the above plus the write, as the CLI runs it (it pauses the
                  cyclic GC while it loads and analyses; the rows above run with the GC on, as a caller's would)

Wall and process CPU time of each; the work is single-threaded, so they agree on an idle core, and on a shared machine
the CPU time is the cost (the wall time also holds the waits for a CPU: compare the load average printed). Ratios:
CPU time against ``read``. Check 1: the total's CPU time <= 10 s (the issue's bound).

Method: ``_method.py`` beside this script (options, machine description, notes, checks, JSON).

Usage:
    python bench/bench_report.py                  # full run: 8 ranks x 100,000 iterations (writing it: ~1-2 min)
    python bench/bench_report.py --quick          # smoke run: 2 ranks x 2,000 iterations (a few seconds)
    python bench/bench_report.py --json out.json  # also write the raw results
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from time import perf_counter_ns, process_time_ns
from typing import Any

import _method
from _method import NOTES, RESULTS, new_row, progress

ARGS: Any
DISTS = ("telemetrain",)
LIMIT_S = 10.0
PHASES_MS = (("data_loading", 0.10), ("model_forward", 0.30), ("model_backward", 0.45), ("optimizer_update", 0.10))
SLOW_FACTOR = 1.3  # rank min(5, ranks - 1) from 40% of the iterations on


def write_run(root: Path, ranks: int, iterations: int, log_every: int) -> Path:
    """The run, written by the real pipeline at simulated times; returns its directory."""
    from telemetrain import Telemetry, identity_from_env
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    # the simulated timeline ends about now: the records written at the real time (the process headers, the
    # straggler events) fall right after it, as in a real run
    base_ms = time.time() * 1000 - iterations * 160.0
    for rank in range(ranks):
        identity = identity_from_env({}, run_id="bench", session_tag="bench-report", perf_tag="bench", rank=rank,
                                     local_rank=rank % 8, world_size=ranks)
        t = Telemetry(identity, store=root, config={"ranks": ranks, "iterations": iterations})
        config = TrainingTelemetryConfig(global_batch_size_or_fn=32, seq_length_or_fn=1024,
                                         log_every_n_train_iterations=log_every, flops_per_sample_or_fn=6e9 * 1024,
                                         peak_tflops_per_gpu=989.0)
        r = TrainingRecorder(config, telemetry=t)
        offset = t.wall_offset_ns
        now = 0.0

        def mono(ms: float) -> int:
            return round((base_ms + ms) * 1e6) - offset  # noqa: B023 - used within this rank's iteration

        r.on_app_start(base_ms + now)
        r.on_model_init_start(base_ms + now)
        now += 2000.0
        r.on_model_init_end(base_ms + now)
        r.on_train_start(0, start_time_msec=base_ms + now)
        base = 100.0 + 2 * rank
        slow_rank, slow_from = min(5, ranks - 1), int(0.4 * iterations)
        start_span = r.tracer.start
        for step in range(iterations):
            duration = base * (SLOW_FACTOR if rank == slow_rank and step >= slow_from else 1.0)
            r.on_training_single_iteration_start(base_ms + now)
            at = now
            for name, share in PHASES_MS:
                span = start_span(name, group="training", start_ns=mono(at))
                at += duration * share
                span.end(end_ns=mono(at))
            r.on_training_single_iteration_end(base_ms + now + duration)
            now += duration + 1.0
            if (step + 1) % 10_000 == 0:
                r.on_save_checkpoint_start(step + 1, base_ms + now)
                r.on_save_checkpoint_success(step + 1, base_ms + now + 1500)
                r.on_save_checkpoint_end(base_ms + now + 1500)
                now += 1500.0
            if rank == 0 and step % 5000 == 0 and step >= slow_from:
                t.event("straggler", {"rank": slow_rank, "host": "node-a", "phase": "iteration", "kind": "relative",
                                      "score": SLOW_FACTOR, "threshold": 1.2, "step": step}, group="cross_rank")
        r.on_train_end(base_ms + now)
        r.on_app_end(base_ms + now + 100)
        if not t.close(timeout=120):
            raise RuntimeError(f"rank {rank}: the run store did not flush")
        progress(f"wrote rank {rank}: {iterations:,} iterations")
    return root / "bench-report" / "bench"


def timed(label: str, fn: Any, reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """Wall and process CPU time of ``fn()``, ``--repeats`` times. The work is single-threaded, so on an idle core
    the two agree; on a shared machine the wall time also holds the waits for a CPU, and CPU time is the cost."""
    samples, cpu = [], []
    for _ in range(ARGS.repeats):
        gc.collect()
        t0, c0 = perf_counter_ns(), process_time_ns()
        fn()
        samples.append(float(perf_counter_ns() - t0))
        cpu.append(float(process_time_ns() - c0))
    row = new_row("telemetrain.report", label, samples, 1)
    row["cpu_median_ns"], row["cpu_best_ns"], row["cpu_repeats"] = statistics.median(cpu), min(cpu), cpu
    row["ratio"] = None if reference is None else row["cpu_median_ns"] / reference["cpu_median_ns"]
    RESULTS.append(row)
    progress(f"{label:<48} wall {row['median_ns'] / 1e9:7.3f} s  CPU {row['cpu_median_ns'] / 1e9:7.3f} s")
    return row


def section(run_dir: Path, out: Path) -> None:
    from telemetrain.report import write_report
    from telemetrain.report.html import render
    from telemetrain.report.load import load_run
    from telemetrain.report.model import build_model
    from telemetrain.store import open_run

    run = open_run(run_dir)
    records = len(run)
    size = sum(p.path.stat().st_size for p in run.processes)
    model = build_model(run)
    read = timed("read: store.open_run", lambda: open_run(run_dir))
    timed("load: report.load.load_run (with progress)", lambda: load_run(run_dir, lambda *a: None), read)
    timed("analyse: report.model.build_model (+ goodput)", lambda: build_model(run), read)
    timed("render: report.html.render", lambda: render(model), read)
    total = timed("report, total: write_report(run_dir, out)", lambda: write_report(run_dir, out), read)
    _method.NOTES.append(f"run: {len(run.processes)} ranks, {records:,} records, {size / 2**20:,.1f} MiB of JSONL; "
                         f"report: {out.stat().st_size / 2**10:,.0f} KiB")
    RUN_INFO.update(records=records, bytes=size, report_bytes=out.stat().st_size, ranks=len(run.processes),
                    findings=[f.title for f in model.findings], total_s=total["median_ns"] / 1e9)


RUN_INFO: dict[str, Any] = {}


def checks() -> list[dict[str, Any]]:
    total = next((r for r in RESULTS if r["operation"].startswith("report, total")), None)
    if total is None:
        return [{"id": "1", "status": "SKIP", "text": "not measured"}]
    seconds = total["cpu_median_ns"] / 1e9
    scale = "" if not ARGS.quick else " (--quick: a small run; the bound is for 8 ranks x 100k iterations)"
    return [{"id": "1", "title": f"report of {ARGS.ranks} ranks x {ARGS.iterations:,} iterations <= {LIMIT_S:g} s "
             "of CPU (single-threaded: the wall time on an idle core)",
             "status": "PASS" if seconds <= LIMIT_S else "FAIL", "seconds": seconds,
             "wall_seconds": total["median_ns"] / 1e9,
             "text": f"CPU median {seconds:.2f} s (best {total['cpu_best_ns'] / 1e9:.2f} s); wall median "
             f"{total['median_ns'] / 1e9:.2f} s (best {total['best_ns'] / 1e9:.2f} s){scale}"}]


def render_table() -> str:
    lines = ["| library | operation | CPU median s | CPU best s | wall median s | wall best s | "
             "CPU ratio to read | n |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in RESULTS:
        ratio = "" if r.get("ratio") is None else f"{r['ratio']:.2f}x"
        lines.append(f"| {r['library']} | {r['operation']} | {r['cpu_median_ns'] / 1e9:.3f} | "
                     f"{r['cpu_best_ns'] / 1e9:.3f} | {r['median_ns'] / 1e9:.3f} | {r['best_ns'] / 1e9:.3f} | "
                     f"{ratio} | {len(r['repeats'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    global ARGS
    # This benchmark times the pure-Python path (bench_scale.py times the DuckDB one): the same whether or not the
    # columnar extra is installed.
    os.environ["TELEMETRAIN_ENGINE"] = "python"
    ap = _method.parser(__doc__, "smoke run: 2 ranks x 2,000 iterations")
    ap.set_defaults(repeats=3)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=100_000)
    ap.add_argument("--log-every", type=int, default=50, help="log_every_n_train_iterations (a window every N)")
    ap.add_argument("--keep", metavar="DIR", help="write the run under DIR and keep it (reused when already there)")
    ARGS = _method.parse_args(ap, argv)
    if ARGS.quick:
        ARGS.ranks, ARGS.iterations, ARGS.repeats = 2, 2000, 2
    tmpdir = Path(tempfile.mkdtemp(prefix="bench_report_"))
    root = Path(ARGS.keep) if ARGS.keep else tmpdir / "store"
    load_before = _method.loadavg()
    t_start = perf_counter_ns()
    try:
        run_dir = root / "bench-report" / "bench"
        if not run_dir.is_dir():
            t0 = perf_counter_ns()
            write_run(root, ARGS.ranks, ARGS.iterations, ARGS.log_every)
            NOTES.append(f"writing the run (not timed): {(perf_counter_ns() - t0) / 1e9:.0f} s")
        failed = _method.run_sections([("report", lambda: section(run_dir, tmpdir / "report.html"))],
                                      lambda name: True)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    load_after = _method.loadavg()
    results_checks = checks()
    if RUN_INFO.get("findings"):
        NOTES.append("findings: " + "; ".join(RUN_INFO["findings"]))
    _method.print_header(DISTS, load_before, load_after)
    print(f"method: {ARGS.ranks} ranks x {ARGS.iterations:,} iterations, a window every {ARGS.log_every}; each step "
          f"{ARGS.repeats} times, median and best, gc.collect() before each; whole run "
          f"{(perf_counter_ns() - t_start) / 1e9:.0f} s")
    _method.print_report(render_table(), results_checks, ARGS.json, DISTS, (load_before, load_after), ARGS,
                         {"run": RUN_INFO})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    sys.exit(main())
