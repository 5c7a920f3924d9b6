"""bench_gpu.py's checks D and E: NVML's values against nvidia-smi, idle and busy, and the energy counter."""

from __future__ import annotations

import itertools
import math
import shutil
import subprocess
import time
from typing import Any

from _gpu_results import check

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
