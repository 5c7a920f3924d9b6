"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``).

Only the devices this rank uses are sampled (``devices.select_gpus``). Without nvidia-ml-py, without a driver, or
with no GPU selected, the source samples nothing and says why once (``reason``, recorded by the sampler as the event
``system.gpu.unavailable``); nothing raises into the program.

Each value is read with its own call. A call NVML answers with "not supported" or "no permission" (ECC on a GPU
without it, energy before Volta, clocks reasons on some boards) is not asked again on that device: that metric is
absent for the run, not 0. Any other NVML error is a failure of that one value in that cycle (counted, warned once,
recorded). Energy is the GPU's own counter (mJ since the driver loaded) as joules since the sampler started,
wraparound and resets handled (``units.EnergyCounter``); a GPU without the counter gets the trapezoidal integral of
its power samples under a different name (``hw.energy.integrated``), so a reader always knows which it has.
pynvml calls go through ctypes, which releases the GIL while the driver answers.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import Any

from .base import Cycle
from .cuda_allocator import current_device
from .devices import GpuChoice, select_gpus
from .names import gpu_group
from .units import EnergyCounter, PowerIntegrator, mhz_to_hz, milli, percent_to_ratio, ratio

__all__ = ["NvmlSource", "list_gpus"]

# NVML clock event ("throttle") reason bits (nvml.h; stable across driver versions)
_SW_POWER_CAP = 0x4
_HW_SLOWDOWN = 0x8
_SW_THERMAL = 0x20
_HW_THERMAL = 0x40
_HW_POWER_BRAKE = 0x80

# NVML return codes after which a call is not repeated on that device (FUNCTION_NOT_FOUND: nvidia-ml-py is newer than
# the driver, whose libnvidia-ml lacks the function)
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_FUNCTION_NOT_FOUND = 13

_MISSING = object()


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def list_gpus(nvml: Any) -> tuple[list[Any], list[str]] | str:
    """Every GPU NVML sees: (handles, UUIDs) in NVML's order, or why they could not be listed. A GPU NVML counts and
    cannot open (fallen off the bus, ``NVML_ERROR_GPU_IS_LOST``; not this job's under a cgroup device limit,
    ``NVML_ERROR_NO_PERMISSION``: nvidia-smi prints "Unable to determine the device handle" for it) keeps its place
    with handle None and UUID "", so that the others -- this rank's among them -- are still sampled."""
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:  # noqa: BLE001
        return f"NVML could not list the GPUs ({type(exc).__name__}: {exc})"
    handles: list[Any] = []
    uuids: list[str] = []
    for i in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except Exception:  # noqa: BLE001 - that one GPU is not readable; the choice of GPUs says so if it is ours
            handle, uuid = None, ""
        handles.append(handle)
        uuids.append(uuid)
    return handles, uuids


class _Device:
    __slots__ = ("choice", "energy", "energy_source", "handle", "integrator", "name", "pci_bus_id", "unsupported")

    def __init__(self, choice: GpuChoice, handle: Any) -> None:
        self.choice = choice
        self.handle = handle
        self.name = ""
        self.pci_bus_id = ""
        self.unsupported: set[str] = set()
        self.energy = EnergyCounter()
        self.integrator = PowerIntegrator()
        self.energy_source = "counter"


class NvmlSource:
    name = "nvml"

    def __init__(
        self, requested: str | Sequence[int | str] | None, local_rank: int | None, nvml: Any = _MISSING
    ) -> None:
        """``requested``/``local_rank``: see ``devices.select_gpus``. ``nvml``: the pynvml module (for tests that
        hand in a broken one; by default it is imported here)."""
        self.devices: list[_Device] = []
        self.reason = ""
        self.driver_version = ""
        # set before anything can return: sample() and probe_energy() run whatever happened here, and a source that
        # has no GPU must sample nothing rather than fail (issue 15 item 1: a warning on every newcomer's first demo)
        self._nv: Any = None
        self._memory_v1 = False  # nvmlDeviceGetMemoryInfo_v2 failed once: v1 from then on
        self._throttle_old = False  # the driver has no nvmlDeviceGetCurrentClocksEventReasons: the deprecated name
        if nvml is _MISSING:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                self.reason = "nvidia-ml-py is not installed (pip install 'telemetrain[system]')"
                return
            except Exception as exc:  # noqa: BLE001 - a broken install is an absent GPU source, not a failure
                self.reason = f"nvidia-ml-py could not be imported ({type(exc).__name__}: {exc})"
                return
        if nvml is None:
            self.reason = "nvidia-ml-py is not installed (pip install 'telemetrain[system]')"
            return
        self._nv = nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.reason = f"NVML did not start ({type(exc).__name__}: {exc}): no NVIDIA driver here?"
            return
        try:
            self.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - information only
            pass
        listed = list_gpus(nvml)
        if isinstance(listed, str):
            self.reason = listed
            return
        handles, uuids = listed
        choices, self.reason = select_gpus(
            uuids,
            requested=requested,
            cuda_visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
            local_rank=local_rank,
            torch_device=current_device(),
        )
        for choice in choices:
            if handles[choice.nvml_index] is None:
                self.reason = f"NVML cannot open GPU {choice.nvml_index} (lost, or not this process's to read)"
                continue
            device = _Device(choice, handles[choice.nvml_index])
            for attr, fn in (("name", nvml.nvmlDeviceGetName), ("pci_bus_id", self._bus_id)):
                try:
                    setattr(device, attr, _text(fn(device.handle)))
                except Exception:  # noqa: BLE001 - description only
                    pass
            self.devices.append(device)

    def _bus_id(self, handle: Any) -> Any:
        return self._nv.nvmlDeviceGetPciInfo(handle).busId

    @property
    def cuda_indices(self) -> list[int]:
        return [d.choice.cuda_index for d in self.devices if d.choice.cuda_index is not None]

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpu.devices": ",".join(str(d.choice.nvml_index) for d in self.devices)}
        if self.reason:
            out["gpu.reason"] = self.reason
        if self.driver_version:
            out["gpu.driver_version"] = self.driver_version
        return out

    def device_attributes(self, device: _Device) -> dict[str, Any]:
        """The attributes of the ``system.gpu.device`` event for one device."""
        c = device.choice
        attributes: dict[str, Any] = {"nvml_index": c.nvml_index, "uuid": c.uuid, "name": device.name}
        if c.cuda_index is not None:
            attributes["cuda_index"] = c.cuda_index
        if device.pci_bus_id:
            attributes["pci_bus_id"] = device.pci_bus_id
        if self.driver_version:
            attributes["driver_version"] = self.driver_version
        attributes["energy_source"] = device.energy_source
        return attributes

    def _read(self, cycle: Cycle, device: _Device, what: str, fn: Callable[[Any], Any]) -> Any:
        if what in device.unsupported:
            return None
        try:
            return fn(device.handle)
        except Exception as exc:  # noqa: BLE001 - contained: absent this cycle (or for good, if unsupported)
            if getattr(exc, "value", None) in (_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND):
                device.unsupported.add(what)
            else:
                cycle.fail(f"nvml.{what} gpu {device.choice.nvml_index}", exc)
            return None

    def probe_energy(self, cycle: Cycle) -> None:
        """Decide per device where its energy comes from (at the first sample): the counter, else power."""
        if self._nv is None:
            return
        for device in self.devices:
            if self._read(cycle, device, "energy", self._nv.nvmlDeviceGetTotalEnergyConsumption) is None:
                if "energy" in device.unsupported:
                    power = self._read(cycle, device, "power", self._nv.nvmlDeviceGetPowerUsage)
                    device.energy_source = "power_integral" if power is not None else "none"

    def sample(self, cycle: Cycle) -> None:
        nv = self._nv
        if nv is None:  # no nvidia-ml-py, no driver: the reason was recorded once (system.gpu.unavailable)
            return
        add = cycle.add
        for device in self.devices:
            group = gpu_group(device.choice.nvml_index)
            read = self._read

            util = read(cycle, device, "utilization", nv.nvmlDeviceGetUtilizationRates)
            if util is not None:
                add(group, "hw.gpu.utilization", percent_to_ratio(util.gpu))
                add(group, "hw.gpu.memory_controller.utilization", percent_to_ratio(util.memory))
            memory = read(cycle, device, "memory", self._memory)
            if memory is not None:
                add(group, "hw.gpu.memory.usage", int(memory.used))
                add(group, "hw.gpu.memory.limit", int(memory.total))
                add(group, "hw.gpu.memory.utilization", ratio(memory.used, memory.total))

            power_mw = read(cycle, device, "power", nv.nvmlDeviceGetPowerUsage)
            watts = milli(power_mw)
            add(group, "hw.power", watts)
            limit_mw = read(cycle, device, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit)
            add(group, "hw.gpu.power.limit", milli(limit_mw))
            if device.energy_source == "counter":
                energy_mj = read(cycle, device, "energy", nv.nvmlDeviceGetTotalEnergyConsumption)
                if energy_mj is not None:
                    add(group, "hw.energy", device.energy.update(int(energy_mj)))
            elif device.energy_source == "power_integral":
                add(group, "hw.energy.integrated", device.integrator.update(cycle.mono_ns, watts))

            add(group, "hw.temperature", read(cycle, device, "temperature", self._temperature))
            add(group, "hw.gpu.clock.sm", mhz_to_hz(read(cycle, device, "clock_sm", self._clock_sm)))
            add(group, "hw.gpu.clock.memory", mhz_to_hz(read(cycle, device, "clock_memory", self._clock_memory)))
            reasons = read(cycle, device, "throttle", self._throttle)
            if reasons is not None:
                reasons = int(reasons)
                add(group, "hw.gpu.throttle.power", int(bool(reasons & (_SW_POWER_CAP | _HW_POWER_BRAKE))))
                add(group, "hw.gpu.throttle.thermal", int(bool(reasons & (_SW_THERMAL | _HW_THERMAL))))
                add(group, "hw.gpu.throttle.hw_slowdown", int(bool(reasons & _HW_SLOWDOWN)))
                add(group, "hw.gpu.throttle.reasons", reasons)
            add(group, "hw.errors.corrected", read(cycle, device, "ecc_corrected", self._ecc_corrected))
            add(group, "hw.errors.uncorrected", read(cycle, device, "ecc_uncorrected", self._ecc_uncorrected))
            processes = read(cycle, device, "processes", nv.nvmlDeviceGetComputeRunningProcesses)
            if processes is not None and cycle.pids:
                ours = [p.usedGpuMemory for p in processes if p.pid in cycle.pids and p.usedGpuMemory is not None]
                # absent unless NVML lists one of ours: in a container NVML gives host pids, which match none
                add(group, "hw.gpu.process.memory.usage", sum(int(m) for m in ours) if ours else None)

    # -- calls with arguments ------------------------------------------------------------------------------------------

    def _temperature(self, handle: Any) -> Any:
        return self._nv.nvmlDeviceGetTemperature(handle, self._nv.NVML_TEMPERATURE_GPU)

    def _clock_sm(self, handle: Any) -> Any:
        return self._nv.nvmlDeviceGetClockInfo(handle, self._nv.NVML_CLOCK_SM)

    def _memory(self, handle: Any) -> Any:
        """Memory in use as nvidia-smi counts it: ``nvmlDeviceGetMemoryInfo_v2``, whose ``used`` leaves out what the
        driver reserves (about 480 MiB on an H100 with driver 580, which the v1 call counts as used); v1 where the
        driver or nvidia-ml-py has no v2."""
        nv = self._nv
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None and not self._memory_v1:
            try:
                return nv.nvmlDeviceGetMemoryInfo(handle, version=version)
            except Exception:  # noqa: BLE001 - an older driver or nvidia-ml-py: v1 from now on
                self._memory_v1 = True
        return nv.nvmlDeviceGetMemoryInfo(handle)

    def _clock_memory(self, handle: Any) -> Any:
        return self._nv.nvmlDeviceGetClockInfo(handle, self._nv.NVML_CLOCK_MEM)

    def _throttle(self, handle: Any) -> Any:
        """``nvmlDeviceGetCurrentClocksEventReasons`` (driver 535 and later), else its deprecated name: nvidia-ml-py
        has the new function whatever the driver, and an older driver's library answers it FUNCTION_NOT_FOUND."""
        nv = self._nv
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is not None and not self._throttle_old:
            try:
                return fn(handle)
            except Exception as exc:
                if getattr(exc, "value", None) != _FUNCTION_NOT_FOUND:
                    raise
                self._throttle_old = True
        return nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)

    def _ecc_corrected(self, handle: Any) -> Any:
        nv = self._nv
        return nv.nvmlDeviceGetTotalEccErrors(handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)

    def _ecc_uncorrected(self, handle: Any) -> Any:
        nv = self._nv
        return nv.nvmlDeviceGetTotalEccErrors(handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
