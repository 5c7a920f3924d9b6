"""What ``goodput`` returns: a session's wall time split into productive time and badput by cause, per run and in
total (docs/goodput.md defines each figure)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .goodput_energy import EnergyAccount

__all__ = ["BADPUT_CATEGORIES", "Badput", "GoodputReport", "RunGoodput"]


BADPUT_CATEGORIES = (
    "initialization",
    "checkpoint_load",
    "checkpoint_save",
    "data_wait",
    "lost_progress",
    "validation",
    "idle",
)


@dataclass(frozen=True)
class Badput:
    """Seconds of the session's wall time lost, by cause (docs/goodput.md defines each)."""

    initialization: float = 0.0
    checkpoint_load: float = 0.0
    checkpoint_save: float = 0.0
    data_wait: float = 0.0
    lost_progress: float = 0.0
    validation: float = 0.0
    idle: float = 0.0

    @property
    def total(self) -> float:
        return math.fsum(getattr(self, name) for name in BADPUT_CATEGORIES)

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in BADPUT_CATEGORIES}


@dataclass(frozen=True)
class RunGoodput:
    """One run (restart attempt) of the session, as the chosen rank saw it.

    ``status``: ``finished`` (its training loop ended with status ok), ``crash`` (the loop ended with status error
    or terminated: an exception or an exit; its last iterations were reported at close, so the figures are exact),
    ``interrupted`` (the same, but a Ctrl-C ended it: a KeyboardInterrupt or SIGINT, as the findings say),
    ``killed`` (a SIGTERM ended the loop, a preemption: exact figures too; or the loop never ended: SIGKILL, OOM
    kill, node failure, ``open_loop`` set: the figures stop at its last report and are approximate), ``running``
    (the session's last run, its loop not ended and still being written: the figures so far, its work since its last
    checkpoint not yet lost; ``open_loop`` set), ``no_training`` (the rank never started a training loop in this
    run), ``absent`` (the rank wrote no training lifecycle record in this run).

    Iterations are global and zero-based, as in the recorder's events: the run ran iterations ``first_iteration`` to
    ``last_iteration``; ``checkpointed_iterations`` is the number of global iterations its last successful checkpoint
    holds (``productive_train_iterations`` of the save), ``last_checkpoint_step`` the step that save was given.
    """

    run_id: str
    restart_order: int
    restart_count: int | None
    ranks: tuple[int, ...]
    status: str
    finished: bool
    start_time_sec: float | None
    end_time_sec: float | None
    first_iteration: int | None
    last_iteration: int | None
    last_checkpoint_step: int | None
    checkpointed_iterations: int | None
    productive_iterations: int
    lost_iterations: int
    productive_seconds: float
    data_wait_seconds: float
    lost_seconds: float
    approximate: bool
    notes: tuple[str, ...] = ()
    open_loop: bool = False  # its last training loop never ended (killed before it could, or still running)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["ranks"] = list(self.ranks)
        out["notes"] = list(self.notes)
        return out


@dataclass(frozen=True)
class GoodputReport:
    """Goodput of a session on one rank's timeline. ``productive_seconds + badput.total == wall_seconds`` (up to float
    rounding): every second of the session is counted once."""

    session_tag: str
    session_dir: str
    rank: int
    ranks: tuple[int, ...]
    start_time_sec: float
    end_time_sec: float
    wall_seconds: float
    productive_seconds: float
    productive_iterations: int
    lost_iterations: int
    goodput: float
    badput: Badput
    runs: tuple[RunGoodput, ...]
    approximate: bool
    notes: tuple[str, ...] = ()
    energy: EnergyAccount | None = None  # the session's training-loop energy, all ranks (GPU jobs)

    @property
    def badput_seconds(self) -> float:
        return self.badput.total

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON types only (``json.dumps`` takes it as is)."""
        return {
            "session_tag": self.session_tag,
            "session_dir": self.session_dir,
            "rank": self.rank,
            "ranks": list(self.ranks),
            "start_time_sec": self.start_time_sec,
            "end_time_sec": self.end_time_sec,
            "wall_seconds": self.wall_seconds,
            "productive_seconds": self.productive_seconds,
            "productive_iterations": self.productive_iterations,
            "lost_iterations": self.lost_iterations,
            "goodput": self.goodput,
            "badput_seconds": self.badput_seconds,
            "badput": self.badput.as_dict(),
            "runs": [r.as_dict() for r in self.runs],
            "approximate": self.approximate,
            "notes": list(self.notes),
            **({"energy": self.energy.as_dict()} if self.energy is not None else {}),
        }
