"""A ``FindingsInput`` from typed run-store records, fed one at a time (``show`` and ``tail`` feed every record;
the report feeds what its own pass already decoded). Another reader (a SQL engine) builds the input types itself.

The names read here are the recorder's and the system sampler's (docs/training.md, docs/system.md); they are kept
in the constants below so that a rename is one line.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from ...phase_times import DEVICE, HOST, iteration_time, phase_times
from ...training.names import checkpoint_step
from .checkpoints import CHECKPOINT_SAVES, CheckpointSave
from .container import LAST_SAMPLES
from .inputs import (
    Attempt,
    ContainerMemory,
    FindingsInput,
    HostMemory,
    MemorySeries,
    NonFinite,
    SpanFailure,
    ValueSeries,
    WindowPoint,
    finite,
)
from .values import value_kind
from .window_budget import Held, WindowStore
from .worker_exits import EVENT as WORKER_FAILED
from .worker_exits import worker_exits

__all__ = ["STALL", "STALL_EVIDENCE", "VALUE_SERIES_NAME_SQL", "WINDOW_POINT_KEYS", "InputBuilder", "value_series_kind",
           "value_series_name", "window_point", "window_point_of_values"]

REPORT = ("training", "training_metrics_update")
STRAGGLER = ("cross_rank", "straggler")
STALL = ("launcher", "stall")  # the launcher agent's (distributed.stall_view)
STALL_EVIDENCE = ("watchdog", "stall_evidence")  # a rank's (distributed.watchdog)
RSS = "process.memory.usage"
CUDA_ALLOCATED = "torch.cuda.memory.allocated"
GPU_MEMORY_LIMIT = "hw.gpu.memory.limit"
HOST_MEMORY_LIMIT = "system.memory.limit"
HOST_MEMORY_USAGE = "system.memory.usage"
CONTAINER_MEMORY = ("container.memory.usage", "container.memory.working_set", "container.memory.limit",
                    "container.memory.oom_kills")
CRASH_SPANS = frozenset({"training_loop", "application"})
PHASES = ("dataloader", "h2d", "forward", "backward", "optimizer", "zero_grad")
# of a report's attributes, those ``window_point`` and ``InputBuilder.window`` read, and no others (the SQL readers
# extract these alone: ``findings_sql.window_fields_sql``); the first three are integers, the rest numbers
WINDOW_POINT_KEYS = (
    "current_iteration", "window_iterations", "train_iterations_start", "avg_iteration_time_sec",
    "max_iteration_time_sec", "p50_iteration_time_sec", "window_seconds", "cpu_wait_sec", "cpu_time_sec",
    "avg_comm_wait_time_sec", "avg_iteration_device_time_sec", *(f"avg_{p}_device_time_sec" for p in PHASES),
    *(f"avg_{p}_time_sec" for p in PHASES), *(f"avg_{p}_comm_wait_sec" for p in (*PHASES, "other")),
    "train_thread_cpu_wait_sec", "train_thread_cpu_time_sec", "avg_comm_world_wait_time_sec")
_NONE: Mapping[str, float] = MappingProxyType({})  # shared by the windows without phases or communication waits
_NOT_VALUES = ("training", "system", "cross_rank")


def value_series_kind(group: str, name: str) -> str | None:
    """``loss``/``grad_norm`` when ``InputBuilder.metric`` keeps a metric of this group and name as a value series
    (the spike rule's input), else None."""
    if group in _NOT_VALUES or group.startswith("system."):
        return None
    return value_kind(name)  # none of the memory gauges' names is a loss or a gradient norm


def value_series_name(group: str, name: str) -> str:
    """The name a value series is tested and reported by: ``group/name`` (as the report's charts title it), the bare
    name in the default group -- so a ``val`` group's ``loss`` is not read as the next points of the training loss."""
    return name if group in ("", "default") else f"{group}/{name}"


# the same, in SQL over columns ``group_name`` and ``name``
VALUE_SERIES_NAME_SQL = "CASE WHEN group_name IN ('', 'default') THEN {name} ELSE group_name || '/' || {name} END"


_DEVICE_PHASES = slice(11, 11 + len(PHASES))  # of WINDOW_POINT_KEYS
_HOST_PHASES = slice(_DEVICE_PHASES.stop, _DEVICE_PHASES.stop + len(PHASES))
_WAIT_PHASES = (*PHASES, "other")
_WAITS = slice(_HOST_PHASES.stop, _HOST_PHASES.stop + len(_WAIT_PHASES))
_THREAD = _WAITS.stop  # the training thread's CPU wait, then its CPU time
_WORLD = _THREAD + 2  # the wait in collectives over every rank


def window_point_of_values(rank: int, v: Any, *, warmup: bool, time_s: float = 0.0) -> WindowPoint | None:
    """``window_point`` of a report given as the values of ``WINDOW_POINT_KEYS`` (a sequence, in that order) typed
    as a SQL reader types them (``findings_sql.window_fields_sql``): the first three an int or None, the rest a
    finite float or None. The same window as ``window_point`` of those attributes, without a mapping per report."""
    mean, step = v[3], v[0]
    if mean is None or mean <= 0 or step is None:
        return None
    n = v[1]
    phases = {p: x for p, x in zip(PHASES, v[_DEVICE_PHASES], strict=True) if x is not None}
    if phases:
        clock = DEVICE
        device_time = v[10]
        pit = device_time if device_time is not None else mean
    else:
        phases = {p: x for p, x in zip(PHASES, v[_HOST_PHASES], strict=True) if x is not None}
        clock, pit = HOST, None
    waits = {p: x for p, x in zip(_WAIT_PHASES, v[_WAITS], strict=True) if x is not None}
    return WindowPoint(
        rank=rank, step=step, iterations=n if n is not None and n > 0 else 1, iteration_time=mean,
        phases=phases or _NONE, max_iteration_time=v[4], p50=v[5], wall_seconds=v[6], cpu_wait_seconds=v[7],
        cpu_seconds=v[8], thread_cpu_wait_seconds=v[_THREAD], thread_cpu_seconds=v[_THREAD + 1], comm_wait=v[9],
        comm_wait_by_phase=waits or _NONE, warmup=warmup, time_s=time_s, phase_clock=clock, phase_iteration_time=pit,
        world_wait=v[_WORLD])


def window_point(rank: int, attributes: Mapping[str, Any], *, warmup: bool,
                 time_s: float = 0.0) -> WindowPoint | None:
    """A ``training_metrics_update``'s attributes as a window (None without a usable mean iteration time)."""
    a = attributes
    mean = finite(a.get("avg_iteration_time_sec"))
    step = a.get("current_iteration")
    if mean is None or mean <= 0 or isinstance(step, bool) or not isinstance(step, int):
        return None
    n = a.get("window_iterations")
    # the phases on the device's clock when the window has device times (on CUDA the host's are launches)
    phases, clock = phase_times(a, PHASES)
    waits = {}
    for phase in (*PHASES, "other"):
        value = finite(a.get(f"avg_{phase}_comm_wait_sec"))
        if value is not None:
            waits[phase] = value
    return WindowPoint(
        rank=rank, step=step, iterations=n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1,
        iteration_time=mean, phases=phases or _NONE, max_iteration_time=finite(a.get("max_iteration_time_sec")),
        p50=finite(a.get("p50_iteration_time_sec")), wall_seconds=finite(a.get("window_seconds")),
        cpu_wait_seconds=finite(a.get("cpu_wait_sec")), cpu_seconds=finite(a.get("cpu_time_sec")),
        thread_cpu_wait_seconds=finite(a.get("train_thread_cpu_wait_sec")),
        thread_cpu_seconds=finite(a.get("train_thread_cpu_time_sec")),
        comm_wait=finite(a.get("avg_comm_wait_time_sec")),
        comm_wait_by_phase=waits or _NONE, warmup=warmup, time_s=time_s, phase_clock=clock,
        phase_iteration_time=iteration_time(a, clock) if clock == DEVICE else None,
        world_wait=finite(a.get("avg_comm_world_wait_time_sec")))


class InputBuilder:
    """Collects what the rules read. ``limit``: keep at most this many windows and checkpoint saves per rank (the last
    ones, as they were written) and points per series (a live view that runs for days); None keeps every series'
    points and every save, and the report windows within ``window_budget`` windows for all ranks
    (``window_budget.WINDOW_BUDGET`` by default): past it, consecutive windows are merged (``window_budget``), the
    same whichever reader feeds them."""

    def __init__(self, limit: int | None = None, *, window_budget: int | None = None) -> None:
        self.limit = limit
        # each report as the window the rules read (None: no usable mean), with its wall time: the attributes are
        # not kept (a report's attributes are ~1-4 KB in Python; its window ~0.35-1.3 KB, held packed by the store
        # in ~0.13-0.28 KB). With a limit, the last ones per rank; else merged past the budget
        self._windows: dict[int, deque[tuple[int, WindowPoint | None]]] = {}
        self._store = WindowStore(window_budget)
        self._steady: int | None = None  # the earliest report window after warm-up (``steady_ns``), without a limit
        self._origin: int | None = None  # the time origin a reader said it will build with (``origin``)
        self._loops: set[tuple[int, int, Any]] = set()
        self._values: dict[tuple[str, int], deque[tuple[int, float]]] = {}
        self._selected: list[ValueSeries] = []  # value series a reader gave whole or as a selection
        # memory gauges a reader gave apart: key, (wall_ns, bytes) points, None or (steady wall_ns, points after it)
        self._gauges: list[tuple[tuple[str, int, str, str], list[tuple[int, float]], tuple[int, int] | None]] = []
        self._memory: dict[tuple[str, int, str, str], deque[tuple[int, float]]] = {}
        self._gpu_limit: float | None = None
        self._host: dict[str, list[float | None]] = {}  # host -> [total, usage]
        # host -> {"limit": (wall_ns, bytes) | None, usage and working set: [(wall_ns, bytes)] (the latest few),
        # "kills": (least, most) | None}
        self._containers: dict[str, dict[str, Any]] = {}
        self._nonfinite: dict[tuple[str, str], list[Any]] = {}
        self._stragglers: deque[Mapping[str, Any]] = deque(maxlen=limit)
        self._hosts: dict[int, str] = {}
        self._open: dict[tuple[int, str], tuple[str, int]] = {}  # (pid, span id) -> (name, rank)
        self._failures: list[SpanFailure] = []
        self._exits: deque[Mapping[str, Any]] = deque(maxlen=limit)
        self._stalls: deque[Mapping[str, Any]] = deque(maxlen=limit)
        self._evidence: deque[tuple[int, Mapping[str, Any]]] = deque(maxlen=limit)
        self._first_ns: int | None = None
        # checkpoint saves: those open, (pid, span id) -> the iteration their start named; those that ended ok, per
        # rank (with a limit, its last ones, as the windows)
        self._saving: dict[tuple[int, str], int | None] = {}
        self._saves: dict[int, deque[CheckpointSave]] = {}
        self._families: dict[str, tuple[int, int]] = {}

    def _deque(self) -> deque[Any]:
        return deque(maxlen=self.limit)

    def _seen(self, wall_ns: int) -> None:
        if self._first_ns is None or wall_ns < self._first_ns:
            self._first_ns = wall_ns

    def seen(self, wall_ns: int) -> None:
        """A record's wall time (the input's time origin is the earliest), for a reader that feeds a selection."""
        self._seen(wall_ns)

    def origin(self, start_ns: int) -> None:
        """The ``start_ns`` that ``build`` will be given, when a reader knows it before it feeds the reports (their
        times on the run's axis are then set once)."""
        self._origin = start_ns

    def host(self, rank: int, host: str) -> None:
        """The host of ``rank`` (the first one given stands), for a reader that feeds a selection."""
        self._hosts.setdefault(rank, host)

    # -- feeding ---------------------------------------------------------------------------------------------------

    def window(self, rank: int, pid: int, wall_ns: int, attributes: Mapping[str, Any]) -> None:
        start = attributes.get("train_iterations_start")
        key = (rank, pid, start if isinstance(start, int) else -1)
        warmup = key not in (self._loops if self.limit is not None else self._store)
        self._seen(wall_ns)
        origin = self._origin if self._origin is not None else self._first_ns
        assert origin is not None
        self._hold(key, rank, wall_ns, window_point(rank, attributes, warmup=warmup, time_s=(wall_ns - origin) / 1e9))

    def window_values(self, rank: int, pid: int, wall_ns: int, values: Any) -> None:
        """``window`` of a report given as ``window_point_of_values`` takes it (a SQL reader's typed row)."""
        start = values[2]
        key = (rank, pid, start if start is not None else -1)
        warmup = key not in (self._loops if self.limit is not None else self._store)
        self._seen(wall_ns)
        origin = self._origin if self._origin is not None else self._first_ns
        assert origin is not None
        self._hold(key, rank, wall_ns, window_point_of_values(rank, values, warmup=warmup,
                                                              time_s=(wall_ns - origin) / 1e9))

    def origin_ns(self) -> int | None:
        """The time origin the reports' ``time_s`` are taken from as they are fed."""
        return self._origin if self._origin is not None else self._first_ns

    def put_loop(self, key: tuple[int, int, Any], rank: int, warmup: tuple[int, WindowPoint] | None,
                 windows: list[Held], positions: int, steady: int | None) -> None:
        """A training loop's windows merged by another engine at the store's level (``findings_windows_sql``), as
        feeding its ``positions`` reports after the warm-up would hold them (each as ``window_budget.hold`` or
        ``hold_sums`` gives it); ``steady``: the wall time of its
        earliest report with a usable mean after the warm-up."""
        self._store.put_loop(key, rank, warmup, windows, positions)
        if steady is not None and (self._steady is None or steady < self._steady):
            self._steady = steady

    def _hold(self, key: tuple[int, int, Any], rank: int, wall_ns: int, w: WindowPoint | None) -> None:
        if self.limit is not None:
            self._loops.add(key)
            self._windows.setdefault(rank, self._deque()).append((wall_ns, w))
            return
        self._store.add(key, rank, wall_ns, w)
        if w is not None and not w.warmup and (self._steady is None or wall_ns < self._steady):
            self._steady = wall_ns

    def metric(self, rank: int, host: str, group: str, name: str, step: int | None, value: Any,
               wall_ns: int, *, series: bool = True) -> None:
        """One metric record. ``series=False``: a reader gives the value series and memory gauges apart
        (``value_series``, ``memory_series``) and feeds only their non-finite points here."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        self._hosts.setdefault(rank, host)
        if not math.isfinite(value):
            entry = self._nonfinite.setdefault((group, name), [0, step, value, rank])
            entry[0] += 1
        if not series and ((name == RSS and group == "system") or
                           (name == CUDA_ALLOCATED and group.startswith("system.cuda."))):
            pass
        elif name == RSS and group == "system":
            self._memory.setdefault(("rss", rank, host, ""), self._deque()).append((wall_ns, float(value)))
        elif name == CUDA_ALLOCATED and group.startswith("system.cuda."):
            device = "cuda:" + group.removeprefix("system.cuda.")
            self._memory.setdefault(("cuda", rank, host, device), self._deque()).append((wall_ns, float(value)))
        elif name == GPU_MEMORY_LIMIT:
            self._gpu_limit = float(value)
        elif name in CONTAINER_MEMORY and group == "system":
            self._container_metric(host, name, float(value), wall_ns)
        elif name in (HOST_MEMORY_LIMIT, HOST_MEMORY_USAGE) and group == "system":
            entry2 = self._host.setdefault(host, [None, None])
            entry2[0 if name == HOST_MEMORY_LIMIT else 1] = float(value)
        elif series and value_series_kind(group, name) is not None:
            points = self._values.setdefault((value_series_name(group, name), rank), self._deque())
            points.append((step if step is not None else len(points), float(value)))
        self._seen(wall_ns)

    def _container_metric(self, host: str, name: str, value: float, wall_ns: int) -> None:
        """A container memory gauge (``findings.container``): the latest limit, the latest few usages, the
        OOM-kill counter's range (it only grows: order-free)."""
        c = self._containers.setdefault(host, {"limit": None, "container.memory.usage": [],
                                                "container.memory.working_set": [], "kills": None})
        if name in ("container.memory.usage", "container.memory.working_set"):
            last = c[name]
            last.append((wall_ns, value))
            if len(last) > 2 * LAST_SAMPLES:
                last.sort()
                del last[:-LAST_SAMPLES]
        elif name == "container.memory.limit":
            if c["limit"] is None or wall_ns >= c["limit"][0]:
                c["limit"] = (wall_ns, value)
        else:
            k = c["kills"]
            c["kills"] = (value, value) if k is None else (min(k[0], value), max(k[1], value))

    def value_series(self, series: ValueSeries) -> None:
        """A value series read apart (whole, or the points a ``SpikeSelection`` names), for a reader that does not
        feed its points to ``metric``."""
        self._selected.append(series)

    def value_family(self, name: str, ranks: int, points: int) -> None:
        """How many ranks have finite points of a value series ``name`` and the most of one rank: from a reader that
        gives only some series (``value_series``), for the spike rule's correction over ranks."""
        self._families[name] = (ranks, points)

    def memory_series(self, kind: str, rank: int, host: str, device: str, points: list[tuple[int, float]],
                      thinned: tuple[int, int] | None = None) -> None:
        """A memory gauge read apart: its (wall_ns, bytes) points, all of them, or (``thinned``: (the steady
        state's wall_ns, n)) only those the memory rule reads of the n from the steady state on
        (``memory.thin_indices``), in time order."""
        self._gauges.append(((kind, rank, host, device), points, thinned))

    def windows_held(self) -> int:
        """The report windows held now (``WindowPoint``s, merged ones counted once)."""
        return sum(w is not None for ws in self._windows.values() for _, w in ws) + len(self._store)

    def steady_ns(self) -> int | None:
        """The wall time the memory rule starts from: the earliest report window after warm-up (None: none)."""
        if self.limit is None:
            return self._steady
        return min((wall for ws in self._windows.values() for wall, w in ws if w is not None and not w.warmup),
                   default=None)

    def stat(self, rank: int, group: str, name: str, values: Mapping[str, Any]) -> None:
        bad = (values.get("nan_count") or 0) + (values.get("inf_count") or 0)
        if bad:
            entry = self._nonfinite.setdefault((group, name + " (stat)"), [0, None, math.nan, rank])
            entry[0] += int(bad)

    def straggler(self, attributes: Mapping[str, Any]) -> None:
        self._stragglers.append(dict(attributes))

    def worker_failed(self, attributes: Mapping[str, Any]) -> None:
        """A ``launcher/worker_failed`` event of the agent (``worker_exits``)."""
        self._exits.append(dict(attributes))

    def stall(self, attributes: Mapping[str, Any]) -> None:
        """A ``launcher/stall`` event of the agent."""
        self._stalls.append(dict(attributes))

    def stall_evidence(self, rank: int, attributes: Mapping[str, Any]) -> None:
        """A rank's ``watchdog/stall_evidence`` event."""
        self._evidence.append((rank, dict(attributes)))

    def span_failure(self, name: str, rank: int, status: str, error: str = "") -> None:
        if name in CRASH_SPANS and status != "ok":
            self._failures.append(SpanFailure(name, rank, status, error))

    def checkpoint_save(self, rank: int, name: str, step: int | None, seconds: float | None,
                        status: str = "ok") -> None:
        """A checkpoint save span that ended (``checkpoint_save_sync``/``_async``): the slow checkpoint rank rule's
        input. Other names, saves not ok and durations that are not finite and >= 0 are left out."""
        if name in CHECKPOINT_SAVES and status == "ok" and (value := finite(seconds)) is not None and value >= 0:
            self._saves.setdefault(rank, self._deque()).append(CheckpointSave(rank, name, step, value))

    def add(self, r: Any) -> None:
        """One typed record (``store.reader``'s): whatever of it the rules read."""
        kind = r.kind
        ident = r.identity
        if kind == "metric":
            self.metric(ident.rank, ident.host, r.group, r.name, r.step, r.value, r.wall_ns)
        elif kind == "event":
            key = (r.group, r.name)
            if key == REPORT:
                self._hosts.setdefault(ident.rank, ident.host)
                self.window(ident.rank, ident.pid, r.wall_ns, r.attributes or {})
            elif key == STRAGGLER:
                self.straggler(r.attributes or {})
            elif key == WORKER_FAILED:
                self.worker_failed(r.attributes or {})
            elif key == STALL:
                self.stall(r.attributes or {})
            elif key == STALL_EVIDENCE and ident.role != "agent":
                self.stall_evidence(ident.rank, r.attributes or {})
        elif kind == "span_start":
            if r.name in CRASH_SPANS:
                self._open[(ident.pid, r.span_id)] = (r.name, ident.rank)
            elif r.name in CHECKPOINT_SAVES:
                self._saving[(ident.pid, r.span_id)] = checkpoint_step(r.attributes or {})
        elif kind == "span_end":
            if r.name in CHECKPOINT_SAVES:
                started = self._saving.pop((ident.pid, r.span_id), None)
                end_step = checkpoint_step(r.attributes or {})
                self.checkpoint_save(ident.rank, r.name, end_step if end_step is not None else started,
                                     r.duration_ns / 1e9, r.status)
            if r.name in CRASH_SPANS:
                self._open.pop((ident.pid, r.span_id), None)
                self.span_failure(r.name, ident.rank, r.status, r.error or "")
        elif kind == "stat":
            self.stat(ident.rank, r.group, r.name, r.values or {})

    # -- the input -----------------------------------------------------------------------------------------------

    def build(self, *, start_ns: int | None = None, open_spans_crashed: bool = True,
              attempts: tuple[Attempt, ...] = ()) -> FindingsInput:
        """The input so far. ``open_spans_crashed``: a training loop or application span still open counts as
        killed (a finished run's reader); False for a run being followed live."""
        origin = start_ns if start_ns is not None else (self._first_ns or 0)
        windows = []
        for rank, ws in self._windows.items():
            if any(w is not None and w.time_s != (wall_ns - origin) / 1e9 for wall_ns, w in ws):
                # another origin than at feeding (an earlier record came later, or the reader's start): new windows
                ws = self._windows[rank] = deque(
                    ((wall, None if w is None else replace(w, time_s=(wall - origin) / 1e9)) for wall, w in ws),
                    maxlen=self.limit)
            windows += [w for _, w in ws if w is not None]
        for wall, w in self._store.windows():  # (a merged window's time: its last report's, on this origin)
            t = (wall - origin) / 1e9
            windows.append(w if w.time_s == t else replace(w, time_s=t))
        values = [ValueSeries(name, kind, rank, list(points)) for (name, rank), points in self._values.items()
                  if (kind := value_kind(name)) is not None] + self._selected
        memory = [MemorySeries(kind, rank, host, device, [((w - origin) / 1e9, v) for w, v in points],
                               limit=self._gpu_limit if kind == "cuda" else None)
                  for (kind, rank, host, device), points in self._memory.items()]
        memory += [MemorySeries(kind, rank, host, device, [((w - origin) / 1e9, v) for w, v in points],
                                limit=self._gpu_limit if kind == "cuda" else None,
                                thinned=None if thinned is None else ((thinned[0] - origin) / 1e9, thinned[1]))
                   for (kind, rank, host, device), points, thinned in self._gauges]
        hosts = [HostMemory(host, total, total - usage) for host, (total, usage) in self._host.items()
                 if total is not None and usage is not None]
        nonfinite = [NonFinite(group, name, count, step, rank, example)
                     for (group, name), (count, step, example, rank) in sorted(self._nonfinite.items())]
        failures = list(self._failures)
        if open_spans_crashed:
            failures += [SpanFailure(name, rank, "never ended") for name, rank in self._open.values()]
        # (the working set where it was read: the usage counts the page cache the kernel reclaims before a kill)
        containers = [ContainerMemory(host, c["limit"][1], sorted(c[name])[-LAST_SAMPLES:], c["kills"],
                                      working_set=name.endswith("working_set"))
                      for host, c in self._containers.items() if c["limit"] is not None
                      for name in [("container.memory.working_set" if c["container.memory.working_set"]
                                    else "container.memory.usage")]]
        return FindingsInput(windows=windows, values=values, memory=memory, hosts_memory=hosts, nonfinite=nonfinite,
                             containers=containers,
                             straggler_events=list(self._stragglers), hosts=dict(self._hosts),
                             span_failures=failures, attempts=attempts, worker_exits=worker_exits(self._exits),
                             stalls=list(self._stalls), stall_evidence=list(self._evidence),
                             checkpoint_saves=[s for saves in self._saves.values() for s in saves],
                             value_families=dict(self._families))
