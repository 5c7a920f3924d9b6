"""Without the [system] extra: what a newcomer gets who installed only telemetrain and torch (the core), or
``telemetrain[demo]`` (psutil, but not nvidia-ml-py): no NVML warning, one ``info`` event saying why GPU metrics are
absent, and device timing and GPU energy falling back to the host, silently.

CI (.ci/run) runs this module, with the core tests, in a second venv that has only torch and the test tools -- there
the absence is genuine: first without psutil and nvidia-ml-py, then with psutil added (the [demo] extra). In the full
venv the same tests run with nvidia-ml-py's import made to fail (``sys.modules["pynvml"] = None`` in this process; a
``pynvml`` that raises ImportError on the path of a subprocess), which is what its absence looks like to the importer.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import telemetrain
from conftest import run_dir_of
from telemetrain.spans import span
from telemetrain.store import open_run

HAS_PSUTIL = importlib.util.find_spec("psutil") is not None
HAS_NVML = importlib.util.find_spec("pynvml") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
ABSENCE = "genuine" if not HAS_NVML else "import blocked"


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    if HAS_NVML:
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError


def _blocked_nvml_path(tmp_path: Path) -> dict[str, str]:
    """The environment of a subprocess in which ``import pynvml`` fails as if nvidia-ml-py were not installed."""
    env = dict(os.environ)
    if HAS_NVML:
        shim = tmp_path / "no_nvml"
        shim.mkdir()
        (shim / "pynvml.py").write_text('raise ImportError("nvidia-ml-py is not installed (test: import blocked)")\n')
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), env.get("PYTHONPATH", "")) if p)
    return env


def test_import_system_without_psutil_names_the_extra() -> None:
    code = ("import sys\n"
            + ("sys.modules['psutil'] = None\n" if HAS_PSUTIL else "")
            + "try:\n    import telemetrain.system\nexcept ImportError as exc:\n    print('IMPORTERROR', exc)\n"
            "import telemetrain\nprint('CORE-OK', telemetrain.__version__)\n")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "IMPORTERROR" in out.stdout and "telemetrain[system]" in out.stdout and "CORE-OK" in out.stdout


@pytest.mark.skipif(not HAS_PSUTIL, reason="the sampler needs psutil (the [system] or [demo] extra)")
def test_the_sampler_without_nvidia_ml_py_records_one_info_event_and_stays_silent(
    tmp_path: Path, no_nvml: None
) -> None:
    """Issue 15 item 1: without nvidia-ml-py every sample warned ``'NvmlSource' object has no attribute '_nv'`` and
    recorded a sampler_error diagnostic. Now: one info event with the reason, no warning, no error."""
    from telemetrain import system

    t = telemetrain.Telemetry(store=tmp_path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning fails the test
            s = system.Sampler(t, interval=60)
            s.sample_now()
            s.sample_now()
            assert s.errors == 0 and s.error_counts == {}
            s.stop()
        assert t.flush()
        run = open_run(run_dir_of(t))
        unavailable = [e for e in run.records("event") if e.name == "system.gpu.unavailable"]
        assert len(unavailable) == 1 and unavailable[0].severity == "info"
        assert "nvidia-ml-py is not installed" in unavailable[0].attributes["reason"]
        assert [d.name for d in run.records("diagnostic") if d.name == "sampler_error"] == []
    finally:
        t.close()


@pytest.mark.skipif(not (HAS_PSUTIL and HAS_TORCH), reason="the demo needs torch and psutil (the [demo] extra)")
def test_the_first_demo_without_nvidia_ml_py_prints_no_telemetry_warning(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    out = subprocess.run([sys.executable, "-m", "telemetrain.cli", "demo", "--steps", "3", "--root", str(root),
                          "--in-process", "--no-crash"], capture_output=True, text=True, timeout=300,
                         env=_blocked_nvml_path(tmp_path))
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "TelemetryWarning" not in text and "nvml" not in text.lower(), f"({ABSENCE}) {text}"
    runs = [p.parent for p in root.rglob("run.json")]
    assert runs
    for run_dir in runs:
        run = open_run(run_dir)
        reasons = [e.attributes["reason"] for e in run.records("event") if e.name == "system.gpu.unavailable"]
        assert reasons and all("nvidia-ml-py" in r for r in reasons)
        assert not [d for d in run.records("diagnostic") if d.name == "sampler_error"]


@pytest.mark.skipif(not HAS_TORCH, reason="a CUDA-less torch is the case under test")
def test_device_timing_and_gpu_energy_fall_back_to_the_host_silently(tmp_path: Path) -> None:
    """On a machine without CUDA (or a job not on the GPU): 'auto' times on the host, energy is off, each says why
    in an info event; span(device=True) is a host span. No warning."""
    import torch  # noqa: F401 - a training process has torch loaded

    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    t = telemetrain.Telemetry(store=tmp_path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=2, log_every_n_train_iterations=2),
                                 telemetry=t)
            r.on_app_start()
            r.on_train_start(0)
            for _ in range(4):
                r.on_training_single_iteration_start()
                with r.forward():
                    pass
                with span("attention", device=True, telemetry=t):
                    pass
                r.on_training_single_iteration_end()
            r.on_train_end()
            r.on_app_end()
        assert t.flush()
        events = list(open_run(run_dir_of(t)).records("event"))
        (info,) = [e for e in events if e.name == "device_timing" and "for" not in e.attributes]
        assert info.severity == "info" and info.attributes["mode"] == "host" and info.attributes["reason"]
        assert info.attributes["energy"] == "none" and info.attributes["energy_reason"]
        (span_info,) = [e for e in events if e.name == "device_timing" and "for" in e.attributes]
        assert span_info.attributes["mode"] == "host"
        updates = [e.attributes for e in events if e.name == "training_metrics_update"]
        assert updates and not any(k.endswith("_device_time_sec") or "energy" in k for u in updates for k in u)
    finally:
        t.close()
