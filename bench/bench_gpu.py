#!/usr/bin/env python3
"""GPU truth: the checks of issue 18 item 5, on a real CUDA device, in one command (~1-2 min on an H100/H200).

    python bench/bench_gpu.py [--steps 300] [--json results.json]

A small GPT (pure torch, random tokens generated on the device: nothing is downloaded), bf16 autocast, fused AdamW,
trained ``--steps`` steps under a ``TrainingRecorder`` with ``device_timing="cuda"`` and the system sampler on. Checks:

  A  device phase times against torch.profiler: for ``--profile-steps`` steps profiled with CUDA activity, each
     phase's device time (our CUDA events) against the sum of the kernels launched inside that phase (the profiler's
     kernel records, attributed to a phase by the time of their launch, whatever the launching thread: backward
     kernels are launched by autograd's device thread). Pass: within 10% per phase (phases under 2% of the step are
     shown, not judged).
  B  no added sync: ``torch.cuda.set_sync_debug_mode("error")`` around instrumented steps that themselves never sync
     (a control step with ``.item()`` must raise, proving the mode is armed); and an instrumented step captured into a
     CUDA graph (a sync, or an event recorded on the capturing stream, would break the capture); and a ``global``-mode
     capture while another thread resolves marks, as the collector thread may.
  C  host cost of device timing: training-thread CPU time of an iteration with 5 phases and empty bodies, device
     timing on against off, blocks interleaved; the difference per iteration. Goal: <= 10 us, judged at the default
     (``device_timing_every="auto"``: one iteration in 8); every iteration timed, 1 in 4 and torch's path reported.
  D  NVML against nvidia-smi: the sampler's values and ``nvidia-smi --query-gpu`` read back to back, idle and busy.
  E  the energy counter: monotonic over readings 50 ms apart under load, and the joules it counts against the
     integral of the power readings taken alongside (within 25%: the power reading is an average the driver keeps).
  F  MFU: the recorder's cumulative MFU (flops_per_sample from FlopCounterMode, peak from training.flops' table)
     against a hand computation: 6 N T + 12 L T^2 d FLOPs per sequence, the steady loop's wall time measured here
     around synchronised steps, and the datasheet's dense bf16 peak of the device typed in below. Pass: within 10%,
     and the table knows the device.

``--bookkeeping`` (no GPU needed): check C's rows with a clock whose marks cost nothing, so only our own Python
bookkeeping is measured (every iteration timed, the default, an iteration left untimed).

Each check runs isolated: one that raises fails with its traceback and the others still run (a failed training
run fails F, A and B, named, and D, E, C still run); ``--json`` is rewritten after every check and holds
``{"skipped": why}`` without CUDA. D without ``nvidia-smi`` on PATH fails, NVML's values recorded uncompared.
Exit status: 0 when every check passed, 1 when one failed, 2 without CUDA (nothing measured). BENCHMARKS.md, "GPU
truth", holds the results of the runs made so far and the exact command.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# dense bf16 tensor peak per GPU (TFLOP/s): the datasheets print the sparse figure, "1/2 lower without sparsity".
# https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM 1,979*, PCIe 1,513*, NVL 1,671*),
# https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM 1,979*)
DATASHEET_BF16_SPARSE = {"H100 SXM": 1979.0, "H100 PCIe": 1513.0, "H100 NVL": 1671.0, "H200 SXM": 1979.0}
PHASES = ("forward", "backward", "optimizer", "zero_grad")
SPAN_OF = {"forward": "model_forward", "backward": "model_backward", "optimizer": "optimizer_update",
           "zero_grad": "zero_grad"}
RESULTS: dict[str, Any] = {}
JSON_PATH: list[Path] = []  # where --json writes; rewritten after every check, so a crash keeps what was measured


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def check(name: str, ok: bool, detail: str, **values: Any) -> None:
    RESULTS[name] = {"ok": ok, "detail": detail, **values}
    log(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}")
    for path in JSON_PATH:
        path.write_text(json.dumps(RESULTS, indent=1, default=str))


def guarded(name: str, run: Any) -> None:
    """Runs one check; an exception fails that check, with its traceback, and the next check still runs (a lent GPU's
    minutes are few: one broken check must not cost the others' numbers)."""
    try:
        run()
    except Exception as exc:  # noqa: BLE001 - the check's failure, recorded
        import traceback

        check(name, False, f"raised {type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        log(traceback.format_exc())


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


# -- A: device phases against the profiler -----------------------------------------------------------------------------


def kernel_times_by_phase(trace: dict[str, Any]) -> dict[str, float]:
    """Seconds of device work per phase: each kernel/memcpy/memset is attributed to the phase (a CPU user annotation)
    during which it was launched (its runtime call, matched by correlation id)."""
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    launches: dict[int, float] = {}
    phases: list[tuple[float, float, str]] = []
    device: list[tuple[int, float]] = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        args = e.get("args") or {}
        if cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches[int(args["correlation"])] = float(e["ts"])
        elif cat == "user_annotation" and e.get("name") in SPAN_OF.values():
            phases.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"]))
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" in args:
            device.append((int(args["correlation"]), float(e.get("dur", 0))))
    out = {p: 0.0 for p in PHASES}
    phase_of = {v: k for k, v in SPAN_OF.items()}
    phases.sort()
    for corr, dur in device:
        ts = launches.get(corr)
        if ts is None:
            continue
        for start, end, name in phases:
            if start <= ts <= end:
                out[phase_of[name]] += dur / 1e6
                break
    return out


def check_a(torch: Any, job: Job, timer: Any, steps: int, out_dir: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    # the same number of steps without the profiler first: the profiler slows the host's launches, and where the host
    # then falls behind the device, the device idles inside a phase -- time our events rightly count and the kernels'
    # sum does not (the batch is sized so that the device stays ahead: --batch)
    torch.cuda.synchronize()
    timer.resolve(0.5)
    timer.take_window()
    for _ in range(steps):
        job.step()
    torch.cuda.synchronize()
    timer.resolve(1.0)
    plain = timer.take_window()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            job.step(annotate=True)
        torch.cuda.synchronize()
    timer.resolve(1.0)
    window = timer.take_window()
    path = out_dir / "profile.json"
    prof.export_chrome_trace(str(path))
    kernels = kernel_times_by_phase(json.loads(path.read_text()))
    ours = {p: window.phases.get(p, 0.0) for p in PHASES}
    iteration = window.iteration_sum / max(window.steady, 1) * steps if window.steady else sum(ours.values())
    rows = {}
    ok = window.iterations == steps
    for p in PHASES:
        a, b = ours[p], kernels[p]
        judged = b >= 0.02 * iteration
        ratio = a / b if b > 0 else math.nan
        rows[p] = {"device_events_s": a, "profiler_kernels_s": b, "ratio": ratio, "judged": judged,
                   "device_events_unprofiled_s": plain.phases.get(p, 0.0)}
        if judged and not abs(ratio - 1) <= 0.10:
            ok = False
    detail = "; ".join(f"{p} {r['device_events_s'] * 1e3 / steps:.3f} ms vs {r['profiler_kernels_s'] * 1e3 / steps:.3f}"
                       f" ms ({r['ratio']:.3f}{'' if r['judged'] else ', not judged'}; unprofiled "
                       f"{r['device_events_unprofiled_s'] * 1e3 / max(plain.iterations, 1):.3f} ms)"
                       for p, r in rows.items())
    check("A_phases_vs_profiler", ok, f"{steps} steps, {window.iterations} timed: {detail}", phases=rows,
          timed=window.iterations, steps=steps)


# -- B: no added sync --------------------------------------------------------------------------------------------------


def check_b(torch: Any, job: Job, timer: Any) -> None:
    armed = False
    torch.cuda.set_sync_debug_mode("error")
    try:
        try:
            job.loss(job.batches[0]).item()  # the control: a sync must raise
        except RuntimeError:
            armed = True
        error = ""
        try:
            for _ in range(20):
                job.step()
                with job.recorder.tracer.span("device_span_check", device=True):
                    job.batches[0].float().sum()
        except RuntimeError as exc:
            error = str(exc)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    # the mode is process-wide: a sync in the collector thread's resolution would raise there, contained, and turn
    # device timing off
    check("B1_no_sync_debug_mode", armed and not error and timer.enabled,
          "20 instrumented steps under set_sync_debug_mode('error'): " + (f"raised {error!r}" if error else "no sync")
          + ("" if armed else "; the control .item() did NOT raise: the mode is not armed")
          + ("" if timer.enabled else f"; device timing turned OFF: {timer.failure}"), armed=armed)
    # an instrumented step captured into a CUDA graph: the capture fails on a sync, and the timer records nothing
    x = torch.randn(1024, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            x @ w
    torch.cuda.current_stream().wait_stream(stream)
    before = timer.take_window()
    graph = torch.cuda.CUDAGraph()
    error = ""
    try:
        with torch.cuda.graph(graph):
            job.recorder.on_training_single_iteration_start()
            with job.recorder.forward():
                y = x @ w
            job.recorder.on_training_single_iteration_end()
        graph.replay()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the check's failure
        error = f"{type(exc).__name__}: {exc}"
    after = timer.take_window()
    check("B2_graph_capture", not error and after.captured >= 1 and bool(torch.isfinite(y).all()),
          f"instrumented step captured and replayed: {error or 'ok'}; iterations begun while capturing "
          f"{after.captured} (not timed, counted)", captured=after.captured, unresolved_before=before.unresolved)
    # a global-mode capture (torch.cuda.graph's default) while another thread resolves pending marks, as the
    # collector thread may: the reads run in relaxed capture mode, so the capture must survive them
    import threading

    for _ in range(5):
        job.step()  # marks pending (no sync)
    stop = threading.Event()
    passes = [0]

    def resolve() -> None:
        while not stop.is_set():
            timer.resolve()
            passes[0] += 1

    worker = threading.Thread(target=resolve)
    graph2 = torch.cuda.CUDAGraph()
    error = ""
    worker.start()
    try:
        with torch.cuda.graph(graph2):
            z = x
            for _ in range(300):
                z = (z @ w).clamp_(-1, 1)
    except Exception as exc:  # noqa: BLE001 - the check's failure
        error = f"{type(exc).__name__}: {exc}"
    finally:
        stop.set()
        worker.join()
    if not error:
        graph2.replay()
        torch.cuda.synchronize()
    check("B3_capture_with_concurrent_resolution", not error and timer.enabled and passes[0] > 0,
          f"global-mode capture of 300 matmuls while another thread ran {passes[0]} resolution passes: "
          f"{error or 'capture ok'}; device timing {'on' if timer.enabled else 'OFF: ' + timer.failure}",
          passes=passes[0])


# -- C: host cost ------------------------------------------------------------------------------------------------------


def empty_iterations(r: Any, n: int) -> float:
    t0 = time.thread_time_ns()
    for _ in range(n):
        r.on_training_single_iteration_start()
        with r.data_loading():
            pass
        with r.forward():
            pass
        with r.backward():
            pass
        with r.optimizer_update():
            pass
        with r.zero_grad():
            pass
        r.on_training_single_iteration_end()
    return (time.thread_time_ns() - t0) / n / 1e3


def interleaved_blocks(rows: dict[str, Any], blocks: int, n: int) -> dict[str, list[float]]:
    """Each recorder's CPU us per empty iteration, ``blocks`` blocks of ``n`` each, after a warm-up of 500:
    interleaved, the order rotated from block to block."""
    for r in rows.values():
        empty_iterations(r, 500)
    times: dict[str, list[float]] = {k: [] for k in rows}
    order = list(rows)
    for i in range(blocks):
        for k in order[i % len(order):] + order[:i % len(order)]:
            times[k].append(empty_iterations(rows[k], n))
    return times


def per_call_us(fn: Any, args: tuple[Any, ...], n: int = 10_000) -> float:
    """Training-thread CPU microseconds of one ``fn(*args)``, the loop's own cost taken off."""
    def loop(f: Any) -> float:
        t0 = time.thread_time_ns()
        for _ in range(n):
            f(*args)
        return (time.thread_time_ns() - t0) / n / 1e3
    return max(loop(fn) - loop(lambda *a: None), 0.0)


def check_c(torch: Any, make_recorder: Any, blocks: int, n: int) -> None:
    from telemetrain.training.device_clock import CudaClock

    raw = CudaClock(torch)
    rows = {"raw": make_recorder(raw, "cost-raw"), "torch": make_recorder(CudaClock(torch, raw=False), "cost-torch"),
            "off": make_recorder("host", "cost-off"), "raw_every_4": make_recorder(CudaClock(torch), "cost-every4", 4),
            "auto": make_recorder(CudaClock(torch), "cost-auto", "auto")}  # the default: 1 in 8 at this interval
    times = interleaved_blocks(rows, blocks, n)
    med = {k: statistics.median(v) for k, v in times.items()}
    diffs = [a - b for a, b in zip(times["raw" if raw.raw else "torch"], times["off"], strict=True)]
    cost = statistics.median(diffs)
    torch_cost = statistics.median(a - b for a, b in zip(times["torch"], times["off"], strict=True))
    every4_cost = statistics.median(a - b for a, b in zip(times["raw_every_4"], times["off"], strict=True))
    auto_cost = statistics.median(a - b for a, b in zip(times["auto"], times["off"], strict=True))
    # what one mark costs, and its parts
    clock_torch = CudaClock(torch, raw=False)
    events = [clock_torch.event() for _ in range(64)]
    ev = events[0]
    parts = {"mark, torch's Event.record path": per_call_us(clock_torch.record, (ev,)),
             "torch.cuda.current_stream()": per_call_us(torch.cuda.current_stream, ()),
             "torch._C._cuda_getCurrentRawStream": per_call_us(torch._C._cuda_getCurrentRawStream, (0,)),
             "torch._C._cuda_isCurrentStreamCapturing": per_call_us(torch._C._cuda_isCurrentStreamCapturing, ()),
             "time.monotonic_ns": per_call_us(time.monotonic_ns, ()),
             "begin (capture check), torch": per_call_us(clock_torch.begin, ())}
    if raw.raw:
        parts["mark, raw path (cuEventRecord)"] = per_call_us(raw.record, (ev,))
        parts["begin (capture check), raw"] = per_call_us(raw.begin, ())
        stream = torch._C._cuda_getCurrentRawStream(0)
        parts["cuEventRecord alone (ctypes)"] = per_call_us(raw._cu_record, (ev.cuda_event, stream))
        import ctypes

        from telemetrain.training.device_clock import _driver_function

        capturing = _driver_function("cuStreamIsCapturing", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)])
        if capturing is not None:
            status = ctypes.c_int()
            parts["cuStreamIsCapturing (ctypes)"] = per_call_us(capturing, (stream, ctypes.byref(status)))
    torch.cuda.synchronize()
    marks = empty_marks(torch, rows["raw"])
    # judged at the default (device_timing_every="auto": one iteration in 8 here); every iteration timed is reported
    check("C_host_cost", auto_cost <= 10.0,
          f"device timing adds {auto_cost:.2f} us per iteration at the default (auto: 1 in 8); timing every "
          f"iteration {cost:.2f} us ({'raw' if raw.raw else 'torch'} marks; torch's "
          f"Event.record path {torch_cost:.2f} us; device_timing_every=4 {every4_cost:.2f} us; "
          f"5 phases, {marks} marks a timed iteration; training-thread CPU time, "
          f"median of {blocks} interleaved blocks of {n}: " + ", ".join(f"{k} {v:.2f} us" for k, v in med.items())
          + "); per call: " + "; ".join(f"{k} {v:.2f} us" for k, v in parts.items()) + "; goal <= 10 us",
          cost_us=auto_cost, every1_cost_us=cost, torch_path_cost_us=torch_cost, every4_cost_us=every4_cost,
          blocks_us=times,
          per_call_us=parts, marks=marks, raw=raw.raw)


class FreeClock:
    """A ``DeviceClock`` whose marks cost nothing and complete at once: what is left is our bookkeeping."""

    name = "free"

    def event(self) -> object:
        return object()

    def record(self, event: Any) -> None:
        pass

    def done(self, event: Any) -> bool:
        return True

    def elapsed_s(self, start: Any, end: Any) -> float:
        return 0.001

    def begin(self) -> bool:
        return True


def bookkeeping_cost(blocks: int, n: int) -> int:
    """Check C's comparison on the CPU with ``FreeClock``: training-thread CPU us per 5-phase iteration over
    ``device_timing="host"``, median of ``blocks`` interleaved blocks of ``n``."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import telemetrain
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    store = tempfile.mkdtemp(prefix="bench_gpu-")

    def make(mode: Any, every: int | str) -> Any:
        t = telemetrain.Telemetry(store=store)
        config = TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=1000,
                                         device_timing=mode, device_timing_every=every, gpu_energy=False)
        r = TrainingRecorder(config, telemetry=t)
        r.on_app_start()
        r.on_train_start(0)
        return r

    rows = {"off": make("host", 1), "every 1": make(FreeClock(), 1), "auto (1 in 8)": make(FreeClock(), "auto"),
            "untimed (1 in 10^9)": make(FreeClock(), 10**9)}
    try:
        times = interleaved_blocks(rows, blocks, n)
    finally:
        for r in rows.values():
            r.telemetry.close()
        shutil.rmtree(store, ignore_errors=True)
    for k, v in times.items():
        added = statistics.median(a - b for a, b in zip(v, times["off"], strict=True))
        print(f"{k:20s} {statistics.median(v):7.2f} us an iteration, +{added:.2f} us")
    return 0


def empty_marks(torch: Any, r: Any) -> int:
    """Marks an empty 5-phase iteration records: the median over the timer's slots (one slot whose iteration was
    preempted between two phases records one more)."""
    from telemetrain.training.device_spans import timer_of

    timer = timer_of(r.telemetry)[0] if hasattr(r, "telemetry") else None
    if timer is None:
        return -1
    empty_iterations(r, 1)
    torch.cuda.synchronize()
    timer.resolve()
    slots = [s for s in list(timer._free) + list(timer._pending) if s.n]
    return int(statistics.median(s.n for s in slots)) if slots else -1


# -- D, E: NVML --------------------------------------------------------------------------------------------------------


SMI_FIELDS = ("memory.used", "memory.total", "power.draw", "power.limit", "clocks.sm", "temperature.gpu")


def parse_smi(stdout: str) -> dict[str, float] | None:
    """One GPU's line of ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits``: each field as a
    float, NaN where nvidia-smi prints "[N/A]" or "[Not Supported]" (that one value is then a mismatch, the others
    are still compared); None when the line does not have one value per field."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if len(lines) != 1:
        return None
    values = [v.strip() for v in lines[0].split(",")]
    if len(values) != len(SMI_FIELDS):
        return None
    out = {}
    for field, value in zip(SMI_FIELDS, values, strict=True):
        try:
            out[field] = float(value)
        except ValueError:
            out[field] = math.nan
    return out


def smi(index: int) -> dict[str, float] | None:
    """``nvidia-smi``'s reading of the GPU of NVML index ``index`` (nvidia-smi numbers GPUs as NVML does, whatever
    ``CUDA_VISIBLE_DEVICES`` says), or None when nvidia-smi is not on PATH or gave no numbers."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    out = subprocess.run([exe, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits",
                          "-i", str(index)], capture_output=True, text=True, timeout=30)
    return parse_smi(out.stdout) if out.returncode == 0 else None


def busy(torch: Any, seconds: float) -> None:
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()


def check_d(torch: Any, telemetry: Any) -> None:
    from telemetrain.system import Sampler

    sampler = Sampler(telemetry, interval=3600, gpus=[torch.cuda.current_device()])
    rows: list[dict[str, Any]] = []
    ok = True
    # the GPU's NVML index (the sampler's group): nvidia-smi -i takes that, not the CUDA ordinal
    gpu_groups = sorted({g for g, _ in sampler.sample_now() if g.startswith("system.gpu.")})
    if not gpu_groups:
        why = getattr(sampler._nvml, "reason", "") or "NVML unavailable?"
        check("D_nvml_vs_nvidia_smi", False, f"the sampler read no GPU: {why}")
        return
    group = gpu_groups[0]
    index = int(group.rsplit(".", 1)[1])
    missing = ""
    for state in ("idle", "busy"):
        if state == "busy":
            import threading

            worker = threading.Thread(target=busy, args=(torch, 4.0))
            worker.start()
            time.sleep(1.5)
        else:
            time.sleep(3.0)  # after the checks before: the GPU cools and its clocks settle while we read
        before = smi(index)
        got = sampler.sample_now()
        after = smi(index)
        if state == "busy":
            worker.join()
        v = {n: val for (g, n), val in got.items() if g == group}
        ours = {"memory.total MiB": v.get("hw.gpu.memory.limit", math.nan) / 2**20,
                "memory.used MiB": v.get("hw.gpu.memory.usage", math.nan) / 2**20,
                "power W": v.get("hw.power", math.nan), "power.limit W": v.get("hw.gpu.power.limit", math.nan),
                "SM clock MHz": v.get("hw.gpu.clock.sm", math.nan) / 1e6,
                "temperature C": v.get("hw.temperature", math.nan)}
        if before is None or after is None:  # NVML's values kept, not compared
            missing = ("nvidia-smi is not on PATH" if shutil.which("nvidia-smi") is None
                       else "nvidia-smi gave no numbers")
            ok = False
            rows.extend({"state": state, "what": what, "nvml": value, "nvidia_smi": [math.nan, math.nan],
                         "ok": False} for what, value in ours.items())
            continue
        # nvidia-smi takes a fraction of a second to start: our reading lies between the two it gave around it, or
        # within the tolerance of the nearer (temperature, power and clocks move while the GPU cools or heats)
        ref = {k: (min(before[k], after[k]), max(before[k], after[k])) for k in before}
        compare = {
            "memory.total MiB": (ref["memory.total"], 0.01, 2.0),
            "memory.used MiB": (ref["memory.used"], 0.05, 256.0),
            "power W": (ref["power.draw"], 0.25, 30.0),
            "power.limit W": (ref["power.limit"], 0.01, 1.0),
            "SM clock MHz": (ref["clocks.sm"], 0.10, 50.0),
            "temperature C": (ref["temperature.gpu"], 0.0, 3.0),
        }
        for what, ((low, high), rel, absolute) in compare.items():
            slack = max(rel * abs(high), absolute)
            good = math.isfinite(ours[what]) and low - slack <= ours[what] <= high + slack
            ok = ok and good
            rows.append({"state": state, "what": what, "nvml": ours[what], "nvidia_smi": [low, high], "ok": good})

    def span(low_high: list[float]) -> str:
        low, high = low_high
        return f"{low:.1f}" if low == high else f"{low:.1f}..{high:.1f}"

    if missing:
        detail = f"{missing}: NVML's values recorded, not compared: " + "; ".join(
            f"{r['state']} {r['what']} {r['nvml']:.1f}" for r in rows)
    else:
        detail = "; ".join(f"{r['state']} {r['what']} {r['nvml']:.1f} vs {span(r['nvidia_smi'])}"
                           f"{'' if r['ok'] else ' (MISMATCH)'}" for r in rows)
    check("D_nvml_vs_nvidia_smi", ok, detail, rows=rows)


def check_e(torch: Any) -> None:
    from telemetrain.system.energy import GpuEnergy

    meter = GpuEnergy()
    if not meter.gpus:
        check("E_energy_counter", False, f"no GPU energy: {meter.reason}")
        return
    import threading

    import pynvml

    worker = threading.Thread(target=busy, args=(torch, 3.0))
    worker.start()
    readings = []
    power = []
    handle = meter.gpus[0].handle
    while worker.is_alive():
        r = meter.read()
        if r is not None:
            readings.append((r.mono_ns, r.joules))
            power.append((r.mono_ns, pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0))
        time.sleep(0.05)
    worker.join()
    monotonic = all(b[1] >= a[1] for a, b in itertools.pairwise(readings))
    counted = readings[-1][1] - readings[0][1] if len(readings) > 1 else 0.0
    integral = sum((p0 + p1) / 2 * (t1 - t0) / 1e9 for (t0, p0), (t1, p1) in itertools.pairwise(power))
    ratio = counted / integral if integral > 0 else math.nan
    check("E_energy_counter", meter.source == "counter" and monotonic and abs(ratio - 1) <= 0.25,
          f"source {meter.source}; {len(readings)} readings, monotonic {monotonic}; counter {counted:.1f} J vs "
          f"power integral {integral:.1f} J (ratio {ratio:.3f})", readings=len(readings), counter_J=counted,
          integral_J=integral)


# -- F: MFU ------------------------------------------------------------------------------------------------------------


def datasheet_peak(name: str) -> float | None:
    """The dense bf16 peak of a ``torch.cuda.get_device_name()`` (SXM unless the name says PCIe or NVL)."""
    n = " ".join(name.split()).upper()
    for sku, sparse in DATASHEET_BF16_SPARSE.items():
        model, form = sku.split()
        if model in n.split() and (form.upper() in n or (form == "SXM" and "PCIE" not in n and "NVL" not in n)):
            return sparse / 2
    return None


def check_f(args: argparse.Namespace, last_update: dict[str, Any], measured_tflops: float, device_name: str,
            peak_table: Any) -> None:
    peak_hand = datasheet_peak(device_name)
    mfu_ours = last_update.get("cumulative_train_throughput_per_gpu", math.nan) / (
        peak_table.tflops if peak_table is not None else math.nan)
    mfu_hand = measured_tflops / peak_hand if peak_hand else math.nan
    ok = peak_table is not None and peak_hand is not None and abs(mfu_ours / mfu_hand - 1) <= 0.10
    check("F_mfu", ok, f"{device_name}: table peak {getattr(peak_table, 'tflops', None)} TFLOP/s "
          f"({getattr(peak_table, 'device', None)}), datasheet {peak_hand}; MFU ours {mfu_ours:.4f} vs hand "
          f"{mfu_hand:.4f}", mfu_ours=mfu_ours, mfu_hand=mfu_hand, peak_table=getattr(peak_table, "tflops", None),
          peak_datasheet=peak_hand)


# -- main --------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--profile-steps", type=int, default=10)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--cost-blocks", type=int, default=9)
    ap.add_argument("--cost-n", type=int, default=2000)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--keep-run", metavar="DIR", help="copy the training run's store here (for report/show)")
    ap.add_argument("--bookkeeping", action="store_true", help="check C's rows with a free clock; no GPU needed")
    args = ap.parse_args(argv)
    if args.json:
        JSON_PATH.append(Path(args.json))
    if args.bookkeeping:
        return bookkeeping_cost(args.cost_blocks, args.cost_n)
    try:
        import torch
    except ImportError:
        return no_cuda("bench_gpu.py needs torch with CUDA: not importable here")
    if not torch.cuda.is_available():
        return no_cuda("bench_gpu.py needs a CUDA device: torch.cuda.is_available() is False here (run it on the GPU "
                       "machine; nothing was measured)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import telemetrain
    from telemetrain.system import start_sampler

    out_dir = Path(tempfile.mkdtemp(prefix="bench_gpu-"))
    try:
        torch.cuda.init()  # type: ignore[no-untyped-call]  # unannotated in torch
    except Exception as exc:  # noqa: BLE001 - a device that is listed and cannot be used: every check would fail
        check("setup", False, f"torch.cuda.init() raised {type(exc).__name__}: {exc}")
        return summary()
    guarded("machine", lambda: describe_machine(torch))
    t = telemetrain.Telemetry(store=out_dir / "train")
    sampler = None
    try:
        sampler = start_sampler(t, interval=1.0)
    except Exception as exc:  # noqa: BLE001 - D reads its own sampler; the training run goes without one
        log(f"the system sampler did not start ({type(exc).__name__}: {exc})")
    # the training run and the checks that need it (F, A, B): a failure in it fails those three, named, and D, E, C
    # still run (each check is isolated: a lent GPU's minutes are few)
    run: dict[str, Any] = {}
    guarded("training", lambda: train(torch, args, t, out_dir, run))
    if "last" in run:
        from telemetrain.training.flops import peak_tflops

        name = torch.cuda.get_device_name()
        guarded("F_mfu", lambda: check_f(args, run["last"], run["hand_tflops"], name, peak_tflops(name, "bfloat16")))
        recorder, job, timer = run["recorder"], run["job"], run["timer"]

        def profiled() -> None:
            # a second loop for A and B's steps, from a multiple of the report interval (50): its first report is 50
            # iterations away, so a report computed in the collector thread takes no window A reads
            recorder.on_train_start(-(-(args.steps + 5) // 50) * 50)
            check_a(torch, job, timer, args.profile_steps, out_dir)

        guarded("A_phases_vs_profiler", profiled)
        guarded("B_no_sync", lambda: check_b(torch, job, timer))
        with contextlib.suppress(Exception):
            recorder.on_train_end()
            recorder.on_app_end()
    else:
        for name in ("F_mfu", "A_phases_vs_profiler", "B_no_sync"):
            check(name, False, "not run: the training run failed (see 'training')")
    guarded("D_nvml_vs_nvidia_smi", lambda: check_d(torch, t))
    guarded("E_energy_counter", lambda: check_e(torch))
    if sampler is not None:
        with contextlib.suppress(Exception):
            sampler.stop()
    guarded("C_host_cost", lambda: check_c(torch, make_recorder_in(args, out_dir), args.cost_blocks, args.cost_n))
    with contextlib.suppress(Exception):
        t.close()
    if args.keep_run and t.run_dir is not None:
        shutil.copytree(str(t.run_dir), args.keep_run, dirs_exist_ok=True)
        log(f"the training run was copied to {args.keep_run}")
    return summary()


def no_cuda(reason: str) -> int:
    """Exit status 2: nothing measured, said on stderr and, with ``--json``, in the file (a script that collects it
    finds why rather than no file)."""
    print(reason, file=sys.stderr)
    for path in JSON_PATH:
        path.write_text(json.dumps({"skipped": reason}, indent=1))
    return 2


def summary() -> int:
    """The checks' verdicts on stdout (the full results are in ``--json``); 0 when all passed, 1 otherwise."""
    failed = [k for k, v in RESULTS.items() if isinstance(v, dict) and v.get("ok") is False]
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk in ("ok", "detail")} if isinstance(v, dict)
                      and "ok" in v else v for k, v in RESULTS.items()}, indent=1, default=str))
    for path in JSON_PATH:
        path.write_text(json.dumps(RESULTS, indent=1, default=str))
    print(f"\n{len(failed)} check(s) failed: {', '.join(failed)}" if failed else "\nall checks passed")
    return 1 if failed else 0


def describe_machine(torch: Any) -> None:
    device_name = torch.cuda.get_device_name()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    driver = ""
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        driver = str(pynvml.nvmlSystemGetDriverVersion())
    machine = {"device": device_name, "driver": driver, "cuda": torch.version.cuda, "torch": torch.__version__,
               "sms": props.multi_processor_count, "memory_GiB": round(props.total_memory / 2**30, 1),
               "python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count(),
               "nvidia_smi": shutil.which("nvidia-smi") or "not found"}
    log(f"machine: {machine}")
    RESULTS["machine"] = machine
    for path in JSON_PATH:
        path.write_text(json.dumps(RESULTS, indent=1, default=str))


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

if __name__ == "__main__":
    sys.exit(main())
