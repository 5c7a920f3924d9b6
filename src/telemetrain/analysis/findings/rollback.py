"""The latest attempt of each step: a rank's report windows that a rollback abandoned, left out of the rules.

A rank whose steps go back (a restart that resumed from an earlier checkpoint, writing to the same run, or a rollback
inside the process) ran those steps twice; the job's history of them is the latest attempt's, the steps the final
model saw -- as the report's curves follow it (``report.curves``). Rules that group the windows by the step they end
at (the job's series, the ranks compared per step) would otherwise mix both attempts into one point: a slow first
attempt, restarted, still read as a slowdown of the steps its restart ran clean. So a window is dropped when a later
window of its rank (in time: ``WindowPoint.time_s``, then the order given) starts at or before the step it ends at.
The windows of an attempt before the step its restart went back to stay: nothing replaced them. Past
``MAX_ROLLBACKS`` such steps back on one rank its step is not training progress (a counter that restarts each
epoch): its windows are kept, as the curves keep every value then.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .inputs import WindowPoint

__all__ = ["MAX_ROLLBACKS", "latest_attempt"]

MAX_ROLLBACKS = 16  # per rank, as the curves' (report.curves)


def latest_attempt(windows: Sequence[WindowPoint]) -> Sequence[WindowPoint]:
    """``windows`` without those a later window of their rank went back over (the module's docstring); ``windows``
    itself when none was."""
    by_rank: dict[int, list[int]] = {}
    for i, w in enumerate(windows):
        by_rank.setdefault(w.rank, []).append(i)
    drop: set[int] = set()
    for positions in by_rank.values():
        order = sorted(positions, key=lambda i: (windows[i].time_s, i))
        high, went_back = -math.inf, 0
        for i in order:  # the steps back, in time order
            w = windows[i]
            if w.first_step <= high:
                went_back += 1
            high = max(high, w.step) if w.first_step > high else w.step
        if not went_back or went_back > MAX_ROLLBACKS:
            continue
        low = math.inf  # the lowest first step of the rank's later windows
        for i in reversed(order):
            w = windows[i]
            if w.step >= low:
                drop.add(i)
            low = min(low, w.first_step)
    return [w for i, w in enumerate(windows) if i not in drop] if drop else windows
