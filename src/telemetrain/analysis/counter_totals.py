"""A run's totals of the system sampler's counters (bytes of disk and network I/O, GPU joules) across sampler
lifetimes: what ``telemetrain show`` and the report print.

Each counter counts from 0 at its sampler's start (docs/system.md, "Counters"), so a restarted process, or a sampler
stopped and started again, begins a new segment: the last value is only the last lifetime's. The total of a series is
the sum of its segments' increases, as Prometheus' ``increase()`` reads a counter reset
(https://prometheus.io/docs/prometheus/latest/querying/functions/#resets): within one process (rank, pid, attempt),
in its own order, a value below the previous one starts a new segment, counted from 0. Processes that sampled the same
device at the same time (two ranks sampling one GPU, host metrics asked of two ranks) measured the same thing: of
lifetimes that overlap in time the largest counts, once; lifetimes one after another add up.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

__all__ = ["COUNTER_NAMES", "CounterTotals", "lifetimes_sql", "merge_lifetimes"]

# the series keys (v1 names) of the sampler's counters that count from its start
COUNTER_NAMES = ("system.disk.io.read", "system.disk.io.write", "system.network.io.receive",
                 "system.network.io.transmit", "hw.energy", "hw.energy.integrated", "container.memory.oom_kills",
                 "container.memory.ooms", "container.memory.limit_hits")

K = TypeVar("K", bound=Hashable)


def merge_lifetimes(lifetimes: Iterable[tuple[int, int, float]]) -> float:
    """The total of (first wall ns, last wall ns, increase) lifetimes: the largest of those overlapping in time, summed
    over the runs of them that do not."""
    total = 0.0
    end: int | None = None
    best = 0.0
    for first, last, increase in sorted(lifetimes):
        if end is not None and first <= end:  # the same device seen by two processes at once: counted once
            best = max(best, increase)
            end = max(end, last)
            continue
        total += best
        end, best = last, increase
    return total + best


class CounterTotals(Generic[K]):
    """Totals per series ``K`` from values given in each process's order (``add``), a process being ``lifetime``."""

    def __init__(self) -> None:
        # (series, lifetime) -> [previous value, increase, first wall ns, last wall ns]
        self._lives: dict[tuple[K, Hashable], list[float]] = {}

    def add(self, key: K, lifetime: Hashable, wall_ns: int, value: float) -> None:
        life = self._lives.get((key, lifetime))
        if life is None:
            self._lives[(key, lifetime)] = [value, max(0.0, value), wall_ns, wall_ns]
            return
        previous = life[0]
        life[1] += max(0.0, value - previous if value >= previous else value)  # below: a reset, counted from 0
        life[0] = value
        life[2] = min(life[2], wall_ns)
        life[3] = max(life[3], wall_ns)

    def totals(self) -> dict[K, float]:
        by_key: dict[K, list[tuple[int, int, float]]] = {}
        for (key, _), (_, increase, first, last) in self._lives.items():
            by_key.setdefault(key, []).append((int(first), int(last), increase))
        return {key: merge_lifetimes(lives) for key, lives in by_key.items()}


def lifetimes_sql(source: str, who: str, name: str, where: str) -> str:
    """A query of (who, group_name, series name, first wall ns, last wall ns, increase): one row per process
    lifetime of each counter series in ``source`` (a metrics table or subquery whose series key is the column
    ``name``), its increase counted as ``CounterTotals.add`` counts it, in each process's order (attempt, monotonic
    time, file order, as ``Run.records()`` reads a process)."""
    names = "(" + ", ".join(f"'{n}'" for n in COUNTER_NAMES) + ")"
    return f"""WITH p AS (SELECT {who} AS who, group_name, {name} AS series, rank, pid, restart_count, wall_ns, value,
          lag(value) OVER (PARTITION BY {who}, group_name, {name}, rank, pid, restart_count
                           ORDER BY mono_ns, segment, line) AS prev
        FROM {source} WHERE {where} AND {name} IN {names} AND value_bool IS NULL AND isfinite(value))
      SELECT who, group_name, series, min(wall_ns), max(wall_ns),
        sum(greatest(0.0, CASE WHEN prev IS NULL THEN value WHEN value >= prev THEN value - prev ELSE value END))
      FROM p GROUP BY who, group_name, series, rank, pid, restart_count ORDER BY ALL"""
