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
import contextlib
import gc
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import warnings
from collections import Counter, deque
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from itertools import repeat
from pathlib import Path
from time import monotonic_ns, perf_counter_ns, process_time_ns, thread_time_ns
from typing import TYPE_CHECKING, Any

import _method
from _method import NOTES, RESULTS, difference_row, measure, new_row, paired, progress, row_of

if TYPE_CHECKING:
    import torch
    from opentelemetry.sdk.trace import ReadableSpan
    from torch import Tensor

    from telemetrain import Telemetry
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

warnings.filterwarnings("ignore")  # torch's "Failed to initialize NumPy" where numpy is absent

ARGS: argparse.Namespace
EXTRA: dict[str, Any] = {}
DISTS = (
    "telemetrain",
    "nv-one-logger-core",
    "nv-one-logger-training-telemetry",
    "PyYAML",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "torch",
)

GLOBAL_BATCH = 8
LOG_EVERY = 50
FLOPS_PER_SAMPLE = 6.0e9  # "given": any positive number (a 1B-parameter model's 6 x params per token, say)
ONE_LOGGER_LATE = 10_000  # one-logger's second block: iterations 10k-11k
FIRST_BLOCK = 1000  # iterations 0-1k
SCRIPT = Path(__file__).resolve()

ONE_LOGGER_MODULE = "nv_one_logger.training_telemetry.api.training_telemetry_provider"


# -- harness (the peers method: _method.py) --------------------------------------------------------------------------


_record = _method.record_with_peer


def _row(lib: str, op: str, samples: list[float], n: object, peer: dict[str, Any] | None = None) -> dict[str, Any]:
    return _record(new_row(lib, op, samples, n), peer)


def bench(
    lib: str,
    op: str,
    stmt: str,
    names: dict[str, Any] | None = None,
    *,
    peer: dict[str, Any] | None = None,
    between: Callable[[], None] | None = None,
    max_n: int | None = None,
) -> dict[str, Any]:
    """Measure ``stmt``; ``between()`` runs after calibration and after every repeat, outside the timed region."""
    samples, n = measure(stmt, names, between=between, max_n=max_n, collect=ARGS.collect)
    return _row(lib, op, samples, n, peer)


def derived(
    lib: str, op: str, a: dict[str, Any], b: dict[str, Any], *, peer: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Row ``a - b`` (median - median, best - best; repeats: the differences of the paired repeats)."""
    return _record(difference_row(lib, op, a, b), peer)


def _empty() -> None:
    pass


def _require(module: str, what: str) -> None:
    """ImportError (the section is skipped with a note) when ``module`` cannot be imported."""
    try:
        __import__(module)
    except ImportError as exc:
        raise ImportError(f"{what} not installed or not importable: {exc}") from exc


def _torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def _training_config(*, log_every: int = LOG_EVERY, device_name: str | None = None) -> TrainingTelemetryConfig:
    from telemetrain.training import TrainingTelemetryConfig

    return TrainingTelemetryConfig(
        global_batch_size_or_fn=GLOBAL_BATCH,
        perf_tag_or_fn="bench_training",
        log_every_n_train_iterations=log_every,
        flops_per_sample_or_fn=FLOPS_PER_SAMPLE,
        device_name=device_name,
    )


# -- child processes ---------------------------------------------------------------------------------------------------


def _run_child(mode: str, spec: dict[str, Any], tmpdir: str, timeout: float = 600) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix=f"child_{mode}_", dir=tmpdir)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--child", mode, "--child-dir", d, "--child-spec", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=d,  # whatever a library writes to its working directory stays in the temp dir
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {mode} failed (rc {proc.returncode}): {proc.stderr.strip()[-1500:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _child_main(mode: str, spec: dict[str, Any], tmpdir: str) -> dict[str, Any]:
    if mode == "one-logger":
        return _one_logger_child(spec, tmpdir)
    if mode in ("recorder", "callbacks", "first-report"):
        return _ours_child(mode, spec, tmpdir)
    raise ValueError(f"unknown child mode {mode!r}")


def _one_logger_child(spec: dict[str, Any], tmpdir: str) -> dict[str, Any]:
    """nv-one-logger configured as its README shows; blocks of iterations at 0 and at ``late`` of one loop."""
    from nv_one_logger.api.config import LoggerConfig, OneLoggerConfig
    from nv_one_logger.exporter.file_exporter import FileExporter
    from nv_one_logger.training_telemetry.api import callbacks as cb
    from nv_one_logger.training_telemetry.api.config import TrainingTelemetryConfig
    from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider

    export_path = Path(tmpdir) / "training_telemetry.jsonl"
    base_config = OneLoggerConfig(
        application_name="bench_training",
        world_size_or_fn=1,
        session_tag_or_fn="bench_training_session",
        logger_config=LoggerConfig(
            log_level="WARNING",
            log_file_path_for_info=str(Path(tmpdir) / "onelogger.log"),
            log_file_path_for_err=str(Path(tmpdir) / "onelogger.err"),
        ),
    )
    training_config = TrainingTelemetryConfig(
        perf_tag_or_fn="bench_training",
        global_batch_size_or_fn=GLOBAL_BATCH,
        log_every_n_train_iterations=LOG_EVERY,
        flops_per_sample_or_fn=int(FLOPS_PER_SAMPLE),
    )
    (
        TrainingTelemetryProvider.instance()
        .with_base_config(base_config)
        .with_exporter(FileExporter(file_path=export_path))
        .configure_provider()
    )
    cb.on_app_start()
    TrainingTelemetryProvider.instance().set_training_telemetry_config(training_config)
    cb.on_train_start(train_iterations_start=0)
    pair = _pair_timer(cb.on_training_single_iteration_start, cb.on_training_single_iteration_end)
    first, late = spec["first"], spec["late"]
    out: dict[str, Any] = {"blocks": {}, "blocks_wall": {}}
    cpu, wall = pair(first)  # iterations [0, first): first calls, no warm-up on purpose
    out["blocks"]["0"], out["blocks_wall"]["0"] = cpu / first, wall / first
    cpu, _ = pair(late - first)
    out["advance_ns"] = cpu / (late - first)
    cpu, wall = pair(first)
    out["blocks"][str(late)], out["blocks_wall"][str(late)] = cpu / first, wall / first
    cb.on_train_end()
    cb.on_app_end()
    out["export_bytes"] = export_path.stat().st_size if export_path.exists() else 0
    return out


def _new_loop(mode: str, tmpdir: str, name: str, torch_loaded: bool) -> tuple[Any, TrainingRecorder, Telemetry]:
    """A Telemetry with a run store under ``tmpdir`` and a recorder (or the module-level callbacks on the default
    recorder) with an application and a training loop started: returns (api, recorder, telemetry)."""
    import telemetrain
    from telemetrain import training

    t = telemetrain.Telemetry(store=os.path.join(tmpdir, name))  # normal flush_interval (0.2 s) and queue
    # without torch the MFU peak lookup would fail and be recorded as an error: a device name it resolves without torch
    device = None if torch_loaded or mode == "first-report" else "cpu"
    config = _training_config(device_name=device)
    api: Any
    if mode == "callbacks":
        telemetrain.set_telemetry(t)
        recorder = training.configure(config)
        api = training.callbacks
    else:
        recorder = training.TrainingRecorder(config, telemetry=t)
        api = recorder
    api.on_app_start()
    api.on_train_start(0)
    return api, recorder, t


_PAIR_LOOP = """
def timed(n, _cpu=_cpu, _wall=_wall, _repeat=_repeat):
    c0 = _cpu()
    w0 = _wall()
    for _ in _repeat(None, n):
        s(); e()
    w1 = _wall()
    return _cpu() - c0, w1 - w0
"""


def _pair_timer(start: Callable[[], Any], end: Callable[[], Any]) -> Callable[[int], tuple[int, int]]:
    """``timed(n) -> (cpu_ns, wall_ns)`` of n ``start(); end()`` pairs: the calling thread's CPU time (the caller
    side: what the training thread spends; the writer and the reporter work in other threads, as the GPU would let
    them) and the wall time (all-in on this CPU-only machine: their work shares the GIL with the loop)."""
    scope: dict[str, Any] = {"s": start, "e": end, "_cpu": thread_time_ns, "_wall": perf_counter_ns, "_repeat": repeat}
    exec(compile(_PAIR_LOOP, "<bench iteration pair>", "exec"), scope)
    timed: Callable[[int], tuple[int, int]] = scope["timed"]
    return timed


def _iteration_pair(api: Any) -> Callable[[int], tuple[int, int]]:
    return _pair_timer(api.on_training_single_iteration_start, api.on_training_single_iteration_end)


def _finish_loop(api: Any, recorder: TrainingRecorder, t: Telemetry, done: int) -> dict[str, Any]:
    api.on_train_end()
    api.on_app_end()
    ok = t.close(timeout=120)
    health = t.health()
    return {
        "iterations": done,
        "errors": recorder.errors,
        "closed_ok": ok,
        "dropped": health["dropped"],
        "failed": health["failed"],
        "store": _count_store(t.store.path if t.store is not None else None),
        "expected": {
            "training_metrics_update": done // LOG_EVERY + (1 if done % LOG_EVERY else 0),
            "iteration_spans": -(-done // LOG_EVERY),  # the first, then every 50th
        },
    }


def _ours_child(mode: str, spec: dict[str, Any], tmpdir: str) -> dict[str, Any]:
    """One training loop on a TrainingRecorder (or the module-level callbacks): iterations 0-1k timed first; then, at
    each position, ``pairs`` blocks of ``block`` iterations, each interleaved with the same block of a fresh reference
    loop at iterations 1k..1k+block (same process, adjacent in time: a slow spell of the machine hits both); then the
    run store is checked."""
    torch_loaded = False
    if mode != "first-report":
        try:
            import torch  # noqa: F401  (a training process has it loaded: see the module docstring)

            torch_loaded = True
        except ImportError:
            pass
    api, recorder, t = _new_loop(mode, tmpdir, "store", torch_loaded)
    out: dict[str, Any] = {"torch_loaded": torch_loaded, "positions": [], "advances": []}
    if mode == "first-report":  # each of the first iterations timed alone: the first report's cost, torch not loaded
        start, end = api.on_training_single_iteration_start, api.on_training_single_iteration_end
        times = []
        for _ in range(spec["first"]):
            t0 = perf_counter_ns()
            start()
            end()
            times.append(perf_counter_ns() - t0)
        slowest = max(range(len(times)), key=times.__getitem__)
        out.update(
            slowest_iteration=slowest,
            slowest_ns=times[slowest],
            median_ns=statistics.median(times),
            torch_imported_by_report="torch" in sys.modules,
        )
        out.update(_finish_loop(api, recorder, t, len(times)))
        return out
    pair = _iteration_pair(api)
    first, block = spec["first"], spec["block"]
    cpu, wall = pair(first)  # iterations [0, first): first calls, no warm-up
    out["first_ns"], out["first_wall_ns"] = cpu / first, wall / first
    done = first
    refs = 0
    for pos in spec["positions"]:
        if pos > done:
            cpu, _ = pair(pos - done)
            out["advances"].append({"start": done, "n": pos - done, "ns": cpu / (pos - done)})
            done = pos
        blocks = []
        for k in range(spec["pairs"]):
            if not spec["reference"]:
                ns, ref = pair(block)[0] / block, None
            else:
                ref_api, ref_recorder, ref_t = _new_loop(mode, tmpdir, f"ref{refs}", torch_loaded)
                refs += 1
                ref_pair = _iteration_pair(ref_api)
                ref_pair(first)  # the reference loop's iterations 0-1k, untimed
                if k % 2 == 0:
                    ns = pair(block)[0] / block
                    ref = ref_pair(block)[0] / block
                else:
                    ref = ref_pair(block)[0] / block
                    ns = pair(block)[0] / block
                _finish_loop(ref_api, ref_recorder, ref_t, first + block)
            blocks.append({"start": done, "n": block, "ns": ns, "ref_ns": ref})
            done += block
        out["positions"].append({"start": pos, "blocks": blocks, "buckets": _cumulative_buckets(recorder)})
    out.update(_finish_loop(api, recorder, t, done))
    import resource

    out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _cumulative_buckets(recorder: TrainingRecorder) -> int | None:
    """Occupied buckets of the recorder's cumulative iteration-time histogram (internals; None if they change)."""
    try:
        hist = recorder._reporter.cumulative.histogram
        return None if hist is None else len(hist._positive.items()) + len(hist._negative.items())
    except AttributeError:
        return None


def _count_store(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Records of a run store file by kind and name (a substring scan: the file of a 1M-iteration run is ~40 MB)."""
    counts: Counter[str] = Counter()
    if path is None or not os.path.exists(path):
        return {}
    with open(path, "rb") as fh:
        for line in fh:
            kind = line[line.find(b'"kind":"') + 8 :].split(b'"', 1)[0].decode()
            i = line.find(b'"name":"')
            name = line[i + 8 :].split(b'"', 1)[0].decode() if i >= 0 else ""
            counts[f"{kind}:{name}"] += 1
    return dict(counts)


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
    for i in range(ARGS.processes):
        runs.append(_run_child("one-logger", spec, tmpdir))
        progress(f"one-logger process {i + 1}/{ARGS.processes}: {runs[-1]['blocks']}")
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
    block, pairs = ARGS.block, ARGS.block_pairs
    spec = {"first": FIRST_BLOCK, "positions": ARGS.positions, "block": block, "pairs": pairs, "reference": True}
    runs = []
    for i in range(ARGS.processes):
        runs.append(_run_child("recorder", spec, tmpdir))
        r = runs[-1]
        progress(
            f"telemetrain process {i + 1}/{ARGS.processes}: 0-1k: {r['first_ns']:.0f} ns; "
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
    cb_runs = [_run_child("callbacks", cb_spec, tmpdir) for _ in range(ARGS.callback_processes)]
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

    if ARGS.quick or not _torch_available():
        NOTES.append(
            "telemetrain first metrics report without torch loaded: not measured "
            + ("(--quick)." if ARGS.quick else "(torch not installed).")
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


# -- 2. spans -----------------------------------------------------------------------------------------------------


class _SpanStore:
    """The default Telemetry for the span rows: a caller-side one (writer asleep) and one with the writer awake."""

    def __init__(self, tmpdir: str) -> None:
        import telemetrain

        self.caller = telemetrain.Telemetry(
            store=os.path.join(tmpdir, "spans_caller"), flush_interval=3600.0, queue_capacity=4_010_000
        )
        self.awake = telemetrain.Telemetry(store=os.path.join(tmpdir, "spans_awake"), queue_capacity=4_010_000)
        self.previous = telemetrain.set_telemetry(self.caller)

    def flush(self) -> None:
        for t in (self.caller, self.awake):
            t.flush(120)

    def close(self) -> dict[str, Any]:
        import telemetrain

        if self.previous is not None:
            telemetrain.set_telemetry(self.previous)
        out = {}
        for label, t in (("caller side", self.caller), ("writer awake", self.awake)):
            ok = t.close(120)
            health = t.health()
            store = _count_store(t.store.path if t.store is not None else None)
            starts = sum(v for k, v in store.items() if k.startswith("span_start:"))
            ends = sum(v for k, v in store.items() if k.startswith("span_end:"))
            out[label] = {
                "span_starts": starts,
                "span_ends": ends,
                "dropped": health["dropped"],
                "failed": health["failed"],
                "ok": ok and starts == ends and starts > 0 and not health["dropped"] and not health["failed"],
            }
        return out


_STORES: list[_SpanStore] = []


def section_spans(tmpdir: str) -> None:
    import telemetrain
    from telemetrain.spans import span

    stores = _SpanStore(tmpdir)
    _STORES.append(stores)
    lib = "telemetrain"
    names = {"span": span}
    root = bench(
        lib,
        '`with span("it"): pass`, root span -> async JSONL (caller side)',
        'with span("it"): pass',
        names,
        between=stores.flush,
    )
    parent = span("parent")
    parent.__enter__()
    try:
        child = bench(
            lib,
            '`with span("it"): pass` inside an open `span("parent")`, child span -> async JSONL (caller side)',
            'with span("it"): pass',
            names,
            between=stores.flush,
        )
    finally:
        parent.__exit__(None, None, None)
    telemetrain.set_telemetry(stores.awake)
    try:
        bench(
            lib,
            '`with span("it"): pass`, root span -> async JSONL, writer awake (normal flush_interval: all-in)',
            'with span("it"): pass',
            names,
            between=stores.flush,
            peer=root,
        )
    finally:
        telemetrain.set_telemetry(stores.caller)
    EXTRA["span_rows"] = {"root": root["median_ns"], "child": child["median_ns"]}
    NOTES.append(
        "telemetrain spans: the default Telemetry is set (set_telemetry) to one whose writer sleeps during a repeat "
        "(flush_interval 3600 s, queue_capacity 4,010,000; flush() between repeats, outside the timed region), as "
        "bench_core.py's caller-side rows; the 'writer awake' row uses the normal 0.2 s flush_interval, so the "
        "writer's JSON encoding of the two records a span writes shares the GIL with the loop. Every span is "
        "exported (no sampling)."
    )


def section_otel_spans(tmpdir: str) -> None:
    _require("opentelemetry.sdk.trace", "opentelemetry-sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from telemetrain.spans import span

    class NoopExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    stores = _STORES[0] if _STORES else None
    flush = stores.flush if stores is not None else None
    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(NoopExporter()))
    tr = tp.get_tracer("bench_training")
    lib = "opentelemetry-sdk"
    stmt = 'with t.start_as_current_span("it"): pass'
    try:
        o_root = bench(
            lib,
            '`with tracer.start_as_current_span("it"): pass`, root, BatchSpanProcessor(no-op exporter)',
            stmt,
            {"t": tr},
        )
        with tr.start_as_current_span("parent"):
            o_child = bench(
                lib,
                '`with tracer.start_as_current_span("it"): pass` inside an open parent span, BatchSpanProcessor(no-op '
                "exporter)",
                stmt,
                {"t": tr},
            )
        for ours_op, peer in (
            ('`with span("it"): pass`, root span', o_root),
            ('`with span("it"): pass` inside an open `span("parent")`', o_child),
        ):
            r = row_of("telemetrain", ours_op)
            if r is not None:
                r["peer"] = f"{peer['library']} | {peer['operation']}"
                r["peer_median_ns"] = peer["median_ns"]
                r["ratio"] = r["median_ns"] / peer["median_ns"]
        if stores is not None:
            paired(
                "paired",
                'telemetrain `with span("it"): pass` root, interleaved with OTel\'s root span',
                'with span("it"): pass',
                {"span": span},
                o_root,
                stmt,
                {"t": tr},
                between=flush,
                collect=ARGS.collect,
            )
            with tr.start_as_current_span("parent"):
                parent = span("parent")
                parent.__enter__()
                try:
                    paired(
                        "paired",
                        'telemetrain `with span("it"): pass` child, interleaved with OTel\'s child span',
                        'with span("it"): pass',
                        {"span": span},
                        o_child,
                        stmt,
                        {"t": tr},
                        between=flush,
                        collect=ARGS.collect,
                    )
                finally:
                    parent.__exit__(None, None, None)
    finally:
        tp.shutdown()  # stops the processor's worker thread before the later sections
    NOTES.append(
        "OpenTelemetry SDK: a TracerProvider used directly (never set globally) with a BatchSpanProcessor whose "
        "exporter does nothing; shut down after its rows."
    )


# -- 3. a small training run ----------------------------------------------------------------------------------------


class _Trainer:
    """An MLP on synthetic data generated in-process; the same work with and without telemetry."""

    def __init__(self, tmpdir: str, steps: int, every: int, val_iters: int) -> None:
        import torch

        torch.set_num_threads(1)
        self.torch = torch
        self.steps, self.every, self.val_iters = steps, every, val_iters
        self.hidden, self.batch, self.classes = 768, 64, 10
        self.ckpt = os.path.join(tmpdir, "checkpoint.pt")
        self.tmpdir = tmpdir
        nparams = 2 * (self.hidden * self.hidden + self.hidden) + self.hidden * self.classes + self.classes
        self.flops_per_sample = 6.0 * nparams

    def _model(self) -> torch.nn.Sequential:
        nn = self.torch.nn
        self.torch.manual_seed(0)
        h = self.hidden
        model: torch.nn.Sequential = nn.Sequential(
            nn.Linear(h, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, self.classes)
        )
        return model

    def _data(self) -> Callable[[], tuple[Tensor, Tensor]]:
        g = self.torch.Generator().manual_seed(1)
        torch = self.torch

        def next_batch() -> tuple[Tensor, Tensor]:
            return torch.randn(self.batch, self.hidden, generator=g), torch.randint(
                0, self.classes, (self.batch,), generator=g
            )

        return next_batch

    def plain(self, steps: int | None = None) -> None:
        torch = self.torch
        steps = steps or self.steps
        model = self._model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        next_batch = self._data()
        loss_fn = torch.nn.CrossEntropyLoss()
        val = [next_batch() for _ in range(self.val_iters)]
        for step in range(steps):
            x, y = next_batch()
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if (step + 1) % self.every == 0:
                model.eval()
                with torch.no_grad():
                    for vx, vy in val:
                        loss_fn(model(vx), vy)
                model.train()
                torch.save(model.state_dict(), self.ckpt)

    def telemetry(
        self, run: int, steps: int | None = None, *, calls_only: bool = False
    ) -> tuple[Callable[[], None], Callable[[], dict[str, Any]]]:
        """Build a fresh Telemetry + TrainingRecorder (outside the timed region); returns (the timed run, closer).
        ``calls_only``: the same telemetry calls around empty bodies (no torch work): telemetry's own cost."""
        import telemetrain
        from telemetrain.training import TrainingContexts, TrainingRecorder, TrainingTelemetryConfig

        t = telemetrain.Telemetry(store=os.path.join(self.tmpdir, f"train_store_{run}"))
        config = TrainingTelemetryConfig(
            global_batch_size_or_fn=self.batch,
            perf_tag_or_fn="bench_training_mlp",
            log_every_n_train_iterations=LOG_EVERY,
            flops_per_sample_or_fn=self.flops_per_sample,
            train_iterations_target_or_fn=steps or self.steps,
        )
        recorder = TrainingRecorder(config, telemetry=t)
        tm = TrainingContexts(lambda: recorder)
        torch = self.torch
        steps = steps or self.steps

        def calls_only_run() -> None:
            with tm.application():
                with tm.model_init():
                    pass
                with tm.optimizer_init():
                    pass
                with tm.dataloader_init():
                    pass
                with tm.training_loop(0):
                    for step in range(steps):
                        with tm.training_iteration():
                            with tm.data_loading():
                                pass
                            with tm.forward():
                                pass
                            with tm.zero_grad():
                                pass
                            with tm.backward():
                                pass
                            with tm.optimizer_update():
                                pass
                        if (step + 1) % self.every == 0:
                            with tm.validation_loop():
                                for _ in range(self.val_iters):
                                    with tm.validation_iteration():
                                        pass
                            with tm.checkpoint_save(step + 1, path=self.ckpt):
                                pass

        def run_it() -> None:
            with tm.application():
                with tm.model_init():
                    model = self._model()
                with tm.optimizer_init():
                    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
                with tm.dataloader_init():
                    next_batch = self._data()
                    val = [next_batch() for _ in range(self.val_iters)]
                loss_fn = torch.nn.CrossEntropyLoss()
                with tm.training_loop(0):
                    for step in range(steps):
                        with tm.training_iteration():
                            with tm.data_loading():
                                x, y = next_batch()
                            with tm.forward():
                                loss = loss_fn(model(x), y)
                            with tm.zero_grad():
                                optimizer.zero_grad(set_to_none=True)
                            with tm.backward():
                                loss.backward()
                            with tm.optimizer_update():
                                optimizer.step()
                        if (step + 1) % self.every == 0:
                            model.eval()
                            with tm.validation_loop(), torch.no_grad():
                                for vx, vy in val:
                                    with tm.validation_iteration():
                                        loss_fn(model(vx), vy)
                            model.train()
                            with tm.checkpoint_save(step + 1, path=self.ckpt):
                                torch.save(model.state_dict(), self.ckpt)

        def close() -> dict[str, Any]:
            ok = t.close(60)
            if run < 0:  # warm-up and calls-only runs: not checked
                return {"ok": ok}
            health = t.health()
            store = _count_store(t.store.path if t.store is not None else None)
            checks = steps // self.every
            expected = {
                "event:training_metrics_update": steps // LOG_EVERY + (1 if steps % LOG_EVERY else 0),
                "event:validation_metrics_update": checks,
                "event:save_checkpoint_success": checks,
                "span_end:checkpoint_save_sync": checks,
                "span_end:training_loop": 1,
                "span_end:application": 1,
            }
            got = {k: store.get(k, 0) for k in expected}
            return {
                "expected": expected,
                "got": got,
                "errors": recorder.errors,
                "dropped": health["dropped"],
                "failed": health["failed"],
                "ok": ok and got == expected and not recorder.errors and not health["dropped"] and not health["failed"],
            }

        return (calls_only_run if calls_only else run_it), close


def section_training(tmpdir: str) -> None:
    _require("torch", "torch")
    tr = _Trainer(tmpdir, ARGS.train_steps, ARGS.train_every, ARGS.val_iters)
    # warm-up: one short run of each variant (first calls, allocator, file cache)
    tr.plain(ARGS.train_every)
    run_it, close = tr.telemetry(-1, ARGS.train_every)
    run_it()
    close()
    orders = (("P", "T", "Q"), ("T", "Q", "P"), ("Q", "P", "T"))  # each variant in each place equally often
    runs: dict[str, list[int]] = {"P": [], "T": [], "Q": []}
    cpu: dict[str, list[int]] = {"P": [], "T": [], "Q": []}
    ratios, cpu_ratios, controls, stores = [], [], [], []
    for k in range(ARGS.train_pairs):
        run_it, close = tr.telemetry(k)
        order = orders[k % 3]
        for variant in order:
            if ARGS.collect:
                gc.collect()
            c0 = process_time_ns()
            t0 = perf_counter_ns()
            if variant == "T":
                run_it()
            else:
                tr.plain()
            runs[variant].append(perf_counter_ns() - t0)
            cpu[variant].append(process_time_ns() - c0)
        stores.append(close())
        p, t, q = runs["P"][-1], runs["T"][-1], runs["Q"][-1]
        ratios.append(2 * t / (p + q))
        cpu_ratios.append(2 * cpu["T"][-1] / (cpu["P"][-1] + cpu["Q"][-1]))
        controls.append(q / p)
        progress(
            f"training round {k + 1}/{ARGS.train_pairs} ({''.join(order)}): plain {p / 1e9:.3f} s / {q / 1e9:.3f} s, "
            f"telemetry {t / 1e9:.3f} s: ratio {ratios[-1]:.4f} (CPU time {cpu_ratios[-1]:.4f}), "
            f"control Q/P {controls[-1]:.4f}"
        )
    calls = []
    for k in range(ARGS.repeats):
        run_calls, close = tr.telemetry(-2 - k, calls_only=True)
        if ARGS.collect:
            gc.collect()
        t0 = perf_counter_ns()
        run_calls()
        calls.append((perf_counter_ns() - t0) / tr.steps)
        close()
    lib = "training run"
    what = (
        f"MLP 768-768-768-10, batch {tr.batch}, {tr.steps} steps, validation ({tr.val_iters} iterations) + "
        f"checkpoint every {tr.every}"
    )
    steps = tr.steps
    plain_all = [x / steps for x in runs["P"] + runs["Q"]]
    p_row = _row(lib, f"{what}: no telemetry, ns per step (incl. validation and checkpoints)", plain_all, steps)
    t_row = _row(lib, f"{what}: full lifecycle telemetry, ns per step", [x / steps for x in runs["T"]], steps, p_row)
    t_row["ratio"] = statistics.median(ratios)
    t_row["pair_ratios"] = ratios
    derived_row = new_row(
        lib, "telemetry overhead per step (median - median)", [t_row["median_ns"] - p_row["median_ns"]], "-"
    )
    _record(derived_row, None)
    c_row = _row(
        lib,
        "control: no telemetry vs no telemetry (Q/P, the same rounds), ns per step",
        [x / steps for x in runs["Q"]],
        steps,
        p_row,
    )
    c_row["ratio"] = statistics.median(controls)
    c_row["pair_ratios"] = controls
    calls_row = _row(
        lib, "the same telemetry calls around empty bodies (no torch work), ns per step", calls, steps, p_row
    )
    EXTRA["training_calls_only_fraction"] = calls_row["ratio"]
    spread = sorted(abs(c - 1.0) for c in controls)
    EXTRA["training"] = {
        "rounds": [
            {
                "order": "".join(orders[k % 3]),
                "P_ns": runs["P"][k],
                "T_ns": runs["T"][k],
                "Q_ns": runs["Q"][k],
                "ratio": ratios[k],
                "cpu_ratio": cpu_ratios[k],
                "control": controls[k],
            }
            for k in range(ARGS.train_pairs)
        ],
        "median_ratio": statistics.median(ratios),
        "median_cpu_ratio": statistics.median(cpu_ratios),
        "median_control": statistics.median(controls),
        "control_abs_dev_median": statistics.median(spread),
        "calls_only_fraction": calls_row["ratio"],
        "stores": stores,
        "steps": steps,
        "torch_threads": tr.torch.get_num_threads(),
    }
    NOTES.append(
        f"training run: torch.set_num_threads(1); {ARGS.train_pairs} rounds of three runs -- plain (P), with telemetry "
        "(T), plain again (Q) -- in rotating order (PTQ, TQP, QPT), "
        f"{'gc.collect() before each run' if ARGS.collect else 'no gc.collect() (--quick)'}, one short warm-up run "
        "of each variant first; a run is timed from model construction to the end of the application span "
        "(on_app_end flushes the store); the Telemetry and recorder are built before and closed after the timed "
        "region. Telemetry row: ratio = median over rounds of T / mean(P, Q): "
        + ", ".join(f"{r:.4f}" for r in ratios)
        + f". Control row (the noise floor of this method on this machine): median of Q/P "
        f"{statistics.median(controls):.4f}, per round "
        + ", ".join(f"{r:.4f}" for r in controls)
        + f". Process CPU time (all threads, the store's writer included), median of T / mean(P, Q): "
        f"{statistics.median(cpu_ratios):.4f}. The telemetry calls alone (same spans, events and reports around empty "
        f"bodies) cost {calls_row['median_ns'] / 1e3:.1f} us a step = {calls_row['ratio']:.2%} of a plain step: the "
        "direct cost, well below what the paired wall-time ratio resolves here."
    )


# -- pieces: where the time goes ------------------------------------------------------------------------------------


class _ItPieces:
    def __init__(self, tmpdir: str, log_every: int) -> None:
        import telemetrain
        from telemetrain.training import TrainingRecorder

        self.t = telemetrain.Telemetry(store=os.path.join(tmpdir, f"pieces_{log_every}"))
        device = None if "torch" in sys.modules else "cpu"
        self.r = TrainingRecorder(_training_config(log_every=log_every, device_name=device), telemetry=self.t)
        self.r.on_app_start()
        self.r.on_train_start(0)
        s, e = self.r.on_training_single_iteration_start, self.r.on_training_single_iteration_end
        for _ in range(3000):  # past the first reports: steady state
            s()
            e()

    def close(self) -> None:
        self.r.on_train_end()
        self.r.on_app_end()
        self.t.close(60)


def section_pieces(tmpdir: str) -> None:
    import cProfile
    import pstats

    from telemetrain.spans import tracer

    lib = "pieces"
    # -- the iteration (the training thread's CPU time, as the iteration rows)
    with_reports = _ItPieces(tmpdir, LOG_EVERY)
    without = _ItPieces(tmpdir, 10**9)
    try:
        def cpu_row(op: str, r: Any) -> dict[str, Any]:
            timer = _pair_timer(r.on_training_single_iteration_start, r.on_training_single_iteration_end)
            n = 50_000
            timer(2000)
            samples = []
            for _ in range(ARGS.repeats):
                gc.collect()
                samples.append(timer(n)[0] / n)
            return _row(lib, op, samples, n)

        full = cpu_row(f"recorder iteration, steady state (after 3k iterations), N={LOG_EVERY}, training thread CPU",
                       with_reports.r)
        bare = cpu_row("recorder iteration, log_every_n_train_iterations=10**9 (no metrics report), training thread "
                       "CPU", without.r)
        capture = derived(lib, f"report capture amortised per iteration (N={LOG_EVERY} - no report)", full, bare)
        # the report computed (in the collector thread normally): here in this thread, on captured snapshots
        reporter = with_reports.r._reporter  # internals: the recorder's Reporter
        reporter.drain()
        queued: list[Any] = []
        submit = reporter.submit
        # capture only, compute below (assignment: list.append's parameter is positional-only, submit's is not)
        reporter.submit = queued.append  # type: ignore[method-assign, assignment]
        try:
            s, e = with_reports.r.on_training_single_iteration_start, with_reports.r.on_training_single_iteration_end
            for _ in range(LOG_EVERY * 200):
                s()
                e()
        finally:
            reporter.submit = submit  # type: ignore[method-assign]
        reports = [q for q in queued if not hasattr(q, "chunks")]
        reporter._pending.extend(queued)
        t0 = thread_time_ns()
        reporter.drain()
        per_report = (thread_time_ns() - t0) / max(len(reports), 1)
        _row(lib, f"one metrics report computed and emitted (the collector thread's work, every {LOG_EVERY} "
             "iterations)", [per_report], len(reports))
        # calls per iteration (cProfile), no report
        s, e = without.r.on_training_single_iteration_start, without.r.on_training_single_iteration_end
        prof = cProfile.Profile()
        n = 2000
        prof.enable()
        for _ in range(n):
            s()
            e()
        prof.disable()
        st = pstats.Stats(prof)
        calls = st.total_calls / n  # type: ignore[attr-defined]
        NOTES.append(
            f"pieces, iteration: {calls:.0f} Python-level calls per no-report iteration (cProfile); the training "
            f"thread's share of a metrics report (the capture) ~{capture['median_ns'] * LOG_EVERY / 1e3:.0f} us, "
            f"the collector thread's ~{per_report / 1e3:.0f} us (every {LOG_EVERY} iterations)."
        )
        EXTRA["pieces"] = {
            "calls_per_iteration": calls,
            "capture_us": capture["median_ns"] * LOG_EVERY / 1e3,
            "report_us": per_report / 1e3,
        }
    finally:
        with_reports.close()
        without.close()

    # -- the span
    stores = _STORES[0] if _STORES else None
    if stores is None:
        return
    t = stores.caller
    tr = tracer(t)
    flush = stores.flush
    with_tracer = bench(
        lib,
        '`with tr.span("it"): pass` (tracer looked up once, outside the loop)',
        'with tr.span("it"): pass',
        {"tr": tr},
        between=flush,
    )
    bench(
        lib,
        "`tracer(None)` (the lookup span() does per span: get_telemetry() + extensions.get)",
        "tracer(None)",
        {"tracer": tracer},
    )
    build = bench(lib, '`tr.span("it")` (builds the Span, not entered)', 'tr.span("it")', {"tr": tr})
    derived(lib, "enter + exit of a built span = with tr.span - build", with_tracer, build)
    bench(lib, "`clock()` (time.monotonic_ns, read twice per span)", "clock()", {"clock": monotonic_ns})
    cv: ContextVar[object] = ContextVar("bench_cv", default=None)
    bench(
        lib,
        "`cv.reset(cv.set(x))` (ContextVar set + reset, once per span)",
        "reset(set_(x))",
        {"reset": cv.reset, "set_": cv.set, "x": 1},
    )
    q: deque[tuple[Any, ...]] = deque()
    bench(
        lib,
        "`q.append((kind, t, tok, group, name, sid, pid, tid))` (one packed record; a short span writes one)",
        "q.append((k, a, b, g, nm, c, d, e))",
        {"q": q, "k": "span_start", "a": 1, "b": 2, "g": "spans", "nm": "it", "c": 3, "d": 0, "e": 4},
        between=q.clear,
    )


# -- checks and output ----------------------------------------------------------------------------------------------


def checks() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def ratio_check(cid: str, title: str, row: dict[str, Any] | None, limit: float, text_extra: str = "") -> None:
        if row is None or row.get("ratio") is None:
            out.append({"id": cid, "title": title, "status": "SKIP", "text": "not measured"})
            return
        ratio = row["ratio"]
        out.append(
            {
                "id": cid,
                "title": title,
                "status": "PASS" if ratio <= limit else "FAIL",
                "ours_ns": row["median_ns"],
                "peer_ns": row["peer_median_ns"],
                "ratio": ratio,
                "limit": limit,
                "text": f"{row['median_ns']:,.1f} ns vs {row['peer_median_ns']:,.1f} ns = {ratio:.4f}x "
                f"(1/{1 / ratio:.1f}; limit {limit:.4f}x = 1/{1 / limit:.0f}){text_extra}",
            }
        )

    # 1a: an iteration, 0-1k, against one-logger's
    first = row_of("telemetrain", "1 train iteration: TrainingRecorder")
    ratio_check("1a", "iteration 0-1k <= 1/40 of one-logger's", first, 1 / 40)
    ol_late = row_of("nv-one-logger", f"same, iterations {ONE_LOGGER_LATE // 1000}k")
    if ol_late is not None:
        out.append(
            {
                "id": "1c",
                "title": "one-logger's growth: iterations 10k-11k vs 0-1k (information)",
                "status": "INFO",
                "ratio": ol_late["ratio"],
                "text": f"{ol_late['median_ns'] / 1e3:.1f} us vs {ol_late['peer_median_ns'] / 1e3:.1f} us = "
                f"{ol_late['ratio']:.2f}x",
            }
        )
    # 1b: flatness from 1k to 1M: each position's cost within +-10% of a fresh loop's at 1k (interleaved ratios)
    flat = [r for r in RESULTS if r["library"] == "telemetrain" and "position" in r]
    if flat:
        devs = [(r, r["ratio"] - 1.0) for r in flat]
        worst = max(abs(d) for _, d in devs)
        out.append(
            {
                "id": "1b",
                "title": "iteration cost flat from 1k to the last block (each position within +-10% of iterations "
                f"{_positions_label(FIRST_BLOCK, ARGS.block)}, interleaved)",
                "status": "PASS" if worst <= 0.10 else "FAIL",
                "worst_deviation": worst,
                "ratios": [r["ratio"] for r in flat],
                "blocks_ns": [r["median_ns"] for r in flat],
                "text": "; ".join(
                    f"{_positions_label(r['position'], 0).split('-')[0]}: {r['median_ns']:,.0f} ns, "
                    f"{r['ratio']:.3f}x ({d:+.1%})"
                    for r, d in devs
                ),
            }
        )
        later = [r for r in flat if r["position"] >= 10 * FIRST_BLOCK]
        if len(later) >= 2:
            base = later[0]["ratio"]
            devs10 = [(r, r["ratio"] / base - 1.0) for r in later[1:]]
            out.append(
                {
                    "id": "1d",
                    "title": f"iteration cost from {_positions_label(later[0]['position'], 0).split('-')[0]} on, "
                    "against the same reference (information)",
                    "status": "INFO",
                    "worst_deviation": max(abs(d) for _, d in devs10),
                    "text": "; ".join(
                        f"{_positions_label(r['position'], 0).split('-')[0]}: {d:+.1%}" for r, d in devs10
                    ),
                }
            )
    else:
        out.append({"id": "1b", "title": "iteration cost flat", "status": "SKIP", "text": "not measured"})
    # 2: spans against OTel
    ratio_check(
        "2a",
        "root span <= 1/15 of OTel's",
        row_of("telemetrain", '`with span("it"): pass`, root span'),
        1 / 15,
        _paired_text("root"),
    )
    ratio_check(
        "2b",
        "child span <= 1/15 of OTel's",
        row_of("telemetrain", '`with span("it"): pass` inside an open'),
        1 / 15,
        _paired_text("child"),
    )
    # 3: training run
    tel = next((r for r in RESULTS if r["library"] == "training run" and "full lifecycle" in r["operation"]), None)
    if tel is None:
        out.append({"id": "3", "title": "training run <= 1.01x", "status": "SKIP", "text": "not measured"})
    else:
        ratio = tel["ratio"]
        tr = EXTRA["training"]
        out.append(
            {
                "id": "3",
                "title": "training run with full lifecycle telemetry <= 1.01x without",
                "status": "PASS" if ratio <= 1.01 else "FAIL",
                "ratio": ratio,
                "cpu_ratio": tr["median_cpu_ratio"],
                "control": tr["median_control"],
                "calls_only_fraction": tr["calls_only_fraction"],
                "text": f"median over {len(tel['pair_ratios'])} rounds of T / mean(P, Q) = {ratio:.4f}x (rounds "
                f"{min(tel['pair_ratios']):.4f}-{max(tel['pair_ratios']):.4f}); plain step "
                f"{tel['peer_median_ns'] / 1e6:.3f} ms, with telemetry {tel['median_ns'] / 1e6:.3f} ms; process CPU "
                f"time ratio {tr['median_cpu_ratio']:.4f}x; control Q/P {tr['median_control']:.4f}x (median "
                f"|Q/P - 1| {tr['control_abs_dev_median']:.2%}: the method's resolution here); the telemetry calls "
                f"alone cost {tr['calls_only_fraction']:.2%} of a plain step",
            }
        )
    # 4: the run stores
    verdicts = []
    for v in EXTRA.get("ours_store", []):
        verdicts.append(("iteration child", v["ok"], v))
    for label, v in (EXTRA.get("span_store") or {}).items():
        verdicts.append((f"spans {label}", v["ok"], v))
    for v in (EXTRA.get("training") or {}).get("stores", []):
        verdicts.append(("training run", v["ok"], v))
    if verdicts:
        bad = [f"{label}: {v}" for label, ok, v in verdicts if not ok]
        out.append(
            {
                "id": "4",
                "title": "run stores complete (every report/span written, nothing dropped, no misuse)",
                "status": "FAIL" if bad else "PASS",
                "text": f"{len(verdicts) - len(bad)}/{len(verdicts)} stores complete"
                + (f"; incomplete: {'; '.join(bad)[:1500]}" if bad else ""),
            }
        )
    else:
        out.append({"id": "4", "title": "run stores complete", "status": "SKIP", "text": "not measured"})
    return out


def _paired_text(which: str) -> str:
    p = row_of("paired", f'telemetrain `with span("it"): pass` {which}')
    return "" if p is None else f"; paired: {p['ratio']:.4f}x (1/{1 / p['ratio']:.1f})"


def render_table() -> str:
    def cells(r: dict[str, Any]) -> list[str]:
        ratio = "" if r.get("ratio") is None else f"{r['ratio']:.4f}x"
        return [ratio, "" if r.get("peer") is None else r["peer"].replace("|", "\\|")]

    return _method.render_table([("ratio to peer", "---:"), ("peer", "---")], cells)


TARGETS = {
    "1a": "iteration 0-1k <= 1/40 of nv-one-logger's",
    "1b": "iteration cost flat (+-10%) from 1k to 1M iterations",
    "2": "span enter+exit <= 1/15 of OpenTelemetry SDK's (root and child)",
    "3": "training run with full lifecycle telemetry <= 1.01x without",
    "4": "run stores complete",
}


def main(argv: list[str] | None = None) -> int:
    global ARGS
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
    ARGS = _method.parse_args(ap, argv)
    if ARGS.child:
        print(json.dumps(_child_main(ARGS.child, json.loads(ARGS.child_spec), ARGS.child_dir)))
        return 0
    ARGS.collect = not ARGS.quick
    ARGS.processes = ARGS.callback_processes = ARGS.repeats
    if ARGS.quick:
        ARGS.repeats, ARGS.target_ms, ARGS.min_n, ARGS.max_n, ARGS.warmup_s = 2, 15.0, 500, 100_000, 0.1
        ARGS.block, ARGS.block_pairs, ARGS.positions = 1000, 2, [1000, 10_000, 20_000]
        ARGS.train_steps, ARGS.train_every, ARGS.val_iters, ARGS.train_pairs = 30, 15, 4, 2
        ARGS.processes = ARGS.callback_processes = 1  # one child process of each kind

    tmpdir = tempfile.mkdtemp(prefix="bench_training_")
    load_before = _method.loadavg()
    _method.spin(ARGS.warmup_s)
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
        failed = _method.run_sections(sections, lambda name: name not in optional, ARGS.only)
        for stores in _STORES:
            EXTRA["span_store"] = stores.close()
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    load_after = _method.loadavg()
    results_checks = checks()

    _method.print_header(DISTS, load_before, load_after)
    collect = "gc.collect() before each repeat" if ARGS.collect else "no gc.collect() between repeats (--quick)"
    print(
        f"method: median and best of {ARGS.repeats} repeats (in-process rows: n calibrated to ~{ARGS.target_ms:.0f} "
        f"ms per repeat, n in [{ARGS.min_n:,}, {ARGS.max_n:,}]; per-position rows: {ARGS.processes} child "
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
    _method.write_run_json(ARGS.json, DISTS, (load_before, load_after), ARGS, EXTRA, results_checks)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    sys.exit(main())
