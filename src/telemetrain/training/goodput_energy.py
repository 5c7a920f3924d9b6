"""Energy across restarts: what a session's training loops drew, and how much of it bought lost work.

Each ``training_metrics_update`` of a GPU job carries ``window_energy_J``: the rank's share of its GPUs' energy over
the window (``gpu_report``: a GPU shared by k processes gives each 1/k), so summing over every rank counts each GPU
once. Per training loop, the cumulative energy at each report is known by iterations completed; the energy at the
loop's *kept* iterations (``goodput``'s definition: all of a finished loop, else up to its last checkpoint, and not
what a later run redid) is interpolated between reports, as goodput interpolates seconds. So:

    energy_J     = every loop's energy, every rank, every run of the session
    wasted_J     = the energy past each loop's kept iterations: work lost to a crash or redone after a restart
    productive_J = energy_J - wasted_J

Only the training loops are counted (the windows cover them): energy before the first loop and between runs is in the
system sampler's ``hw.energy``. Loops without energy attributes (a CPU job, energy off) contribute nothing; if no loop
has any, there is no account.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EnergyAccount", "energy_account"]


@dataclass(frozen=True)
class EnergyAccount:
    """Joules of a session's training loops (all ranks, each GPU once); docs/goodput.md, "Energy"."""

    energy_J: float
    productive_J: float
    wasted_J: float
    runs: tuple[tuple[str, float, float], ...]  # (run_id, energy_J, wasted_J) per run, in restart order
    approximate: bool  # a kept or last iteration fell between reports: interpolated

    @property
    def wasted_fraction(self) -> float:
        return self.wasted_J / self.energy_J if self.energy_J > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"energy_J": self.energy_J, "productive_J": self.productive_J, "wasted_J": self.wasted_J,
                "wasted_fraction": self.wasted_fraction, "approximate": self.approximate,
                "runs": [{"run_id": r, "energy_J": e, "wasted_J": w} for r, e, w in self.runs]}


def _at(points: Sequence[tuple[int, float]], n: int) -> tuple[float, bool]:
    """Cumulative joules at ``n`` iterations completed (interpolated between reports, the last value beyond)."""
    if n <= points[0][0]:
        return points[0][1], n == points[0][0]
    for (n0, e0), (n1, e1) in itertools.pairwise(points):
        if n == n1:
            return e1, True
        if n0 < n < n1:
            return e0 + (e1 - e0) * (n - n0) / (n1 - n0), False
    return points[-1][1], n == points[-1][0]


def loop_energy(windows: Iterable[Any], start: int, kept: int, end: int) -> tuple[float, float, bool] | None:
    """(energy, wasted, exact) of one loop from its windows (``completed``, ``energy_J``), or None without energy."""
    points = [(start, 0.0)]
    total = 0.0
    seen = False
    for w in sorted(windows, key=lambda w: w.completed):
        if w.energy_J is None or w.completed < start:
            continue
        seen = True
        total += w.energy_J
        points.append((w.completed, total))
    if not seen:
        return None
    e_kept, exact_kept = _at(points, kept)
    e_end, exact_end = _at(points, end)
    return total, max(total - min(e_kept, e_end), 0.0), exact_kept and exact_end


def energy_account(loops: Iterable[tuple[str, int, Any, int, int, int]], run_ids: Sequence[str]
                   ) -> EnergyAccount | None:
    """``loops``: (run_id, run index, windows, start, kept, end) of every training loop of every rank."""
    per_run = {i: [0.0, 0.0] for i in range(len(run_ids))}
    approximate = False
    seen = False
    for _, index, windows, start, kept, end in loops:
        found = loop_energy(windows, start, kept, end)
        if found is None:
            continue
        seen = True
        energy, wasted, exact = found
        per_run[index][0] += energy
        per_run[index][1] += wasted
        approximate = approximate or not exact
    if not seen:
        return None
    total = math.fsum(e for e, _ in per_run.values())
    wasted = math.fsum(w for _, w in per_run.values())
    return EnergyAccount(total, total - wasted, wasted,
                         tuple((run_ids[i], e, w) for i, (e, w) in sorted(per_run.items())), approximate)
