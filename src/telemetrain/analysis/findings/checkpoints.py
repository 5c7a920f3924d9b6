"""Slow checkpoint ranks: a rank whose checkpoint save takes much longer than the other ranks' saves of the same
checkpoint.

Where every rank saves its share (a sharded or distributed checkpoint), the ranks meet at the next collective: the
slow rank's extra save time is time every other rank waits. Per checkpoint (a span name and the iteration it saved;
without an iteration, each rank's k-th save of that name) saved by at least two ranks, each rank's save time is
compared with the other ranks', leave-one-out: flagged when it is ``checkpoint_ratio`` times their median,
``checkpoint_min_s`` seconds more, and ``z >= checkpoint_z`` against their median and MAD (the scale at least
``checkpoint_scale_floor`` of the median: ranks that save in the same time). A rank is a finding when it was flagged
at ``checkpoint_share`` of the checkpoints it saved with others, at least; its cost is the excess summed over those.

**One rank writes for all** (``torch.save`` on rank 0 while the others wait at a barrier after their empty save):
the lowest rank of a checkpoint whose other ranks' saves are under ``checkpoint_writer_share`` of its own did the
work alone; that is the pattern, not a straggler (a checkpoint saved by one rank only is not compared at all).
**Some ranks write for all** (the first data-parallel replica's ranks, or one rank a node, write the state while
the others' saves are empty): the ranks whose save the median of all is under ``checkpoint_writer_share`` of, when
there are two or more, are compared among themselves -- the others waited for them all alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .fmt import ranges, seconds
from .model import Evidence, Finding
from .stats import MAD_TO_SD, mad, median
from .thresholds import Thresholds

__all__ = ["CHECKPOINT_SAVES", "CheckpointSave", "slow_checkpoint_ranks"]

CHECKPOINT_SAVES = frozenset({"checkpoint_save_sync", "checkpoint_save_async"})
EXACT_BELOW = 64  # up to this many ranks the others' median and MAD are computed without the rank itself


@dataclass(frozen=True, slots=True)
class CheckpointSave:
    """One rank's checkpoint save span that ended ok: its name (``checkpoint_save_sync``/``_async``: the async one
    is the part that blocks training), the iteration it saved (None: not said) and its seconds."""

    rank: int
    name: str
    step: int | None
    seconds: float


@dataclass(frozen=True)
class _Flag:
    step: int | None
    seconds: float
    reference: float  # the other ranks' median
    lowest: bool  # the lowest rank that saved it (rank 0, which often writes what the others do not)


def _groups(saves: Sequence[CheckpointSave]) -> list[list[CheckpointSave]]:
    """The saves of each checkpoint: by (name, step), or by (name, the rank's k-th save) without a step."""
    groups: dict[tuple[str, int | None, int], list[CheckpointSave]] = {}
    nth: dict[tuple[str, int], int] = {}
    for s in saves:
        if s.name not in CHECKPOINT_SAVES:
            continue  # (a load is not a save: the ranks start together after it)
        key: tuple[str, int | None, int]
        if s.step is not None:
            key = (s.name, s.step, 0)
        else:
            k = nth[(s.name, s.rank)] = nth.get((s.name, s.rank), -1) + 1
            key = (s.name, None, k)
        groups.setdefault(key, []).append(s)
    return list(groups.values())


def _flags(group: list[CheckpointSave], th: Thresholds) -> tuple[dict[int, _Flag], set[int]]:
    """The ranks flagged in one checkpoint, and the ranks that saved it with others (a rank saving twice: its
    longest)."""
    by_rank: dict[int, CheckpointSave] = {}
    for s in group:
        if s.rank not in by_rank or s.seconds > by_rank[s.rank].seconds:
            by_rank[s.rank] = s
    if len(by_rank) < 2:
        return {}, set()
    values = [s.seconds for s in by_rank.values()]
    # several ranks wrote for all (the first data-parallel replica's, one a node) while the others' saves were empty:
    # everyone waited for the writers, which are compared among themselves
    everyone = median(values)
    writers = [s for s in by_rank.values() if everyone < th.checkpoint_writer_share * s.seconds]
    if len(writers) >= 2:
        return _flags(writers, th)[0], set(by_rank)
    shared = (median(values), mad(values)) if len(values) > EXACT_BELOW else None
    lowest = min(by_rank)
    flagged = {}
    for rank, s in by_rank.items():
        if shared is None:
            others = [v.seconds for r, v in by_rank.items() if r != rank]
            center, spread = median(others), mad(others)
        else:
            center, spread = shared
        if rank == lowest and center < th.checkpoint_writer_share * s.seconds:
            continue  # it wrote the checkpoint for all; the others' saves were empty
        excess = s.seconds - center
        scale = max(MAD_TO_SD * spread, th.checkpoint_scale_floor * center)
        if (excess >= th.checkpoint_min_s and s.seconds >= th.checkpoint_ratio * center
                and (scale <= 0 or excess / scale >= th.checkpoint_z)):
            flagged[rank] = _Flag(s.step, s.seconds, center, rank == lowest)
    return flagged, set(by_rank)


def slow_checkpoint_ranks(saves: Sequence[CheckpointSave], th: Thresholds,
                          hosts: Mapping[int, str] | None = None) -> list[Finding]:
    """One finding per rank that saved slowly at enough of its checkpoints, costliest first."""
    flags: dict[int, list[_Flag]] = {}
    shared: dict[int, int] = {}  # rank -> checkpoints it saved with other ranks
    for group in _groups(saves):
        flagged, ranks = _flags(group, th)
        for rank in ranks:
            shared[rank] = shared.get(rank, 0) + 1
        for rank, flag in flagged.items():
            flags.setdefault(rank, []).append(flag)
    found = []
    for rank, fs in flags.items():
        n = shared[rank]
        if len(fs) < th.checkpoint_share * n:
            continue  # a one-off hiccup of the storage among many checkpoints
        cost = sum(f.seconds - f.reference for f in fs)
        value, reference = median([f.seconds for f in fs]), median([f.reference for f in fs])
        ratio = value / reference if reference > 0 else math.inf
        steps = sorted(f.step for f in fs if f.step is not None)
        where = f" at step(s) {ranges(steps)}" if steps else ""
        host = f" on host {hosts[rank]}" if hosts and rank in hosts else ""
        found.append((cost, Finding(
            "warning", "slow checkpoint rank",
            f"slow checkpoint rank: rank {rank} saves in {seconds(value)} against {seconds(reference)}",
            f"rank {rank}{host} took {seconds(value)} to save a checkpoint against a median {seconds(reference)} of "
            f"the other ranks{f' ({ratio:.3g}x)' if reference > 0 else ''} at {len(fs)} of its {n} checkpoint(s)"
            f"{where}: every other rank waited for it at the next collective, {seconds(cost)} in all. Check that "
            "rank's storage path and host (a slow or shared filesystem, a full disk, a larger share of the state) and "
            "time its save alone" + (
                "; it is the lowest rank: if it writes state the others do not (the model, the optimizer, the data "
                "loader's), that is its extra time, and sharding the save or writing it asynchronously spreads it"
                if all(f.lowest for f in fs) else ""),
            Evidence(effect=ratio, ranks=(rank,), value=value, reference=reference,
                     steps=(steps[0], steps[-1]) if steps else None, cost_seconds=cost,
                     test=f"its save >= {th.checkpoint_ratio:g}x and {seconds(th.checkpoint_min_s)} over the other "
                          f"ranks' median, robust z >= {th.checkpoint_z:g}, at {len(fs)} of {n} checkpoint(s)"))))
    return [f for _, f in sorted(found, key=lambda cf: -cf[0])]
