"""Which metrics are running totals rather than readings: the backends that tell the two apart (Prometheus counters
with ``_total``, OpenTelemetry observable counters) share this one list.

A total is a value that only grows from a start (the system sampler's I/O bytes since it started, a process's CPU
time, error counts) or anything in joules: energy is exported as a counter and the backend derives watts from its
rate (https://prometheus.io/docs/practices/naming/: "export a joules counter") -- except the few derived values in
joules that are no totals (``GAUGE_METRICS``: joules per sample). Everything else is a gauge.
"""

from __future__ import annotations

from .ucum import base_unit

__all__ = ["CUMULATIVE_METRICS", "CUMULATIVE_UNITS", "GAUGE_METRICS", "is_cumulative"]

# cumulative metrics of docs/system.md (v2 names, and the v1 names for records read back from old runs) and the
# derived training totals of docs/training.md
CUMULATIVE_METRICS = frozenset(
    {
        "system.disk.io",
        "system.network.io",
        "process.cpu.time",
        "hw.errors",
        "torch.cuda.alloc_retries",
        "torch.cuda.ooms",
        "container.memory.oom_kills",
        "container.memory.ooms",
        "container.memory.limit_hits",
        "train.iterations",
        "train.samples",
        "train.tokens",
        "train.flops",
        "train.checkpoint.saves",
        "train.checkpoint.save_time",
        # v1
        "system.disk.io.read",
        "system.disk.io.write",
        "system.network.io.receive",
        "system.network.io.transmit",
        "hw.errors.corrected",
        "hw.errors.uncorrected",
    }
)

CUMULATIVE_UNITS = frozenset({"J"})

# in joules but not running totals: the derived energy per sample/token of a window (docs/training.md, "Energy"),
# and the window energy older runs wrote (train.energy is now the loop's running total, a counter)
GAUGE_METRICS = frozenset({"train.energy_per_sample", "train.energy_per_token", "train.energy_J",
                           "train.energy_per_sample_J", "train.energy_per_token_J"})


def is_cumulative(name: str, unit: str) -> bool:
    """A running total: a known cumulative metric, a quantity in joules (``J``, or ``kJ``, ``Wh``, ``kWh``: joules
    in another scale), or a name that says so."""
    if name in GAUGE_METRICS:
        return False
    return (name in CUMULATIVE_METRICS or name.endswith((".total", "_total")) or unit in CUMULATIVE_UNITS
            or base_unit(unit)[0] in CUMULATIVE_UNITS)
