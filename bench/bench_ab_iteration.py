"""The training iteration's cost in two source trees, measured in fresh child processes that alternate between them
(what a before/after comparison on a shared, noisy machine needs: both sides see the same load drift).

Each child: a ``TrainingRecorder`` on a run store, global batch 8, 1,000 iterations first, then the training thread's
CPU time (``time.thread_time_ns``) of 10 blocks of 3,000 iterations (or, ``capture``, of 200 report captures, each
after 50 iterations); it prints the median block. Printed: per tree the median over its children, and the median of
the per-pair ratios (second tree / first).

    git archive <commit> src | tar -x -C /tmp/before      # the tree to compare with
    python bench/bench_ab_iteration.py /tmp/before/src src --pairs 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

MODES = ("report", "no-report", "capture", "module")


def child(mode: str) -> float:
    """One child's median: ns per iteration (per capture for ``capture``)."""
    from telemetrain import Telemetry, set_telemetry
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
    from telemetrain.training import callbacks as cb
    from telemetrain.training.default import configure

    t = Telemetry(store=os.path.join(tempfile.mkdtemp(prefix="bench_ab_"), "run"), default=False)
    every = 10**9 if mode in ("no-report", "capture") else 50
    config = TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=every)
    s: Callable[[], Any]
    e: Callable[[], Any]
    if mode == "module":
        set_telemetry(t)
        configure(config)
        cb.on_app_start()
        cb.on_train_start(0)
        s, e = cb.on_training_single_iteration_start, cb.on_training_single_iteration_end
    else:
        r = TrainingRecorder(config, telemetry=t)
        r.on_app_start()
        r.on_train_start(0)
        s, e = r.on_training_single_iteration_start, r.on_training_single_iteration_end
    for _ in range(1000):
        s()
        e()
    blocks = []
    for _ in range(10):
        if mode == "capture":
            spent = 0
            for _ in range(200):
                for _ in range(50):
                    s()
                    e()
                t0 = time.thread_time_ns()
                r._snapshot(False)  # internals: the training thread's share of a report
                spent += time.thread_time_ns() - t0
            blocks.append(spent / 200)
        else:
            t0 = time.thread_time_ns()
            for _ in range(3000):
                s()
                e()
            blocks.append((time.thread_time_ns() - t0) / 3000)
    t.close()
    return statistics.median(blocks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first", help="a source tree (the directory holding telemetrain/)")
    ap.add_argument("second", help="the other source tree")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(child(args.child))
        return 0
    trees = (os.path.abspath(args.first), os.path.abspath(args.second))
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
        ns: tuple[list[float], list[float]] = ([], [])
        for i in range(args.pairs):
            for k in (0, 1) if i % 2 == 0 else (1, 0):  # alternating which goes first
                env = dict(os.environ, PYTHONPATH=trees[k])
                out = subprocess.run([sys.executable, __file__, args.first, args.second, "--child", mode], env=env,
                                     check=True, capture_output=True, text=True).stdout
                ns[k].append(float(out.split()[-1]))
        ratios = [b / a for a, b in zip(ns[0], ns[1], strict=True)]
        print(f"{mode}: {statistics.median(ns[0]):.0f} ns -> {statistics.median(ns[1]):.0f} ns, "
              f"per-pair ratio median {statistics.median(ratios):.3f} (pairs: {', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
