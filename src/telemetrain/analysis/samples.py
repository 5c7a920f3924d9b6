"""The iteration-time and throughput samples of a run, as the comparison uses them.

The unit is the report window: each rank's ``training_metrics_update`` event (every ``log_every_n_train_iterations``)
carries the window's mean iteration time, its throughput and its phase split. Every iteration feeds those figures,
whereas iteration spans are exported one in N, so windows are the complete record; the sampled iteration spans are
kept alongside for the per-iteration percentiles shown next to the comparison. The first window of each training loop
of each process is left out (warm-up: compilation, allocator growth, cold caches), as are windows without a finite,
positive mean.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store.layout import is_agent_file, is_process_file
from ..store.reader import NotARunError, Run, open_run, read_run_meta, scan_process

__all__ = ["PHASES", "RunSamples", "Window", "read_samples", "run_samples"]

PHASES = ("dataloader", "forward", "backward", "optimizer")
_UPDATE = "training_metrics_update"
_ITERATION_SPAN = "training_single_iteration"
_UPDATE_BYTES = b'"name":"training_metrics_update"'
_ITERATION_BYTES = b'"name":"training_single_iteration"'


@dataclass(frozen=True)
class Window:
    """One rank's report window."""

    rank: int
    pid: int
    iteration: int  # global zero-based iteration at the window's end
    iterations: int  # iterations in the window
    iteration_time: float  # mean iteration time over the window, seconds
    samples_per_second: float | None  # the window's throughput (global batch x iterations / wall seconds)
    phases: Mapping[str, float]  # mean seconds per iteration of each timed sub-phase
    final: bool = False


@dataclass
class RunSamples:
    """What a comparison needs of one run: its identity and its steady-state windows."""

    path: Path
    run_id: str
    session_tag: str
    perf_tag: str
    created_wall_ns: int
    windows: list[Window]
    skipped_windows: int = 0  # warm-up windows and windows without a usable mean
    iteration_spans: dict[int, list[float]] = field(default_factory=dict)  # rank -> sampled iteration seconds
    # Filled by the SQL path instead of ``windows`` (whose size grows with the run): the series, the ranks, the
    # window count and the sampled spans' percentiles, computed by DuckDB.
    # (8 bytes a value: a run's per-rank series hold one value per window of every rank)
    precomputed: dict[tuple[str, int | None], Sequence[float]] | None = None
    precomputed_ranks: list[int] = field(default_factory=list)
    precomputed_windows: int = 0
    precomputed_percentiles: tuple[float, float] | None = None

    @property
    def ranks(self) -> list[int]:
        if self.precomputed is not None:
            return list(self.precomputed_ranks)
        return sorted({w.rank for w in self.windows})

    @property
    def window_count(self) -> int:
        return self.precomputed_windows if self.precomputed is not None else len(self.windows)

    def series(self, metric: str, rank: int | None = None) -> list[float]:
        """The metric's values, one per window in iteration order: ``iteration_time``, ``samples_per_second`` or a
        phase name. With ``rank=None`` the windows of all ranks that end at the same iteration are averaged into one
        (data-parallel ranks step together, so they are one observation, not world_size independent ones)."""
        if self.precomputed is not None:
            return list(self.precomputed.get((metric, rank), []))
        by_iteration: dict[int, list[float]] = {}
        for w in self.windows:
            if rank is not None and w.rank != rank:
                continue
            value = _value_of(w, metric)
            if value is not None:
                by_iteration.setdefault(w.iteration, []).append(value)
        return [statistics.fmean(v) for _, v in sorted(by_iteration.items())]

    def iteration_percentiles(self) -> tuple[float, float] | None:
        """p50 and p99 of the sampled iteration spans of all ranks (None without any)."""
        if self.precomputed is not None:
            return self.precomputed_percentiles
        times = sorted(t for ts in self.iteration_spans.values() for t in ts)
        if not times:
            return None
        return _quantile(times, 0.5), _quantile(times, 0.99)


def _quantile(ordered: Sequence[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _value_of(w: Window, metric: str) -> float | None:
    if metric == "iteration_time":
        return w.iteration_time
    if metric == "samples_per_second":
        return w.samples_per_second
    return w.phases.get(metric)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def open_run_meta(path: Path) -> dict[str, Any]:
    """``run.json`` of a run directory (empty if missing or unreadable; damaged fields dropped)."""
    return read_run_meta(path)


def _worker_files(path: Path) -> list[Path]:
    return sorted(f for f in path.iterdir() if f.is_file() and is_process_file(f.name) and not is_agent_file(f.name))


def run_bytes(path: str | Path) -> int:
    """Total size of a run's process files (the work a load does)."""
    try:
        return sum(f.stat().st_size for f in _worker_files(Path(path)))
    except OSError:
        return 0


class _Collector:
    """Windows and iteration spans, fed one process's records at a time."""

    def __init__(self) -> None:
        self.windows: list[Window] = []
        self.skipped = 0
        self.spans: dict[int, list[float]] = {}
        self.perf_tag = ""

    def feed(self, records: Iterable[Any]) -> None:
        loops_seen: set[tuple[int, int]] = set()
        for r in records:
            ident = r.identity
            self.perf_tag = self.perf_tag or ident.perf_tag
            if r.kind == "span_end":
                if r.name == _ITERATION_SPAN and r.group == "training" and r.status == "ok":
                    self.spans.setdefault(ident.rank, []).append(r.duration_ns / 1e9)
                continue
            if r.kind != "event" or r.name != _UPDATE or r.group != "training":
                continue
            a = r.attributes or {}
            # the first report of each training loop (told apart by the iteration it started at) holds the warm-up
            loop_start = a.get("train_iterations_start")
            key = (ident.pid, loop_start if isinstance(loop_start, int) else -1)
            first_of_loop = key not in loops_seen
            loops_seen.add(key)
            window = _window_of(ident.rank, ident.pid, a)
            if window is None or first_of_loop:
                self.skipped += 1
            else:
                self.windows.append(window)

    def result(self, path: Path, meta: Mapping[str, Any]) -> RunSamples:
        created = meta.get("created_wall_ns")
        return RunSamples(
            path=path,
            run_id=str(meta.get("run_id") or path.name),
            session_tag=str(meta.get("session_tag") or path.parent.name),
            perf_tag=str(meta.get("perf_tag") or self.perf_tag),
            created_wall_ns=created if isinstance(created, int) else 0,
            windows=self.windows,
            skipped_windows=self.skipped,
            iteration_spans=self.spans,
        )


def _wanted(raw: bytes) -> bool:
    """The lines the comparison reads (the reports and the iteration spans' ends, a few percent of a file): the
    others are not even decoded."""
    return _UPDATE_BYTES in raw or (_ITERATION_BYTES in raw and b'"span_end"' in raw[:40])


def read_samples(path: str | Path, on_file: Callable[[int], None] | None = None) -> RunSamples:
    """The samples of the run directory ``path``: with the ``columnar`` extra by SQL over its columnar copy and JSONL
    tail (``store.engine``), else read straight from its files, decoding only the lines needed (faster than loading
    the whole run); ``on_file(bytes)`` is called after each file (for a progress bar). Raises ``FileNotFoundError``
    and ``NotARunError`` as ``open_run`` does."""
    p = Path(path)
    run = open_run(p)  # raises its error: missing, a file, not a run
    if not run.processes:
        raise NotARunError(f"{p} holds no process files (rank-<R>.<pid>.jsonl)")
    from ..store.engine import engine_for

    engine = engine_for([p])
    if engine is not None:
        from .samples_sql import samples_sql

        try:
            result = samples_sql(engine, run)
        finally:
            engine.close()
        if on_file is not None:
            on_file(run_bytes(p))
        return result
    collector = _Collector()
    for log in run.processes:
        collector.feed(scan_process(log.paths, run.meta, _wanted))
        if on_file is not None:
            on_file(sum(f.stat().st_size for f in log.paths if f.exists()))
    return collector.result(p, run.meta)


def run_samples(run: Run | str | Path) -> RunSamples:
    """The steady-state windows and sampled iteration spans of a run (a loaded ``Run``, or its directory)."""
    if not isinstance(run, Run):
        return read_samples(run)
    if not run.processes:
        raise NotARunError(f"{run.path} holds no process files")
    collector = _Collector()
    for process in run.processes:
        collector.feed(process.records)
    return collector.result(run.path, run.meta)


def _window_of(rank: int, pid: int, a: Mapping[str, Any]) -> Window | None:
    mean = _finite(a.get("avg_iteration_time_sec"))
    iteration = a.get("current_iteration")
    count = a.get("window_iterations")
    if mean is None or mean <= 0 or not isinstance(iteration, int) or not isinstance(count, int) or count < 1:
        return None
    throughput = _finite(a.get("samples_per_second"))
    phases = {}
    for phase in PHASES:
        value = _finite(a.get(f"avg_{phase}_time_sec"))
        if value is not None:
            phases[phase] = value
    return Window(rank=rank, pid=pid, iteration=iteration, iterations=count, iteration_time=mean,
                  samples_per_second=throughput if throughput and throughput > 0 else None, phases=phases,
                  final=bool(a.get("final")))
