"""The report's collection in one Python pass over every record of a run (``_Collector``): the windows, lifecycle
spans, events, problems, system samples and per-series stats the report's sections need, and the findings engine's
input; the rows it collects (``Window``, ``SpanRow``, ``EventRow``) and the limits on what it keeps.
``model_sql.SqlCollector`` does the same collection by SQL; ``model.build_model`` makes the report's model of either.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from ..analysis.counter_totals import CounterTotals
from ..analysis.findings import InputBuilder
from ..analysis.findings.builder import STALL, STALL_EVIDENCE
from ..analysis.findings.worker_exits import EVENT as WORKER_FAILED
from ..phase_times import iteration_time, phase_times
from ..semconv import series_key
from ..store.reader import ProcessLog, Run, in_start_order
from ..training.names import checkpoint_step
from .curves import CurveBuilder
from .headline import _num
from .windows import WindowFigures, window_figures

__all__ = ["PHASES", "EventRow", "SpanRow", "Window", "downsample", "stride"]

PHASES = ("dataloader", "forward", "backward", "optimizer", "zero_grad")
# the sub-phase spans of an iteration -> the phase their time is reported under (avg_<phase>_time_sec)
PHASE_SPANS = {"data_loading": "dataloader", "model_forward": "forward", "model_backward": "backward",
               "optimizer_update": "optimizer", "zero_grad": "zero_grad"}
LIFECYCLE_SPANS = ("application", "distributed_code_initialization", "data_loader_initialization",
                   "model_initialization", "optimizer_initialization", "checkpoint_load", "checkpoint_save_sync",
                   "checkpoint_save_async", "training_loop", "validation_loop", "testing_loop")
CHECKPOINT_SPANS = ("checkpoint_load", "checkpoint_save_sync", "checkpoint_save_async")
# events whose figures have their own sections: left out of the events table (they would flood it)
ROUTINE_EVENTS = frozenset({"training_metrics_update", "sync_checkpoint_metrics_update", "validation_metrics_update",
                            "testing_metrics_update", "straggler", "training_progress", "clock_offset"})
# (metric name, chart title, unit) of the system charts, in page order
SYSTEM_CHARTS = (
    ("system.cpu.utilization", "host CPU utilization", "1"),
    ("system.memory.utilization", "host memory utilization", "1"),
    ("container.memory.utilization", "container memory working set, share of its cgroup limit", "1"),
    ("process.cpu.utilization", "process CPU utilization (per rank)", "1"),
    ("process.memory.usage", "process resident memory (per rank)", "By"),
    ("hw.gpu.utilization", "GPU utilization", "1"),
    ("hw.gpu.memory.utilization", "GPU memory utilization", "1"),
    ("hw.power", "GPU power", "W"),
    ("hw.temperature", "GPU temperature", "Cel"),
)
_SYSTEM_NAMES = frozenset(name for name, _, _ in SYSTEM_CHARTS)
_ENERGY_NAMES = ("hw.energy", "hw.energy.integrated")

MAX_EVENT_ROWS = 300
# of one (group, name), the events listed: a job of many ranks would otherwise fill the list with each rank's start
# events (the events by name table counts them all)
MAX_EVENT_ROWS_PER_NAME = 16
MAX_CHECKPOINT_ROWS = 500  # the save_checkpoint_success events the report lists (the earliest)
# the checkpoint spans the report shows (the timeline's ticks; its table, the first 500), the earliest: the others are
# counted and timed (the lifecycle table), their attributes not held (6,400 spans of 64 ranks held ~5 MiB of them)
MAX_CHECKPOINT_SPANS = 1000
MAX_SERIES_POINTS = 800
ITERATION_CHART_POINTS = 1000  # html.MAX_CHART_POINTS: the iteration spans drawn when there are no windows


@dataclasses.dataclass(slots=True)
class Window:
    """One ``training_metrics_update`` of one rank: the iterations since its previous report."""

    rank: int
    iteration: int  # current_iteration: the global step of the window's last iteration
    wall_ns: int
    iterations: int
    avg: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None
    total: float | None
    samples_per_second: float | None
    phases: dict[str, float]
    phase_source: str = "host"  # the clock of `phases`: "device" (CUDA events) when the window has device times
    phase_avg: float | None = None  # the mean iteration time on that clock (the phase split's total)


@dataclasses.dataclass(slots=True)  # (a long run of many ranks has one per checkpoint per rank: no __dict__ each)
class SpanRow:
    rank: int
    name: str
    start_ns: int
    duration_s: float | None  # None: never ended (the process was killed)
    status: str
    attributes: dict[str, Any]
    error: str = ""
    step: int | None = None  # a checkpoint span's iteration (``checkpoint_step``), kept when its attributes are not

    def __post_init__(self) -> None:
        if self.step is None and self.name in CHECKPOINT_SPANS:
            self.step = checkpoint_step(self.attributes)


@dataclasses.dataclass
class EventRow:
    wall_ns: int
    source: str  # "rank 3" or "agent <host>"
    group: str
    name: str
    severity: str
    attributes: dict[str, Any]


def _window(rank: int, wall_ns: int, attributes: dict[str, Any]) -> Window | None:
    iteration = attributes.get("current_iteration")
    if isinstance(iteration, bool) or not isinstance(iteration, int):
        return None
    phases, source = phase_times(attributes, PHASES)
    n = attributes.get("window_iterations")
    return Window(
        rank=rank, iteration=iteration, wall_ns=wall_ns, iterations=n if isinstance(n, int) else 0,
        avg=_num(attributes, "avg_iteration_time_sec"), p50=_num(attributes, "p50_iteration_time_sec"),
        p90=_num(attributes, "p90_iteration_time_sec"), p99=_num(attributes, "p99_iteration_time_sec"),
        max=_num(attributes, "max_iteration_time_sec"), total=_num(attributes, "total_iteration_time_sec"),
        samples_per_second=_num(attributes, "samples_per_second"), phases=phases, phase_source=source,
        phase_avg=iteration_time(attributes, source),
    )


class _Collector:
    """The one pass over every record of the run."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.windows: dict[int, list[Window]] = defaultdict(list)
        self.last_update: dict[int, dict[str, Any]] = {}
        self.iteration_spans: dict[int, list[tuple[int, float]]] = defaultdict(list)
        self.span_phase_seconds: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.lifecycle: list[SpanRow] = []
        self.successes: list[EventRow] = []
        self.events: list[EventRow] = []
        self.events_left_out = 0
        self._listed_by_name: Counter[tuple[str, str]] = Counter()
        self.event_counts: Counter[tuple[str, str, str]] = Counter()
        self.problems: list[EventRow] = []
        self.stragglers: list[dict[str, Any]] = []
        self.system: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)  # (name, who) -> points
        # (host, group, name) -> a GPU's joules over the sampler's lifetimes (analysis.counter_totals), by collect()
        self.energy: dict[tuple[str, str, str], float] = {}
        self._energy: CounterTotals[tuple[str, str, str]] = CounterTotals()
        self.dropped = 0
        self.sink_failures: Counter[tuple[str, str]] = Counter()  # (sink, what) -> records concerned
        self.unencodable = 0
        self.metric_stats: dict[tuple[str, str], list[Any]] = {}  # (group, name) -> [count, last, min, max, unit]
        self.span_stats: dict[tuple[str, str], list[Any]] = {}  # (group, name) -> [count, seconds, not ok]
        self.hyperparameters: dict[str, Any] = {}
        self.training_config: dict[str, Any] = {}
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.inputs = InputBuilder()  # what the findings engine reads
        self.curves = CurveBuilder()  # the user's metrics, bucketed for the charts

    def collect(self) -> None:
        for log in in_start_order(self.run.processes):  # (the curves follow each series' steps as written)
            self._process(log, f"rank {log.rank}", agent=False)
        for log in self.run.agents:
            self._process(log, f"agent {log.identity.host}", agent=True)
        self.energy = self._energy.totals()
        self.events.sort(key=lambda e: e.wall_ns)
        self.problems.sort(key=lambda e: e.wall_ns)

    def window_figures(self) -> WindowFigures:
        windows = {rank: sorted(ws, key=lambda w: (w.iteration, w.wall_ns)) for rank, ws in sorted(self.windows.items())
                   if ws}
        return window_figures(windows, Window)

    def close(self) -> None:
        """Let go of what the collection held outside Python (the SQL path's temporary tables)."""

    def release_charted(self) -> None:
        """Let go of what ``build_model`` has drawn from (the curves' buckets: ~10 MiB at 64 ranks; the iteration
        spans), before the findings engine runs with its windows: what the process holds then grows with the ranks
        (docs/scale.md)."""
        self.curves = CurveBuilder(self.curves.capacity)
        self.iteration_spans.clear()

    def windows_at(self, flagged: set[tuple[int, int, int]]) -> list[Window]:
        """The report windows (unmerged) of these (rank, first step, last step)s: of each range, the window(s) ending
        in it whose slowest iteration is the slowest (one window, unless the findings engine merged the range's
        windows into one: ``findings.window_budget``)."""
        out: dict[int, Window] = {}
        by_rank: dict[int, list[Window]] = {}
        for rank, first, last in flagged:
            ws = by_rank.get(rank)
            if ws is None:
                ws = by_rank[rank] = sorted((w for w in self.windows.get(rank, ()) if w.max is not None
                                             and math.isfinite(w.max)), key=lambda w: w.iteration)
            lo = bisect.bisect_left(ws, first, key=lambda w: w.iteration)
            hi = bisect.bisect_right(ws, last, key=lambda w: w.iteration)
            top = max((w.max for w in ws[lo:hi] if w.max is not None), default=None)
            out.update((id(w), w) for w in ws[lo:hi] if w.max == top)
        return list(out.values())

    def iteration_span_points(self) -> dict[int, list[tuple[int, float]]]:
        """The lowest rank with exported iteration spans -> (wall ns, seconds) of every ``stride``-th of them (what
        the chart draws)."""
        ranks = [rank for rank, points in self.iteration_spans.items() if points]
        if not ranks:
            return {}
        ordered = sorted(self.iteration_spans[min(ranks)])
        return {min(ranks): ordered[::stride(len(ordered), ITERATION_CHART_POINTS)]}

    def system_points(self) -> dict[tuple[str, str], list[tuple[int, float]]]:
        """(metric, who) -> its samples (wall ns, value) in time order, ``downsample``d."""
        return {key: downsample(sorted(points)) for key, points in self.system.items()}

    def _note_event(self, row: EventRow) -> None:
        listed = self._listed_by_name[(row.group, row.name)]
        if len(self.events) < MAX_EVENT_ROWS and listed < MAX_EVENT_ROWS_PER_NAME:
            self.events.append(row)
            self._listed_by_name[(row.group, row.name)] = listed + 1
        else:
            self.events_left_out += 1

    def _process(self, log: ProcessLog, source: str, *, agent: bool) -> None:
        rank = log.rank
        host = log.identity.host
        open_spans: dict[str, tuple[str, int, dict[str, Any]]] = {}
        windows = self.windows[rank]
        spans = self.iteration_spans[rank]
        phase_seconds = self.span_phase_seconds[rank]
        metric_stats = self.metric_stats
        span_stats = self.span_stats
        inputs = self.inputs
        first = last = None
        for r in log.records:
            kind = r.kind
            wall = r.wall_ns
            if first is None or wall < first:
                first = wall
            if last is None or wall > last:
                last = wall
            if kind == "metric":
                value = r.value
                name = series_key(r.name, r.attributes) if r.attributes else r.name  # v1 and v2 alike
                if not agent:
                    inputs.metric(rank, host, r.group, name, r.step, value, wall)
                    self.curves.add(rank, r.group, name, r.step, value, wall, r.unit)
                key = (r.group, name)
                st = metric_stats.get(key)
                if st is None:
                    metric_stats[key] = st = [0, value, None, None, r.unit]
                st[0] += 1
                st[1] = value
                if type(value) is not bool and math.isfinite(value):  # min and max of the finite numbers
                    if st[2] is None or value < st[2]:
                        st[2] = value
                    if st[3] is None or value > st[3]:
                        st[3] = value
                if name in _SYSTEM_NAMES and not isinstance(value, bool):
                    who = host if name.startswith(("system.", "container.")) else f"rank {rank}"
                    if name.startswith("hw."):
                        who = f"{host} {r.group.removeprefix('system.')}"
                    self.system[(name, who)].append((wall, float(value)))
                elif name in _ENERGY_NAMES and isinstance(value, (int, float)) and math.isfinite(value):
                    self._energy.add((host, r.group, name), (rank, r.identity.pid, r.identity.restart_count), wall,
                                     float(value))
            elif kind == "span_start":
                if r.name in LIFECYCLE_SPANS:
                    open_spans[r.span_id] = (r.name, wall, dict(r.attributes or {}))
            elif kind == "span_end":
                name = r.name
                duration = r.duration_ns / 1e9
                key = (r.group, name)
                st = span_stats.get(key)
                if st is None:
                    span_stats[key] = st = [0, 0.0, 0]
                st[0] += 1
                st[1] += duration
                if r.status != "ok":
                    st[2] += 1
                if name == "training_single_iteration":
                    spans.append((wall, duration))
                elif name in PHASE_SPANS:
                    phase_seconds[PHASE_SPANS[name]] += duration
                if name in LIFECYCLE_SPANS:
                    _, _, attributes = open_spans.pop(r.span_id, (name, wall, {}))
                    attributes.update(r.attributes or {})
                    self.lifecycle.append(SpanRow(rank, name, wall - r.duration_ns, duration, r.status, attributes,
                                                  r.error))
                if r.status != "ok":
                    self.problems.append(EventRow(wall, source, r.group, name, "error" if r.status == "error"
                                                  else "warning", {"span status": r.status, "error": r.error,
                                                                   "duration_s": duration}))
            elif kind == "event":
                name = r.name
                group = r.group
                attributes = r.attributes or {}
                self.event_counts[(source if agent else "ranks", group, name)] += 1
                if group == "training" and name == "training_metrics_update":
                    window = _window(rank, wall, attributes)
                    if window is not None:
                        windows.append(window)
                    inputs.window(rank, log.pid, wall, attributes)
                    self.last_update[rank] = attributes
                    continue
                if not agent and name in ("hyperparameters", "update_training_telemetry_config"):
                    into = self.hyperparameters if group == "run" else self.training_config
                    for key, value in attributes.items():
                        into.setdefault(key, value)  # ranks agree; the lowest rank's value is kept otherwise
                if group == "cross_rank" and name == "straggler":
                    self.stragglers.append({**attributes, "reported_by": rank, "wall_ns": wall})
                    inputs.straggler(attributes)
                    continue
                if (group, name) == STALL:
                    inputs.stall(attributes)
                elif (group, name) == WORKER_FAILED and agent:
                    inputs.worker_failed(attributes)
                elif (group, name) == STALL_EVIDENCE and not agent:
                    inputs.stall_evidence(rank, attributes)
                row = EventRow(wall, source, group, name, r.severity, attributes)
                if name == "save_checkpoint_success":
                    self.successes.append(row)
                if r.severity in ("warning", "error", "critical") or (group == "training" and name == "error"):
                    self.problems.append(row)
                elif name not in ROUTINE_EVENTS:
                    self._note_event(row)
            elif kind == "stat":
                if not agent:
                    inputs.stat(rank, r.group, r.name, r.values or {})
            elif kind == "diagnostic":
                name = r.name
                if name == "dropped":
                    self.dropped += r.record_count
                elif name == "unencodable":
                    self.unencodable += max(r.record_count, 1)
                elif name in ("sink_error", "sink_suspended"):
                    self.sink_failures[(r.sink, name)] += max(r.record_count, 1)
                if name != "sink_resumed":
                    self.problems.append(EventRow(wall, source, "diagnostic", name, "warning",
                                                  {"sink": r.sink, "records": r.record_count, "message": r.message}))
        for name, start, attributes in open_spans.values():  # started, never ended: the process was killed
            self.lifecycle.append(SpanRow(rank, name, start, None, "never ended", attributes))
        if first is not None:
            self.first_ns = first if self.first_ns is None else min(self.first_ns, first)
        if last is not None:
            self.last_ns = last if self.last_ns is None else max(self.last_ns, last)


def stride(n: int, limit: int) -> int:
    """Every how many points a series of ``n`` is drawn with at most about ``limit`` (the SQL path uses the same)."""
    return max(1, n // limit)


def downsample(points: Sequence[tuple[Any, float]], limit: int = MAX_SERIES_POINTS) -> list[tuple[Any, float]]:
    """Every ``stride``-th point and the last (the same points the SQL path selects)."""
    step = stride(len(points), limit)
    out = list(points[::step])
    if out and (len(points) - 1) % step:
        out.append(points[-1])
    return out
