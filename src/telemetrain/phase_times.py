"""Which phase times a reader shows: the device's when a report has them, else the host's -- and says which.

A ``training_metrics_update`` carries host times for every phase (``avg_<phase>_time_sec``: what the host spent,
launches included) and, when device timing was on (``training.device_timing``), device times
(``avg_<phase>_device_time_sec``). On CUDA the host times describe launch overhead and pile the device's work into
whichever phase holds the sync, so every reader -- the report's phase split and slow-phase findings, the straggler
detector, ``compare`` -- takes the device times whenever they exist and labels what it shows. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEVICE", "HOST", "LABELS", "PHASES", "iteration_time", "phase_times"]

PHASES = ("dataloader", "forward", "backward", "optimizer", "zero_grad")
DEVICE = "device"
HOST = "host"
LABELS = {DEVICE: "device time (CUDA events)", HOST: "host time"}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def phase_times(attributes: Mapping[str, Any], phases: Sequence[str] = PHASES) -> tuple[dict[str, float], str]:
    """The report's mean seconds per iteration of each phase, and ``"device"`` or ``"host"``: the device times when
    the report has any (the phases without one are then left out rather than mixed in), else the host times."""
    device = {}
    for phase in phases:
        value = _finite(attributes.get(f"avg_{phase}_device_time_sec"))
        if value is not None:
            device[phase] = value
    if device:
        return device, DEVICE
    host = {}
    for phase in phases:
        value = _finite(attributes.get(f"avg_{phase}_time_sec"))
        if value is not None:
            host[phase] = value
    return host, HOST


def iteration_time(attributes: Mapping[str, Any], source: str) -> float | None:
    """The report's mean iteration time on the same clock as its phases (``source``: what ``phase_times`` said)."""
    if source == DEVICE:
        value = _finite(attributes.get("avg_iteration_device_time_sec"))
        if value is not None:
            return value
    return _finite(attributes.get("avg_iteration_time_sec"))
