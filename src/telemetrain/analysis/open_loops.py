"""The ranks of a run with a training loop that never ended (a ``training_loop`` span started, not ended, in one of
its processes): a SIGKILLed rank, an OOM kill, a lost node -- or one still running. ``compare`` judges goodput on
rank 0's timeline; a run where any rank's loop is open is not complete, whatever rank 0's says."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..store.reader import Run, scan_process
from .summary import _where

__all__ = ["open_loop_ranks"]


def _loop_line(raw: bytes) -> bool:
    """A training loop's start or end (the only lines decoded)."""
    return b'"training_loop"' in raw and (b'"span_start"' in raw[:40] or b'"span_end"' in raw[:40])


def open_loop_ranks(run: Run, engine: Any = None) -> list[int]:
    """The ranks, ascending, of the processes of ``run`` whose training loop spans started outnumber those that
    ended; by SQL with ``engine`` (a ``store.engine.Engine``: the run is attached to it), else from the files, only
    the loop's lines decoded."""
    if engine is not None:
        engine.attach(run)
        w = _where(run)
        loop = "group_name = 'training' AND name = 'training_loop'"
        return sorted({int(rank) for rank, in engine.rows(
            f"SELECT rank FROM (SELECT rank, pid, 1 AS d FROM span_starts WHERE {w} AND {loop} UNION ALL SELECT "
            f"rank, pid, -1 FROM span_ends WHERE {w} AND {loop}) GROUP BY rank, pid HAVING sum(d) > 0")})
    ranks: set[int] = set()
    for log in run.processes:
        started: Counter[int] = Counter()
        for r in scan_process(log.paths, run.meta, _loop_line):
            if r.group == "training" and r.name == "training_loop" and r.kind in ("span_start", "span_end"):
                started[r.identity.rank] += 1 if r.kind == "span_start" else -1
        ranks.update(rank for rank, n in started.items() if n > 0)
    return sorted(ranks)
