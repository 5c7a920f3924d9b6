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

from ..store.reader import find_runs

__all__ = ["main"]


def _latest_checkpoint(session_dir: Path, this_run: Path) -> Path | None:
    from .train import CHECKPOINT_NAME

    earlier = [run for run in find_runs(session_dir) if run != this_run and (run / CHECKPOINT_NAME).exists()]
    if not earlier:
        return None
    return max((run / CHECKPOINT_NAME for run in earlier), key=lambda p: p.stat().st_mtime)


def _peer_lost(exc: BaseException) -> bool:
    """gloo's error when a peer process went away mid-collective (read: closed or reset; write: broken pipe)."""
    text = str(exc)
    return any(s in text for s in ("closed by peer", "reset by peer", "Broken pipe"))


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
    # here, not at import: a Ctrl-C while torch loads is then this rank's one line (below), not a traceback
    from .backends import Backends
    from .session import _demo_identity, _run
    from .train import DemoConfig

    world = int(os.environ.get("WORLD_SIZE", "1"))
    import torch.distributed as dist  # here: .train imported torch first, without its numpy warning

    if world > 1:
        dist.init_process_group("gloo")
    identity = _demo_identity()
    rank, attempt = identity.rank, identity.restart_count
    root = Path(args.root)
    session = root / identity.session_tag
    resume = _latest_checkpoint(session, session / identity.run_id) if attempt > 0 else None
    fail_at = args.fail_at if attempt == 0 and rank == world - 1 else None
    out = sys.stdout if rank == 0 else io.StringIO()  # one rank speaks for the job (the CLI announced the plan)
    backends = Backends(prometheus=args.prometheus, otel=args.otel, tensorboard=args.tensorboard,
                        mlflow=args.mlflow)
    cfg = DemoConfig(steps=args.steps, seed=args.seed)
    try:
        result = _run(cfg, identity, root, args.console, out, resume, fail_at, backends)
    except RuntimeError as exc:
        # The planned preemption of the last rank breaks the all-reduce the other ranks are in, unless the agent
        # stops them first: expected, so one line instead of a traceback (the run store has the error).
        if not (args.fail_at is not None and attempt == 0 and _peer_lost(exc)):
            raise
        print(f"[rank {rank}] rank {world - 1}'s planned preemption ended this step's all-reduce "
              f"({type(exc).__name__}: connection closed by peer), as expected: leaving for the agent to restart "
              "the job", flush=True)
        return 1
    if rank == 0:
        print(f"done: {result.steps} steps in {result.seconds:.1f} s, val loss {result.val_loss:.4f}, "
              f"accuracy {result.val_accuracy:.1%}", flush=True)
        print(f"sample: {result.sample!r}", flush=True)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:  # Ctrl-C reaches every rank of the terminal's job: the agent says it once
        raise SystemExit(130) from None
