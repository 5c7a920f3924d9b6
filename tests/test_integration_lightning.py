"""``telemetrain.integrations.lightning``: a real Lightning ``Trainer`` (CPU, a tiny model, synthetic data) with the
callback, read back from the run store.

The reference run: 16 training samples in batches of 2 (8 batches an epoch), ``accumulate_grad_batches=2`` (4
optimizer steps an epoch), 2 epochs, validation on 4 samples (2 batches) after each epoch, the sanity check on (it
must not count), a ``ModelCheckpoint`` saving after each epoch.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pl = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO  # noqa: E402
from torch import Tensor  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import telemetrain  # noqa: E402
from telemetrain.integrations import lightning as tl  # noqa: E402
from telemetrain.store import open_run  # noqa: E402
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig  # noqa: E402

# Lightning's own deprecation notice (its pytree helper) and its note on a changed checkpoint folder: not ours
pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec"),
              pytest.mark.filterwarnings("ignore:The dirpath has changed")]

EPOCHS, BATCH, ACCUMULATE, TRAIN_SAMPLES, VAL_SAMPLES = 2, 2, 2, 16, 4
STEPS_PER_EPOCH = TRAIN_SAMPLES // BATCH // ACCUMULATE


class Tiny(pl.LightningModule):  # type: ignore[misc, name-defined]  # (a base from pytest.importorskip's module object: Any to mypy)
    """A linear regression; ``fail_at_step``: training_step raises at that global step."""

    def __init__(self, fail_at_step: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.fail_at_step = fail_at_step

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.fail_at_step is not None and self.trainer.global_step == self.fail_at_step:
            raise RuntimeError("boom in training_step")
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        return self.validation_step(batch, batch_idx)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(n: int, seed: int = 0) -> DataLoader[tuple[Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=BATCH)


def trainer(tmp_path: Path, callback: Any, **kwargs: Any) -> Any:
    options: dict[str, Any] = dict(
        accelerator="cpu", devices=1, max_epochs=EPOCHS, accumulate_grad_batches=ACCUMULATE, logger=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1, num_sanity_val_steps=2,
        default_root_dir=tmp_path,
        callbacks=[callback, ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, filename="{epoch}-{step}")],
    )
    options.update(kwargs)
    return pl.Trainer(**options)


@pytest.fixture
def t(tmp_path: Path) -> Iterator[telemetrain.Telemetry]:
    telemetry = telemetrain.Telemetry(store=tmp_path / "runs")
    try:
        yield telemetry
    finally:
        telemetry.close()


def records(t: telemetrain.Telemetry) -> list[Any]:
    assert t.flush()
    assert t.run_dir is not None
    return open_run(t.run_dir).records()


def ends(recs: list[Any], name: str) -> list[Any]:
    return [r for r in recs if r.kind == "span_end" and r.name == name]


def events(recs: list[Any], name: str) -> list[Any]:
    return [r for r in recs if r.kind == "event" and r.name == name]


def fit(tmp_path: Path, t: telemetrain.Telemetry, callback: Any = None, model: Any = None, **kwargs: Any) -> Any:
    callback = callback if callback is not None else tl.TelemetrainCallback(telemetry=t)
    tr = trainer(tmp_path, callback, **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|LeafSpec).*")
        tr.fit(model or Tiny(), loader(TRAIN_SAMPLES), loader(VAL_SAMPLES, seed=1))
    return tr


# -- the reference fit ------------------------------------------------------------------------------------------------


@pytest.fixture
def reference(tmp_path: Path, t: telemetrain.Telemetry) -> tuple[Any, Any, list[Any]]:
    callback = tl.TelemetrainCallback(telemetry=t)
    tr = fit(tmp_path, t, callback)
    return tr, callback, records(t)


def test_the_callback_is_a_lightning_callback_and_no_class_is_patched() -> None:
    assert issubclass(tl.TelemetrainCallback, pl.Callback)
    assert tl.TelemetrainCallback is tl.callback_class("lightning.pytorch")
    # what a patching integration would have replaced is Lightning's own
    assert pl.Trainer.fit.__module__ == "lightning.pytorch.trainer.trainer"
    assert pl.LightningModule.optimizer_step.__module__.startswith("lightning.pytorch")


def test_iterations_are_optimizer_steps_and_micro_batches_are_counted(reference: Any) -> None:
    tr, callback, recs = reference
    steps = EPOCHS * STEPS_PER_EPOCH
    assert tr.global_step == steps
    iterations = ends(recs, "training_single_iteration")
    assert len(iterations) == steps  # log_every_n_steps=1: every iteration exported
    assert all(r.status == "ok" and r.attributes["micro_batches"] == ACCUMULATE for r in iterations)
    assert callback.optimizer_steps == steps and callback.micro_batches == steps * ACCUMULATE
    [loop] = ends(recs, "training_loop")
    assert loop.status == "ok" and loop.attributes["micro_batches"] == steps * ACCUMULATE
    final = events(recs, "training_metrics_update")[-1].attributes
    assert final["num_iterations"] == steps and final["current_iteration"] == steps - 1
    # the global batch derived from the Trainer: loader batch x accumulation x world size
    assert final["num_train_samples"] == steps * BATCH * ACCUMULATE
    [config] = events(recs, "update_training_telemetry_config")
    assert config.attributes["global_batch_size"] == BATCH * ACCUMULATE
    assert config.attributes["micro_batch_size"] == BATCH
    assert config.attributes["train_iterations_target"] == steps
    assert config.attributes["log_every_n_train_iterations"] == 1
    # every training iteration is a child of the loop, the loop of the application
    starts = {r.span_id: r for r in recs if r.kind == "span_start"}
    [app] = ends(recs, "application")
    assert app.status == "ok" and app.attributes["lightning_stage"] == "fit"
    assert starts[loop.span_id].parent_id == app.span_id
    assert all(starts[r.span_id].parent_id == loop.span_id for r in iterations)


def test_validation_loops_leave_the_sanity_check_out(reference: Any) -> None:
    _, _, recs = reference
    loops = ends(recs, "validation_loop")
    assert len(loops) == EPOCHS  # the sanity check would be one more
    assert len(ends(recs, "validation_single_iteration")) == EPOCHS * VAL_SAMPLES // BATCH
    updates = events(recs, "validation_metrics_update")
    assert [u.attributes["num_iterations"] for u in updates] == [VAL_SAMPLES // BATCH] * EPOCHS
    assert [u.attributes["interval"] for u in updates] == [STEPS_PER_EPOCH] * EPOCHS


def test_checkpoint_saves_succeed_once_written(reference: Any, tmp_path: Path) -> None:
    _, _, recs = reference
    saves = ends(recs, "checkpoint_save_sync")
    assert len(saves) == EPOCHS and all(r.status == "ok" for r in saves)
    successes = events(recs, "save_checkpoint_success")
    assert [s.attributes["current_iteration"] for s in successes] == [STEPS_PER_EPOCH * (e + 1) for e in range(EPOCHS)]
    for epoch, success in enumerate(successes):
        path = Path(success.attributes["checkpoint_directory"])
        assert path == tmp_path / "ckpt" / f"epoch={epoch}-step={STEPS_PER_EPOCH * (epoch + 1)}.ckpt"
        assert success.attributes["checkpoint_size"] == path.stat().st_size
        assert success.attributes["productive_train_iterations"] == STEPS_PER_EPOCH * (epoch + 1)
    assert not [e for e in events(recs, "error")]
    # each success inside its save span: after the start, before the end
    spans = {r.span_id: r for r in saves}
    for success in successes:
        assert success.span_id in spans
        assert success.mono_ns <= spans[success.span_id].mono_ns


def test_every_span_is_closed(reference: Any) -> None:
    _, callback, recs = reference
    started = {r.span_id for r in recs if r.kind == "span_start"}
    ended = {r.span_id for r in recs if r.kind == "span_end"}
    assert started == ended
    assert callback.failures == 0


# -- failure and recovery -------------------------------------------------------------------------------------------


def test_an_exception_in_training_step_ends_the_spans_with_error_and_the_next_fit_works(
    tmp_path: Path, t: telemetrain.Telemetry
) -> None:
    callback = tl.TelemetrainCallback(telemetry=t, phases=True)
    with pytest.raises(RuntimeError, match="boom"):
        fit(tmp_path / "a", t, callback, Tiny(fail_at_step=3))
    recs = records(t)
    for name in ("application", "training_loop", "training_single_iteration", "model_forward"):
        failed = [r for r in ends(recs, name) if r.status == "error"]
        assert len(failed) == 1, name
        assert failed[0].error == "RuntimeError: boom in training_step"
    assert [r.status for r in ends(recs, "training_single_iteration")] == ["ok"] * 3 + ["error"]
    assert {r.span_id for r in recs if r.kind == "span_start"} == {r.span_id for r in recs if r.kind == "span_end"}

    tr = fit(tmp_path / "b", t, callback)  # the same callback instance, a new Trainer
    recs = records(t)
    apps = ends(recs, "application")
    assert [a.status for a in apps] == ["error", "ok"]
    assert [r.status for r in ends(recs, "training_loop")] == ["error", "ok"]
    assert events(recs, "training_metrics_update")[-1].attributes["num_iterations"] == tr.global_step
    assert callback.failures == 0


def test_a_failing_save_ends_its_span_with_error(tmp_path: Path, t: telemetrain.Telemetry) -> None:
    class Unsavable(Tiny):
        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:  # after the callbacks' hooks
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"), \
            pytest.warns(telemetrain.TelemetryWarning, match="save ended without on_save_checkpoint_success"):
        fit(tmp_path, t, model=Unsavable())
    recs = records(t)
    [save] = ends(recs, "checkpoint_save_sync")
    assert save.status == "error" and save.error == "OSError: disk full"
    assert not events(recs, "save_checkpoint_success")


# -- async saves, loads, validate and test --------------------------------------------------------------------------


def test_async_saves_succeed_after_the_background_write(tmp_path: Path, t: telemetrain.Telemetry) -> None:
    fit(tmp_path, t, plugins=[AsyncCheckpointIO()])
    recs = records(t)
    saves = ends(recs, "checkpoint_save_async")
    assert len(saves) == EPOCHS and all(r.status == "ok" for r in saves)
    assert not ends(recs, "checkpoint_save_sync")
    successes = events(recs, "save_checkpoint_success")
    assert len(successes) == EPOCHS
    for save, success in zip(saves, successes, strict=True):
        assert success.attributes["checkpoint_strategy"] == "async"
        assert success.mono_ns >= save.mono_ns  # the hand-off ends the span; the write finishes after it
        path = Path(success.attributes["checkpoint_directory"])
        assert success.attributes["checkpoint_size"] == path.stat().st_size  # the whole file, written


def test_resuming_records_the_load_and_starts_at_the_saved_step(tmp_path: Path, t: telemetrain.Telemetry) -> None:
    callback = tl.TelemetrainCallback(telemetry=t)
    first = fit(tmp_path / "a", t, callback, max_epochs=1)
    ckpt = Path(first.checkpoint_callback.best_model_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|LeafSpec).*")
        tr = trainer(tmp_path / "b", callback, max_epochs=2)
        tr.fit(Tiny(), loader(TRAIN_SAMPLES), loader(VAL_SAMPLES, seed=1), ckpt_path=ckpt)
    recs = records(t)
    [load] = ends(recs, "checkpoint_load")
    assert load.status == "ok"
    loops = [r for r in recs if r.kind == "span_start" and r.name == "training_loop"]
    assert [r.attributes["train_iterations_start"] for r in loops] == [0, STEPS_PER_EPOCH]
    final = events(recs, "training_metrics_update")[-1].attributes
    assert final["load_checkpoint_count"] == 1 and final["load_checkpoint_size_bytes"] == ckpt.stat().st_size
    assert final["num_iterations"] == STEPS_PER_EPOCH and final["current_iteration"] == 2 * STEPS_PER_EPOCH - 1


def test_validate_and_test_calls(tmp_path: Path, t: telemetrain.Telemetry) -> None:
    callback = tl.TelemetrainCallback(telemetry=t)
    tr = trainer(tmp_path, callback)
    model = Tiny()
    tr.validate(model, loader(VAL_SAMPLES, seed=1), verbose=False)
    tr.test(model, loader(6, seed=2), verbose=False)
    recs = records(t)
    assert [r.attributes["lightning_stage"] for r in ends(recs, "application")] == ["validate", "test"]
    assert len(ends(recs, "validation_loop")) == 1 and len(ends(recs, "validation_single_iteration")) == 2
    assert len(ends(recs, "testing_loop")) == 1 and len(ends(recs, "testing_single_iteration")) == 3
    [update] = events(recs, "testing_metrics_update")
    assert update.attributes["num_iterations"] == 3
    assert not ends(recs, "training_loop")


def test_a_test_call_after_fit_keeps_the_training_workload(tmp_path: Path, t: telemetrain.Telemetry) -> None:
    """The application start of ``trainer.test()`` sends the config again: it still describes the fit's batches
    (the global batch was 0 and the micro-batch gone, erasing the workload from run.json)."""
    import json

    callback = tl.TelemetrainCallback(telemetry=t)
    tr = fit(tmp_path, t, callback, max_epochs=1, enable_checkpointing=False, callbacks=[callback])
    tr.test(tr.lightning_module, loader(4, seed=2), verbose=False)
    configs = events(records(t), "update_training_telemetry_config")
    assert len(configs) >= 2
    assert [c.attributes["global_batch_size"] for c in configs] == [BATCH * ACCUMULATE] * len(configs)
    assert configs[-1].attributes["micro_batch_size"] == BATCH
    assert t.run_dir is not None
    workload = json.loads((t.run_dir / "run.json").read_text())["workload"]
    assert workload["global_batch_size"] == BATCH * ACCUMULATE and workload["micro_batch_size"] == BATCH


def test_phases_split_each_iteration(tmp_path: Path, t: telemetrain.Telemetry) -> None:
    """phases=True: forward, zero_grad and backward per micro-batch, the optimizer update per step, inside it."""
    callback = tl.TelemetrainCallback(telemetry=t, phases=True)
    fit(tmp_path, t, callback, enable_checkpointing=False, callbacks=[callback], limit_val_batches=0,
        num_sanity_val_steps=0)
    recs = records(t)
    steps = EPOCHS * STEPS_PER_EPOCH
    iterations = {r.span_id for r in ends(recs, "training_single_iteration")}
    assert len(iterations) == steps
    starts = {r.span_id: r for r in recs if r.kind == "span_start"}
    # accumulating: zero_grad only in the micro-batch whose step comes next (Lightning zeroes before that backward)
    for name, per_step in (("model_forward", ACCUMULATE), ("model_backward", ACCUMULATE), ("zero_grad", 1),
                           ("optimizer_update", 1)):
        spans = ends(recs, name)
        assert len(spans) == steps * per_step, name
        assert {starts[r.span_id].parent_id for r in spans} == iterations, name
        assert all(r.status == "ok" for r in spans)
    final = events(recs, "training_metrics_update")[-1].attributes
    for phase in ("forward", "backward", "optimizer", "zero_grad"):
        assert final[f"avg_{phase}_time_sec"] > 0, phase
    assert final["avg_forward_time_sec"] + final["avg_backward_time_sec"] < final["avg_iteration_time_sec"]


def test_a_short_last_step_counts_the_samples_it_took(tmp_path: Path, t: telemetrain.Telemetry) -> None:
    """11 samples in batches of 2 (the last one 1), accumulation 2: an epoch's steps take 4, 4 and 3 samples.
    Two epochs count 22 samples, not 6 global batches (24)."""
    callback = tl.TelemetrainCallback(telemetry=t)
    tr = trainer(tmp_path, callback, enable_checkpointing=False, callbacks=[callback], num_sanity_val_steps=0)
    with warnings.catch_warnings():
        # (no validation loader: Lightning says it skips the loop, as this test means it to)
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|LeafSpec|Skipping val).*")
        tr.fit(Tiny(), loader(11))
    assert tr.global_step == 6 and callback.failures == 0
    reports = [e.attributes for e in events(records(t), "training_metrics_update")]
    assert [r["num_train_samples"] for r in reports if not r["final"]] == [4, 8, 11, 15, 19, 22]
    assert reports[-1]["num_train_samples"] == 22


def test_manual_optimization_counts_optimizer_steps(tmp_path: Path, t: telemetrain.Telemetry) -> None:
    """Manual optimization stepping every third batch: an iteration is still an optimizer step."""

    class Manual(Tiny):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.manual_backward(loss)
            if batch_idx % 3 == 2:
                self.optimizers().step()
                self.optimizers().zero_grad()
            return loss

    callback = tl.TelemetrainCallback(telemetry=t)
    tr = fit(tmp_path, t, callback, Manual(), accumulate_grad_batches=1, max_epochs=1, enable_checkpointing=False,
             callbacks=[callback])
    recs = records(t)
    batches = TRAIN_SAMPLES // BATCH
    assert tr.global_step == batches // 3
    iterations = ends(recs, "training_single_iteration")
    assert [r.attributes for r in iterations[:-1]] == [{"micro_batches": 3}] * (batches // 3)
    # the batches after the last step (automatic optimization leaves none) are ended with the loop, flagged
    assert iterations[-1].attributes == {"micro_batches": batches % 3, "optimizer_step": False}
    assert callback.micro_batches == batches and callback.optimizer_steps == batches // 3
    assert events(recs, "training_metrics_update")[-1].attributes["num_iterations"] == batches // 3 + 1


def test_several_trainer_calls_in_one_application(tmp_path: Path, t: telemetrain.Telemetry) -> None:
    from telemetrain.training import TrainingContexts

    recorder = TrainingRecorder(telemetry=t)
    callback = tl.TelemetrainCallback(recorder=recorder, application=False)
    with TrainingContexts(lambda: recorder).application():
        tr = fit(tmp_path, t, callback, max_epochs=1)
        tr.test(Tiny(), loader(4), verbose=False)
    recs = records(t)
    [app] = ends(recs, "application")
    assert app.status == "ok" and "lightning_stage" not in (app.attributes or {})
    starts = {r.span_id: r for r in recs if r.kind == "span_start"}
    loops = {r.span_id for r in ends(recs, "training_loop")}
    # one-logger's parents: what runs inside the training loop (its validation, its saves) is the loop's child
    for name, parents in (("training_loop", {app.span_id}), ("testing_loop", {app.span_id}),
                          ("validation_loop", loops), ("checkpoint_save_sync", loops)):
        spans = ends(recs, name)
        assert spans and all(starts[r.span_id].parent_id in parents for r in spans), name


# -- configuration -----------------------------------------------------------------------------------------------------


def test_overrides_and_an_explicit_config(tmp_path: Path, t: telemetrain.Telemetry) -> None:
    callback = tl.TelemetrainCallback(telemetry=t, global_batch_size=64, seq_length=128, log_every_n_train_iterations=4)
    fit(tmp_path / "a", t, callback)
    update = events(records(t), "training_metrics_update")[0].attributes
    assert update["num_train_samples"] == 4 * 64 and update["train_tokens"] == 4 * 64 * 128

    recorder = TrainingRecorder(telemetry=t)
    config = TrainingTelemetryConfig(global_batch_size_or_fn=10, log_every_n_train_iterations=100)
    fit(tmp_path / "b", t, tl.TelemetrainCallback(config, recorder=recorder))
    assert recorder.config is config
    final = events(records(t), "training_metrics_update")[-1].attributes
    assert final["num_train_samples"] == EPOCHS * STEPS_PER_EPOCH * 10


def test_bad_arguments_raise_naming_them() -> None:
    with pytest.raises(TypeError, match="unknown TrainingTelemetryConfig field 'batch'"):
        tl.TelemetrainCallback(batch=3)
    with pytest.raises(ValueError, match="seq_length_or_fn"):
        tl.TelemetrainCallback(seq_length=0)
    with pytest.raises(TypeError, match="config must be a TrainingTelemetryConfig"):
        tl.TelemetrainCallback({"global_batch_size_or_fn": 1})
    with pytest.raises(ValueError, match="either config or field overrides"):
        tl.TelemetrainCallback(TrainingTelemetryConfig(global_batch_size_or_fn=1), seq_length=3)
    with pytest.raises(ValueError, match="package must be one of"):
        tl.callback_class("keras")


def test_the_pytorch_lightning_name(tmp_path: Path, t: telemetrain.Telemetry) -> None:
    try:
        import pytorch_lightning
    except ImportError:
        with pytest.raises(ImportError):
            tl.callback_class("pytorch_lightning")
        return
    cls = tl.callback_class("pytorch_lightning")
    assert issubclass(cls, pytorch_lightning.Callback)


def test_a_failure_inside_the_callback_never_reaches_training(tmp_path: Path, t: telemetrain.Telemetry) -> None:
    callback = tl.TelemetrainCallback(telemetry=t, global_batch_size=lambda: 1 // 0)  # a user function that raises
    with pytest.warns(telemetrain.TelemetryWarning, match="ZeroDivisionError"):
        tr = fit(tmp_path, t, callback)
    assert tr.global_step == EPOCHS * STEPS_PER_EPOCH
    recs = records(t)
    assert len(ends(recs, "training_single_iteration")) == EPOCHS * STEPS_PER_EPOCH
    assert any("ZeroDivisionError" in e.attributes["error_message"] for e in events(recs, "error"))


def run_example(name: str, tmp_path: Path, *args: str) -> str:
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[1] / "examples" / name
    env = {**os.environ, "TELEMETRAIN_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(example), *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_lightning_example_runs(tmp_path: Path) -> None:
    out = run_example("lightning_fit.py", tmp_path, "--steps", "4")
    assert "optimizer steps: 4" in out and "iterations 4, samples 128" in out
    assert "checkpoint saves that succeeded: 1" in out


def test_the_plain_loop_example_runs(tmp_path: Path) -> None:
    out = run_example("plain_loop.py", tmp_path, "--steps", "20", "--log-every", "10", "--save-every", "10")
    assert "iterations 20" in out and "checkpoint saves that succeeded: 2" in out
    assert "model_forward x" in out and "training_single_iteration x" in out
    (run_dir,) = [line.split(";")[0].removeprefix("wrote ") for line in out.splitlines() if line.startswith("wrote ")]
    losses = [r for r in open_run(run_dir).records("metric") if r.group == "train"]  # the report's loss chart
    assert [(r.name, r.step) for r in losses] == [("train.loss", step) for step in range(20)]
    assert f"20 steps, final loss {losses[-1].value:.4f}" in out
