"""telemetrain.training.flops: the peak table, device matching, MFU arithmetic, FLOP counts on real CPU models."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from telemetrain.training.flops import (  # noqa: E402 -- after the importorskip
    DTYPES,
    PEAK_SOURCES,
    PEAK_TFLOPS,
    PeakFlops,
    explicit_peak,
    flops_per_sample,
    match_device,
    measure_flops,
    mfu,
    normalize_dtype,
    peak_tflops,
)

# ---------------------------------------------------------------------------------------------------------- devices

# (torch.cuda.get_device_name() string as reported on real machines, expected key)
DEVICE_NAMES = [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA H200", "H200-SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
    ("Tesla V100-SXM2-16GB", "V100-SXM2"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2"),
    ("Tesla V100-PCIE-16GB", "V100-PCIe"),
    ("Tesla V100-PCIE-32GB", "V100-PCIe"),
    ("Tesla V100S-PCIE-32GB", "V100S-PCIe"),
    ("Tesla T4", "T4"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A40", "A40"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI300X VF", "MI300X"),
    ("AMD Instinct MI250X", "MI250X-GCD"),
    # whitespace and case do not matter; the table keys match themselves
    ("  nvidia   h100  pcie ", "H100-PCIe"),
    ("H100-SXM", "H100-SXM"),
    ("a100-pcie-80gb", "A100-PCIe-80GB"),
]

UNKNOWN_NAMES = [
    "NVIDIA GeForce RTX 4090",
    "NVIDIA GeForce RTX 3090",
    "NVIDIA RTX A6000",
    "NVIDIA RTX 6000 Ada Generation",
    "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a MIG slice has a fraction of the SMs: the full-GPU peak would be wrong
    "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
    "NVIDIA A100X",
    "NVIDIA A800-SXM4-80GB",
    "NVIDIA A30",
    "NVIDIA H800",
    "NVIDIA H20",
    "NVIDIA H100",  # ambiguous board
    "NVIDIA H100 SXM5 94GB",
    "NVIDIA H200 NVL",  # not in the table: must not fall back to the H200 SXM entry
    "NVIDIA GH200 480GB",
    "NVIDIA L20",
    "NVIDIA B100",
    "Tesla V100-SXM3-32GB",
    "Tesla V100-FHHL-16GB",
    "Tesla P100-PCIE-16GB",
    "AMD Instinct MI250X / MI250",  # ambiguous: the MI250 is slower
    "AMD Instinct MI325X",
    "AMD Instinct MI300A",
    "cpu",
    "",
    "   ",
]


@pytest.mark.parametrize(("name", "key"), DEVICE_NAMES)
def test_match_device_known(name: str, key: str) -> None:
    assert match_device(name) == key


@pytest.mark.parametrize("name", UNKNOWN_NAMES)
def test_match_device_unknown(name: str) -> None:
    assert match_device(name) is None


def test_variants_do_not_cross_match() -> None:
    assert {match_device(n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL")} == {
        "H100-SXM", "H100-PCIe", "H100-NVL"}
    assert [match_device(n) for n in ("NVIDIA A10", "NVIDIA A10G", "NVIDIA A100-SXM4-80GB")] == [
        "A10", "A10G", "A100-SXM4-80GB"]
    assert [match_device(n) for n in ("NVIDIA L4", "NVIDIA L40", "NVIDIA L40S")] == ["L4", "L40", "L40S"]
    assert [match_device(n) for n in ("NVIDIA B200", "NVIDIA GB200")] == ["B200", "GB200"]


def test_table_is_complete_and_sane() -> None:
    assert set(PEAK_SOURCES) == set(PEAK_TFLOPS)
    for key, row in PEAK_TFLOPS.items():
        assert row, key
        assert set(row) <= set(DTYPES), key
        assert PEAK_SOURCES[key], key
        for dtype, value in row.items():
            assert math.isfinite(value) and value > 0, (key, dtype)
        if "bfloat16" in row and "float16" in row:
            assert row["bfloat16"] == row["float16"], key  # one tensor-core rate for both on every listed GPU
        if "tf32" in row:
            assert row["float32"] <= row["tf32"] <= row["bfloat16"], key
        if "float8" in row:
            assert row["float8"] >= 1.9 * row["bfloat16"], key
    with pytest.raises(TypeError):
        PEAK_TFLOPS["H100-SXM"]["bfloat16"] = 1.0  # type: ignore[index]


def test_documented_dense_figures() -> None:
    # the datasheet prints 1,979 / 3,958 "with sparsity" for the H100 SXM: dense is half
    assert PEAK_TFLOPS["H100-SXM"]["bfloat16"] == 1979 / 2
    assert PEAK_TFLOPS["H100-SXM"]["float8"] == 3958 / 2
    assert PEAK_TFLOPS["H100-PCIe"]["bfloat16"] == 1513 / 2
    assert PEAK_TFLOPS["L4"]["bfloat16"] == 242 / 2
    assert PEAK_TFLOPS["A100-SXM4-80GB"]["bfloat16"] == 312.0  # printed dense | sparse: the dense one
    assert PEAK_TFLOPS["V100-SXM2"] == {"float32": 15.7, "float16": 125.0}
    assert PEAK_TFLOPS["MI300X"]["bfloat16"] == 1307.4
    assert PEAK_TFLOPS["MI250X-GCD"]["bfloat16"] == 383 / 2  # one GCD = one torch device


def test_peak_tflops_h100_bf16() -> None:
    peak = peak_tflops("NVIDIA H100 80GB HBM3", torch.bfloat16)
    assert peak == PeakFlops(tflops=989.5, device="H100-SXM", dtype="bfloat16", source=PEAK_SOURCES["H100-SXM"])
    assert "H100" in peak.source and "sparsity" in peak.source
    with pytest.raises(AttributeError):
        peak.tflops = 1.0  # type: ignore[misc]


def test_peak_tflops_other_dtypes_and_devices() -> None:
    assert peak_tflops("NVIDIA H100 PCIe", "fp8") == PeakFlops(1513.0, "H100-PCIe", "float8", PEAK_SOURCES["H100-PCIe"])
    assert peak_tflops("NVIDIA A100-SXM4-40GB", torch.float32).tflops == 19.5  # type: ignore[union-attr]
    assert peak_tflops("NVIDIA A100-SXM4-40GB", "tf32").tflops == 156.0  # type: ignore[union-attr]
    assert peak_tflops("Tesla V100-SXM2-16GB", torch.float16).tflops == 125.0  # type: ignore[union-attr]
    assert peak_tflops("L40S").tflops == 362.05  # type: ignore[union-attr]  # default dtype bfloat16


def test_peak_tflops_unknown_gives_none() -> None:
    assert peak_tflops("NVIDIA GeForce RTX 4090", torch.bfloat16) is None
    assert peak_tflops("NVIDIA A100-SXM4-40GB MIG 1g.5gb", torch.bfloat16) is None
    assert peak_tflops("cpu") is None
    # a known device with no datasheet figure for the dtype: no MFU either
    assert peak_tflops("Tesla V100-SXM2-16GB", torch.bfloat16) is None
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "float8") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU case: this machine has CUDA")
def test_peak_tflops_cpu_default_is_none() -> None:
    assert peak_tflops() is None
    assert peak_tflops(None, torch.float32) is None
    assert peak_tflops("cuda") is None
    assert peak_tflops("cuda:0") is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the real one, not a stand-in)")
def test_peak_tflops_current_cuda_device() -> None:
    """On a real GPU: the current device (and "cuda"/"cuda:N") resolves through its real name, to the table's entry
    when the model is known, else to no peak (no MFU)."""
    name = torch.cuda.get_device_name()
    key = match_device(name)
    peak = peak_tflops()
    if key is None or "bfloat16" not in PEAK_TFLOPS[key]:
        assert peak is None
    else:
        assert peak == PeakFlops(PEAK_TFLOPS[key]["bfloat16"], key, "bfloat16", PEAK_SOURCES[key])
        assert peak_tflops("cuda") == peak
        assert peak_tflops(f"cuda:{torch.cuda.current_device()}") == peak


def test_dtype_normalization() -> None:
    assert normalize_dtype(torch.bfloat16) == "bfloat16"
    assert normalize_dtype(torch.float16) == "float16"
    assert normalize_dtype(torch.half) == "float16"
    assert normalize_dtype(torch.float32) == "float32"
    assert normalize_dtype(torch.float8_e4m3fn) == "float8"
    assert normalize_dtype(torch.float8_e5m2) == "float8"
    assert normalize_dtype("BF16") == "bfloat16"
    assert normalize_dtype("torch.float16") == "float16"
    assert normalize_dtype(" tf32 ") == "tf32"
    assert [normalize_dtype(d) for d in DTYPES] == list(DTYPES)


@pytest.mark.parametrize("bad", [torch.float64, torch.int8, torch.bool, "float64", "int8", "", "bfloat", 16, None])
def test_bad_dtype_raises_listing_valid_ones(bad: Any) -> None:
    with pytest.raises(ValueError, match="expected one of float32, tf32, bfloat16, float16, float8"):
        normalize_dtype(bad)
    with pytest.raises(ValueError, match="unknown dtype"):
        peak_tflops("NVIDIA H100 80GB HBM3", bad)
    with pytest.raises(ValueError, match="unknown dtype"):
        peak_tflops("NVIDIA GeForce RTX 4090", bad)  # the dtype is checked even when the device is unknown


# ------------------------------------------------------------------------------------------------ explicit peak, mfu

def test_explicit_peak() -> None:
    assert explicit_peak(400) == PeakFlops(400.0, "explicit", "unspecified", "explicit")
    assert explicit_peak(123.5, "my-accelerator", dtype=torch.bfloat16) == PeakFlops(
        123.5, "my-accelerator", "bfloat16", "explicit")
    assert isinstance(explicit_peak(400).tflops, float)


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, math.nan, math.inf, -math.inf, True, "100", None])
def test_explicit_peak_rejects(bad: Any) -> None:
    with pytest.raises(ValueError, match="peak TFLOP/s"):
        explicit_peak(bad)


def test_explicit_peak_rejects_bad_dtype() -> None:
    with pytest.raises(ValueError, match="unknown dtype"):
        explicit_peak(100.0, dtype="int4")


def test_mfu() -> None:
    h100 = peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16")
    assert mfu(494.75, h100) == 0.5
    assert mfu(0.0, h100) == 0.0
    assert mfu(100, explicit_peak(400)) == 0.25
    assert mfu(1000.0, explicit_peak(500.0)) == 2.0  # above the peak: reported as is (a wrong FLOP count shows up)
    assert mfu(123.0, None) is None
    assert mfu(123.0, peak_tflops("NVIDIA GeForce RTX 4090")) is None
    for bad in (-1.0, math.nan, math.inf, "1", True):
        with pytest.raises(ValueError, match="achieved"):
            mfu(bad, h100)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------ FLOP counts

IN, OUT, BATCH = 8, 16, 4


def test_measure_flops_linear_exact() -> None:
    model = nn.Linear(IN, OUT)
    x = torch.randn(BATCH, IN)
    assert measure_flops(model, x) == 2 * BATCH * IN * OUT
    assert measure_flops(lambda a, b: a @ b, torch.randn(3, 5), b=torch.randn(5, 7)) == 2 * 3 * 5 * 7
    assert measure_flops(torch.relu, x) == 0  # elementwise: not counted


def test_flops_per_sample_linear() -> None:
    torch.manual_seed(0)
    model = nn.Linear(IN, OUT)
    x = torch.randn(BATCH, IN)
    forward = flops_per_sample(model, x, backward=False)
    assert forward == 2 * IN * OUT  # 2 FLOPs per multiply-add, per sample; the bias add is not counted
    # backward: dL/dW is one more matmul of the same size; dL/dx is not computed (x does not require grad)
    assert flops_per_sample(model, x) == 2 * forward
    # with an input that requires grad (any layer but the first) the backward is two matmuls: 3x forward
    x_grad = torch.randn(BATCH, IN, requires_grad=True)
    assert flops_per_sample(model, x_grad) == 3 * forward
    assert x_grad.grad is None  # the input's gradient is not left behind either
    # the per-sample figure does not depend on the batch size
    assert flops_per_sample(model, torch.randn(32, IN)) == 2 * forward


def _mlp() -> Any:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_flops_per_sample_mlp_hand_count() -> None:
    model = _mlp()
    x = torch.randn(5, 8)
    forward = 2 * (8 * 16 + 16 * 4)
    assert flops_per_sample(model, x, backward=False) == forward == 384
    # backward: layer 1 weight grad only; layer 2 weight grad + input grad
    backward = 2 * 8 * 16 + 2 * (2 * 16 * 4)
    assert flops_per_sample(model, x) == forward + backward == 896


def _conv_net() -> Any:
    return nn.Sequential(
        nn.Conv2d(3, 8, kernel_size=3, padding=1),  # 3x16x16 -> 8x16x16
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Conv2d(8, 4, kernel_size=3, stride=2, padding=1),  # -> 4x8x8
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, 10),
    )


def test_flops_per_sample_conv_hand_count() -> None:
    model = _conv_net()
    x = torch.randn(2, 3, 16, 16)
    conv1 = 2 * (8 * 16 * 16) * (3 * 3 * 3)  # 2 x output elements x (C_in x k x k)
    conv2 = 2 * (4 * 8 * 8) * (8 * 3 * 3)
    linear = 2 * (4 * 8 * 8) * 10
    assert (conv1, conv2, linear) == (110_592, 36_864, 5_120)
    assert flops_per_sample(model, x, backward=False) == conv1 + conv2 + linear
    # backward: conv1 weight grad only (its input needs no grad); conv2 and linear: weight + input grads
    expected = (conv1 + conv2 + linear) + conv1 + 2 * conv2 + 2 * linear
    assert flops_per_sample(model, x) == expected == 347_136


def test_flops_per_sample_restores_grads_modes_buffers_and_rng() -> None:
    torch.manual_seed(0)
    model = _conv_net()
    x = torch.randn(2, 3, 16, 16)
    params = list(model.parameters())
    # existing gradients on some parameters (as mid-accumulation), none on the others
    sentinels = {}
    for i, p in enumerate(params):
        if i % 2 == 0:
            p.grad = torch.full_like(p, 7.0)
            sentinels[i] = p.grad
    # mixed train/eval flags: eval at the top, one submodule in training mode (e.g. a BN left training)
    model.eval()
    model[1].train()
    modes = [m.training for m in model.modules()]
    bn = model[1]
    stats = (bn.running_mean.clone(), bn.running_var.clone(), bn.num_batches_tracked.clone())

    seen_training: list[bool] = []
    model[4].register_forward_pre_hook(lambda module, args: seen_training.append(module.training))

    torch.manual_seed(123)
    flops_per_sample(model, x)
    after = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(3))  # dropout did not advance the global generator

    assert seen_training == [True]  # measured in training mode
    assert [m.training for m in model.modules()] == modes
    for i, p in enumerate(params):
        if i in sentinels:
            assert p.grad is sentinels[i]  # the same tensor object ...
            assert torch.equal(p.grad, torch.full_like(p, 7.0))  # ... untouched by the backward
        else:
            assert p.grad is None
    assert torch.equal(bn.running_mean, stats[0])  # training-mode BN updated its statistics; they are restored
    assert torch.equal(bn.running_var, stats[1])
    assert torch.equal(bn.num_batches_tracked, stats[2])


def test_flops_per_sample_restores_state_on_error() -> None:
    model = _mlp()
    model.eval()
    p = next(model.parameters())
    p.grad = torch.ones_like(p)
    grad = p.grad

    def bad_loss(output: Any) -> Any:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        flops_per_sample(model, torch.randn(2, 8), loss_fn=bad_loss)
    assert p.grad is grad and not model.training and not model[0].training


class _TwoInputs(nn.Module):  # type: ignore[misc, name-defined]  # (a base from pytest.importorskip's module object: Any to mypy)
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 4)
        self.b = nn.Linear(6, 4)

    def forward(self, x: Any, y: Any) -> Any:
        return self.a(x) + self.b(y), x.sum()


def test_flops_per_sample_batch_structures() -> None:
    model = _TwoInputs()
    x, y = torch.randn(3, 8), torch.randn(3, 6)
    forward = 2 * (8 * 4 + 6 * 4)
    assert flops_per_sample(model, (x, y), backward=False) == forward  # model(*batch)
    assert flops_per_sample(model, [x, y], backward=False) == forward
    assert flops_per_sample(model, {"x": x, "y": y}, backward=False) == forward  # model(**batch)
    # tuple output: the default loss is output[0].sum(); weight grads of both layers
    assert flops_per_sample(model, (x, y)) == 2 * forward


def test_flops_per_sample_loss_fn() -> None:
    model = nn.Linear(IN, OUT)
    x = torch.randn(BATCH, IN)
    w = torch.randn(OUT, 3)
    calls = []

    def loss_fn(output: Any) -> Any:
        calls.append(output.shape)
        return (output @ w).sum()  # a matmul in the loss is counted: forward + its input grad

    extra = 2 * OUT * 3
    assert flops_per_sample(model, x, loss_fn=loss_fn) == 2 * (2 * IN * OUT) + 2 * extra
    assert calls == [torch.Size([BATCH, OUT])]


def test_flops_per_sample_errors() -> None:
    with pytest.raises(ValueError, match="no tensor"):
        flops_per_sample(_mlp(), {"x": [1, 2, 3]})
    with pytest.raises(ValueError, match="no batch dimension"):
        flops_per_sample(_mlp(), torch.tensor(1.0))
    frozen = _mlp().requires_grad_(False)
    with pytest.raises(ValueError, match="does not require grad"):
        flops_per_sample(frozen, torch.randn(2, 8))
    assert flops_per_sample(frozen, torch.randn(2, 8), backward=False) == 384

    with pytest.raises(TypeError, match="pass loss_fn"):
        flops_per_sample(_StrOut(), torch.randn(2, 8))
    # a mapping output: the default loss is the first value's sum
    assert flops_per_sample(_DictOut(), torch.randn(2, 8)) == 2 * (2 * 8 * 8)


class _StrOut(nn.Module):  # type: ignore[misc, name-defined]  # (a base from pytest.importorskip's module object: Any to mypy)
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        self.lin(x)
        return "not a tensor"


class _DictOut(_StrOut):
    def forward(self, x: Any) -> Any:
        return {"logits": self.lin(x), "other": x}


def test_cpu_attention_limit_is_real() -> None:
    """The documented limit: CPU SDPA counts 0 unless measured with the math backend (where it counts its bmms)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 3, 8, 4)  # batch, heads, seq, head_dim
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert measure_flops(sdpa, q, q, q) == 0
    with sdpa_kernel(SDPBackend.MATH):
        assert measure_flops(sdpa, q, q, q) == 2 * (2 * (2 * 3) * 8 * 8 * 4)  # QK^T and PV, 2 FLOPs per MAC each


def test_a_transformer_measures_the_documented_formula() -> None:
    """docs/training.md: a dense transformer of N matmul parameters, L layers of width d, on sequences of T tokens:
    6 x N x T + 12 x L x T^2 x d per sample (attention in full), computed here from the model's own shapes."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    d, layers, seq, batch = 32, 3, 16, 2
    model = nn.Sequential(*[nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
                            for _ in range(layers)])
    n = sum(p.numel() for p in model.parameters() if p.dim() == 2)  # the weights of the matmuls, no bias or norm
    x = torch.randn(batch, seq, d, requires_grad=True)
    with sdpa_kernel(SDPBackend.MATH):
        measured = flops_per_sample(model, x)
    assert measured == 6 * n * seq + 12 * layers * seq**2 * d


# ------------------------------------------------------------------------------------------------- import isolation

def test_import_does_not_import_torch() -> None:
    code = textwrap.dedent("""
        import sys
        import telemetrain
        assert "torch" not in sys.modules, "import telemetrain imported torch"
        import telemetrain.training.flops as flops
        assert "torch" not in sys.modules, "import telemetrain.training.flops imported torch"
        assert flops.match_device("NVIDIA H100 PCIe") == "H100-PCIe"
        assert flops.peak_tflops("NVIDIA H100 PCIe", "bf16").tflops == 756.5
        assert flops.explicit_peak(10.0).tflops == 10.0 and flops.mfu(5.0, flops.explicit_peak(10.0)) == 0.5
        assert "torch" not in sys.modules, "the table lookups imported torch"
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
