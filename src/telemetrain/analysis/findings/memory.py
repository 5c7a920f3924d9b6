"""Memory that keeps growing: a rank's resident set (RSS) or its CUDA allocator's live bytes, with the time left
before the memory runs out at that rate.

**The rule**, per series, on the samples after training reached its steady state (the first report window after
warm-up; before it, models, optimizers and allocator caches are expected to grow): a Mann-Kendall trend test gives
``p < memory_alpha``; the growth (Theil-Sen slope x duration) is at least ``memory_min_growth_bytes`` and
``memory_min_growth_fraction`` of the starting level; and the last half still trends up (``p < memory_tail_alpha``,
slope at least a quarter of the whole): memory that grew and levelled off (a cache filling) is not a leak. The series
of the ranks that grow are one finding per kind (RSS, CUDA).

**Time to out-of-memory**: for RSS, the host's available memory at the end of the run over the summed slopes of the
growing ranks on that host, or where a container's cgroup memory limit applies and leaves less, what is left under
it (the limit less the last working set, else usage: its OOM killer acts there, long before the host runs out); for
CUDA, the device's total less the last value, over the slope. A projection at a constant rate; the sampler's
interval bounds how fast a growth it can see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .fmt import bytes_, ranges, seconds
from .inputs import ContainerMemory, HostMemory, MemorySeries
from .model import Evidence, Finding
from .stats import mann_kendall, median, theil_sen
from .thresholds import Thresholds

__all__ = ["MAX_POINTS", "memory_growth", "thin_indices"]

MAX_POINTS = 200  # the tests are O(n^2): longer series are thinned evenly
_LABEL = {"rss": "resident memory (RSS)", "cuda": "CUDA allocated memory"}


@dataclass(frozen=True)
class _Growth:
    series: MemorySeries
    slope: float  # bytes/s over the steady part
    tail_slope: float  # bytes/s over its last half
    growth: float
    start: float
    last: float
    duration: float
    p: float


def thin_indices(n: int) -> list[int]:
    """The positions ``_thin`` keeps of ``n`` points (a reader that selects them by SQL asks here)."""
    if n <= MAX_POINTS:
        return list(range(n))
    step = n / MAX_POINTS
    return [int(i * step) for i in range(MAX_POINTS - 1)] + [n - 1]


def _thin(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [points[i] for i in thin_indices(len(points))]


def _growth(s: MemorySeries, steady_from: float, th: Thresholds) -> _Growth | None:
    points = sorted(p for p in s.points if p[0] >= steady_from)
    n = len(points)
    if s.thinned is not None:  # already thinned (the same points as _thin's of the whole), from n points
        if s.thinned[0] != steady_from:
            raise ValueError(f"memory series of rank {s.rank} thinned from {s.thinned[0]} s, not {steady_from} s")
        n = s.thinned[1]
    if n < th.memory_min_samples:
        return None
    points = _thin(points)
    ts, vs = [t for t, _ in points], [v for _, v in points]
    duration = ts[-1] - ts[0]
    if duration <= 0:
        return None
    _, p = mann_kendall(vs)
    if p >= th.memory_alpha:
        return None
    slope = theil_sen(ts, vs)
    start = median(vs[: max(len(vs) // 5, 1)])
    growth = slope * duration
    if growth < th.memory_min_growth_bytes or growth < th.memory_min_growth_fraction * start:
        return None
    half = len(points) // 2
    _, p_tail = mann_kendall(vs[half:])
    tail_slope = theil_sen(ts[half:], vs[half:])
    if p_tail >= th.memory_tail_alpha or tail_slope < slope / 4:
        return None  # grew, then levelled off
    return _Growth(s, slope, tail_slope, growth, start, vs[-1], duration, p)


def memory_growth(memory: Sequence[MemorySeries], hosts: Sequence[HostMemory], steady_from: float,
                  th: Thresholds, containers: Sequence[ContainerMemory] = ()) -> list[Finding]:
    growing: dict[str, list[_Growth]] = {}
    for s in memory:
        g = _growth(s, steady_from, th)
        if g is not None:
            growing.setdefault(s.kind, []).append(g)
    available = {h.host: h for h in hosts}
    limited = {c.host: c for c in containers if c.last}
    findings = []
    for kind, gs in sorted(growing.items()):
        gs.sort(key=lambda g: g.series.rank)
        ranks = [g.series.rank for g in gs]
        worst = max(gs, key=lambda g: g.tail_slope)
        oom = _time_to_oom(kind, gs, available, limited)
        rate = worst.tail_slope * 60
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranges(ranks)}"
        device = f" {worst.series.device}" if worst.series.device else ""
        detail = (f"{_LABEL.get(kind, kind)} of {who} grew steadily after warm-up: {bytes_(worst.start)} -> "
                  f"{bytes_(worst.last)} on rank {worst.series.rank}{device}"
                  f" over {seconds(worst.duration)}, still {bytes_(rate)}/min at the end (Theil-Sen slope; "
                  f"Mann-Kendall p={worst.p:.1g})")
        if oom is not None:
            seconds_left, what = oom
            detail += f"; at that rate {what} is used up in about {seconds(seconds_left)}"
        findings.append(Finding(
            "warning", "memory growth", f"memory growth: {_LABEL.get(kind, kind)} of {who} (+{bytes_(rate)}/min)",
            detail, Evidence(effect=worst.tail_slope, effect_unit="B/s", confidence=1 - worst.p, ranks=tuple(ranks),
                             value=worst.last, reference=worst.start, test="Mann-Kendall trend, Theil-Sen slope",
                             notes=(f"time to out-of-memory {seconds(oom[0])}",) if oom else ())))
    return findings


def _time_to_oom(kind: str, gs: Sequence[_Growth], hosts: dict[str, HostMemory],
                 containers: dict[str, ContainerMemory]) -> tuple[float, str] | None:
    if kind == "rss":
        best: tuple[float, str] | None = None
        for host in {g.series.host for g in gs}:
            rate = sum(g.tail_slope for g in gs if g.series.host == host)
            if rate <= 0:
                continue
            room: list[tuple[float, str]] = []
            if (h := hosts.get(host)) is not None:
                room.append((h.available, f"the {bytes_(h.available)} still available on {host or 'the host'}"))
            if (c := containers.get(host)) is not None:
                left_c = max(0.0, c.limit - sorted(c.last)[-1][1])
                room.append((left_c, f"the {bytes_(left_c)} left under the container's {bytes_(c.limit)} cgroup "
                                     f"memory limit on {host or 'the host'}"))
            if room:
                bytes_left, what = min(room)
                if best is None or bytes_left / rate < best[0]:
                    best = (bytes_left / rate, what)
        return best
    options = [((g.series.limit - g.last) / g.tail_slope, f"{g.series.device or 'the device'}'s "
                f"{bytes_(g.series.limit)}") for g in gs if g.series.limit and g.tail_slope > 0]
    return min(options) if options else None
