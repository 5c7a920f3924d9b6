"""A small real training job with problems planted through the environment, for the planted-problem suite
(``tests/test_findings_planted.py``) and the calibration (``bench/bench_findings.py``).

Run alone (one process) or under ``telemetrain launch`` (DDP over gloo, CPU). It records the lifecycle with a
``TrainingRecorder`` (phases timed), the loss and gradient norm each step, checkpoints and validation, and samples
the system every ``SAMPLER_S`` seconds. Planted (all optional):

- ``SLOW_FROM``/``SLOW_FACTOR``: from that step every rank does each phase's work that many times (job-wide);
- ``STRAGGLERS``: ``rank:phase:amount,...``: that rank does ``amount`` extra forward passes (``forward``) or sleeps
  ``amount`` seconds while loading data (``dataloader``), every step;
- ``LEAK_MB``: MiB kept alive per step (a leak);
- ``SPIKE_AT``: the batch of that step is scaled 30x (a real loss and gradient spike); ``NAN_AT``: that batch holds a
  NaN (loss and gradient norm NaN; the optimizer step is skipped, as a gradient scaler does);
- ``CKPT_EVERY``/``CKPT_SLOW_S``: save every N steps, each save taking that much longer (a slow filesystem);
  ``CKPT_SLOW_RANK``: ``rank:seconds``: that rank's saves alone take that much longer (its storage), and the ranks
  meet at a barrier after their save spans (every rank saving its share) rather than inside them;
- ``VAL_EVERY``: a short validation loop every N steps;
- ``HOG_AT``/``HOG_PROCS``/``HOG_S``: at that step (rank 0) start that many busy processes for that many seconds;
- ``CRASH_AT``: rank 0 SIGKILLs itself at that step in the first attempt (with ``--max-restarts`` the job restarts
  from its last checkpoint).
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time

import torch

from telemetrain import get_telemetry
from telemetrain.system import start_sampler
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

DIM, BATCH = 256, 64


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def main() -> None:
    steps, log_every = env_int("STEPS", 600), env_int("LOG_EVERY", 10)
    slow_from, slow_factor = env_int("SLOW_FROM", -1), env_int("SLOW_FACTOR", 1)
    leak_mb, spike_at, nan_at = env_int("LEAK_MB", 0), env_int("SPIKE_AT", -1), env_int("NAN_AT", -1)
    ckpt_every, ckpt_slow = env_int("CKPT_EVERY", 0), env_float("CKPT_SLOW_S", 0.0)
    slow_rank_text, _, slow_rank_seconds = os.environ.get("CKPT_SLOW_RANK", "-1:0").partition(":")
    slow_rank, slow_rank_s = int(slow_rank_text), float(slow_rank_seconds)
    val_every = env_int("VAL_EVERY", 0)
    hog_at, hog_procs, hog_s = env_int("HOG_AT", -1), env_int("HOG_PROCS", 2), env_float("HOG_S", 5.0)
    crash_at = env_int("CRASH_AT", -1)
    attempt = env_int("TORCHELASTIC_RESTART_COUNT", 0)
    stragglers = {}
    for item in filter(None, os.environ.get("STRAGGLERS", "").split(",")):
        rank_s, phase, amount = item.split(":")
        stragglers[int(rank_s)] = (phase, float(amount))

    torch.set_num_threads(1)
    telemetry = get_telemetry()
    start_sampler(telemetry, interval=env_float("SAMPLER_S", 0.25), cuda_allocator=False)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(DIM, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    model: torch.nn.Module = net  # net: the model itself, which DDP wraps when distributed
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.002)
    # planted extra work runs on a copy: the training itself (weights, gradients, loss) is the same in every scenario
    shadow = copy.deepcopy(net)
    shadow_opt = torch.optim.SGD(shadow.parameters(), lr=0.0)
    rec = TrainingRecorder(TrainingTelemetryConfig(
        global_batch_size_or_fn=BATCH * world, perf_tag_or_fn=os.environ.get("PERF_TAG", "planted"),
        log_every_n_train_iterations=log_every, train_iterations_target_or_fn=steps, world_size_or_fn=world,
        is_baseline_run_or_fn=os.environ.get("BASELINE") == "1",
    ), telemetry=telemetry)
    rec.on_app_start()
    ckpt = os.environ.get("CKPT_PATH")
    start = 0
    if ckpt and os.path.exists(ckpt):
        rec.on_load_checkpoint_start()
        state = torch.load(ckpt, weights_only=True)
        net.load_state_dict(state["model"])
        start = int(state["step"])
        rec.on_load_checkpoint_end(path=ckpt)
    generator = torch.Generator().manual_seed(1000 + rank)
    target_w = torch.randn(DIM, 1, generator=torch.Generator().manual_seed(7))
    leak: list[bytearray] = []
    hogs: list[subprocess.Popen[bytes]] = []
    hog_until = 0.0
    rec.on_train_start(train_iterations_start=start)
    for step in range(start, steps):
        if rank == 0 and step == crash_at and attempt == 0:
            telemetry.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 0 and step == hog_at:
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hog_procs)]
            hog_until = time.monotonic() + hog_s
        if hogs and time.monotonic() > hog_until:
            for h in hogs:
                h.kill()
                h.wait()
            hogs = []
        repeat = slow_factor if 0 <= slow_from <= step else 1
        planted = stragglers.get(rank)
        rec.on_training_single_iteration_start()
        with rec.data_loading():
            for _ in range(repeat):
                x = torch.randn(BATCH, DIM, generator=generator)
                y = x @ target_w + 0.1 * torch.randn(BATCH, 1, generator=generator)
            if planted and planted[0] == "dataloader":
                time.sleep(planted[1])
            if step == spike_at:
                x = x * 30
            if step == nan_at:
                x[0, 0] = float("nan")
        with rec.forward():
            extra = (repeat - 1) + (int(planted[1]) if planted and planted[0] == "forward" else 0)
            with torch.no_grad():
                for _ in range(extra):
                    shadow(x)
            loss = (model(x) - y).pow(2).mean()
        with rec.backward():
            for _ in range(repeat - 1):
                (shadow(x) - y).pow(2).mean().backward()
            loss.backward()
        with rec.optimizer_update():
            # clipped, as real training is: a spike is seen (the norm before clipping) and survived
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)
            for _ in range(repeat - 1):
                torch.nn.utils.clip_grad_norm_(shadow.parameters(), 100.0)
                shadow_opt.step()
            shadow_opt.zero_grad()
            if torch.isfinite(grad_norm):  # a non-finite step is skipped, as a gradient scaler does
                opt.step()
            opt.zero_grad()
        rec.on_training_single_iteration_end()
        telemetry.metric("train.loss", float(loss.detach()), "train", step=step)
        telemetry.metric("train.grad_norm", float(grad_norm), "train", step=step)
        if leak_mb:
            leak.append(bytearray(os.urandom(16)) * (leak_mb * 2**16))  # written, so resident
        if val_every and (step + 1) % val_every == 0:
            rec.on_validation_start()
            with torch.no_grad():
                for _ in range(5):
                    rec.on_validation_single_iteration_start()
                    model(torch.randn(BATCH, DIM, generator=generator))
                    rec.on_validation_single_iteration_end()
            rec.on_validation_end()
        if ckpt and ckpt_every and (step + 1) % ckpt_every == 0:
            rec.on_save_checkpoint_start(global_step=step + 1)
            if rank == 0:
                torch.save({"model": net.state_dict(), "step": step + 1}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
            if ckpt_slow:
                time.sleep(ckpt_slow)
            if rank == slow_rank:
                time.sleep(slow_rank_s)
            if distributed and slow_rank < 0:
                dist.barrier()
            rec.on_save_checkpoint_success(global_step=step + 1)
            rec.on_save_checkpoint_end()
            if distributed and slow_rank >= 0:
                dist.barrier()  # (the next collective: the other ranks wait here for the slow one)
    for h in hogs:
        h.kill()
        h.wait()
    rec.on_train_end()
    rec.on_app_end()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
