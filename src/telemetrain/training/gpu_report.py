"""What a GPU job adds to each ``training_metrics_update``: device times (``device_timing``) and energy per unit of
work (``system.energy``). The recorder builds one ``GpuReport`` per training loop when either is on; the reporter
calls it at the end of each report's computation (in the collector thread, or in the training thread for a final
report). docs/training.md, "Device time" and "Energy", defines each attribute.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

from ..dispatch import describe
from ..semconv import TRAIN_PHASE
from ..telemetry import Telemetry
from .device_spans import timer_of
from .device_timing import FINAL_WAIT_S, DeviceTimer
from .names import PHASES

__all__ = ["METRICS", "EnergySource", "GpuReport", "start_gpu_report"]

# attribute -> (metric record name, UCUM unit, attributes, factor), as reports.METRICS: the device's phase times are
# one series per ``train.phase``, like the host's ``train.phase.duration``
METRICS: dict[str, tuple[str, str, dict[str, str] | None, float]] = {
    "avg_iteration_device_time_sec": ("train.iteration_time.device.mean", "s", None, 1.0),
    **{f"avg_{p}_device_time_sec": ("train.phase.device_duration", "s", {TRAIN_PHASE: p}, 1.0)
       for p in PHASES.values()},
    "avg_stall_time_sec": ("train.stall_time", "s", None, 1.0),
    # (the unit is the record's, not the name's: Prometheus and OpenTelemetry add their own suffix to the name)
    "cumulative_energy_J": ("train.energy", "J", None, 1.0),  # a running total: a joules counter (cumulative.py)
    "energy_per_sample_J": ("train.energy_per_sample", "J", None, 1.0),
    "energy_per_token_J": ("train.energy_per_token", "J", None, 1.0),
    "avg_gpu_power_W": ("train.gpu_power", "W", None, 1.0),
}


class EnergySource(Protocol):
    """Where joules come from: ``system.energy.GpuEnergy`` (NVML), or anything with the same ``read()``."""

    def read(self) -> Any:
        """An ``EnergyReading`` (``mono_ns``, ``joules`` since the first reading, ``sharers``) or None."""
        ...


class GpuReport:
    """Device times and energy of the windows of one training loop."""

    def __init__(self, timer: DeviceTimer | None, energy: EnergySource | None) -> None:
        self.timer = timer
        self.energy = energy
        self._last: Any = None
        self._cumulative = 0.0
        self.failed = ""

    def start_loop(self) -> None:
        """A new training loop: energy counts from now; device marks of an earlier loop are left out."""
        self._cumulative = 0.0
        self._last = self._read()
        if self.timer is not None:
            self.timer.resolve()
            self.timer.take_window()

    def tail(self) -> dict[str, Any] | None:
        """A loop that ends right after a report has no final report: the iterations the device had not finished by
        that report would be in no window. Waits for them as a final report does (at most ``FINAL_WAIT_S``) and
        returns their window's attributes, or None when there are none."""
        timer = self.timer
        if timer is None or not timer.enabled:
            return None
        timer.resolve(FINAL_WAIT_S)
        timer.give_up_waiting()
        window = timer.take_window()
        if not (window.iterations or window.unresolved or window.captured):
            return None
        return {**window.attributes(), "device_timing": timer.clock.name}

    def _read(self) -> Any:
        energy = self.energy
        if energy is None or self.failed:
            return None
        try:
            return energy.read()
        except Exception as exc:  # noqa: BLE001 - a custom source that raises: no energy from now on
            self.failed = describe(exc)
            return None

    def __call__(self, snap: Any, attributes: dict[str, Any]) -> None:
        """Add this window's device and energy attributes (``snap``: the report's ``reports.Snapshot``)."""
        timer = self.timer
        if timer is not None and timer.enabled:
            if snap.final:
                timer.resolve(FINAL_WAIT_S)
                timer.give_up_waiting()
            else:
                timer.resolve()
            attributes.update(timer.take_window().attributes())
            attributes["device_timing"] = timer.clock.name
        reading = self._read()
        last = self._last
        if reading is None:
            return
        self._last = reading
        if last is None:
            return
        gpu_joules = max(reading.joules - last.joules, 0.0)
        sharers = max(int(reading.sharers), 1)
        share = gpu_joules / sharers
        self._cumulative += share
        attributes["window_energy_J"] = share
        attributes["cumulative_energy_J"] = self._cumulative
        attributes["energy_gpu_sharers"] = sharers
        attributes["energy_source"] = str(getattr(self.energy, "source", "") or "custom")
        uuids = getattr(self.energy, "uuids", None)
        if uuids:
            attributes["energy_gpus"] = ",".join(uuids)
        seconds = (reading.mono_ns - last.mono_ns) / 1e9
        if seconds > 0:
            attributes["avg_gpu_power_W"] = gpu_joules / seconds
        world = max(int(snap.world or 1), 1)
        # per global sample and token, as the iterations counted them (a short last batch, packed sequences)
        for key, count, joules in (("energy_per_sample_J", snap.window_samples, share),
                                   ("energy_per_token_J", snap.window_tokens, share),
                                   ("cumulative_energy_per_sample_J", snap.samples, self._cumulative),
                                   ("cumulative_energy_per_token_J", snap.tokens, self._cumulative)):
            if count:
                attributes[key] = joules * world / count


def _energy_source(setting: Any) -> tuple[EnergySource | None, str]:
    if setting is False:
        return None, "gpu_energy=False"
    if setting is not True:
        return setting, ""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None, "CUDA is not initialised in this process (no GPU in use)"
    except Exception as exc:  # noqa: BLE001
        return None, f"torch.cuda could not be asked ({describe(exc)})"
    try:
        from ..system.energy import GpuEnergy
    except ImportError as exc:
        return None, f"GPU energy needs the [system] extra ({describe(exc)})"
    meter = GpuEnergy()
    return (meter, "") if meter.gpus else (None, meter.reason)


AUTO_EVERY = 8  # "auto" sampling: one iteration in 8 keeps the marks' host cost under 10 us an iteration (check C)


def sampling_interval(every: int | str, report_every: int) -> int:
    """Device-time one iteration in this many: ``every`` as configured, or for ``"auto"`` ``AUTO_EVERY``, or the
    report interval when it is shorter, so that every report window has a timed iteration."""
    return every if isinstance(every, int) else max(1, min(AUTO_EVERY, report_every))


def start_gpu_report(telemetry: Telemetry, device_timing: Any, gpu_energy: Any, every: int | str = 1,
                     report_every: int = 50) -> tuple[GpuReport | None, dict[str, Any]]:
    """The loop's ``GpuReport`` (None when neither device time nor energy is measured), and the attributes of the
    ``device_timing`` event that says what is measured and, for what is not, why. ``every``: the config's
    ``device_timing_every``; ``report_every``: its ``log_every_n_train_iterations``."""
    timer, timing_reason = timer_of(telemetry, device_timing)
    energy, energy_reason = _energy_source(gpu_energy)
    info: dict[str, Any] = {"mode": timer.clock.name if timer is not None else "host"}
    if timer is None:
        info["reason"] = timing_reason
    else:
        info["capacity"] = timer.capacity
        timer.every = sampling_interval(every, report_every)
        info["every"] = timer.every
        if every == "auto":
            info["every_auto"] = True
    if energy is None:
        info["energy"] = "none"
        info["energy_reason"] = energy_reason
    else:
        info["energy"] = "on"
        uuids = getattr(energy, "uuids", None)
        if uuids:
            info["energy_gpus"] = ",".join(uuids)
    if timer is None and energy is None:
        return None, info
    report = GpuReport(timer, energy)
    report.start_loop()
    return report, info
