"""How a Lightning run ends in MLflow with only ``TelemetrainLogger`` and the MLflow sink: a real ``fit`` in a
subprocess, a real SIGINT (Lightning catches the KeyboardInterrupt and ends in ``sys.exit(1)``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("lightning.pytorch")
pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

_FIT = textwrap.dedent(
    """
    import os, signal, sys, warnings
    import torch
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset
    import telemetrain
    from telemetrain.integrations.lightning_logger import TelemetrainLogger
    from telemetrain.sinks.mlflow import MLflowSink

    uri, how = sys.argv[1], sys.argv[2]
    warnings.filterwarnings("ignore")

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == 2 and how == "ctrl-c":
                os.kill(os.getpid(), signal.SIGINT)  # what a Ctrl-C in the terminal sends
            if batch_idx == 2 and how == "exception":
                raise RuntimeError("the training step failed")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    t = telemetrain.Telemetry(store=False)
    t.add_sink(MLflowSink(uri, experiment_name="lightning", run_name=how))
    data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=TelemetrainLogger(telemetry=t),
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         log_every_n_steps=1)
    trainer.fit(Model(), data)
    """
)


@pytest.mark.parametrize(("how", "status", "returncode"),
                         [("clean", "FINISHED", 0), ("ctrl-c", "KILLED", 1), ("exception", "FAILED", 1)])
def test_a_lightning_run_ends_in_mlflow_as_the_job_did(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str,
                                                       status: str, returncode: int) -> None:
    """Lightning turns a Ctrl-C into ``sys.exit(1)``: the MLflow run said FINISHED, as after a clean fit."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = (tmp_path / "mlruns").as_uri()
    proc = subprocess.run([sys.executable, "-c", _FIT, uri, how], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == returncode, proc.stderr
    client = MlflowClient(uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "lightning"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == how and run.info.status == status
    losses = client.get_metric_history(run.info.run_id, "train_loss")
    assert len(losses) == (8 if how == "clean" else 2)  # the steps before the interrupt are there
