"""The sampler's series descriptions (the gauges' help text, docs/system.md's table) say what a value covers."""

from __future__ import annotations

from pathlib import Path

from telemetrain.system.names import CATALOGUE

DOC = Path(__file__).resolve().parents[1] / "docs" / "system.md"


def test_gpu_utilisation_is_over_nvmls_period_not_the_samplers_interval() -> None:
    # NVML averages over its own sample period, 1/6 s to 1 s by product (nvmlUtilization_t): a 10 s sampler sees
    # a snapshot of its last second, not the interval, and "the last sample period" read as the sampler's
    doc = DOC.read_text(encoding="utf-8")
    for key in ("hw.gpu.utilization", "hw.gpu.memory_controller.utilization"):
        description = CATALOGUE[key][1]
        assert "NVML's last sample period (1/6 s to 1 s" in description, description
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{key}` |"))
        assert "NVML's last sample period (1/6 s to 1 s" in row, row
