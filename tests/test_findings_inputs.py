"""What the findings engine reads, from real records: the process's CPU time and wait per report window (the
recorder, on the clock; not for simulated times), a failed iteration not counted, and ``InputBuilder`` turning a
run's records into the engine's series."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import run_dir_of
from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis.findings import InputBuilder, analyse, run_findings, window_point
from telemetrain.spans import tracer
from telemetrain.store import open_run
from telemetrain.training import TrainingContexts, TrainingRecorder, TrainingTelemetryConfig, cpu_wait

linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="schedstat is Linux's")


def _updates(run_dir: Path) -> list[dict[str, object]]:
    return [r.attributes for r in open_run(run_dir).records("event") if r.name == "training_metrics_update"]


def _started(t: Telemetry) -> TrainingRecorder:
    """A recorder reporting every 5 iterations, its app and training loop started."""
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=1, log_every_n_train_iterations=5),
                         telemetry=t)
    r.on_app_start()
    r.on_train_start(0)
    return r


def _busy_loop_iterations(r: TrainingRecorder, iterations: int, cpu_s: float) -> None:
    """``iterations`` iterations of ``cpu_s`` seconds of this thread's CPU each."""
    for _ in range(iterations):
        r.on_training_single_iteration_start()
        deadline = time.thread_time() + cpu_s
        while time.thread_time() < deadline:
            pass
        r.on_training_single_iteration_end()


def _busy_loop(r: TrainingRecorder, iterations: int, cpu_s: float) -> None:
    """``iterations`` iterations of ``cpu_s`` seconds of this thread's CPU each, then the loop and the app ended."""
    _busy_loop_iterations(r, iterations, cpu_s)
    r.on_train_end()
    r.on_app_end()


CPU_S = 0.02


@linux_only
def test_each_report_window_carries_the_process_cpu_time_and_wait(tmp_path: Path) -> None:
    # in the suite's own process, thousands of threads started and ended by earlier tests (the CPU time is the
    # process's and the thread's CPU clocks at the windows' captures, so what other threads do cannot lower it)
    t = Telemetry(store=tmp_path)
    _busy_loop(_started(t), 15, CPU_S)
    assert t.close()
    updates = _updates(run_dir_of(t))
    assert len(updates) == 3
    for a in updates:
        assert isinstance(a["cpu_time_sec"], float) and isinstance(a["train_thread_cpu_time_sec"], float)
        # no more than the window's wall time x the CPUs that could run it
        assert 0 < a["cpu_time_sec"] <= a["window_seconds"] * (os.cpu_count() or 1) + 0.01  # type: ignore[operator]
        # the training thread's own: part of the process's
        assert 0 < a["train_thread_cpu_time_sec"] <= a["cpu_time_sec"]
    # every iteration's CPU: the clocks are exact (schedstat's count of a running thread lagged by up to a tick)
    assert sum(a["train_thread_cpu_time_sec"] for a in updates) >= 15 * CPU_S  # type: ignore[misc]
    # the waits, read by the reporter when it computes (a window whose reading came too late has none)
    for a in updates:
        if "cpu_wait_sec" in a:
            assert a["cpu_wait_sec"] >= 0  # type: ignore[operator]
        if "train_thread_cpu_wait_sec" in a:
            assert 0 <= a["train_thread_cpu_wait_sec"] <= a["cpu_wait_sec"] + 0.01  # type: ignore[operator]
    cpu, wait, thread_cpu, thread_wait = cpu_wait.read(threading.get_native_id()) or (0, 0, 0, 0)
    assert cpu >= thread_cpu > 0 and wait >= thread_wait >= 0
    assert (cpu_wait.read() or (0, 0, 0, 0))[2:] == (-1, -1)  # no thread asked for


_CHURN = """
import hashlib, sys, threading, time
import test_findings_inputs as m
from telemetrain import Telemetry

def task():  # 5 ms of CPU in C, the GIL released: a short-lived worker thread (a checkpoint writer, a compile job)
    data, deadline = b"x" * 100_000, time.thread_time() + 0.005
    while time.thread_time() < deadline:
        hashlib.sha256(data).digest()

stop = threading.Event()
def churn():
    while not stop.is_set():
        worker = threading.Thread(target=task)
        worker.start()
        worker.join()

t = Telemetry(store=sys.argv[1])
before = time.process_time()
r = m._started(t)
churner = threading.Thread(target=churn)
churner.start()
for _ in range(15):
    r.on_training_single_iteration_start()
    time.sleep(0.02)
    r.on_training_single_iteration_end()
stop.set()
churner.join()
r.on_train_end()
print(time.process_time() - before, t.run_dir)
r.on_app_end()
assert t.close()
"""


@linux_only
def test_the_cpu_of_threads_that_start_and_end_between_reports_is_counted(tmp_path: Path) -> None:
    """A loop that sleeps while short-lived threads do the work (each ~5 ms of CPU, one after another): the windows
    add up to the process's CPU time. Summed from the threads' schedstat counts at each report, a thread that ended
    before the next report took its CPU with it: most of this process's was never counted."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    out = subprocess.run([sys.executable, "-c", _CHURN, str(tmp_path)], capture_output=True, text=True, timeout=120,
                         env=env, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    used, run_dir = out.stdout.split()
    updates = _updates(Path(run_dir))
    assert len(updates) == 3
    windows = sum(a["cpu_time_sec"] for a in updates)  # type: ignore[misc]
    # the windows lie within the process's measured span, which also holds the recorder's start (a few ms); the
    # threads' schedstat counts added up to 13% of it
    assert 0.75 * float(used) <= windows <= float(used) + 0.005, (windows, used)


@linux_only
def test_a_window_reported_late_keeps_its_cpu_time(tmp_path: Path) -> None:
    """The collector computes a window's report 300 ms after it ended (held up: a loaded machine). Its CPU time is
    still the window's own, from the clocks the training thread read at the capture. Before, the window lost it (the
    waits, read when the report is computed, are left out when the reading came too late for the window's wall time:
    whether 300 ms is too late depends on how long the loaded machine made the window, so not asserted here)."""
    t = Telemetry(store=tmp_path)
    r = _started(t)
    lock = r._reporter._lock
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait()
    try:
        _busy_loop_iterations(r, 5, 0.01)  # the first window's report waits for the lock
        time.sleep(0.3)
    finally:
        release.set()
        holder.join()
    _busy_loop(r, 5, 0.01)
    assert t.close()
    first, second = _updates(run_dir_of(t))
    for a in (first, second):
        assert 0.04 <= a["cpu_time_sec"] <= a["window_seconds"] * (os.cpu_count() or 1) + 0.01, a  # type: ignore[operator]
        assert 0.04 <= a["train_thread_cpu_time_sec"] <= a["cpu_time_sec"], a  # type: ignore[operator]
        assert a.get("cpu_wait_sec", 0.0) >= 0, a  # type: ignore[operator]


@linux_only
def test_a_sleeping_thread_adds_no_cpu_and_the_thread_figures_are_its_own(tmp_path: Path) -> None:
    """A loop whose iterations sleep (a data loader waiting for I/O) while another thread of the process burns
    CPU: the training thread's CPU time is a small part of the process's."""
    stop = threading.Event()

    def burn() -> None:  # CPU in C with the GIL released (hashlib, large data): the training thread is not held up
        data = b"x" * 1_000_000
        while not stop.is_set():
            hashlib.sha256(data).digest()

    worker = threading.Thread(target=burn, daemon=True)
    t = Telemetry(store=tmp_path)
    r = _started(t)
    worker.start()
    try:
        for _ in range(10):
            r.on_training_single_iteration_start()
            time.sleep(0.02)
            r.on_training_single_iteration_end()
        r.on_train_end()
    finally:
        stop.set()
        worker.join()
    r.on_app_end()
    assert t.close()
    updates = _updates(run_dir_of(t))
    assert len(updates) == 2
    # every window carries the process's and the thread's CPU time (the clocks at the captures)
    thread_cpu = sum(a["train_thread_cpu_time_sec"] for a in updates)  # type: ignore[misc]
    process_cpu = sum(a["cpu_time_sec"] for a in updates)  # type: ignore[misc]
    assert thread_cpu < 0.5 * process_cpu, (thread_cpu, process_cpu)


@linux_only
def test_a_thread_that_ends_in_a_window_takes_only_its_own_increment_out(tmp_path: Path) -> None:
    """A thread that used 150 ms of CPU before the loop started and ends during its first window (a data loader
    worker shut down, a checkpoint thread done): the window still carries the loop's own CPU. Differences of two
    sums over the live threads lost the ended thread's whole count, and the window's figure was clamped to 0."""
    go = threading.Event()

    def used_then_waits() -> None:
        deadline = time.thread_time() + 0.15
        while time.thread_time() < deadline:
            pass
        go.wait()

    worker = threading.Thread(target=used_then_waits)
    worker.start()
    while worker.is_alive() and (cpu_wait.read(worker.native_id) or (0, 0, 0, 0))[2] < 100_000_000:
        time.sleep(0.01)
    t = Telemetry(store=tmp_path)
    r = _started(t)  # the reporter's first reading: the worker alive, its 150 ms counted
    go.set()
    worker.join()
    _busy_loop(r, 5, 0.01)  # 10 ms of CPU per iteration
    assert t.close()
    (update,) = _updates(run_dir_of(t))
    # the loop's 50 ms, less what schedstat had not yet added for the running thread (up to a tick)
    assert update["cpu_time_sec"] >= 0.02, update  # type: ignore[operator]


def test_a_loop_driven_from_another_thread_has_no_training_thread_cpu_time(tmp_path: Path) -> None:
    """The loop started on this thread, its iterations run on another: the capture's thread CPU clock is not the
    training thread's, so the window carries the process's CPU time but no thread CPU time (a difference of two
    threads' clocks is no thread's figure)."""
    t = Telemetry(store=tmp_path)
    r = _started(t)
    worker = threading.Thread(target=_busy_loop_iterations, args=(r, 5, 0.01))
    worker.start()
    worker.join()
    r.on_train_end()
    r.on_app_end()
    assert t.close()
    (update,) = _updates(run_dir_of(t))
    assert update["cpu_time_sec"] >= 0.04, update  # type: ignore[operator]
    assert "train_thread_cpu_time_sec" not in update


def test_since_counts_each_threads_own_increment() -> None:
    last = {"10": (1_000, 50), "11": (9_000, 900), "12": (500, 5)}
    now = {"10": (1_400, 70), "12": (100, 1), "13": (300, 30)}  # 11 ended, 12's id reused, 13 started
    assert cpu_wait.since(last, now) == (400 + 100 + 300, 20 + 1 + 30)
    assert cpu_wait.since(last, now, 10) == (800, 51, 400, 20)
    assert cpu_wait.since(last, now, 11) == (800, 51)  # the thread not alive at both readings: no figures of its own
    assert cpu_wait.since(last, last, 10) == (0, 0, 0, 0)


def test_a_simulated_window_carries_no_cpu_figures(tmp_path: Path) -> None:
    """Times given explicitly (a replay): the process's CPU since the last report has nothing to do with them."""
    t = Telemetry(store=tmp_path)
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=1, log_every_n_train_iterations=5),
                         telemetry=t)
    base = 1_700_000_000_000.0
    r.on_app_start(base)
    r.on_train_start(0, start_time_msec=base)
    for k in range(10):
        r.on_training_single_iteration_start(base + 1000 * k)
        r.on_training_single_iteration_end(base + 1000 * k + 900)
    r.on_train_end(base + 10_000)
    assert t.close()
    assert all("cpu_time_sec" not in a and "cpu_wait_sec" not in a for a in _updates(run_dir_of(t)))


def test_a_failed_iteration_is_not_counted_as_completed(tmp_path: Path) -> None:
    t = Telemetry(store=tmp_path)
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2, log_every_n_train_iterations=4),
                         telemetry=t)
    ctx = TrainingContexts(lambda: r)
    r.on_app_start()
    r.on_train_start(0)
    for k in range(8):
        try:
            with ctx.training_iteration():
                if k == 3:
                    raise RuntimeError("CUDA out of memory (planted)")
        except RuntimeError:
            pass
    r.on_train_end()
    r.on_app_end()
    assert t.close()
    last = _updates(run_dir_of(t))[-1]
    assert (last["num_iterations"], last["num_train_samples"]) == (7, 14)


def test_the_builder_reads_windows_memory_values_events_and_failures(tmp_path: Path) -> None:
    identity = identity_from_env({}, run_id="r", session_tag="s", rank=1, world_size=2)
    t = Telemetry(identity, store=tmp_path)
    for k in range(3):
        attrs = {"current_iteration": 10 * k + 9, "window_iterations": 10, "avg_iteration_time_sec": 0.1,
                 "avg_forward_time_sec": 0.04, "train_iterations_start": 0, "cpu_time_sec": 0.5,
                 "cpu_wait_sec": 0.5, "window_seconds": 1.0}
        t.event("training_metrics_update", attrs, group="training")
    t.metric("process.memory.usage", 100.0, "system")
    t.metric("torch.cuda.memory.allocated", 5.0, "system.cuda.0")
    t.metric("hw.gpu.memory.limit", 80.0, "system.gpu.0")
    t.metric("system.memory.limit", 1000.0, "system")
    t.metric("system.memory.usage", 400.0, "system")
    t.metric("train.loss", 2.0, "train", step=0)
    t.metric("train.loss", math.nan, "train", step=1)
    t.metric("model.grad_norm", 1.0, "train", step=0)
    t.metric("lr", 0.1, "train", step=0)
    t.event("straggler", {"rank": 0, "phase": "forward", "step": 9}, group="cross_rank")
    tracer(t).start("training_loop", group="training")  # never ended: the process "was killed"
    t.flush()
    b = InputBuilder()
    for r in open_run(tmp_path / "s" / "r").records():
        b.add(r)
    data = b.build()
    assert [w.warmup for w in data.windows] == [True, False, False]
    w = data.windows[1]
    assert (w.rank, w.step, w.iterations, w.phases, w.wait_fraction) == (1, 19, 10, {"forward": 0.04}, 0.5)
    assert w.busy_free(0.1) == pytest.approx(0.05)
    assert {(m.kind, m.device, m.limit) for m in data.memory} == {("rss", "", None), ("cuda", "cuda:0", 80.0)}
    assert [(h.total, h.available) for h in data.hosts_memory] == [(1000.0, 600.0)]
    # (a series is its group and name: a val loss of the same name is another series)
    assert sorted((v.name, v.kind) for v in data.values) == [("train/model.grad_norm", "grad_norm"),
                                                            ("train/train.loss", "loss")]
    assert [(n.name, n.count, n.first_step) for n in data.nonfinite] == [("train.loss", 1, 1)]
    assert data.straggler_events == [{"rank": 0, "phase": "forward", "step": 9}]
    assert [(f.name, f.status) for f in data.span_failures] == [("training_loop", "never ended")]
    assert not b.build(open_spans_crashed=False).span_failures  # a run being followed: open is not killed
    kinds = analyse(data).kinds()
    assert "crash" in kinds and "nan/inf" in kinds
    assert t.close()
    assert "crash" in run_findings(open_run(tmp_path / "s" / "r")).kinds()  # closed: terminated


def test_the_limit_bounds_what_a_live_view_keeps() -> None:
    b = InputBuilder(limit=5)
    for k in range(20):
        b.window(0, 1, k, {"current_iteration": k, "avg_iteration_time_sec": 0.1, "window_iterations": 1})
        b.metric(0, "h", "train", "train.loss", k, 1.0, k)
    data = b.build()
    assert [w.step for w in data.windows] == [15, 16, 17, 18, 19]
    assert [s for s, _ in data.values[0].points] == [15, 16, 17, 18, 19]


def test_a_window_with_device_times_gives_its_phases_on_the_device_clock() -> None:
    """training.device_timing's avg_<phase>_device_time_sec: the engine takes them over the host's launch times
    (phase_times.py), with the device iteration time for the time outside the phases."""
    a = {"current_iteration": 9, "window_iterations": 10, "avg_iteration_time_sec": 0.1,
         "avg_forward_time_sec": 0.001, "avg_backward_time_sec": 0.09}
    host = window_point(0, a, warmup=False)
    assert host is not None and (host.phase_clock, host.phases, host.phase_total) == (
        "host", {"forward": 0.001, "backward": 0.09}, 0.1)
    device = window_point(0, {**a, "avg_forward_device_time_sec": 0.03, "avg_backward_device_time_sec": 0.05,
                              "avg_iteration_device_time_sec": 0.095}, warmup=False)
    assert device is not None and (device.phase_clock, device.phases, device.phase_total) == (
        "device", {"forward": 0.03, "backward": 0.05}, 0.095)
    assert device.iteration_time == 0.1  # the step's own time stays the host's (the slowdown rule reads it)
