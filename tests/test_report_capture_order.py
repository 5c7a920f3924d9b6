"""The report capture on the training thread (``report_capture``), as made cheaper: the snapshot built positionally
(each field checked by name against the state it comes from), the config's world size read once per config (the
value after a config replacement, a lazy one and the identity's at each report), the window's summary made by the
reporter, and the usual iteration's sample count taken on a short path (a count given outside an iteration is still
not the next one's)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from telemetrain import Telemetry
from telemetrain.default_instance import _default
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
from telemetrain.training import callbacks as training
from telemetrain.training.default import configure, get_recorder


def _reports(records: list[Any]) -> list[dict[str, Any]]:
    return [dict(r.attributes or {}) for r in records if r.kind == "event" and r.name == "training_metrics_update"]


def _base_ms() -> float:
    return float(int(time.time() * 1000) - 60_000)


def test_each_snapshot_field_comes_from_its_own_state(telemetry: Telemetry) -> None:
    """Distinct values everywhere, so a field filled from its neighbour's state fails here."""
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, seq_length_or_fn=16,
                                                 flops_per_sample_or_fn=3e9, log_every_n_train_iterations=1000,
                                                 world_size_or_fn=5, warmup_iterations=1, peak_tflops_per_gpu=77.0),
                         telemetry=telemetry)
    base = _base_ms()
    r.on_app_start(base)
    r.on_train_start(7, 123, start_time_msec=base + 10.0)
    now = base + 10.0
    for _ in range(3):
        r.on_training_single_iteration_start(now + 1.0)
        now += 100.0
        r.on_training_single_iteration_end(now)
    r.on_validation_start(now)  # a pause in the window: 40 ms
    r.on_validation_end(now + 40.0)
    now += 40.0
    r.on_training_single_iteration_start(now)
    now += 100.0
    r.on_training_single_iteration_end(now)
    loop = r.open_span("training_loop")
    assert loop is not None
    window = r._window
    ms = 1_000_000
    snap = r._snapshot(final=True)
    last_end = r._last_iteration_end_ns
    assert snap.final is True and snap.window is window and r._window is not window
    assert snap.window_iterations == 4 and snap.iterations == 4 and snap.interval == 1000
    assert snap.iterations_start == 7 and snap.samples_start == 123
    assert snap.end_ns == last_end == snap.last_iteration_end_ns
    assert snap.first_iteration_end_ns == last_end - 340 * ms
    assert snap.steady_start_ns == snap.first_iteration_end_ns  # the end of the one warm-up iteration
    assert snap.steady_iterations == 3
    assert snap.iteration_total_sec == pytest.approx(4 * 0.099 + 0.001)
    assert snap.time_to_first_iteration == pytest.approx(0.11)  # from the application's start
    assert (snap.gbs, snap.seq, snap.fps, snap.world) == (8, 16, 3e9, 5)
    assert (snap.samples, snap.window_samples, snap.steady_samples) == (32, 32, 24)
    assert (snap.tokens, snap.window_tokens) == (32 * 16, 32 * 16)
    assert snap.paused_ns == 40 * ms and snap.steady_paused_ns == 40 * ms
    assert snap.peak is not None and snap.peak.tflops == 77.0
    assert snap.saves == {"save_checkpoint_count": 0} and snap.loads == {"load_checkpoint_count": 0}
    assert snap.wall_offset_ns == telemetry.wall_offset_ns
    assert snap.span_id == loop.span_id_hex and snap.extras is None and snap.extra == ()
    assert snap.clocks is not None and len(snap.clocks) == 4 and snap.iteration_times is None
    r.on_train_end(now)
    r.on_app_end(now)


def _throughputs(telemetry: Telemetry, read_run: Callable[..., Any], configs: list[TrainingTelemetryConfig],
                 before_each: Callable[[int], None] | None = None) -> list[float]:
    """Train 2 iterations of 100 ms under each config in turn (a report after each pair): each report's
    TFLOP/s per GPU (8 samples x 1e12 FLOPs / 0.2 s / world / 1e12 = 40 / world)."""
    r = TrainingRecorder(configs[0], telemetry=telemetry)
    base = _base_ms()
    r.on_app_start(base)
    r.on_train_start(0, start_time_msec=base)
    now = base
    for k, config in enumerate(configs):
        if k:
            r.set_training_telemetry_config(config)
        if before_each is not None:
            before_each(k)
        for _ in range(2):
            r.on_training_single_iteration_start(now)
            now += 100.0
            r.on_training_single_iteration_end(now)
    r.on_train_end(now)
    r.on_app_end(now)
    return [a["train_throughput_per_gpu"] for a in _reports(read_run(telemetry))]


def _config(world: Any) -> TrainingTelemetryConfig:
    return TrainingTelemetryConfig(global_batch_size_or_fn=4, flops_per_sample_or_fn=1e12,
                                   log_every_n_train_iterations=2, world_size_or_fn=world)


def test_a_replaced_config_s_world_size_is_the_one_divided_by(telemetry: Telemetry,
                                                              read_run: Callable[..., Any]) -> None:
    """The config's world size is read when the config is set, not at each report: a new config replaces it."""
    assert _throughputs(telemetry, read_run, [_config(2), _config(4), _config(None)]) == pytest.approx(
        [20.0, 10.0, 40.0])  # the last: no world size in the config, the identity's (1)


def test_a_lazy_world_size_is_called_at_each_report(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    """A function (``torch.distributed.get_world_size`` after a re-initialised process group) is asked again."""
    worlds = iter([2, 4, 8])
    current = [1]

    def before(_: int) -> None:
        current[0] = next(worlds)

    lazy = _config(lambda: current[0])
    assert _throughputs(telemetry, read_run, [lazy, lazy, lazy], before) == pytest.approx([20.0, 10.0, 5.0])


def test_the_identity_s_world_size_is_read_at_each_report(telemetry: Telemetry,
                                                          read_run: Callable[..., Any]) -> None:
    """No world size in the config: the run identity's, which ``set_identity`` changes (rank and world size
    learned when the process group is (re)initialised)."""

    def before(k: int) -> None:
        telemetry.set_identity(world_size=(1, 2, 4)[k])

    none = _config(None)
    assert _throughputs(telemetry, read_run, [none, none, none], before) == pytest.approx([40.0, 20.0, 10.0])


def test_a_count_given_between_iterations_is_not_the_next_one_s(telemetry: Telemetry,
                                                                 read_run: Callable[..., Any]) -> None:
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, seq_length_or_fn=10,
                                                 log_every_n_train_iterations=3), telemetry=telemetry)
    base = _base_ms()
    r.on_app_start(base)
    r.on_train_start(0, start_time_msec=base)
    r.on_training_single_iteration_start()
    r.on_training_single_iteration_end()  # 4 samples, 40 tokens (the defaults)
    r.iteration_size(samples=100, tokens=7)  # outside an iteration: dropped at the next start
    r.on_training_single_iteration_start()
    r.on_training_single_iteration_end()  # 4, 40
    r.on_training_single_iteration_start()
    r.iteration_size(samples=2)
    r.on_training_single_iteration_end()  # 2 samples, 20 tokens
    r.on_train_end()
    r.on_app_end()
    (report,) = _reports(read_run(telemetry))
    assert report["num_train_samples"] == 10 and report["window_samples"] == 10
    assert report["train_tokens"] == 100


def test_the_module_callbacks_follow_the_default_instance(tmp_path: Path, read_run: Callable[..., Any]) -> None:
    """The module-level iteration callbacks find the default instance's recorder at each call (inlined lookup): a
    ``set_telemetry`` between two loops sends the second loop to the new instance, and with no default instance
    yet one is made, as ``get_recorder()`` makes it."""
    first, second = Telemetry(store=tmp_path / "a"), Telemetry(store=tmp_path / "b")
    config = TrainingTelemetryConfig(global_batch_size_or_fn=2, log_every_n_train_iterations=100)
    try:
        for t, n in ((first, 3), (second, 5)):
            telemetrain.set_telemetry(t)
            configure(config)
            training.on_app_start()
            training.on_train_start(0)
            for _ in range(n):
                training.on_training_single_iteration_start()
                training.on_training_single_iteration_end()
            training.on_train_end()
            training.on_app_end()
        assert [_reports(read_run(t))[-1]["num_iterations"] for t in (first, second)] == [3, 5]
        telemetrain.reset()
        assert _default.telemetry is None
        with pytest.warns(Warning, match="no training loop"):  # a misuse on a recorder made now, not an exception
            training.on_training_single_iteration_start()
        made = _default.telemetry
        assert made is not None and get_recorder(made).errors == 1
    finally:
        telemetrain.reset()
        first.close()
        second.close()
