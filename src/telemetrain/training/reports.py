"""The derived training metrics (``training_metrics_update``), computed off the training thread.

At each report the recorder's iteration callback only *captures* a ``Snapshot`` -- the finished ``Window`` of
iteration times (swapped for a fresh one: O(1)) and the counters and config values of that instant -- and hands it
to a ``Reporter``. The reporter computes the metrics (percentiles, the cumulative sketch, throughput, MFU) and emits
the event and the metric records in the process's collector thread (the step only appends: folding and
percentiles happen off it), so a report costs the training thread a few microseconds instead of ~100. Reports come out
in order. The final report of a loop (training end, exit, SIGTERM), a ``Telemetry.flush()``, and the start of a new
loop first compute whatever is pending in the calling thread, so nothing is lost or reordered around them.

Every formula is in docs/training.md; the recorder's tests check each one on controlled timings.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..collector import collector
from ..records import StatWindow
from ..semconv import TRAIN_PHASE
from ..stats.aggregations import M2, MINMAX
from ..stats.summary import Summary
from . import cpu_wait
from .gpu_report import METRICS as GPU_METRICS

__all__ = ["ITERATION_TIME", "METRICS", "QUANTILES", "REPORT_SOURCES", "TIME_AGGS", "Reporter", "Snapshot", "Window",
           "capture", "compute", "emit_derived"]

QUANTILES = ("p50", "p90", "p99")
TIME_AGGS = ("count", "mean", "min", "max", "sum", *QUANTILES)
FOLD_EVERY = 2048  # iteration times handed to the reporter to fold in this many (bounded memory for long windows)
CUMULATIVE_BATCH = 1000  # iteration times batched into the cumulative histogram while behind (Reporter.add_window)
MAX_PENDING = 512  # reports waiting for the collector thread before the training thread computes them itself
TICK_NS = 50_000_000  # while reports keep coming, the collector drains them this often

# derived metric -> (metric record name, UCUM unit, attributes, factor): each of these values of the event is also a
# metric record (value x factor), at the report's step, for dashboards and every backend. Names are ours (no semantic
# convention covers training); units are UCUM and in base units (FLOP/s, not TFLOP/s); the running totals are
# counters for the backends that tell them apart (cumulative.py); the phases are one series per ``train.phase``. The
# window's iteration times are a stat record, ``train.iteration_time`` (``ITERATION_TIME``), with its histogram.
METRICS: dict[str, tuple[str, str, dict[str, str] | None, float]] = {
    "samples_per_second": ("train.samples_per_second", "{sample}/s", None, 1.0),
    "tokens_per_second": ("train.tokens_per_second", "{token}/s", None, 1.0),
    "train_throughput_per_gpu": ("train.flops_per_gpu", "{flop}/s", None, 1e12),  # the event's is TFLOP/s
    "mfu": ("train.mfu", "1", None, 1.0),
    "num_iterations": ("train.iterations", "{iteration}", None, 1.0),
    "num_train_samples": ("train.samples", "{sample}", None, 1.0),
    "train_tokens": ("train.tokens", "{token}", None, 1.0),
    "total_flops": ("train.flops", "{flop}", None, 1.0),
    "save_checkpoint_count": ("train.checkpoint.saves", "{checkpoint}", None, 1.0),
    "save_checkpoint_time_total_sec": ("train.checkpoint.save_time", "s", None, 1.0),
    **{f"avg_{phase}_time_sec": ("train.phase.duration", "s", {TRAIN_PHASE: phase}, 1.0)
       for phase in ("dataloader", "h2d", "forward", "backward", "optimizer", "zero_grad")},
    "avg_comm_time_sec": ("train.comm.time", "s", None, 1.0),
    "avg_comm_wait_time_sec": ("train.comm.wait", "s", None, 1.0),
    "comm_wait_fraction": ("train.comm.wait_fraction", "1", None, 1.0),
    "comm_bytes": ("train.comm.bytes", "By", None, 1.0),
    **GPU_METRICS,  # device times and energy (training.gpu_report), when measured
}
ITERATION_TIME = "train.iteration_time"  # the stat record of a window's iteration times (unit s)
# the derived metrics v1 wrote (one-logger's time aggregates as separate records, TFLOP/s, a name per phase)
OLD_METRICS = frozenset({
    "train.iteration_time.mean", "train.iteration_time.p50", "train.iteration_time.p90", "train.iteration_time.p99",
    "train.iteration_time.max", "train.tflops_per_gpu", "train.phase.dataloader", "train.phase.forward",
    "train.phase.backward", "train.phase.optimizer", "train.phase.zero_grad",
    # and, until the energy series' names lost their unit (the record carries it), v2's energy names
    "train.energy_J", "train.energy_per_sample_J", "train.energy_per_token_J", "train.gpu_power_W",
})

# Telemetry.extensions key: a list of report sources, each a callable run on the training thread when a report is
# captured (O(1): it swaps its own window) returning None or a function that the reporter calls, off the training
# thread, with the report's attributes so far and whose dict it adds to them (distributed.comm: comm_time_sec...)
REPORT_SOURCES = "training.report_sources"
_warned_source = False


def capture(sources: Any) -> tuple[Callable[[Mapping[str, Any]], Mapping[str, Any]], ...]:
    """The report sources' captures for one snapshot; a source that raises is skipped (warned once)."""
    if not sources:
        return ()
    out = []
    for source in list(sources):
        try:
            finish = source()
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks training
            _source_failed(exc)
            continue
        if finish is not None:
            out.append(finish)
    return tuple(out)


def _source_failed(exc: BaseException) -> None:
    global _warned_source
    if not _warned_source:
        _warned_source = True
        from ..dispatch import describe, warn_safely

        warn_safely(f"telemetrain.training: a report source failed (its figures are left out): {describe(exc)}")


class Window:
    """The iterations since the last metrics update. The training thread appends to ``times`` and moves every
    ``FOLD_EVERY`` of them to ``chunks``; only the reporter folds (under its lock)."""

    __slots__ = ("chunks", "pauses", "phases", "start_ns", "summary", "times", "warmup_times")

    def __init__(self, start_ns: int = 0) -> None:
        self.times: list[float] = []  # iteration seconds, warm-up excluded
        self.chunks: list[list[float]] = []  # full lists of times, waiting to be folded
        self.warmup_times: list[float] = []  # reported only when the window has nothing else
        self.summary: Summary | None = None  # made by the reporter when it first folds (off the training thread)
        self.start_ns = start_ns  # end of the previous window's last iteration (or the loop's start)
        self.phases: dict[str, float] = {}  # phase -> seconds
        # (start, end) monotonic ns of the checkpoint saves, validation and testing loops between its iterations
        self.pauses: list[tuple[int, int]] = []

    def fold_chunks(self) -> Summary:
        """Fold the full chunks into the window's summary (made now if it is the first fold) and return it."""
        summary = self.summary
        if summary is None:
            summary = self.summary = Summary()
        chunks = self.chunks
        while chunks:
            summary.fold(chunks.pop(0))
        return summary


@dataclass(slots=True)
class Snapshot:
    """What a report needs, captured on the training thread at the report's instant."""

    final: bool
    window: Window
    window_iterations: int  # warm-up included
    end_ns: int  # the window's last iteration end (monotonic)
    iterations: int  # completed this job
    iterations_start: int
    samples_start: int
    iteration_total_sec: float
    steady_start_ns: int
    steady_iterations: int
    first_iteration_end_ns: int
    last_iteration_end_ns: int
    time_to_first_iteration: float | None
    interval: int
    gbs: int
    seq: int | None
    fps: float | None
    # samples and tokens this job and in the window, as the iterations counted them (None: unknown)
    samples: int | None
    window_samples: int | None
    tokens: int | None
    window_tokens: int | None
    steady_samples: int | None  # since the end of warm-up
    # ns of the window (and since the end of warm-up) training paused in a checkpoint save, validation, testing
    paused_ns: int
    steady_paused_ns: int
    world: int
    peak: Any
    saves: dict[str, Any]
    loads: dict[str, Any]
    wall_offset_ns: int
    span_id: str  # the training loop's (the event is linked to it)
    extras: Callable[[Snapshot, dict[str, Any]], None] | None = None  # adds device times, energy (gpu_report)
    extra: tuple[Callable[[Mapping[str, Any]], Mapping[str, Any]], ...] = ()  # report sources' captures (capture)
    # (monotonic ns, process CPU ns, capturing thread's CPU ns, its id) at the capture: the window's CPU time
    clocks: tuple[int, int, int, int] | None = None
    # set by ``compute``: the window's iteration-time aggregates and histogram (the ``train.iteration_time`` stat)
    iteration_times: tuple[dict[str, Any], dict[str, Any] | None] | None = None


def compute(snap: Snapshot, state: Reporter, behind: bool = False) -> dict[str, Any]:
    """The ``training_metrics_update`` attributes of one snapshot (updates the cumulative state); ``behind``: more
    snapshots wait (see ``Reporter.add_window``)."""
    window = snap.window
    summary = window.fold_chunks()
    if window.times:
        summary.fold(window.times)
        window.times = []
    gbs, fps, world = snap.gbs, snap.fps, snap.world
    samples, window_samples, steady_samples = snap.samples, snap.window_samples, snap.steady_samples
    window_tokens = snap.window_tokens
    end_ns = snap.end_ns
    current = snap.iterations_start + snap.iterations
    attributes: dict[str, Any] = {
        "train_iterations_start": snap.iterations_start,
        "current_iteration": current - 1,
        "num_iterations": snap.iterations,
        "train_samples_start": snap.samples_start,
        "num_train_samples": snap.samples or 0,  # (one-logger's required field: 0 when unknown, as it has)
        "interval": snap.interval,
        "window_iterations": snap.window_iterations,
        "final": snap.final,
        # every iteration's time, warm-up included (for goodput: what this loop has done so far)
        "cumulative_iteration_time_sec": snap.iteration_total_sec,
    }
    # iteration time: the window (one-logger documents per-window values; it computed them cumulatively)
    fresh = state.add_window(summary, snap.final, behind)
    times = summary
    w = times.values(TIME_AGGS)
    if not w.get("count") and window.warmup_times:  # a window of warm-up only: its own times, flagged
        times = Summary.of(window.warmup_times)
        w = times.values(TIME_AGGS)
        attributes["warmup_only"] = True
    if w.get("count"):
        snap.iteration_times = (w, times.histogram_dict())
        attributes.update({
            "avg_iteration_time_sec": w["mean"], "min_iteration_time_sec": w["min"],
            "max_iteration_time_sec": w["max"], "total_iteration_time_sec": w["sum"],
            **{f"{q}_iteration_time_sec": w[q] for q in QUANTILES if q in w},
        })
    c = state.moments.values(("count", "mean", "min", "max"))
    if c.get("count"):
        attributes.update({
            "cumulative_avg_iteration_time_sec": c["mean"], "cumulative_min_iteration_time_sec": c["min"],
            "cumulative_max_iteration_time_sec": c["max"],
        })
        if fresh:  # (see Reporter.add_window)
            q = state.cumulative.values(QUANTILES)
            attributes.update({f"cumulative_{k}_iteration_time_sec": q[k] for k in QUANTILES if k in q})
    # throughput over the window's wall time
    wall_s = (end_ns - window.start_ns) / 1e9 if window.start_ns else 0.0
    attributes["window_seconds"] = wall_s
    # the rates are over the time training ran: the wall time less its pauses (saves, validation: their own badput)
    paused_s = snap.paused_ns / 1e9
    if wall_s > 0:
        attributes["window_paused_seconds"] = paused_s
    run_s = wall_s - paused_s if wall_s > paused_s else 0.0
    if window_samples is not None:
        attributes["window_samples"] = window_samples
    if snap.tokens is not None:
        attributes["train_tokens"] = snap.tokens
    if run_s > 0 and window_samples is not None:
        attributes["samples_per_second"] = window_samples / run_s
    if run_s > 0 and window_tokens is not None:
        attributes["tokens_per_second"] = attributes["avg_tokens_per_second"] = window_tokens / run_s
    steady_s = (end_ns - snap.steady_start_ns - snap.steady_paused_ns) / 1e9 if snap.steady_start_ns else 0.0
    if steady_s > 0 and steady_samples is not None:
        attributes["cumulative_samples_per_second"] = steady_samples / steady_s
    if fps and samples is not None:
        total_flops = samples * fps
        attributes["total_flops"] = total_flops
        attributes["completed_floating_point_operations_overall"] = snap.iterations_start * gbs * fps + total_flops
    if fps and window_samples is not None:
        if run_s > 0:
            tflops = window_samples * fps / run_s / world / 1e12
            attributes["train_throughput_per_gpu"] = attributes["avg_tflops"] = tflops
            high, low = state.throughput_max, state.throughput_min
            state.throughput_max = tflops if high is None else max(high, tflops)
            state.throughput_min = tflops if low is None else min(low, tflops)
            attributes["train_throughput_per_gpu_max"] = state.throughput_max
            attributes["train_throughput_per_gpu_min"] = state.throughput_min
            peak = snap.peak
            if peak is not None:
                attributes["mfu"] = tflops / peak.tflops
                attributes["peak_tflops_per_gpu"] = peak.tflops
                attributes["peak_source"] = f"{peak.device} {peak.dtype}: {peak.source}"
        if steady_s > 0 and steady_samples is not None:
            attributes["cumulative_train_throughput_per_gpu"] = steady_samples * fps / steady_s / world / 1e12
    if window_samples is not None and snap.window_iterations:
        n = snap.window_iterations
        attributes["avg_batch_size"] = window_samples // n if window_samples % n == 0 else window_samples / n
    # the split between the sub-phases, when used
    if window.phases and snap.window_iterations:
        for phase, seconds in list(window.phases.items()):
            attributes[f"avg_{phase}_time_sec"] = seconds / snap.window_iterations
            if wall_s > 0:
                attributes[f"{phase}_time_fraction"] = seconds / wall_s
    if snap.first_iteration_end_ns:
        offset = snap.wall_offset_ns
        first, last = snap.first_iteration_end_ns + offset, snap.last_iteration_end_ns + offset
        attributes["first_logged_train_iterations_finish_timestamp_sec"] = first / 1e9
        attributes["last_logged_train_iterations_finish_timestamp_sec"] = last / 1e9
    if snap.time_to_first_iteration is not None:
        attributes["time_to_first_iteration_sec"] = snap.time_to_first_iteration
    attributes.update(snap.saves)
    attributes.update(snap.loads)
    # the process's and the training thread's CPU time and wait for a CPU in the window (cpu_wait.py;
    # Reporter.cpu_figures says when)
    attributes.update(state.cpu_figures(snap, wall_s))
    if snap.extras is not None:
        snap.extras(snap, attributes)
    for finish in snap.extra:
        try:
            attributes.update(finish(attributes))
        except Exception as exc:  # noqa: BLE001 - one source's failure does not cost the report
            _source_failed(exc)
    return attributes


def emit_derived(telemetry: Any, group: str, snap: Snapshot, attributes: Mapping[str, Any]) -> None:
    """The metric records of a report (``METRICS``) at its step, and its window's ``train.iteration_time`` stat."""
    step = snap.iterations_start + snap.iterations - 1
    metric = telemetry.metric
    for key, (name, unit, labels, factor) in METRICS.items():
        value = attributes.get(key)
        if value is not None and type(value) is not bool:
            metric(name, value * factor if factor != 1.0 else value, group, unit=unit, step=step,
                   attributes=labels)
    if snap.iteration_times is not None and telemetry.listening("stat", group):
        values, histogram = snap.iteration_times
        end = snap.end_ns
        start = snap.window.start_ns or end
        telemetry.emit(StatWindow(end, end + snap.wall_offset_ns, telemetry.identity, group, ITERATION_TIME, start,
                                  int(values["count"]), dict(values), "s", histogram))


Emit = Callable[[Snapshot, Mapping[str, Any]], None]


def _items(pending: deque[Any]) -> list[Any]:
    """What a deque holds while the training thread appends to it: copied by ``list`` (C, under the GIL), taken again
    in the rare case a thread switch interrupted the copy. Iterating it in Python lets an append in between, and
    raised 'deque mutated during iteration' in the collector: the report was lost (seen at 64 ranks on a loaded
    machine)."""
    while True:
        try:
            return list(pending)
        except RuntimeError:
            continue


def _matches(elapsed: float, wall: float) -> bool:
    """Whether an interval of the clock (seconds) is a window's wall time, within 25% + 50 ms."""
    return abs(elapsed - wall) <= 0.25 * max(elapsed, wall) + 0.05


class Reporter:
    """Computes and emits the snapshots handed to it, in order, in the collector thread (or in the caller's, in
    ``drain``). Owns the cumulative state of one training loop."""

    def __init__(self, emit: Emit, on_error: Callable[[BaseException], None]) -> None:
        self._emit = emit
        self._on_error = on_error
        self._after_fork()
        self.new_loop()

    def _after_fork(self) -> None:
        self._lock = threading.RLock()  # re-entrant: a signal handler's final report may interrupt a drain
        self._pending: deque[Snapshot | Window] = deque()
        self._ticking = False  # a tick is scheduled on the collector
        # id(snapshot) -> (that snapshot, its share of a batch's CPU figures): see cpu_figures
        self._cpu_allotted: dict[int, tuple[Snapshot, tuple[float, ...] | None]] = {}

    def new_loop(self) -> None:
        self.drain()  # the previous loop's reports, with the previous loop's cumulative state
        with self._lock:
            # the loop's iteration times, warm-up excluded: count/mean/min/max exact at every report ...
            self.moments = Summary(MINMAX | M2)
            # ... and the distribution, for the cumulative percentiles: the windows' times are batched and put into
            # the histogram CUMULATIVE_BATCH at a time (the histogram's cost is per value; its quantiles cost
            # O(buckets), so computing them at every report would cost more than the report)
            self.cumulative = Summary.sketch()
            self._batch: list[float] = []
            self.throughput_min: float | None = None
            self.throughput_max: float | None = None
            self.thread = threading.get_native_id()  # the training thread: the loop starts on it
            # each thread's (CPU ns, wait ns) at the previous report (the loop's start)
            self.cpu = cpu_wait.read_threads()
            self.cpu_ns = time.monotonic_ns()  # and when it was read
            self.clocks = cpu_wait.clocks()  # the CPU clocks at the previous capture (the loop's start)
            self._cpu_allotted.clear()

    def cpu_figures(self, snap: Snapshot, wall_s: float) -> dict[str, float]:
        """The CPU figures of the window being computed (``wall_s`` long): ``cpu_time_sec`` and
        ``train_thread_cpu_time_sec`` from the CPU clocks the training thread read at the window's capture and the
        previous one (exact, whatever the reporter's delay), ``cpu_wait_sec`` and ``train_thread_cpu_wait_sec``
        from the threads' schedstat read here, off the training thread, when the report is computed (the delta
        since the previous reading; the thread's when it was alive at both readings).
        Reports computed together (the collector drains every ``TICK_NS``: windows shorter than that come in
        batches) share one schedstat reading, split by their windows' wall time -- the waits taken as even over
        the batch. Each pair is given only when its interval matches the window's wall time (within 25% + 50 ms):
        not when the window's times were given explicitly (``*_time_msec``: a replay, a simulation) and do not
        match the clock, and the waits not when the reading came too late for the window (a loaded machine)."""
        figures: dict[str, float] = {}
        clocks, last_clocks = snap.clocks, self.clocks
        if clocks is not None:
            self.clocks = clocks
            if last_clocks is not None and wall_s > 0 and _matches((clocks[0] - last_clocks[0]) / 1e9, wall_s):
                figures["cpu_time_sec"] = max(clocks[1] - last_clocks[1], 0) / 1e9
                if clocks[3] == last_clocks[3] == self.thread:  # both read on the training thread
                    figures["train_thread_cpu_time_sec"] = max(clocks[2] - last_clocks[2], 0) / 1e9
        waits = self._waits(snap, wall_s)
        if waits is not None:
            figures["cpu_wait_sec"] = waits[0]
            if len(waits) == 2:
                figures["train_thread_cpu_wait_sec"] = waits[1]
        return figures

    def _waits(self, snap: Snapshot, wall_s: float) -> tuple[float, ...] | None:
        """(the process's threads' wait for a CPU, then the training thread's when it was alive at both readings)
        in the window, or None: see ``cpu_figures``."""
        allotted = self._cpu_allotted.pop(id(snap), None)
        if allotted is not None and allotted[0] is snap:
            return allotted[1]  # shared out by the batch's first report
        self._cpu_allotted.clear()  # (left by a report that failed)
        cpu, now = cpu_wait.read_threads(), time.monotonic_ns()
        last, last_ns = self.cpu, self.cpu_ns
        self.cpu, self.cpu_ns = cpu, now
        if cpu is None or last is None:
            return None
        batch = [s for s in _items(self._pending) if isinstance(s, Snapshot)]
        walls = [wall_s] + [(s.end_ns - s.window.start_ns) / 1e9 if s.window.start_ns else 0.0 for s in batch]
        total = sum(w for w in walls if w > 0)
        if not total > 0 or not _matches((now - last_ns) / 1e9, total):
            self._cpu_allotted.update((id(s), (s, None)) for s in batch)
            return None
        seconds = [max(c, 0) / 1e9 for c in cpu_wait.since(last, cpu, self.thread)[1::2]]
        shares = [tuple(s * w / total for s in seconds) if w > 0 else None for w in walls]
        self._cpu_allotted.update((id(s), (s, share)) for s, share in zip(batch, shares[1:], strict=True))
        return shares[0]

    def add_window(self, window: Summary, final: bool, behind: bool = False) -> bool:
        """Count a window into the cumulative state; True when the cumulative percentiles are up to date, which a
        report then includes. They are brought up to date at every report unless the reporter is ``behind`` (more
        reports wait: a loop reporting faster than they are computed, in practice only a benchmark's empty loop);
        then only every ``CUMULATIVE_BATCH`` iteration times and at the final report, which keeps it cheap enough
        to catch up."""
        self.moments.absorb(window)
        batch = self._batch
        if window.raw is not None:
            batch.extend(window.raw)
        elif window.histogram is not None:  # a window of more than RAW_LIMIT times: already a histogram
            self.cumulative.absorb(window)
        if batch and (final or not behind or len(batch) >= CUMULATIVE_BATCH):
            self.cumulative.fold(batch)
            self._batch = []
        return not self._batch and self.cumulative.count > 0

    def submit(self, item: Snapshot | Window) -> None:
        """A snapshot to report, or a window whose full chunks to fold: done in the collector thread soon. If the
        collector falls behind (a loop far faster than a report: a benchmark), the caller catches up itself, so
        what waits stays bounded."""
        pending = self._pending
        pending.append(item)
        if not self._ticking:
            self._ticking = True
            collector.schedule(self, time.monotonic_ns())
        elif len(pending) > MAX_PENDING:
            self.drain()

    def tick(self, now_ns: int) -> int | None:
        """Drain; tick again in ``TICK_NS`` after a tick that found work (so a loop reporting faster than that pays
        no collector wake-up per report), stop after one that found none (``submit`` schedules it again)."""
        if self.drain():
            return now_ns + TICK_NS
        self._ticking = False
        if self._pending:  # appended between the drain and the flag: submit saw the flag still set
            self._ticking = True
            return now_ns + TICK_NS
        return None

    def drain(self) -> int:
        """Compute and emit everything pending, in this thread; returns how many items that was."""
        pending = self._pending
        done = 0
        with self._lock:
            while pending:
                try:
                    item = pending.popleft()
                except IndexError:  # taken by another thread's drain
                    break
                done += 1
                try:
                    if isinstance(item, Window):
                        item.fold_chunks()
                    else:
                        self._emit(item, compute(item, self, behind=bool(pending)))
                except Exception as exc:  # noqa: BLE001 - telemetry never breaks training
                    self._on_error(exc)
        return done

    def close(self) -> None:
        """Compute what is pending here, and take this reporter off the collector (its Telemetry is closing: the
        collector thread may end)."""
        self.drain()
        collector.cancel(self)

    def after_fork_in_child(self) -> None:
        self._after_fork()
