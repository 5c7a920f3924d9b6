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

``TelemetrainLogger`` alone gets no hook with the Trainer, so it agrees through the process group itself
(``adopt_process_group_ranks``), at its first use once the group is up: Lightning's, on every rank (the profiler's
``trainer.log_dir``, right after the group is made, which reads the first logger's ``save_dir``; else the
``logger.experiment`` that ``setup`` reads on every rank before any user hook but ``prepare_data``).
"""

from __future__ import annotations

import os
from typing import Any

from ..identity import Identity
from ..telemetry import Telemetry

__all__ = ["LAUNCHER_RANK_VARIABLES", "adopt_process_group_ranks", "adopt_trainer_ranks"]

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


def adopt_process_group_ranks(telemetry: Telemetry) -> bool | None:
    """The logger's way (no Trainer at hand): the same agreement through ``torch.distributed``'s default group, as
    Lightning's ``strategy.broadcast`` does it. None while no process group is up (ask again later); else True when
    the identity was replaced, False when there was nothing to do (a collective on every rank when True)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    world_size = dist.get_world_size()
    if world_size <= 1 or any(os.environ.get(name) for name in LAUNCHER_RANK_VARIABLES):
        return False
    own = telemetry.identity
    shared: list[Any] = [(own.run_id, own.session_tag)]
    dist.broadcast_object_list(shared, src=0)
    rank = dist.get_rank()
    # LOCAL_RANK/NODE_RANK: what Lightning's launcher gives its children (LightningEnvironment reads the same);
    # ddp_spawn sets neither, and runs on one node: the local rank is the global one there
    node_rank = int(os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or 0)
    telemetry.set_identity(
        run_id=shared[0][0],
        session_tag=shared[0][1],
        rank=rank,
        local_rank=dist.get_node_local_rank(fallback_rank=rank),
        world_size=world_size,
        group_rank=node_rank,
    )
    return True
