"""bench/bench_gpu.py off the GPU: it refuses, clearly and without measuring anything, where there is no CUDA; and
its two pieces of pure logic -- attributing the profiler's kernels to phases, the datasheet peak of a device name --
are right. The bench itself is the GPU check (BENCHMARKS.md, "GPU truth")."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_gpu.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_exits_2_and_says_why() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: run the bench itself (python bench/bench_gpu.py)")
    out = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert "needs a CUDA device" in out.stderr and "nothing was measured" in out.stderr and out.stdout == ""


def test_bookkeeping_mode_runs_without_a_gpu_and_times_the_rows_it_names() -> None:
    """``--bookkeeping`` measures check C's rows with a free clock: each row printed once, with a number (no CUDA)."""
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, str(BENCH), "--bookkeeping", "--cost-blocks", "1", "--cost-n", "20"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line.split("  ")[0] for line in out.stdout.splitlines()]
    assert rows == ["off", "every 1", "auto (1 in 8)", "untimed (1 in 10^9)"]
    assert all(" us an iteration, +" in line for line in out.stdout.splitlines())
    assert out.stderr == ""


def test_kernels_are_attributed_to_the_phase_they_were_launched_in() -> None:
    """Launch time decides, whatever thread launched (backward kernels come from autograd's device thread) and
    whenever the kernel ran (later, on the device)."""
    b = _bench()
    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "model_forward", "ts": 100, "dur": 50, "tid": 1},
        {"ph": "X", "cat": "user_annotation", "name": "model_backward", "ts": 150, "dur": 100, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 110, "dur": 3, "args": {"correlation": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 160, "dur": 3, "tid": 7,
         "args": {"correlation": 2}},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 170, "dur": 3, "args": {"correlation": 3}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemsetAsync", "ts": 300, "dur": 3, "args": {"correlation": 4}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 400, "dur": 1000, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "gemm_bwd", "ts": 1400, "dur": 2000, "args": {"correlation": 2}},
        {"ph": "X", "cat": "gpu_memset", "name": "memset", "ts": 3400, "dur": 500, "args": {"correlation": 3}},
        {"ph": "X", "cat": "kernel", "name": "outside", "ts": 4000, "dur": 7000, "args": {"correlation": 4}},
    ]}
    got = b.kernel_times_by_phase(trace)
    assert got["forward"] == pytest.approx(1000e-6) and got["backward"] == pytest.approx(2500e-6)
    assert got["optimizer"] == 0.0 and got["zero_grad"] == 0.0


def test_datasheet_peaks_by_device_name() -> None:
    b = _bench()
    assert b.datasheet_peak("NVIDIA H100 80GB HBM3") == 989.5
    assert b.datasheet_peak("NVIDIA H100 PCIe") == 756.5
    assert b.datasheet_peak("NVIDIA H100 NVL") == 835.5
    assert b.datasheet_peak("NVIDIA H200") == 989.5
    assert b.datasheet_peak("NVIDIA A100-SXM4-80GB") is None


def test_without_cuda_the_json_says_why_nothing_was_measured(tmp_path: Path) -> None:
    """A script that collects ``--json`` finds the reason in it, not a missing file (exit status 2 as before)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: run the bench itself (python bench/bench_gpu.py)")
    out_json = tmp_path / "gpu.json"
    out = subprocess.run([sys.executable, str(BENCH), "--steps", "150", "--cost-blocks", "5", "--json", str(out_json)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stdout == ""
    got = json.loads(out_json.read_text())
    assert list(got) == ["skipped"] and "needs a CUDA device" in got["skipped"]


def test_nvidia_smi_fields_are_parsed_one_by_one() -> None:
    """nvidia-smi prints "[N/A]" for a value a board does not report: that value is NaN (a mismatch), the others are
    still compared; a line with the wrong number of values, or no line (an unknown -i), gives nothing."""
    b = _bench()
    got = b.parse_smi("4593, 81559, 685.52, 700.00, 1980, 48\n")
    assert got == {"memory.used": 4593.0, "memory.total": 81559.0, "power.draw": 685.52, "power.limit": 700.0,
                   "clocks.sm": 1980.0, "temperature.gpu": 48.0}
    partial = b.parse_smi("4593, 81559, [N/A], 700.00, 1980, 48")
    assert partial is not None and math.isnan(partial["power.draw"]) and partial["memory.used"] == 4593.0
    assert b.parse_smi("4593, 81559") is None and b.parse_smi("") is None
    assert b.parse_smi("1, 2, 3, 4, 5, 6\n1, 2, 3, 4, 5, 6\n") is None  # two GPUs: not the one asked for
