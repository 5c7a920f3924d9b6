"""A small real training job instrumented with telemetrain, as a user would write it.

The model predicts the next character of Python source code (the standard library's own, see ``data``): an
embedding, a one-layer GRU and a linear head, about 47k parameters, trained with AdamW on a warmup + cosine
schedule. It runs on the CPU in seconds and learns visibly (validation loss falls from ~4.5 nats per character to
~1.6 in the default 800 steps).

Instrumentation uses the compatible APIs unchanged (``from telemetrain import metrics, events, monitor``:
torchelastic's ``put_metric``, ``@prof``, ``record(Event(...))`` and torch.monitor's ``Stat``) next to the native
``Telemetry.log`` / ``Telemetry.metric`` / ``Telemetry.event`` and windowed ``Stat``s with percentiles.

This module imports torch: only ``telemetrain demo`` imports it, never ``import telemetrain``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

with warnings.catch_warnings():
    # A torch without numpy warns as it loads, once per process (each rank, each attempt); the demo never uses numpy
    # (the [demo] extra installs it anyway: torch is whole then).
    warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

import telemetrain
from telemetrain import events, metrics, monitor
from telemetrain.stats import Gauge, Stat
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

from .data import VOCAB, CharWindows, decode, encode, load_corpus

__all__ = ["CharGRU", "DemoConfig", "DemoResult", "evaluate", "train_step"]  # (and run_demo, from session)

CHECKPOINT_NAME = "checkpoint.pt"


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Hyperparameters; all of them go into the run's ``run.json`` as its config."""

    steps: int = 800
    seed: int = 0
    batch_size: int = 64
    context: int = 32
    embed_dim: int = 24
    hidden_dim: int = 96
    lr: float = 3e-3
    min_lr: float = 3e-4
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    val_fraction: float = 0.1
    eval_batches: int = 16  # a fixed slice of the validation set, so evaluations are cheap and comparable
    evals: int = 5  # evaluations during training, besides the one before the first step
    # One intra-op thread: the matrices are too small for more to pay, a shared CPU then cannot stall the demo
    # (spinning OpenMP threads can), and results do not depend on the machine's core count.
    threads: int = 1

    @property
    def warmup_steps(self) -> int:
        return max(1, min(50, self.steps // 10))


@dataclasses.dataclass
class DemoResult:
    run_dir: Path
    steps: int
    seconds: float
    val_loss: float
    val_accuracy: float
    checkpoint: Path
    sample: str


class CharGRU(nn.Module):
    """Next-character logits at every position of a ``(batch, time)`` tensor of character ids."""

    def __init__(self, vocab_size: int, embed_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.rnn = nn.GRU(embed_dim, hidden_dim, batch_first=True)
        self.head = nn.Linear(hidden_dim, vocab_size)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        out, h = self.rnn(self.embed(x), h)
        return self.head(out), h


def lr_factor(step: int, cfg: DemoConfig) -> float:
    """Linear warmup, then cosine decay from ``lr`` to ``min_lr`` (as a factor of ``lr``, for ``LambdaLR``)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    floor = cfg.min_lr / cfg.lr
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


# Module-level functions, so @prof names them "train.train_step" and "train.evaluate" (torchelastic's rule).


@metrics.prof(group="demo")
def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    x: torch.Tensor,
    y: torch.Tensor,
    grad_clip: float,
    recorder: TrainingRecorder | None = None,
) -> tuple[float, float]:
    """One optimisation step; returns (loss, gradient norm before clipping) as Python floats. With a recorder, its
    phases are sub-spans of the iteration (forward, zero_grad, backward, optimizer update)."""
    with _phase(recorder, "forward"):
        logits, _ = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    with _phase(recorder, "zero_grad"):
        optimizer.zero_grad(set_to_none=True)
    with _phase(recorder, "backward"):
        loss.backward()  # type: ignore[no-untyped-call]  # torch's own annotation gap
    with _phase(recorder, "optimizer_update"):
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        scheduler.step()
    # .item() syncs with the device; on the CPU that costs nothing, and the demo wants the numbers.
    return loss.item(), grad_norm.item()


def _phase(recorder: TrainingRecorder | None, name: str) -> Any:
    return contextlib.nullcontext() if recorder is None else getattr(recorder, name)()


@metrics.prof(group="demo")
def evaluate(
    model: nn.Module, loader: DataLoader[Any], max_batches: int, recorder: TrainingRecorder | None = None
) -> tuple[float, float]:
    """Mean loss (nats per character) and next-character accuracy on the first ``max_batches`` batches."""
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for i, (x, y) in enumerate(loader):
            if i >= max_batches:
                break
            if recorder is not None:
                recorder.on_validation_single_iteration_start()
            logits, _ = model(x)
            total_loss += nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum"
            ).item()
            correct += int((logits.argmax(-1) == y).sum())
            count += y.numel()
            if recorder is not None:
                recorder.on_validation_single_iteration_end()
    model.train()
    return total_loss / count, correct / count


def sample_text(model: CharGRU, prompt: str, length: int, seed: int, temperature: float = 0.8) -> str:
    """Continue ``prompt`` by sampling; a glance at what the model learned."""
    gen = torch.Generator().manual_seed(seed)
    model.eval()
    ids = encode(prompt)
    with torch.no_grad():
        logits, h = model(torch.tensor([ids]))
        out: list[int] = []
        for _ in range(length):
            probs = torch.softmax(logits[0, -1] / temperature, dim=-1)
            nxt = int(torch.multinomial(probs, 1, generator=gen))
            out.append(nxt)
            logits, h = model(torch.tensor([[nxt]]), h)
    model.train()
    return prompt + decode(out)


def _batches(loader: DataLoader[Any]) -> Iterator[tuple[int, Any]]:
    """(epoch, batch) forever; each new epoch reshuffles from the loader's seeded generator."""
    epoch = 0
    while True:
        for batch in loader:
            yield epoch, batch
        epoch += 1


def _loop(
    cfg: DemoConfig,
    t: telemetrain.Telemetry,
    run_dir: Path,
    started: float,
    out: TextIO,
    resume: Path | None = None,
    crash_at: int | None = None,
) -> DemoResult:
    # the training lifecycle (one-logger's model): application > init phases > training loop > iterations >
    # data loading / forward / backward / optimizer; validation loops; checkpoint saves
    report_every = max(1, cfg.steps // 10)
    rec = TrainingRecorder(
        TrainingTelemetryConfig(
            global_batch_size_or_fn=cfg.batch_size,
            seq_length_or_fn=cfg.context,
            perf_tag_or_fn="telemetrain-demo",
            log_every_n_train_iterations=report_every,
            train_iterations_target_or_fn=cfg.steps,
        ),
        telemetry=t,
    )
    rec.on_app_start()
    try:
        return _lifecycle(cfg, t, rec, run_dir, started, out, report_every, resume, crash_at)
    except BaseException as exc:  # a peer rank died mid all-reduce, say: the spans end as failed, not finished
        rec.on_exception(exc)
        raise
    finally:
        rec.on_app_end()


def _lifecycle(
    cfg: DemoConfig,
    t: telemetrain.Telemetry,
    rec: TrainingRecorder,
    run_dir: Path,
    started: float,
    out: TextIO,
    report_every: int,
    resume: Path | None = None,
    crash_at: int | None = None,
) -> DemoResult:
    torch.manual_seed(cfg.seed)
    rec.on_dataloader_init_start()
    text, modules = load_corpus()
    ids = torch.tensor(encode(text), dtype=torch.long)
    split = int(len(ids) * (1 - cfg.val_fraction))  # contiguous split: no window straddles train and validation
    train_set = CharWindows(ids[:split], cfg.context)
    val_set = CharWindows(ids[split:], cfg.context, stride=cfg.context)
    rank, world = _rank_and_world()
    loader = DataLoader(
        train_set,
        batch_size=cfg.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=0,
        generator=torch.Generator().manual_seed(cfg.seed + rank),  # each rank its own order of the data
    )
    val_loader = DataLoader(val_set, batch_size=cfg.batch_size, shuffle=False, num_workers=0)
    rec.on_dataloader_init_end()

    rec.on_model_init_start()
    net = CharGRU(len(VOCAB), cfg.embed_dim, cfg.hidden_dim)  # the same initial weights on every rank (seeded)
    params = sum(p.numel() for p in net.parameters())
    model: nn.Module = net
    if world > 1:  # data parallel over the launcher's gloo ranks: gradients are averaged in backward
        model = nn.parallel.DistributedDataParallel(net)
    rec.on_model_init_end()
    rec.on_optimizer_init_start()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    rec.on_optimizer_init_end()
    start_step = 0
    if resume is not None:  # a restart: the last checkpoint of the attempt before
        rec.on_load_checkpoint_start()
        state = torch.load(resume, weights_only=True)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_step = int(state["step"])
        rec.on_load_checkpoint_end(path=resume)
        print(f"restart: resumed from the checkpoint of step {start_step} ({resume})", file=out, flush=True)
    t.event(
        "data.loaded",
        {"modules": modules, "chars": len(text), "train_windows": len(train_set), "val_windows": len(val_set)},
    )
    print(
        f"telemetrain demo: next-character GRU ({params:,} parameters) on {len(text):,} characters of Python "
        f"source ({', '.join(modules)}); {cfg.steps} steps of batch {cfg.batch_size}"
        + (f" on each of {world} ranks" if world > 1 else ""),
        file=out,
    )
    print(f"writing the run to {run_dir}", file=out, flush=True)

    eval_every = max(1, math.ceil(cfg.steps / cfg.evals))
    # windowed stats: exact percentiles per window of steps, and a torch.monitor stat closed every 2 s on time
    step_time = Stat(
        "train.step_time", ["count", "mean", "p50", "p90", "p99", "max"], samples=report_every, unit="s", telemetry=t
    )
    data_wait = Stat("train.data_wait", ["mean", "p99", "max"], samples=report_every, unit="s", telemetry=t)
    # (a name of its own: train.loss is the per-step metric, and a backend such as Prometheus has one series a name)
    loss_stat = monitor.Stat("train.loss_2s", [monitor.MEAN, monitor.MIN, monitor.VALUE], 2.0, telemetry=t)
    rss = Gauge("process.max_rss", _max_rss_bytes, unit="By", interval=1.0, telemetry=t)  # UCUM, as every unit
    width = len(str(cfg.steps))
    best = math.inf
    # the model as it starts: step 0, or the checkpoint's step on a restart (the curve must not go back to step 0)
    val_loss, val_acc = _evaluate_and_record(t, net, val_loader, cfg, step=start_step, recorder=rec)
    print(f"  eval at step {start_step}: val loss {val_loss:.4f}  accuracy {val_acc:.1%}", file=out, flush=True)
    window_loss, window_samples, window_time = 0.0, 0, 0.0
    step = start_step
    batches = _batches(loader)
    for _ in range(start_step):  # the data position the checkpoint was at (same seed, same order)
        next(batches)
    checkpoint_every = max(1, cfg.steps // 4)
    rec.on_train_start(train_iterations_start=start_step)
    while step < cfg.steps:
        if crash_at is not None and step >= crash_at:
            # At the top of the next iteration, once this step's checkpoint and evaluation are done: the other ranks
            # are then on their way into this iteration's all-reduce, where they see the peer go before the agent,
            # which looks every few seconds, stops them. Said on this process's own stdout (a launched rank other
            # than 0 prints nothing else), before it happens.
            rank, world = _rank_and_world()
            then = ("the elastic agent will log this rank's exit (exitcode -15) and restart the job" if world > 1
                    else "the next attempt resumes from the last checkpoint")
            print(f"{f'[rank {rank}] ' if world > 1 else ''}step {step}: SIGTERM (simulated preemption), as planned; "
                  f"{then}", file=sys.stdout, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)  # telemetrain flushes, ends open spans as terminated, re-raises
            time.sleep(5)  # the signal arrives at the next bytecode; never reached
        tick = time.perf_counter()
        rec.on_training_single_iteration_start()
        with data_wait.time(), rec.data_loading():
            epoch, (x, y) = next(batches)
        lr = float(scheduler.get_last_lr()[0])  # the rate this step uses
        loss, grad_norm = train_step(model, optimizer, scheduler, x, y, cfg.grad_clip, rec)
        rec.on_training_single_iteration_end()
        elapsed = time.perf_counter() - tick
        step_time.add(elapsed)
        loss_stat.add(loss)
        step += 1
        samples_per_s = len(x) / elapsed if elapsed > 0 else 0.0
        # the model's own numbers at the iteration's global step (zero-based, as the recorder's current_iteration:
        # the report charts them by step), then torchelastic's API
        t.log({"train.loss": loss, "train.lr": lr, "train.grad_norm": grad_norm}, step=step - 1, group="train")
        metrics.put_metric("train.samples_per_s", samples_per_s, "train")
        metrics.put_metric("train.epoch", epoch, "train")
        window_loss += loss * len(x)
        window_samples += len(x)
        window_time += elapsed
        if step % report_every == 0 or step == cfg.steps:
            times = step_time.get()  # the window that closed at this step
            print(
                f"step {step:>{width}}/{cfg.steps}  loss {window_loss / window_samples:.4f}  "
                f"{window_samples / window_time:,.0f} samples/s  lr {lr:.2e}  "
                f"step p50 {times.get('p50', 0) * 1e3:.1f} ms p99 {times.get('p99', 0) * 1e3:.1f} ms",
                file=out,
                flush=True,
            )
            window_loss, window_samples, window_time = 0.0, 0, 0.0
        if step % checkpoint_every == 0 and step < cfg.steps:
            rec.on_save_checkpoint_start(step)
            path = _save_checkpoint(net, optimizer, cfg, step, run_dir, scheduler)
            rec.on_save_checkpoint_success(step, path=path)
            rec.on_save_checkpoint_end(path=path)
        if step % eval_every == 0 or step == cfg.steps:
            val_loss, val_acc = _evaluate_and_record(t, net, val_loader, cfg, step, recorder=rec)
            if val_loss < best:
                best = val_loss
                t.event("val.new_best", {"step": step, "val_loss": val_loss})
            print(f"  eval at step {step}: val loss {val_loss:.4f}  accuracy {val_acc:.1%}", file=out, flush=True)

    for stat in (step_time, data_wait, loss_stat):
        stat.close()  # report what is open now (closing the Telemetry would too)
    rss.close()
    rec.on_save_checkpoint_start(step)
    checkpoint = _save_checkpoint(net, optimizer, cfg, step, run_dir, scheduler)
    rec.on_save_checkpoint_success(step, path=checkpoint)
    rec.on_save_checkpoint_end(path=checkpoint)
    rec.on_train_end()
    sample = sample_text(net, "def ", 120, cfg.seed)
    t.event("demo.sample", {"step": step, "text": sample})
    return DemoResult(run_dir, step, time.perf_counter() - started, val_loss, val_acc, checkpoint, sample)


def _max_rss_bytes() -> int | None:
    """Peak resident memory of this process (a gauge read by the collector thread); None where unknown."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _evaluate_and_record(
    t: telemetrain.Telemetry,
    model: nn.Module,
    loader: DataLoader[Any],
    cfg: DemoConfig,
    step: int,
    recorder: TrainingRecorder | None = None,
) -> tuple[float, float]:
    if recorder is not None:
        recorder.on_validation_start()
    try:
        val_loss, val_acc = evaluate(model, loader, cfg.eval_batches, recorder)
    finally:
        if recorder is not None:
            recorder.on_validation_end()
    t.metric("val.loss", val_loss, "val", unit="{nat}", step=step)
    t.metric("val.accuracy", val_acc, "val", unit="1", step=step)
    events.record(
        events.Event(
            name="demo.evaluation",
            source=events.EventSource.WORKER,
            metadata={"step": step, "val_loss": val_loss, "val_accuracy": val_acc},
        )
    )
    return val_loss, val_acc


def _rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size when the launcher started it with a process group, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _save_checkpoint(
    model: CharGRU,
    optimizer: torch.optim.Optimizer,
    cfg: DemoConfig,
    step: int,
    run_dir: Path,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> Path:
    """Rank 0 writes the file (the ranks hold the same weights); every rank waits for it, so each rank's save span
    covers the save."""
    run_dir.mkdir(parents=True, exist_ok=True)  # the store creates it on its first write, which may still be queued
    path = run_dir / CHECKPOINT_NAME
    tick = time.perf_counter()
    rank, world = _rank_and_world()
    if rank != 0:
        import torch.distributed as dist

        dist.barrier()
        return path
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else {},
            "step": step,
            "config": dataclasses.asdict(cfg),
            "vocab": VOCAB,
        },
        path.with_suffix(".tmp"),
    )
    os.replace(path.with_suffix(".tmp"), path)  # a rank killed mid-save never leaves a torn checkpoint to resume from
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    events.record(
        events.Event(
            name="demo.checkpoint",
            source=events.EventSource.WORKER,
            metadata={
                "step": step,
                "path": str(path),
                "bytes": path.stat().st_size,
                "seconds": round(time.perf_counter() - tick, 4),
            },
        )
    )
    return path


def __getattr__(name: str) -> Any:
    if name == "run_demo":  # moved to session (which imports this module): still importable from here
        from .session import run_demo

        return run_demo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
