"""The Perfetto / Chrome trace export (``telemetrain.trace``, ``telemetrain trace``) on real runs: two ranks written by
two real ``Telemetry`` instances with the training recorder and the system sampler, and a restart attempt that
crashes (``os._exit``) with spans open, all in one session folder; plus run stores written line by line in the
documented format (docs/format.md) for the clipping and the per-name cap. The trace is checked as a viewer would
read it: µs units, perfect nesting on every track, one process per rank, counters, instants. The system sampler needs
the [system] extra (psutil): without it the ranks are written without system samples and only their counters' test
skips."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from telemetrain import Telemetry, TelemetryWarning
from telemetrain.identity import Identity
from telemetrain.span_lifecycle import _current
from telemetrain.spans import tracer
from telemetrain.trace import build_trace, export_trace, load_runs
from telemetrain.trace_spans import OPEN_STATUS
from telemetrain.training import TrainingContexts, TrainingRecorder, TrainingTelemetryConfig

HAS_PSUTIL = importlib.util.find_spec("psutil") is not None
SESSION = "sess"
KNOWN_NS = 2_345_678  # the duration of one span written with explicit times


def _identity(run_id: str, rank: int, host: str) -> Identity:
    return Identity(run_id=run_id, session_tag=SESSION, perf_tag="trace-test", rank=rank, local_rank=rank,
                    world_size=2, host=host, pid=os.getpid())


def _train(t: Telemetry, *, rank: int) -> None:
    """A demo-like job: application > init, loop > iterations > sub-phases, a validation loop, a sync save on rank 0
    and an async save (outliving its iteration) on rank 1, a misuse error, a span of known length."""
    strategy = "async" if rank == 1 else "sync"
    r = TrainingRecorder(TrainingTelemetryConfig(
        global_batch_size_or_fn=8, seq_length_or_fn=16, flops_per_sample_or_fn=1e6, log_every_n_train_iterations=2,
        export_iteration_spans_every=1, save_checkpoint_strategy=strategy, warmup_iterations=0,
        peak_tflops_per_gpu=1.0), telemetry=t)
    ctx = TrainingContexts(lambda: r)
    t0 = time.monotonic_ns()
    tracer(t).start("known_wait", group="test", start_ns=t0, make_current=False).end(end_ns=t0 + KNOWN_NS)
    with ctx.application():
        with ctx.model_init():
            time.sleep(0.001)
        with ctx.training_loop(0):
            for step in range(6):
                with ctx.training_iteration():
                    with ctx.data_loading():
                        time.sleep(0.0005)
                    with ctx.forward():
                        time.sleep(0.0005)
                    with ctx.backward():
                        time.sleep(0.0005)
                    with ctx.optimizer_update():
                        time.sleep(0.0002)
                    if step == 3 and strategy == "async":
                        r.on_save_checkpoint_start(step)  # ends two iterations later
                if step == 2:
                    with ctx.validation_loop():
                        for _ in range(2):
                            with ctx.validation_iteration():
                                time.sleep(0.0005)
                if step == 4 and strategy == "sync":
                    with ctx.checkpoint_save(global_step=step):
                        time.sleep(0.001)
                if step == 5 and strategy == "async":
                    r.on_save_checkpoint_success(3)
                    r.on_save_checkpoint_end()
        with warnings.catch_warnings():  # (it also warns, once)
            warnings.simplefilter("ignore", TelemetryWarning)
            r.on_save_checkpoint_success(999)  # misuse: no start for this step -> an `error` event
    time.sleep(0.02)  # (the sampler's last sample comes at close)


# A restart attempt that dies mid-iteration: spans open, no close, no atexit.
CRASH = """
import os, sys
from telemetrain import Telemetry, TelemetryWarning
from telemetrain.identity import Identity
from telemetrain.training import TrainingContexts, TrainingRecorder, TrainingTelemetryConfig
root = sys.argv[1]
t = Telemetry(Identity(run_id="run-b", session_tag="sess", perf_tag="trace-test", rank=0, local_rank=0,
                       world_size=1, host="node-a", pid=os.getpid()), store=root)
r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=1), telemetry=t)
ctx = TrainingContexts(lambda: r)
ctx.application().__enter__()
ctx.training_loop(0).__enter__()
for step in range(3):
    with ctx.training_iteration():
        with ctx.forward():
            pass
ctx.training_iteration().__enter__()
ctx.forward().__enter__()
t.metric("crash.marker", 1, group="test")
t.flush()
os._exit(3)
"""


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    for rank, host in ((0, "node-a"), (1, "node-b")):
        t = Telemetry(_identity("run-a", rank, host), store=root)
        token = _current.set(None)
        try:
            if HAS_PSUTIL:
                from telemetrain.system import start_sampler

                sampler = start_sampler(t, interval=0.01, host=True, gpus=[])
            _train(t, rank=rank)
            if HAS_PSUTIL:
                from telemetrain.system.process import MIN_RATE_S

                time.sleep(MIN_RATE_S)  # CPU rates need that long an interval (CPU times are counted in ticks)
                sampler.stop()
        finally:
            _current.reset(token)
            t.close()
    time.sleep(0.01)  # the restart is later than the first attempt (runs are ordered by creation time)
    proc = subprocess.run([sys.executable, "-c", CRASH, str(root)], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("TELEMETRAIN_")})
    assert proc.returncode == 3, proc.stderr
    return root / SESSION


def _events(trace: dict[str, Any], ph: str) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def _process_names(trace: dict[str, Any]) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def _nesting_problems(trace: dict[str, Any]) -> list[str]:
    """What a viewer would have to repair: on one (pid, tid), X events that overlap without one holding the other."""
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in _events(trace, "X"):
        assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0, e
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    problems = []
    for key, events in tracks.items():
        stack: list[dict[str, Any]] = []
        for e in sorted(events, key=lambda x: (x["ts"], -x["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"]:
                problems.append(f"{key}: {e['name']} {e['ts']}+{e['dur']} overlaps {stack[-1]['name']} "
                                f"{stack[-1]['ts']}+{stack[-1]['dur']}")
            stack.append(e)
    return problems


def _write_run(run_dir: Path, lines: list[dict[str, Any]], *, rank: int = 0, pid: int = 4242) -> None:
    """A process file in the documented line format (docs/format.md), written directly."""
    run_dir.mkdir(parents=True, exist_ok=True)
    header = {"v": 1, "kind": "process", "mono_ns": 0, "wall_ns": 0,
              "identity": {"run_id": run_dir.name, "session_tag": run_dir.parent.name, "perf_tag": "synthetic",
                           "rank": rank, "local_rank": 0, "world_size": rank + 1, "host": "h", "pid": pid}}
    with open(run_dir / f"rank-{rank}.{pid}.jsonl", "w") as fh:
        for obj in [header, *lines]:
            fh.write(json.dumps(obj, separators=(",", ":")) + "\n")


def _span_lines(name: str, sid: int, parent: int, start_ns: int, dur_ns: int,
                ended: bool = True) -> list[dict[str, Any]]:
    base = {"v": 1, "group": "training", "name": name, "span_id": f"{sid:016x}"}
    out = [{**base, "kind": "span_start", "mono_ns": start_ns, "wall_ns": start_ns,
            "parent_id": f"{parent:016x}" if parent else "", "trace_id": "1" * 32, "attributes": {}}]
    if ended:
        out.append({**base, "kind": "span_end", "mono_ns": start_ns + dur_ns, "wall_ns": start_ns + dur_ns,
                    "duration_ns": dur_ns, "status": "ok", "attributes": {}, "error": ""})
    return out


# -- the real session --------------------------------------------------------------------------------------------------


def test_one_process_per_rank_and_run_with_names(session: Path) -> None:
    trace = build_trace(load_runs(session))
    names = _process_names(trace)
    assert sorted(names.values()) == sorted([
        f"rank 0 @ node-a (run run-a, pid {os.getpid()})",
        f"rank 1 @ node-b (run run-a, pid {os.getpid()})",
        f"rank 0 @ node-a (run run-b, pid {names[3].rsplit('pid ', 1)[1][:-1]})",
    ])
    assert list(names) == [1, 2, 3]  # small stable ints: the first run's ranks in order, then the restart
    assert "run run-b" in names[3]
    sort = {e["pid"]: e["args"]["sort_index"] for e in trace["traceEvents"] if e["name"] == "process_sort_index"}
    assert sort == {1: 1, 2: 2, 3: 3}
    # every event belongs to a named process
    assert {e["pid"] for e in trace["traceEvents"]} == set(names)
    assert trace["otherData"]["telemetrain"]["runs"] == ["run-a", "run-b"]


def test_microseconds_and_perfect_nesting(session: Path) -> None:
    trace = build_trace(load_runs(session))
    assert trace["displayTimeUnit"] == "ms"
    known = [e for e in _events(trace, "X") if e["name"] == "known_wait"]
    assert len(known) == 2
    for e in known:  # 2_345_678 ns, start and end each rounded to the µs
        assert e["dur"] in (KNOWN_NS // 1000, KNOWN_NS // 1000 + 1), e
    assert _nesting_problems(trace) == []


def test_lifecycle_track_nests_as_the_parent_ids_say(session: Path) -> None:
    runs = load_runs(session)
    trace = build_trace(runs)
    parent_of = {r.span_id: r.parent_id for run in runs for r in run.records("span_start")}
    spans = {e["args"]["span_id"]: e for e in _events(trace, "X")}
    lifecycle = [e for e in spans.values() if e["pid"] in (1, 2) and e["tid"] == 1]
    names = {e["name"] for e in lifecycle}
    assert {"application", "model_initialization", "training_loop", "training_single_iteration", "model_forward",
            "model_backward", "data_loading", "optimizer_update", "validation_loop",
            "validation_single_iteration"} <= names
    assert "checkpoint_save_sync" in {e["name"] for e in lifecycle if e["pid"] == 1}
    checked = 0
    for e in lifecycle:
        parent = spans.get(parent_of[e["args"]["span_id"]])
        if parent is None or parent["tid"] != e["tid"]:
            continue
        assert parent["ts"] <= e["ts"] and e["ts"] + e["dur"] <= parent["ts"] + parent["dur"], (e, parent)
        checked += 1
    assert checked > 40
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
                    if e["ph"] == "M" and e["name"] == "thread_name"}
    assert thread_names[(1, 1)] == "lifecycle" and thread_names[(2, 1)] == "lifecycle"


def test_async_checkpoint_on_its_own_track(session: Path) -> None:
    trace = build_trace(load_runs(session))
    saves = [e for e in _events(trace, "X") if e["name"] == "checkpoint_save_async"]
    assert len(saves) == 1 and saves[0]["pid"] == 2 and saves[0]["tid"] == 2
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
                    if e["ph"] == "M" and e["name"] == "thread_name"}
    assert thread_names[(2, 2)] == "checkpoint (async)"
    # it outlives the iteration that started it: it overlaps iterations on the lifecycle track
    s = saves[0]
    iterations = [e for e in _events(trace, "X") if e["pid"] == 2 and e["name"] == "training_single_iteration"]
    assert any(e["ts"] < s["ts"] < e["ts"] + e["dur"] < s["ts"] + s["dur"] for e in iterations)


def _counters(trace: dict[str, Any]) -> dict[tuple[int, str], list[dict[str, Any]]]:
    counters: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for e in _events(trace, "C"):
        counters.setdefault((e["pid"], e["name"]), []).append(e)
        assert isinstance(e["args"]["value"], float)
    return counters


def test_counters_for_throughput(session: Path) -> None:
    trace = build_trace(load_runs(session))
    counters = _counters(trace)
    for pid in (1, 2):
        for name in ("train.samples_per_second", "train.tokens_per_second", "train.flops_per_gpu", "train.mfu"):
            assert counters.get((pid, name)), (pid, name, sorted(counters))
            assert all(e["args"]["value"] > 0 for e in counters[(pid, name)])
    # each counter is named and scaled as the run's own metric record: FLOP/s, not the event's TFLOP/s
    recorded = [float(r.value) for run in load_runs(session) for r in run.records()
                if r.kind == "metric" and r.group == "training" and r.name == "train.flops_per_gpu"]
    drawn = [e["args"]["value"] for (_, name), es in counters.items() if name == "train.flops_per_gpu" for e in es]
    assert recorded and drawn and not any(name == "train.tflops_per_gpu" for _, name in counters)
    assert all(min(abs(v / r - 1) for r in recorded) < 1e-9 for v in drawn), (drawn, recorded)
    assert not any(name == "crash.marker" for _, name in counters)  # not a default counter...
    everything = build_trace(load_runs(session), all_metrics=True)
    assert any(e["name"] == "test/crash.marker" and e["pid"] == 3 for e in _events(everything, "C"))  # ...with all


def test_one_name_in_two_groups_is_two_counter_tracks(tmp_path: Path) -> None:
    """With all metrics, ``loss`` of group ``train`` and of group ``val`` are two tracks (named as TensorBoard's tags
    and MLflow's keys), not one track zigzagging between the two series."""
    t = Telemetry(store=tmp_path)
    for step in range(3):
        t.metric("loss", 1.0 + step, group="train", step=step)
        t.metric("loss", 5.0 + step, group="val", step=step)
        t.metric("lr", 0.1, step=step)  # group default: the name alone
    t.close()
    tracks: dict[str, list[float]] = {}
    for e in _events(build_trace(load_runs(tmp_path), all_metrics=True), "C"):
        tracks.setdefault(e["name"], []).append(e["args"]["value"])
    assert tracks == {"train/loss": [1.0, 2.0, 3.0], "val/loss": [5.0, 6.0, 7.0], "lr": [0.1, 0.1, 0.1]}


@pytest.mark.skipif(not HAS_PSUTIL, reason="the system sampler needs psutil (the [system] extra)")
def test_counters_for_system_samples(session: Path) -> None:
    counters = _counters(build_trace(load_runs(session)))
    for pid in (1, 2):
        for name in ("system.cpu.utilization", "process.memory.usage", "process.cpu.utilization"):
            assert counters.get((pid, name)), (pid, name, sorted(counters))


def test_instants_for_events(session: Path) -> None:
    trace = build_trace(load_runs(session))
    instants = _events(trace, "i")
    by_name: dict[str, list[dict[str, Any]]] = {}
    for e in instants:
        assert e["s"] == "p"
        by_name.setdefault(e["name"], []).append(e)
    assert {e["pid"] for e in by_name["save_checkpoint_success"]} == {1, 2}
    errors = by_name["error"]  # the misuse
    assert {e["pid"] for e in errors} == {1, 2} and all(e["args"]["severity"] == "error" for e in errors)
    assert "training_metrics_update" not in by_name  # drawn as counters
    assert "one_logger_initialization" in by_name


def test_open_spans_end_at_the_process_last_record(session: Path) -> None:
    runs = load_runs(session)
    trace = build_trace(runs)
    crashed = [e for e in _events(trace, "X") if e["pid"] == 3]
    still_open = {e["name"] for e in crashed if e["args"].get("status") == OPEN_STATUS}
    # what the store holds a start of and no end (a sub-phase open at the crash may not have been written yet)
    ended = {r.span_id for r in runs[1].records("span_end")}
    expected = {r.name for r in runs[1].records("span_start") if r.span_id not in ended}
    assert {"application", "training_loop", "training_single_iteration"} <= expected
    assert still_open == expected
    origin = trace["otherData"]["telemetrain"]["origin_wall_ns"]
    last_ns = max(r.wall_ns for r in runs[1].records())
    last_us = (last_ns - origin + 500) // 1000
    for e in crashed:
        if e["args"].get("status") == OPEN_STATUS:
            assert e["ts"] + e["dur"] == last_us, e
    assert trace["otherData"]["telemetrain"]["open_spans"] == len(expected)
    assert _nesting_problems(trace) == []


def test_cli_writes_the_file(session: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    proc = subprocess.run([sys.executable, "-m", "telemetrain.cli", "trace", str(session), "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout and "3 process(es)" in proc.stdout
    data = json.loads(out.read_text())
    assert data["traceEvents"] == build_trace(load_runs(session))["traceEvents"]
    # a single run directory exports that run only
    one = tmp_path / "one.json"
    result = export_trace(session / "run-b", one)
    assert result.processes == 1 and json.loads(one.read_text())["otherData"]["telemetrain"]["runs"] == ["run-b"]


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "telemetrain.cli", "trace", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("telemetrain: error:") and "nope" in proc.stderr
    assert not (tmp_path / "trace.json").exists()
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, "-m", "telemetrain.cli", "trace", str(tmp_path / "empty")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and "not a telemetrain run" in proc.stderr


# -- stores written line by line ------------------------------------------------------------------------------------


def test_children_are_clipped_into_their_parent_and_siblings_that_overlap_move(tmp_path: Path) -> None:
    run = tmp_path / "s" / "r"
    lines = [
        *_span_lines("application", 1, 0, 1_000_000, 10_000_000),
        # ends 3 µs after its parent (a late clock), and starts 2 µs before it
        *_span_lines("training_loop", 2, 1, 998_000, 10_005_000),
        # two children of the loop that overlap each other (two threads, no thread attribute)
        *_span_lines("worker_a", 3, 2, 2_000_000, 4_000_000),
        *_span_lines("worker_b", 4, 2, 3_000_000, 4_000_000),
        # an end whose start line was lost
        {"v": 1, "kind": "span_end", "mono_ns": 9_000_000, "wall_ns": 9_000_000, "group": "training",
         "name": "orphan", "span_id": "0000000000000009", "duration_ns": 1_000_000, "status": "error",
         "attributes": {"x": 1}, "error": "ValueError: boom"},
    ]
    _write_run(run, lines)
    trace = build_trace(load_runs(run))
    assert _nesting_problems(trace) == []
    x = {e["name"]: e for e in _events(trace, "X")}
    app, loop = x["application"], x["training_loop"]
    # the origin is the earliest record (the loop's start, 998 µs): times are µs after it
    assert trace["otherData"]["telemetrain"]["origin_wall_ns"] == 998_000
    assert (app["ts"], app["dur"]) == (2, 10_000)
    assert (loop["ts"], loop["dur"]) == (2, 10_000)  # clipped into the application on both sides
    assert x["worker_a"]["tid"] == 1 and x["worker_b"]["tid"] != 1  # the overlap moved to another lane
    assert x["orphan"]["ts"] == 7_002 and x["orphan"]["args"]["status"] == "error"
    assert x["orphan"]["args"]["error"] == "ValueError: boom"


def test_cap_per_name_keeps_whole_iterations_and_counts_the_rest(tmp_path: Path) -> None:
    run = tmp_path / "s" / "big"
    n_iter, phases, cap = 1_500, ("data_loading", "model_forward", "model_backward", "optimizer_update"), 150
    lines = [*_span_lines("application", 1, 0, 0, n_iter * 1_000_000 + 10),
             *_span_lines("training_loop", 2, 1, 1, n_iter * 1_000_000)]
    sid = 10
    for k in range(n_iter):
        start = 1 + k * 1_000_000
        it = sid
        lines += _span_lines("training_single_iteration", it, 2, start, 900_000)
        for j, name in enumerate(phases):
            lines += _span_lines(name, sid + 1 + j, it, start + j * 200_000, 150_000)
        sid += 10
        lines.append({"v": 1, "kind": "metric", "mono_ns": start, "wall_ns": start, "group": "system",
                      "name": "system.cpu.utilization", "value": 0.5})
    _write_run(run, lines)
    out = tmp_path / "trace.json"
    result = export_trace(run, out, max_per_name=cap)
    trace = json.loads(out.read_text())
    x = _events(trace, "X")
    kept_iterations = [e for e in x if e["name"] == "training_single_iteration"]
    assert len(kept_iterations) == cap
    assert kept_iterations[0]["ts"] == 0 and kept_iterations[-1]["ts"] == (n_iter - 1) * 1000  # first and last kept
    gaps = {b["ts"] - a["ts"] for a, b in itertools.pairwise(kept_iterations)}
    assert max(gaps) - min(gaps) <= 1000  # evenly spaced (to one iteration)
    kept_ids = {e["args"]["span_id"] for e in kept_iterations}
    for name in phases:  # every kept sub-phase belongs to a kept iteration, and every kept iteration has its own
        mine = [e for e in x if e["name"] == name]
        assert len(mine) == cap
        assert {int(e["args"]["span_id"], 16) // 10 * 10 for e in mine} == {int(i, 16) for i in kept_ids}
    dropped = trace["otherData"]["telemetrain"]["dropped"]
    assert result.dropped == dropped
    (label,) = dropped
    assert dropped[label]["spans"] == {name: n_iter - cap for name in ("training_single_iteration", *phases)}
    assert dropped[label]["counters"] == {"system.cpu.utilization": n_iter - cap}
    assert len(_events(trace, "C")) == cap
    assert _nesting_problems(trace) == []
    # bounded by the cap, not by the run: ~5 names x cap spans
    assert result.size_bytes < 6 * cap * 250, result.size_bytes


def test_size_bound_of_a_long_run_at_the_default_cap(tmp_path: Path) -> None:
    """The default cap bounds a trace by the number of names, not the run's length: a run 2x the cap per name."""
    from telemetrain.trace import DEFAULT_MAX_PER_NAME

    run = tmp_path / "s" / "long"
    n = DEFAULT_MAX_PER_NAME * 2
    lines: list[dict[str, Any]] = [*_span_lines("training_loop", 1, 0, 0, n * 1000 + 10)]
    for k in range(n):
        lines += _span_lines("training_single_iteration", 2 + k, 1, 1 + k * 1000, 500)
    _write_run(run, lines)
    result = export_trace(run, tmp_path / "t.json")
    (dropped,) = result.dropped.values()
    assert dropped["spans"] == {"training_single_iteration": n - DEFAULT_MAX_PER_NAME}
    per_span = result.size_bytes / (DEFAULT_MAX_PER_NAME + 1)
    assert per_span < 200, per_span  # so 100 MB holds >= 500k spans: ~100 names x the default cap per process


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_per_name"):
        build_trace([], max_per_name=0)
    assert build_trace([])["traceEvents"] == []
