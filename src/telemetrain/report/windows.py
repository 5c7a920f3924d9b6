"""What the report derives from the per-rank windows (``training_metrics_update``), in a size that does not grow with
the run: the figures of docs/report.md (slow ranks, slow windows, time by phase, the heatmap) and each
rank's windows merged into at most ``MAX_WINDOWS_PER_RANK`` for the charts.

Computed here from the windows in memory (the pure-Python path), and by SQL in ``model_sql`` (the DuckDB path) with
the same rules, so both paths give the same figures; the tests compare them.

Merging: a rank with more than its limit of windows (in iteration order) has them grouped into runs of
``ceil(n / limit)`` consecutive windows. The limit is ``MAX_WINDOWS_PER_RANK`` (1,000) for the lowest rank, whose
windows the iteration chart draws, and ``WINDOW_BUDGET / ranks`` for the others (50 to 1,000), so that all ranks
together hold about ``WINDOW_BUDGET`` windows, however many ranks and iterations the run has. A group becomes one
``Window`` ending where its last window ends: iterations and total summed; avg, p50, samples/s and each phase the mean
of the group's finite values; p90, p99 and max the largest finite value. The iteration chart draws buckets of the
same size with the same rules, so it is the same whether drawn from the windows or from their merged form.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from ..phase_times import DEVICE, HOST

__all__ = ["MAX_HEATMAP_COLUMNS", "MAX_WINDOWS_PER_RANK", "Heatmap", "WindowFigures", "merge_size", "window_figures",
           "window_limit"]

PHASES = ("dataloader", "forward", "backward", "optimizer", "zero_grad")
MAX_WINDOWS_PER_RANK = 1000  # the iteration chart's points
WINDOW_BUDGET = 16_000  # windows kept in memory for all ranks together (besides the lowest rank's)
MIN_WINDOWS_PER_RANK = 50
MAX_HEATMAP_COLUMNS = 200
SLOW_ITERATION_FACTOR = 3.0  # a window whose slowest iteration is this many times the rank's median


@dataclasses.dataclass
class Heatmap:
    """The per-rank heatmap: ``cells[i][j]`` is the mean of rank ``ranks[i]``'s finite window means whose
    iteration falls in column ``j`` (``lo + j * width`` to ``lo + (j + 1) * width``), None when it has none."""

    ranks: list[int]
    lo: int
    hi: int
    ncols: int
    cells: list[list[float | None]]
    typical: float  # the median of every finite window mean (1.0 without any)
    medians: dict[int, float | None]  # rank -> the median of its finite window means

    @property
    def width(self) -> float:
        return (self.hi - self.lo + 1) / self.ncols

    def column(self, step: int) -> int:
        return min(self.ncols - 1, max(0, int((step - self.lo) / self.width)))


@dataclasses.dataclass
class WindowFigures:
    counts: dict[int, int]  # rank -> windows
    # rank -> its windows, merged to at most MAX_WINDOWS_PER_RANK (report.model_pass.Window; packed on the SQL path)
    merged: dict[int, Sequence[Any]]
    medians: dict[int, float | None]  # rank -> median of its finite window means
    slow_windows: list[Any]  # windows whose slowest iteration took > 3x the rank's median p50 (iteration, rank order)
    phase_seconds: dict[int, tuple[dict[str, float], float]]  # rank -> (phase -> seconds, mean x iterations summed)
    heatmap: Heatmap | None
    # rank -> the clock of its phase_seconds: "device" when any window has device times (then only those windows
    # count, against the device iteration time), else "host" (phase_times.py)
    phase_sources: dict[int, str] = dataclasses.field(default_factory=dict)


def window_limit(rank: int, ranks: Sequence[int]) -> int:
    """How many (merged) windows ``rank`` keeps, of a run whose ranks with windows are ``ranks``."""
    if not ranks or rank == min(ranks):
        return MAX_WINDOWS_PER_RANK
    return max(MIN_WINDOWS_PER_RANK, min(MAX_WINDOWS_PER_RANK, WINDOW_BUDGET // len(ranks)))


def merge_size(n: int, limit: int = MAX_WINDOWS_PER_RANK) -> int:
    """How many consecutive windows make one merged window (or one chart point) for a rank with ``n`` windows."""
    return max(1, math.ceil(n / limit))


def _finite(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _median(values: Iterable[float | None]) -> float | None:
    finite = _finite(values)
    return statistics.median(finite) if finite else None


def _mean(values: Iterable[float | None]) -> float | None:
    finite = _finite(values)
    return statistics.fmean(finite) if finite else None


def _largest(values: Iterable[float | None]) -> float | None:
    finite = _finite(values)
    return max(finite) if finite else None


def merge_windows(ws: Sequence[Any], make: Any, limit: int = MAX_WINDOWS_PER_RANK) -> list[Any]:
    """``ws`` (one rank's, in iteration order) merged into at most ``limit``; ``make(**fields)`` builds a window."""
    size = merge_size(len(ws), limit)
    if size == 1:
        return list(ws)
    out = []
    for i in range(0, len(ws), size):
        group = ws[i:i + size]
        last = group[-1]
        totals = _finite(w.total for w in group)
        phases = {}
        for phase in PHASES:
            value = _mean(w.phases.get(phase) for w in group)
            if value is not None:
                phases[phase] = value
        out.append(make(
            rank=last.rank, iteration=last.iteration, wall_ns=last.wall_ns, iterations=sum(w.iterations for w in group),
            avg=_mean(w.avg for w in group), p50=_mean(w.p50 for w in group), p90=_largest(w.p90 for w in group),
            p99=_largest(w.p99 for w in group), max=_largest(w.max for w in group),
            total=math.fsum(totals) if totals else None, samples_per_second=_mean(w.samples_per_second for w in group),
            phases=phases))
    return out


def window_figures(windows: dict[int, list[Any]], make: Any) -> WindowFigures:
    """The figures of ``windows`` (rank -> its windows in iteration order), computed in memory."""
    counts = {rank: len(ws) for rank, ws in windows.items()}
    medians = {rank: _median(w.avg for w in ws) for rank, ws in windows.items()}
    slow: list[Any] = []
    for ws in windows.values():
        typical = _median(w.p50 if w.p50 is not None else w.avg for w in ws)
        if not typical:
            continue
        slow.extend(w for w in ws if w.max is not None and w.max > SLOW_ITERATION_FACTOR * typical)
    slow.sort(key=lambda w: (w.iteration, w.rank))
    phase_seconds = {}
    phase_sources = {}
    for rank, ws in windows.items():
        if any(w.phases for w in ws):
            device = any(w.phase_source == DEVICE for w in ws)
            phase_sources[rank] = DEVICE if device else HOST
            if device:  # device phases against the device iteration time; host windows (device timing off) left out
                ws = [w for w in ws if w.phase_source == DEVICE]
            seconds = {p: math.fsum(w.phases[p] * w.iterations for w in ws if p in w.phases) for p in PHASES}
            total = math.fsum(w.phase_avg * w.iterations for w in ws
                              if w.phase_avg is not None and math.isfinite(w.phase_avg))
            phase_seconds[rank] = (seconds, total)
    ranks = sorted(windows)
    return WindowFigures(counts=counts, merged={rank: merge_windows(ws, make, window_limit(rank, ranks))
                                                for rank, ws in windows.items()},
                         medians=medians, slow_windows=slow, phase_seconds=phase_seconds,
                         heatmap=_heatmap(windows, medians), phase_sources=phase_sources)


def _heatmap(windows: dict[int, list[Any]], medians: dict[int, float | None]) -> Heatmap | None:
    if not windows:
        return None
    ranks = sorted(windows)
    lo = min(w.iteration for ws in windows.values() for w in ws)
    hi = max(w.iteration for ws in windows.values() for w in ws)
    ncols = max(1, min(MAX_HEATMAP_COLUMNS, max(len(ws) for ws in windows.values())))
    heat = Heatmap(ranks=ranks, lo=lo, hi=hi, ncols=ncols, cells=[], typical=1.0, medians=dict(medians))
    values: list[float] = []
    for rank in ranks:
        cells: list[list[float]] = [[] for _ in range(ncols)]
        for w in windows[rank]:
            if w.avg is not None and math.isfinite(w.avg):
                cells[heat.column(w.iteration)].append(w.avg)
                values.append(w.avg)
        heat.cells.append([math.fsum(c) / len(c) if c else None for c in cells])
    typical = statistics.median(values) if values else 1.0
    heat.typical = typical if typical > 0 else 1.0
    return heat
