"""A training worker for the multi-rank tests, started by ``telemetrain launch`` (a real elastic agent, gloo, CPU).

A tiny DDP model trained for ``STEPS`` iterations with the lifecycle recorded by telemetrain's default Telemetry
(identity from torchrun's environment). Behaviour planted through the environment:

- ``SLOW_RANK``/``SLOW_PHASE``/``SLOW_S``: that rank sleeps in that phase (``dataloader``, ``forward`` or
  ``backward``: there after a pipeline's receive, as a stage's own work), from iteration ``SLOW_FROM`` (0);
- ``KILL_RANK``/``KILL_AT``/``KILL_ATTEMPT``: that rank SIGKILLs itself before iteration ``KILL_AT`` of that attempt
  (``TORCHELASTIC_RESTART_COUNT``; -1: every attempt); ``KILL_PHASE=forward``: inside that iteration's forward;
- ``BLOCK_RANK``/``BLOCK_AT``: that rank blocks forever in the forward of iteration ``BLOCK_AT`` (before the
  all-reduce the others then wait in); ``PG_TIMEOUT``: the training process group's timeout in seconds;
- ``COMM=1``: the DDP all-reduce timed by telemetrain's communication hook; ``FSDP=1``: FSDP2 instead of DDP, its
  all-gathers and reduce-scatters timed; ``SKEW_RANK``/``SKEW_NS``: that rank's wall clock reads ``SKEW_NS`` off
  (telemetry's test hook, ``TELEMETRAIN_TEST_CLOCK_SKEW_NS``);
- ``CKPT_DIR``/``CKPT_EVERY``: save a checkpoint every N iterations, and resume from the newest at start;
- ``PAIRS=1``: data parallelism within pairs of ranks (DDP on the pair's ``new_group``), ranks 0..1 also all-reduce
  a scalar on their pair in the optimizer phase, and every rank enters a global barrier there (timed with
  ``COMM=1``): collectives on subgroups, which advance only their members' sequence numbers;
- ``TOPO=pairs``: as ``PAIRS=1`` without the pair's scalar and the global barrier: the pairs never synchronise
  together; ``TOPO=pipeline``: no DDP, a pipeline of send/recv (each rank receives from the one before it in forward
  and from the one after it in backward, timed with ``COMM=1``), no collective over every rank;
- ``NO_DDP=1``: no collectives in the training (each rank trains alone), ``EXIT_RANK``/``EXIT_AT``: that rank leaves
  early (exit 0), ``CROSS_TIMEOUT``: enable cross-rank aggregation in code with this exchange timeout (every
  ``CROSS_EVERY``; ``MIN_SHARE``: the detectors' smallest share of a step that counts);
- ``PIN_CPUS``: rank r runs on the r-th CPU of this comma-separated list (its threads too: set before any starts);
  ``WORK_S``: every rank spins ``WORK_S`` seconds of its own CPU time in forward (work the same on every rank);
  ``BUSY_RANK``/``BUSY_LOOPS``: that rank starts that many busy loops on its CPUs (its children: the same
  scheduling group, where the kernel's autogroups share a CPU fairly between sessions) and runs its training thread
  (only: telemetry's threads keep theirs) at niceness ``NICE`` (0): it waits for a CPU, descheduled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from telemetrain import get_telemetry
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def pipe(telemetry: Any, comm: bool, rank: int, world: int, peer: int, send: bool = False) -> None:
    """One pipeline hand-over with ``peer`` (none past either end): blocking, timed with ``comm``."""
    if not 0 <= peer < world:
        return
    from telemetrain.distributed import collectives

    timed: Any = collectives.using(telemetry) if comm else dist
    buf = torch.ones(64)
    (timed.send if send else timed.recv)(buf, peer)


def main() -> None:
    steps, log_every = env_int("STEPS", 200), env_int("LOG_EVERY", 10)
    slow_rank, slow_phase, slow_s = env_int("SLOW_RANK", -1), os.environ.get("SLOW_PHASE", "dataloader"), float(
        os.environ.get("SLOW_S", "0.01"))
    kill_rank, kill_at, kill_attempt = env_int("KILL_RANK", -1), env_int("KILL_AT", -1), env_int("KILL_ATTEMPT", 0)
    exit_rank, exit_at = env_int("EXIT_RANK", -1), env_int("EXIT_AT", -1)
    ckpt_dir, ckpt_every = os.environ.get("CKPT_DIR"), env_int("CKPT_EVERY", 0)
    no_ddp = os.environ.get("NO_DDP") == "1"
    attempt = env_int("TORCHELASTIC_RESTART_COUNT", 0)
    slow_from, kill_phase = env_int("SLOW_FROM", 0), os.environ.get("KILL_PHASE", "")
    block_rank, block_at = env_int("BLOCK_RANK", -1), env_int("BLOCK_AT", -1)
    comm, fsdp = os.environ.get("COMM") == "1", os.environ.get("FSDP") == "1"
    topo = os.environ.get("TOPO", "")
    no_ddp = no_ddp or topo == "pipeline"
    if env_int("RANK", 0) == env_int("SKEW_RANK", -1):
        os.environ["TELEMETRAIN_TEST_CLOCK_SKEW_NS"] = os.environ["SKEW_NS"]

    if os.environ.get("PIN_CPUS"):
        os.sched_setaffinity(0, {int(os.environ["PIN_CPUS"].split(",")[env_int("RANK", 0)])})
    work_s = float(os.environ.get("WORK_S", "0"))
    telemetry = get_telemetry()
    if os.environ.get("CROSS_TIMEOUT"):
        from telemetrain.distributed import StragglerDetector, enable_cross_rank

        detector = StragglerDetector(min_share=float(os.environ.get("MIN_SHARE", "0.05")))
        enable_cross_rank(telemetry, every=env_int("CROSS_EVERY", 50), timeout_s=float(os.environ["CROSS_TIMEOUT"]),
                          detector=detector)
    timeout = env_int("PG_TIMEOUT", 0)
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout) if timeout else None)  # None: the default
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    model: torch.nn.Module = net
    pair = None  # the DDP group: the default one, or with PAIRS=1 the rank's pair
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from telemetrain.distributed import instrument_fsdp

        mesh = init_device_mesh("cpu", (world,))
        fully_shard(net[0], mesh=mesh)
        fully_shard(model, mesh=mesh)
        instrument_fsdp(model, telemetry=telemetry)
    elif not no_ddp:
        if os.environ.get("PAIRS") == "1" or topo == "pairs":
            pair = [dist.new_group([r, r + 1]) for r in range(0, world, 2)][rank // 2]  # (every rank makes each)
        model = torch.nn.parallel.DistributedDataParallel(model, process_group=pair)
        if comm:
            from telemetrain.distributed import instrument_ddp

            instrument_ddp(model, telemetry=telemetry)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = TrainingRecorder(TrainingTelemetryConfig(
        global_batch_size_or_fn=16 * world, perf_tag_or_fn="dist-test", log_every_n_train_iterations=log_every,
        train_iterations_target_or_fn=steps, world_size_or_fn=world,
    ), telemetry=telemetry)
    rec.on_app_start()
    start = 0
    ckpt = os.path.join(ckpt_dir, "ckpt.pt") if ckpt_dir else None
    if ckpt is not None and os.path.exists(ckpt):
        rec.on_load_checkpoint_start()
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        start = int(state["step"])
        rec.on_load_checkpoint_end(path=ckpt)
    rec.on_train_start(train_iterations_start=start)
    busy = []
    if rank == env_int("BUSY_RANK", -1):
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(env_int("BUSY_LOOPS", 1))]
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), env_int("NICE", 0))
    for step in range(start, steps):
        if rank == kill_rank and step == kill_at and kill_attempt in (-1, attempt) and not kill_phase:
            telemetry.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == exit_rank and step == exit_at:
            rec.on_train_end()
            rec.on_app_end()
            telemetry.close()
            sys.exit(0)
        rec.on_training_single_iteration_start()
        with rec.data_loading():
            if rank == slow_rank and slow_phase == "dataloader" and step >= slow_from:
                time.sleep(slow_s)
            x = torch.randn(16, 32)
        with rec.forward():
            if rank == slow_rank and slow_phase == "forward" and step >= slow_from:
                time.sleep(slow_s)
            spun = time.thread_time()
            while time.thread_time() - spun < work_s:
                pass
            if rank == kill_rank and step == kill_at and kill_phase == "forward" and kill_attempt in (-1, attempt):
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == block_rank and step == block_at:
                while True:  # blocked for good: only a signal ends it
                    time.sleep(3600)
            if topo == "pipeline":
                pipe(telemetry, comm, rank, world, rank - 1)
            loss = model(x).pow(2).mean()
            if topo == "pipeline":
                pipe(telemetry, comm, rank, world, rank + 1, send=True)
        with rec.backward():
            if topo == "pipeline":
                pipe(telemetry, comm, rank, world, rank + 1)
            if rank == slow_rank and slow_phase == "backward" and step >= slow_from:
                time.sleep(slow_s)
            loss.backward()
            if topo == "pipeline":
                pipe(telemetry, comm, rank, world, rank - 1, send=True)
        with rec.optimizer_update():
            opt.step()
            opt.zero_grad()
            if os.environ.get("PAIRS") == "1":
                from telemetrain.distributed import collectives

                timed: Any = collectives.using(telemetry) if comm else dist
                if rank < 2:
                    timed.all_reduce(torch.ones(1), group=pair)
                timed.barrier()
        rec.on_training_single_iteration_end()
        if ckpt is not None and ckpt_every and (step + 1) % ckpt_every == 0:
            rec.on_save_checkpoint_start(global_step=step + 1)
            if rank == 0:
                torch.save({"model": model.state_dict(), "step": step + 1}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
            if not no_ddp:
                dist.barrier()
            rec.on_save_checkpoint_success(global_step=step + 1)
            rec.on_save_checkpoint_end()
    for loop in busy:
        loop.kill()
        loop.wait()
    rec.on_train_end()
    rec.on_app_end()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
