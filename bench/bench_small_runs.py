#!/usr/bin/env python3
"""The readers on small runs: which path ``store.engine.engine_for`` should take when DuckDB is installed.

``show`` and ``report`` of two small runs, each command in a fresh process as a user runs it (``bench_scale``'s
``timed_command``: wall time, CPU time, peak RSS), on the pure-Python path (``TELEMETRAIN_ENGINE=python``), on DuckDB
(``=duckdb``) and as chosen by default (the variable unset):

- **many tiny ranks**: ``--ranks`` processes (default 1,024, 8 a host) of ``--values`` loss points each, a resident
  set and, one process a host, the host's CPU: a few KiB a file, too small for the writer to compact, so DuckDB
  converts each JSONL file itself;
- **one small run**: 2 ranks of the real training recorder for ``--iterations`` (default 2,000) iterations with a
  loss per step (~0.7 MiB; the demo's run is 1 MiB).

The runs are written once under ``--dir`` (default: a temporary directory). Usage::

    python bench/bench_small_runs.py                      # both runs, the three choices
    python bench/bench_small_runs.py --ranks 256 --engines python,default --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from bench_scale import timed_command
from telemetrain import Telemetry, identity_from_env
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

ENGINES = ("python", "duckdb", "default")


def write_tiny_ranks(root: Path, ranks: int, values: int) -> Path:
    for rank in range(ranks):
        t = Telemetry(identity_from_env({}, run_id="tiny", session_tag="tiny", rank=rank, world_size=ranks,
                                        host=f"node{rank // 8:04d}"), store=root)
        for step in range(values):
            t.metric("loss", 1.0 / (step + 1), "train", step=step)
        t.metric("process.memory.usage", 1e8 + rank, "system", unit="By")
        if rank % 8 == 0:
            t.metric("system.cpu.utilization", 0.5, "system", unit="1")
        assert t.close()
    return root / "tiny" / "tiny"


def write_small_run(root: Path, iterations: int) -> Path:
    for rank in range(2):
        t = Telemetry(identity_from_env({}, run_id="small", session_tag="small", rank=rank, world_size=2), store=root)
        r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=64, log_every_n_train_iterations=50),
                             telemetry=t)
        now = 1_700_000_000_000.0
        r.on_app_start(now)
        r.on_train_start(0, start_time_msec=now)
        for i in range(iterations):
            r.on_training_single_iteration_start(now)
            now += 20.0 + rank
            r.on_training_single_iteration_end(now)
            t.metric("loss", 3.0 / (1 + i), "train", step=i)
        r.on_train_end(now)
        r.on_app_end(now)
        assert t.close()
    return root / "small" / "small"


def jsonl_bytes(run: Path) -> int:
    return sum(f.stat().st_size for f in run.glob("*.jsonl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--values", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--engines", default=",".join(ENGINES), help="of python, duckdb, default (comma-separated)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-small-") as tmp:
        root = args.dir or Path(tmp)
        runs = {f"{args.ranks} tiny ranks": write_tiny_ranks(root / "tiny", args.ranks, args.values),
                "2 ranks": write_small_run(root / "small", args.iterations)}
        results: dict[str, Any] = {}
        for name, run in runs.items():
            files = len(list(run.glob("*.jsonl")))
            size = jsonl_bytes(run)
            print(f"{name}: {files} files, {size / 2**20:.2f} MiB of JSONL", flush=True)
            results[name] = {"files": files, "jsonl_bytes": size}
            for engine in args.engines.split(","):
                env = {k: v for k, v in os.environ.items()
                       if k not in ("PYTHONDONTWRITEBYTECODE", "TELEMETRAIN_ENGINE")}
                if engine != "default":
                    env["TELEMETRAIN_ENGINE"] = engine
                for command, argv_ in (("show", ["show", str(run)]),
                                       ("report", ["report", str(run), "-o", str(root / "r.html"), "--no-progress"])):
                    timed_command(argv_, env, args.timeout)  # warm: bytecode and file cache
                    r = timed_command(argv_, env, args.timeout)
                    results[name][f"{command} {engine}"] = r
                    print(f"  {command:<6} {engine:<8} {r['wall_s']:7.2f} s wall  {r['cpu_s']:7.2f} s CPU  "
                          f"{r['peak_rss'] / 2**20:6.0f} MiB" + ("" if r["code"] == 0 else f"  exit {r['code']}"),
                          flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
