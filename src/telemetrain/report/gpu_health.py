"""GPU health joined to step time: per report window, what the GPU went through while the window ran.

Each rank's system sampler (``telemetrain.system``) writes its own GPUs' samples into the rank's own process file,
beside the rank's ``training_metrics_update`` windows, so the join is per process file: a window covers
``[end - window_seconds, end]`` of wall time; a sample at time t stands for the half sampling interval on either side
of it (its series' median spacing / 2), so a window shorter than the interval still meets its nearest sample. For
each window: the throttle reasons active in any sample met (``hw.gpu.throttle.power`` -- power cap or brake --,
``.thermal``, ``.hw_slowdown``), the SM clock (min, mean), the board power (mean), the device memory in use (max
fraction) and the caching allocator's retries during the window (``torch.cuda.alloc_retries`` growing: memory
pressure).

The finding: a window whose iteration time rose ``RISE`` or more above the rank's median window while a throttle
reason was active. Both must hold: a throttle that costs nothing (clocks held at a cap the job does not reach) is
shown, not flagged, and a slow window with no throttle is some other finding's business. A clean run -- no throttle
sample -- never gets it. Energy per unit of work comes from the windows' own energy attributes (``gpu_report``):
each rank's share of its GPUs, summed over ranks, so a GPU is counted once however many ranks share it.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from ..store.reader import Run

__all__ = ["RISE", "GpuHealth", "GpuWindow", "build_gpu_health", "gpu_findings", "gpu_headline"]

RISE = 0.10  # a window this much slower than the rank's median window, while throttled, is flagged
THROTTLES = {"hw.gpu.throttle.power": "power", "hw.gpu.throttle.thermal": "thermal",
             "hw.gpu.throttle.hw_slowdown": "hw_slowdown"}
_SERIES = (*THROTTLES, "hw.gpu.clock.sm", "hw.power", "hw.gpu.memory.utilization", "torch.cuda.alloc_retries")
# a run without any of these has nothing to join (train.energy_J: its name in runs written before)
_RELEVANT = frozenset((*_SERIES, "train.energy", "train.energy_J"))


@dataclasses.dataclass
class GpuWindow:
    """One rank's report window and the GPU samples it met."""

    rank: int
    iteration: int
    start_ns: int
    end_ns: int
    avg: float | None  # mean iteration time (host: what the step cost)
    device_avg: float | None  # mean iteration device time, when device timing was on
    throttles: tuple[str, ...] = ()  # reasons active in any sample met
    sm_clock_min: float | None = None  # Hz
    sm_clock_mean: float | None = None
    power_mean: float | None = None  # W
    memory_max: float | None = None  # fraction of device memory in use
    alloc_retries: int | None = None  # allocator retries during the window
    energy_per_sample: float | None = None  # J (the rank's estimate for the job)
    rise: float | None = None  # avg / the rank's median window - 1
    samples: int = 0  # GPU samples met

    @property
    def flagged(self) -> bool:
        return bool(self.throttles) and self.rise is not None and self.rise >= RISE


@dataclasses.dataclass
class GpuHealth:
    windows: list[GpuWindow]
    sampled: bool  # some process recorded GPU samples
    energy_J: float | None  # the job's training-loop energy: the ranks' shares summed
    samples: int | None  # global samples those joules bought
    tokens: int | None

    @property
    def flagged(self) -> list[GpuWindow]:
        return [w for w in self.windows if w.flagged]

    @property
    def energy_per_sample(self) -> float | None:
        return self.energy_J / self.samples if self.energy_J is not None and self.samples else None

    @property
    def energy_per_token(self) -> float | None:
        return self.energy_J / self.tokens if self.energy_J is not None and self.tokens else None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class _Series:
    """One metric's samples in one process file, by wall time."""

    def __init__(self, points: list[tuple[int, float]]) -> None:
        points.sort()
        self.times = [t for t, _ in points]
        self.values = [v for _, v in points]
        gaps = [b - a for a, b in zip(self.times, self.times[1:], strict=False) if b > a]
        self.reach = statistics.median(gaps) // 2 if gaps else 0

    def during(self, start: int, end: int) -> list[float]:
        lo = bisect.bisect_left(self.times, start - self.reach)
        hi = bisect.bisect_right(self.times, end + self.reach)
        return self.values[lo:hi]

    def at_or_before(self, t: int) -> float | None:
        i = bisect.bisect_right(self.times, t)
        return self.values[i - 1] if i else None


def _join(w: GpuWindow, series: dict[str, _Series]) -> None:
    met = 0
    active = []
    for name, reason in THROTTLES.items():
        s = series.get(name)
        if s is not None:
            values = s.during(w.start_ns, w.end_ns)
            met = max(met, len(values))
            if any(v >= 1 for v in values):
                active.append(reason)
    w.throttles = tuple(active)
    clock = series.get("hw.gpu.clock.sm")
    if clock is not None and (values := clock.during(w.start_ns, w.end_ns)):
        w.sm_clock_min, w.sm_clock_mean = min(values), statistics.fmean(values)
        met = max(met, len(values))
    power = series.get("hw.power")
    if power is not None and (values := power.during(w.start_ns, w.end_ns)):
        w.power_mean = statistics.fmean(values)
    memory = series.get("hw.gpu.memory.utilization")
    if memory is not None and (values := memory.during(w.start_ns, w.end_ns)):
        w.memory_max = max(values)
    retries = series.get("torch.cuda.alloc_retries")
    if retries is not None:
        # a counter: the growth from the last reading at or before the window's start to its last reading in it
        inside = [v for t, v in zip(retries.times, retries.values, strict=True) if w.start_ns < t <= w.end_ns]
        before = retries.at_or_before(w.start_ns)
        if inside:
            w.alloc_retries = int(max(inside) - (before if before is not None else min(inside)))
    w.samples = met


def _rises(windows: list[GpuWindow]) -> None:
    by_rank: dict[int, list[GpuWindow]] = defaultdict(list)
    for w in windows:
        by_rank[w.rank].append(w)
    for ws in by_rank.values():
        times = [w.avg for w in ws if w.avg is not None and w.avg > 0]
        if len(times) < 3:  # too few windows for a median to mean "usual"
            continue
        median = statistics.median(times)
        for w in ws:
            if w.avg is not None and median > 0:
                w.rise = w.avg / median - 1


class _Row(NamedTuple):
    """The fields of a record read here (``_processes_sql``)."""

    kind: str
    group: str
    name: str
    value: Any
    wall_ns: int
    attributes: dict[str, Any] | None


def _processes_sql(engine: Any, run: Run) -> Iterator[tuple[int, Iterator[Any]]]:
    """(rank, records) of each process of ``run``, by SQL: only the rows read here (the ``_SERIES`` metrics and the
    reports) and only their fields read here (narrow rows: a sort of whole rows would outgrow DuckDB's memory), in
    file order, process by process (rank, pid), streamed in batches."""

    from ..store.codec import loads_column

    engine.attach(run)
    session, run_id = (v.replace("'", "''") for v in (run.session_tag, run.run_id))
    w = f"session = '{session}' AND run = '{run_id}' AND role <> 'agent'"
    names = "(" + ", ".join(f"'{n}'" for n in _SERIES) + ")"
    query = (f"SELECT 'metric' AS kind, rank, pid, segment, line, wall_ns, group_name, name, value, value_int, "
             f"value_bool, NULL AS attributes FROM metrics WHERE {w} AND name IN {names} UNION ALL "
             f"SELECT 'event', rank, pid, segment, line, wall_ns, group_name, name, NULL, NULL, NULL, attributes "
             f"FROM events WHERE {w} AND group_name = 'training' AND name = 'training_metrics_update' "
             "ORDER BY rank, pid, segment, line")

    def rows() -> Iterator[tuple[tuple[int, int], _Row]]:
        for _, batch in engine.stream(query):
            for kind, rank, pid, _, _, wall, group, name, value, value_int, value_bool, text in batch:
                if value_bool is not None:
                    value = bool(value_bool)
                elif value_int is not None:
                    value = int(value_int)
                attributes = loads_column(text)
                yield (rank, pid), _Row(kind, group, name, value, wall,
                                        attributes if isinstance(attributes, dict) else None)

    for (rank, _), group in itertools.groupby(rows(), key=lambda kr: kr[0]):
        yield rank, (r for _, r in group)


def build_gpu_health(run: Run, metric_names: Iterable[str] | None = None, engine: Any = None) -> GpuHealth:
    """Every rank's windows joined with the GPU samples of the same process file, and the job's energy.
    ``metric_names``: the names of the run's metrics, when the caller has them: a run with neither GPU samples nor
    energy (a CPU job) is then not read again. ``engine``: a ``store.engine.Engine`` over the run, to select the
    rows read here by SQL instead of reading every record (the windows kept are the same: one per report)."""
    if metric_names is not None and not _RELEVANT.intersection(metric_names):
        return GpuHealth([], False, None, None, None)
    windows: list[GpuWindow] = []
    sampled = False
    energy: dict[int, tuple[float, int | None, int | None]] = {}  # rank -> (joules, samples, tokens), last report
    processes = _processes_sql(engine, run) if engine is not None else ((log.rank, iter(log.records))
                                                                         for log in run.processes)
    for log_rank, records in processes:
        points: dict[str, list[tuple[int, float]]] = defaultdict(list)
        own: list[GpuWindow] = []
        for r in records:
            kind = r.kind
            if kind == "metric":
                if r.name in _SERIES and (value := _num(r.value)) is not None:
                    points[r.name].append((r.wall_ns, value))
            elif kind == "event" and r.name == "training_metrics_update" and r.group == "training":
                a = r.attributes or {}
                iteration = a.get("current_iteration")
                if isinstance(iteration, bool) or not isinstance(iteration, int) or a.get("warmup_only"):
                    continue
                seconds = _num(a.get("window_seconds")) or 0.0
                start = r.wall_ns - round(max(seconds, 0.0) * 1e9)
                own.append(GpuWindow(log_rank, iteration, start, r.wall_ns, _num(a.get("avg_iteration_time_sec")),
                                     _num(a.get("avg_iteration_device_time_sec")),
                                     energy_per_sample=_num(a.get("energy_per_sample_J"))))
                joules = _num(a.get("cumulative_energy_J"))
                if joules is not None:
                    samples, tokens = a.get("num_train_samples"), a.get("train_tokens")
                    energy[log_rank] = (joules, samples if isinstance(samples, int) else None,
                                        tokens if isinstance(tokens, int) else None)
        series = {name: _Series(p) for name, p in points.items()}
        sampled = sampled or any(name.startswith("hw.") for name in series)
        if series:
            for w in own:
                _join(w, series)
        windows.extend(own)
    _rises(windows)
    windows.sort(key=lambda w: (w.iteration, w.rank))
    joules = math.fsum(j for j, _, _ in energy.values()) if energy else None
    samples = max((s for _, s, _ in energy.values() if s), default=None)
    tokens = max((t for _, _, t in energy.values() if t), default=None)
    return GpuHealth(windows, sampled, joules, samples, tokens)


def _ranges(values: Iterable[int]) -> str:
    ordered = sorted(set(values))
    return ", ".join(map(str, ordered[:8])) + (f" (+{len(ordered) - 8} more)" if len(ordered) > 8 else "")


def gpu_findings(health: GpuHealth | None) -> list[tuple[str, str, str, str]]:
    """(severity, kind, title, detail) of the report's GPU findings."""
    if health is None:
        return []
    out = []
    flagged = health.flagged
    if flagged:
        worst = max(flagged, key=lambda w: w.rise or 0.0)
        reasons = sorted({r for w in flagged for r in w.throttles})
        clocks = [w.sm_clock_min for w in flagged if w.sm_clock_min]
        usual = [w.sm_clock_mean for w in health.windows if not w.throttles and w.sm_clock_mean]
        clock = (f"; SM clock down to {min(clocks) / 1e6:.0f} MHz" if clocks else "") + (
            f" against {statistics.median(usual) / 1e6:.0f} MHz in unthrottled windows" if clocks and usual else "")
        out.append((
            "warning", "gpu throttling", f"GPU throttling slowed {len(flagged)} window(s)",
            f"iteration time >= {RISE:.0%} above the rank's median window while the GPU was throttled "
            f"({', '.join(reasons)}) in {len(flagged)} window(s) on rank(s) {_ranges(w.rank for w in flagged)}; "
            f"worst: rank {worst.rank}, window ending at iteration {worst.iteration}, "
            f"+{(worst.rise or 0.0):.0%}{clock}"))
    pressure = [w for w in health.windows if w.alloc_retries]
    if pressure:
        retries = sum(w.alloc_retries or 0 for w in pressure)
        out.append((
            "warning", "gpu memory pressure", f"GPU memory pressure in {len(pressure)} window(s)",
            f"the CUDA caching allocator retried cudaMalloc after freeing its cache {retries}"
            f" time(s) in windows on rank(s) {_ranges(w.rank for w in pressure)} (torch.cuda.alloc_retries): each "
            "retry synchronises the device"))
    return out


def gpu_headline(health: GpuHealth | None) -> list[tuple[str, str, str]]:
    """(label, value, how) rows for the report's headline: energy per unit of work."""
    if health is None or health.energy_J is None:
        return []
    rows = []
    per_sample, per_token = health.energy_per_sample, health.energy_per_token
    how = ("cumulative_energy_J of each rank's last training_metrics_update (its share of its GPUs' energy over the "
           "training loop), summed over ranks, / num_train_samples")
    rows.append(("energy per sample", f"{per_sample:.4g} J" if per_sample is not None else "n/a", how))
    if per_token is not None:
        rows.append(("energy per token", f"{per_token:.4g} J", how.replace("num_train_samples", "train_tokens")))
    return rows
