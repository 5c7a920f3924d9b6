"""One rank of ``bench_cross_rank.py --scale`` (started by ``telemetrain launch``): the aggregator's collectives alone,
no training. Builds the exchange group the aggregator builds, then times ``ROUNDS`` all-gathers of the aggregator's
vector and ``ROUNDS`` clock estimates (``Exchange.clock_offset``, at the start's and at an exchange's round trips),
and writes ``$BENCH_OUT/rank-<R>.json``."""

from __future__ import annotations

import json
import os
import time

from telemetrain.distributed.cross_rank import _FIELDS, CLOCK_PEERS, CLOCK_ROUNDS, CLOCK_ROUNDS_START
from telemetrain.distributed.exchange import Exchange


def timed(fn: object, rounds: int) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    for _ in range(rounds):
        w, c = time.perf_counter(), time.thread_time()
        fn()  # type: ignore[operator]
        cpus.append(time.thread_time() - c)
        walls.append(time.perf_counter() - w)
    return walls, cpus


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rounds = int(os.environ.get("ROUNDS", "50"))
    ex = Exchange(rank, world, os.environ.get("TORCHELASTIC_RUN_ID", "bench") + "-scale", 120.0)
    vector = [float(i) for i in range(2 + len(_FIELDS))]
    ex.allgather(vector)  # connections warmed up
    ag_wall, ag_cpu = timed(lambda: ex.allgather(vector), rounds)
    peers = range(1, min(world, CLOCK_PEERS + 1))  # an exchange's slice (every rank, up to 65)
    clock_wall, clock_cpu = timed(lambda: ex.clock_offset(time.time_ns, CLOCK_ROUNDS, peers), rounds)
    start_wall, _ = timed(lambda: ex.clock_offset(time.time_ns, CLOCK_ROUNDS_START), max(rounds // 5, 3))
    out = {"rank": rank, "world": world, "vector_floats": len(vector), "allgather_wall": ag_wall,
           "allgather_cpu": ag_cpu, "clock_wall": clock_wall, "clock_cpu": clock_cpu, "clock_start_wall": start_wall}
    with open(os.path.join(os.environ["BENCH_OUT"], f"rank-{rank}.json"), "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main()
