"""``integrations.lightning_trainer``: one-logger's ``OneLoggerPTLTrainer`` form, a Lightning ``Trainer`` subclass
with ``TelemetrainCallback`` first in its callbacks (Lightning's own ``Trainer`` is left alone). With a configured
one-logger provider its exporters receive the run in one-logger's spans and events (an iteration per optimizer step,
the checkpoint saves timed from Lightning's hooks) and telemetrain's run store records it; without one, the callback
records to telemetrain's own recorder."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

pl = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch import Tensor  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import telemetrain  # noqa: E402
from _onelogger import Recording, base_config, provider_fixture, training_config  # noqa: E402, F401
from conftest import run_dir_of  # noqa: E402
from telemetrain.integrations import lightning as tl  # noqa: E402
from telemetrain.integrations import lightning_trainer as lt  # noqa: E402
from telemetrain.store import open_run  # noqa: E402
from telemetrain.training import callbacks as cb  # noqa: E402
from telemetrain.training.training_telemetry_provider import TrainingTelemetryProvider  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec"), pytest.mark.filterwarnings("ignore:The dirpath has"),
              pytest.mark.filterwarnings("ignore:.*(num_workers|does not have many workers)")]


class Tiny(pl.LightningModule):  # type: ignore[misc, name-defined]  # (a base from pytest.importorskip's module object: Any to mypy)
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return self.training_step(batch, batch_idx)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader(n: int) -> DataLoader[tuple[Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=2)


def _config(tmp_path: Path) -> dict[str, Any]:
    return dict(accelerator="cpu", devices=1, max_epochs=2, accumulate_grad_batches=2, logger=False,
                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1,
                default_root_dir=tmp_path,
                callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, filename="{epoch}-{step}")])


def test_the_trainer_subclass_adds_the_callback_and_patches_nothing(tmp_path: Path,
                                                                     telemetry: telemetrain.Telemetry) -> None:
    trainer = lt.OneLoggerPTLTrainer(trainer_config=_config(tmp_path))
    assert isinstance(trainer, pl.Trainer) and lt.OneLoggerPTLTrainer is lt.TelemetrainTrainer
    assert isinstance(trainer.callbacks[0], tl.TelemetrainCallback)
    assert trainer.nv_one_logger_callback is trainer.telemetry_callback is trainer.callbacks[0]
    assert not hasattr(pl.Trainer, "nv_one_logger_callback")  # Lightning's class is not touched
    assert any(isinstance(c, ModelCheckpoint) for c in trainer.callbacks)
    with pytest.raises(TypeError, match="trainer_config"):
        lt.OneLoggerPTLTrainer(trainer_config=[("max_epochs", 1)])


def test_a_configured_provider_receives_the_run(provider: TrainingTelemetryProvider, tmp_path: Path,
                                                telemetry: telemetrain.Telemetry) -> None:
    exporter = Recording()
    provider.with_base_config(base_config(telemetry_config=training_config(log_every_n_train_iterations=2)))
    provider.with_exporter(exporter).with_delivery_wait(10).configure_provider()
    trainer = lt.OneLoggerPTLTrainer(trainer_config=_config(tmp_path), training_telemetry_provider=provider)
    assert exporter.named("export_start") == ["application"]  # one-logger's callback starts it when built
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Lightning's own notes on tiny loaders
        trainer.fit(Tiny(), _loader(16), _loader(4))
    cb.on_app_end()  # the program ends the application, as with one-logger
    assert trainer.global_step == 8
    assert exporter.named("export_start").count("training_loop") == 1
    assert exporter.named("export_stop").count("checkpoint_save_sync") == 2  # one save per epoch
    assert len(exporter.events("save_checkpoint_success")) == 2
    assert [e.attributes.to_json()["current_iteration"] for e in exporter.events("training_metrics_update")] == \
        [1, 3, 5, 7]  # an iteration per optimizer step (2 micro-batches each)
    assert exporter.named("export_start").count("validation_loop") == 2  # the sanity check is not one
    assert exporter.methods()[-1] == "close"
    assert telemetry.flush()
    records = open_run(run_dir_of(telemetry)).records()
    assert sum(1 for r in records if r.kind == "span_end" and r.name == "checkpoint_save_sync") == 2
    assert any(r.kind == "span_end" and r.name == "application" for r in records)


def test_a_short_step_reaches_a_provider_that_takes_no_sizes(provider: TrainingTelemetryProvider, tmp_path: Path,
                                                              telemetry: telemetrain.Telemetry) -> None:
    # 15 samples in batches of 2: each epoch's last step takes 3 samples, not 4. telemetrain's recorder is told so;
    # one-logger's callbacks take no sizes: they get the plain call, and the iteration still ends.
    exporter = Recording()
    provider.with_base_config(base_config(telemetry_config=training_config(log_every_n_train_iterations=2)))
    provider.with_exporter(exporter).with_delivery_wait(10).configure_provider()
    trainer = lt.OneLoggerPTLTrainer(trainer_config=_config(tmp_path), training_telemetry_provider=provider)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        trainer.fit(Tiny(), _loader(15), _loader(4))
    cb.on_app_end()
    assert trainer.global_step == 8 and trainer.telemetry_callback.failures == 0
    assert [e.attributes.to_json()["current_iteration"] for e in exporter.events("training_metrics_update")] == \
        [1, 3, 5, 7]


def test_without_a_provider_the_callback_records_to_telemetrains_recorder(tmp_path: Path,
                                                                         telemetry: telemetrain.Telemetry) -> None:
    trainer = lt.OneLoggerPTLTrainer(_config(tmp_path), telemetry_callback=tl.TelemetrainCallback(telemetry=telemetry))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        trainer.fit(Tiny(), _loader(16), _loader(4))
    assert telemetry.flush()
    records = open_run(run_dir_of(telemetry)).records()
    assert sum(1 for r in records if r.kind == "span_end" and r.name == "training_single_iteration") >= 1
    assert sum(1 for r in records if r.kind == "span_end" and r.name == "application") == 1


class _ReadmeModel(Tiny):
    """one-logger's Lightning README: the optimizer's initialisation timed through the trainer's callback."""

    def configure_optimizers(self) -> Any:
        callback = self.trainer.nv_one_logger_callback
        callback.on_optimizer_init_start()
        optimizer = super().configure_optimizers()
        callback.on_optimizer_init_end()
        return optimizer


def test_hook_trainer_cls_and_the_explicit_calls_as_one_loggers_readme_writes_them(
        provider: TrainingTelemetryProvider, tmp_path: Path, telemetry: telemetrain.Telemetry) -> None:
    exporter = Recording()
    provider.with_base_config(base_config(telemetry_config=training_config(log_every_n_train_iterations=2)))
    provider.with_exporter(exporter).with_delivery_wait(10).configure_provider()
    hooked, callback = lt.hook_trainer_cls(pl.Trainer, provider)
    assert issubclass(hooked, pl.Trainer) and not hasattr(pl.Trainer, "nv_one_logger_callback")  # nothing patched
    callback.on_model_init_start()
    model = _ReadmeModel()
    callback.on_model_init_end()
    trainer = hooked(**_config(tmp_path))
    assert trainer.nv_one_logger_callback is callback is trainer.callbacks[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        trainer.fit(model, _loader(8), _loader(4))
    callback.on_testing_start()
    callback.on_testing_end()
    callback.on_app_end()
    assert exporter.methods()[-1] == "close" and "export_error" not in exporter.methods()
    stopped = exporter.named("export_stop")
    assert {"model_initialization", "optimizer_initialization", "testing_loop", "application"} <= set(stopped), stopped
    assert provider.errors == 0 and provider.recorder.errors == 0 and callback.failures == 0
    with pytest.raises(TypeError, match="cls"):
        lt.hook_trainer_cls(dict, provider)


def test_the_explicit_on_app_end_after_fit_without_a_provider_records_no_misuse(
        tmp_path: Path, telemetry: telemetrain.Telemetry) -> None:
    hooked, callback = lt.hook_trainer_cls(pl.Trainer, telemetry_callback=tl.TelemetrainCallback(telemetry=telemetry))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        hooked(**_config(tmp_path)).fit(Tiny(), _loader(8), _loader(4))
    callback.on_app_end()  # the callback ended its application at teardown: nothing left to end
    assert telemetry.flush()
    records = open_run(run_dir_of(telemetry)).records()
    assert not [r for r in records if r.kind == "event" and r.severity == "error"]
    assert sum(1 for r in records if r.kind == "span_end" and r.name == "application") == 1
