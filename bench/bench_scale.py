#!/usr/bin/env python3
"""The readers at scale: ``telemetrain report``, ``compare``, ``goodput`` and ``show`` on runs of 8 ranks x 100,000
iterations up to 64 ranks x 1,000,000, their wall time and peak memory; compaction's speed; bytes per iteration in
JSONL and Parquet; and the extrapolation to 1,024 ranks x 1,000,000 iterations.

**The runs** are written by the real pipeline: one process per rank (its own pid, as a real rank), a ``Telemetry``
with the default run store (its segments and its background compaction included) driving a ``TrainingRecorder`` with
the default configuration (a ``training_metrics_update`` every 50 iterations, the iteration spans it exports) at
simulated times (rank ``r``'s iterations take ``100 + r`` ms, rank 1 is 30% slower in the second half), plus two
metrics per step (``loss`` and ``lr`` with their step), a checkpoint every 10,000 iterations. They are cached
(``--cache``, default ``$TELEMETRAIN_SCALE_CACHE`` or ``~/.cache/telemetrain-scale``) and resumable: a rank is
written once, marked done, and a rank left half-written by an interrupted run is deleted and written again.
``--jobs`` ranks are written at once.

**Timed** (after one untimed run that leaves Python's bytecode and the OS's file cache warm, as on a machine where
telemetrain is installed; each command in a fresh process, ``python -m telemetrain.cli ...``, as a user runs it;
wall time and CPU time from ``wait4``, peak RSS as the process's own ``VmHWM``): ``report RUN``,
``compare RUN --baseline COPY`` (against a hard-linked copy of itself: both are read), ``goodput SESSION``,
``show RUN``, and when asked (``--commands``) ``trace RUN``, ``tail RUN --once`` and ``query RUN SQL`` (the loss
metric's rows counted and averaged per rank: a scan of the largest table); ``--repeats`` times, median.
With DuckDB (the ``columnar`` extra) and, where ``--python-up-to`` allows, the pure-Python path
(``TELEMETRAIN_ENGINE=python``) for comparison.

**Compaction**: ``telemetrain.store.compact.compact(run, dest=<temp dir>)`` of one rank's segments in this process
(DuckDB on one thread), records per second. **Bytes**: JSONL and Parquet bytes of the run over ranks x iterations.

**Extrapolation** to 1,024 x 1,000,000: disk from the bytes per iteration; time from the per-row cost fitted on the
two largest sizes measured (time = a + b x rows); memory: the largest peak measured (it does not grow with the run).

Usage:
    python bench/bench_scale.py --quick                       # 2 x 5,000 (seconds)
    python bench/bench_scale.py --sizes 8x100000              # one size
    python bench/bench_scale.py --sizes 8x100000,64x1000000 --json out.json
    python bench/bench_scale.py --sizes 8x100000 --commands report,show --no-compaction-rate   # two readers
    python bench/bench_scale.py --clean                       # delete the cached runs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHECKS = {"report": 60.0, "compare": 60.0, "goodput": 60.0, "show": 60.0}  # seconds on 64 x 1M
# readers timed when asked (--commands): the Perfetto trace (a process's records at a time) and tail's first frame
# (``--once``); the checks above time the four readers issue 17 set a goal for, these carry the same 1 GiB and
# flat-memory checks
MORE_COMMANDS = ("trace", "tail", "query")
# ``query``: the run's largest table scanned whole, aggregated per rank (a few rows printed: the reading is timed,
# not the printing); DuckDB only, so never on the pure-Python path
QUERY = ("SELECT rank, count(*) AS n, avg(value) AS mean_loss FROM metrics WHERE name = 'loss' "
         "GROUP BY rank ORDER BY rank")
SMALL_LIMIT_S = 2.0  # on 8 x 100k
RSS_LIMIT = 1 << 30
COMPACT_RATE = 300_000  # records/s per process
PARQUET_SHARE = 0.2
SESSION, RUN = "scale", "run"


def log(msg: str) -> None:
    print(f"[bench_scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- writing the runs --------------------------------------------------------------------------------------------------

# one iteration of a writer, its two metrics, a checkpoint every 10,000 and a flush every 5,000 (bench_restarts.py's
# writer runs it too): the body of a `for step in ...` loop that sets `duration`
STEP = r"""
    r.on_training_single_iteration_start(base + now)
    now += duration
    r.on_training_single_iteration_end(base + now)
    metric("loss", 1.0 / (step + 1), step=step)
    metric("lr", 1e-3, step=step)
    now += 1.0
    if (step + 1) % 10_000 == 0:
        r.on_save_checkpoint_start(step + 1, base + now)
        r.on_save_checkpoint_success(step + 1, base + now + 1500)
        r.on_save_checkpoint_end(base + now + 1500)
        now += 1500.0
    if step % 5000 == 4999 and not t.flush(timeout=300):  # the producer must not outrun the writer: nothing dropped
        raise SystemExit("flush timed out")
"""

WRITER = r"""
import sys, time
from telemetrain import Telemetry, identity_from_env
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

root, ranks, rank, iterations = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
identity = identity_from_env({}, run_id="run", session_tag="scale", perf_tag="scale", rank=rank,
                             local_rank=rank % 8, world_size=ranks)
t = Telemetry(identity, store=root, config={"ranks": ranks, "iterations": iterations})
r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=32), telemetry=t)
step_ms = 100.0 + rank
base = time.time() * 1000 - iterations * (step_ms * 1.3 + 1) - 60_000
now = 0.0
r.on_app_start(base)
r.on_model_init_start(base)
now += 2000.0
r.on_model_init_end(base + now)
r.on_train_start(0, start_time_msec=base + now)
metric = t.metric
for step in range(iterations):
    duration = step_ms * (1.3 if rank == 1 and step >= iterations // 2 else 1.0)
""" + STEP + r"""r.on_train_end(base + now)
r.on_app_end(base + now + 100)
dropped = t.health()["dropped"]
if not t.close(timeout=600) or dropped:
    raise SystemExit(f"the run store did not get every record (dropped {dropped})")
"""


def size_dir(cache: Path, ranks: int, iterations: int) -> Path:
    return cache / f"{ranks}x{iterations}"


def run_dir_of(base: Path) -> Path:
    return base / "store" / SESSION / RUN


def write_run(base: Path, ranks: int, iterations: int, jobs: int) -> float:
    """Write the missing ranks of the run under ``base``; returns the seconds it took (0 when cached)."""
    done = base / "done"
    done.mkdir(parents=True, exist_ok=True)
    run = run_dir_of(base)
    todo = [r for r in range(ranks) if not (done / f"rank-{r}").exists()]
    if not todo:
        return 0.0
    for r in todo:  # what an interrupted generation left of these ranks: written again from scratch
        for f in list(run.glob(f"rank-{r}.*")) if run.exists() else []:
            f.unlink()
        if (run / "_columnar").exists():
            for f in (run / "_columnar").rglob(f"rank-{r}.*"):
                f.unlink()
    log(f"writing {len(todo)} rank(s) of {ranks} x {iterations:,} ({jobs} at a time) under {base}")
    t0 = time.perf_counter()
    running: dict[int, subprocess.Popen[bytes]] = {}
    pending = list(todo)
    env = {**os.environ}
    env.pop("TELEMETRAIN_ENGINE", None)
    while pending or running:
        while pending and len(running) < jobs:
            r = pending.pop(0)
            running[r] = subprocess.Popen([sys.executable, "-c", WRITER, str(base / "store"), str(ranks), str(r),
                                           str(iterations)], env=env)
        time.sleep(0.5)
        for r, proc in list(running.items()):
            code = proc.poll()
            if code is None:
                continue
            del running[r]
            if code != 0:
                raise SystemExit(f"writing rank {r} failed ({code})")
            (done / f"rank-{r}").touch()
            log(f"rank {r} written ({ranks - len(pending) - len(running)}/{ranks})")
    seconds = time.perf_counter() - t0
    (base / "written.json").write_text(json.dumps({"seconds": seconds, "ranks": len(todo)}))
    return seconds


def finish_compaction(run: Path) -> dict[str, Any]:
    """Wait for the writers' background compactors (``telemetrain compact`` takes each segment's lock) and cover what
    they left: afterwards every segment has its Parquet copy."""
    from telemetrain.store.compact import compact

    t0 = time.perf_counter()
    result = compact(run)
    return {"segments_left": result.segments, "seconds": time.perf_counter() - t0, "errors": result.errors}


# -- measuring ---------------------------------------------------------------------------------------------------------


# The command, run as ``python -m telemetrain.cli`` would, writing its own peak RSS (VmHWM) to a file at exit:
# ru_maxrss from wait4 would include the memory of this benchmark process, which the child's exec inherits.
CLI = r"""
import atexit, os, sys
def _hwm():
    with open("/proc/self/status") as fh:
        kib = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    with open(os.environ["BENCH_SCALE_HWM"], "w") as out:
        out.write(str(kib * 1024))
atexit.register(_hwm)
from telemetrain.cli import console
raise SystemExit(console())
"""


def timed_command(argv: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Wall time, CPU time and peak RSS of the ``telemetrain`` command ARGV in its own process."""
    with tempfile.TemporaryDirectory(prefix="bench-scale-cmd-") as tmp:
        hwm, err_path = Path(tmp) / "hwm", Path(tmp) / "stderr"
        with open(err_path, "wb") as err:
            t0 = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-c", CLI, *argv], env={**env, "BENCH_SCALE_HWM": str(hwm)},
                                    stdout=subprocess.DEVNULL, stderr=err)
            deadline = t0 + timeout
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() > deadline:
                    proc.kill()
                    pid, status, usage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.02)
            wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        peak = int(hwm.read_text()) if hwm.exists() else 0
        text = err_path.read_bytes().decode(errors="replace")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss": peak, "code": proc.returncode,
            "stderr": text[-2000:]}


def baseline_of(run: Path) -> Path:
    """A second run to compare with: the same files, hard-linked (no disk), under another store. Linked afresh each
    time: a copy kept from before the run was compacted again would hold the old columnar copy (a stale one once made
    every ``compare`` convert the whole baseline's JSONL again)."""
    base = run.parents[2] / "baseline" / SESSION / RUN
    base.parent.mkdir(parents=True, exist_ok=True)
    tmp = base.with_name(".tmp-baseline")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(run, tmp, copy_function=os.link)
    shutil.rmtree(base, ignore_errors=True)
    tmp.rename(base)
    return base


def measure(run: Path, engine: str, repeats: int, timeout: float, out: Path,
            only: tuple[str, ...] = tuple(CHECKS)) -> dict[str, Any]:
    # as installed: Python's bytecode cached (a development shell may set PYTHONDONTWRITEBYTECODE, and then every
    # command would compile telemetrain's modules again, ~0.5 s); one untimed run of each command writes the cache
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["TELEMETRAIN_ENGINE"] = engine
    commands = {
        "report": ["report", str(run), "-o", str(out / "report.html"), "--no-progress"],
        # (the baseline, a hard-linked copy beside the run, is made only when compare is timed)
        "compare": ["compare", str(run), "--baseline", str(baseline_of(run))] if "compare" in only else [],
        "goodput": ["goodput", str(run.parent)],
        "show": ["show", str(run)],
        "trace": ["trace", str(run), "-o", str(out / "trace.json")],
        "tail": ["tail", str(run), "--once"],
        "query": ["query", str(run), QUERY, "--max-rows", "0"],
    }
    results = {}
    for name, argv in commands.items():
        if name not in only or (name == "query" and engine == "python"):
            continue
        timed_command(argv, env, timeout)  # warm: bytecode and the OS's file cache
        samples = [timed_command(argv, env, timeout) for _ in range(repeats)]
        bad = [s for s in samples if s["code"] != 0]
        if bad:
            log(f"{name} ({engine}) failed: exit {bad[0]['code']}: {bad[0]['stderr'][-500:]}")
        results[name] = {
            "wall_s": statistics.median(s["wall_s"] for s in samples),
            "cpu_s": statistics.median(s["cpu_s"] for s in samples),
            "peak_rss": max(s["peak_rss"] for s in samples),
            "ok": not bad, "samples": samples,
        }
        log(f"{name:8} {engine:7} wall {results[name]['wall_s']:7.2f} s  cpu {results[name]['cpu_s']:7.2f} s  "
            f"peak RSS {results[name]['peak_rss'] / 2**20:7.1f} MiB")
    return results


def disk(run: Path, ranks: int, iterations: int) -> dict[str, Any]:
    jsonl = sum(f.stat().st_size for f in run.glob("*.jsonl"))
    parquet = sum(f.stat().st_size for f in (run / "_columnar").rglob("*.parquet")) if (run / "_columnar").exists() \
        else 0
    n = ranks * iterations
    return {"jsonl_bytes": jsonl, "parquet_bytes": parquet, "jsonl_per_iteration": jsonl / n,
            "parquet_per_iteration": parquet / n, "parquet_share": parquet / jsonl if jsonl else None}


def compaction_rate(run: Path) -> dict[str, Any]:
    """Compact rank 0's segments again, into a temporary directory, in this process."""
    from telemetrain.store.compact import CompactResult, compact_process, connect, segment_plan

    plans = segment_plan(run)
    _, paths, meta = next((p for p in plans if p[1][0].name.startswith("rank-0.")), plans[0])
    with tempfile.TemporaryDirectory(prefix="bench-compact-", dir=run.parent) as tmp:
        con = connect(threads=1)
        result = CompactResult()
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        compact_process(con, run, paths, meta, Path(tmp), result, force=True, lock=False)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        con.close()
    return {"records": result.records, "segments": result.segments, "seconds": seconds, "cpu_s": cpu,
            "records_per_s": result.records / seconds if seconds else 0.0,
            "records_per_cpu_s": result.records / cpu if cpu else 0.0, "bytes_in": result.bytes_in,
            "bytes_out": result.bytes_out}


def records_of(run: Path) -> int:
    from telemetrain.store.engine import Engine

    with Engine([run]) as engine:
        return sum(int(c.records) for c in engine.process_counts.values())


# -- the report ----------------------------------------------------------------------------------------------------


def extrapolate(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """1,024 ranks x 1,000,000 iterations from the measured sizes."""
    target_iterations = 1024 * 1_000_000
    big = max(sizes, key=lambda s: s["ranks"] * s["iterations"])
    out: dict[str, Any] = {
        "jsonl_bytes": big["disk"]["jsonl_per_iteration"] * target_iterations,
        "parquet_bytes": big["disk"]["parquet_per_iteration"] * target_iterations,
        "records": big["records"] / (big["ranks"] * big["iterations"]) * target_iterations,
    }
    if "compaction" in big:
        out["compaction_cpu_s"] = (big["records"] / (big["ranks"] * big["iterations"]) * target_iterations
                                   / max(big["compaction"]["records_per_cpu_s"], 1.0))
    fitted = sorted(sizes, key=lambda s: s["records"])[-2:]
    for cmd in (*CHECKS, *MORE_COMMANDS):
        points = [(s["records"], s["duckdb"][cmd]["wall_s"]) for s in fitted if cmd in s.get("duckdb", {})]
        if len(points) == 2 and points[1][0] != points[0][0]:
            (x0, y0), (x1, y1) = points
            b = max((y1 - y0) / (x1 - x0), 0.0)
            a = y0 - b * x0
            out[f"{cmd}_wall_s"] = a + b * out["records"]
            out[f"{cmd}_s_per_million_records"] = b * 1e6
        peaks = [s["duckdb"][cmd]["peak_rss"] for s in sizes if cmd in s.get("duckdb", {})]
        if peaks:
            out[f"{cmd}_peak_rss"] = max(peaks)
    return out


def checks(sizes: list[dict[str, Any]]) -> list[str]:
    lines = []

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    for s in sizes:
        label = f"{s['ranks']} x {s['iterations']:,}"
        limit = SMALL_LIMIT_S if (s["ranks"], s["iterations"]) == (8, 100_000) else (
            60.0 if (s["ranks"], s["iterations"]) == (64, 1_000_000) else None)
        for cmd, r in s.get("duckdb", {}).items():
            parts = [f"{cmd} on {label}: {r['wall_s']:.2f} s wall ({r['cpu_s']:.2f} s CPU), "
                     f"{r['peak_rss'] / 2**20:.0f} MiB peak RSS"]
            if limit is not None:
                parts.append(f"{verdict(r['wall_s'] <= limit and r['ok'])} (<= {limit:g} s)")
            parts.append(f"{verdict(r['peak_rss'] <= RSS_LIMIT)} (<= 1 GiB)")
            lines.append("; ".join(parts))
        c = s.get("compaction")
        if c is not None:
            ok = verdict(c["records_per_s"] >= COMPACT_RATE)
            lines.append(f"compaction on {label}: {c['records_per_s']:,.0f} records/s wall, "
                         f"{c['records_per_cpu_s']:,.0f} per CPU second: {ok} (>= {COMPACT_RATE:,})")
        d = s["disk"]
        if d["parquet_share"] is not None:
            lines.append(f"Parquet / JSONL on {label}: {d['parquet_share']:.1%}: "
                         f"{verdict(d['parquet_share'] <= PARQUET_SHARE)} (<= 20%)")
    if len(sizes) >= 2:
        for cmd in (*CHECKS, *MORE_COMMANDS):
            peaks = [s["duckdb"][cmd]["peak_rss"] for s in sizes if cmd in s.get("duckdb", {})]
            if len(peaks) >= 2:
                spread = max(peaks) / min(peaks) - 1
                lines.append(f"{cmd} peak RSS from the smallest to the largest run: +{spread:.0%}: "
                             f"{verdict(spread <= 0.2)} (flat within 20%)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sizes", default="8x100000,64x1000000", help="RANKSxITERATIONS,... (default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="one small size, 2 x 5,000 (a smoke run)")
    ap.add_argument("--cache", default=os.environ.get("TELEMETRAIN_SCALE_CACHE")
                    or str(Path.home() / ".cache" / "telemetrain-scale"), help="where the runs are kept")
    ap.add_argument("--jobs", type=int, default=2, help="ranks written at once")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800.0, help="per command, seconds")
    ap.add_argument("--python-up-to", type=int, default=2_000_000,
                    help="also time the pure-Python path on runs of at most this many iterations in all")
    ap.add_argument("--commands", default=",".join(CHECKS),
                    help=f"the readers timed, of {', '.join((*CHECKS, *MORE_COMMANDS))} (default: %(default)s)")
    ap.add_argument("--no-compaction-rate", action="store_true", help="do not time compaction")
    ap.add_argument("--json", metavar="FILE", help="also write the raw results to FILE")
    ap.add_argument("--clean", action="store_true", help="delete the cached runs and exit")
    ap.add_argument("--write-only", action="store_true", help="write (or finish writing) the runs, time nothing")
    args = ap.parse_args(argv)
    cache = Path(args.cache)
    if args.clean:
        shutil.rmtree(cache, ignore_errors=True)
        log(f"deleted {cache}")
        return 0
    sizes = [(2, 5000)] if args.quick else [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    load = os.getloadavg()
    results: list[dict[str, Any]] = []
    for ranks, iterations in sizes:
        base = size_dir(cache, ranks, iterations)
        written = write_run(base, ranks, iterations, args.jobs)
        run = run_dir_of(base)
        if args.write_only:
            continue
        compaction_left = finish_compaction(run)
        entry: dict[str, Any] = {"ranks": ranks, "iterations": iterations, "write_s": written,
                                 "compaction_left": compaction_left, "disk": disk(run, ranks, iterations),
                                 "records": records_of(run), "load_before": os.getloadavg()}
        log(f"{ranks} x {iterations:,}: {entry['records']:,} records, JSONL {entry['disk']['jsonl_bytes'] / 2**20:,.0f}"
            f" MiB, Parquet {entry['disk']['parquet_bytes'] / 2**20:,.0f} MiB")
        if not args.no_compaction_rate:
            entry["compaction"] = compaction_rate(run)
        only = tuple(c for c in args.commands.split(",") if c)
        unknown = set(only) - {*CHECKS, *MORE_COMMANDS}
        if unknown:
            ap.error(f"--commands: unknown {sorted(unknown)} (known: {', '.join((*CHECKS, *MORE_COMMANDS))})")
        with tempfile.TemporaryDirectory(prefix="bench-scale-out-") as out:
            entry["duckdb"] = measure(run, "duckdb", args.repeats, args.timeout, Path(out), only)
            if ranks * iterations <= args.python_up_to:
                entry["python"] = measure(run, "python", 1, args.timeout, Path(out), only)
        entry["load_after"] = os.getloadavg()
        results.append(entry)
    report = {"machine": {"cpus": os.cpu_count(), "load_at_start": load, "python": sys.version.split()[0]},
              "sizes": results, "extrapolation_1024x1M": extrapolate(results) if results else {},
              "checks": checks(results)}
    print(json.dumps({k: v for k, v in report.items() if k != "sizes"}, indent=1))
    for line in report["checks"]:
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
