"""A data-parallel training loop to run under the launcher:

    telemetrain launch --nproc-per-node 2 examples/launch_ddp.py --steps 300

Each rank trains a small MLP on synthetic data with DistributedDataParallel over gloo (CPU), instrumented with
telemetrain's training lifecycle (nv-one-logger's model). The launcher puts the elastic agent's telemetry in the same
run folder and turns on cross-rank aggregation; ``--slow-rank R`` makes rank R slow in data loading, so the run
shows a ``straggler`` event naming it (``telemetrain show`` / ``telemetrain report``). Each rank logs its loss every
step (``train.loss``, as the demo does: the report's loss chart, one line per rank when they differ).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn

import telemetrain
from telemetrain import training


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--slow-rank", type=int, default=-1, help="this rank sleeps 20 ms in data loading")
    args = parser.parse_args()

    with training.application():
        with training.distributed_init():
            dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, ...
        rank, world = dist.get_rank(), dist.get_world_size()
        training.configure(training.TrainingTelemetryConfig(
            global_batch_size_or_fn=args.batch_size * world, perf_tag_or_fn="launch_ddp",
            log_every_n_train_iterations=25, train_iterations_target_or_fn=args.steps))
        with training.model_init():
            torch.manual_seed(0)  # the same initial weights on every rank
            model = nn.parallel.DistributedDataParallel(
                nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
        with training.optimizer_init():
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(rank)  # each rank its own data
        with training.training_loop(train_iterations_start=0):
            for step in range(args.steps):
                with training.training_iteration():
                    with training.data_loading():
                        if rank == args.slow_rank:
                            time.sleep(0.02)
                        x = torch.randn(args.batch_size, 64, generator=gen)
                        y = torch.randint(0, 10, (args.batch_size,), generator=gen)
                    with training.forward():
                        loss = nn.functional.cross_entropy(model(x), y)
                    with training.zero_grad():
                        optimizer.zero_grad(set_to_none=True)
                    with training.backward():
                        loss.backward()
                    with training.optimizer_update():
                        optimizer.step()
                # at the iteration's step (zero-based, as the recorder counts): the report charts it by step;
                # telemetrain takes numbers, not tensors: .item() is the caller's (it waits for a GPU; here a CPU)
                telemetrain.log({"train.loss": loss.item()}, step=step, group="train")
        if rank == 0:
            print(f"rank 0: final loss {loss.item():.4f} after {args.steps} steps on {world} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
