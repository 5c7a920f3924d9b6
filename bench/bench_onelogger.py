#!/usr/bin/env python3
"""nv-one-logger's training API run by nv-one-logger 2.3.1 itself and by telemetrain (the same program, imports
changed), side by side: the training thread's CPU time per iteration (``on_training_single_iteration_start(); _end()``,
``time.thread_time_ns``) with a ``FileExporter`` as one-logger's README configures it (global batch 8, metrics every 50
iterations, FLOPs per sample given, throughput logging on), at iterations 0-1k and 20k-21k (one-logger's cost grows
with the loop's length). Also telemetrain's one-logger path with every iteration span exported (the default blacklist
overridden: two exporter calls an iteration, each handed to the exporter's delivery thread) with the default delivery
wait and with ``with_delivery_wait(0)``, and telemetrain's native callbacks (no provider) for reference.

Each row is a fresh child process per repeat (one-logger is a process singleton); median and best over ``--repeats``.
The exporters write to a temporary directory. Rows whose library is not installed are skipped with a note.

Usage:
    python bench/bench_onelogger.py              # ~1-2 min
    python bench/bench_onelogger.py --quick      # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

FIRST, LATE = (0, 1000), (20_000, 21_000)

CHILD = r'''
import json, os, sys, tempfile, time
from pathlib import Path
kind, late_from, late_to, first_to = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
out = Path(tempfile.mkdtemp()) / "telemetry.json"
if kind == "one-logger":
    P = "nv_one_logger."
    from nv_one_logger.api.config import OneLoggerConfig
    from nv_one_logger.exporter.file_exporter import FileExporter
    from nv_one_logger.training_telemetry.api.config import TrainingTelemetryConfig
    from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider
    from nv_one_logger.training_telemetry.api import callbacks as cb
else:
    import telemetrain
    telemetrain.set_telemetry(telemetrain.Telemetry(store=out.parent / "store"))
    from telemetrain.training.one_logger_config import OneLoggerConfig
    from telemetrain.training.exporters import FileExporter
    from telemetrain.training.config import TrainingTelemetryConfig
    from telemetrain.training.training_telemetry_provider import TrainingTelemetryProvider
    from telemetrain.training.default_recorder import ExportCustomizationMode
    from telemetrain.training import callbacks as cb
config = TrainingTelemetryConfig(perf_tag_or_fn="bench", global_batch_size_or_fn=8, log_every_n_train_iterations=50,
                                 flops_per_sample_or_fn=6_000_000_000, is_log_throughput_enabled_or_fn=True,
                                 train_iterations_target_or_fn=10**7, train_samples_target_or_fn=8 * 10**7)
if kind == "native":
    from telemetrain import training
    training.configure(config)
else:
    p = TrainingTelemetryProvider.instance().with_base_config(OneLoggerConfig(
        application_name="bench", world_size_or_fn=1, session_tag_or_fn="bench", telemetry_config=config))
    p.with_exporter(FileExporter(file_path=out))
    if kind.startswith("telemetrain-all"):
        p.with_export_customization(ExportCustomizationMode.EXPORT_ALL_SPANS, None)
    if kind == "telemetrain-all-nowait":
        p.with_delivery_wait(0)
    p.configure_provider()
cb.on_app_start()
cb.on_train_start(train_iterations_start=0)
s, e = cb.on_training_single_iteration_start, cb.on_training_single_iteration_end
def block(n):
    t0 = time.thread_time_ns()
    for _ in range(n):
        s(); e()
    return (time.thread_time_ns() - t0) / n
first = block(first_to)
for _ in range(late_from - first_to):
    s(); e()
late = block(late_to - late_from)
cb.on_train_end(); cb.on_app_end()
print(json.dumps({"first": first, "late": late}))
'''

KINDS = [
    ("one-logger", "nv-one-logger 2.3.1 (its README's setup, FileExporter)"),
    ("telemetrain", "telemetrain, the same program (imports changed)"),
    ("telemetrain-all", "telemetrain, every iteration span exported (2 exporter calls an iteration)"),
    ("telemetrain-all-nowait", "same, with_delivery_wait(0): the training thread never waits"),
    ("native", "telemetrain's own callbacks, no provider (reference)"),
]


def run(kind: str, first: tuple[int, int], late: tuple[int, int], src: str | None) -> dict[str, float] | None:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as cwd:  # one-logger writes onelogger.log/.err into the working directory
        proc = subprocess.run([sys.executable, "-c", CHILD, kind, str(late[0]), str(late[1]), str(first[1])],
                              env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        print(f"  {kind}: failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--src", help="PYTHONPATH entry for telemetrain (default: the installed/importable one)")
    args = ap.parse_args()
    first, late = ((0, 200), (2000, 2200)) if args.quick else (FIRST, LATE)
    repeats = 1 if args.quick else args.repeats
    rows: dict[str, dict[str, list[float]]] = {}
    for rep in range(repeats):
        for kind, _ in KINDS:
            print(f"repeat {rep + 1}/{repeats}: {kind}", file=sys.stderr)
            result = run(kind, first, late, args.src)
            if result is not None:
                for key, value in result.items():
                    rows.setdefault(kind, {}).setdefault(key, []).append(value)
    print(f"| library | iteration (start + end), training-thread CPU ns | {first[0]}-{first[1]} median | best | "
          f"{late[0]}-{late[1]} median | best | ratio to one-logger ({late[0]}-{late[1]}) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    reference = statistics.median(rows["one-logger"]["late"]) if "one-logger" in rows else None
    for kind, label in KINDS:
        if kind not in rows:
            print(f"| {kind} | {label} | not measured (not installed or failed) | | | | |")
            continue
        f, lt = rows[kind]["first"], rows[kind]["late"]
        ratio = f"{statistics.median(lt) / reference:.3f}x" if reference else ""
        print(f"| {kind} | {label} | {statistics.median(f):,.0f} | {min(f):,.0f} | {statistics.median(lt):,.0f} | "
              f"{min(lt):,.0f} | {ratio} |")
    print(f"\n{repeats} fresh process(es) per row; command: python bench/bench_onelogger.py"
          f"{' --quick' if args.quick else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
