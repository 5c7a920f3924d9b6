"""One rank of the launched demo: ``telemetrain demo`` runs ``telemetrain launch --nproc-per-node N -m
telemetrain.demo.worker ...``, and each worker trains its share in data parallel over gloo.

The identity comes from the launcher's environment (job = session, attempt = run). A restarted attempt resumes from
the newest checkpoint an earlier attempt of the session left. With ``--fail-at K`` the last rank of the first
attempt is preempted with SIGTERM at step K: the elastic agent sees the failure, stops the other ranks and restarts
the group, which resumes from that checkpoint; goodput counts the iterations in between as lost.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch.distributed as dist

from ..store.reader import find_runs
from .backends import Backends
from .train import CHECKPOINT_NAME, DemoConfig, _demo_identity, _run

__all__ = ["main"]


def _latest_checkpoint(session_dir: Path, this_run: Path) -> Path | None:
    earlier = [run for run in find_runs(session_dir) if run != this_run and (run / CHECKPOINT_NAME).exists()]
    if not earlier:
        return None
    return max((run / CHECKPOINT_NAME for run in earlier), key=lambda p: p.stat().st_mtime)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m telemetrain.demo.worker")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", required=True)
    parser.add_argument("--fail-at", type=int, default=None)
    parser.add_argument("--console", action="store_true")
    parser.add_argument("--prometheus", action="store_true")
    parser.add_argument("--otel", action="store_true")
    parser.add_argument("--tensorboard")
    parser.add_argument("--mlflow")
    args = parser.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    identity = _demo_identity()
    rank, attempt = identity.rank, identity.restart_count
    root = Path(args.root)
    session = root / identity.session_tag
    resume = _latest_checkpoint(session, session / identity.run_id) if attempt > 0 else None
    fail_at = args.fail_at if attempt == 0 and rank == world - 1 else None
    out = sys.stdout if rank == 0 else io.StringIO()  # one rank speaks for the job
    if fail_at is not None:
        print(f"[rank {rank}] will be preempted (SIGTERM) at step {fail_at}; the agent will restart the job",
              flush=True)
    backends = Backends(prometheus=args.prometheus, otel=args.otel, tensorboard=args.tensorboard,
                        mlflow=args.mlflow)
    cfg = DemoConfig(steps=args.steps, seed=args.seed)
    result = _run(cfg, identity, root, args.console, out, resume, fail_at, backends)
    if rank == 0:
        print(f"done: {result.steps} steps in {result.seconds:.1f} s, val loss {result.val_loss:.4f}, "
              f"accuracy {result.val_accuracy:.1%}", flush=True)
        print(f"sample: {result.sample!r}", flush=True)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
