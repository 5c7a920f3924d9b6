"""What a restarted session costs the readers: ``telemetrain report`` of the last attempt and ``telemetrain goodput``
of the session, for sessions of 1, 2 and 4 attempts (issue 17: "the report of a restarted session does not re-read
every attempt in full for goodput").

Each attempt is written by the real pipeline as ``bench_scale.py`` writes its runs (one process per rank, a
``TrainingRecorder`` at simulated times, two metrics per step, a checkpoint every 10,000 iterations, the default
run store with its background compaction): ``--ranks`` ranks x ``--iterations`` iterations per attempt. Every attempt
but the last stops without ending its spans or closing its ``Telemetry`` (``os._exit`` after a flush: what a
SIGKILL leaves, bar the last queued records) 5,000 iterations past its last checkpoint, and the next resumes from
that checkpoint. The readers run as
``bench_scale.py`` runs them: a fresh process each, one untimed run first, the median of ``--repeats``, that
process's CPU time and peak RSS. DuckDB path unless ``--engine python``.

    python bench/bench_restarts.py                                   # 8 ranks x 50,000 per attempt; 1, 2, 4 attempts
    python bench/bench_restarts.py --attempts 1,2 --iterations 20000 --cache /tmp/restarts
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import STEP, finish_compaction, log, timed_command

WRITER = r"""
import os, sys, time
from telemetrain import Telemetry, identity_from_env
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

root, session, ranks, rank, attempt, attempts, per = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
identity = identity_from_env({}, run_id=f"attempt-{attempt}", session_tag=session, perf_tag="restarts", rank=rank,
                             local_rank=rank % 8, world_size=ranks, restart_count=attempt)
t = Telemetry(identity, store=root, config={"ranks": ranks, "iterations": per})
r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=32), telemetry=t)
step_ms = 100.0 + rank
killed = attempt < attempts - 1
run = per + (5000 if killed else 0)  # a killed attempt dies 5,000 iterations past its last checkpoint
span_ms = (per + 5000) * (step_ms + 1) + (per // 10_000 + 1) * 1500 + 5000
base = time.time() * 1000 - (attempts - attempt) * span_ms - 60_000
start = attempt * per  # the previous attempt's last checkpoint
now = 0.0
r.on_app_start(base)
r.on_load_checkpoint_start(base + 10)
r.on_load_checkpoint_end(base + 500)
now += 1000.0
r.on_train_start(start, start_time_msec=base + now)
metric = t.metric
duration = step_ms
for step in range(start, start + run):
""" + STEP + r"""if killed:  # nothing ended, nothing closed
    if not t.flush(timeout=300) or t.health()["dropped"]:
        raise SystemExit("the run store did not get every record")
    os._exit(0)
r.on_train_end(base + now)
r.on_app_end(base + now + 100)
if not t.close(timeout=600) or t.health()["dropped"]:
    raise SystemExit("the run store did not get every record")
"""


def write_session(root: Path, attempts: int, ranks: int, per: int, jobs: int) -> Path:
    """The session folder of ``attempts`` attempts (written unless its ``done`` marker is there)."""
    session = f"restarts-{attempts}x{ranks}x{per}"
    done = root / f"{session}.done"
    if done.exists():
        return root / "store" / session
    env = {k: v for k, v in os.environ.items() if k != "TELEMETRAIN_ENGINE"}
    t0 = time.perf_counter()
    for attempt in range(attempts):  # in order: an attempt's clock follows the previous one's
        todo = list(range(ranks))
        running: list[subprocess.Popen[bytes]] = []
        while todo or running:
            while todo and len(running) < jobs:
                rank = todo.pop(0)
                running.append(subprocess.Popen([sys.executable, "-c", WRITER, str(root / "store"), session,
                                                 *map(str, (ranks, rank, attempt, attempts, per))], env=env))
            time.sleep(0.5)
            for proc in [p for p in running if p.poll() is not None]:
                running.remove(proc)
                if proc.returncode != 0:
                    raise SystemExit(f"writing {session} attempt {attempt} failed ({proc.returncode})")
        log(f"{session}: attempt {attempt} written")
    for run in sorted((root / "store" / session).iterdir()):
        finish_compaction(run)
    done.write_text(json.dumps({"seconds": time.perf_counter() - t0}))
    return root / "store" / session


def measure(argv: list[str], engine: str, repeats: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["TELEMETRAIN_ENGINE"] = engine
    timed_command(argv, env, 1800.0)
    samples = [timed_command(argv, env, 1800.0) for _ in range(repeats)]
    bad = [s for s in samples if s["code"] != 0]
    if bad:
        raise SystemExit(f"{argv[0]} failed: exit {bad[0]['code']}: {bad[0]['stderr'][-800:]}")
    return {"wall_s": statistics.median(s["wall_s"] for s in samples),
            "cpu_s": statistics.median(s["cpu_s"] for s in samples),
            "peak_rss": max(s["peak_rss"] for s in samples)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--attempts", default="1,2,4", help="sessions of this many attempts (default: %(default)s)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=50_000, help="per attempt and rank")
    ap.add_argument("--jobs", type=int, default=2, help="ranks written at once")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engine", default="duckdb", choices=("duckdb", "python"))
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "telemetrain-restarts"))
    args = ap.parse_args(argv)
    root = Path(args.cache)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-restarts-") as out:
        for attempts in (int(a) for a in args.attempts.split(",")):
            session = write_session(root, attempts, args.ranks, args.iterations, args.jobs)
            last = session / f"attempt-{attempts - 1}"
            row: dict[str, Any] = {"attempts": attempts,
                   "report": measure(["report", str(last), "-o", str(Path(out) / "r.html"), "--no-progress"],
                                     args.engine, args.repeats),
                   "goodput": measure(["goodput", str(session)], args.engine, args.repeats)}
            rows.append(row)
            log(f"{attempts} attempt(s): report {row['report']['cpu_s']:.2f} CPU s "
                f"{row['report']['peak_rss'] / 2**20:.0f} MiB; goodput {row['goodput']['cpu_s']:.2f} CPU s "
                f"{row['goodput']['peak_rss'] / 2**20:.0f} MiB")
    print(f"| attempts of {args.ranks} x {args.iterations:,} | report (CPU s, peak RSS) | goodput (CPU s, peak RSS) |")
    print("|---:|---|---|")
    for row in rows:
        cells = [f"{row[c]['wall_s']:.2f} s ({row[c]['cpu_s']:.2f} CPU), {row[c]['peak_rss'] / 2**20:.0f} MiB"
                 for c in ("report", "goodput")]
        print(f"| {row['attempts']} | {cells[0]} | {cells[1]} |")
    print(json.dumps({"machine": {"cpus": os.cpu_count(), "load": os.getloadavg()}, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
