"""Device timing, GPU energy and the peak table on a real CUDA device. Skipped, saying why, without one.

The bookkeeping is tested on every machine against a simulated stream (tests/test_device_timing.py); this module
checks what only a GPU can: that ``CudaClock``'s marks time real kernels, add no sync (``set_sync_debug_mode``), do not
break a CUDA graph capture (neither a captured iteration nor a resolution running in another thread during a
``global``-mode capture), never wait when the device lags, and that NVML's energy counter is read. The timing
comparisons with ``torch.profiler`` and ``nvidia-smi`` are in ``bench/bench_gpu.py`` (numbers, not pass/fail of a
unit test).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="device timing is measured on torch's CUDA device")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here (torch.cuda.is_available() is False): the device-timing bookkeeping is tested "
                "on a simulated stream in tests/test_device_timing.py; run this module and bench/bench_gpu.py on a GPU",
                allow_module_level=True)

from conftest import run_dir_of  # noqa: E402
from telemetrain import Telemetry  # noqa: E402
from telemetrain.store import open_run  # noqa: E402
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig  # noqa: E402
from telemetrain.training.device_clock import CudaClock  # noqa: E402
from telemetrain.training.device_spans import timer_of  # noqa: E402
from telemetrain.training.device_timing import DeviceTimer  # noqa: E402


@pytest.fixture
def t(tmp_path: Path) -> Iterator[Telemetry]:
    telemetry = Telemetry(store=tmp_path)
    yield telemetry
    telemetry.close()
    torch.cuda.synchronize()


def _recorder(t: Telemetry, **config: Any) -> TrainingRecorder:
    fields: dict[str, Any] = {"global_batch_size_or_fn": 8, "log_every_n_train_iterations": 10,
                              "warmup_iterations": 1, "device_timing": "cuda", "device_timing_every": 1, **config}
    r = TrainingRecorder(TrainingTelemetryConfig(**fields), telemetry=t)
    r.on_app_start()
    r.on_train_start(0)
    return r


def _matmuls(x: Any, n: int) -> Any:
    for _ in range(n):
        x = (x @ x).clamp_(-1, 1)
    return x


def test_cuda_marks_time_real_kernels_phase_by_phase(t: Telemetry) -> None:
    """Forward runs 4 matmuls, backward 8 (same size): their device times are 1:2; on the host both are launches."""
    torch.cuda.init()
    r = _recorder(t)
    assert r.device_timed and isinstance(timer_of(t)[0], DeviceTimer)
    x = torch.randn(4096, 4096, device="cuda")
    _matmuls(x, 1)  # cuBLAS's first call (its handle, its kernels' loading) out of the timed iterations
    for _ in range(21):
        r.on_training_single_iteration_start()
        with r.forward():
            x = _matmuls(x, 4)
        with r.backward():
            x = _matmuls(x, 8)
        r.on_training_single_iteration_end()
    # the final report waits at most device_timing.FINAL_WAIT_S for the device: a sync first, as a program's last
    # loss.item() would, so that every iteration is resolved by then (not given up)
    torch.cuda.synchronize()
    r.on_train_end()
    t.flush()  # the final report is in the store after it
    updates = [e.attributes for e in open_run(run_dir_of(t)).records("event") if e.name == "training_metrics_update"]
    n = sum(u["device_timed_iterations"] for u in updates)
    assert n == 21 and sum(u["device_unresolved_iterations"] for u in updates) == 0
    # (a window in which the device finished no iteration has no averages)
    forward = sum(u.get("avg_forward_device_time_sec", 0.0) * u["device_timed_iterations"] for u in updates)
    backward = sum(u.get("avg_backward_device_time_sec", 0.0) * u["device_timed_iterations"] for u in updates)
    assert backward / forward == pytest.approx(2.0, rel=0.2)
    # the host phases were launches: far shorter than the device's
    host_backward = sum(u["avg_backward_time_sec"] * u["window_iterations"] for u in updates)
    assert host_backward < backward


def test_no_sync_on_the_instrumented_step(t: Telemetry) -> None:
    torch.cuda.init()
    r = _recorder(t, log_every_n_train_iterations=5)
    x = torch.randn(2048, 2048, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):
            x.sum().item()  # the control: the mode is armed
        for _ in range(20):  # reports included (every 5): computed in the collector thread, which reads events
            r.on_training_single_iteration_start()
            with r.forward():
                y = _matmuls(x, 2)
            with r.optimizer_update(), r.tracer.span("inner", device=True):
                y = y + 1
            r.on_training_single_iteration_end()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    r.on_train_end()
    # the mode is process-wide: a sync in the collector thread's resolution would have raised there, contained, and
    # turned device timing off
    timer = t.extensions.get("device_timer")
    assert isinstance(timer, DeviceTimer) and timer.enabled, getattr(timer, "failure", "")


def _ready_to_capture(t: Telemetry) -> tuple[Any, Any, Any]:
    """A recorder with its device timer, and a tensor whose kernels were warmed up on a side stream (as CUDA graph
    capture needs)."""
    torch.cuda.init()
    r = _recorder(t, log_every_n_train_iterations=1000)
    timer = timer_of(t)[0]
    assert timer is not None
    x = torch.randn(2048, 2048, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _matmuls(x, 3)
    torch.cuda.current_stream().wait_stream(side)
    return r, timer, x


def test_graph_capture_is_not_broken_by_marks_or_by_resolution(t: Telemetry) -> None:
    r, timer, x = _ready_to_capture(t)
    # 1. an instrumented iteration captured into a graph: no mark is recorded on the capturing stream
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        r.on_training_single_iteration_start()
        with r.forward():
            y = _matmuls(x, 2)
        r.on_training_single_iteration_end()
    g.replay()
    # 2. a global-mode capture (the default) while another thread resolves pending marks
    for _ in range(5):
        r.on_training_single_iteration_start()
        with r.forward():
            _matmuls(x, 20)
        r.on_training_single_iteration_end()
    stop = threading.Event()
    passes = [0]

    def resolve() -> None:
        while not stop.is_set():
            timer.resolve()
            passes[0] += 1

    worker = threading.Thread(target=resolve)
    worker.start()
    g2 = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g2):  # capture_error_mode="global"
            z = _matmuls(x, 200)
    finally:
        stop.set()
        worker.join()
    g2.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(y).all() and torch.isfinite(z).all() and passes[0] > 0
    assert timer.enabled, timer.failure
    timer.resolve(1.0)
    w = timer.take_window()
    assert w.captured == 1 and w.iterations == 5


def test_the_host_never_waits_for_a_lagging_device(t: Telemetry) -> None:
    """capacity 4, 12 iterations of long kernels without a sync: the host finishes its loop long before the device,
    4 iterations wait, 8 are given up (counted), and the waiting ones resolve once the device gets there."""
    torch.cuda.init()
    timer = DeviceTimer(t, CudaClock(torch), capacity=4)
    t.extensions["device_timer"] = timer
    r = _recorder(t, log_every_n_train_iterations=1000)
    x = torch.randn(8192, 8192, device="cuda")
    torch.cuda.synchronize()
    for _ in range(12):
        r.on_training_single_iteration_start()
        with r.forward():
            x = _matmuls(x, 10)
        r.on_training_single_iteration_end()
    # the host ran ahead: the device still has the loop's work queued (a sync in the loop would have drained it)
    assert not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    timer.resolve()
    w = timer.take_window()
    assert w.unresolved == 8 and w.iterations == 4


def test_nvml_energy_counter_on_this_gpu() -> None:
    pytest.importorskip("psutil", reason="telemetrain.system needs the [system] extra")
    pytest.importorskip("pynvml", reason="the GPU energy counter is read through nvidia-ml-py")
    from telemetrain.system.energy import GpuEnergy

    torch.cuda.init()
    meter = GpuEnergy()
    assert meter.gpus, meter.reason
    first = meter.read()
    _matmuls(torch.randn(8192, 8192, device="cuda"), 200)
    torch.cuda.synchronize()
    second = meter.read()
    assert first is not None and second is not None
    assert first.joules == 0.0 and second.joules > 0 and second.sharers >= 1
    assert meter.source in ("counter", "power_integral")


def test_the_peak_table_knows_this_gpu() -> None:
    from telemetrain.training.flops import peak_tflops

    name = torch.cuda.get_device_name()
    if not any(k in name for k in ("H100", "H200", "A100", "B200")):
        pytest.skip(f"{name}: not a data-centre GPU the table is checked against here")
    peak = peak_tflops(name, "bfloat16")
    assert peak is not None, f"{name} is not in training.flops.PEAK_TFLOPS"


def test_raw_driver_marks_time_what_torch_marks_time() -> None:
    """CudaClock records through the driver (cuEventRecord on the current stream's raw handle) where it can: the same
    kernels timed by both ways of recording agree, on the default stream and on a side stream made current."""
    torch.cuda.init()
    raw, plain = CudaClock(torch), CudaClock(torch, raw=False)
    assert raw.raw and not plain.raw
    x = torch.randn(4096, 4096, device="cuda")
    _matmuls(x, 1)
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        took: dict[bool, list[float]] = {}
        with torch.cuda.stream(stream):
            for clock in (raw, plain, raw, plain):  # interleaved: the clocks' turns see the same device
                a, b = clock.event(), clock.event()
                clock.record(a)
                _matmuls(x, 10)
                clock.record(b)
                torch.cuda.synchronize()
                assert clock.done(a) and clock.done(b)
                took.setdefault(clock.raw, []).append(clock.elapsed_s(a, b))
        assert min(took[True]) > 0 and min(took[True]) == pytest.approx(min(took[False]), rel=0.1), took


def test_a_loop_ending_on_a_report_puts_its_last_device_times_in_the_tail(t: Telemetry) -> None:
    """10 iterations of long kernels, a report every 5, no sync: the host ends the loop while the device is still on
    the first iterations; the reports' windows and the tail event (waited for at most FINAL_WAIT_S) count each
    iteration once."""
    torch.cuda.init()
    r = _recorder(t, log_every_n_train_iterations=5)
    x = torch.randn(8192, 8192, device="cuda")  # ~20 ms a matmul in float32: the device is far behind at the end
    _matmuls(x, 1)
    torch.cuda.synchronize()
    for _ in range(10):
        r.on_training_single_iteration_start()
        with r.forward():
            x = _matmuls(x, 3)
        r.on_training_single_iteration_end()
    r.on_train_end()
    t.flush()
    events = list(open_run(run_dir_of(t)).records("event"))
    updates = [e.attributes for e in events if e.name == "training_metrics_update"]
    tails = [e.attributes for e in events if e.name == "device_timing" and e.attributes.get("tail")]
    counted = sum(u["device_timed_iterations"] + u["device_unresolved_iterations"] for u in updates + tails)
    assert counted == 10 and len(tails) == 1, (updates, tails)


def test_cuda_events_answer_as_the_simulation_assumes() -> None:
    """tests/_device_sim.py is evidence only while its events behave as these do: never recorded, done and without a
    time; recorded behind queued work, not done until the device gets there (checked without waiting for it first)."""
    torch.cuda.init()
    clock = CudaClock(torch)
    never = torch.cuda.Event(enable_timing=True)
    assert clock.done(never)
    a, b = clock.event(), clock.event()
    torch.cuda.synchronize()
    clock.record(a)
    with pytest.raises((ValueError, RuntimeError), match="recorded"):
        clock.elapsed_s(never, a)
    x = torch.randn(8192, 8192, device="cuda")
    _matmuls(x, 20)  # ~0.3 s of device work in float32: far longer than the host takes to the query below
    clock.record(b)
    assert not clock.done(b)
    torch.cuda.synchronize()
    assert clock.done(a) and clock.done(b) and clock.elapsed_s(a, b) > 0


def test_a_device_span_inside_a_graph_capture_leaves_device_timing_on(t: Telemetry) -> None:
    """A captured eval step wrapped in ``span(device=True)`` (no iteration open): no mark on the capturing stream,
    the capture and its replays work, and device timing stays on for the iterations after it."""
    from telemetrain.spans import span

    r, timer, x = _ready_to_capture(t)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(3):
            with span("captured_eval", device=True):
                y = _matmuls(x, 2)
    g.replay()
    for _ in range(3):
        r.on_training_single_iteration_start()
        with r.forward():
            _matmuls(x, 2)
        r.on_training_single_iteration_end()
    torch.cuda.synchronize()
    timer.resolve(1.0)
    assert timer.enabled, timer.failure
    assert torch.isfinite(y).all() and timer.take_window().iterations == 3


_CPU_JOB = """
import sys, torch, telemetrain
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
t = telemetrain.Telemetry(store=sys.argv[1])
r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, flops_per_sample_or_fn=1e9,
                                             log_every_n_train_iterations=5, warmup_iterations=0), telemetry=t)
r.on_app_start(); r.on_train_start(0)
device = sys.argv[2]
for _ in range(10):
    r.on_training_single_iteration_start()
    torch.ones(64, 64, device=device) @ torch.ones(64, 64, device=device)  # (CUDA initialised only in the loop)
    r.on_training_single_iteration_end()
r.on_train_end(); r.on_app_end(); t.flush()
print(torch.cuda.is_initialized())
print(t.run_dir)
"""


def test_a_cpu_job_on_a_gpu_machine_gets_no_mfu_and_no_cuda_context(tmp_path: Path) -> None:
    """torch imported, CUDA never initialised by the program: no MFU against the GPU it does not use, and the report
    does not initialise CUDA to look the GPU's name up (a fresh process: this one has CUDA initialised)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _CPU_JOB, str(tmp_path / "cpu"), "cpu"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    initialised, run = out.stdout.split()
    assert initialised == "False"
    updates = [e.attributes for e in open_run(run).records("event") if e.name == "training_metrics_update"]
    assert updates and all("mfu" not in u and "peak_tflops_per_gpu" not in u for u in updates)
    assert all("train_throughput_per_gpu" in u for u in updates)
    # the same job whose work reaches the GPU only after on_train_start: the peak is looked up again, MFU comes
    from telemetrain.training.flops import peak_tflops

    if peak_tflops(torch.cuda.get_device_name(0), "bfloat16") is None:
        return  # a GPU the peak table does not hold: no MFU either way
    out = subprocess.run([sys.executable, "-c", _CPU_JOB, str(tmp_path / "gpu"), "cuda"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    initialised, run = out.stdout.split()
    assert initialised == "True"
    updates = [e.attributes for e in open_run(run).records("event") if e.name == "training_metrics_update"]
    assert updates and all("mfu" in u and u["peak_tflops_per_gpu"] > 0 for u in updates)
