"""bench_gpu.py's check F: the recorder's MFU against a hand computation and the datasheet's dense bf16 peak."""

from __future__ import annotations

import argparse
import math
from typing import Any

from _gpu_results import check

# dense bf16 tensor peak per GPU (TFLOP/s): the datasheets print the sparse figure, "1/2 lower without sparsity".
# https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM 1,979*, PCIe 1,513*, NVL 1,671*),
# https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM 1,979*)
DATASHEET_BF16_SPARSE = {"H100 SXM": 1979.0, "H100 PCIe": 1513.0, "H100 NVL": 1671.0, "H200 SXM": 1979.0}


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
