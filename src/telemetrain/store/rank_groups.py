"""Ranks in groups of bounded size, for readers that run a query a group of ranks at a time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["rank_groups"]


def rank_groups(counts: Sequence[tuple[Any, ...]], *most: int) -> list[str]:
    """The ranks of ``counts`` ((rank, rows), by rank) as SQL lists of consecutive ranks holding at most ``most``
    rows together (a rank holding more is alone): a reader that sorts or groups rows runs its query a group of ranks
    at a time, so that DuckDB holds a bounded number of rows, not the run's. With several counts a rank ((rank,
    series, steps), say), one bound each."""
    groups: list[list[int]] = []
    held = [0] * len(most)
    for rank, *ns in counts:
        sizes = [int(n or 0) for n in ns]
        if not groups or any(h + n > m for h, n, m in zip(held, sizes, most, strict=True)):
            groups.append([])
            held = [0] * len(most)
        groups[-1].append(int(rank))
        held = [h + n for h, n in zip(held, sizes, strict=True)]
    return ["(" + ", ".join(map(str, g)) + ")" for g in groups]
