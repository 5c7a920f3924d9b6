"""Lightning's own DDP launcher: one run, with the Trainer's ranks.

Under ``Trainer(strategy="ddp", devices=N)`` started by a plain ``python train.py``, Lightning's
``_SubprocessScriptLauncher`` re-runs the script as children at ``trainer.fit``, before any callback hook, with only
``LOCAL_RANK``/``WORLD_SIZE``/``NODE_RANK``/``MASTER_*`` in their environment (no ``RANK``: the global rank is given
to ``init_process_group``). ``identity_from_env`` then makes every process a rank 0 of a run of its own.

Lightning offers no hook before the launch (only a global patch of the launcher would), so the ranks agree at the
callback's first ``setup``, the first hook, run by every rank once the process group is up and before this
integration records anything: rank 0's run id and session tag are broadcast (``strategy.broadcast``, as Lightning's
own ``ModelCheckpoint.setup`` does with its directory), and each rank takes its ranks and world size from the
Trainer. Nothing is exported to the environment, so later subprocesses of a job never join its run. Whether to
broadcast is decided alike on every rank (a collective that one rank skips would hang the others): only when no
launcher named the ranks (no ``RANK``, ``SLURM_PROCID`` or ``OMPI_COMM_WORLD_RANK``), so torchrun, SLURM and
``telemetrain launch`` jobs are left as they were.
"""

from __future__ import annotations

import os
from typing import Any

from ..identity import Identity
from ..telemetry import Telemetry

__all__ = ["LAUNCHER_RANK_VARIABLES", "adopt_trainer_ranks"]

LAUNCHER_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")  # what identity_from_env reads a rank from


def adopt_trainer_ranks(trainer: Any, telemetry: Telemetry) -> Identity | None:
    """Give ``telemetry`` the Trainer's ranks and rank 0's run, when the processes were started by Lightning itself
    (``world_size`` > 1, no launcher rank variable). A collective on every rank then: call it on all ranks at the
    same hook. Returns the identity installed, or None when there was nothing to do."""
    world_size = int(trainer.world_size)
    if world_size <= 1 or any(os.environ.get(name) for name in LAUNCHER_RANK_VARIABLES):
        return None
    own = telemetry.identity
    run_id, session_tag = trainer.strategy.broadcast((own.run_id, own.session_tag), src=0)
    return telemetry.set_identity(
        run_id=run_id,
        session_tag=session_tag,
        rank=int(trainer.global_rank),
        local_rank=int(trainer.local_rank),
        world_size=world_size,
        group_rank=int(getattr(trainer, "node_rank", 0) or 0),
    )
