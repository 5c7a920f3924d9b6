"""The derived training numbers, checked by hand against the loop's own inputs.

What an iteration processed: samples and tokens counted per step, not steps x a batch size read at the report. A
short last batch (``drop_last=False``), a batch size that changes mid-run (a curriculum, given as a function), and
packed sequences (tokens per step) must give the samples, tokens, throughput and FLOP/s a user computes by hand from
the loop's own inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from telemetrain import Telemetry, training
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
from telemetrain.training.context import TrainingContexts


def _reports(records: list[Any]) -> list[dict[str, Any]]:
    return [dict(r.attributes or {}) for r in records if r.kind == "event" and r.name == "training_metrics_update"]


def _metric(records: list[Any], name: str) -> list[tuple[int | None, float]]:
    return [(m.step, m.value) for m in records if m.kind == "metric" and m.name == name]


def _base_ms() -> float:
    return float(int(time.time() * 1000) - 60_000)


def test_a_short_last_batch_counts_its_own_samples(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    dataset = TensorDataset(torch.arange(10.0).unsqueeze(1))
    loader = DataLoader(dataset, batch_size=4, drop_last=False)  # batches of 4, 4, 2
    fps, every = 1e9, 2
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, flops_per_sample_or_fn=fps,
                                                 log_every_n_train_iterations=every, world_size_or_fn=1),
                         telemetry=telemetry)
    base = _base_ms()
    r.on_app_start(base)
    r.on_train_start(0, start_time_msec=base)
    now, sizes, ends = base, [], []
    for (x,) in loader:
        r.on_training_single_iteration_start(now)
        now += 100.0
        sizes.append(len(x))
        r.on_training_single_iteration_end(now, samples=len(x))
        ends.append(now)
    r.on_train_end(now)
    r.on_app_end(now)
    reports = _reports(read_run(telemetry))
    assert sizes == [4, 4, 2] and len(reports) == 2
    first, last = reports
    assert first["num_train_samples"] == 8 and first["window_samples"] == 8
    assert last["num_train_samples"] == len(dataset)  # not 3 x 4 = 12
    assert last["window_samples"] == 2 and last["avg_batch_size"] == 2
    wall = (ends[2] - ends[1]) / 1000
    assert last["samples_per_second"] == pytest.approx(2 / wall)
    assert last["total_flops"] == pytest.approx(len(dataset) * fps)
    assert last["train_throughput_per_gpu"] == pytest.approx(2 * fps / wall / 1e12)


def test_a_batch_size_function_is_read_at_each_iteration(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    """A curriculum: the global batch size, given as a function, grows every 3 steps; windows of 4."""
    schedule = [8, 8, 8, 16, 16, 16, 32, 32, 32, 64]
    current = {"gbs": schedule[0]}
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=lambda: current["gbs"], seq_length_or_fn=10,
                                                 log_every_n_train_iterations=4, world_size_or_fn=1),
                         telemetry=telemetry)
    base = _base_ms()
    r.on_app_start(base)
    r.on_train_start(0, start_time_msec=base)
    now = base
    for gbs in schedule:
        current["gbs"] = gbs
        r.on_training_single_iteration_start(now)
        now += 50.0
        r.on_training_single_iteration_end(now)
    current["gbs"] = 1000  # changed after the last step: counts for no iteration
    r.on_train_end(now)
    r.on_app_end(now)
    records = read_run(telemetry)
    reports = _reports(records)
    windows = [schedule[0:4], schedule[4:8], schedule[8:10]]
    assert [rep["window_samples"] for rep in reports] == [sum(w) for w in windows]
    totals = [sum(schedule[:4]), sum(schedule[:8]), sum(schedule)]
    assert [rep["num_train_samples"] for rep in reports] == totals
    assert [rep["train_tokens"] for rep in reports] == [10 * t for t in totals]
    for rep, w in zip(reports, windows, strict=True):
        assert rep["samples_per_second"] == pytest.approx(sum(w) / (len(w) * 0.05))
        assert rep["tokens_per_second"] == pytest.approx(10 * sum(w) / (len(w) * 0.05))
    assert [v for _, v in _metric(records, "train.samples")] == totals


def test_packed_sequences_count_the_tokens_given(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    """Variable token counts (packing, padding left out): the tokens given per step; a step given none counts
    samples x seq_length."""
    torch.manual_seed(0)
    seq, gbs, steps = 32, 4, 6
    masks = [torch.rand(gbs, seq) < torch.rand(gbs, 1) for _ in range(steps)]  # real tokens per row vary
    given = [int(m.sum()) for m in masks]
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=gbs, seq_length_or_fn=seq,
                                                 log_every_n_train_iterations=3, world_size_or_fn=1),
                         telemetry=telemetry)
    contexts = TrainingContexts(lambda: r)
    base = _base_ms()
    r.on_app_start(base)
    r.on_train_start(0, start_time_msec=base)
    now = base
    for k in range(steps):
        r.on_training_single_iteration_start(now)
        if k != 4:  # step 4: no count given, so gbs x seq
            contexts.iteration_size(tokens=given[k])
        now += 100.0
        r.on_training_single_iteration_end(now)
    r.on_train_end(now)
    r.on_app_end(now)
    reports = _reports(read_run(telemetry))
    counted = [*given[:4], gbs * seq, given[5]]
    assert [rep["train_tokens"] for rep in reports] == [sum(counted[:3]), sum(counted)]
    assert reports[1]["tokens_per_second"] == pytest.approx(sum(counted[3:]) / 0.3)
    assert reports[1]["num_train_samples"] == steps * gbs  # the samples are still the batch size's


def test_without_a_sequence_length_only_given_tokens_count(telemetry: Telemetry,
                                                         read_run: Callable[..., Any]) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2, log_every_n_train_iterations=2,
                                                 world_size_or_fn=1), telemetry=telemetry)
    base = _base_ms()
    r.on_app_start(base)
    r.on_train_start(0, start_time_msec=base)
    for k, tokens in enumerate((100, 60, None, 80)):
        r.on_training_single_iteration_start(base + 100 * k)
        r.on_training_single_iteration_end(base + 100 * k + 100, tokens=tokens)
    r.on_train_end(base + 400)
    r.on_app_end(base + 400)
    first, second = _reports(read_run(telemetry))
    assert first["train_tokens"] == 160 and first["tokens_per_second"] == pytest.approx(160 / 0.2)
    # the third step's tokens are unknown (no seq_length): no tokens made up, from then on
    assert "train_tokens" not in second and "tokens_per_second" not in second
    assert second["num_train_samples"] == 8


def test_the_module_callbacks_and_contexts_take_the_counts(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    training.configure(TrainingTelemetryConfig(global_batch_size_or_fn=16, log_every_n_train_iterations=100,
                                               world_size_or_fn=1))
    with training.application(), training.training_loop(train_iterations_start=0):
        with training.training_iteration():
            training.iteration_size(samples=5)
        training.callbacks.on_training_single_iteration_start()
        training.callbacks.on_training_single_iteration_end(samples=7, tokens=70)
        with training.training_iteration():
            pass
    (report,) = _reports(read_run(telemetry))
    assert report["num_train_samples"] == 5 + 7 + 16


@pytest.mark.parametrize(("kwargs", "error"), [({"samples": "4"}, TypeError), ({"tokens": 2.5}, TypeError),
                                               ({"samples": True}, TypeError), ({"samples": -1}, ValueError),
                                               ({"tokens": torch.tensor(3)}, TypeError)])
def test_a_count_that_is_no_count_is_refused(telemetry: Telemetry, kwargs: dict[str, Any],
                                             error: type[Exception]) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2), telemetry=telemetry)
    r.on_train_start(0)
    r.on_training_single_iteration_start()
    name = next(iter(kwargs))
    with pytest.raises(error, match=name):
        r.iteration_size(**kwargs)
    with pytest.raises(error, match=name):
        r.on_training_single_iteration_end(**kwargs)
    r.on_training_single_iteration_end()
    r.on_train_end()


def test_checkpoint_saves_and_validation_are_left_out_of_the_rates(telemetry: Telemetry,
                                                                  read_run: Callable[..., Any]) -> None:
    """Training is paused during a save or a validation loop (each its own badput): a window's throughput, FLOP/s
    and MFU are over the time it trained, so they do not dip in the windows that hold one."""
    gbs, fps, peak, world = 8, 2e12, 100.0, 2
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=gbs, flops_per_sample_or_fn=fps,
                                                 log_every_n_train_iterations=4, world_size_or_fn=world,
                                                 peak_tflops_per_gpu=peak), telemetry=telemetry)
    base = _base_ms()
    r.on_app_start(base)
    r.on_train_start(0, start_time_msec=base)
    now = base

    def iterations(n: int) -> None:
        nonlocal now
        for _ in range(n):
            r.on_training_single_iteration_start(now)
            now += 100.0
            r.on_training_single_iteration_end(now)

    def pause(kind: str, ms: float) -> None:
        nonlocal now
        if kind == "save":
            r.on_save_checkpoint_start(0, now)
            r.on_save_checkpoint_success(0, now + ms)
            r.on_save_checkpoint_end(now + ms)
        else:
            r.on_validation_start(now)
            r.on_validation_end(now + ms)
        now += ms

    r.on_load_checkpoint_start(now)  # a resume inside the loop, before its first iteration
    r.on_load_checkpoint_end(now + 400.0)
    now += 400.0
    iterations(2)
    pause("save", 500.0)
    pause("validation", 300.0)
    iterations(2)  # report 1: 4 x 0.1 s trained in 1.6 s of wall time
    iterations(4)  # report 2: no pause
    pause("save", 200.0)  # after report 2's last iteration: report 3's
    iterations(2)
    r.on_train_end(now)
    r.on_app_end(now)
    reports = _reports(read_run(telemetry))
    walls, paused, trained = [1.6, 0.4, 0.4], [1.2, 0.0, 0.2], [0.4, 0.4, 0.2]
    samples = [4 * gbs, 4 * gbs, 2 * gbs]
    for rep, wall, off, busy, n in zip(reports, walls, paused, trained, samples, strict=True):
        assert rep["window_seconds"] == pytest.approx(wall)
        assert rep["samples_per_second"] == pytest.approx(n / busy)
        assert rep["window_paused_seconds"] == pytest.approx(off)
        tflops = n * fps / busy / world / 1e12
        assert rep["train_throughput_per_gpu"] == pytest.approx(tflops)
        assert rep["mfu"] == pytest.approx(tflops / peak)
    # since the end of the warm-up iteration: 9 iterations, 0.9 s of training, all three pauses after it
    assert reports[-1]["cumulative_samples_per_second"] == pytest.approx(9 * gbs / 0.9)
    assert reports[-1]["cumulative_train_throughput_per_gpu"] == pytest.approx(9 * gbs * fps / 0.9 / world / 1e12)


@pytest.mark.parametrize("dtype", ["bf17", "float64", ""])
def test_an_unknown_dtype_is_refused_by_the_config(dtype: str) -> None:
    """The MFU's peak is looked up for ``dtype`` at the loop's start: a typo was an error event there and no MFU."""
    with pytest.raises(ValueError, match="dtype"):
        TrainingTelemetryConfig(global_batch_size_or_fn=2, dtype=dtype)


def test_a_dtype_alias_is_taken(telemetry: Telemetry) -> None:
    # the A100 datasheet's dense figures: BF16 and FP16 312, TF32 156 TFLOP/s
    for dtype, tflops in (("bf16", 312.0), ("half", 312.0), ("tf32", 156.0)):
        config = TrainingTelemetryConfig(global_batch_size_or_fn=2, dtype=dtype, device_name="NVIDIA A100-SXM4-80GB")
        r = TrainingRecorder(config, telemetry=telemetry)
        peak = r.peak()
        assert peak is not None and peak.tflops == tflops and r.errors == 0


def test_a_checkpoint_holds_the_samples_the_iterations_counted(telemetry: Telemetry,
                                                               read_run: Callable[..., Any]) -> None:
    """save_checkpoint_success's productive samples and TFLOPs: resumed at step 10 of 8-sample steps, then steps
    of 8, 8 and a short one of 3, saved after the curriculum moved the batch size function on to 64."""
    fps = 1e12
    current = {"gbs": 8}
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=lambda: current["gbs"],
                                                 flops_per_sample_or_fn=fps, world_size_or_fn=1),
                         telemetry=telemetry)
    r.on_app_start()
    r.on_train_start(10)  # train_samples_start: 10 x 8
    for samples in (None, None, 3):
        r.on_training_single_iteration_start()
        r.on_training_single_iteration_end(samples=samples)
    current["gbs"] = 64
    r.on_save_checkpoint_start(13)
    r.on_save_checkpoint_success(13)
    r.on_save_checkpoint_end()
    r.on_train_end()
    r.on_app_end()
    (success,) = [dict(e.attributes or {}) for e in read_run(telemetry)
                  if e.kind == "event" and e.name == "save_checkpoint_success"]
    expected = 10 * 8 + 8 + 8 + 3
    assert success["productive_train_iterations"] == 13
    assert success["productive_train_samples"] == expected
    assert success["productive_train_tflops"] == pytest.approx(expected * fps / 1e12)
