"""``telemetrain demo`` as a multi-rank job: this process becomes the elastic agent of ``telemetrain launch``, which
starts ``telemetrain.demo.worker`` on N gloo ranks. The job id is chosen here so the session folder is known."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TextIO

from ..identity import new_run_id
from ..store.reader import find_runs
from .backends import Backends
from .train import DemoConfig

__all__ = ["LaunchedDemo", "run_launched_demo"]


@dataclasses.dataclass(frozen=True)
class LaunchedDemo:
    status: int  # the launcher's exit status
    session_dir: Path
    runs: list[Path]  # the attempts' run folders, oldest first

    @property
    def run_dir(self) -> Path | None:
        """The last attempt's run."""
        return self.runs[-1] if self.runs else None


def run_launched_demo(
    cfg: DemoConfig, *, root: Path, nproc: int, crash: bool, console: bool, backends: Backends, out: TextIO
) -> LaunchedDemo:
    from ..distributed.launch import environment
    from ..distributed.launch import main as launch

    job = new_run_id()
    fail_at = max(2, cfg.steps * 6 // 10) if crash and cfg.steps >= 8 else None
    argv = [
        "--nproc-per-node", str(nproc), "--max-restarts", "1" if fail_at is not None else "0",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", job,
        "-m", "telemetrain.demo.worker", "--steps", str(cfg.steps), "--seed", str(cfg.seed), "--root", str(root),
    ]
    if fail_at is not None:
        argv += ["--fail-at", str(fail_at)]
    for flag, on in (("--console", console), ("--prometheus", backends.prometheus), ("--otel", backends.otel)):
        if on:
            argv.append(flag)
    if backends.tensorboard is not None:
        argv += ["--tensorboard", backends.tensorboard]
    if backends.mlflow is not None:
        argv += ["--mlflow", backends.mlflow]
    print(f"telemetrain launch --nproc-per-node {nproc}: job {job}, {nproc} gloo rank(s) on this CPU", file=out)
    if fail_at is not None:  # said before it happens, so that what the agent logs then reads as planned
        others = ", sends the other ranks a closing SIGTERM" if nproc > 1 else ""
        print(f"planned: rank {nproc - 1} will be preempted (SIGTERM) at step {fail_at}, as a scheduler would; the "
              f"elastic agent logs its exit (exitcode -15){others} and restarts the job, which resumes from the last "
              "checkpoint", file=out)
    out.flush()
    sys.stdout.flush()
    # the agent's own store beside the workers'; torchrun's default thread count for workers, without its warning
    with environment({"TELEMETRAIN_DIR": str(root)},
                     defaults={"TELEMETRAIN_PERF_TAG": "telemetrain-demo", "OMP_NUM_THREADS": "1"}):
        status = launch(argv)
    session = root / job
    return LaunchedDemo(status, session, find_runs(session))
