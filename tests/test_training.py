"""Training telemetry (nv-one-logger compatible): the derived metrics on controlled timings, the callback sequence of
one-logger's README (module-level callbacks and context managers), every misuse case (an error event, never an
exception), an interrupted run (SIGTERM in a subprocess) and the lazy, validated config.

Timings are driven with explicit ``*_time_msec`` values (or explicit monotonic ns for sub-phase spans), so every
metric is checked against arithmetic done here; nothing asserts how fast the real clock runs.
"""

from __future__ import annotations

import contextlib
import inspect
import signal
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import run_dir_of, run_helper_process
from telemetrain import Telemetry, TelemetryWarning, training
from telemetrain.stats import relative_error
from telemetrain.store import open_run
from telemetrain.training import (
    SpanName,
    TrainingContexts,
    TrainingRecorder,
    TrainingTelemetryConfig,
    callbacks,
)
from telemetrain.training import reports as training_reports

HANG_S = 20.0  # only a hang gets near it
TESTS = Path(__file__).parent
SESSION = "training"


# -- helpers -----------------------------------------------------------------------------------------------------------


def _base_ms() -> float:
    """Integral milliseconds since the epoch, a minute ago: explicit ``*_time_msec`` values are this plus offsets."""
    return float(int(time.time() * 1000) - 60_000)


def _events(records: list[Any], name: str) -> list[Any]:
    return [r for r in records if r.kind == "event" and r.name == name]


def _attrs(records: list[Any], name: str) -> list[dict[str, Any]]:
    return [dict(r.attributes or {}) for r in _events(records, name)]


def _spans(records: list[Any], kind: str, name: str) -> list[Any]:
    return [r for r in records if r.kind == kind and r.name == name]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _assert_close(actual: Mapping[str, Any], expected: Mapping[str, Any], rel: float = 1e-5,
                  abs_: float = 1e-6) -> None:
    """Every expected key present with its value (floats to rounding: explicit msec go through float ns)."""
    bad: dict[str, Any] = {}
    for key, want in expected.items():
        if key not in actual:
            bad[key] = ("missing", want)
        elif isinstance(want, float) and not isinstance(actual[key], bool):
            if actual[key] != pytest.approx(want, rel=rel, abs=abs_):
                bad[key] = (actual[key], want)
        elif actual[key] != want or type(actual[key]) is not type(want):
            bad[key] = (actual[key], want)
    assert not bad, f"(got, expected): {bad}"


@contextmanager
def _one_warning_at_most() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def _telemetry_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, TelemetryWarning)]


def _iterate(r: TrainingRecorder, start_ms: float, durations_ms: list[float], gap_ms: float = 0.0) -> list[float]:
    """Iterations with explicit times: each starts ``gap_ms`` after the previous end (``start_ms`` for the first
    gap's origin). Returns the end of each."""
    ends = []
    now = start_ms
    for d in durations_ms:
        r.on_training_single_iteration_start(now + gap_ms)
        now += gap_ms + d
        r.on_training_single_iteration_end(now)
        ends.append(now)
    return ends


# -- 1. the derived metrics on controlled timings ----------------------------------------------------------------------


def test_derived_metrics_on_controlled_timings(telemetry: Telemetry, read_run: Callable[..., Any],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # cumulative percentiles are reported once CUMULATIVE_BATCH new times have come in (1000 by default: see
    # test_cumulative_percentiles_when_fresh); 3 here, so that every window of this test refreshes them
    monkeypatch.setattr(training_reports, "CUMULATIVE_BATCH", 3)
    gbs, seq, fps, world, every, resumed = 8, 16, 1e12, 2, 4, 4
    config = TrainingTelemetryConfig(global_batch_size_or_fn=gbs, seq_length_or_fn=seq, flops_per_sample_or_fn=fps,
                                     world_size_or_fn=world, log_every_n_train_iterations=every)
    r = TrainingRecorder(config, telemetry=telemetry)
    base = _base_ms()
    r.on_app_start(base)
    loop_start = base + 1000
    r.on_train_start(resumed, start_time_msec=loop_start)
    # 10 ms between iterations; the windows' throughput goes down then up, so min and max are both exercised
    durations_ms = [100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 150.0, 250.0]
    ends = _iterate(r, loop_start, durations_ms, gap_ms=10)
    r.on_train_end(ends[-1] + 50)
    r.on_app_end(ends[-1] + 60)
    records = read_run(telemetry)
    reports = _attrs(records, "training_metrics_update")
    # resumed at 4, every 4: after global steps 8 and 12 (iterations 0..3, 4..7 of this job), then the tail 8..9
    windows = [range(0, 4), range(4, 8), range(8, 10)]
    assert len(reports) == 3
    window_starts = [loop_start, ends[3], ends[7]]
    seconds = [d / 1000 for d in durations_ms]
    throughputs: list[float] = []
    for report, window, window_start, final in zip(reports, windows, window_starts, (False, False, True), strict=True):
        n = window[-1] + 1  # iterations this job so far
        steady_window = [seconds[k] for k in window if k >= 1]  # warm-up: the job's first iteration
        steady_all = seconds[1:n]
        wall = (ends[window[-1]] - window_start) / 1000
        samples = len(window) * gbs
        tflops = samples * fps / wall / world / 1e12
        throughputs.append(tflops)
        steady_wall = (ends[window[-1]] - ends[0]) / 1000
        w50, w90, w99 = np.percentile(steady_window, [50, 90, 99])
        c50, c90, c99 = np.percentile(steady_all, [50, 90, 99])
        _assert_close(report, {
            "train_iterations_start": resumed,
            "current_iteration": resumed + n - 1,
            "num_iterations": n,
            "train_samples_start": resumed * gbs,
            "num_train_samples": n * gbs,
            "interval": every,
            "window_iterations": len(window),
            "final": final,
            "avg_iteration_time_sec": float(np.mean(steady_window)),
            "min_iteration_time_sec": min(steady_window),
            "max_iteration_time_sec": max(steady_window),
            "total_iteration_time_sec": float(np.sum(steady_window)),
            "p50_iteration_time_sec": float(w50),
            "p90_iteration_time_sec": float(w90),
            "p99_iteration_time_sec": float(w99),
            "cumulative_avg_iteration_time_sec": float(np.mean(steady_all)),
            "cumulative_min_iteration_time_sec": min(steady_all),
            "cumulative_max_iteration_time_sec": max(steady_all),
            "window_seconds": wall,
            "window_samples": samples,
            "train_tokens": n * gbs * seq,
            "samples_per_second": samples / wall,
            "tokens_per_second": samples * seq / wall,
            "cumulative_samples_per_second": (n - 1) * gbs / steady_wall,
            "total_flops": n * gbs * fps,
            "completed_floating_point_operations_overall": (resumed + n) * gbs * fps,
            "train_throughput_per_gpu": tflops,
            "train_throughput_per_gpu_min": min(throughputs),
            "train_throughput_per_gpu_max": max(throughputs),
            "cumulative_train_throughput_per_gpu": (n - 1) * gbs * fps / steady_wall / world / 1e12,
            "avg_batch_size": gbs,
            "time_to_first_iteration_sec": (ends[0] - base) / 1000,  # from the application's start
        })
        # the cumulative percentiles come from the run's histogram: within its bound of the times as measured, which
        # differ from the nominal ones by the float rounding of ms timestamps near 1.7e12 (~0.2 us); 0.5 s is a bucket
        # boundary, so that rounding may move a time to the next bucket: hence the 1e-5 on top
        bound = relative_error(6) + 1e-5
        _assert_close(report, {
            "cumulative_p50_iteration_time_sec": float(c50),
            "cumulative_p90_iteration_time_sec": float(c90),
            "cumulative_p99_iteration_time_sec": float(c99),
        }, rel=bound)
        assert report["first_logged_train_iterations_finish_timestamp_sec"] == pytest.approx(ends[0] / 1000, abs=1e-4)
        assert report["last_logged_train_iterations_finish_timestamp_sec"] == pytest.approx(
            ends[window[-1]] / 1000, abs=1e-4)
    assert throughputs[1] < throughputs[0] < throughputs[2]
    # every report is linked to the training loop span
    loop = _spans(records, "span_start", "training_loop")[0]
    assert {e.span_id for e in _events(records, "training_metrics_update")} == {loop.span_id}
    # and its values are metric records too, with step = the zero-based global iteration
    metric_names = {"train.samples_per_second": ("samples_per_second", 1.0),
                    "train.tokens_per_second": ("tokens_per_second", 1.0),
                    "train.flops_per_gpu": ("train_throughput_per_gpu", 1e12),  # base units: FLOP/s
                    "train.iterations": ("num_iterations", 1.0),
                    "train.samples": ("num_train_samples", 1.0)}
    metrics = [m for m in records if m.kind == "metric" and m.group == "training"]
    for name, (key, factor) in metric_names.items():
        points = [m for m in metrics if m.name == name]
        assert [(m.step, m.value) for m in points] == [(rep["current_iteration"], pytest.approx(rep[key] * factor))
                                                       for rep in reports], name
    units = {m.name: m.unit for m in metrics}
    assert units["train.samples_per_second"] == "{sample}/s" and units["train.flops_per_gpu"] == "{flop}/s"
    assert units["train.iterations"] == "{iteration}"
    # the window's iteration times: one stat record per report, its aggregates those of the event, with a histogram
    stats = [r for r in records if r.kind == "stat" and r.name == "train.iteration_time"]
    assert len(stats) == len(reports)
    for stat, rep in zip(stats, reports, strict=True):
        assert stat.group == "training" and stat.unit == "s" and stat.histogram is not None
        assert stat.values["mean"] == rep["avg_iteration_time_sec"] and stat.values["p99"] == rep[
            "p99_iteration_time_sec"]
        assert stat.sample_count == sum(stat.histogram["positive"]["counts"]) + stat.histogram.get("zero_count", 0)
    assert _attrs(records, "error") == []



@pytest.mark.parametrize("caught_up", [True, False])
def test_cumulative_percentiles_when_fresh(telemetry: Telemetry, read_run: Callable[..., Any],
                                          monkeypatch: pytest.MonkeyPatch, caught_up: bool) -> None:
    """The cumulative percentiles appear in a report only when every time so far is in them. A reporter that keeps
    up (each report computed before the next) brings them up to date at every report; one that is behind (reports
    waiting) only once CUMULATIVE_BATCH new times have come in, and at the final report. The cumulative
    count/mean/min/max are in every report either way."""
    monkeypatch.setattr(training_reports, "CUMULATIVE_BATCH", 10)
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=1, log_every_n_train_iterations=4,
                                                 warmup_iterations=0), telemetry=telemetry)
    reporter = r._reporter
    if not caught_up:  # the collector never runs it: every report waits until training ends
        monkeypatch.setattr(reporter, "submit", reporter._pending.append)
    base = _base_ms()
    r.on_app_start(base)
    r.on_train_start(0, start_time_msec=base)
    durations = [float(10 + k) for k in range(14)]
    now = base
    for k, d in enumerate(durations):
        now = _iterate(r, now, [d])[0]
        if caught_up and (k + 1) % 4 == 0:
            reporter.drain()  # as the collector does when it keeps up
    r.on_train_end()
    got = _attrs(read_run(telemetry), "training_metrics_update")
    # windows of 4, 4, 4 and the tail of 2; behind: 4, 8 (batching), 12 (>= 10 new: fresh), 14 (final: fresh)
    expected = [True, True, True, True] if caught_up else [False, False, True, True]
    assert [("cumulative_p50_iteration_time_sec" in a) for a in got] == expected
    assert all("cumulative_avg_iteration_time_sec" in a for a in got)
    seconds = [d / 1000 for d in durations]
    for report, n in zip(got, (4, 8, 12, 14), strict=True):
        # (explicit times pass through the monotonic clock: exact to about a microsecond)
        assert report["cumulative_avg_iteration_time_sec"] == pytest.approx(float(np.mean(seconds[:n])), abs=1e-6)
        assert report["cumulative_max_iteration_time_sec"] == pytest.approx(max(seconds[:n]), abs=1e-6)
        if "cumulative_p90_iteration_time_sec" in report:
            assert report["cumulative_p90_iteration_time_sec"] == pytest.approx(
                float(np.percentile(seconds[:n], 90)), rel=relative_error(6) + 1e-5)


def test_explicit_epoch_times_give_exact_durations(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    """Iterations 250 ms apart given as fractional epoch milliseconds (``time.time() * 1000``, as a job replaying its
    own timestamps passes them): the spans last exactly 250 ms, not 249.999872 (the float ns product's grain)."""
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=1, log_every_n_train_iterations=4,
                                                 warmup_iterations=0), telemetry=telemetry)
    base = time.time() * 1000 - 60_000.123
    r.on_app_start(base)
    r.on_train_start(0, start_time_msec=base)
    _iterate(r, base, [250.0] * 4, gap_ms=50.0)
    r.on_train_end()
    records = read_run(telemetry)
    assert {s.duration_ns for s in _spans(records, "span_end", "training_single_iteration")} == {250_000_000}
    (report,) = _attrs(records, "training_metrics_update")
    assert report["avg_iteration_time_sec"] == report["max_iteration_time_sec"] == 0.25
    assert report["window_seconds"] == 1.2


def test_sub_phase_split_from_explicit_span_times(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2, log_every_n_train_iterations=2),
                         telemetry=telemetry)
    base = _base_ms()
    r.on_train_start(0, start_time_msec=base)
    phases_ns = {  # per iteration, in ns
        SpanName.DATA_LOADING: [3_000_000, 5_000_000],
        SpanName.MODEL_FORWARD: [11_000_000, 13_000_000],
        SpanName.MODEL_BACKWARD: [20_000_000, 24_000_000],
        SpanName.OPTIMIZER_UPDATE: [1_000_000, 2_000_000],
        SpanName.ZERO_GRAD: [500_000, 700_000],
    }
    for it in range(2):
        r.on_training_single_iteration_start(base + 100 * it)
        for name, durations in phases_ns.items():
            t0 = time.monotonic_ns()
            r.tracer.start(name.value, start_ns=t0, make_current=False).end(end_ns=t0 + durations[it])
        r.on_training_single_iteration_end(base + 100 * it + 80)
    r.on_train_end(base + 200)
    report = _attrs(read_run(telemetry), "training_metrics_update")[-1]
    short = {SpanName.DATA_LOADING: "dataloader", SpanName.MODEL_FORWARD: "forward",
             SpanName.MODEL_BACKWARD: "backward", SpanName.OPTIMIZER_UPDATE: "optimizer",
             SpanName.ZERO_GRAD: "zero_grad"}
    wall = 0.18  # the loop's start to the second iteration's end
    expected = {}
    for name, durations in phases_ns.items():
        expected[f"avg_{short[name]}_time_sec"] = sum(durations) / 2 / 1e9
        expected[f"{short[name]}_time_fraction"] = sum(durations) / 1e9 / wall
    _assert_close(report, {"window_seconds": wall, **expected}, rel=1e-9, abs_=1e-5)


def test_an_iteration_that_raises_is_exported_with_status_error_sampled_or_not(
    telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    """The context manager marks the iteration it leaves by an exception as failed: exported with its error even
    when it was sampled out (iterations 0 and 5 are exported here; 2 and 5 raise), and the loop goes on."""
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=1, log_every_n_train_iterations=5),
                         telemetry=telemetry)
    ctx = TrainingContexts(lambda: r)
    with ctx.training_loop(0):
        for k in range(8):
            with contextlib.suppress(KeyError), ctx.training_iteration():
                if k in (2, 5):
                    raise KeyError(f"batch {k}")
    records = read_run(telemetry)
    ends = _spans(records, "span_end", "training_single_iteration")
    failed = [e for e in ends if e.status == "error"]
    assert [e.error for e in failed] == ["KeyError: 'batch 2'", "KeyError: 'batch 5'"]
    assert sorted(e.status for e in ends) == ["error", "error", "ok"]  # iteration 0, and the two failures
    starts = {s.span_id for s in _spans(records, "span_start", "training_single_iteration")}
    assert {e.span_id for e in ends} == starts
    # a failed iteration did not complete: 6 of the 8 count (lost work is not off by one per failure)
    last = _attrs(records, "training_metrics_update")[-1]
    assert (last["num_iterations"], last["current_iteration"]) == (6, 5)


def test_the_context_managers_are_decorators(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=1, log_every_n_train_iterations=2),
                         telemetry=telemetry)
    ctx = TrainingContexts(lambda: r)

    @ctx.training_iteration()
    def step(k: int) -> int:
        assert r.current_span is not None and r.current_span.name == "training_single_iteration"
        return k * 2

    with ctx.training_loop(0):
        assert [step(k) for k in range(4)] == [0, 2, 4, 6]
    reports = _attrs(read_run(telemetry), "training_metrics_update")
    assert [a["num_iterations"] for a in reports] == [2, 4]


def test_sub_phase_split_from_the_recorder_context_managers(
    telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2, log_every_n_train_iterations=3),
                         telemetry=telemetry)
    ctx = TrainingContexts(lambda: r)
    durations: dict[str, int] = {"dataloader": 0, "forward": 0, "backward": 0, "optimizer": 0, "zero_grad": 0}
    with ctx.training_loop(0):
        for _ in range(3):
            with ctx.training_iteration() as it:
                for phase, cm in (("dataloader", r.data_loading), ("zero_grad", r.zero_grad),
                                  ("forward", ctx.forward), ("backward", r.backward),
                                  ("optimizer", r.optimizer_update)):
                    with cm() as s:
                        assert s.parent is it  # the sub-phases nest under the iteration
                        time.sleep(0.0005)
                    durations[phase] += s.duration_ns
    records = read_run(telemetry)
    report = _attrs(records, "training_metrics_update")[0]
    assert report["window_iterations"] == 3
    _assert_close(report, {f"avg_{p}_time_sec": ns / 3 / 1e9 for p, ns in durations.items()}, rel=1e-9)
    assert sum(report[f"{p}_time_fraction"] for p in durations) < 1  # the phases lie inside the window
    phase_points = [m for m in records if m.kind == "metric" and m.name == "train.phase.duration"]
    assert {m.attributes["train.phase"] for m in phase_points} == set(durations)  # one series per phase
    forward_points = [m for m in phase_points if m.attributes == {"train.phase": "forward"}]
    assert [(m.step, m.value, m.unit) for m in forward_points] == [(2, report["avg_forward_time_sec"], "s")]


def test_mfu_against_an_explicit_peak(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    config = TrainingTelemetryConfig(global_batch_size_or_fn=8, flops_per_sample_or_fn=1e12, world_size_or_fn=2,
                                     log_every_n_train_iterations=2, peak_tflops_per_gpu=50.0)
    r = TrainingRecorder(config, telemetry=telemetry)
    base = _base_ms()
    r.on_train_start(0, start_time_msec=base)
    _iterate(r, base, [100.0, 300.0])
    r.on_train_end(base + 400)
    records = read_run(telemetry)
    report = _attrs(records, "training_metrics_update")[0]
    # 16 samples x 1e12 FLOPs / 0.4 s / 2 GPUs = 20 TFLOP/s per GPU; against 50: 0.4
    _assert_close(report, {"train_throughput_per_gpu": 20.0, "mfu": 0.4, "peak_tflops_per_gpu": 50.0})
    assert "explicit" in report["peak_source"]
    assert [m.value for m in records if m.kind == "metric" and m.name == "train.mfu"] == [report["mfu"]]
    assert r.errors == 0 and _attrs(records, "error") == []


@pytest.mark.parametrize("device_name", [None, "Imaginary Accelerator 9000"], ids=["this_cpu", "unknown_device"])
def test_no_mfu_and_no_error_without_a_known_peak(
    telemetry: Telemetry, read_run: Callable[..., Any], device_name: str | None
) -> None:
    if device_name is None and _cuda_available():
        pytest.skip("the current device is a GPU: its table peak applies")
    config = TrainingTelemetryConfig(global_batch_size_or_fn=8, flops_per_sample_or_fn=1e12,
                                     log_every_n_train_iterations=2, device_name=device_name)
    r = TrainingRecorder(config, telemetry=telemetry)
    base = _base_ms()
    r.on_train_start(0, start_time_msec=base)
    with _one_warning_at_most() as caught:
        _iterate(r, base, [100.0, 300.0])
        r.on_train_end(base + 400)
    records = read_run(telemetry)
    report = _attrs(records, "training_metrics_update")[0]
    assert report["train_throughput_per_gpu"] == pytest.approx(40.0)
    assert "mfu" not in report and not any(m.name == "train.mfu" for m in records if m.kind == "metric")
    assert r.errors == 0 and _attrs(records, "error") == [] and _telemetry_warnings(caught) == []


def test_checkpoint_save_and_load_metrics(tmp_path: Path, telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    loaded_file = tmp_path / "loaded.pt"
    loaded_file.write_bytes(b"x" * 1000)
    loaded_dir = tmp_path / "loaded_dir"
    (loaded_dir / "shard").mkdir(parents=True)
    (loaded_dir / "a.bin").write_bytes(b"x" * 300)
    (loaded_dir / "shard" / "b.bin").write_bytes(b"x" * 200)
    saved = [tmp_path / "step5.pt", tmp_path / "step7.pt"]
    saved[0].write_bytes(b"x" * 700)
    saved[1].write_bytes(b"x" * 900)
    gbs, fps = 4, 2e12
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=gbs, flops_per_sample_or_fn=fps,
                                                 log_every_n_train_iterations=100), telemetry=telemetry)
    base = _base_ms()
    r.on_app_start(base)
    r.on_load_checkpoint_start(base + 10)
    r.on_load_checkpoint_end(base + 260, path=loaded_file)  # 0.25 s
    r.on_load_checkpoint_start(base + 300)
    r.on_load_checkpoint_end(base + 450, path=loaded_dir)  # 0.15 s
    r.on_train_start(2, start_time_msec=base + 500)  # resumed at 2: samples start at 8
    _iterate(r, base + 500, [100.0, 100.0, 100.0])  # ends at +800: global step 5
    r.on_save_checkpoint_start(5, base + 800)
    r.on_save_checkpoint_success(5, base + 1150)
    r.on_save_checkpoint_end(base + 1200, path=saved[0])  # 0.4 s
    _iterate(r, base + 1200, [100.0, 100.0])  # ends at +1400: global step 7
    r.on_save_checkpoint_start(7, base + 1400)
    r.on_save_checkpoint_success(7, base + 1550)
    r.on_save_checkpoint_end(base + 1600, path=saved[1])  # 0.2 s
    r.on_train_end(base + 1600)
    r.on_app_end(base + 1610)
    records = read_run(telemetry)

    successes = _attrs(records, "save_checkpoint_success")
    assert len(successes) == 2
    for success, step, iterations, sec, first_ms, latest_ms, count in (
            (successes[0], 5, 3, 0.3, 1150, 1150, 1), (successes[1], 7, 5, 0.5, 1150, 1550, 2)):
        _assert_close(success, {
            "checkpoint_strategy": "sync",
            "current_iteration": step,
            "save_checkpoint_success_count": count,
            "productive_train_iterations": step,  # the global iterations the checkpoint holds
            "productive_train_samples": 8 + iterations * gbs,
            "productive_train_iterations_sec": sec,
            "productive_validation_iterations_sec": 0.0,
            "productive_train_tflops": step * gbs * fps / 1e12,
        })
        assert success["first_successful_save_checkpoint_timestamp_sec"] == pytest.approx((base + first_ms) / 1000,
                                                                                          abs=1e-4)
        assert success["latest_successful_save_checkpoint_timestamp_sec"] == pytest.approx((base + latest_ms) / 1000,
                                                                                           abs=1e-4)
        assert success["training_start_timestamp_sec"] == pytest.approx((base + 500) / 1000, abs=1e-4)
    updates = _attrs(records, "sync_checkpoint_metrics_update")
    assert len(updates) == 2
    _assert_close(updates[0], {"save_checkpoint_sync_time_total_sec": 0.4, "save_checkpoint_sync_time_min_sec": 0.4,
                               "save_checkpoint_sync_time_max_sec": 0.4, "save_checkpoint_count": 1,
                               "save_checkpoint_size_bytes": 700, "checkpoint_size": 700})
    _assert_close(updates[1], {"save_checkpoint_sync_time_total_sec": 0.6, "save_checkpoint_sync_time_min_sec": 0.2,
                               "save_checkpoint_sync_time_max_sec": 0.4, "save_checkpoint_count": 2,
                               "save_checkpoint_time_mean_sec": 0.3, "save_checkpoint_size_bytes": 900,
                               "save_checkpoint_size_total_bytes": 1600, "checkpoint_size": 900})
    save_starts = _spans(records, "span_start", "checkpoint_save_sync")
    assert [s.attributes for s in save_starts] == [
        {"checkpoint_strategy": "sync", "current_iteration": 5, "save_checkpoint_attempt_count": 1},
        {"checkpoint_strategy": "sync", "current_iteration": 7, "save_checkpoint_attempt_count": 2}]
    save_ends = _spans(records, "span_end", "checkpoint_save_sync")
    assert [e.duration_ns for e in save_ends] == pytest.approx([400_000_000, 200_000_000], abs=1000)
    # the success and metrics events are linked to their save's span
    assert [e.span_id for e in _events(records, "save_checkpoint_success")] == [s.span_id for s in save_starts]
    assert [e.span_id for e in _events(records, "sync_checkpoint_metrics_update")] == [s.span_id for s in save_starts]
    assert [e.duration_ns for e in _spans(records, "span_end", "checkpoint_load")] == pytest.approx(
        [250_000_000, 150_000_000], abs=1000)
    final = _attrs(records, "training_metrics_update")[-1]
    _assert_close(final, {
        "save_checkpoint_count": 2, "save_checkpoint_time_total_sec": 0.6, "save_checkpoint_time_min_sec": 0.2,
        "save_checkpoint_time_max_sec": 0.4, "save_checkpoint_time_mean_sec": 0.3,
        "save_checkpoint_size_bytes": 900, "save_checkpoint_size_total_bytes": 1600,
        "load_checkpoint_count": 2, "load_checkpoint_time_total_sec": 0.4, "load_checkpoint_time_min_sec": 0.15,
        "load_checkpoint_time_max_sec": 0.25, "load_checkpoint_time_mean_sec": 0.2,
        "load_checkpoint_size_bytes": 500, "load_checkpoint_size_total_bytes": 1500,
    })
    assert _attrs(records, "error") == []


def test_each_save_success_carries_its_own_checkpoint_path(
    tmp_path: Path, telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    paths = [tmp_path / "first.pt", tmp_path / "second.pt"]
    paths[0].write_bytes(b"x" * 100)
    paths[1].write_bytes(b"x" * 250)
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4), telemetry=telemetry)
    ctx = TrainingContexts(lambda: r)
    with ctx.training_loop(0):
        for step, path in enumerate(paths):
            with ctx.training_iteration():
                pass
            with ctx.checkpoint_save(step + 1, path=path):
                pass
    successes = _attrs(read_run(telemetry), "save_checkpoint_success")
    assert [(s.get("checkpoint_directory"), s.get("checkpoint_size")) for s in successes] == [
        (str(paths[0]), 100), (str(paths[1]), 250)]


def _validation_run(telemetry: Telemetry) -> tuple[TrainingRecorder, float]:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=100),
                         telemetry=telemetry)
    base = _base_ms()
    r.on_app_start(base)
    r.on_train_start(0, start_time_msec=base)
    _iterate(r, base, [10.0, 10.0, 10.0])  # ends at +30
    r.on_validation_start(base + 40)
    r.on_validation_single_iteration_start(base + 50)
    r.on_validation_single_iteration_end(base + 100)  # 0.05 s
    r.on_validation_single_iteration_start(base + 110)
    r.on_validation_single_iteration_end(base + 260)  # 0.15 s
    r.on_validation_end(base + 300)  # a 0.26 s loop
    _iterate(r, base + 300, [10.0, 10.0])  # ends at +320
    r.on_validation_start(base + 330)
    r.on_validation_single_iteration_start(base + 340)
    r.on_validation_single_iteration_end(base + 640)  # 0.3 s
    r.on_validation_end(base + 700)  # a 0.37 s loop
    return r, base


def test_validation_metrics_per_loop(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    r, base = _validation_run(telemetry)
    r.on_train_end(base + 710)
    r.on_app_end(base + 720)
    records = read_run(telemetry)
    first, second = _attrs(records, "validation_metrics_update")
    p50, p90, p99 = np.percentile([0.05, 0.15], [50, 90, 99])
    _assert_close(first, {"current_iteration": 2, "interval": 3, "num_iterations": 2, "avg_iteration_time_sec": 0.1,
                          "min_iteration_time_sec": 0.05, "max_iteration_time_sec": 0.15,
                          "total_iteration_time_sec": 0.2, "p50_iteration_time_sec": float(p50),
                          "p90_iteration_time_sec": float(p90), "p99_iteration_time_sec": float(p99)})
    # the second loop: its own iteration only (one-logger's are cumulative), 2 training iterations since the first
    _assert_close(second, {"current_iteration": 4, "interval": 2, "num_iterations": 1, "avg_iteration_time_sec": 0.3,
                           "min_iteration_time_sec": 0.3, "max_iteration_time_sec": 0.3,
                           "total_iteration_time_sec": 0.3})
    loops = _spans(records, "span_start", "validation_loop")
    assert [e.span_id for e in _events(records, "validation_metrics_update")] == [s.span_id for s in loops]
    assert [e.duration_ns for e in _spans(records, "span_end", "validation_loop")] == pytest.approx(
        [260_000_000, 370_000_000], abs=1000)
    assert r.errors == 0


def test_validation_loop_time_is_the_loop_span_duration(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    _validation_run(telemetry)
    records = read_run(telemetry)
    assert [a["loop_time_sec"] for a in _attrs(records, "validation_metrics_update")] == pytest.approx(
        [0.26, 0.37], abs=1e-6)


def test_productive_validation_seconds_are_the_validation_iterations(
    telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    r, base = _validation_run(telemetry)
    r.on_save_checkpoint_start(5, base + 800)
    r.on_save_checkpoint_success(5, base + 900)
    r.on_save_checkpoint_end(base + 900)
    success = _attrs(read_run(telemetry), "save_checkpoint_success")[0]
    assert success["productive_validation_iterations_sec"] == pytest.approx(0.05 + 0.15 + 0.3, abs=1e-6)


def test_testing_metrics(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4), telemetry=telemetry)
    base = _base_ms()
    r.on_train_start(0, start_time_msec=base)
    _iterate(r, base, [10.0] * 4)
    r.on_train_end(base + 40)
    r.on_testing_start(base + 50)
    r.on_testing_single_iteration_start(base + 60)
    r.on_testing_single_iteration_end(base + 80)
    r.on_testing_end(base + 100)
    records = read_run(telemetry)
    (testing,) = _attrs(records, "testing_metrics_update")
    _assert_close(testing, {"current_iteration": 3, "interval": 4, "num_iterations": 1,
                            "avg_iteration_time_sec": 0.02})
    assert _events(records, "testing_metrics_update")[0].span_id == _spans(records, "span_start", "testing_loop")[
        0].span_id
    assert r.errors == 0


@pytest.mark.parametrize("resumed, every, iterations, expected", [
    (3, 5, 9, [(4, 2, False), (9, 5, False), (11, 2, True)]),  # aligned to the global step, then the tail
    (0, 5, 10, [(4, 5, False), (9, 5, False)]),  # no tail left at the end: no extra report
    (0, 1, 3, [(0, 1, False), (1, 1, False), (2, 1, False)]),  # one-logger never reports iteration 0 with N=1
    (0, 50, 3, [(2, 3, True)]),  # fewer than N: only the final report (one-logger: none at all)
])
def test_report_cadence_is_aligned_to_the_global_step(
    telemetry: Telemetry, read_run: Callable[..., Any], resumed: int, every: int, iterations: int,
    expected: list[tuple[int, int, bool]]
) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2, log_every_n_train_iterations=every),
                         telemetry=telemetry)
    ctx = TrainingContexts(lambda: r)
    with ctx.application(), ctx.training_loop(train_iterations_start=resumed):
        for _ in range(iterations):
            with ctx.training_iteration():
                pass
    records = read_run(telemetry)
    reports = _attrs(records, "training_metrics_update")
    assert [(a["current_iteration"], a["window_iterations"], a["final"]) for a in reports] == expected
    assert [a["num_iterations"] for a in reports] == [c - resumed + 1 for c, _, _ in expected]
    points = [m for m in records if m.kind == "metric" and m.name == "train.samples_per_second"]
    assert [m.step for m in points] == [c for c, _, _ in expected]
    assert r.errors == 0


def test_close_while_training_reports_the_last_iterations(tmp_path: Path) -> None:
    t = Telemetry(store=tmp_path)
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2, log_every_n_train_iterations=4),
                         telemetry=t)
    r.on_app_start()
    r.on_train_start(0)
    for _ in range(6):
        r.on_training_single_iteration_start()
        r.on_training_single_iteration_end()
    t.close()
    records = open_run(run_dir_of(t)).records()
    reports = _attrs(records, "training_metrics_update")
    assert [(a["current_iteration"], a["window_iterations"], a["final"]) for a in reports] == [
        (3, 4, False), (5, 2, True)]
    ends = {e.name: e.status for e in records if e.kind == "span_end"}
    assert ends["training_loop"] == ends["application"] == "terminated"


# -- 2. one-logger's README callback sequence ----------------------------------------------------------------------


ONE_LOGGER_SIGNATURES = {  # one_logger.md 2.3: the parameter names of every callback
    "on_app_start": ["start_time_msec"], "on_app_end": ["finish_time_msec"],
    "on_distributed_init_start": ["start_time_msec"], "on_distributed_init_end": ["finish_time_msec"],
    "on_model_init_start": ["start_time_msec"], "on_model_init_end": ["finish_time_msec"],
    "on_dataloader_init_start": ["start_time_msec"], "on_dataloader_init_end": ["finish_time_msec"],
    "on_optimizer_init_start": ["start_time_msec"], "on_optimizer_init_end": ["finish_time_msec"],
    "on_load_checkpoint_start": ["start_time_msec"], "on_load_checkpoint_end": ["finish_time_msec"],
    "on_train_start": ["train_iterations_start", "train_samples_start", "train_iterations_target_or_fn",
                       "train_samples_target_or_fn", "start_time_msec"],
    "on_train_end": ["finish_time_msec"],
    "on_training_single_iteration_start": ["start_time_msec"],
    "on_training_single_iteration_end": ["finish_time_msec"],
    "on_validation_start": ["start_time_msec"], "on_validation_end": ["finish_time_msec"],
    "on_validation_single_iteration_start": ["start_time_msec"],
    "on_validation_single_iteration_end": ["finish_time_msec"],
    "on_testing_start": ["start_time_msec"], "on_testing_end": ["finish_time_msec"],
    "on_save_checkpoint_start": ["global_step", "start_time_msec"],
    "on_save_checkpoint_success": ["global_step", "time_msec"],
    "on_save_checkpoint_end": ["finish_time_msec"],
}


def test_callbacks_have_one_loggers_signatures() -> None:
    for name, params in ONE_LOGGER_SIGNATURES.items():
        for fn in (getattr(callbacks, name), getattr(TrainingRecorder, name)):
            got = [p.name for p in inspect.signature(fn).parameters.values()
                   if p.name != "self" and p.kind is not inspect.Parameter.KEYWORD_ONLY]
            assert got == params, (fn, got)
            optional = params[1:] if name in ("on_train_start", "on_save_checkpoint_start",
                                              "on_save_checkpoint_success") else params
            assert all(inspect.signature(fn).parameters[p].default is None for p in optional), fn


def _readme_sequence_with_callbacks() -> None:
    cb = callbacks
    cb.on_app_start()
    cb.on_distributed_init_start()
    cb.on_distributed_init_end()
    cb.on_model_init_start()
    cb.on_model_init_end()
    cb.on_dataloader_init_start()
    cb.on_dataloader_init_end()
    cb.on_optimizer_init_start()
    cb.on_optimizer_init_end()
    cb.on_load_checkpoint_start()
    cb.on_load_checkpoint_end()
    cb.on_train_start(train_iterations_start=0, train_samples_start=0, train_iterations_target_or_fn=10,
                      train_samples_target_or_fn=80)
    for i in range(4):
        cb.on_training_single_iteration_start()
        cb.on_training_single_iteration_end()
        if i == 1:
            cb.on_validation_start()
            for _ in range(2):
                cb.on_validation_single_iteration_start()
                cb.on_validation_single_iteration_end()
            cb.on_validation_end()
        if i == 2:
            cb.on_save_checkpoint_start(global_step=3)
            cb.on_save_checkpoint_success(global_step=3)
            cb.on_save_checkpoint_end()
    cb.on_train_end()
    cb.on_testing_start()
    cb.on_testing_end()
    cb.on_app_end()


def _readme_sequence_with_context_managers() -> None:
    with training.application():
        with training.distributed_init():
            pass
        with training.model_init():
            pass
        with training.dataloader_init():
            pass
        with training.optimizer_init():
            pass
        with training.checkpoint_load():
            pass
        with training.training_loop(0, 0, 10, 80):
            for i in range(4):
                with training.training_iteration():
                    pass
                if i == 1:
                    with training.validation_loop():
                        for _ in range(2):
                            with training.validation_iteration():
                                pass
                if i == 2:
                    with training.checkpoint_save(3):
                        pass
        with training.testing_loop():
            pass


@pytest.mark.parametrize("drive", [_readme_sequence_with_callbacks, _readme_sequence_with_context_managers],
                         ids=["callbacks", "context_managers"])
def test_readme_callback_sequence(
    telemetry: Telemetry, read_run: Callable[..., Any], drive: Callable[[], None]
) -> None:
    recorder = training.configure(TrainingTelemetryConfig(global_batch_size_or_fn=8, seq_length_or_fn=16,
                                                          perf_tag_or_fn="gpt-small", log_every_n_train_iterations=2,
                                                          custom_metadata={"team": "x"}))
    assert recorder is training.get_recorder() is training.get_recorder(telemetry)
    with _one_warning_at_most() as caught:
        drive()
    assert _telemetry_warnings(caught) == [] and recorder.errors == 0
    records = read_run(telemetry)
    assert _attrs(records, "error") == []
    starts = {r.span_id: r for r in records if r.kind == "span_start"}
    ends = {r.span_id: r for r in records if r.kind == "span_end"}
    assert set(starts) == set(ends) and all(e.status == "ok" for e in ends.values())
    assert all(s.group == "training" for s in starts.values())
    by_name: dict[str, list[Any]] = {}
    for s in starts.values():
        by_name.setdefault(s.name, []).append(s)
    assert set(by_name) == {
        "application", "distributed_code_initialization", "model_initialization", "data_loader_initialization",
        "optimizer_initialization", "checkpoint_load", "training_loop", "training_single_iteration",
        "validation_loop", "validation_single_iteration", "checkpoint_save_sync", "testing_loop"}
    (app,) = by_name["application"]
    (loop,) = by_name["training_loop"]
    (validation,) = by_name["validation_loop"]
    assert app.parent_id == ""
    for name in ("distributed_code_initialization", "model_initialization", "data_loader_initialization",
                 "optimizer_initialization", "checkpoint_load", "training_loop", "testing_loop"):
        assert [s.parent_id for s in by_name[name]] == [app.span_id], name
    for name in ("validation_loop", "checkpoint_save_sync"):  # inside the training loop: its children (one-logger's)
        assert [s.parent_id for s in by_name[name]] == [loop.span_id], name
    # iteration spans: every log_every_n-th exported (0 and 2 of 4), under their loop
    assert [s.parent_id for s in by_name["training_single_iteration"]] == [loop.span_id] * 2
    assert [s.parent_id for s in by_name["validation_single_iteration"]] == [validation.span_id]
    assert {s.trace_id for s in starts.values()} == {app.trace_id}
    _assert_close(loop.attributes, {"train_iterations_start": 0, "train_samples_start": 0,
                                    "train_iterations_target": 10, "train_samples_target": 80,
                                    "train_tokens_target": 1280})
    (save,) = by_name["checkpoint_save_sync"]
    assert save.attributes == {"checkpoint_strategy": "sync", "current_iteration": 3,
                               "save_checkpoint_attempt_count": 1}

    required = {  # one_logger.md 2.6: the required attributes of each event, and the span it is attached to
        "one_logger_initialization": (app, ["world_size", "one_logger_training_telemetry_version",
                                            "enable_for_current_rank", "session_tag", "is_baseline_run",
                                            "summary_data_schema_version", "node_name", "rank"]),
        "update_training_telemetry_config": (app, ["perf_tag", "global_batch_size", "log_every_n_train_iterations"]),
        "training_metrics_update": (loop, ["train_iterations_start", "current_iteration", "num_iterations",
                                           "train_samples_start", "num_train_samples", "interval",
                                           "avg_iteration_time_sec", "min_iteration_time_sec",
                                           "max_iteration_time_sec", "total_iteration_time_sec"]),
        "validation_metrics_update": (validation, ["current_iteration", "interval", "avg_iteration_time_sec",
                                                   "min_iteration_time_sec", "max_iteration_time_sec",
                                                   "total_iteration_time_sec"]),
        "testing_metrics_update": (by_name["testing_loop"][0], ["current_iteration", "interval"]),
        "save_checkpoint_success": (save, ["checkpoint_strategy", "current_iteration",
                                           "first_successful_save_checkpoint_timestamp_sec",
                                           "latest_successful_save_checkpoint_timestamp_sec",
                                           "save_checkpoint_success_count", "productive_train_iterations",
                                           "productive_train_samples", "productive_train_iterations_sec",
                                           "productive_validation_iterations_sec"]),
        "sync_checkpoint_metrics_update": (save, ["save_checkpoint_sync_time_total_sec",
                                                  "save_checkpoint_sync_time_min_sec",
                                                  "save_checkpoint_sync_time_max_sec"]),
    }
    counts = {"training_metrics_update": 2}
    for name, (on, fields) in required.items():
        events = _events(records, name)
        assert len(events) == counts.get(name, 1), name
        for e in events:
            assert e.group == "training" and e.span_id == on.span_id, name
            missing = [f for f in fields if f not in (e.attributes or {})]
            assert not missing, (name, missing)
    init = _attrs(records, "one_logger_initialization")[0]
    assert init["custom_metadata"] == ["team:x"] and init["rank"] == 0 and init["world_size"] == 1
    config = _attrs(records, "update_training_telemetry_config")[0]
    assert (config["perf_tag"], config["global_batch_size"], config["seq_length"]) == ("gpt-small", 8, 16)
    assert [a["current_iteration"] for a in _attrs(records, "training_metrics_update")] == [1, 3]
    _assert_close(_attrs(records, "validation_metrics_update")[0], {"current_iteration": 1, "interval": 2,
                                                                    "num_iterations": 2})
    _assert_close(_attrs(records, "testing_metrics_update")[0], {"current_iteration": 3, "interval": 4})
    _assert_close(_attrs(records, "save_checkpoint_success")[0], {"current_iteration": 3,
                                                                  "productive_train_iterations": 3,
                                                                  "productive_train_samples": 24,
                                                                  "save_checkpoint_success_count": 1})


def test_async_checkpoint_strategy(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2, save_checkpoint_strategy="async"),
                         telemetry=telemetry)
    ctx = TrainingContexts(lambda: r)
    with ctx.application(), ctx.training_loop(0):
        with ctx.training_iteration():
            pass
        with ctx.checkpoint_save(1):
            pass  # async: the save is only scheduled here, success comes when it is finalised
        assert _attrs(read_run(telemetry), "save_checkpoint_success") == []
        r.on_save_checkpoint_success(1)
    records = read_run(telemetry)
    (save,) = _spans(records, "span_start", "checkpoint_save_async")
    assert save.attributes["checkpoint_strategy"] == "async"
    (success,) = _attrs(records, "save_checkpoint_success")
    assert (success["checkpoint_strategy"], success["productive_train_iterations"]) == ("async", 1)
    assert r.errors == 0


# -- 3. misuse: an error event, a count, one warning, never an exception ------------------------------------------


def _iteration_end_without_start(r: TrainingRecorder) -> None:
    r.on_app_start()
    r.on_train_start(0)
    r.on_training_single_iteration_end()
    r.on_training_single_iteration_start()  # the next iteration still works
    r.on_training_single_iteration_end()
    r.on_train_end()
    r.on_app_end()


def _train_start_twice(r: TrainingRecorder) -> None:
    r.on_app_start()
    assert r.on_train_start(0) is not None
    assert r.on_train_start(0) is None
    r.on_train_end()
    r.on_app_end()


def _app_start_twice(r: TrainingRecorder) -> None:
    assert r.on_app_start() is not None
    assert r.on_app_start() is None
    r.on_app_end()


def _success_without_start(r: TrainingRecorder) -> None:
    r.on_app_start()
    r.on_train_start(0)
    r.on_save_checkpoint_success(7)
    r.on_train_end()
    r.on_app_end()


def _iteration_open_at_train_end(r: TrainingRecorder) -> None:
    r.on_app_start()
    r.on_train_start(0)
    r.on_training_single_iteration_start()
    r.on_train_end()
    r.on_app_end()


def _spans_open_at_app_end(r: TrainingRecorder) -> None:
    r.on_app_start()
    r.on_model_init_start()
    r.on_train_start(0)
    r.on_training_single_iteration_start()
    r.on_app_end()


def _iteration_started_twice(r: TrainingRecorder) -> None:
    r.on_app_start()
    r.on_train_start(0)
    r.on_training_single_iteration_start()
    r.on_training_single_iteration_start()
    r.on_training_single_iteration_end()
    r.on_train_end()
    r.on_app_end()


def _end_callbacks_without_start(r: TrainingRecorder) -> None:
    r.on_model_init_end()
    r.on_save_checkpoint_end()
    r.on_train_end()
    r.on_app_end()


# scenario: (driver, the error events expected: (callback, part of the message, context))
MISUSE: dict[str, tuple[Callable[[TrainingRecorder], None], list[tuple[str, str, dict[str, Any]]]]] = {
    "iteration end without start": (_iteration_end_without_start, [
        ("on_training_single_iteration_end", "not started", {"span": "training_single_iteration"})]),
    "on_train_start twice": (_train_start_twice, [("on_train_start", "already open", {})]),
    "on_app_start twice": (_app_start_twice, [("on_app_start", "already open", {"span": "application"})]),
    "success without start": (_success_without_start, [
        ("on_save_checkpoint_success", "no on_save_checkpoint_start", {"global_step": 7})]),
    "iteration open at train end": (_iteration_open_at_train_end, [("on_train_end", "still open", {})]),
    "spans open at app end": (_spans_open_at_app_end, [
        ("on_app_end", "training_loop still open", {}),
        ("on_train_end", "still open", {}),
        ("on_app_end", "model_initialization still open", {"span": "model_initialization"})]),
    "iteration started twice": (_iteration_started_twice, [
        ("on_training_single_iteration_start", "not ended", {"iteration": 0})]),
    "ends without starts": (_end_callbacks_without_start, [
        ("on_model_init_end", "not started", {"span": "model_initialization"}),
        ("on_save_checkpoint_end", "not started", {"span": "checkpoint_save_sync"}),
        ("on_train_end", "not started", {"span": "training_loop"}),
        ("on_app_end", "not started", {"span": "application"})]),
}


@pytest.mark.parametrize("scenario", list(MISUSE))
def test_misuse_is_an_error_event_never_an_exception(
    telemetry: Telemetry, read_run: Callable[..., Any], scenario: str
) -> None:
    drive, expected = MISUSE[scenario]
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2), telemetry=telemetry)
    with _one_warning_at_most() as caught:
        drive(r)  # raises nothing
    assert r.errors == len(expected)
    messages = _telemetry_warnings(caught)
    assert len(messages) == 1 and expected[0][0] in messages[0]
    records = read_run(telemetry)
    errors = _events(records, "error")
    assert len(errors) == len(expected)
    for event, (callback, text, context) in zip(errors, expected, strict=True):
        attributes = dict(event.attributes or {})
        assert (event.group, event.severity, attributes["callback"]) == ("training", "error", callback)
        assert text in attributes["error_message"], attributes
        _assert_close(attributes, context)
    if scenario == "spans open at app end":
        statuses = {e.name: e.status for e in records if e.kind == "span_end"}
        assert (statuses["model_initialization"], statuses["training_loop"], statuses["application"]) == (
            "terminated", "ok", "ok")


def test_misuse_leaves_the_records_consistent(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2), telemetry=telemetry)
    with _one_warning_at_most() as caught:
        r.on_app_start()
        r.on_app_start()  # ignored: one application, one initialization event
        r.on_model_init_start()  # never ended: terminated at application end
        r.on_train_start(0)
        r.on_train_start(0)  # ignored
        r.on_save_checkpoint_success(7)  # no start: nothing invented
        r.on_training_single_iteration_start()
        r.on_training_single_iteration_start()  # the first is ended with status error, not counted
        r.on_training_single_iteration_end()
        r.on_training_single_iteration_start()  # left open: ended and counted at the training end
        r.on_app_end()
    # app twice, train twice, success, iteration twice; at app end: the loop, the iteration, model_init still open
    assert r.errors == 7 and len(_telemetry_warnings(caught)) == 1
    records = read_run(telemetry)
    assert len(_spans(records, "span_start", "application")) == 1
    assert len(_events(records, "one_logger_initialization")) == 1
    assert len(_spans(records, "span_start", "training_loop")) == 1
    (success,) = _attrs(records, "save_checkpoint_success")
    assert success["current_iteration"] == 7 and success["save_checkpoint_success_count"] == 1
    assert not [k for k in success if k.startswith("productive_")]  # not known: left out, no zeros
    statuses = {e.name: e.status for e in records if e.kind == "span_end" and e.name != "training_single_iteration"}
    assert statuses == {"application": "ok", "training_loop": "ok", "model_initialization": "terminated"}
    # the abandoned iteration is exported (a failure) with status error; the two that ended are counted
    iteration_statuses = [e.status for e in _spans(records, "span_end", "training_single_iteration")]
    assert "error" in iteration_statuses
    (report,) = _attrs(records, "training_metrics_update")
    assert report["num_iterations"] == 2 and report["final"] is True
    assert len(_events(records, "error")) == 7


def test_a_failed_save_never_blocks_the_next(
    tmp_path: Path, telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2), telemetry=telemetry)
    ctx = TrainingContexts(lambda: r)
    with ctx.application(), ctx.training_loop(0):
        with ctx.training_iteration():
            pass
        with pytest.raises(OSError, match="disk full"), \
                pytest.warns(TelemetryWarning, match="checkpoint save failed: OSError: disk full"):
            with ctx.checkpoint_save(1, path=tmp_path / "missing.pt"):
                raise OSError("disk full")
        with ctx.training_iteration():
            pass
        with ctx.checkpoint_save(2):  # one-logger: "Cannot start timer since it is already active"
            pass
    records = read_run(telemetry)
    starts = _spans(records, "span_start", "checkpoint_save_sync")
    ends = {e.span_id: e for e in _spans(records, "span_end", "checkpoint_save_sync")}
    assert [s.attributes["save_checkpoint_attempt_count"] for s in starts] == [1, 2]
    assert [(ends[s.span_id].status, ends[s.span_id].error) for s in starts] == [
        ("error", "OSError: disk full"), ("ok", "")]
    (success,) = _attrs(records, "save_checkpoint_success")
    assert (success["current_iteration"], success["productive_train_iterations"]) == (2, 2)
    assert success["save_checkpoint_success_count"] == 1
    assert _events(records, "save_checkpoint_success")[0].span_id == starts[1].span_id
    assert not [a for a in _attrs(records, "error") if "on_save_checkpoint_start" in str(a.get("callback"))]


def test_a_failed_save_is_an_error_event(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2), telemetry=telemetry)
    ctx = TrainingContexts(lambda: r)
    with _one_warning_at_most() as caught:
        with ctx.application(), ctx.training_loop(0):
            with pytest.raises(OSError):
                with ctx.checkpoint_save(1):
                    raise OSError("disk full")
    errors = _attrs(read_run(telemetry), "error")
    assert r.errors == 1 and len(errors) == 1 and len(_telemetry_warnings(caught)) == 1
    assert "disk full" in errors[0]["error_message"]


def test_validation_end_without_start_invents_no_metrics(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2), telemetry=telemetry)
    with _one_warning_at_most():
        r.on_train_start(0)
        r.on_training_single_iteration_start()
        r.on_training_single_iteration_end()
        r.on_validation_end()
    assert r.errors == 1
    assert _attrs(read_run(telemetry), "validation_metrics_update") == []


def test_a_config_function_that_raises_is_recorded_not_raised(
    telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    def broken() -> int:
        raise LookupError("no data loader yet")

    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=broken, log_every_n_train_iterations=2),
                         telemetry=telemetry)
    ctx = TrainingContexts(lambda: r)
    with _one_warning_at_most() as caught:
        with ctx.application(), ctx.training_loop(0):
            for _ in range(2):
                with ctx.training_iteration():
                    pass
    assert r.errors >= 1 and len(_telemetry_warnings(caught)) == 1
    records = read_run(telemetry)
    assert all("LookupError: no data loader yet" in a["error_message"] for a in _attrs(records, "error"))
    assert len(_attrs(records, "error")) == r.errors
    (report,) = _attrs(records, "training_metrics_update")
    assert report["num_iterations"] == 2 and "samples_per_second" not in report


# -- 4. an interrupted run -----------------------------------------------------------------------------------------


def test_sigterm_mid_training_reports_up_to_the_last_iteration(tmp_path: Path) -> None:
    run_id = f"train-{uuid.uuid4().hex[:8]}"
    code = f"import _proc_helpers as h; h.training_until_sigterm({str(tmp_path)!r}, 8, 5)"
    returncode, path, stderr = run_helper_process(tmp_path, code, run_id, SESSION, sigterm=True, timeout=HANG_S)
    assert returncode == -signal.SIGTERM, stderr
    records = open_run(path).records()
    reports = _attrs(records, "training_metrics_update")
    assert [(a["current_iteration"], a["num_iterations"], a["window_iterations"], a["final"]) for a in reports] == [
        (4, 5, 5, False), (7, 8, 3, True)], stderr
    assert reports[-1]["num_train_samples"] == 32
    loop = _spans(records, "span_start", "training_loop")[0]
    assert _events(records, "training_metrics_update")[-1].span_id == loop.span_id
    ends = {e.name: (e.status, e.error) for e in records if e.kind == "span_end"
            and e.name in ("application", "training_loop")}
    assert {k: v[0] for k, v in ends.items()} == {"application": "terminated", "training_loop": "terminated"}
    points = [m for m in records if m.kind == "metric" and m.name == "train.samples_per_second"]
    assert [m.step for m in points] == [4, 7]


# -- the config ----------------------------------------------------------------------------------------------------


def test_lazy_config_values_are_evaluated_when_needed(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    calls = {"gbs": 0}
    facts: dict[str, Any] = {}

    def gbs() -> int:
        calls["gbs"] += 1
        return int(facts["gbs"])

    config = TrainingTelemetryConfig(global_batch_size_or_fn=gbs, seq_length_or_fn=lambda: facts["seq"],
                                     perf_tag_or_fn=lambda: facts["tag"], world_size_or_fn=lambda: facts["world"],
                                     is_baseline_run_or_fn=lambda: facts["baseline"],
                                     log_every_n_train_iterations=2)
    r = TrainingRecorder(config, telemetry=telemetry)
    assert calls["gbs"] == 0  # nothing evaluated before the application starts
    facts.update(gbs=16, seq=32, tag=["a", "b"], world=4, baseline=True)  # known only now (after the data loader)
    r.on_app_start()
    facts["gbs"] = 24  # and changed later: the value when it is needed counts
    r.on_train_start(0)
    for _ in range(2):
        r.on_training_single_iteration_start()
        r.on_training_single_iteration_end()
    r.on_train_end()
    r.on_app_end()
    records = read_run(telemetry)
    config_event = _attrs(records, "update_training_telemetry_config")[0]
    assert (config_event["global_batch_size"], config_event["seq_length"], config_event["perf_tag"]) == (
        16, 32, ["a", "b"])
    init = _attrs(records, "one_logger_initialization")[0]
    assert (init["world_size"], init["is_baseline_run"]) == (4, True)
    report = _attrs(records, "training_metrics_update")[0]
    assert (report["num_train_samples"], report["train_tokens"]) == (48, 48 * 32)
    assert config.global_batch_size == 24 and config.perf_tag == ["a", "b"]
    assert r.errors == 0


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"global_batch_size_or_fn": 0}, ValueError, "global_batch_size_or_fn"),
    ({"global_batch_size_or_fn": -8}, ValueError, "global_batch_size_or_fn"),
    ({"global_batch_size_or_fn": 2.5}, ValueError, "global_batch_size_or_fn"),
    ({"global_batch_size_or_fn": "eight"}, ValueError, "global_batch_size_or_fn"),
    ({"global_batch_size_or_fn": True}, ValueError, "global_batch_size_or_fn"),
    ({"global_batch_size_or_fn": None}, ValueError, "global_batch_size_or_fn"),
    ({"micro_batch_size_or_fn": 0}, ValueError, "micro_batch_size_or_fn"),
    ({"seq_length_or_fn": -1}, ValueError, "seq_length_or_fn"),
    ({"train_iterations_target_or_fn": 0}, ValueError, "train_iterations_target_or_fn"),
    ({"train_samples_target_or_fn": 1.5}, ValueError, "train_samples_target_or_fn"),
    ({"world_size_or_fn": 0}, ValueError, "world_size_or_fn"),
    ({"flops_per_sample_or_fn": 0}, ValueError, "flops_per_sample_or_fn"),
    ({"flops_per_sample_or_fn": float("inf")}, ValueError, "flops_per_sample_or_fn"),
    ({"flops_per_sample_or_fn": float("nan")}, ValueError, "flops_per_sample_or_fn"),
    ({"flops_per_sample_or_fn": "1e12"}, ValueError, "flops_per_sample_or_fn"),
    ({"perf_tag_or_fn": 3}, TypeError, "perf_tag_or_fn"),
    ({"perf_tag_or_fn": ["a", 1]}, TypeError, "perf_tag_or_fn"),
    ({"log_every_n_train_iterations": 0}, ValueError, "log_every_n_train_iterations"),
    ({"log_every_n_train_iterations": 2.5}, ValueError, "log_every_n_train_iterations"),
    ({"save_checkpoint_strategy": "sometimes"}, ValueError, "save_checkpoint_strategy"),
    ({"warmup_iterations": -1}, ValueError, "warmup_iterations"),
    ({"export_iteration_spans_every": 0}, ValueError, "export_iteration_spans_every"),
    ({"peak_tflops_per_gpu": 0}, ValueError, "peak_tflops_per_gpu"),
    ({"peak_tflops_per_gpu": float("inf")}, ValueError, "peak_tflops_per_gpu"),
    ({"peak_tflops_per_gpu": True}, ValueError, "peak_tflops_per_gpu"),
    ({"custom_metadata": ["a:b"]}, TypeError, "custom_metadata"),
])
def test_invalid_config_values_are_refused(kwargs: dict[str, Any], exc: type[Exception], match: str) -> None:
    args = {"global_batch_size_or_fn": 8, **kwargs}
    with pytest.raises(exc, match=match):
        TrainingTelemetryConfig(**args)


def test_wrong_arguments_at_the_call_site_raise(telemetry: Telemetry) -> None:
    with pytest.raises(TypeError, match="config"):
        TrainingRecorder({"global_batch_size_or_fn": 8}, telemetry=telemetry)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="telemetry"):
        TrainingRecorder(telemetry="store")  # type: ignore[arg-type]
    r = TrainingRecorder(telemetry=telemetry)
    with pytest.raises(TypeError, match="config"):
        r.set_training_telemetry_config(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config"):
        training.set_training_telemetry_config({"global_batch_size_or_fn": 8})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="train_iterations_start"):
        r.on_train_start(-1)
    with pytest.raises(TypeError, match="global_step"):
        r.on_save_checkpoint_start("3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="time_msec"):
        r.on_app_start("yesterday")  # type: ignore[arg-type]
    assert r.errors == 0


def test_a_late_config_emits_update_training_telemetry_config(
    telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    recorder = training.get_recorder()
    with _one_warning_at_most() as caught:
        callbacks.on_app_start()
        assert _events(read_run(telemetry), "update_training_telemetry_config") == []  # no config yet
        training.set_training_telemetry_config(TrainingTelemetryConfig(global_batch_size_or_fn=32,
                                                                       perf_tag_or_fn="late"))
        callbacks.on_train_start(0)
        callbacks.on_training_single_iteration_start()
        callbacks.on_training_single_iteration_end()
        training.set_training_telemetry_config(TrainingTelemetryConfig(global_batch_size_or_fn=64,
                                                                       perf_tag_or_fn="later"))
        callbacks.on_train_end()
        callbacks.on_app_end()
    records = read_run(telemetry)
    updates = _events(records, "update_training_telemetry_config")
    assert [(e.attributes["global_batch_size"], e.attributes["perf_tag"]) for e in updates] == [
        (32, "late"), (64, "later")]
    app = _spans(records, "span_start", "application")[0]
    assert {e.span_id for e in updates} == {app.span_id}
    # the iteration ran under the first config: its samples are that batch size (as one-logger counts them, at the
    # iteration's end), not the size of a config set after it
    assert _attrs(records, "training_metrics_update")[0]["num_train_samples"] == 32
    assert recorder.errors == 0 and _telemetry_warnings(caught) == []


def test_a_config_set_before_the_application_is_emitted_at_its_start(
    telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    training.configure(TrainingTelemetryConfig(global_batch_size_or_fn=4, custom_metadata={"k": 1}))
    telemetry.metric("marker", 1)
    assert [r.name for r in read_run(telemetry)] == ["marker"]  # nothing emitted before the application starts
    with training.application():
        pass
    records = read_run(telemetry)
    (update,) = _attrs(records, "update_training_telemetry_config")
    assert update["custom_metadata"] == ["k:1"] and update["global_batch_size"] == 4
    names = [e.name for e in records if e.kind == "event"]
    assert names.index("one_logger_initialization") < names.index("update_training_telemetry_config")


def test_the_training_loop_stays_current_after_a_save_or_a_validation(telemetry: Telemetry) -> None:
    from telemetrain.spans import current_span

    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2), telemetry=telemetry)
    ctx = TrainingContexts(lambda: r)
    seen = []
    with ctx.application(), ctx.training_loop(0) as loop:
        with ctx.checkpoint_save(0):
            pass
        seen.append(current_span())
        with ctx.validation_loop():
            pass
        seen.append(current_span())
    assert seen == [loop, loop]


def test_reports_carry_the_loops_cumulative_iteration_time(telemetry: Telemetry, read_run: Any) -> None:
    """Each report carries the loop's total iteration time so far, warm-up included (goodput needs it between
    checkpoints)."""
    recorder = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2, log_every_n_train_iterations=2),
                                telemetry=telemetry)
    base = time.time() * 1000 - 60_000
    recorder.on_train_start(0, start_time_msec=base)
    durations = [100, 200, 300, 400]
    clock = base
    for d in durations:
        recorder.on_training_single_iteration_start(start_time_msec=clock + 10)
        recorder.on_training_single_iteration_end(finish_time_msec=clock + 10 + d)
        clock += 10 + d
    recorder.on_train_end(finish_time_msec=clock + 5)
    reports = [r.attributes for r in read_run(telemetry, "event") if r.name == "training_metrics_update"]
    assert [round(r["cumulative_iteration_time_sec"], 6) for r in reports] == [0.3, 1.0]


def test_on_exception_ends_the_open_spans_as_failed_without_a_misuse_error(tmp_path: Path) -> None:
    t = Telemetry(store=tmp_path)
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=2),
                           telemetry=t)
    rec.on_app_start()
    rec.on_train_start(train_iterations_start=0)
    for _ in range(3):
        rec.on_training_single_iteration_start()
        rec.on_training_single_iteration_end()
    rec.on_training_single_iteration_start()
    rec.on_exception(RuntimeError("peer rank died"))
    rec.on_app_end()
    with pytest.raises(TypeError, match="exc"):
        rec.on_exception("not an exception")  # type: ignore[arg-type]
    t.close()
    records = open_run(run_dir_of(t)).records()
    (loop,) = _spans(records, "span_end", "training_loop")
    assert loop.status == "error" and "RuntimeError: peer rank died" in (loop.error or "")
    (app,) = _spans(records, "span_end", "application")
    assert app.status == "error"
    assert not [e for e in _events(records, "error") if "still open" in str(e.attributes)]
    assert _attrs(records, "training_metrics_update")[-1]["num_iterations"] == 3  # the failed one is not completed


def test_open_span_and_abandon_iteration_for_integrations(tmp_path: Path) -> None:
    t = Telemetry(store=tmp_path)
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=100),
                           telemetry=t)
    assert rec.open_span("application") is None
    app = rec.on_app_start()
    assert rec.open_span("application") is app
    rec.on_train_start(train_iterations_start=0)
    rec.on_training_single_iteration_start()
    rec.on_training_single_iteration_end()
    rec.on_training_single_iteration_start()
    rec.abandon_iteration("RuntimeError: step failed")
    rec.abandon_iteration("again")  # nothing open: nothing happens
    rec.on_train_end()
    rec.on_app_end()
    assert rec.open_span("application") is None
    t.close()
    records = open_run(run_dir_of(t)).records()
    assert _attrs(records, "training_metrics_update")[-1]["num_iterations"] == 1  # the abandoned one is not counted
    assert not [e for e in _events(records, "error")]  # and no misuse
