"""Export a run (or a session of runs) from the run store as a Chrome Trace Event Format file, for Perfetto.

Offline: it reads what the run store wrote (``telemetrain.store``) after the fact, so it costs the training job
nothing. Layout (``docs/backends/perfetto.md``):

- one trace process per (run, rank, pid), named ``rank R @ host``;
- tid 1 ``lifecycle``: the training spans, nested exactly as their parent ids say (children clipped to their parent
  after rounding to microseconds, so the viewer never has to guess); tid 2 ``checkpoint (async)``: async saves, which
  outlive the iteration that started them; spans that say which thread they ran in (``thread.name``/``thread.id``
  attributes) get that thread's track, any other span that does not fit its parent's track a further one;
- counters: throughput from ``training_metrics_update`` and the system samples; instants: the events;
- spans without an end (a crash) end at the process's last record with ``args.status = "open at end of data"``;
- at most ``max_per_name`` spans (and counter points, and instants) per name and process, evenly spaced; what was
  dropped is counted in ``otherData.telemetrain.dropped``;
- one clock: where the ranks measured their clock's offset to rank 0 (``clock_offset`` events, group ``clock``:
  cross-rank aggregation does at the first report and at every exchange, docs/distributed.md), each process's times
  are moved onto rank 0's clock -- the offset interpolated between estimates, by the process's own estimates or
  else those of a rank on the same host (the launcher's agent) -- and ``otherData.telemetrain.clock`` states, per
  process, the offset applied and the measured error (half the best round trip).

Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .output_file import atomic_output
from .semconv import series_key
from .store.layout import AGENT_ROLE
from .store.reader import Run, find_runs, open_run
from .trace_spans import OPEN_STATUS, TID_LIFECYCLE, _assign_tracks, _cap_spans, _collect_spans, _evenly, _us, _walk

__all__ = ["DEFAULT_MAX_PER_NAME", "TraceResult", "build_trace", "export_trace", "load_runs"]

DEFAULT_MAX_PER_NAME = 5000  # ~10 span names x 5000 x ~200 bytes: ~10 MB per process, whatever the run length

# training_metrics_update attribute -> counter name (the names of the matching metric records, docs/training.md)
_THROUGHPUT = {
    "samples_per_second": "train.samples_per_second",
    "tokens_per_second": "train.tokens_per_second",
    "train_throughput_per_gpu": "train.flops_per_gpu",  # the event's TFLOP/s, drawn in FLOP/s as the metric is
    "mfu": "train.mfu",
}
_SCALE = {"train_throughput_per_gpu": 1e12}  # to the metric record's unit

# system samples drawn as counters by default (docs/system.md); the rest with all_metrics=True
_SYSTEM_COUNTERS = frozenset({
    "system.cpu.utilization",
    "system.memory.usage",
    "process.cpu.utilization",
    "process.tree.cpu.utilization",
    "process.memory.usage",
    "process.tree.memory.usage",
    "hw.gpu.utilization",
    "hw.gpu.memory.usage",
    "hw.power",
    "torch.cuda.memory.allocated",
    "torch.cuda.memory.reserved",
})


@dataclasses.dataclass
class TraceResult:
    """What ``export_trace`` wrote."""

    path: Path
    size_bytes: int
    events: int
    processes: int
    dropped: dict[str, dict[str, dict[str, int]]]  # process label -> "spans"/"counters"/"instants" -> name -> count


def load_runs(path: str | os.PathLike[str]) -> list[Run]:
    """The run at ``path``, or every run under it (a session directory, a store root), oldest first."""
    base = Path(path)
    runs = find_runs(base)
    if not runs:
        return [open_run(base)]  # raises FileNotFoundError / NotARunError with the reader's message
    return [open_run(p) for p in runs]


# -- values ------------------------------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """Attribute values as strict JSON (viewers reject NaN): non-finite floats spelled as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _counter_name(r: Any) -> str:
    """A metric's counter: its series (semconv.series_key: ``system.disk.io.read`` for a v1 and a v2 record), with the
    device of per-device groups (system.gpu.0 -> ``hw.power gpu 0``), and the group of any other group but
    ``default`` (``val/loss``, as TensorBoard's tag and MLflow's key: a name in two groups is two tracks, not one
    that zigzags between them)."""
    name = series_key(r.name, r.attributes)
    for prefix, label in (("system.gpu.", "gpu"), ("system.cuda.", "cuda")):
        if r.group.startswith(prefix):
            return f"{name} {label} {r.group[len(prefix):]}"
    if r.group.startswith("system.filesystem."):
        return f"{name} {r.group[len('system.filesystem.'):]}"
    if r.group == "default" or r.group == "system" or r.group.startswith("system."):
        return name
    return f"{r.group}/{name}"


# -- the trace ---------------------------------------------------------------------------------------------------------


def _clock_events(procs: Sequence[_Process], engine: Any) -> Iterable[tuple[str, int, int, dict[str, Any]]]:
    """(run id, rank, wall ns, attributes) of every rank's ``clock_offset`` event: by SQL with ``engine`` (the
    processes' records are then not loaded here), else from the records."""
    if engine is not None:
        from .store.trace_sql import clock_offset_events

        yield from clock_offset_events(engine, {p.run for p in procs})
        return
    for p in procs:
        if p.identity.role == AGENT_ROLE:
            continue
        for r in p.records:
            if r.kind == "event" and r.group == "clock" and r.name == "clock_offset":
                yield p.identity.run_id, p.identity.rank, r.wall_ns, r.attributes or {}


def _clock_estimates(procs: Sequence[_Process], engine: Any = None) -> tuple[
        dict[tuple[str, int], list[tuple[int, int, int]]], dict[tuple[str, str], tuple[str, int]]]:
    """(run id, rank) -> [(wall ns, offset ns, error ns)] from the ``clock_offset`` events, by wall time; and
    (run id, host) -> the (run id, rank) whose estimates stand for that host (its lowest rank with any)."""
    by_rank: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for run_id, rank, wall, a in _clock_events(procs, engine):
        offset, error = a.get("offset_ns"), a.get("error_ns")
        if type(offset) is int and type(error) is int:
            by_rank.setdefault((run_id, rank), []).append((wall, offset, error))
    by_host: dict[tuple[str, str], tuple[str, int]] = {}
    for p in procs:
        key = (p.identity.run_id, p.identity.rank)
        if key in by_rank and p.identity.role != AGENT_ROLE:
            host = (p.identity.run_id, p.identity.host)
            if host not in by_host or key[1] < by_host[host][1]:
                by_host[host] = key
    for estimates in by_rank.values():
        estimates.sort()
    return by_rank, by_host


def _offset_at(estimates: Sequence[tuple[int, int, int]], wall_ns: int) -> int:
    """The clock offset at ``wall_ns``: linear between the estimates around it, the nearest one outside them."""
    if wall_ns <= estimates[0][0]:
        return estimates[0][1]
    if wall_ns >= estimates[-1][0]:
        return estimates[-1][1]
    lo, hi = 0, len(estimates) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if estimates[mid][0] <= wall_ns:
            lo = mid
        else:
            hi = mid
    (w0, o0, _), (w1, o1, _) = estimates[lo], estimates[hi]
    return o0 + (o1 - o0) * (wall_ns - w0) // max(w1 - w0, 1)


def _align_clocks(procs: Sequence[_Process], engine: Any = None) -> dict[str, Any]:
    """Move every process with clock estimates onto rank 0's clock (in place; a process read by SQL when it is
    drawn is moved then); the trace's ``clock`` metadata."""
    by_rank, by_host = _clock_estimates(procs, engine)
    if not by_rank:
        return {"aligned": False, "note": "no clock_offset records (one rank, or cross-rank aggregation off): "
                                          "times are each host's wall clock as recorded"}
    aligned: dict[str, dict[str, Any]] = {}
    unaligned: list[str] = []
    for p in procs:
        i = p.identity
        key = (i.run_id, i.rank) if i.role != AGENT_ROLE and (i.run_id, i.rank) in by_rank else \
            by_host.get((i.run_id, i.host))
        if key is None:
            unaligned.append(p.label)
            continue
        estimates = by_rank[key]
        if any(offset for _, offset, _ in estimates):
            p.shift(estimates)
        aligned[p.label] = {"offset_ns": estimates[-1][1], "error_ns": max(e for _, _, e in estimates),
                            "estimates": len(estimates), "by": f"rank {key[1]}"}
    return {"aligned": True, "reference": "rank 0 of each run",
            "max_error_ns": max((a["error_ns"] for a in aligned.values()), default=0),
            "processes": aligned, "unaligned": unaligned}


class _Process:
    def __init__(self, run: Run, identity: Any, loader: Any = None, first_ns: int | None = None,
                 last_ns: int | None = None) -> None:
        self.run = run
        self.identity = identity
        self._records: list[Any] | None = None if loader is not None else []
        self._loader = loader  # the SQL path: records are read when the process is drawn, then let go
        self._estimates: Sequence[tuple[int, int, int]] = ()  # clock offsets applied to its records (_align_clocks)
        self.first_ns = first_ns  # of all its records (the origin is the earliest)
        self.last_ns = last_ns  # of all its records (its unmet metrics included)

    @property
    def records(self) -> list[Any]:
        if self._records is None:
            self._records = self._shifted(self._loader())
        return self._records

    @records.setter
    def records(self, value: list[Any]) -> None:
        self._records = value

    def shift(self, estimates: Sequence[tuple[int, int, int]]) -> None:
        """Move this process onto the reference clock: ``wall - offset(wall)`` for each record (now, or when a
        process read by SQL is loaded). The offset changes far slower than time, so the bounds move the same way."""
        self._estimates = estimates
        self.first_ns = None if self.first_ns is None else self.first_ns - _offset_at(estimates, self.first_ns)
        self.last_ns = None if self.last_ns is None else self.last_ns - _offset_at(estimates, self.last_ns)
        if self._records is not None:
            self._records = self._shifted(self._records)

    def _shifted(self, records: list[Any]) -> list[Any]:
        estimates = self._estimates
        if not estimates:
            return records
        moved = [r._replace(wall_ns=r.wall_ns - _offset_at(estimates, r.wall_ns)) for r in records]
        moved.sort(key=lambda r: (r.wall_ns, r.mono_ns))
        return moved

    def release(self) -> None:
        if self._loader is not None:
            self._records = None

    @property
    def label(self) -> str:
        i = self.identity
        if i.role == AGENT_ROLE:  # telemetrain launch's elastic agent: its events (restarts, worker states) as marks
            from .distributed.summary import agent_node  # (standard library only: no torch)

            node = agent_node(self.records, i.group_rank)  # (an agent's few records: --node-rank is 0 on every node)
            return f"agent of node {node} @ {i.host} (run {i.run_id}, pid {i.pid})"
        return f"rank {i.rank} @ {i.host} (run {i.run_id}, pid {i.pid})"


def _processes(runs: Sequence[Run]) -> list[_Process]:
    """One per (run, rank, pid), in run order (oldest first), then rank, then pid: that order gives the trace pids;
    a run's agents after its ranks."""
    out: dict[tuple[int, str, int, int, int], _Process] = {}
    for n, run in enumerate(runs):
        for log in run.processes + run.agents:
            for r in log.records:
                i = r.identity
                key = (n, i.run_id, int(i.role == AGENT_ROLE), i.rank, i.pid)
                p = out.get(key)
                if p is None:
                    p = out[key] = _Process(run, i)
                p.records.append(r)
    for p in out.values():
        p.records.sort(key=lambda r: (r.wall_ns, r.mono_ns))
        p.first_ns = p.records[0].wall_ns if p.records else None
        p.last_ns = p.records[-1].wall_ns if p.records else None
    return [out[k] for k in sorted(out)]


def _processes_sql(runs: Sequence[Run], engine: Any, all_metrics: bool) -> list[_Process]:
    """``_processes`` by SQL (``store.engine``): each process's records are read only when it is drawn, and only
    those the trace uses (its spans, events and diagnostics; of the metrics, the counters drawn)."""
    from .store.trace_sql import process_loaders

    return [_Process(run, identity, loader, first, last) for run, identity, loader, (first, last) in
            process_loaders(runs, engine, all_metrics, _SYSTEM_COUNTERS, frozenset(_THROUGHPUT.values()))]


def build_trace(
    runs: Sequence[Run], *, max_per_name: int = DEFAULT_MAX_PER_NAME, all_metrics: bool = False, engine: Any = None
) -> dict[str, Any]:
    """The trace of ``runs`` as a Chrome Trace Event Format object (``traceEvents``, ``displayTimeUnit``,
    ``otherData``). ``ts``/``dur`` are integer µs from the earliest record (``otherData.telemetrain.origin_wall_ns``),
    so every rank and run shares one clock. ``all_metrics``: every numeric metric record is a counter, not only the
    throughput and the main system samples. ``engine``: a ``store.engine.Engine`` over the runs, to read each process's
    records by SQL when it is drawn (memory: a bounded group of processes at a time) instead of from the loaded runs."""
    if type(max_per_name) is not int or max_per_name < 1:
        raise ValueError(f"max_per_name must be an int >= 1, got {max_per_name!r}")
    procs = _processes(runs) if engine is None else _processes_sql(runs, engine, all_metrics)
    clock = _align_clocks(procs, engine)
    origin = min((p.first_ns for p in procs if p.first_ns is not None), default=0)
    meta: list[dict[str, Any]] = []
    body: list[dict[str, Any]] = []
    dropped_all: dict[str, dict[str, dict[str, int]]] = {}
    open_spans = 0
    for pid, proc in enumerate(procs, start=1):
        i = proc.identity
        dropped: dict[str, dict[str, int]] = {"spans": {}, "counters": {}, "instants": {}}
        meta.append({"ph": "M", "pid": pid, "name": "process_name",
                     "args": {"name": proc.label}})
        meta.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
        meta.append({"ph": "M", "pid": pid, "name": "process_labels",
                     "args": {"labels": f"session {i.session_tag}, perf {i.perf_tag}, local rank {i.local_rank}"}})
        last_ns = proc.last_ns if proc.last_ns is not None else origin

        spans = _collect_spans((r for r in proc.records if r.kind in ("span_start", "span_end")), last_ns, origin)
        by_id = {s.span_id: s for s in spans}
        for s in spans:
            parent = by_id.get(s.parent_id)
            if parent is not None and parent is not s:
                parent.children.append(s)
        _cap_spans(spans, by_id, max_per_name, dropped["spans"])
        placed, track_names = _assign_tracks(_walk(spans, by_id))
        for tid, label in sorted(track_names.items()):
            meta.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": label}})
            meta.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
        placed.sort(key=lambda ts: (ts[0], ts[1].start, -ts[1].end))
        for tid, s in placed:
            open_spans += s.args.get("status") == OPEN_STATUS
            body.append({"ph": "X", "pid": pid, "tid": tid, "name": s.name, "cat": s.category, "ts": s.start,
                         "dur": s.end - s.start, "args": _jsonable(s.args)})

        body.extend(_capped(_counters(proc, pid, origin, all_metrics), max_per_name, dropped["counters"]))
        body.extend(_capped(_instants(proc, pid, origin), max_per_name, dropped["instants"]))
        if any(dropped.values()):
            dropped_all[proc.label] = {kind: dict(sorted(d.items())) for kind, d in dropped.items() if d}
        proc.release()
    return {
        "traceEvents": meta + body,
        "displayTimeUnit": "ms",
        "otherData": {"telemetrain": {
            "origin_wall_ns": origin,
            "runs": [r.run_id for r in runs],
            "max_per_name": max_per_name,
            "open_spans": open_spans,
            "dropped": dropped_all,
            "clock": clock,
        }},
    }


def _capped(events: Iterator[dict[str, Any]], max_per_name: int, dropped: dict[str, int]) -> list[dict[str, Any]]:
    by_name: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_name.setdefault(e["name"], []).append(e)
    out = []
    for name, evs in by_name.items():
        kept, lost = _evenly(evs, max_per_name)
        out.extend(kept)
        if lost:
            dropped[name] = dropped.get(name, 0) + len(lost)
    return out


def _counters(proc: _Process, pid: int, origin: int, all_metrics: bool) -> Iterator[dict[str, Any]]:
    for r in proc.records:
        ts = _us(r.wall_ns - origin)
        if r.kind == "event" and r.group == "training" and r.name == "training_metrics_update":
            attributes = r.attributes or {}
            for key, name in _THROUGHPUT.items():
                value = _number(attributes.get(key))
                if value is not None:
                    value *= _SCALE.get(key, 1.0)
                    yield {"ph": "C", "pid": pid, "name": name, "ts": ts, "args": {"value": value}}
        elif r.kind == "metric":
            if r.group == "training" and r.name in _THROUGHPUT.values():
                continue  # drawn from the event above
            if not all_metrics and series_key(r.name, r.attributes) not in _SYSTEM_COUNTERS:
                continue
            value = _number(r.value)
            if value is not None:
                yield {"ph": "C", "pid": pid, "name": _counter_name(r), "ts": ts, "args": {"value": value}}


def _instants(proc: _Process, pid: int, origin: int) -> Iterator[dict[str, Any]]:
    """Events (all but the metrics updates, which are counters) and diagnostics, process-wide instants."""
    for r in proc.records:
        if r.kind == "event":
            if r.group == "training" and r.name == "training_metrics_update":
                continue
            args: dict[str, Any] = {"severity": r.severity, **(r.attributes or {})}
            if r.span_id:
                args["span_id"] = r.span_id
            yield {"ph": "i", "s": "p", "pid": pid, "tid": TID_LIFECYCLE, "name": r.name, "cat": r.group,
                   "ts": _us(r.wall_ns - origin), "args": _jsonable(args)}
        elif r.kind == "diagnostic":
            yield {"ph": "i", "s": "p", "pid": pid, "tid": TID_LIFECYCLE, "name": f"telemetrain {r.name}",
                   "cat": "diagnostic", "ts": _us(r.wall_ns - origin),
                   "args": {"sink": r.sink, "count": r.record_count, "message": r.message}}


def export_trace(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str] = "trace.json",
    *,
    max_per_name: int = DEFAULT_MAX_PER_NAME,
    all_metrics: bool = False,
) -> TraceResult:
    """Write the trace of the run (or of every run under the directory) ``source`` to ``out``, atomically: a reader
    never sees half a file, and a failed export leaves any previous one in place."""
    from .store.engine import engine_for

    runs = load_runs(source)
    engine = engine_for([r.path for r in runs])  # DuckDB when installed: the runs are not loaded whole
    try:
        trace = build_trace(runs, max_per_name=max_per_name, all_metrics=all_metrics, engine=engine)
    finally:
        if engine is not None:
            engine.close()
    target = Path(out)
    with atomic_output(target) as fh:  # the umask's permissions, as the report and compare pages
        # one event per line: still one JSON object, but greppable and diffable
        fh.write('{"displayTimeUnit":"ms","traceEvents":[\n')
        events = trace["traceEvents"]
        for n, event in enumerate(events):
            fh.write(json.dumps(event, separators=(",", ":"), allow_nan=False, default=repr))
            fh.write(",\n" if n + 1 < len(events) else "\n")
        fh.write('],"otherData":')
        fh.write(json.dumps(trace["otherData"], separators=(",", ":"), allow_nan=False, default=repr))
        fh.write("}\n")
    tele = trace["otherData"]["telemetrain"]
    return TraceResult(path=target, size_bytes=target.stat().st_size, events=len(trace["traceEvents"]),
                       processes=sum(1 for e in trace["traceEvents"] if e["name"] == "process_name"),
                       dropped=tele["dropped"])
