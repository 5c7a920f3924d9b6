"""What compare reads of a run, on both paths: only the curves its quality comparison can use (the time origin of
every user series kept), the goodput by the same engine, the per-rank series a group of ranks at a time."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis import samples_sql
from telemetrain.analysis.compare_quality import compare_quality, quality_series
from telemetrain.analysis.samples import read_samples
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
from telemetrain.training.goodput import goodput


def _run(root: Path, tag: str) -> Path:
    for rank in (0, 1):
        t = Telemetry(identity_from_env({}, run_id=tag, session_tag=tag, rank=rank, world_size=2), store=root)
        t.metric("warmup", 1.0, "train")  # the first user point, of a series compare does not draw, without a step
        recorder = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=5),
                                    telemetry=t)
        recorder.on_app_start()
        recorder.on_train_start(0)
        for step in range(40):
            recorder.on_training_single_iteration_start()
            t.metric("lr", 0.1 / (1 + step), "train", step=step)
            t.log({"loss": 3.0 / (1 + step) + 0.01 * rank}, step=step, group="train")
            if step % 10 == 9:
                t.metric("val_accuracy", step / 40, "val", step=step)
            recorder.on_training_single_iteration_end()
        recorder.on_train_end()
        recorder.on_app_end()
        assert t.close()
    return root / tag / tag


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("store"), "reading")


@pytest.mark.parametrize("engine", ["python", "duckdb"])
def test_only_the_quality_curves_are_fed_and_the_answers_are_the_same(run_dir: Path, engine: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if engine == "python":
        monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    full = read_samples(run_dir)
    some = read_samples(run_dir, curves=quality_series())
    assert full.curves.names() == [("train", "loss"), ("train", "lr"), ("train", "warmup"), ("val", "val_accuracy")]
    assert some.curves.names() == [("train", "loss"), ("val", "val_accuracy")]
    # the time origin is every user series' first point (here the warm-up's, fed in neither)
    assert some.curves.first_wall_ns == full.curves.first_wall_ns
    for key in some.curves.names():
        assert some.curves.curve(*key) == full.curves.curve(*key)
    assert compare_quality(some, some) == compare_quality(full, full) is not None
    by_name = read_samples(run_dir, curves=quality_series("lr"))  # --loss lr: that series, and the evaluations
    assert by_name.curves.names() == [("train", "lr"), ("val", "val_accuracy")]
    none = read_samples(run_dir, curves=lambda name: False)  # a run of the history: no curve
    assert none.curves.names() == [] and none.curves.first_wall_ns == full.curves.first_wall_ns
    assert dataclasses.replace(none, curves=full.curves, path=full.path) == full  # and nothing else differs


@pytest.mark.parametrize("engine", ["python", "duckdb"])
def test_goodput_read_with_the_samples_is_the_runs_own(run_dir: Path, engine: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if engine == "python":
        monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    alone = goodput(run_dir).goodput
    assert read_samples(run_dir, goodput=True).goodput == alone is not None
    assert read_samples(run_dir).goodput is None


def test_per_rank_series_a_rank_at_a_time(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    together = read_samples(run_dir)
    monkeypatch.setattr(samples_sql, "WINDOWS_AT_ONCE", 1)  # every rank its own query
    apart = read_samples(run_dir)
    assert together.precomputed is not None and apart.precomputed is not None
    assert {k: list(v) for k, v in apart.precomputed.items()} == {k: list(v) for k, v in together.precomputed.items()}
    assert len(together.series("iteration_time", 1)) == 7  # 8 reports less the warm-up's
