"""One rank of ``bench_cross_rank.py`` (started by ``telemetrain launch``): a small DDP training loop recorded by
telemetrain, in one of three modes, writing its per-step timings to ``$BENCH_OUT/rank-<R>.json``.

- ``off``: no cross-rank aggregation (what every peer does: rank 0 logs its own view);
- ``ours``: telemetrain's aggregator, every ``EVERY`` iterations, in its sink thread over its own gloo group;
- ``inline``: the hand-written alternative: ``dist.all_gather_object`` of the same summary on the training thread
  and the training's process group every ``EVERY`` iterations.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist

import telemetrain
from telemetrain.distributed import enable_cross_rank
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig


def main() -> None:
    mode, steps, every = os.environ["MODE"], int(os.environ["STEPS"]), int(os.environ["EVERY"])
    warmup = int(os.environ.get("WARMUP", "100"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = telemetrain.Telemetry(store=os.environ["BENCH_STORE"])
    aggregator = enable_cross_rank(t, every=every) if mode == "ours" else None
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=64 * world, perf_tag_or_fn="bench",
                                                   log_every_n_train_iterations=every), telemetry=t)
    x = torch.randn(64, 256)
    rec.on_app_start()
    rec.on_train_start(train_iterations_start=0)
    times: list[float] = []
    cpu0 = time.process_time()
    for step in range(steps):
        tick = time.perf_counter()
        rec.on_training_single_iteration_start()
        with rec.forward():
            loss = model(x).pow(2).mean()
        with rec.backward():
            loss.backward()
        with rec.optimizer_update():
            opt.step()
            opt.zero_grad()
        rec.on_training_single_iteration_end()
        if mode == "inline" and (step + 1) % every == 0:
            summary = {"step": step, "iteration": sum(times[-every:]) / max(1, len(times[-every:]))}
            gathered: list[object] = [None] * world
            dist.all_gather_object(gathered, summary)
        times.append(time.perf_counter() - tick)
        if step == warmup:
            cpu0 = time.process_time()
    cpu = time.process_time() - cpu0
    rec.on_train_end()
    rec.on_app_end()
    t.close()
    out = {"rank": rank, "mode": mode, "step_s": times[warmup + 1:], "process_cpu_s": cpu,
           "exchanges": aggregator.exchanges if aggregator else 0,
           "exchange_cpu_s": aggregator.cpu_ns / 1e9 if aggregator else 0.0,
           "exchange_wall_s": aggregator.wall_ns / 1e9 if aggregator else 0.0}
    with open(os.path.join(os.environ["BENCH_OUT"], f"rank-{rank}.json"), "w") as fh:
        json.dump(out, fh)
    # every rank done with the group before any tears it down, and DDP's reducer (which holds gloo work) gone before
    # the group: a rank that destroyed its pairs while a loaded peer was still in a collective once took that peer
    # down with "terminate called without an active exception" (SIGABRT)
    dist.barrier()
    del model, opt, loss
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
