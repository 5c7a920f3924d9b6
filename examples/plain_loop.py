"""A plain PyTorch training loop (no framework) with telemetrain's training lifecycle around it.

    python examples/plain_loop.py                      # then: telemetrain show
    python examples/plain_loop.py --steps 50 --no-telemetry

Each phase is a context manager of ``telemetrain.training`` (nv-one-logger's names): the iteration and its data
loading, zero_grad, forward, backward and optimizer step; a checkpoint save every ``--save-every`` steps. From them
come the derived metrics (iteration time percentiles, samples/s, TFLOP/s, the phase split) every ``--log-every``
steps and at the end; the loop logs its loss every step (``train.loss``, as the demo does: the report's loss chart).
``--no-telemetry`` runs the same loop bare (the comparison in bench/bench_lightning.py).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path
from typing import Any

import torch

import telemetrain
from telemetrain import training
from telemetrain.training.flops import flops_per_sample


def build(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def batches(batch: int) -> Any:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64 * batch, 16, generator=g), torch.randn(64 * batch, 1, generator=g)
    while True:
        for i in range(0, len(x), batch):
            yield x[i:i + batch], y[i:i + batch]


def train(steps: int, batch: int, width: int, log_every: int, save_every: int, ckpt_dir: Path,
          telemetry: bool = True) -> float:
    """The loop; returns the last loss. Without ``telemetry`` every context manager is a no-op."""
    torch.manual_seed(0)
    tm: Any = training if telemetry else _Bare()
    with tm.model_init():
        model, optimizer = build(width)
    data = batches(batch)
    if telemetry:
        x, y = next(batches(batch))
        training.configure(training.TrainingTelemetryConfig(
            global_batch_size_or_fn=batch, log_every_n_train_iterations=log_every, perf_tag_or_fn="plain-loop",
            flops_per_sample_or_fn=flops_per_sample(model, x, loss_fn=lambda out: torch.nn.functional.mse_loss(out, y)),
        ))
    loss = torch.zeros(())
    with tm.training_loop(train_iterations_start=0):
        for step in range(steps):
            with tm.training_iteration():
                with tm.data_loading():
                    x, y = next(data)
                with tm.zero_grad():
                    optimizer.zero_grad()
                with tm.forward():
                    loss = torch.nn.functional.mse_loss(model(x), y)
                with tm.backward():
                    loss.backward()
                with tm.optimizer_update():
                    optimizer.step()
            if telemetry:  # at the iteration's step (zero-based, as the recorder counts): the report charts it by step
                # telemetrain takes numbers, not tensors: .item() is the caller's (it waits for a GPU; here a CPU)
                telemetrain.log({"train.loss": loss.item()}, step=step, group="train")
            if save_every and (step + 1) % save_every == 0:
                path = ckpt_dir / f"step-{step + 1}.pt"
                with tm.checkpoint_save(global_step=step, path=path):
                    torch.save({"model": model.state_dict(), "step": step + 1}, path)
    return float(loss.detach())


class _Bare:
    """The same calls as ``telemetrain.training``, doing nothing (the loop without telemetry)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: contextlib.nullcontext()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--no-telemetry", dest="telemetry", action="store_false")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as ckpt_dir:
        if not args.telemetry:
            loss = train(args.steps, args.batch, args.width, args.log_every, args.save_every, Path(ckpt_dir), False)
            print(f"{args.steps} steps, final loss {loss:.4f} (no telemetry)")
            return
        with training.application():
            loss = train(args.steps, args.batch, args.width, args.log_every, args.save_every, Path(ckpt_dir))
    t = telemetrain.get_telemetry()
    t.close()
    print(f"{args.steps} steps, final loss {loss:.4f}")
    summarize(t)


def summarize(t: telemetrain.Telemetry) -> None:
    """What the run store holds: the spans by name, the last metrics report."""
    from collections import Counter

    from telemetrain.store import open_run

    assert t.run_dir is not None
    records = open_run(t.run_dir).records()
    spans = Counter(r.name for r in records if r.kind == "span_end")
    print("spans:", ", ".join(f"{name} x{n}" for name, n in sorted(spans.items())))
    reports = [r.attributes for r in events_named(records, "training_metrics_update")]
    if reports:
        last = reports[-1]
        print(f"iterations {last['num_iterations']}, samples/s {last.get('samples_per_second', 0):.0f}, "
              f"p50 iteration {last.get('p50_iteration_time_sec', 0) * 1e3:.3f} ms, "
              f"TFLOP/s {last.get('train_throughput_per_gpu', 0):.4f}")
    saves = len(events_named(records, "save_checkpoint_success"))
    print(f"checkpoint saves that succeeded: {saves}")
    print(f"wrote {t.run_dir}; see it with: telemetrain show {t.run_dir}")


def events_named(records: list[Any], name: str) -> list[Any]:
    return [r for r in records if r.kind == "event" and r.name == name]


if __name__ == "__main__":
    main()
