"""Peak FLOP/s per GPU and FLOP counting, for MFU (model FLOPs utilisation) in training telemetry.

MFU = achieved model TFLOP/s per GPU / the GPU's dense peak TFLOP/s for the dtype the model computes in. Two rules:

- an unknown device gives **no** MFU (``None``), never a silent fallback to some other GPU's peak: ``match_device``
  maps only device names it knows exactly (a MIG slice, an unlisted SKU or a consumer card is unknown);
- the peak used is always reported with where it came from: ``PeakFlops(tflops, device, dtype, source)``, where
  ``source`` names the vendor datasheet (``PEAK_TFLOPS`` / ``PEAK_SOURCES``) or says the peak was given explicitly.

The FLOPs side (``measure_flops``, ``flops_per_sample``) uses ``torch.utils.flop_counter.FlopCounterMode``. Its known
limits, which apply to every number these functions return:

- it counts only the ops in its registry: matrix products (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_scaled_mm``),
  convolutions and their backward, and the fused attention kernels (flash / memory-efficient / cuDNN SDPA, flex
  attention) and their backward; elementwise ops, activations, norms, softmax outside a fused kernel, embeddings
  (gathers), reductions, losses and the optimizer step count 0. For transformers and conv nets the matmuls and
  convolutions dominate, so the count is close to the model FLOPs; for models dominated by elementwise work it is low;
- a matrix product counts 2 FLOPs per multiply-add (``2*M*N*K``); a bias add is not counted;
- on the CPU (torch 2.13) ``scaled_dot_product_attention`` runs ``_scaled_dot_product_flash_attention_for_cpu``, which
  is not in the registry, so CPU attention counts 0; measure under
  ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` (which decomposes into counted ``bmm``s) or on the GPU;
- fused attention is counted as full (non-causal) attention whatever the mask;
- custom CUDA/Triton/extension ops are not counted unless registered with ``register_flop_formula``;
- recomputation (activation checkpointing) is counted where it runs, which makes the count hardware FLOPs rather than
  model FLOPs: measure MFU's numerator on the model without checkpointing;
- the backward pass only counts the gradients autograd computes: the first layer's input gradient is skipped when the
  input does not require grad, so forward + backward is about 3x forward for deep models (2x for the first layer).

This module imports torch only inside the functions that need it; importing it (or ``telemetrain``) never does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "DTYPES",
    "PEAK_SOURCES",
    "PEAK_TFLOPS",
    "PeakFlops",
    "explicit_peak",
    "flops_per_sample",
    "match_device",
    "measure_flops",
    "mfu",
    "normalize_dtype",
    "peak_tflops",
]

# The dtypes a peak is given for: "float32" is non-tensor-core (vector) FP32; "tf32" is FP32 matmuls on TF32 tensor
# cores (torch.backends.cuda.matmul.allow_tf32 / set_float32_matmul_precision("high")): pass it explicitly, a
# torch.float32 dtype always means "float32"; "float8" is FP8 tensor-core throughput (e4m3; e5m2 runs at the same rate).
DTYPES = ("float32", "tf32", "bfloat16", "float16", "float8")

_DTYPE_ALIASES: Mapping[str, str] = MappingProxyType({
    "float32": "float32", "fp32": "float32", "float": "float32",
    "tf32": "tf32", "tensorfloat32": "tf32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "float8": "float8", "fp8": "float8",
    "float8_e4m3fn": "float8", "float8_e4m3fnuz": "float8", "float8_e5m2": "float8", "float8_e5m2fnuz": "float8",
})

# Dense (no structured sparsity) peak tensor throughput in TFLOP/s per GPU (per torch device), from the vendors'
# datasheets. NVIDIA datasheets from Ampere on print tensor figures "with sparsity" (2:4 structured sparsity doubles
# them; footnote "Shown with sparsity. Specifications are one-half lower without sparsity"): where only that figure is
# printed it is halved here, and the comment says so; where the datasheet prints "dense | sparse*" the dense one is
# used. A dtype a datasheet gives no figure for (V100 bfloat16, A100 float8, ...) is left out: no MFU for it.
# A figure that could not be confirmed from the vendor's own datasheet is left out rather than guessed.
_PEAKS: dict[str, dict[str, float]] = {
    # NVIDIA Tesla V100 datasheet ("Tesla V100 PCIe / SXM2 / V100S PCIe" table; Volta has no sparsity feature):
    # https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf
    # "Single-precision" = float32; "Tensor performance / deep learning" = FP16 tensor cores (no BF16/TF32 on Volta).
    "V100-SXM2": {"float32": 15.7, "float16": 125.0},
    "V100-PCIe": {"float32": 14.0, "float16": 112.0},
    "V100S-PCIe": {"float32": 16.4, "float16": 130.0},
    # NVIDIA T4 datasheet (Turing, no sparsity feature): "Single-precision 8.1 TFLOPS", "Mixed-precision (FP16/FP32)
    # 65 TFLOPS". https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf
    "T4": {"float32": 8.1, "float16": 65.0},
    # NVIDIA A100 Tensor Core GPU datasheet, all four boards (40/80GB, PCIe/SXM) have the same peaks; printed as
    # "dense | sparse*": FP32 19.5, TF32 156 | 312*, BF16 312 | 624*, FP16 312 | 624*. No FP8 on Ampere.
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    "A100-SXM4-40GB": {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0},
    "A100-SXM4-80GB": {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0},
    "A100-PCIe-40GB": {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0},
    "A100-PCIe-80GB": {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0},
    # NVIDIA A10 datasheet, "dense | sparse*": FP32 31.2, TF32 62.5 | 125*, BF16 125 | 250*, FP16 125 | 250*.
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf
    "A10": {"float32": 31.2, "tf32": 62.5, "bfloat16": 125.0, "float16": 125.0},
    # NVIDIA A10G datasheet for AWS (the AWS-only GA102 variant in EC2 G5; half the A10's tensor rate per SM, more
    # SMs), "dense | sparse*": FP32 35, TF32 35 | 70*, BF16 70 | 140*, FP16 70 | 140*.
    # https://d1.awsstatic.com/product-marketing/ec2/NVIDIA_AWS_A10G_DataSheet_FINAL_02_17_2022.pdf
    "A10G": {"float32": 35.0, "tf32": 35.0, "bfloat16": 70.0, "float16": 70.0},
    # NVIDIA A40 datasheet, "dense | sparse*": FP32 37.4, TF32 74.8 | 149.6*, BF16 149.7 | 299.4*, FP16 149.7 | 299.4*.
    # https://www.nvidia.com/en-us/data-center/a40/
    "A40": {"float32": 37.4, "tf32": 74.8, "bfloat16": 149.7, "float16": 149.7},
    # NVIDIA L4 datasheet / product page prints only sparse tensor figures ("Shown with sparsity. Specifications are
    # one-half lower without sparsity"): TF32 120*, BF16 242*, FP16 242*, FP8 485* -> halved. FP32 30.3 (not sparse).
    # https://www.nvidia.com/en-us/data-center/l4/ (datasheet: https://resources.nvidia.com/en-us-l4/l4-datasheet)
    "L4": {"float32": 30.3, "tf32": 60.0, "bfloat16": 121.0, "float16": 121.0, "float8": 242.5},
    # NVIDIA L40 datasheet, "dense | sparse*": FP32 90.5, TF32 90.5 | 181*, BF16 181.05 | 362.1*,
    # FP16 181.05 | 362.1*, FP8 362 | 724*. https://www.nvidia.com/en-us/data-center/l40/
    "L40": {"float32": 90.5, "tf32": 90.5, "bfloat16": 181.05, "float16": 181.05, "float8": 362.0},
    # NVIDIA L40S datasheet, "dense | sparse*": FP32 91.6, TF32 183 | 366*, BF16 362.05 | 733*, FP16 362.05 | 733*,
    # FP8 733 | 1,466*. https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413
    "L40S": {"float32": 91.6, "tf32": 183.0, "bfloat16": 362.05, "float16": 362.05, "float8": 733.0},
    # NVIDIA H100 Tensor Core GPU datasheet / https://www.nvidia.com/en-us/data-center/h100/ prints only sparse tensor
    # figures ("* With sparsity", "Specifications 1/2 lower without sparsity") -> halved:
    # H100 SXM: FP32 67, TF32 989*, BF16 1,979*, FP16 1,979*, FP8 3,958*.
    # H100 PCIe: FP32 51, TF32 756*, BF16 1,513*, FP16 1,513*, FP8 3,026*.
    # H100 NVL (per GPU, the current page; an early version listed a two-GPU pair): FP32 60, TF32 835*, BF16 1,671*,
    # FP16 1,671*; its FP8 figure could not be confirmed here, so it is left out.
    "H100-SXM": {"float32": 67.0, "tf32": 494.5, "bfloat16": 989.5, "float16": 989.5, "float8": 1979.0},
    "H100-PCIe": {"float32": 51.0, "tf32": 378.0, "bfloat16": 756.5, "float16": 756.5, "float8": 1513.0},
    "H100-NVL": {"float32": 60.0, "tf32": 417.5, "bfloat16": 835.5, "float16": 835.5},
    # NVIDIA H200 datasheet / https://www.nvidia.com/en-us/data-center/h200/, H200 SXM column, sparse figures halved
    # (same compute as H100 SXM): FP32 67, TF32 989*, BF16 1,979*, FP16 1,979*, FP8 3,958*. The H200 NVL column could
    # not be confirmed here: "NVIDIA H200 NVL" is unknown (no MFU).
    "H200-SXM": {"float32": 67.0, "tf32": 494.5, "bfloat16": 989.5, "float16": 989.5, "float8": 1979.0},
    # NVIDIA GB200 NVL72 / HGX B200 product pages, "Individual Blackwell GPU Specifications" (preliminary, may change;
    # all tensor figures with sparsity) -> halved. https://www.nvidia.com/en-us/data-center/gb200-nvl72/
    # HGX B200: FP32 75, TF32 2.2 PF*, BF16/FP16 4.5 PF*, FP8 9 PF*. GB200: FP32 80, TF32 2.5 PF*, BF16/FP16 5 PF*,
    # FP8 10 PF*.
    "B200": {"float32": 75.0, "tf32": 1100.0, "bfloat16": 2250.0, "float16": 2250.0, "float8": 4500.0},
    "GB200": {"float32": 80.0, "tf32": 1250.0, "bfloat16": 2500.0, "float16": 2500.0, "float8": 5000.0},
    # AMD Instinct MI250X (CDNA 2) product page / data sheet, per OAM module: FP32 vector 47.9, FP32 matrix 95.7,
    # FP16 383, BF16 383 (dense; no TF32 or FP8 on CDNA 2). An MI250X is two GCDs and ROCm exposes each GCD as its own
    # torch device, so the per-device peak is half the per-module figure: that is what this entry holds.
    # https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html
    "MI250X-GCD": {"float32": 23.95, "bfloat16": 191.5, "float16": 191.5},
    # AMD Instinct MI300X data sheet (dense figures, listed next to the "with structured sparsity" ones; endnote
    # MI300-11): FP32 vector 163.4, TF32 653.7, FP16 1,307.4, BF16 1,307.4, FP8 2,614.9.
    # https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf
    "MI300X": {"float32": 163.4, "tf32": 653.7, "bfloat16": 1307.4, "float16": 1307.4, "float8": 2614.9},
}

PEAK_TFLOPS: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {key: MappingProxyType(dict(row)) for key, row in _PEAKS.items()})
"""Dense peak TFLOP/s per GPU: ``PEAK_TFLOPS[device_key][dtype]`` (read-only; see the comments in the source)."""

_HALVED = "; dense = the datasheet's 'with sparsity' figure / 2"
_V100 = "NVIDIA Tesla V100 datasheet (volta-v100-datasheet-update-us-1165301-r5.pdf)"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), dense figure"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100)"
_BLACKWELL = "NVIDIA GB200 NVL72 / HGX B200 specifications (nvidia.com/en-us/data-center/gb200-nvl72), preliminary"

PEAK_SOURCES: Mapping[str, str] = MappingProxyType({
    "V100-SXM2": _V100 + ", V100 SXM2 column",
    "V100-PCIe": _V100 + ", V100 PCIe column",
    "V100S-PCIe": _V100 + ", V100S PCIe column",
    "T4": "NVIDIA T4 datasheet (t4-tensor-core-datasheet-951643.pdf)",
    "A100-SXM4-40GB": _A100,
    "A100-SXM4-80GB": _A100,
    "A100-PCIe-40GB": _A100,
    "A100-PCIe-80GB": _A100,
    "A10": "NVIDIA A10 datasheet (a10-datasheet.pdf), dense figure",
    "A10G": "NVIDIA A10G datasheet for AWS (NVIDIA_AWS_A10G_DataSheet_FINAL_02_17_2022.pdf), dense figure",
    "A40": "NVIDIA A40 datasheet (nvidia.com/en-us/data-center/a40), dense figure",
    "L4": "NVIDIA L4 datasheet (nvidia.com/en-us/data-center/l4)" + _HALVED,
    "L40": "NVIDIA L40 datasheet (nvidia.com/en-us/data-center/l40), dense figure",
    "L40S": "NVIDIA L40S datasheet (resources.nvidia.com/en-us-l40s/l40s-datasheet-28413), dense figure",
    "H100-SXM": _H100 + ", H100 SXM column" + _HALVED,
    "H100-PCIe": _H100 + ", H100 PCIe column" + _HALVED,
    "H100-NVL": _H100 + ", H100 NVL column (per GPU)" + _HALVED,
    "H200-SXM": "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200), H200 SXM column" + _HALVED,
    "B200": _BLACKWELL + ", HGX B200 per-GPU column" + _HALVED,
    "GB200": _BLACKWELL + ", GB200 NVL72 per-GPU column" + _HALVED,
    "MI250X-GCD": "AMD Instinct MI250X specifications (amd.com), per-OAM figure / 2 for one GCD (one torch device)",
    "MI300X": "AMD Instinct MI300X data sheet (amd-instinct-mi300x-data-sheet.pdf), dense figure",
})
"""Where each ``PEAK_TFLOPS`` row comes from (reported as ``PeakFlops.source``)."""

# torch.cuda.get_device_name() strings -> table keys. Each pattern must match the whole (whitespace-normalised,
# case-insensitive) name, so "H100 PCIe" never reaches the SXM entry, "A100" never the "A10" one, "GB200" never
# "B200", and a MIG slice ("NVIDIA A100-SXM4-40GB MIG 1g.5gb": a fraction of the GPU's SMs) is unknown.
_NV = r"(?:NVIDIA )?"
_TESLA = r"(?:NVIDIA )?(?:Tesla )?"
_AMD = r"(?:AMD )?(?:Instinct )?"
_DEVICE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), key) for pattern, key in (
        (_TESLA + r"V100[- ]SXM2(?:[- ](?:16|32)GB)?", "V100-SXM2"),
        (_TESLA + r"V100[- ]PCIE(?:[- ](?:16|32)GB)?", "V100-PCIe"),
        (_TESLA + r"V100S[- ]PCIE(?:[- ]32GB)?", "V100S-PCIe"),
        (_TESLA + r"T4", "T4"),
        (_NV + r"A100[- ]SXM4?[- ]40GB", "A100-SXM4-40GB"),
        (_NV + r"A100[- ]SXM4?[- ]80GB", "A100-SXM4-80GB"),
        (_NV + r"A100(?:[- ]PCIE[- ]40GB|[- ]40GB[- ]PCIE)", "A100-PCIe-40GB"),
        (_NV + r"A100(?:[- ]PCIE[- ]80GB|[- ]80GB[- ]PCIE)", "A100-PCIe-80GB"),
        (_NV + r"A10", "A10"),
        (_NV + r"A10G", "A10G"),
        (_NV + r"A40", "A40"),
        (_NV + r"L4", "L4"),
        (_NV + r"L40", "L40"),
        (_NV + r"L40S", "L40S"),
        (_NV + r"H100(?:[- ]SXM5?)?[- ]80GB[- ]HBM3|" + _NV + r"H100[- ]SXM5?(?:[- ]80GB)?", "H100-SXM"),
        (_NV + r"H100[- ]PCIE(?:[- ]80GB)?", "H100-PCIe"),
        (_NV + r"H100[- ]NVL", "H100-NVL"),
        (_NV + r"H200(?:[- ]SXM5?)?(?:[- ]141GB(?:[- ]HBM3E?)?)?", "H200-SXM"),
        (_NV + r"B200", "B200"),
        (_NV + r"GB200", "GB200"),
        # "AMD Instinct MI250X / MI250" (ROCm 6 names both boards so) is ambiguous -- the MI250 is slower -- so unknown.
        (_AMD + r"MI250X", "MI250X-GCD"),
        (_AMD + r"MI300X(?: VF)?", "MI300X"),
    ))
_KEYS_LOWER = {key.lower(): key for key in _PEAKS}


@dataclass(frozen=True, slots=True)
class PeakFlops:
    """A peak throughput used for MFU and where it came from.

    ``tflops``: dense peak TFLOP/s per GPU; ``device``: the ``PEAK_TFLOPS`` key (or the device named for an explicit
    peak); ``dtype``: one of ``DTYPES`` (``"unspecified"`` for an explicit peak given without one); ``source``: the
    datasheet the figure comes from, or ``"explicit"``.
    """

    tflops: float
    device: str
    dtype: str
    source: str


def normalize_dtype(dtype: Any) -> str:
    """The ``DTYPES`` name for a torch dtype (``torch.bfloat16`` -> ``"bfloat16"``) or a string (``"bf16"``,
    ``"fp16"``, ``"tf32"``, ``"float8_e4m3fn"``, ...); ValueError for anything else. Does not import torch."""
    if isinstance(dtype, str):
        name = dtype.strip().lower()
        name = name.removeprefix("torch.")
    else:
        text = str(dtype)  # a torch.dtype prints as "torch.bfloat16"
        name = text[len("torch."):] if text.startswith("torch.") else ""
    canonical = _DTYPE_ALIASES.get(name)
    if canonical is None:
        aliases = ", ".join(sorted(set(_DTYPE_ALIASES) - set(DTYPES)))
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPES)} (or a torch dtype of those, "
                         f"or an alias: {aliases})")
    return canonical


def match_device(name: str) -> str | None:
    """The ``PEAK_TFLOPS`` key for a ``torch.cuda.get_device_name()`` string (or a key itself), or None if unknown.

    "NVIDIA H100 80GB HBM3" -> "H100-SXM", "NVIDIA H100 PCIe" -> "H100-PCIe", "NVIDIA A100-SXM4-80GB" ->
    "A100-SXM4-80GB", "Tesla V100-SXM2-16GB" -> "V100-SXM2", "NVIDIA GeForce RTX 4090" -> None. The whole name must
    match, so a MIG slice, an unlisted SKU (H800, H20, H100 94GB/96GB, H200 NVL, GH200, ...) or anything with extra
    text is None.
    """
    normalized = " ".join(str(name).split())
    if not normalized:
        return None
    key = _KEYS_LOWER.get(normalized.lower())
    if key is not None:
        return key
    for pattern, key in _DEVICE_PATTERNS:
        if pattern.fullmatch(normalized):
            return key
    return None


def _current_device_name(device: str | None) -> str | None:
    """The name of the CUDA device ``device`` ("cuda", "cuda:N" or None for the current one), None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = None
    if device is not None and ":" in device:
        index = int(device.split(":", 1)[1])
    return str(torch.cuda.get_device_name(index))


def peak_tflops(device: str | None = None, dtype: Any = "bfloat16") -> PeakFlops | None:
    """The dense peak TFLOP/s of ``device`` for ``dtype`` with its source, or None when it is unknown (no MFU).

    ``device``: a ``torch.cuda.get_device_name()`` string or a ``PEAK_TFLOPS`` key; ``"cuda"`` / ``"cuda:N"`` or None
    for the current CUDA device (None -- no MFU -- on a machine without CUDA, e.g. the CPU). ``dtype``: a torch dtype
    or a string (see ``normalize_dtype``); an unknown dtype raises ValueError whatever the device. A known device with
    no datasheet figure for the dtype (a V100 in bfloat16, an A100 in float8) also gives None.
    """
    dtype_name = normalize_dtype(dtype)
    if device is None or re.fullmatch(r"cuda(?::\d+)?", device.strip().lower()):
        name = _current_device_name(None if device is None else device.strip().lower())
        if name is None:
            return None
    else:
        name = device
    key = match_device(name)
    if key is None:
        return None
    tflops = PEAK_TFLOPS[key].get(dtype_name)
    if tflops is None:
        return None
    return PeakFlops(tflops=tflops, device=key, dtype=dtype_name, source=PEAK_SOURCES[key])


def _check_number(value: Any, what: str, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        raise ValueError(f"{what} must be finite and {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return number


def explicit_peak(tflops: float, device: str = "explicit", *, dtype: Any = None) -> PeakFlops:
    """A user-given peak TFLOP/s per GPU (finite and > 0, else ValueError), reported with source ``"explicit"``.

    ``dtype`` (optional) records which dtype the peak is for; without it the dtype is ``"unspecified"``.
    """
    value = _check_number(tflops, "peak TFLOP/s", allow_zero=False)
    dtype_name = "unspecified" if dtype is None else normalize_dtype(dtype)
    return PeakFlops(tflops=value, device=str(device), dtype=dtype_name, source="explicit")


def mfu(achieved_tflops_per_gpu: float, peak: PeakFlops | None) -> float | None:
    """Model FLOPs utilisation: achieved TFLOP/s per GPU / ``peak.tflops``; None without a peak (unknown device).

    ``achieved_tflops_per_gpu`` must be finite and >= 0 (ValueError otherwise).
    """
    achieved = _check_number(achieved_tflops_per_gpu, "achieved TFLOP/s per GPU", allow_zero=True)
    if peak is None:
        return None
    return achieved / peak.tflops


def measure_flops(fn: Callable[..., object], *args: Any, **kwargs: Any) -> int:
    """Run ``fn(*args, **kwargs)`` once under ``FlopCounterMode(display=False)`` and return its total FLOPs.

    Whatever ``fn`` does (a backward filling ``.grad``, optimizer steps) it does for real; the count has the limits
    listed in the module docstring (matmuls, convolutions and fused attention only; 2 FLOPs per multiply-add).
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn(*args, **kwargs)
    return int(counter.get_total_flops())


def _iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``obj`` (a tensor, or nested tuples/lists/mappings of them), depth first, in order."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _iter_tensors(value)
    elif isinstance(obj, (tuple, list)):
        for value in obj:
            yield from _iter_tensors(value)


def _batch_size(example_batch: Any) -> int:
    first = next(_iter_tensors(example_batch), None)
    if first is None:
        raise ValueError(f"example_batch has no tensor to take the batch size from: {type(example_batch).__name__}")
    if first.dim() == 0 or first.shape[0] == 0:
        raise ValueError(f"the first tensor in example_batch has no batch dimension (shape {tuple(first.shape)})")
    return int(first.shape[0])


def _default_loss(output: Any) -> torch.Tensor:
    import torch

    value = output
    if isinstance(value, Mapping):
        value = next(iter(value.values()), None)
    elif isinstance(value, (tuple, list)):
        value = value[0] if value else None
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"cannot make a loss from a model output of type {type(output).__name__}: pass loss_fn")
    return value.sum()


def flops_per_sample(model: torch.nn.Module, example_batch: Any, *, loss_fn: Callable[[Any], Any] | None = None,
                     backward: bool = True) -> float:
    """FLOPs of one training step's forward (+ backward) on ``example_batch``, divided by its batch size.

    The model is called as ``model(batch)`` for a tensor, ``model(*batch)`` for a tuple/list and ``model(**batch)``
    for a mapping; the batch size is dim 0 of the first tensor in ``example_batch`` (depth first). With ``backward``
    the loss is ``loss_fn(output)``, or ``output.sum()`` (``output[0].sum()`` for a tuple/list output, the first
    value's for a mapping), and ``loss.backward()`` runs under the counter too (the loss itself counts ~0 FLOPs).
    Use the per-sample figure with samples/s, or ``flops_per_sample(...) / seq_len`` with tokens/s.

    Side effects are undone: the model runs in training mode (``model.train()``, since this measures a training step)
    and every submodule's train/eval flag is put back afterwards; the ``.grad`` of every parameter (and of any input
    tensor that requires grad) is set to None for the measurement and the original gradient object restored after
    (unchanged: the backward writes into fresh tensors); buffers (BatchNorm running statistics) are restored to their
    values; the CPU and CUDA random number generators are forked, so dropout does not advance them. The count has the
    limits listed in the module docstring: matmuls, convolutions and fused attention only; on the CPU, attention
    through ``scaled_dot_product_attention`` counts 0 unless measured under ``sdpa_kernel(SDPBackend.MATH)``.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    batch_size = _batch_size(example_batch)
    leaves: dict[int, torch.Tensor] = {}
    for tensor in [*model.parameters(), *_iter_tensors(example_batch)]:
        if tensor.is_leaf and tensor.requires_grad:
            leaves.setdefault(id(tensor), tensor)
    saved_grads = [(tensor, tensor.grad) for tensor in leaves.values()]
    saved_buffers = [(module, name, buffer, buffer.detach().clone())
                     for module in model.modules() for name, buffer in module._buffers.items() if buffer is not None]
    saved_modes = [(module, module.training) for module in model.modules()]
    cuda_devices = sorted({tensor.device.index for tensor in [*leaves.values(), *(b for _, _, b, _ in saved_buffers)]
                           if tensor.device.type == "cuda" and tensor.device.index is not None})
    counter = FlopCounterMode(display=False)
    try:
        for tensor, _ in saved_grads:
            tensor.grad = None
        model.train()
        with torch.random.fork_rng(devices=cuda_devices), counter:
            if isinstance(example_batch, Mapping):
                output = model(**example_batch)
            elif isinstance(example_batch, (tuple, list)):
                output = model(*example_batch)
            else:
                output = model(example_batch)
            if backward:
                loss = loss_fn(output) if loss_fn is not None else _default_loss(output)
                if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
                    raise ValueError("backward=True but the loss does not require grad (no trainable parameter "
                                     "reaches it): pass backward=False to count the forward only")
                backward_fn: Any = loss.backward  # Tensor.backward is not annotated in torch
                backward_fn()
    finally:
        for tensor, grad in saved_grads:
            tensor.grad = grad
        with torch.no_grad():
            for module, name, buffer, saved in saved_buffers:
                buffer.copy_(saved)
                module._buffers[name] = buffer
        for module, mode in saved_modes:
            module.training = mode
    return counter.get_total_flops() / batch_size
