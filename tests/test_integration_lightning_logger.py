"""``TelemetrainLogger``: a real Lightning ``fit`` whose LightningModule logs with ``self.log``/``self.log_dict`` and
``save_hyperparameters()``, read back from the run store and the HTML report -- the logger alone, and with the
lifecycle callback."""

from __future__ import annotations

import argparse
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest

pl = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

from torch import Tensor  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import telemetrain  # noqa: E402
from telemetrain.integrations import lightning as tl  # noqa: E402
from telemetrain.integrations import lightning_logger  # noqa: E402
from telemetrain.report import write_report  # noqa: E402
from telemetrain.report.model import build_model  # noqa: E402
from telemetrain.store import open_run  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec")]

EPOCHS, BATCH, TRAIN_SAMPLES, VAL_SAMPLES = 2, 4, 16, 8
STEPS = EPOCHS * TRAIN_SAMPLES // BATCH


class Logged(pl.LightningModule):  # type: ignore[misc, name-defined]  # (a base from pytest.importorskip's module object: Any to mypy)
    """A linear regression that logs what users log: a loss per step, a validation loss and accuracy per epoch, and
    its hyperparameters."""

    def __init__(self, lr: float = 0.05, hidden: int = 4, optimizer: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        self.log_dict({"lr": self.hparams.lr, "batch_index": float(batch_idx)})
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("val_loss", loss, on_epoch=True)
        self.log("val_acc", (loss < 10).float(), on_epoch=True)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def _loader(n: int, seed: int) -> DataLoader[tuple[Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=BATCH)


def _fit(tmp_path: Path, logger: Any, callbacks: list[Any]) -> Any:
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=EPOCHS, logger=logger, callbacks=callbacks,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         log_every_n_steps=1, num_sanity_val_steps=0, default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|LeafSpec).*")
        trainer.fit(Logged(optimizer={"name": "sgd", "momentum": 0.0}), _loader(TRAIN_SAMPLES, 0),
                    _loader(VAL_SAMPLES, 1))
    return trainer


def _metrics(records: list[Any], name: str) -> list[Any]:
    return [r for r in records if r.kind == "metric" and r.name == name]


def test_a_real_lightning_logger() -> None:
    logger = lightning_logger.TelemetrainLogger(telemetry=telemetrain.Telemetry(store=False))
    assert isinstance(logger, pl.loggers.Logger)
    assert logger.name == "telemetrain" and logger.version == logger.experiment.identity.run_id
    assert lightning_logger.logger_class("lightning.pytorch") is type(logger)
    with pytest.raises(ValueError, match="package"):
        lightning_logger.logger_class("keras")
    with pytest.raises(TypeError, match="telemetry"):
        lightning_logger.TelemetrainLogger(telemetry="nope")
    logger.experiment.close()  # type: ignore[attr-defined]  # (the type() check above narrowed it to object)


def test_self_log_and_save_hyperparameters_reach_the_store_and_the_report(tmp_path: Path) -> None:
    """The logger alone: every self.log value at Lightning's step, the hyperparameters as one event."""
    t = telemetrain.Telemetry(store=tmp_path / "runs")
    try:
        _fit(tmp_path, lightning_logger.TelemetrainLogger(telemetry=t), [])
        assert t.run_dir is not None
        records = open_run(t.run_dir).records()
    finally:
        t.close()
    train_loss = _metrics(records, "train_loss")
    assert [r.step for r in train_loss] == list(range(STEPS))  # log_every_n_steps=1: every optimizer step
    assert all(r.group == "default" and isinstance(r.value, float) for r in train_loss)
    assert [r.value for r in _metrics(records, "lr")] == [pytest.approx(0.05)] * STEPS  # float32 in Lightning
    val = _metrics(records, "val_loss")
    assert len(val) == EPOCHS and [r.step for r in val] == [STEPS // EPOCHS - 1, STEPS - 1]  # after each epoch
    assert len(_metrics(records, "val_acc")) == EPOCHS
    (hparams,) = [r for r in records if r.kind == "event" and r.name == "hyperparameters"]
    assert hparams.group == "run"
    assert hparams.attributes == {"lr": 0.05, "hidden": 4, "optimizer.name": "sgd", "optimizer.momentum": 0.0}

    model = build_model(open_run(t.run_dir))
    assert model.metric_stats[("default", "train_loss")][0] == STEPS
    assert model.hyperparameters["optimizer.name"] == "sgd"
    html = write_report(t.run_dir, tmp_path / "report.html").read_text()
    assert "train_loss" in html and "val_acc" in html and "optimizer.momentum" in html


def test_with_the_callback_the_lifecycle_and_the_values_share_one_run(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=tmp_path / "runs")
    try:
        _fit(tmp_path, lightning_logger.TelemetrainLogger(telemetry=t), [tl.TelemetrainCallback(telemetry=t)])
        assert t.run_dir is not None
        records = open_run(t.run_dir).records()
    finally:
        t.close()
    iterations = [r for r in records if r.kind == "metric" and r.name == "train.iterations"]
    assert iterations and iterations[-1].value == STEPS
    # the derived metrics and self.log's values on one axis: the report after iteration N (0-based) is at step N,
    # and Lightning logs the loss of that iteration at step N too
    last_report = iterations[-1].step
    assert last_report == STEPS - 1 and _metrics(records, "train_loss")[-1].step == last_report
    assert [r for r in records if r.kind == "event" and r.name == "hyperparameters"]
    assert [r for r in records if r.kind == "span_end" and r.name == "training_loop"]


class TypedArgs(argparse.Namespace):
    """A typed namespace, as argparse users (and jsonargparse, LightningCLI's parser) subclass it."""

    lr: float


def test_log_hyperparams_takes_any_argparse_namespace(tmp_path: Path) -> None:
    """Lightning's loggers take any argparse.Namespace (isinstance): a subclass, at the top or nested, too."""
    t = telemetrain.Telemetry(store=tmp_path / "runs")
    try:
        logger = lightning_logger.TelemetrainLogger(telemetry=t)
        logger.log_hyperparams(TypedArgs(lr=0.1, optimizer=TypedArgs(name="sgd")))
        logger.finalize("success")
        assert t.run_dir is not None
        (hparams,) = [r for r in open_run(t.run_dir).records() if r.kind == "event" and r.name == "hyperparameters"]
    finally:
        t.close()
    assert hparams.attributes == {"lr": 0.1, "optimizer.name": "sgd"}


def test_a_logger_given_a_telemetry_refuses_pickling_naming_the_argument(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """What ddp_spawn does to loggers: a given Telemetry cannot go (a TypeError naming it); the default one is left
    behind, to be made again where the logger is unpickled."""
    t = telemetrain.Telemetry(store=False)
    try:
        with pytest.raises(TypeError, match="telemetry"):
            pickle.dumps(lightning_logger.TelemetrainLogger(telemetry=t))
    finally:
        t.close()
    monkeypatch.setenv("TELEMETRAIN_DIR", str(tmp_path))
    try:
        logger = lightning_logger.TelemetrainLogger()
        assert logger.experiment is telemetrain.get_telemetry()  # made
        copy = pickle.loads(pickle.dumps(logger))
        assert copy._telemetry is None and copy.experiment is telemetrain.get_telemetry()
    finally:
        telemetrain.reset()
