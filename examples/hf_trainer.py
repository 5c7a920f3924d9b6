#!/usr/bin/env python3
"""A Hugging Face ``Trainer`` with telemetrain: a tiny GPT-2 built from a config (nothing downloaded) trained on
synthetic tokens on the CPU, with gradient accumulation, evaluation and checkpoints; ``TelemetrainHFCallback`` records
the lifecycle (iterations = optimizer steps, evaluation loops, checkpoint saves, the Trainer's logs as metrics) into
the run store (``$TELEMETRAIN_DIR``, else ``./telemetrain-runs``). At the end the run is read back and summarised.

    python examples/hf_trainer.py --steps 20
    telemetrain report <the run directory printed at the end>     # (the HTML report, if installed)
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is built locally
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import telemetrain
from telemetrain.integrations.hf import TelemetrainHFCallback
from telemetrain.store import open_run


class RandomTokens(torch.utils.data.Dataset):
    """Fixed random token sequences, each its own label (a causal LM's loss)."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int) -> None:
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps")
    ap.add_argument("--output-dir", help="the Trainer's checkpoints (default: a temporary folder)")
    args = ap.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    n_params = sum(p.numel() for p in model.parameters())
    seq = 32

    # Everything the callback cannot see (here: FLOPs per sample, ~6 x parameters x tokens) goes in as an override
    callback = TelemetrainHFCallback(flops_per_sample=6 * n_params * seq, perf_tag="gpt2-tiny-example")
    with tempfile.TemporaryDirectory() as tmp:
        training_args = TrainingArguments(
            output_dir=args.output_dir or tmp, max_steps=args.steps, per_device_train_batch_size=8,
            per_device_eval_batch_size=8, gradient_accumulation_steps=2, eval_strategy="steps",
            eval_steps=max(args.steps // 2, 1), save_steps=max(args.steps // 2, 1), logging_steps=5, report_to=[],
            use_cpu=True, disable_tqdm=True, seed=0,
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=RandomTokens(512, seq, 128, 0),
                          eval_dataset=RandomTokens(32, seq, 128, 1), callbacks=[callback])
        with callback.guard():  # an exception would end the open spans with status error, then go on
            trainer.train()

    telemetry = telemetrain.get_telemetry()
    telemetry.flush()
    run_dir = telemetry.run_dir
    records = open_run(run_dir).records()
    print(f"\nrun store: {run_dir}")
    spans = Counter((r.name, r.status) for r in records if r.kind == "span_end")
    print("spans (name, status: count): " + ", ".join(f"{n} {s}: {c}" for (n, s), c in sorted(spans.items())))
    report = [r.attributes for r in records if r.kind == "event" and r.name == "training_metrics_update"][-1]
    saves = sum(1 for r in records if r.kind == "event" and r.name == "save_checkpoint_success")
    print(f"iterations (optimizer steps): {report['num_iterations']}, micro-batches: {callback.micro_batches}, "
          f"mean iteration over the run (after warm-up): {report['cumulative_avg_iteration_time_sec'] * 1e3:.1f} ms, "
          f"checkpoints saved: {saves}")
    # the report's throughput is its window's (the last log_every iterations), not the whole run's as HF's
    # train_samples_per_second above, which also counts evaluation and checkpoint time
    print(f"throughput in the last report window ({report['window_iterations']} iterations, training time only): "
          f"{report['samples_per_second']:.1f} samples/s, {report['tokens_per_second']:.0f} tokens/s, "
          f"{report['train_throughput_per_gpu']:.4f} TFLOP/s per GPU")
    losses = [(r.step, r.value) for r in records if r.kind == "metric" and r.group == "hf" and r.name == "loss"]
    print("loss by step: " + ", ".join(f"{step}: {value:.3f}" for step, value in losses))
    telemetrain.reset()  # close the default instance: everything is on disk


if __name__ == "__main__":
    main()
