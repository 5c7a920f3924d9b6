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

from ..phase_times import phase_times
from ..report.curves import CurveBuilder, is_user_group
from ..semconv import series_key
from ..store.layout import is_agent_file, is_process_file
from ..store.reader import NotARunError, Run, in_start_order, open_run, read_run_meta, scan_process
from .findings.inputs import contention_share

__all__ = ["DURATIONS", "PHASES", "RunSamples", "Window", "read_samples", "run_samples", "with_goodput"]

PHASES = ("dataloader", "forward", "backward", "optimizer")
OTHER = "other"  # the series of the iteration time outside the phases (``RunSamples.series("other")``)
_UPDATE = "training_metrics_update"
_ITERATION_SPAN = "training_single_iteration"
_UPDATE_BYTES = b'"name":"training_metrics_update"'
_ITERATION_BYTES = b'"name":"training_single_iteration"'
# the spans whose durations compare (one observation per span of each rank) -> the row they belong to
DURATIONS = {"checkpoint_save_sync": "checkpoint_save", "checkpoint_save_async": "checkpoint_save",
             "checkpoint_load": "checkpoint_load", "validation_loop": "validation"}
_DURATION_BYTES = tuple(f'"name":"{name}"'.encode() for name in DURATIONS)
# the system sampler's contention signals (metric name -> key in RunSamples.contention); the baseline marker
_CONTENTION = {"process.cpu.utilization": "process_cpu", "system.cpu.utilization": "host_cpu",
               "system.cpu.steal": "steal"}
_CONTENTION_BYTES = (b'"process.cpu.utilization"', b'"system.cpu.utilization"', b'"system.cpu.steal"',
                     b'"hw.gpu.throttle.')
_INIT_BYTES = b'"name":"one_logger_initialization"'
_SAMPLER_START_BYTES = b'"name":"system.sampler.start"'
_NOT_USER_BYTES = (b'"group":"system', b'"group":"training"', b'"group":"cross_rank"')  # curves.is_user_group's


@dataclass(frozen=True)
class Window:
    """One rank's report window."""

    rank: int
    pid: int
    iteration: int  # global zero-based iteration at the window's end
    iterations: int  # iterations in the window
    iteration_time: float  # mean iteration time over the window, seconds
    samples_per_second: float | None  # the window's throughput (its samples / the seconds it trained)
    phases: Mapping[str, float]  # mean seconds per iteration of each timed sub-phase
    final: bool = False
    phase_source: str = "host"  # the clock of `phases`: "device" where the window has device times (phase_times)
    cpu_wait_fraction: float | None = None  # contention: the process's wait for a CPU / (its CPU time + that wait)

    def busy_free(self, value: float) -> float:
        """``value`` less the share of the window spent waiting for a CPU (a busy machine taken out)."""
        return value if self.cpu_wait_fraction is None else value * (1.0 - self.cpu_wait_fraction)


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
    workload: dict[str, Any] = field(default_factory=dict)  # run.json's (training.workload); {} for older runs
    # "checkpoint_save", "checkpoint_load", "validation" -> (rank, seconds) of each span that ended ok, in order
    durations: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    # the sampler's contention signals: mean process_cpu (share of its CPUs), host_cpu, gpu_throttled (share)
    contention: dict[str, float] = field(default_factory=dict)
    is_baseline: bool = False  # the config's is_baseline_run (one_logger_initialization)
    goodput: float | None = None  # the run's own goodput, when compare computed it (``with_goodput``)
    open_loop: str = ""  # "running" or "killed": a training loop of the run never ended (goodput's run status)
    open_ranks: tuple[int, ...] = ()  # the ranks whose loop never ended (``open_loop``)
    cpu_count: float | None = None  # the CPUs the sampler divided process CPU by (a quota), else run.json's hardware
    # Filled by the SQL path instead of ``windows`` (whose size grows with the run): the series (keyed by metric,
    # rank, busy_free), the ranks, the window count, the sampled spans' percentiles and the windows' aggregates
    # computed by DuckDB (8 bytes a value: a run's per-rank series hold one value per window of every rank, kept in
    # a temporary file by ``samples_sql.SeriesStore`` and read back a series at a time)
    precomputed: Mapping[tuple[str, int | None, bool], Sequence[float]] | None = None
    precomputed_ranks: list[int] = field(default_factory=list)
    precomputed_windows: int = 0
    precomputed_iterations: int = 0  # the lowest rank's, in its steady-state windows
    precomputed_percentiles: tuple[float, float, int] | None = None
    precomputed_phase_source: str = ""
    precomputed_waits_known: bool = False
    precomputed_wait_fraction: float | None = None
    curves: CurveBuilder = field(default_factory=CurveBuilder)  # the user's metrics (loss, eval), bounded buckets

    @property
    def ranks(self) -> list[int]:
        if self.precomputed is not None:
            return list(self.precomputed_ranks)
        return sorted({w.rank for w in self.windows})

    @property
    def window_count(self) -> int:
        return self.precomputed_windows if self.precomputed is not None else len(self.windows)

    def steady_iterations(self) -> int:
        """The iterations in the lowest rank's steady-state windows (what the comparison's windows cover)."""
        if self.precomputed is not None:
            return self.precomputed_iterations
        ranks = self.ranks
        return sum(w.iterations for w in self.windows if w.rank == ranks[0]) if ranks else 0

    @property
    def phase_source(self) -> str:
        """The clock of the windows' phase times: ``device``, ``host``, ``mixed``, or ``""`` without phases."""
        if self.precomputed is not None:
            return self.precomputed_phase_source
        clocks = {w.phase_source for w in self.windows if w.phases}
        return clocks.pop() if len(clocks) == 1 else ("mixed" if clocks else "")

    def series(self, metric: str, rank: int | None = None, *, busy_free: bool = False) -> list[float]:
        """The metric's values, one per window in iteration order: ``iteration_time``, ``samples_per_second`` or a
        phase name. With ``rank=None`` the windows of all ranks that end at the same iteration are averaged into one
        (data-parallel ranks step together, so they are one observation, not world_size independent ones).
        ``busy_free``: each time less the share of runnable time spent waiting for a CPU -- of the most contended
        rank at that iteration, whom the others wait for -- and a rate raised by as much."""
        if self.precomputed is not None:
            return list(self.precomputed.get((metric, rank, busy_free), []))
        by_iteration: dict[int, list[float]] = {}
        shares: dict[int, float] = {}
        for w in self.windows:
            if rank is not None and w.rank != rank:
                continue
            value = _value_of(w, metric)
            if value is not None:
                by_iteration.setdefault(w.iteration, []).append(value)
                if busy_free:  # ranks step together: they wait for the most contended one
                    shares[w.iteration] = max(shares.get(w.iteration, 0.0), w.cpu_wait_fraction or 0.0)
        out = []
        for iteration, values in sorted(by_iteration.items()):
            value = statistics.fmean(values)
            if busy_free:  # a rate the other way round: what it would have been without the wait
                free = 1.0 - min(shares[iteration], 0.999)
                value = value / free if metric == "samples_per_second" else value * free
            out.append(value)
        return out

    @property
    def waits_known(self) -> bool:
        """Every window carries the process's CPU time and wait (Linux, a recorder that reports them)."""
        if self.precomputed is not None:
            return self.precomputed_waits_known
        return bool(self.windows) and all(w.cpu_wait_fraction is not None for w in self.windows)

    def wait_fraction(self) -> float | None:
        """The median over windows of the contention share (the process's wait for a CPU / its runnable time)."""
        if self.precomputed is not None:
            return self.precomputed_wait_fraction
        known = [w.cpu_wait_fraction for w in self.windows if w.cpu_wait_fraction is not None]
        return statistics.median(known) if known else None

    def duration_series(self, kind: str) -> list[float]:
        """One value per ``kind`` span index (the k-th save of every rank averaged: ranks save together)."""
        by_index: dict[int, list[float]] = {}
        counts: dict[int, int] = {}
        for rank, seconds in self.durations.get(kind, ()):
            k = counts.get(rank, 0)
            counts[rank] = k + 1
            by_index.setdefault(k, []).append(seconds)
        return [statistics.fmean(v) for _, v in sorted(by_index.items())]

    def iteration_percentiles(self) -> tuple[float, float, int] | None:
        """p50 and p99 of the sampled iteration spans of all ranks, and how many there are (None without any): a
        short run's handful, its first (warm-up) iteration among them, is no p99 to read as one."""
        if self.precomputed is not None:
            return self.precomputed_percentiles
        times = sorted(t for ts in self.iteration_spans.values() for t in ts)
        if not times:
            return None
        return _quantile(times, 0.5), _quantile(times, 0.99), len(times)


def quantile_positions(n: int, q: float) -> tuple[int, int, float]:
    """The ranks (0-based) of the two ordered values whose interpolation is the ``q`` quantile of ``n`` values, and
    the weight of the second."""
    position = q * (n - 1)
    low = math.floor(position)
    return low, min(low + 1, n - 1), position - low


def interpolate(low: float, high: float, weight: float) -> float:
    return low + (high - low) * weight


def _quantile(ordered: Sequence[float], q: float) -> float:
    low, high, weight = quantile_positions(len(ordered), q)
    return interpolate(ordered[low], ordered[high], weight)


def _value_of(w: Window, metric: str) -> float | None:
    if metric == "iteration_time":
        return w.iteration_time
    if metric == "samples_per_second":
        return w.samples_per_second
    if metric == OTHER:  # the step's time outside its timed phases (a sleep in the loop, unannotated work)
        if not w.phases or w.phase_source != "host":  # device phases against a host iteration time: not comparable
            return None
        return max(0.0, w.iteration_time - sum(w.phases.values()))
    return w.phases.get(metric)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def hardware_cpu_count(value: Any) -> float | None:
    """run.json's ``hardware.cpu_count`` (the host's CPUs), if a positive int."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


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

    def __init__(self, curves: Callable[[str], bool] | None = None) -> None:
        self.wanted = curves  # which user series feed the curves (None: every one)
        self.chosen: dict[str, bool] = {}
        self.first_wall_ns: int | None = None  # of every user metric point, fed or not (the curves' time origin)
        self.windows: list[Window] = []
        self.skipped = 0
        self.spans: dict[int, list[float]] = {}
        self.perf_tag = ""
        self.durations: dict[str, list[tuple[int, float]]] = {}
        self.signals: dict[str, list[float]] = {}
        self.is_baseline = False
        self.sampler_cpus: list[float] = []  # each sampler's divisor of process.cpu.utilization (at its start)
        self.curves = CurveBuilder()

    def feed(self, records: Iterable[Any]) -> None:
        loops_seen: set[tuple[int, int]] = set()
        for r in records:
            ident = r.identity
            self.perf_tag = self.perf_tag or ident.perf_tag
            if r.kind == "span_end":
                if r.name == _ITERATION_SPAN and r.group == "training" and r.status == "ok":
                    self.spans.setdefault(ident.rank, []).append(r.duration_ns / 1e9)
                elif r.name in DURATIONS and r.group == "training" and r.status == "ok":
                    self.durations.setdefault(DURATIONS[r.name], []).append((ident.rank, r.duration_ns / 1e9))
                continue
            if r.kind == "metric":
                self._signal(r.name, r.value)
                key = series_key(r.name, r.attributes) if r.attributes else r.name
                if self.wanted is None:
                    self.curves.add(ident.rank, r.group, key, r.step, r.value, r.wall_ns, r.unit)
                    continue
                chosen = self.chosen.get(key)
                if chosen is None:
                    chosen = self.chosen[key] = self.wanted(key)
                if chosen:
                    self.curves.add(ident.rank, r.group, key, r.step, r.value, r.wall_ns, r.unit)
                elif type(r.value) is not bool and isinstance(r.value, (int, float)) and is_user_group(r.group) \
                        and (self.first_wall_ns is None or r.wall_ns < self.first_wall_ns):
                    self.first_wall_ns = r.wall_ns  # a point CurveBuilder.add would have taken
                continue
            if r.kind == "event" and r.name == "system.sampler.start":
                cpus = _finite((r.attributes or {}).get("process.cpu_count"))
                if cpus is not None and cpus > 0:
                    self.sampler_cpus.append(cpus)
                continue
            if r.kind == "event" and r.name == "one_logger_initialization":
                self.is_baseline = self.is_baseline or (r.attributes or {}).get("is_baseline_run") is True
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

    def _signal(self, name: str, value: Any) -> None:
        value = _finite(value)
        if value is None:
            return
        key = _CONTENTION.get(name)
        if key is None and name.startswith("hw.gpu.throttle.") and name != "hw.gpu.throttle.reasons":
            key, value = "gpu_throttled", float(value > 0)
        if key is not None:
            self.signals.setdefault(key, []).append(value)

    def result(self, path: Path, meta: Mapping[str, Any]) -> RunSamples:
        if self.first_wall_ns is not None and (self.curves.first_wall_ns is None or
                                               self.first_wall_ns < self.curves.first_wall_ns):
            self.curves.first_wall_ns = self.first_wall_ns
        created = meta.get("created_wall_ns")
        hardware = meta.get("hardware")
        cpus = hardware.get("cpu_count") if isinstance(hardware, dict) else None
        return RunSamples(
            path=path,
            run_id=str(meta.get("run_id") or path.name),
            session_tag=str(meta.get("session_tag") or path.parent.name),
            perf_tag=str(meta.get("perf_tag") or self.perf_tag),
            created_wall_ns=created if isinstance(created, int) else 0,
            windows=self.windows,
            skipped_windows=self.skipped,
            iteration_spans=self.spans,
            workload=dict(meta["workload"]) if isinstance(meta.get("workload"), dict) else {},
            durations=self.durations,
            contention={k: statistics.fmean(v) for k, v in self.signals.items() if v},
            is_baseline=self.is_baseline or meta.get("is_baseline_run") is True,
            cpu_count=statistics.fmean(self.sampler_cpus) if self.sampler_cpus else hardware_cpu_count(cpus),
            curves=self.curves,
        )




def _wanted(raw: bytes) -> bool:
    """The lines the comparison reads (a few percent of a file): the reports, the iteration, checkpoint and
    validation spans' ends, the sampler's CPU and throttling metrics and the config's baseline marker; the others are
    not even decoded."""
    head = raw[:40]
    if _UPDATE_BYTES in raw:
        return True
    if b'"span_end"' in head:
        return _ITERATION_BYTES in raw or any(name in raw for name in _DURATION_BYTES)
    if b'"metric"' in head:  # the contention signals, and the user's metrics (curves)
        return any(name in raw for name in _CONTENTION_BYTES) or not any(g in raw for g in _NOT_USER_BYTES)
    return _INIT_BYTES in raw or _SAMPLER_START_BYTES in raw


def read_samples(path: str | Path, on_file: Callable[[int], None] | None = None, *,
                 curves: Callable[[str], bool] | None = None, goodput: bool = False) -> RunSamples:
    """The samples of the run directory ``path``: with the ``columnar`` extra by SQL over its columnar copy and JSONL
    tail (``store.engine``), else read straight from its files, decoding only the lines needed (faster than loading
    the whole run); ``on_file(bytes)`` is called after each file (for a progress bar). ``curves``: which user series
    (by name) feed ``RunSamples.curves`` (default: every one; its ``first_wall_ns`` is always that of every user
    metric); ``goodput``: also the run's own goodput (``with_goodput``), read by the same engine. Raises
    ``FileNotFoundError`` and ``NotARunError`` as ``open_run`` does."""
    p = Path(path)
    run = open_run(p)  # raises its error: missing, a file, not a run
    if not run.processes:
        raise NotARunError(f"{p} holds no process files (rank-<R>.<pid>.jsonl)")
    from ..store.engine import engine_for

    engine = engine_for([p])
    if engine is not None:
        from .samples_sql import samples_sql

        try:
            result = samples_sql(engine, run, curves)
            if goodput:
                with_goodput(result, engine)
        finally:
            engine.close()
        if on_file is not None:
            on_file(run_bytes(p))
        return result
    collector = _Collector(curves)
    for log in in_start_order(run.processes):  # (a series' steps in the order written: a restart's rollback)
        collector.feed(scan_process(log.paths, run.meta, _wanted))
        if on_file is not None:
            on_file(sum(f.stat().st_size for f in log.paths if f.exists()))
    result = collector.result(p, run.meta)
    return with_goodput(result) if goodput else result


def run_samples(run: Run | str | Path) -> RunSamples:
    """The steady-state windows and sampled iteration spans of a run (a loaded ``Run``, or its directory)."""
    if not isinstance(run, Run):
        return read_samples(run)
    if not run.processes:
        raise NotARunError(f"{run.path} holds no process files")
    collector = _Collector()
    for process in in_start_order(run.processes):
        collector.feed(process.records)
    return collector.result(run.path, run.meta)


def _window_of(rank: int, pid: int, a: Mapping[str, Any]) -> Window | None:
    mean = _finite(a.get("avg_iteration_time_sec"))
    iteration = a.get("current_iteration")
    count = a.get("window_iterations")
    if mean is None or mean <= 0 or not isinstance(iteration, int) or not isinstance(count, int) or count < 1:
        return None
    throughput = _finite(a.get("samples_per_second"))
    share = contention_share(_finite(a.get("cpu_time_sec")), _finite(a.get("cpu_wait_sec")))
    phases, source = phase_times(a, PHASES)
    return Window(rank=rank, pid=pid, iteration=iteration, iterations=count, iteration_time=mean,
                  samples_per_second=throughput if throughput and throughput > 0 else None, phases=phases,
                  final=bool(a.get("final")), phase_source=source, cpu_wait_fraction=share)


def with_goodput(samples: RunSamples, engine: Any = None) -> RunSamples:
    """``samples`` with the run's own goodput (the run folder read as a session of one run: its productive time
    over its wall time, docs/goodput.md); unchanged when it cannot be computed (no training, damaged records). Reads
    the whole run (``engine``: a ``store.engine.Engine`` that has read it already)."""
    from ..training.goodput import goodput
    from .open_loops import open_loop_ranks

    try:
        report = goodput(samples.path, engine=engine)
        samples.goodput = report.goodput
        # a loop that never ended, not every "killed": a SIGTERM-ended loop reported its last iterations at close
        open_runs = [r for r in report.runs if r.open_loop]
        # the goodput is rank 0's, but a run where another rank's loop never ended (a SIGKILLed rank, its peers
        # ended by the lost collective or finished) is not complete: the first such rank's status is asked too
        others = [rank for rank in open_loop_ranks(open_run(samples.path), engine) if rank != report.rank]
        if others and not any(r.status == "running" for r in open_runs):
            open_runs += [r for r in goodput(samples.path, rank=others[0], engine=engine).runs if r.open_loop]
        samples.open_loop = next(("running" for r in open_runs if r.status == "running"),
                                 "killed" if open_runs or others else "")
        samples.open_ranks = tuple(sorted({*others, *([report.rank] if any(r.open_loop for r in report.runs)
                                                      else [])}))
    except Exception:  # noqa: BLE001 - goodput is one row of a comparison; the rest stands without it
        samples.goodput = None
    return samples
