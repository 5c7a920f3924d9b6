"""A DDP training process whose all-reduce fails, for the tests of the stall evidence a failed collective leaves
(tests/test_comm_failure.py). Real gloo process groups on CPU; the only telemetry is rank 0's.

``python _comm_failure_worker.py SCENARIO RANK WORLD INIT_FILE STORE``:

- ``dead_peer`` (world 2): rank 1 trains two steps with rank 0, then SIGKILLs itself; rank 0's next backward raises
  (gloo sees the peer's socket closed: every bucket's all-reduce fails) and the exception leaves the script;
- ``future_fails`` (world 1): the comm hook's future fails from another thread while backward waits on it;
- ``hook_raises`` (world 1): the comm hook raises at launch, inside ``loss.backward()``;
- ``user_error_in_flight`` (world 1): the user's own exception leaves the loop while a collective timed with
  ``CommMonitor.begin`` is still in flight.

The watchdog looks only every 60 s and has no stall within reach: what it writes here, it writes because a
collective failed or was in flight when the process ended, not because its thread happened to look.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import telemetrain
from telemetrain.distributed import comm_monitor, enable_watchdog, instrument_ddp
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

FAIL_AT = 2  # the iteration whose all-reduce fails


def main() -> None:
    scenario, rank, world, init_file, store = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    # gradient buckets of a few hundred bytes: three all-reduces per step, all failing together when the peer is dead
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8), torch.nn.ReLU(),
                            torch.nn.Linear(8, 4)), bucket_cap_mb=0.0004)
    x = torch.randn(4, 8)
    if rank != 0:  # the peer that dies: no telemetry
        for _ in range(FAIL_AT):
            model(x).sum().backward()
        time.sleep(1.0)  # rank 0 has read all of this step's data, and waits in the next step's all-reduces
        os.kill(os.getpid(), signal.SIGKILL)
    telemetry = telemetrain.Telemetry(store=store)
    enable_watchdog(telemetry, poll_s=60.0, floor_s=600.0, startup_s=600.0, heartbeat_s=0, on_signal=False,
                    fatal_stacks=False, flight_recorder=False)
    step = [0]

    def hook(state: Any, bucket: Any) -> Any:
        if step[0] == FAIL_AT and scenario == "hook_raises":
            raise RuntimeError("the hook could not launch its all-reduce")
        if step[0] == FAIL_AT and scenario == "future_fails":
            future: Any = torch.futures.Future()
            threading.Timer(0.05, future.set_exception, (RuntimeError("the all-reduce failed in flight"),)).start()
            return future
        done = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return done.then(lambda f: f.value()[0])

    if scenario == "dead_peer":
        instrument_ddp(model, telemetry=telemetry)
    else:
        instrument_ddp(model, hook=hook, telemetry=telemetry)
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=1000),
                           telemetry=telemetry)
    rec.on_app_start()
    rec.on_train_start(train_iterations_start=0)
    for i in range(10):
        step[0] = i
        rec.on_training_single_iteration_start()
        with rec.forward():
            loss = model(x).sum()
        if i == FAIL_AT and scenario == "user_error_in_flight":
            comm_monitor(telemetry).begin("all_to_all", 64)  # launched, never completed: the user's error first
            raise ValueError("the user's own error")
        with rec.backward():
            loss.backward()
        rec.on_training_single_iteration_end()
    rec.on_train_end()
    rec.on_app_end()


if __name__ == "__main__":
    main()
