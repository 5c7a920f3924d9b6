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
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# the checks, the training run and the results: the sibling modules bench/_gpu_*.py, one job each.
# tests/test_gpu_bench.py loads this file by its path, where bench/ is not on sys.path: put it there for the siblings
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from _gpu_host_cost import bookkeeping_cost, check_c
from _gpu_mfu import check_f, datasheet_peak
from _gpu_nvml import check_d, check_e, parse_smi
from _gpu_phases import check_a, check_b, kernel_times_by_phase
from _gpu_results import JSON_PATH, check, describe_machine, guarded, log, no_cuda, summary
from _gpu_training import make_recorder_in, train

# the pure logic tests/test_gpu_bench.py checks, by these names, on this module
__all__ = ["datasheet_peak", "kernel_times_by_phase", "main", "parse_smi"]

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

if __name__ == "__main__":
    sys.exit(main())
