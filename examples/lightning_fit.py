"""A Lightning ``Trainer.fit`` with ``TelemetrainCallback``: the training lifecycle with no change to the model.

    python examples/lightning_fit.py                   # then: telemetrain show
    python examples/lightning_fit.py --steps 20 --async-checkpoints

A small regression model on synthetic data, gradient accumulation 2 (an iteration is an optimizer step), validation
every epoch (the sanity check is not counted), a checkpoint after each epoch (``--async-checkpoints``: written in the
background by ``AsyncCheckpointIO``; its success is recorded once the file is written), then ``trainer.test``.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from collections import Counter
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from torch.utils.data import DataLoader, TensorDataset

import telemetrain
from telemetrain.integrations.lightning import TelemetrainCallback
from telemetrain.store import open_run


class Regressor(pl.LightningModule):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        return self.validation_step(batch, batch_idx)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(n: int, batch: int, seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)), batch_size=batch)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps (max_steps)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--async-checkpoints", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|LeafSpec).*")
    torch.manual_seed(0)
    callback = TelemetrainCallback(perf_tag="lightning-example")  # everything else derived from the Trainer
    with tempfile.TemporaryDirectory() as ckpt_dir:
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_steps=args.steps, accumulate_grad_batches=2, logger=False,
            enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=10,
            callbacks=[callback, ModelCheckpoint(dirpath=ckpt_dir)],
            plugins=[AsyncCheckpointIO()] if args.async_checkpoints else None,
        )
        model = Regressor()
        # 32 batches an epoch = 16 optimizer steps
        trainer.fit(model, loader(32 * args.batch, args.batch, 0), loader(4 * args.batch, args.batch, 1))
        trainer.test(model, loader(4 * args.batch, args.batch, 2), verbose=False)
    t = telemetrain.get_telemetry()
    t.close()
    summarize(t, trainer.global_step)


def summarize(t: telemetrain.Telemetry, steps: int) -> None:
    assert t.run_dir is not None
    records = open_run(t.run_dir).records()
    spans = Counter(r.name for r in records if r.kind == "span_end")
    print(f"optimizer steps: {steps}")
    print("spans:", ", ".join(f"{name} x{n}" for name, n in sorted(spans.items())))
    reports = [r.attributes for r in records if r.kind == "event" and r.name == "training_metrics_update"]
    if reports:
        last = reports[-1]
        print(f"iterations {last['num_iterations']}, samples {last['num_train_samples']}, "
              f"samples/s {last.get('samples_per_second', 0):.0f}, "
              f"p50 iteration {last.get('p50_iteration_time_sec', 0) * 1e3:.3f} ms")
    saves = [r for r in records if r.kind == "event" and r.name == "save_checkpoint_success"]
    print(f"checkpoint saves that succeeded: {len(saves)}")
    print(f"wrote {t.run_dir}; see it with: telemetrain show {t.run_dir}")


if __name__ == "__main__":
    main()
