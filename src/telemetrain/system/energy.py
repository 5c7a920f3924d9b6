"""The energy of this process's GPUs, read on demand: what the training recorder divides by the work done.

The sampler records ``hw.energy`` every ``interval`` seconds; energy per sample needs readings at the recorder's
report boundaries instead, so ``GpuEnergy`` reads the same counter when asked (one NVML call per GPU, ~10-50 us,
made in the collector thread where the report is computed). Sources, per GPU, decided at the first reading:

- ``counter``: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded; Volta and later), differenced
  from the first reading, wraps and resets handled (``units.EnergyCounter``);
- ``power_integral``: no counter -- the trapezoidal integral of ``nvmlDeviceGetPowerUsage`` at each reading. Coarse:
  it sees the power only at the readings (one per report), so it is labelled apart and a reader never mistakes it.

Shared GPUs: a GPU several processes compute on (ranks that share a device, another job on the same GPU) is not
this process's alone. Each reading also counts the compute processes NVML lists on the GPU (``sharers``), and the
recorder attributes ``1 / sharers`` of the GPU's energy to this process, so that summing over the ranks of a job
counts each GPU once.

Without nvidia-ml-py, without a driver, or when this process uses no GPU: no energy and one ``reason``; nothing is
warned and nothing raises.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .cuda_allocator import current_device
from .devices import select_gpus
from .nvml import list_gpus
from .units import EnergyCounter, PowerIntegrator

__all__ = ["EnergyReading", "GpuEnergy"]

_mono = time.monotonic_ns
_MISSING = object()


@dataclass(frozen=True)
class EnergyReading:
    """One reading: joules since the meter's first reading, summed over its GPUs, at ``mono_ns``."""

    mono_ns: int
    joules: float
    sharers: int  # compute processes on the GPU (the most of any of its GPUs), at least 1


class _Gpu:
    __slots__ = ("counter", "handle", "integrator", "source", "uuid")

    def __init__(self, handle: Any, uuid: str) -> None:
        self.handle = handle
        self.uuid = uuid
        self.source = ""  # decided at the first reading
        self.counter = EnergyCounter()
        self.integrator = PowerIntegrator()


class GpuEnergy:
    """Joules of this process's GPUs since the first ``read()``. ``cuda_indices``: CUDA ordinals of this process (as
    ``cuda:k``); default: torch's current device (read only if the program initialised CUDA). ``nvml``: the pynvml
    module (default: imported here)."""

    def __init__(self, cuda_indices: Sequence[int] | None = None, nvml: Any = _MISSING) -> None:
        self.reason = ""
        self.gpus: list[_Gpu] = []
        self._nv: Any = None
        if nvml is _MISSING:
            try:
                nvml = importlib.import_module("pynvml")
            except Exception:  # noqa: BLE001 - ImportError, or a broken install: no energy
                self.reason = "nvidia-ml-py is not installed (pip install 'telemetrain[system]')"
                return
        if nvml is None:
            self.reason = "nvidia-ml-py is not installed (pip install 'telemetrain[system]')"
            return
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001
            self.reason = f"NVML did not start ({type(exc).__name__}: {exc}): no NVIDIA driver here?"
            return
        self._nv = nvml
        wanted = list(cuda_indices) if cuda_indices is not None else []
        if not wanted:
            k = current_device()
            if k is None:
                self.reason = "this process has not initialised CUDA: no GPU of its own to read"
                return
            wanted = [k]
        listed = list_gpus(nvml)
        if isinstance(listed, str):
            self.reason = listed
            return
        handles, uuids = listed
        choices, reason = select_gpus(uuids, requested=wanted, cuda_visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
                                      local_rank=None, torch_device=None)
        self.gpus = [_Gpu(handles[c.nvml_index], c.uuid) for c in choices if handles[c.nvml_index] is not None]
        if not self.gpus:
            self.reason = reason or ("NVML cannot open this process's GPU (lost, or not this process's to read)"
                                     if choices else "no GPU selected")

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]

    @property
    def source(self) -> str:
        """``counter``, ``power_integral``, ``mixed`` (GPUs differ), or ``""`` before the first reading / none."""
        sources = {g.source for g in self.gpus if g.source}
        return sources.pop() if len(sources) == 1 else ("mixed" if sources else "")

    def read(self) -> EnergyReading | None:
        """Joules since the first reading (0 at it), or None when no GPU could be read. Never raises."""
        nv = self._nv
        if nv is None or not self.gpus:
            return None
        now = _mono()
        total = 0.0
        read_any = False
        sharers = 1
        for gpu in self.gpus:
            joules = self._joules(nv, gpu, now)
            if joules is None:
                continue
            read_any = True
            total += joules
            try:
                sharers = max(sharers, len(nv.nvmlDeviceGetComputeRunningProcesses(gpu.handle)))
            except Exception:  # noqa: BLE001 - not listed: taken as this process's alone
                pass
        return EnergyReading(now, total, sharers) if read_any else None

    def _joules(self, nv: Any, gpu: _Gpu, now: int) -> float | None:
        if gpu.source in ("", "counter"):
            try:
                joules = gpu.counter.update(int(nv.nvmlDeviceGetTotalEnergyConsumption(gpu.handle)))
                gpu.source = "counter"
                return joules
            except Exception:  # noqa: BLE001 - no counter on this GPU (before Volta) or not readable: power
                if gpu.source == "counter":
                    return None  # it worked before: a failed reading this time
        try:
            watts = float(nv.nvmlDeviceGetPowerUsage(gpu.handle)) / 1000.0
        except Exception:  # noqa: BLE001
            return None
        gpu.source = "power_integral"
        return gpu.integrator.update(now, watts)
