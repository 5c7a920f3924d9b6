"""Device timing's BOOKKEEPING, on a simulated CUDA stream (tests/_device_sim.py): pooled marks, the bounded ring of
pending iterations, non-blocking resolution, the phase split, the stall, graph capture, failures, device spans.

These tests do not test CUDA. The real clock (``CudaClock``: ``torch.cuda.Event`` on the current stream) and the
check that it adds no sync run in tests/test_gpu.py and bench/bench_gpu.py, on a GPU.

Every expected number is arithmetic on the simulated work; the device clock and the marks' host clock are the
simulation's (virtual), so nothing depends on how fast this machine runs.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from _device_sim import SimClock, skip_if_cuda_in_use
from conftest import run_dir_of
from telemetrain import Telemetry, TelemetryWarning
from telemetrain.spans import span, tracer
from telemetrain.store import open_run
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
from telemetrain.training import device_timing as dt

MS = 1_000_000  # ns


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> SimClock:
    clock = SimClock(launch_ns=20_000)
    monkeypatch.setattr(dt, "_mono", clock.now)  # the marks' host clock is the simulation's
    monkeypatch.setattr(dt, "_sleep", clock.sleep)
    # no background resolution: the tests resolve where they say (reports still do, in the collector thread)
    monkeypatch.setattr(dt, "TICK_NS", 3600 * 10**9)
    return clock


def _recorder(t: Telemetry, clock: Any, **config: Any) -> TrainingRecorder:
    fields: dict[str, Any] = {"global_batch_size_or_fn": 8, "log_every_n_train_iterations": 5,
                              "warmup_iterations": 0, "device_timing": clock, "gpu_energy": False,
                              "device_timing_every": 1, **config}  # the bookkeeping of every iteration
    r = TrainingRecorder(TrainingTelemetryConfig(**fields), telemetry=t)
    r.on_app_start()
    r.on_train_start(0)
    return r


def _updates(read_run: Callable[..., Any], t: Telemetry) -> list[dict[str, Any]]:
    return [dict(e.attributes) for e in read_run(t, "event") if e.name == "training_metrics_update"]


def _sum(updates: list[dict[str, Any]], key: str) -> float:
    """Sum over windows of a per-iteration average x the window's device-timed iterations (windows may split the
    iterations differently: the collector thread resolves some before a report asks)."""
    total: float = sum(u.get(key, 0.0) * u["device_timed_iterations"] for u in updates)
    return total


def _step(r: TrainingRecorder, sim: SimClock, fwd: int, bwd: int, opt: int, *, sync: bool = True) -> None:
    r.on_training_single_iteration_start()
    with r.forward():
        sim.launch(fwd)
    with r.backward():
        sim.launch(bwd)
    with r.optimizer_update():
        sim.launch(opt)
        if sync:
            sim.sync()  # loss.item(): the host waits for everything queued
    r.on_training_single_iteration_end()


def test_device_time_splits_the_phases_the_host_time_cannot(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock
) -> None:
    """A GPU-bound loop whose sync is in the optimizer phase: on the host the optimizer phase holds the whole device
    time; on the device each phase gets its own work. Stall: the host waited in the optimizer phase for the forward
    and backward work queued before it."""
    r = _recorder(telemetry, sim)
    fwd, bwd, opt = 3 * MS, 6 * MS, 1 * MS
    n = 10
    for _ in range(n):
        _step(r, sim, fwd, bwd, opt)
    r.on_train_end()
    ups = _updates(read_run, telemetry)
    assert sum(u["device_timed_iterations"] for u in ups) == n
    assert all(u["device_timing"] == "sim" and u["device_unresolved_iterations"] == 0 for u in ups)
    assert _sum(ups, "avg_forward_device_time_sec") == pytest.approx(n * fwd / 1e9)
    assert _sum(ups, "avg_backward_device_time_sec") == pytest.approx(n * bwd / 1e9)
    assert _sum(ups, "avg_optimizer_device_time_sec") == pytest.approx(n * opt / 1e9)
    # the iteration, start mark to end mark, on the device: all its work (the host launched each kernel at once)
    steady = _sum(ups, "avg_iteration_device_time_sec")  # (warm-up 0: every iteration is steady)
    assert steady == pytest.approx(n * (fwd + bwd + opt) / 1e9)
    # the host queued forward and backward in 2 launches (40 us): it then waited for the rest of their 9 ms
    expected_stall = (fwd + bwd - 2 * sim.launch_ns) / 1e9
    assert _sum(ups, "avg_stall_time_sec") == pytest.approx(n * expected_stall)
    # metric records beside the event, for dashboards
    metrics = read_run(telemetry, "metric")
    names = {m.name for m in metrics}
    assert {"train.phase.device_duration", "train.stall_time", "train.iteration_time.device.mean"} <= names
    assert {m.attributes["train.phase"] for m in metrics if m.name == "train.phase.device_duration"} >= {
        "forward", "backward"}
    (info,) = [e.attributes for e in read_run(telemetry, "event") if e.name == "device_timing"]
    assert info["mode"] == "sim" and info["capacity"] == dt.DEFAULT_CAPACITY


def test_a_host_bound_loop_has_no_stall_and_matching_times(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock
) -> None:
    """The device waits for the host (small kernels, CPU work between them): no stall, and each phase's device time
    is its host time (the device follows the host)."""
    r = _recorder(telemetry, sim)
    for _ in range(10):
        r.on_training_single_iteration_start()
        with r.data_loading():
            sim.host(4 * MS)  # the host decodes a batch
        with r.forward():
            sim.launch(100_000)
            sim.host(1 * MS)
        r.on_training_single_iteration_end()
    r.on_train_end()
    ups = _updates(read_run, telemetry)
    assert _sum(ups, "avg_stall_time_sec") == 0.0
    assert _sum(ups, "avg_dataloader_device_time_sec") == pytest.approx(10 * 4 * MS / 1e9)
    assert _sum(ups, "avg_forward_device_time_sec") == pytest.approx(10 * (1 * MS + sim.launch_ns) / 1e9)


def test_resolution_never_waits_and_the_ring_gives_the_oldest_up(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock
) -> None:
    """No sync in the loop and a device far slower than the host: marks complete long after the host moved on. The
    timer never reads an unfinished mark (SimClock.elapsed_s would raise), keeps `capacity` iterations waiting, and
    counts each one it gives up; what the device finishes later is resolved later."""
    capacity = 8
    t = telemetry
    timer = dt.DeviceTimer(t, sim, capacity=capacity)
    t.extensions[dt.EXTENSION] = timer  # the recorder takes the Telemetry's timer
    r = _recorder(t, sim, log_every_n_train_iterations=1000)
    n = 30
    for _ in range(n):
        _step(r, sim, 50 * MS, 50 * MS, 50 * MS, sync=False)  # 150 ms of device work per ~0.1 ms of host time
    assert timer.waiting == capacity  # nothing completed: every slot waits; the rest were given up
    # pooled: 5 marks an iteration (3 back-to-back phases start at the mark before them: dt.SHARE_NS), `capacity`
    # slots, never more
    assert sim.events_created == capacity * 5
    assert timer.resolve() == 0  # still nothing done: nothing read, nothing waited for
    # time passes on the host (CPU work, no sync): the device works through 25.5 iterations' worth of its queue.
    # The given-up iterations' kernels still ran; the 8 waiting are the last (22-29): 22, 23 and 24 are done now
    sim.host(int(25.5 * 150 * MS))
    done = timer.resolve()
    w = timer.take_window()
    assert done == 3 and w.iterations == 3 and w.unresolved == n - capacity
    assert w.phases["forward"] == pytest.approx(3 * 50 * MS / 1e9)
    # the final report polls for the last 5 for at most FINAL_WAIT_S (0.5 s: 3 more of 150 ms finish meanwhile), then
    # counts the rest as unresolved: every iteration is either timed or counted
    r.on_train_end()
    ups = _updates(read_run, t)
    timed = sum(u["device_timed_iterations"] for u in ups)
    unresolved = sum(u["device_unresolved_iterations"] for u in ups)
    assert (timed, unresolved) == (3, 2)
    assert timed + unresolved + done + (n - capacity) == n and timer.waiting == 0


def test_the_final_wait_is_bounded_when_the_device_never_finishes(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock
) -> None:
    r = _recorder(telemetry, sim)
    sleeps: list[float] = []
    original = sim.sleep

    def counted_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        original(seconds)

    dt._sleep = counted_sleep  # type: ignore[assignment]  # (time.sleep's stand-in; restored by the fixture's monkeypatch)
    for _ in range(3):
        _step(r, sim, 1 * MS, 1 * MS, 1 * MS)
    r.on_training_single_iteration_start()
    with r.forward():
        sim.launch(10**15)  # a hung kernel: the device never reaches the end mark
    r.on_training_single_iteration_end()
    r.on_train_end()
    assert sum(sleeps) <= dt.FINAL_WAIT_S + 0.002  # polled, then gave up
    ups = _updates(read_run, telemetry)
    assert sum(u["device_timed_iterations"] for u in ups) == 3
    assert ups[-1]["num_iterations"] == 4  # the host figures are whole


def test_graph_capture_records_no_marks(telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock) -> None:
    r = _recorder(telemetry, sim)
    _step(r, sim, MS, MS, MS)
    records = sim.records
    sim.capturing = True
    _step(r, sim, MS, MS, MS)
    assert sim.records == records  # neither the iteration nor its phases marked
    sim.capturing = False
    _step(r, sim, MS, MS, MS)
    r.on_train_end()
    ups = _updates(read_run, telemetry)
    assert sum(u["device_timed_iterations"] for u in ups) == 2
    assert sum(u["device_unresolved_iterations"] for u in ups) == 1


def test_an_abandoned_iteration_is_not_timed(telemetry: Telemetry, read_run: Callable[..., Any],
                                             sim: SimClock) -> None:
    r = _recorder(telemetry, sim)
    _step(r, sim, MS, MS, MS)
    r.on_training_single_iteration_start()
    with r.forward():
        sim.launch(MS)
    r.abandon_iteration("step failed")
    _step(r, sim, MS, MS, MS)
    r.on_train_end()
    ups = _updates(read_run, telemetry)
    assert sum(u["device_timed_iterations"] for u in ups) == 2
    assert _sum(ups, "avg_forward_device_time_sec") == pytest.approx(2 * MS / 1e9)


def test_device_spans_inside_and_outside_iterations(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock
) -> None:
    """A user's device span inside a phase is not a phase (the phase keeps its whole time); its device time, like a
    device span's outside any iteration, goes to the windowed stat <name>.device_time of its group."""
    r = _recorder(telemetry, sim)
    for _ in range(4):
        r.on_training_single_iteration_start()
        with r.forward():
            sim.launch(MS)
            with span("attention", device=True, group="model"):
                sim.launch(2 * MS)
        r.on_training_single_iteration_end()
    r.on_train_end()
    with span("evaluate", device=True):  # no iteration open: a slot of its own
        sim.launch(5 * MS)
        sim.sync()
    sim.host(MS)
    ups = _updates(read_run, telemetry)
    assert _sum(ups, "avg_forward_device_time_sec") == pytest.approx(4 * 3 * MS / 1e9)
    telemetry.close()  # the stats' last (10 s) window closes
    stats = {(s.group, s.name): s.values for s in open_run(run_dir_of(telemetry)).records("stat")}
    attention = stats[("model", "attention.device_time")]
    assert attention["count"] == 4 and attention["mean"] == pytest.approx(2 * MS / 1e9)
    evaluate = stats[("spans", "evaluate.device_time")]
    assert evaluate["count"] == 1 and evaluate["mean"] == pytest.approx(5 * MS / 1e9)  # (its launch overlapped)


def test_callback_style_phases_are_device_timed_too(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock
) -> None:
    """Phases started and ended by callbacks (``Tracer.start(..., device=r.device_timed)``, as the Lightning
    integration drives them) get their marks as the context managers' do."""
    r = _recorder(telemetry, sim)
    for _ in range(3):
        r.on_training_single_iteration_start()
        s = r.tracer.start("model_forward", group="training", device=r.device_timed)
        sim.launch(2 * MS)
        s.end()
        s = r.tracer.start("model_backward", group="training", device=r.device_timed)
        sim.launch(4 * MS)
        sim.sync()
        s.end()
        r.on_training_single_iteration_end()
    r.on_train_end()
    ups = _updates(read_run, telemetry)
    assert _sum(ups, "avg_forward_device_time_sec") == pytest.approx(3 * 2 * MS / 1e9)
    assert _sum(ups, "avg_backward_device_time_sec") == pytest.approx(3 * 4 * MS / 1e9)


def test_a_failing_clock_turns_device_timing_off_and_training_goes_on(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock
) -> None:
    r = _recorder(telemetry, sim)
    _step(r, sim, MS, MS, MS)
    sim.fail_record = RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.warns(TelemetryWarning, match="device timing failed.*illegal memory access"):
        _step(r, sim, MS, MS, MS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once
        for _ in range(3):
            _step(r, sim, MS, MS, MS)
    r.on_train_end()
    records = read_run(telemetry, "event")
    errors = [e.attributes for e in records if e.name == "error" and e.attributes.get("callback") == "device_timing"]
    assert len(errors) == 1 and "illegal memory access" in errors[0]["error_message"]
    ups = _updates(read_run, telemetry)
    assert ups[-1]["num_iterations"] == 5  # every iteration counted on the host


def test_an_unreadable_slot_is_unresolved_and_only_repeated_failures_turn_timing_off(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock
) -> None:
    """One slot whose marks cannot be read (a mark recorded inside a CUDA graph capture begun mid-iteration) costs
    that iteration; MAX_READ_FAILURES in a row (a broken device) turn device timing off, warned once."""
    r = _recorder(telemetry, sim, log_every_n_train_iterations=1000)
    timer = r._device
    _step(r, sim, MS, MS, MS)
    sim.fail_reads = 1
    _step(r, sim, MS, MS, MS)
    _step(r, sim, MS, MS, MS)
    timer.resolve()
    w = timer.take_window()
    assert timer.enabled and (w.iterations, w.unresolved) == (2, 1)
    for _ in range(dt.MAX_READ_FAILURES):
        _step(r, sim, MS, MS, MS)
    sim.fail_reads = dt.MAX_READ_FAILURES
    with pytest.warns(TelemetryWarning, match="device timing failed.*capturing stream"):
        timer.resolve()
    assert not timer.enabled
    _step(r, sim, MS, MS, MS)  # training goes on, host-timed
    r.on_train_end()
    assert _updates(read_run, telemetry)[-1]["num_iterations"] == 7


def test_host_mode_and_auto_on_a_cpu(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    """device_timing='host': no marks; 'auto' here (no CUDA device in use): host, and the event says why."""
    skip_if_cuda_in_use()
    for mode in ("host", "auto"):
        r = _recorder(telemetry, mode)
        assert not r.device_timed
        r.on_training_single_iteration_start()
        with r.forward() as s:
            assert type(s).__name__ == "Span"  # not a device span: nothing more on the host path
        r.on_training_single_iteration_end()
        r.on_train_end()
        r.on_app_end()
    infos = [e.attributes for e in read_run(telemetry, "event") if e.name == "device_timing"]
    assert [i["mode"] for i in infos] == ["host", "host"]
    assert infos[0]["reason"] == "device_timing='host'" and infos[1]["reason"]
    assert all(i["energy"] == "none" for i in infos)
    assert not any("device" in k for u in _updates(read_run, telemetry) for k in u if k != "device_timing")


def test_config_checks_device_timing_and_gpu_energy() -> None:
    with pytest.raises(ValueError, match="device_timing"):
        TrainingTelemetryConfig(global_batch_size_or_fn=1, device_timing="gpu")
    with pytest.raises(TypeError, match="device_timing"):
        TrainingTelemetryConfig(global_batch_size_or_fn=1, device_timing=3)
    with pytest.raises(TypeError, match="gpu_energy"):
        TrainingTelemetryConfig(global_batch_size_or_fn=1, gpu_energy="yes")
    TrainingTelemetryConfig(global_batch_size_or_fn=1, device_timing=SimClock())


def test_span_device_flag_keeps_a_device_attribute_as_before(telemetry: Telemetry,
                                                              read_run: Callable[..., Any]) -> None:
    """``device=True`` is the flag; any other value is an attribute named device, as before the flag existed."""
    with span("copy", device="cuda:0") as s:  # type: ignore[arg-type]  # (annotated bool: the flag)
        assert type(s) is span
    with tracer(telemetry).span("copy2", device="cuda:1") as s2:  # type: ignore[arg-type]
        pass
    starts = {e.name: e.attributes for e in read_run(telemetry, "span_start")}
    assert s.start_attributes == {"device": "cuda:0"} and s2.start_attributes == {"device": "cuda:1"}
    assert starts == {"copy": {"device": "cuda:0"}, "copy2": {"device": "cuda:1"}}  # stored as attributes too


def test_window_attributes_arithmetic() -> None:
    w = dt.DeviceWindow()
    assert w.attributes() == {"device_timed_iterations": 0, "device_unresolved_iterations": 0}
    w.iterations, w.steady, w.iteration_sum, w.iteration_max = 4, 3, 0.6, 0.3
    w.phases = {"forward": 0.4}
    w.stall_sum = 0.08
    w.unresolved, w.captured = 2, 1
    a = w.attributes()
    assert a["avg_iteration_device_time_sec"] == pytest.approx(0.2) and a["max_iteration_device_time_sec"] == 0.3
    assert a["avg_forward_device_time_sec"] == pytest.approx(0.1) and a["avg_stall_time_sec"] == pytest.approx(0.02)
    assert a["device_unresolved_iterations"] == 3
    assert all(math.isfinite(v) for v in a.values())


def test_back_to_back_boundaries_share_one_mark(telemetry: Telemetry, read_run: Callable[..., Any],
                                                sim: SimClock) -> None:
    """Five phases back to back need 7 marks an iteration, not 12 (each phase starts at the mark before it:
    dt.SHARE_NS), and each phase keeps its own device time."""
    r = _recorder(telemetry, sim, log_every_n_train_iterations=1000)  # one report, at the end: all resolved by then
    n = 10
    for _ in range(n):
        r.on_training_single_iteration_start()
        for phase, work in ((r.data_loading, 1), (r.zero_grad, 2), (r.forward, 3), (r.backward, 6),
                            (r.optimizer_update, 1)):
            with phase():
                sim.launch(work * MS)
        r.on_training_single_iteration_end()
    r.on_train_end()
    assert sim.records == 7 * n
    ups = _updates(read_run, telemetry)
    assert sum(u["device_timed_iterations"] for u in ups) == n
    for key, work in (("dataloader", 1), ("zero_grad", 2), ("forward", 3), ("backward", 6), ("optimizer", 1)):
        assert _sum(ups, f"avg_{key}_device_time_sec") == pytest.approx(n * work * MS / 1e9), key
    assert _sum(ups, "avg_iteration_device_time_sec") == pytest.approx(n * 13 * MS / 1e9)


@pytest.mark.parametrize("launch_ns", [20_000, 5_000])
def test_work_between_phases_is_outside_both_unless_it_came_within_the_sharing_time(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock, launch_ns: int
) -> None:
    """One kernel launched between forward and backward. Launched in SHARE_NS or more of host time, backward records
    its own start and the kernel is in neither phase; launched faster than that (5 us: the bound the docs state),
    backward starts at forward's end mark and the kernel counts in backward. The iteration holds it either way; a
    phase whose one launch took less than SHARE_NS still ends at a mark of its own (forward keeps its 3 ms)."""
    sim.launch_ns = launch_ns
    r = _recorder(telemetry, sim, log_every_n_train_iterations=1000)
    n = 5
    for _ in range(n):
        r.on_training_single_iteration_start()
        with r.forward():
            sim.launch(3 * MS)
        sim.launch(2 * MS)  # between the phases (a loss computed outside them, say)
        with r.backward():
            sim.launch(6 * MS)
        r.on_training_single_iteration_end()
    r.on_train_end()
    ups = _updates(read_run, telemetry)
    shared = launch_ns < dt.SHARE_NS
    assert sim.records == n * (4 if shared else 5)
    assert _sum(ups, "avg_forward_device_time_sec") == pytest.approx(n * 3 * MS / 1e9)
    assert _sum(ups, "avg_backward_device_time_sec") == pytest.approx(n * (8 if shared else 6) * MS / 1e9)
    assert _sum(ups, "avg_iteration_device_time_sec") == pytest.approx(n * 11 * MS / 1e9)


def test_device_timing_every_times_one_iteration_in_n(telemetry: Telemetry, read_run: Callable[..., Any],
                                                      sim: SimClock) -> None:
    """device_timing_every=3: iterations 1, 4, 7, ... record marks, the others none (neither timed nor unresolved);
    the averages are per timed iteration, so a steady loop's are the same as when every iteration is timed."""
    r = _recorder(telemetry, sim, log_every_n_train_iterations=1000, device_timing_every=3)
    n = 9
    for _ in range(n):
        _step(r, sim, 3 * MS, 6 * MS, 1 * MS)
    r.on_train_end()
    assert sim.records == 3 * 5  # 3 timed iterations, 5 marks each (3 phases back to back, the iteration ends)
    (u,) = _updates(read_run, telemetry)
    assert u["device_timed_iterations"] == 3 and u["device_unresolved_iterations"] == 0
    assert u["avg_forward_device_time_sec"] == pytest.approx(3 * MS / 1e9)
    assert u["avg_iteration_device_time_sec"] == pytest.approx(10 * MS / 1e9)
    (info,) = [e.attributes for e in read_run(telemetry, "event") if e.name == "device_timing"]
    assert info["every"] == 3
    for bad in (0, 1.5, True, "8", "always", None):
        with pytest.raises(ValueError, match="device_timing_every"):
            TrainingTelemetryConfig(global_batch_size_or_fn=1, device_timing_every=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("report_every", "every"), [(1000, 8), (50, 8), (3, 3), (1, 1)])
def test_device_timing_every_auto_is_the_default_and_times_every_window(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock, report_every: int, every: int
) -> None:
    """The default, "auto": one iteration in 8, or one in each report window when windows are shorter."""
    assert TrainingTelemetryConfig(global_batch_size_or_fn=1).device_timing_every == "auto"
    r = _recorder(telemetry, sim, log_every_n_train_iterations=report_every, device_timing_every="auto")
    n = 24
    for _ in range(n):
        _step(r, sim, 3 * MS, 6 * MS, 1 * MS)
    r.on_train_end()
    ups = _updates(read_run, telemetry)
    assert sum(u["device_timed_iterations"] for u in ups) == n // every
    assert sum(u["device_unresolved_iterations"] for u in ups) == 0
    assert _sum(ups, "avg_forward_device_time_sec") == pytest.approx(n // every * 3 * MS / 1e9)
    (info,) = [e.attributes for e in read_run(telemetry, "event") if e.name == "device_timing"]
    assert info["every"] == every and info["every_auto"] is True


def test_a_loop_ending_right_after_a_report_keeps_its_last_device_times(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock
) -> None:
    """10 iterations, a report every 5, a device far behind the host: the loop ends on a report, so there is no final
    report; the iterations the device finished later are in a ``device_timing`` event marked ``tail``, and every
    iteration is counted once, in a window or in the tail."""
    r = _recorder(telemetry, sim)
    n = 10
    for _ in range(n):
        _step(r, sim, 3 * MS, 6 * MS, 1 * MS, sync=False)
    r.on_train_end()
    ups = _updates(read_run, telemetry)
    assert sum(u["window_iterations"] for u in ups) == n and not any(u["final"] for u in ups)
    (tail,) = [e.attributes for e in read_run(telemetry, "event")
               if e.name == "device_timing" and e.attributes.get("tail")]
    timed = sum(u["device_timed_iterations"] for u in ups) + tail["device_timed_iterations"]
    assert timed == n and tail["device_unresolved_iterations"] == 0 and tail["device_timed_iterations"] > 0
    assert tail["avg_forward_device_time_sec"] == pytest.approx(3 * MS / 1e9)
    # a loop whose last report has every device time: no tail
    r.on_train_start(n)
    for _ in range(5):
        _step(r, sim, MS, MS, MS)  # synchronised: resolved by the report
    r.on_train_end()
    tails = [e for e in read_run(telemetry, "event") if e.name == "device_timing" and e.attributes.get("tail")]
    assert len(tails) == 1


def test_the_simulated_events_answer_as_cuda_events_do() -> None:
    """The simulation is only evidence if its events behave as ``torch.cuda.Event``'s: never recorded, an event is
    done (cudaEventQuery has no work to wait for) and has no time (elapsed_time raises); recorded behind queued work,
    it is done once the device gets there; recorded again, it answers for its latest record."""
    clock = SimClock(launch_ns=0)
    never, a, b = clock.event(), clock.event(), clock.event()
    assert clock.done(never)
    clock.record(a)
    with pytest.raises(ValueError, match="recorded"):
        clock.elapsed_s(never, a)
    clock.launch(1_000)
    clock.record(b)
    assert clock.done(a) and not clock.done(b)
    clock.sync()
    assert clock.done(b) and clock.elapsed_s(a, b) == pytest.approx(1e-6)
    clock.launch(5_000)
    clock.record(a)  # re-recorded behind new work: not done until the device reaches it
    assert not clock.done(a)


def test_a_device_span_outside_iterations_records_no_mark_while_capturing(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock
) -> None:
    """``span(device=True)`` with no iteration open, inside a CUDA graph capture (a captured eval step): no mark on
    the capturing stream, whose events CUDA would refuse to read -- three such spans used to turn device timing off
    for the process. Spans and iterations after the capture are timed."""
    r = _recorder(telemetry, sim)
    timer = r._device
    assert timer is not None
    records = sim.records
    sim.capturing = True
    for _ in range(3):
        with span("captured_eval", device=True):
            sim.launch(MS)
    sim.capturing = False
    assert sim.records == records
    sim.sync()
    timer.resolve()
    assert timer.enabled, timer.failure
    with span("evaluate", device=True):
        sim.launch(2 * MS)
        sim.sync()
    _step(r, sim, MS, MS, MS)
    r.on_train_end()
    assert timer.enabled, timer.failure
    ups = _updates(read_run, telemetry)
    assert sum(u["device_timed_iterations"] for u in ups) == 1


def test_the_host_to_device_phase_has_its_device_metric_as_its_host_one_does(
    telemetry: Telemetry, read_run: Callable[..., Any], sim: SimClock
) -> None:
    """``host_to_device()`` (phase ``h2d``) is device-timed like the others: its attribute and its
    ``train.phase.device_duration`` series, as the host's ``train.phase.duration`` has one for h2d."""
    r = _recorder(telemetry, sim)
    for _ in range(5):
        r.on_training_single_iteration_start()
        with r.host_to_device():
            sim.launch(2 * MS)
        with r.forward():
            sim.launch(MS)
            sim.sync()
        r.on_training_single_iteration_end()
    r.on_train_end()
    ups = _updates(read_run, telemetry)
    assert _sum(ups, "avg_h2d_device_time_sec") == pytest.approx(5 * 2 * MS / 1e9)
    metrics = read_run(telemetry, "metric")
    host = {m.attributes["train.phase"] for m in metrics if m.name == "train.phase.duration"}
    device = {m.attributes["train.phase"] for m in metrics if m.name == "train.phase.device_duration"}
    assert "h2d" in host and device == {"h2d", "forward"}
