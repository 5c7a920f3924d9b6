"""bench_gpu.py's training run: the small GPT and its job, the recorders check C and the FLOPs probe use, and the
run under a ``TrainingRecorder`` with CUDA device timing that checks F, A and B read."""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from typing import Any

from _gpu_results import RESULTS, log

PHASES = ("forward", "backward", "optimizer", "zero_grad")
SPAN_OF = {"forward": "model_forward", "backward": "model_backward", "optimizer": "optimizer_update",
           "zero_grad": "zero_grad"}


# -- the model ---------------------------------------------------------------------------------------------------------


def build_gpt(torch: Any, layers: int, d: int, heads: int, vocab: int, seq: int) -> Any:
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):  # type: ignore[misc, name-defined]  # (a base from the torch passed in: Any to mypy)
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):  # type: ignore[misc, name-defined]  # (a base from the torch passed in: Any to mypy)
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, idx: Any) -> Any:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return GPT()


class Job:
    """The model, its optimizer and one instrumented step."""

    def __init__(self, torch: Any, args: argparse.Namespace, recorder: Any) -> None:
        self.torch = torch
        self.args = args
        self.recorder = recorder
        self.model = build_gpt(torch, args.layers, args.d, args.heads, args.vocab, args.seq).cuda()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.params = sum(p.numel() for p in self.model.parameters())
        gen = torch.Generator(device="cuda")
        gen.manual_seed(0)
        self.batches = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), device="cuda", generator=gen)
                        for _ in range(8)]
        self.k = 0

    def loss(self, batch: Any) -> Any:
        F = self.torch.nn.functional
        with self.torch.autocast("cuda", dtype=self.torch.bfloat16):
            logits = self.model(batch[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    def step(self, annotate: bool = False) -> Any:
        """One training step: zero_grad, forward, backward, optimizer, each a device-timed phase. No sync."""
        torch, r = self.torch, self.recorder
        rf = torch.profiler.record_function if annotate else (lambda name: contextlib.nullcontext())
        batch = self.batches[self.k % len(self.batches)]
        self.k += 1
        r.on_training_single_iteration_start()
        with r.zero_grad(), rf("zero_grad"):
            self.opt.zero_grad(set_to_none=True)
        with r.forward(), rf("model_forward"):
            loss = self.loss(batch)
        with r.backward(), rf("model_backward"):
            loss.backward()
        with r.optimizer_update(), rf("optimizer_update"):
            self.opt.step()
        r.on_training_single_iteration_end()
        return loss


def make_recorder_in(args: argparse.Namespace, out_dir: Path) -> Any:
    """A factory of started recorders, each in its own store under ``out_dir`` (check C's rows, the FLOPs probe)."""
    import telemetrain
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    def make_recorder(mode: Any, run_id: str, every: int | str = 1) -> Any:
        t = telemetrain.Telemetry(store=out_dir / run_id)
        config = TrainingTelemetryConfig(global_batch_size_or_fn=args.batch, seq_length_or_fn=args.seq,
                                         log_every_n_train_iterations=1000, device_timing=mode,
                                         device_timing_every=every)
        r = TrainingRecorder(config, telemetry=t)
        r.on_app_start()
        r.on_train_start(0)
        return r

    return make_recorder


def train(torch: Any, args: argparse.Namespace, t: Any, out_dir: Path, run: dict[str, Any]) -> None:
    """FLOPs per sample measured once, then ``--steps`` steps (after 5 of warm-up) under a recorder of ``t``; fills
    ``run`` with what F, A and B need."""
    from telemetrain.store import open_run
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
    from telemetrain.training.device_spans import timer_of
    from telemetrain.training.flops import flops_per_sample

    probe = Job(torch, args, make_recorder_in(args, out_dir)("host", "probe"))
    fps = flops_per_sample(probe.model, probe.batches[0][:, :-1])
    # 6 N T over the parameters that multiply (not the embeddings' lookups) + 12 L T^2 d for attention (the T x T
    # scores in full, as FlopCounterMode counts scaled_dot_product_attention, causal or not)
    hand_fps = 6 * (probe.params - args.vocab * args.d - args.seq * args.d) * args.seq \
        + 12 * args.layers * args.seq * args.seq * args.d
    log(f"model: {probe.params / 1e6:.1f} M parameters; FLOPs per sample: FlopCounterMode {fps:.4g}, "
        f"hand {hand_fps:.4g}")
    RESULTS["flops_per_sample"] = {"flop_counter": fps, "hand": hand_fps}
    del probe
    config = TrainingTelemetryConfig(global_batch_size_or_fn=args.batch, seq_length_or_fn=args.seq,
                                     flops_per_sample_or_fn=fps, log_every_n_train_iterations=50,
                                     warmup_iterations=5, device_timing="cuda", dtype="bfloat16",
                                     device_timing_every=1)  # check A compares every profiled step
    recorder = TrainingRecorder(config, telemetry=t)
    recorder.on_app_start()
    recorder.on_train_start(0)
    job = Job(torch, args, recorder)
    timer, reason = timer_of(t, "cuda")
    if timer is None:
        raise RuntimeError(f"no device timer: {reason}")
    for _ in range(5):  # warm-up (the recorder's warm-up iterations)
        job.step()
    torch.cuda.synchronize()
    w0 = time.perf_counter()
    for _ in range(args.steps):
        job.step()
    torch.cuda.synchronize()
    steady_s = time.perf_counter() - w0
    recorder.on_train_end()
    t.flush()
    assert t.run_dir is not None  # made with store=
    updates = [e.attributes for e in open_run(t.run_dir).records("event") if e.name == "training_metrics_update"]
    if not updates:
        raise RuntimeError("the training run recorded no training_metrics_update")
    last = updates[-1]
    log(f"training: {args.steps} steps in {steady_s:.2f} s; last report: device iteration "
        f"{last.get('avg_iteration_device_time_sec')}, host {last.get('avg_iteration_time_sec')}, stall "
        f"{last.get('avg_stall_time_sec')}, energy/sample {last.get('energy_per_sample_J')}")
    RESULTS["training"] = {"ok": True, "detail": f"{args.steps} steps in {steady_s:.2f} s", "steps": args.steps,
                           "seconds": steady_s, "last_report": last}
    run.update(last=last, hand_tflops=hand_fps * args.batch * args.steps / steady_s / 1e12, recorder=recorder,
               job=job, timer=timer)
