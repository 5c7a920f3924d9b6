"""A demo session (``run_demo``): the Telemetry each attempt of the training job in ``train`` runs under (its
backends, the system sampler, the cross-rank aggregator when launched), and the preemption scenario -- a first
attempt in its own process, sent SIGTERM at 60% of the steps, then the restart from its last checkpoint, in the same
session. ``worker`` runs one launched rank's attempt through ``_run``.

This module imports torch (through ``train``, which silences a numpy-less torch's warning as it loads). ``_train``
is one attempt: its ``demo.start`` and ``demo.end`` events around the training loop.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path
from typing import TextIO

import telemetrain
from telemetrain import events

from .backends import Backends, attach
from .train import CHECKPOINT_NAME, DemoConfig, DemoResult, _loop

__all__ = ["run_demo"]


def _demo_identity() -> telemetrain.Identity:
    # The entry point's name ("telemetrain", "cli") would be the perf_tag; demo runs should compare with each other.
    if os.environ.get("TELEMETRAIN_PERF_TAG"):
        return telemetrain.identity_from_env()
    return telemetrain.identity_from_env(perf_tag="telemetrain-demo")


def run_demo(
    cfg: DemoConfig,
    *,
    root: str | os.PathLike[str],
    console: bool = False,
    out: TextIO | None = None,
    crash: bool = True,
    backends: Backends | None = None,
) -> DemoResult:
    """Train, writing the runs under ``root``; progress goes to ``out`` (stdout).

    With ``crash`` (the default, from 8 steps), the job is preempted once, as a scheduler does it: a first process
    trains, saving a checkpoint every quarter of the steps, and is sent SIGTERM at 60% of the steps; a second one --
    the restart, in the same session, restart_count 1 -- loads the last checkpoint and finishes. Goodput then shows
    the iterations lost between that checkpoint and the preemption."""
    out = out or sys.stdout
    backends = backends or Backends()
    result = _attempts(cfg, root, console, out, crash, backends)
    if backends.trace is not None:  # the whole session (both attempts) as one timeline
        from ..trace import export_trace

        written = export_trace(result.run_dir.parent, backends.trace)
        print(f"trace: {written.path} ({written.events} events): open it in https://ui.perfetto.dev", file=out)
    return result


def _attempts(
    cfg: DemoConfig, root: str | os.PathLike[str], console: bool, out: TextIO, crash: bool, backends: Backends
) -> DemoResult:
    identity = _demo_identity()
    if crash and cfg.steps >= 8:
        crash_at = max(2, cfg.steps * 6 // 10)
        first = identity.replace(run_id=f"{identity.session_tag}-a0", restart_count=0)
        print(f"attempt 1 (a separate process) will be preempted with SIGTERM at step {crash_at}", file=out, flush=True)
        out.flush()
        ctx = multiprocessing.get_context("spawn")
        child = ctx.Process(target=_preempted_attempt,
                            args=(cfg, os.fspath(root), first, crash_at, console, backends))
        child.start()
        child.join()
        print(f"attempt 1 ended by signal {-(child.exitcode or 0)} (SIGTERM = {int(signal.SIGTERM)}); restarting from "
              "its last checkpoint", file=out, flush=True)
        resume = Path(root) / first.session_tag / first.run_id / CHECKPOINT_NAME
        identity = identity.replace(run_id=f"{identity.session_tag}-a1", restart_count=1)
        return _run(cfg, identity, root, console, out, resume if resume.exists() else None, None, backends)
    return _run(cfg, identity, root, console, out, None, None, backends)


def _preempted_attempt(
    cfg: DemoConfig, root: str, identity: telemetrain.Identity, crash_at: int, console: bool, backends: Backends
) -> None:
    """The first attempt, in its own process: trains until ``crash_at``, where it is sent SIGTERM."""
    _run(cfg, identity, root, console, sys.stdout, None, crash_at, backends)


def _run(
    cfg: DemoConfig,
    identity: telemetrain.Identity,
    root: str | os.PathLike[str],
    console: bool,
    out: TextIO,
    resume: Path | None,
    crash_at: int | None,
    backends: Backends | None = None,
) -> DemoResult:
    config = dataclasses.asdict(cfg) | {"warmup_steps": cfg.warmup_steps, "model": "CharGRU", "optimizer": "AdamW"}
    t = telemetrain.Telemetry(identity, store=root, console=console, config=config)
    previous = telemetrain.set_telemetry(t)  # metrics.* and events.* now go to t
    if backends is not None and backends.any_sink:
        attach(t, backends, out)
    _start_system_sampler(t, out)  # stopped, with a last sample, when t closes (SIGTERM included)
    if t.identity.world_size > 1:  # under `telemetrain launch`: the ranks compare their windows (docs/distributed.md)
        from ..distributed.cross_rank import enable_from_env

        enable_from_env(t)
    import torch  # (loaded by .train already, under its warnings filter: an import here would be outside it)

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, t, out, resume, crash_at)
    finally:
        torch.set_num_threads(previous_threads)
        t.close()
        # Leave the process as we found it (main() may be called in-process, e.g. by tests).
        if previous is None:
            telemetrain.reset()
        else:
            telemetrain.set_telemetry(previous)


def _start_system_sampler(t: telemetrain.Telemetry, out: TextIO) -> None:
    """CPU, memory, process tree, GPU and allocator samples every second (a demo run is short)."""
    try:
        from telemetrain.system import start_sampler
    except ImportError as exc:  # psutil missing: the demo runs without system metrics
        print(f"note: no system metrics: {exc}", file=out)
        return
    start_sampler(t, interval=1.0)


def _train(
    cfg: DemoConfig, t: telemetrain.Telemetry, out: TextIO, resume: Path | None = None, crash_at: int | None = None
) -> DemoResult:
    import torch  # (loaded by .train already)

    run_dir = t.run_dir
    assert run_dir is not None  # built with a store
    started = time.perf_counter()
    events.record(
        events.Event(
            name="demo.start",
            source=events.EventSource.WORKER,
            metadata={
                "steps": cfg.steps,
                "seed": cfg.seed,
                "torch": str(torch.__version__),
                "threads": torch.get_num_threads(),
            },
        )
    )
    try:
        result = _loop(cfg, t, run_dir, started, out, resume, crash_at)
    except BaseException as exc:
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        events.record(
            events.Event(
                name="demo.end",
                source=events.EventSource.WORKER,
                metadata={"status": status, "error": f"{type(exc).__name__}: {exc}"[:300]},
            )
        )
        raise
    events.record(
        events.Event(
            name="demo.end",
            source=events.EventSource.WORKER,
            metadata={
                "status": "ok",
                "steps": result.steps,
                "seconds": round(result.seconds, 3),
                "val_loss": result.val_loss,
                "val_accuracy": result.val_accuracy,
            },
        )
    )
    return result
