"""Checkpoint strategies (``nv_one_logger.training_telemetry.api.checkpoint``'s names)."""

from __future__ import annotations

import enum

__all__ = ["CheckPointStrategy", "CheckPointType", "CheckpointStrategy"]


class CheckPointStrategy(str, enum.Enum):
    """How a checkpoint is saved: ``SYNC`` blocks training for the whole save; ``ASYNC`` blocks only to schedule it
    (its success is reported later, when the save is finalised)."""

    SYNC = "sync"
    ASYNC = "async"

    def __str__(self) -> str:
        return self.value


class CheckPointType(str, enum.Enum):
    """Where a checkpoint goes (declared by one-logger, unused by it and by us)."""

    GLOBAL = "global"
    LOCAL = "local"

    def __str__(self) -> str:
        return self.value


CheckpointStrategy = CheckPointStrategy  # telemetrain's earlier spelling
