"""Unit conversions done where a value is sampled, and the two energy accumulators.

Every sampled value leaves the sampler in a base unit (ratio 0-1, bytes, seconds, W, J, Hz, degrees Celsius), so no
consumer has to know that NVML speaks mW, mJ, MHz and percent. ``None`` means "could not be read" and passes through
every conversion unchanged: an absent value stays absent, it never becomes 0.

Standard library only (the sampler's sources import psutil and pynvml; this module does not).
"""

from __future__ import annotations

import math

__all__ = [
    "COUNTER_WRAP",
    "UNITS",
    "EnergyCounter",
    "PowerIntegrator",
    "joules_to_kwh",
    "mhz_to_hz",
    "milli",
    "percent_to_ratio",
    "ratio",
]

# The units the sampler puts on its records (UCUM, as OpenTelemetry writes them; Prometheus sinks translate).
UNITS = {
    "ratio": "1",
    "bytes": "By",
    "seconds": "s",
    "watts": "W",
    "joules": "J",
    "hertz": "Hz",
    "celsius": "Cel",
}

JOULES_PER_KWH = 3.6e6
# NVML's energy counter is an unsigned 64-bit count of mJ.
COUNTER_WRAP = 1 << 64


def percent_to_ratio(percent: float | None) -> float | None:
    """NVML and psutil percentages (0-100) as a ratio (0-1)."""
    return None if percent is None else percent / 100.0


def milli(value: float | None) -> float | None:
    """mW -> W, mJ -> J."""
    return None if value is None else value / 1000.0


def mhz_to_hz(mhz: float | None) -> int | float | None:
    if mhz is None:
        return None
    return mhz * 1_000_000 if isinstance(mhz, int) else mhz * 1e6


def joules_to_kwh(joules: float) -> float:
    return joules / JOULES_PER_KWH


def ratio(part: float | None, whole: float | None) -> float | None:
    """``part / whole``, absent when either is absent or ``whole`` is not positive (a machine without swap has no
    swap utilisation, rather than 0 of 0)."""
    if part is None or whole is None or not whole > 0:
        return None
    return part / whole


class EnergyCounter:
    """Joules consumed since the first reading of a cumulative mJ counter (NVML's total energy since driver load).

    The counter can go backwards in three ways. A wrap of the unsigned 64-bit counter (a reading just above 0 after one
    near 2**64) adds the distance through the wrap. A reset (driver reload, GPU reset: the counter restarts from 0,
    so the reading is far below the last: under half of it) adds the new reading itself, the energy since the reset;
    what was consumed between the last reading and the reset is lost, and ``resets`` counts such events. A small step
    back (a glitch: above half the last reading) adds nothing and is counted in ``glitches``; the last reading stays
    the reference, so the next one counts from it -- adding the whole counter (energy since the driver loaded, often
    megajoules) as a reset would have been a spike of that size."""

    __slots__ = ("_last_mj", "_total_mj", "glitches", "resets", "wraps")

    def __init__(self) -> None:
        self._last_mj: int | None = None
        self._total_mj = 0
        self.resets = 0
        self.wraps = 0
        self.glitches = 0

    def update(self, reading_mj: int) -> float:
        """Feed one reading (mJ); returns joules since the first reading."""
        last = self._last_mj
        if last is not None:
            if reading_mj >= last:
                self._total_mj += reading_mj - last
            elif last > COUNTER_WRAP // 2 and reading_mj < COUNTER_WRAP // 2:
                self.wraps += 1
                self._total_mj += COUNTER_WRAP - last + reading_mj
            elif reading_mj > last // 2:
                self.glitches += 1
                return self._total_mj / 1000.0
            else:
                self.resets += 1
                self._total_mj += reading_mj
        self._last_mj = reading_mj
        return self._total_mj / 1000.0

    @property
    def joules(self) -> float:
        return self._total_mj / 1000.0


class PowerIntegrator:
    """Joules from power readings (W) at known monotonic times, by the trapezoidal rule: the fallback where a GPU has
    no energy counter (before Volta). Coarser than the counter: it sees the power only at the sampling instants."""

    __slots__ = ("_joules", "_last")

    def __init__(self) -> None:
        self._last: tuple[int, float] | None = None
        self._joules = 0.0

    def update(self, mono_ns: int, watts: float | None) -> float:
        """Feed one reading; returns joules since the first. A missing reading breaks the integral there (the gap is
        not guessed), and the next reading starts a new segment."""
        if watts is None or not math.isfinite(watts):
            self._last = None
            return self._joules
        last = self._last
        if last is not None and mono_ns > last[0]:
            self._joules += (last[1] + watts) / 2.0 * (mono_ns - last[0]) / 1e9
        self._last = (mono_ns, watts)
        return self._joules

    @property
    def joules(self) -> float:
        return self._joules
