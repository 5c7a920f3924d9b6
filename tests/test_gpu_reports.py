"""What readers make of a GPU job's records, on real run stores: the device phase split (report, compare, straggler
detector), GPU health joined to each report window (the throttle finding, and that it stays silent on a clean run),
energy per unit of work (per window, per rank sharing a GPU, across restarts in goodput), and NVML's absence.

The records are the ones a GPU job writes -- ``training_metrics_update`` events with device times and energy, and the
system sampler's ``hw.gpu.*`` / ``torch.cuda.*`` samples -- written with explicit times into a real store; the
energy is fed through ``gpu_report``'s ``EnergySource`` interface (what NVML's counter is read through), not a mock
of NVML. NVML itself runs here only for real: this machine has no driver (and the CI's lean venv no nvidia-ml-py).
"""

from __future__ import annotations

import re
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from _device_sim import skip_if_cuda_in_use
from conftest import run_dir_of, train_empty_iterations
from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis.compare import compare_runs
from telemetrain.cli import summarize
from telemetrain.distributed.stragglers import phase_clock, phases_of
from telemetrain.phase_times import phase_times
from telemetrain.records import Event, MetricPoint
from telemetrain.report.gpu_health import build_gpu_health, gpu_findings
from telemetrain.report.html import render
from telemetrain.report.model import build_model
from telemetrain.store import open_run
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
from telemetrain.training import reports as reports_module
from telemetrain.training.goodput import goodput
from telemetrain.training.gpu_report import _energy_source

SESSION = "gpu"
S = 1_000_000_000
T0 = 1_700_000_000 * S  # wall ns of the simulated run's start


class Store:
    """A real run store that records are written into with explicit wall times."""

    def __init__(self, root: Path, run_id: str, rank: int = 0, world: int = 1, perf_tag: str = "gpt") -> None:
        identity = identity_from_env({}, run_id=run_id, session_tag=SESSION, perf_tag=perf_tag, rank=rank,
                                     local_rank=rank, world_size=world)
        self.t = Telemetry(identity, store=root)

    def metric(self, wall_s: float, group: str, name: str, value: float, unit: str = "") -> None:
        wall = T0 + round(wall_s * S)
        self.t.emit(MetricPoint(wall - T0, wall, self.t.identity, group, name, value, unit))

    def window(self, wall_s: float, iteration: int, seconds: float, avg: float, **attributes: Any) -> None:
        wall = T0 + round(wall_s * S)
        a = {"current_iteration": iteration, "window_iterations": 10, "num_iterations": iteration + 1,
             "train_iterations_start": 0, "window_seconds": seconds, "avg_iteration_time_sec": avg,
             "p50_iteration_time_sec": avg, "max_iteration_time_sec": avg, "total_iteration_time_sec": avg * 10,
             "samples_per_second": 80 / seconds, **attributes}
        self.t.emit(Event(wall - T0, wall, self.t.identity, "training", "training_metrics_update", "info", a))

    def close(self) -> Path:
        assert self.t.close()
        assert self.t.run_dir is not None
        return self.t.run_dir


def _device_phases(forward: float, backward: float, optimizer: float) -> dict[str, float | str]:
    """A GPU job's window: host phase times are launches, the optimizer's holds the sync; device times are real."""
    return {"avg_forward_time_sec": 0.002, "avg_backward_time_sec": 0.003,
            "avg_optimizer_time_sec": forward + backward + optimizer - 0.005,
            "avg_forward_device_time_sec": forward, "avg_backward_device_time_sec": backward,
            "avg_optimizer_device_time_sec": optimizer, "avg_iteration_device_time_sec": forward + backward + optimizer,
            "device_timed_iterations": 10, "device_timing": "cuda"}


# -- which times the readers show --------------------------------------------------------------------------------------


def test_phase_times_prefer_the_device_and_say_so() -> None:
    host_only = {"avg_forward_time_sec": 0.01, "avg_backward_time_sec": 0.02}
    assert phase_times(host_only) == ({"forward": 0.01, "backward": 0.02}, "host")
    both = {**host_only, "avg_forward_device_time_sec": 0.03, "avg_backward_device_time_sec": float("nan")}
    assert phase_times(both) == ({"forward": 0.03}, "device")  # no mixing: a NaN device time is absent, not host
    assert phases_of(both)["forward"] == 0.03 and phase_clock(both) == "device"
    assert phases_of(host_only)["forward"] == 0.01 and phase_clock(host_only) == "host"


def test_the_report_splits_phases_by_device_time(tmp_path: Path) -> None:
    s = Store(tmp_path, "dev")
    for i in range(6):
        s.window(10.0 * (i + 1), 10 * i + 9, 1.0, 0.1, **_device_phases(0.03, 0.06, 0.01))
    model = build_model(open_run(s.close()))
    assert model.phase_source == {0: "device"}
    seconds = model.phase_seconds[0]
    assert seconds["forward"] == pytest.approx(6 * 10 * 0.03) and seconds["optimizer"] == pytest.approx(6 * 10 * 0.01)
    assert seconds["other"] == 0.0  # the device iteration is the phases
    page = render(model)
    assert "iteration time by phase, per rank: device time (CUDA events)" in page
    show = "\n".join(summarize(open_run(run_dir_of(s.t))))
    assert "last window, device time)" in show and "forward 30%" in show and "backward 60%" in show


def test_compare_labels_device_phases_and_refuses_to_mix_clocks(tmp_path: Path) -> None:
    runs = {}
    for name, forward, device in (("base", 0.030, True), ("cand", 0.045, True), ("host", 0.030, False)):
        s = Store(tmp_path, name)
        for i in range(12):
            extra = _device_phases(forward, 0.06, 0.01) if device else {"avg_forward_time_sec": forward}
            s.window(10.0 * (i + 1), 10 * i + 9, 1.0, 0.1, **extra)
        runs[name] = s.close()
    c = compare_runs(runs["cand"], runs["base"]).candidates[0]
    fwd = c.metric("forward")
    assert fwd is not None and fwd.label == "forward phase (device time)" and fwd.verdict == "regression"
    mixed = compare_runs(runs["host"], runs["base"]).candidates[0]
    assert mixed.metric("forward") is None
    assert any("device timing on in one run only" in n for n in mixed.notes)


# -- GPU health per window ---------------------------------------------------------------------------------------------


def _health_run(root: Path, run_id: str, *, throttle_at: set[int], slow_at: set[int], retries_at: int | None = None
                ) -> Path:
    """12 windows of 1 s (a report every second), samples every 2 s; windows in ``slow_at`` 30% slower; the power
    throttle flag (with the SM clock down) in the samples that fall in windows ``throttle_at``."""
    s = Store(root, run_id)
    for k in range(0, 13, 2):  # a sample at 0, 2, ..., 12 s
        throttled = k in throttle_at or (k - 1) in throttle_at
        s.metric(k, "system.gpu.0", "hw.gpu.throttle.power", int(throttled), "1")
        s.metric(k, "system.gpu.0", "hw.gpu.throttle.thermal", 0, "1")
        s.metric(k, "system.gpu.0", "hw.gpu.clock.sm", 1.35e9 if throttled else 1.98e9, "Hz")
        s.metric(k, "system.gpu.0", "hw.power", 700.0 if throttled else 640.0, "W")
        s.metric(k, "system.gpu.0", "hw.gpu.memory.utilization", 0.62, "1")
        retries = 0 if retries_at is None or k < retries_at else 3
        s.metric(k, "system.cuda.0", "torch.cuda.alloc_retries", retries, "{retry}")
    for i in range(12):
        avg = 0.13 if i in slow_at else 0.1
        s.window(i + 1.0, 10 * i + 9, 1.0, avg, energy_per_sample_J=2.5)
    return s.close()


def test_a_throttled_slow_window_is_flagged(tmp_path: Path) -> None:
    run = open_run(_health_run(tmp_path, "hot", throttle_at={7}, slow_at={6, 7}))
    health = build_gpu_health(run)
    flagged = health.flagged
    # the throttled sample is the one at 8 s, standing for 7-9 s (half its 2 s interval either side): windows 6
    # ([6, 7] s) and 7 ([7, 8] s) meet it and are 30% slow: flagged; window 8 meets it too but is not slow
    assert {w.iteration for w in flagged} == {69, 79}
    w = flagged[-1]
    assert w.throttles == ("power",) and w.sm_clock_min == 1.35e9 and w.rise == pytest.approx(0.3)
    ((severity, kind, title, detail),) = gpu_findings(health)
    assert (severity, kind) == ("warning", "gpu throttling") and "2 window(s)" in title
    assert "power" in detail and "1350 MHz" in detail and "1980 MHz" in detail
    model = build_model(run)
    assert any(f.kind == "gpu throttling" for f in model.findings)
    page = render(model)
    assert "GPU health by window" in page and "slowed while throttled" in page


def test_no_finding_on_a_clean_run_nor_on_a_throttle_that_costs_nothing(tmp_path: Path) -> None:
    clean = build_gpu_health(open_run(_health_run(tmp_path, "clean", throttle_at=set(), slow_at={6, 7})))
    assert clean.sampled and not clean.flagged and gpu_findings(clean) == []  # slow, but no throttle: not ours
    capped = build_gpu_health(open_run(_health_run(tmp_path, "capped", throttle_at={3, 7}, slow_at=set())))
    assert any(w.throttles for w in capped.windows) and gpu_findings(capped) == []  # throttled, not slower


def test_allocator_retries_are_memory_pressure(tmp_path: Path) -> None:
    health = build_gpu_health(open_run(_health_run(tmp_path, "mem", throttle_at=set(), slow_at=set(),
                                                   retries_at=8)))
    pressured = [w for w in health.windows if w.alloc_retries]
    assert [w.iteration for w in pressured] == [79]  # the window during which the counter went 0 -> 3
    assert pressured[0].alloc_retries == 3
    ((_, kind, _, detail),) = gpu_findings(health)
    assert kind == "gpu memory pressure" and "3 time(s)" in detail


def test_a_run_without_gpu_samples_has_no_gpu_findings(tmp_path: Path) -> None:
    s = Store(tmp_path, "cpu")
    for i in range(5):
        s.window(i + 1.0, 10 * i + 9, 1.0, 0.1 if i != 3 else 0.5)
    health = build_gpu_health(open_run(s.close()))
    assert not health.sampled and health.energy_J is None and gpu_findings(health) == []
    assert "No GPU samples joined" in render(build_model(open_run(tmp_path / SESSION / "cpu")))


# -- energy per unit of work -------------------------------------------------------------------------------------------


class Reading(NamedTuple):
    """What ``EnergySource.read`` returns (``system.energy.EnergyReading``'s fields)."""

    mono_ns: int
    joules: float
    sharers: int


class SharedGpu:
    """One GPU drawing ``joules_per_iteration`` for each iteration of the job, read by ``sharers`` processes: the
    ``EnergySource`` each rank's recorder reads (the interface NVML's counter is read through)."""

    def __init__(self, joules_per_iteration: float, sharers: int) -> None:
        self.iterations = 0
        self.rate = joules_per_iteration
        self.sharers = sharers
        self.uuids = ["GPU-test-0"]
        self.source = "counter"

    def read(self) -> Reading:
        return Reading(time.monotonic_ns(), self.iterations * self.rate, self.sharers)


def _rank(root: Path, run_id: str, rank: int, gpu: SharedGpu, *, world: int = 2) -> tuple[Telemetry,
                                                                                           TrainingRecorder]:
    identity = identity_from_env({}, run_id=run_id, session_tag=SESSION, perf_tag="gpt", rank=rank, local_rank=rank,
                                 world_size=world)
    t = Telemetry(identity, store=root)
    config = TrainingTelemetryConfig(global_batch_size_or_fn=16, seq_length_or_fn=1024, log_every_n_train_iterations=5,
                                     warmup_iterations=0, device_timing="host", gpu_energy=gpu, world_size_or_fn=world)
    r = TrainingRecorder(config, telemetry=t)
    r.on_app_start()
    return t, r


def _train(pairs: list[tuple[Telemetry, TrainingRecorder]], gpu: SharedGpu, start: int, n: int,
           save_at: int | None = None) -> None:
    for _, r in pairs:
        r.on_train_start(start)
    for i in range(start, start + n):
        for _, r in pairs:
            r.on_training_single_iteration_start()
        gpu.iterations += 1  # the iteration's joules are drawn before it ends (a report may be computed at once)
        for _, r in pairs:
            r.on_training_single_iteration_end()
        if (i + 1) % 5 == 0:
            for t, _ in pairs:
                t.flush()  # the report is computed now: the energy reading is this window's end
        if save_at is not None and i + 1 == save_at:
            for _, r in pairs:
                r.on_save_checkpoint_start(i + 1)
                r.on_save_checkpoint_success(i + 1)
                r.on_save_checkpoint_end()


def test_energy_per_sample_counts_a_shared_gpu_once(tmp_path: Path) -> None:
    """Two ranks on one GPU (100 J per job iteration): each rank is given half; each rank's estimate for the job is
    its share x world / global samples; summed over the ranks, the GPU counts once."""
    gpu = SharedGpu(100.0, sharers=2)
    pairs = [_rank(tmp_path, "shared", rank, gpu) for rank in (0, 1)]
    _train(pairs, gpu, 0, 20)
    for t, r in pairs:
        r.on_train_end()
        r.on_app_end()
        assert t.close()
    run = open_run(tmp_path / SESSION / "shared")
    for rank in (0, 1):
        ups = [e.attributes for e in run.records("event") if e.name == "training_metrics_update"
               and e.identity.rank == rank]
        full = [u for u in ups if u["window_iterations"] == 5]
        assert full and all(u["window_energy_J"] == pytest.approx(250.0) for u in full)  # 500 J / 2 ranks
        assert all(u["energy_per_sample_J"] == pytest.approx(250.0 * 2 / 80) for u in full)  # 80 samples/window
        assert all(u["energy_per_token_J"] == pytest.approx(250.0 * 2 / 80 / 1024) for u in full)
        assert ups[-1]["cumulative_energy_J"] == pytest.approx(1000.0) and ups[-1]["energy_gpu_sharers"] == 2
        assert ups[-1]["energy_gpus"] == "GPU-test-0" and ups[-1]["energy_source"] == "counter"
    metrics = {m.name for m in run.records("metric")}
    assert {"train.energy_per_sample", "train.energy_per_token", "train.energy", "train.gpu_power"} <= metrics
    health = build_gpu_health(run)
    assert health.energy_J == pytest.approx(2000.0)  # 20 iterations x 100 J: the GPU once
    assert health.energy_per_sample == pytest.approx(2000.0 / (20 * 16))
    headline = {label: value for label, value, _ in build_model(run).headline}
    assert headline["energy per sample"] == "6.25 J"


def test_the_energy_series_on_a_prometheus_endpoint_carry_their_unit_once(tmp_path: Path) -> None:
    """Each derived series is a dotted lowercase name with its unit on the record; the backend adds the unit's
    suffix once (v2 named them train.energy_J...: served as telemetrain_train_energy_J_joules_total). The loop's
    joules are a counter, the joules per sample or token gauges (they were counters, as anything in joules)."""
    parser = pytest.importorskip("prometheus_client.parser", reason="the [prometheus] extra is not installed")
    from telemetrain.sinks.prometheus import PrometheusSink
    from telemetrain.sinks.prometheus.names import metric_name

    for name, unit, _, _ in reports_module.METRICS.values():
        assert name == name.lower() and re.fullmatch(r"[a-z0-9_.]+", name), name
        prom_name = metric_name(name, unit)
        suffix = prom_name.rsplit("_", 1)[-1]
        assert prom_name.count(suffix) == 1 or suffix == "second", (name, prom_name)
    gpu = SharedGpu(100.0, sharers=1)
    t, r = _rank(tmp_path, "prom", 0, gpu, world=1)
    sink = PrometheusSink(port=0)
    t.add_sink(sink)
    try:
        _train([(t, r)], gpu, 0, 10)
        assert t.flush()
        text = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://127.0.0.1:{sink.port}/metrics", timeout=10).read().decode()
        served = {sample.name: sample.value for family in parser.text_string_to_metric_families(text)
                  for sample in family.samples}
    finally:
        r.on_train_end()
        r.on_app_end()
        assert t.close()
    # 10 iterations x 100 J on one GPU, one process: 1000 J so far, a counter; per window: 500 J, 80 samples,
    # 80 x 1024 tokens, gauges (they go down as well as up: as counters, a rate() over them would be wrong)
    assert served["telemetrain_train_energy_joules_total"] == pytest.approx(1000.0)
    assert served["telemetrain_train_energy_per_sample_joules"] == pytest.approx(500.0 / 80)
    assert served["telemetrain_train_energy_per_token_joules"] == pytest.approx(500.0 / 80 / 1024)
    assert "telemetrain_train_gpu_power_watts" in served
    assert not [n for n in served if n.endswith(("_J_joules", "_W_watts", "_J_joules_total"))]
    assert not [n for n in served if "per_sample" in n and n.endswith("_total")]


def test_energy_per_sample_and_token_use_what_the_iterations_counted(tmp_path: Path) -> None:
    """A short last batch and packed sequences (iteration_size): joules per sample and per token divide by the counts
    given, not by steps x batch size (x seq_length)."""
    gpu = SharedGpu(100.0, sharers=1)
    t, r = _rank(tmp_path, "packed", 0, gpu, world=1)
    sizes = [(16, 9000), (16, 12000), (16, 16384), (16, 7000), (5, 2500)]  # (samples, tokens): a short last batch
    r.on_train_start(0)
    for samples, tokens in sizes:
        r.on_training_single_iteration_start()
        gpu.iterations += 1
        r.on_training_single_iteration_end(samples=samples, tokens=tokens)
    t.flush()
    r.on_train_end()
    r.on_app_end()
    assert t.close()
    (update,) = [e.attributes for e in open_run(tmp_path / SESSION / "packed").records("event")
                 if e.name == "training_metrics_update"]
    assert update["window_energy_J"] == pytest.approx(500.0)
    assert update["energy_per_sample_J"] == pytest.approx(500.0 / sum(s for s, _ in sizes))
    assert update["energy_per_token_J"] == pytest.approx(500.0 / sum(k for _, k in sizes))
    assert update["cumulative_energy_per_token_J"] == pytest.approx(500.0 / sum(k for _, k in sizes))


def test_goodput_counts_the_energy_of_lost_work_as_wasted(tmp_path: Path) -> None:
    """Attempt 1 runs 20 iterations, checkpoints at 10 and dies; attempt 2 resumes at 10 and runs to 30. 100 J per
    iteration on one GPU per rank (2 ranks): 4000 J in attempt 1, of which iterations 10-19 (2000 J) were lost; 4000 J
    in attempt 2, all kept."""
    gpus = [SharedGpu(100.0, sharers=1), SharedGpu(100.0, sharers=1)]
    pairs = [_rank(tmp_path, "a1", rank, gpus[rank]) for rank in (0, 1)]
    for rank, (t, r) in enumerate(pairs):
        _train([(t, r)], gpus[rank], 0, 20, save_at=10)
        assert t.close()  # dies mid-loop: the last iterations are reported, the loop ends terminated
    gpus = [SharedGpu(100.0, sharers=1), SharedGpu(100.0, sharers=1)]
    pairs = [_rank(tmp_path, "a2", rank, gpus[rank]) for rank in (0, 1)]
    for rank, (t, r) in enumerate(pairs):
        _train([(t, r)], gpus[rank], 10, 20)
        r.on_train_end()
        r.on_app_end()
        assert t.close()
    report = goodput(tmp_path / SESSION)
    e = report.energy
    assert e is not None
    assert e.energy_J == pytest.approx(8000.0) and e.wasted_J == pytest.approx(2000.0)
    assert e.productive_J == pytest.approx(6000.0) and e.wasted_fraction == pytest.approx(0.25)
    assert [(r, round(en), round(w)) for r, en, w in e.runs] == [("a1", 4000, 2000), ("a2", 4000, 0)]
    assert report.as_dict()["energy"]["wasted_J"] == pytest.approx(2000.0)


def test_goodput_of_a_cpu_job_has_no_energy(tmp_path: Path) -> None:
    skip_if_cuda_in_use()
    identity = identity_from_env({}, run_id="cpu", session_tag=SESSION, perf_tag="gpt")
    t = Telemetry(identity, store=tmp_path)
    train_empty_iterations(t, 4, batch=4, log_every=2)
    assert t.close()
    report = goodput(tmp_path / SESSION)
    assert report.energy is None and "energy" not in report.as_dict()


# -- NVML absent: no energy, no warning --------------------------------------------------------------------------------


def test_gpu_energy_without_a_gpu_is_absent_and_silent() -> None:
    """Real: no CUDA in use here (and no NVIDIA driver on this machine): the reason, no warning."""
    skip_if_cuda_in_use()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        source, reason = _energy_source(True)
    assert source is None and reason
    assert _energy_source(False) == (None, "gpu_energy=False")


def test_the_nvml_energy_meter_without_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("psutil", reason="telemetrain.system needs the [system] extra")
    from telemetrain.system.energy import GpuEnergy

    try:
        import pynvml

        pynvml.nvmlInit()
        pytest.skip("an NVIDIA driver is here: tests/test_gpu.py checks the meter on the GPU")
    except ImportError:
        pass  # nvidia-ml-py absent: the meter says so
    except Exception:  # noqa: BLE001 - NVMLError: no driver, the case under test
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        meter = GpuEnergy([0])
        assert meter.read() is None and meter.gpus == []
        assert "NVML did not start" in meter.reason or "nvidia-ml-py is not installed" in meter.reason
        monkeypatch.setitem(__import__("sys").modules, "pynvml", None)
        absent = GpuEnergy([0])
        assert absent.read() is None and "nvidia-ml-py is not installed" in absent.reason
