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

``TelemetrainLogger`` alone gets no hook with the Trainer, so it agrees at the Trainer's first use of it once the
process group is up (``calling_trainer``: the Trainer found up the stack, through Lightning's own frames only). That
use is on every rank: the profiler's ``trainer.log_dir`` right after the group is made (it reads the first logger's
``save_dir``), else the ``logger.experiment`` that ``setup`` reads. A use from other code (a user's hook, as
``prepare_data`` on local rank 0 only; Fabric) adopts nothing: a collective there would wait for the other ranks.
"""

from __future__ import annotations

import os
from types import FrameType
from typing import Any

from ..identity import Identity
from ..telemetry import Telemetry

__all__ = ["LAUNCHER_RANK_VARIABLES", "adopt_trainer_ranks", "calling_trainer"]

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


def calling_trainer(frame: FrameType | None, depth: int = 12) -> Any | None:
    """The Lightning ``Trainer`` calling, from its own code, the logger whose frame is ``frame``: found in a frame of
    Lightning's (its ``self``, or a ``trainer`` argument), walking up through the logger's and Lightning's frames
    only. A frame of other code (a hook of the user's: ``prepare_data`` runs on one rank) ends the walk with None:
    Lightning calls a hook with the Trainer up the stack, but what a hook does is no Trainer call. This is how a
    logger, which Lightning never hands the Trainer, knows Lightning is calling it."""
    while frame is not None and depth > 0:
        module = str(frame.f_globals.get("__name__", ""))
        if module.split(".")[0] in _LIGHTNING:
            for name in ("self", "trainer"):
                value = frame.f_locals.get(name)
                if value is not None and _is_trainer(value):
                    return value
        elif module != _LOGGER_MODULE:
            return None
        frame, depth = frame.f_back, depth - 1
    return None


_LIGHTNING = ("lightning", "pytorch_lightning")
_LOGGER_MODULE = __name__.rsplit(".", 1)[0] + ".lightning_logger"


def _is_trainer(value: Any) -> bool:
    return any(c.__name__ == "Trainer" and c.__module__.split(".")[0] in _LIGHTNING for c in type(value).__mro__)
