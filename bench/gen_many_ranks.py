#!/usr/bin/env python3
"""A run of many ranks and few iterations each, for the readers at scale (BENCHMARKS.md, "Many ranks, few
iterations"): ``python bench/gen_many_ranks.py ROOT RANKS ITERATIONS`` writes ``ROOT/scale/run``.

One process writes every rank in turn (a ``Telemetry`` and ``TrainingRecorder`` per rank, the default
configuration: a ``training_metrics_update`` every 50 iterations), so every rank's files carry the same pid, as ranks
in their own containers do. A clean job: each rank's iterations take 100 ms x (1 + 2% Gaussian noise), the same for
all ranks (no straggler), plus ``loss`` and ``lr`` per step. No background compaction (``telemetrain compact`` writes
the columnar copy when wanted). 2,048 x 200 takes ~30 s and 145 MiB of JSONL."""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ["TELEMETRAIN_COMPACT"] = "0"

from telemetrain import Telemetry, identity_from_env
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig


def main(root: str, ranks: int, iterations: int) -> None:
    base0 = time.time() * 1000 - iterations * 200 - 60_000
    for rank in range(ranks):
        rng = random.Random(rank)
        identity = identity_from_env({}, run_id="run", session_tag="scale", perf_tag="scale", rank=rank,
                                     local_rank=rank % 8, world_size=ranks)
        t = Telemetry(identity, store=root, config={"ranks": ranks, "iterations": iterations})
        r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=32), telemetry=t)
        base, now = base0 + rng.uniform(0, 50), 2000.0
        r.on_app_start(base)
        r.on_model_init_start(base)
        r.on_model_init_end(base + now)
        r.on_train_start(0, start_time_msec=base + now)
        for step in range(iterations):
            r.on_training_single_iteration_start(base + now)
            now += 100.0 * rng.gauss(1.0, 0.02)
            r.on_training_single_iteration_end(base + now)
            t.metric("loss", 1.0 / (step + 1), step=step)
            t.metric("lr", 1e-3, step=step)
            now += 1.0
        r.on_train_end(base + now)
        r.on_app_end(base + now + 100)
        if not t.close(timeout=600) or t.health()["dropped"]:
            raise SystemExit(f"rank {rank}: the run store did not get every record")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="run store root; the run is ROOT/scale/run")
    parser.add_argument("ranks", type=int, help="ranks, written one after another by this process")
    parser.add_argument("iterations", type=int, help="training iterations per rank")
    args = parser.parse_args()
    main(args.root, args.ranks, args.iterations)
