"""bench_training.py's section 1, one training iteration: the baseline, one-logger's and telemetrain's iteration
per position (in child processes), and the verdict on each child's run store."""

from __future__ import annotations

import contextlib
import statistics
from typing import Any

import _training_state as state
from _method import NOTES, progress, row_of
from _training_children import _run_child
from _training_harness import _empty, _require, _row, _torch_available, bench
from _training_state import EXTRA, FIRST_BLOCK, GLOBAL_BATCH, LOG_EVERY, ONE_LOGGER_LATE, ONE_LOGGER_MODULE

# -- baseline -----------------------------------------------------------------------------------------------------


def section_baseline() -> None:
    bench("baseline", "empty loop (`pass`)", "pass")
    bench("baseline", "empty function call `f()`", "f()", {"f": _empty})
    bench("baseline", "`with contextlib.nullcontext(): pass`", "with nc(): pass", {"nc": contextlib.nullcontext})


# -- 1. one training iteration: one-logger ----------------------------------------------------------------------------


def section_one_logger(tmpdir: str) -> None:
    _require("yaml", "PyYAML (nv-one-logger-core 2.3.1 imports it without declaring it)")
    _require(ONE_LOGGER_MODULE, "nv-one-logger-training-telemetry")
    spec = {"first": FIRST_BLOCK, "late": ONE_LOGGER_LATE}
    runs = []
    for i in range(state.ARGS.processes):
        runs.append(_run_child("one-logger", spec, tmpdir))
        progress(f"one-logger process {i + 1}/{state.ARGS.processes}: {runs[-1]['blocks']}")
    EXTRA["one_logger"] = runs
    lib = "nv-one-logger"
    first = _row(
        lib,
        f"1 train iteration: on_training_single_iteration_start(); _end(), iterations 0-{FIRST_BLOCK // 1000}k "
        "(fresh process)",
        [r["blocks"]["0"] for r in runs],
        FIRST_BLOCK,
    )
    _row(
        lib,
        f"same, iterations 0-{FIRST_BLOCK // 1000}k, wall time",
        [r["blocks_wall"]["0"] for r in runs],
        FIRST_BLOCK,
        first,
    )
    _row(
        lib,
        f"same, iterations {ONE_LOGGER_LATE // 1000}k-{(ONE_LOGGER_LATE + FIRST_BLOCK) // 1000}k of the same loop",
        [r["blocks"][str(ONE_LOGGER_LATE)] for r in runs],
        FIRST_BLOCK,
        first,
    )
    _row(
        lib,
        f"same, mean over iterations {FIRST_BLOCK // 1000}k-{ONE_LOGGER_LATE // 1000}k (the loop advanced between the "
        "blocks)",
        [r["advance_ns"] for r in runs],
        ONE_LOGGER_LATE - FIRST_BLOCK,
        first,
    )
    NOTES.append(
        "nv-one-logger: configured as its README shows (TrainingTelemetryProvider.instance().with_base_config(...)"
        ".with_exporter(FileExporter(...)).configure_provider(), on_app_start, set_training_telemetry_config, "
        f"on_train_start); global batch {GLOBAL_BATCH}, log_every_n_train_iterations={LOG_EVERY}, flops per sample "
        "given, throughput logging at its default (off: on, it costs a few % more, so the comparison is the "
        "conservative one); each repeat is a fresh process; FileExporter wrote "
        f"{statistics.median(r['export_bytes'] for r in runs) / 1e3:.0f} kB per process."
    )


# -- 1. one training iteration: telemetrain ---------------------------------------------------------------------------


def _positions_label(start: int, n: int) -> str:
    def k(x: int) -> str:
        if x == 0:
            return "0"
        if x >= 1_000_000 and x % 1000 == 0:
            return f"{x / 1e6:g}M"
        return f"{x / 1000:g}k" if x % 100 == 0 else str(x)

    return f"{k(start)}-{k(start + n)}"


def section_iteration(tmpdir: str) -> None:
    block, pairs = state.ARGS.block, state.ARGS.block_pairs
    spec = {"first": FIRST_BLOCK, "positions": state.ARGS.positions, "block": block, "pairs": pairs, "reference": True}
    runs = []
    for i in range(state.ARGS.processes):
        runs.append(_run_child("recorder", spec, tmpdir))
        r = runs[-1]
        progress(
            f"telemetrain process {i + 1}/{state.ARGS.processes}: 0-1k: {r['first_ns']:.0f} ns; "
            + "; ".join(
                f"{_positions_label(p['start'], pairs * block)}: "
                + ", ".join(f"{b['ns']:.0f}/{b['ref_ns']:.0f}" for b in p["blocks"])
                for p in r["positions"]
            )
            + " ns (block/reference)"
        )
    EXTRA["ours"] = runs
    lib = "telemetrain"
    peer = row_of("nv-one-logger", "1 train iteration")
    first = _row(
        lib,
        "1 train iteration: TrainingRecorder.on_training_single_iteration_start(); _end(), iterations "
        f"{_positions_label(0, FIRST_BLOCK)} (fresh process)",
        [r["first_ns"] for r in runs],
        FIRST_BLOCK,
        peer,
    )
    _row(
        lib,
        f"same, iterations {_positions_label(0, FIRST_BLOCK)}, wall time (all-in: the reporter and the writer share "
        "the GIL with the loop)",
        [r["first_wall_ns"] for r in runs],
        FIRST_BLOCK,
        row_of("nv-one-logger", f"same, iterations 0-{FIRST_BLOCK // 1000}k, wall time"),
    )
    ref_label = _positions_label(FIRST_BLOCK, block)
    ref = _row(
        lib,
        f"reference: a fresh loop's iterations {ref_label} (one per block below, interleaved with it)",
        [statistics.mean(b["ref_ns"] for p in r["positions"] for b in p["blocks"]) for r in runs],
        block,
    )
    ref["all_ref_ns"] = [b["ref_ns"] for r in runs for p in r["positions"] for b in p["blocks"]]
    flat_rows = []
    for k, pos in enumerate(runs[0]["positions"]):
        label = _positions_label(pos["start"], pairs * block)
        per_process = [statistics.mean(b["ns"] for b in r["positions"][k]["blocks"]) for r in runs]
        ratios = [b["ns"] / b["ref_ns"] for r in runs for b in r["positions"][k]["blocks"]]
        row = _row(
            lib,
            f"same, iterations {label} of the same loop ({pairs} blocks of {block:,}, each interleaved with a fresh "
            f"loop's {ref_label})",
            per_process,
            pairs * block,
            ref,
        )
        row["ratio"] = statistics.median(ratios)
        row["pair_ratios"] = ratios
        row["position"] = pos["start"]
        flat_rows.append(row)
        progress(
            f"{'':<24} interleaved ratio {row['ratio']:.3f} ({len(ratios)} pairs, {min(ratios):.2f}-{max(ratios):.2f})"
        )
    total_its = statistics.median(r["iterations"] for r in runs)
    all_ns = []
    for r in runs:
        parts = [(r["first_ns"], FIRST_BLOCK)] + [(a["ns"], a["n"]) for a in r["advances"]]
        parts += [(b["ns"], b["n"]) for p in r["positions"] for b in p["blocks"]]
        all_ns.append(sum(ns * n for ns, n in parts) / sum(n for _, n in parts))
    _row(lib, f"same, mean over the whole loop ({total_its:,.0f} iterations)", all_ns, int(total_its), first)
    EXTRA["ours_store"] = [_store_verdict(r) for r in runs]
    buckets = [(p["start"], p["buckets"]) for p in runs[0]["positions"]]
    NOTES.append(
        "telemetrain iteration: TrainingRecorder(config, telemetry=Telemetry(store=<tmp>)), global batch "
        f"{GLOBAL_BATCH}, log_every_n_train_iterations={LOG_EVERY}, flops per sample given (no peak given: on this "
        "CPU machine no MFU); the writer at its normal 0.2 s flush_interval; torch imported first in each child. "
        f"Flatness: at each position the loop runs {pairs} blocks of {block:,} iterations, each adjacent to the same "
        f"block of a fresh reference loop (its iterations {ref_label}, built and advanced to 1k untimed), in "
        "alternating order; a row's ns/op is the median over processes of the blocks' mean, its ratio the median of "
        "the per-block ratios to the reference (all processes pooled), so a slow spell of the (shared) machine hits "
        f"both sides. Peak RSS of a child: {statistics.median(r['maxrss_mb'] for r in runs):.0f} MB. Occupied "
        "buckets of the cumulative iteration-time histogram after each position (process 1): "
        + ", ".join(f"{_positions_label(st, 0).split('-')[0]}: {n}" for st, n in buckets)
        + "."
    )

    cb_spec = {"first": FIRST_BLOCK, "positions": [FIRST_BLOCK], "block": block, "pairs": 1, "reference": False}
    cb_runs = [_run_child("callbacks", cb_spec, tmpdir) for _ in range(state.ARGS.callback_processes)]
    EXTRA["ours_callbacks"] = cb_runs
    _row(
        lib,
        "1 train iteration: training.callbacks.on_training_single_iteration_start(); _end() (default recorder), "
        f"iterations {_positions_label(0, FIRST_BLOCK)} (fresh process)",
        [r["first_ns"] for r in cb_runs],
        FIRST_BLOCK,
        peer,
    )
    _row(
        lib,
        f"same (callbacks), iterations {_positions_label(FIRST_BLOCK, block)}",
        [r["positions"][0]["blocks"][0]["ns"] for r in cb_runs],
        block,
        ref,
    )
    EXTRA["ours_store"] += [_store_verdict(r) for r in cb_runs]

    if state.ARGS.quick or not _torch_available():
        NOTES.append(
            "telemetrain first metrics report without torch loaded: not measured "
            + ("(--quick)." if state.ARGS.quick else "(torch not installed).")
        )
        return
    fr = _run_child("first-report", {"first": 2 * LOG_EVERY}, tmpdir)
    EXTRA["first_report"] = fr
    _row(
        lib,
        f"slowest of the first {2 * LOG_EVERY} iterations (iteration {fr['slowest_iteration']}: the first metrics "
        "report), torch not yet imported (fresh process)",
        [fr["slowest_ns"]],
        1,
        first,
    )
    NOTES.append(
        f"telemetrain first report: in a process that has not imported torch, iteration {fr['slowest_iteration']} "
        f"took {fr['slowest_ns'] / 1e6:.0f} ms (median iteration {fr['median_ns'] / 1e3:.1f} us): the report's MFU "
        "peak lookup (TrainingRecorder.peak -> flops.peak_tflops -> _current_device_name) imports torch on the "
        f"training thread (torch imported by it: {fr['torch_imported_by_report']})."
    )


def _store_verdict(r: dict[str, Any]) -> dict[str, Any]:
    store = r["store"]
    got_updates = store.get("event:training_metrics_update", 0)
    got_spans = store.get("span_end:training_single_iteration", 0)
    got_starts = store.get("span_start:training_single_iteration", 0)
    exp = r["expected"]
    ok = (
        got_updates == exp["training_metrics_update"]
        and got_spans == got_starts == exp["iteration_spans"]
        and r["dropped"] == 0
        and r["failed"] == 0
        and r["errors"] == 0
        and r["closed_ok"]
    )
    return {
        "iterations": r["iterations"],
        "training_metrics_update": [got_updates, exp["training_metrics_update"]],
        "iteration_spans": [got_spans, exp["iteration_spans"]],
        "dropped": r["dropped"],
        "failed": r["failed"],
        "errors": r["errors"],
        "ok": ok,
    }
