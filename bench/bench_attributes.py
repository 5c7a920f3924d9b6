#!/usr/bin/env python3
"""Metric attributes: their cost on the calling thread and in the run store, and the cost of a metric without them
against a baseline tree (``--baseline``, e.g. the main branch's ``src``), measured back to back in CPU time.

Each round runs one child process per tree, back to back (baseline first in even rounds, ours first in odd ones),
so both see the same machine load; a child times each operation with ``time.thread_time_ns`` (CPU time of the
calling thread: another process on a shared machine inflates it less than wall time) over ``--n`` calls per
repeat, GC on, into a Telemetry whose run-store writer sleeps during the repeat (``flush_interval`` 3600 s) and is
flushed between repeats, outside the timed region (the caller-side cost, as ``bench_core.py`` measures it).
Reported: the median over rounds of each child's median, per tree, and ours / baseline.

Record size: the bytes of one JSON line in the run store (format v2) for each shape.

Usage:
    python bench/bench_attributes.py --baseline /work/main/src            # ~1-2 min
    python bench/bench_attributes.py --baseline /work/main/src --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from telemetrain import Telemetry

HERE = Path(__file__).resolve().parent
OURS = HERE.parent / "src"

# (label, statement, needs attributes support)
OPS = [
    ("metrics.put_metric to a muted group", 'put_metric("m", 1, "quiet")', False),
    ("t.metric(name, value, group)", 't.metric("m", 1.0, "grp")', False),
    ("t.metric(..., unit=, step=)", 't.metric("m", 1.0, "grp", unit="s", step=7)', False),
    ("metrics.put_metric(name, value, group)", 'put_metric("m", 1, "grp")', False),
    ("t.metric(..., attributes=1 label)", 't.metric("m", 1.0, "grp", attributes=A1)', True),
    ("t.metric(..., attributes=3 labels)", 't.metric("m", 1.0, "grp", attributes=A3)', True),
    ("t.log({4 values}, step=) per call", 't.log(D4, 7)', True),
]
A1 = {"disk.io.direction": "read"}
A3 = {"hw.id": "0", "hw.type": "gpu", "train.phase": "forward"}
D4 = {"loss": 0.5, "lr": 3e-4, "grad_norm": 1.25, "tokens": 4096}

CHILD = r"""
import gc, json, statistics, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import telemetrain
from telemetrain import metrics as tmetrics
n, repeats, attrs = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
ops = json.loads(sys.argv[5])
t = telemetrain.Telemetry(store=tempfile.mkdtemp(), flush_interval=3600.0, queue_capacity=50_000_000)
telemetrain.set_telemetry(t)
t.mute("quiet")
names = {"t": t, "put_metric": tmetrics.put_metric, "A1": json.loads(sys.argv[6]), "A3": json.loads(sys.argv[7]),
         "D4": json.loads(sys.argv[8])}
out = {}
for label, stmt, needs in ops:
    if needs and not attrs:
        continue
    code = compile(f"def run(_n):\n    for _ in range(_n):\n        {stmt}\n", "<bench>", "exec")
    scope = dict(names)
    exec(code, scope)
    run = scope["run"]
    run(1000)
    t.flush(30)
    samples = []
    for _ in range(repeats):
        gc.collect()
        c0 = time.thread_time_ns()
        run(n)
        samples.append((time.thread_time_ns() - c0) / n)
        t.flush(60)  # outside the timed region: every record is really written
    out[label] = statistics.median(samples)
health = t.health()
t.close()
print(json.dumps({"ns": out, "dropped": health["dropped"], "failed": health["failed"]}))
"""


def child(tree: Path, n: int, repeats: int, attributes: bool) -> dict[str, Any]:
    args = [sys.executable, "-c", CHILD, str(tree), str(n), str(repeats), "1" if attributes else "0",
            json.dumps(OPS), json.dumps(A1), json.dumps(A3), json.dumps(D4)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": ""})
    if proc.returncode != 0:
        raise RuntimeError(f"child for {tree} failed: {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["dropped"] or result["failed"]:
        raise RuntimeError(f"records lost in the child for {tree}: {result}")
    return dict(result["ns"])


def record_sizes() -> list[tuple[str, int]]:
    sys.path.insert(0, str(OURS))
    import telemetrain

    shapes: list[tuple[str, Callable[[Telemetry], None]]] = [
        ("metric, no unit/step/attributes", lambda t: t.metric("loss", 0.123456789, "default")),
        ("metric, unit + step", lambda t: t.metric("loss", 0.123456789, "default", unit="s", step=1234)),
        ("metric + 1 attribute (system.disk.io)", lambda t: t.metric(
            "system.disk.io", 123456789, "system", unit="By", attributes={"disk.io.direction": "read"})),
        ("metric + 2 attributes (a GPU's hw.id, hw.type)", lambda t: t.metric(
            "hw.power", 312.5, "system.gpu.0", unit="W", attributes={"hw.id": "0", "hw.type": "gpu"})),
        ("metric + 1 attribute + step (train.phase.duration)", lambda t: t.metric(
            "train.phase.duration", 0.0123, "training", unit="s", step=1234, attributes={"train.phase": "forward"})),
    ]
    out: list[tuple[str, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, emit in shapes:
            with telemetrain.Telemetry(store=Path(tmp) / label.split()[0] / str(len(out))) as t:
                emit(t)
                assert t.flush() and t.store is not None
                path = t.store.path
                assert path is not None  # the record opened the file
            lines = Path(path).read_bytes().splitlines(keepends=True)
            out.append((label, len(lines[-1])))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, help="the baseline tree's src directory (e.g. /work/main/src)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 50,000 calls x 3")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.n, args.repeats = 2, 50_000, 3
    ours_runs: list[dict[str, Any]] = []
    base_runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = [(OURS, ours_runs, True)]
        if args.baseline is not None:  # alternate which goes first: the second of a pair may find warmer caches
            order.insert(r % 2, (args.baseline, base_runs, False))
        for tree, runs, attributes in order:
            runs.append(child(tree, args.n, args.repeats, attributes=attributes))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    rows = []
    print(f"CPU time of the calling thread, ns per call: median of {args.rounds} rounds x {args.repeats} repeats x "
          f"{args.n:,} calls; GC on; load average {os.getloadavg()[0]:.2f} (shared machine)\n")
    print("| operation | baseline | ours | ours / baseline |\n|---|---:|---:|---:|")
    for label, _, _ in OPS:
        ours = statistics.median(run[label] for run in ours_runs)
        base = statistics.median(run[label] for run in base_runs) if base_runs and label in base_runs[0] else None
        ratio = ours / base if base else None
        rows.append({"op": label, "ours_ns": ours, "baseline_ns": base, "ratio": ratio})
        print(f"| `{label}` | {f'{base:.0f}' if base else '-'} | {ours:.0f} | {f'{ratio:.3f}' if ratio else '-'} |")
    sizes = record_sizes()
    print("\n| record | bytes per line in the run store |\n|---|---:|")
    for label, size in sizes:
        print(f"| {label} | {size} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "sizes": sizes}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
