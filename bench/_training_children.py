"""bench_training.py's child processes: the entry script re-run with ``--child MODE``, one-logger's and our
iteration loops timed in fixed blocks there, and what each child's run store holds."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from itertools import repeat
from pathlib import Path
from time import perf_counter_ns, thread_time_ns
from typing import TYPE_CHECKING, Any

from _training_harness import _training_config
from _training_state import FLOPS_PER_SAMPLE, GLOBAL_BATCH, LOG_EVERY, SCRIPT

if TYPE_CHECKING:
    from telemetrain import Telemetry
    from telemetrain.training import TrainingRecorder


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
    """Records of a process's run store files by kind and name (a substring scan: a 1M-iteration run writes ~80 MB).
    ``path`` is the store's current file; every segment of its process is read (the writer starts a new segment past
    64 MiB: reading the last one alone missed most of a 1M-iteration run). Each segment's header counts as ``process:``.
    """
    counts: Counter[str] = Counter()
    if path is None or not os.path.exists(path):
        return {}
    from telemetrain.store.segments import process_segments

    path = Path(path)
    files = next((fs for fs in process_segments(path.parent.iterdir()).values() if path in fs), [path])
    for f in files:
        with open(f, "rb") as fh:
            for line in fh:
                kind = line[line.find(b'"kind":"') + 8 :].split(b'"', 1)[0].decode()
                i = line.find(b'"name":"')
                name = line[i + 8 :].split(b'"', 1)[0].decode() if i >= 0 else ""
                counts[f"{kind}:{name}"] += 1
    return dict(counts)
