"""One rank of a 2-rank job that estimates its clock offset to rank 0 (tests/test_clock_exchange.py). Real gloo
groups on CPU. Rank 1's clock is 2.5 s ahead, and its first ``SLOW`` round trips are made long (it waits 3 ms
between sending and reading the answer's arrival time), as a busy host makes them.

``python _clock_worker.py RANK INIT_FILE OUT_JSON SLOW ROUNDS MAX_ROUNDS``
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from telemetrain.distributed.exchange import Exchange

SKEW_NS = 2_500_000_000
DELAY_S = 0.003


def main() -> None:
    rank, init_file, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    slow, rounds, max_rounds = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    ex = Exchange(rank, 2, "clock-test", timeout_s=60)
    reads = 0

    def now_ns() -> int:  # rank 1: odd reads end a round trip (t3)
        nonlocal reads
        reads += 1
        if rank == 1 and reads % 2 == 0 and reads // 2 <= slow:
            time.sleep(DELAY_S)
        return time.time_ns() + (SKEW_NS if rank == 1 else 0)

    result: dict[str, object] = {}
    errors: list[str] = []
    for bad in ({"rounds": 0}, {"rounds": 4, "max_rounds": 2}):
        try:
            ex.clock_offset(now_ns, **bad)  # type: ignore[arg-type]
        except ValueError as exc:
            errors.append(str(exc))
    if errors:
        result["errors"] = errors
    found = ex.clock_offset(now_ns, rounds, max_rounds=max_rounds)
    result["found"] = list(found) if found is not None else None
    result["round_trips"] = reads // 2 if rank == 1 else None
    # the two ranks are still in step: a second estimate and an all-gather go through
    again = ex.clock_offset(time.time_ns, 2, max_rounds=2)
    result["again"] = list(again) if again is not None else None
    result["gathered"] = ex.allgather([float(rank)])
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
