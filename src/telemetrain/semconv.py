"""OpenTelemetry semantic-convention names the records use, and the series key readers use for both formats.

Metric records carry dimension labels as attributes (format v2): the system sampler writes OpenTelemetry's names
with OpenTelemetry's attributes -- ``system.disk.io`` with ``disk.io.direction`` ``read``/``write``, not
``system.disk.io.read``. Format v1 had no metric attributes and put the direction in the name. A reader that wants one
key per series, whichever version wrote the record, asks ``series_key(name, attributes)``: the v1 name for the series
that had one (``system.disk.io.read``), ``name/<value>...`` for other attributes, the bare name without them.

The strings are checked against the ``opentelemetry-semantic-conventions`` package's own constants in the tests; this
module is standard library only (the core never needs the package).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEVICE_KEYS",
    "RENAMED",
    "SEMCONV_COUNTERS",
    "SEMCONV_GAUGES",
    "SEMCONV_METRICS",
    "SEMCONV_UPDOWN",
    "SYSTEM_SERIES",
    "series_key",
]

# attribute keys: OpenTelemetry's semantic conventions
DISK_IO_DIRECTION = "disk.io.direction"
NETWORK_IO_DIRECTION = "network.io.direction"
SYSTEM_MEMORY_STATE = "system.memory.state"
SYSTEM_PAGING_STATE = "system.paging.state"
SYSTEM_FILESYSTEM_STATE = "system.filesystem.state"
SYSTEM_FILESYSTEM_MOUNTPOINT = "system.filesystem.mountpoint"
SYSTEM_DEVICE = "system.device"
HW_ID = "hw.id"
HW_TYPE = "hw.type"
ERROR_TYPE = "error.type"
# attribute keys of our own (no convention covers them)
TORCH_CUDA_DEVICE = "torch.cuda.device"  # this process's CUDA ordinal of a torch.cuda allocator series
TRAIN_PHASE = "train.phase"  # the sub-phase of a training iteration (dataloader, forward, backward, ...)

# The attributes that name a device. The record's group names it too (``system.gpu.0``), so readers that already
# key by group leave them out of the series key.
DEVICE_KEYS = frozenset({HW_ID, HW_TYPE, SYSTEM_DEVICE, SYSTEM_FILESYSTEM_MOUNTPOINT, TORCH_CUDA_DEVICE})

# The system sampler's series whose v2 record has a semantic-convention name and attributes other than the device:
# series key (the v1 record name, and the sampler's own key, ``Sampler.latest()``) -> (v2 name, attributes).
SYSTEM_SERIES: dict[str, tuple[str, dict[str, str]]] = {
    "system.memory.usage": ("system.memory.usage", {SYSTEM_MEMORY_STATE: "used"}),
    "system.memory.utilization": ("system.memory.utilization", {SYSTEM_MEMORY_STATE: "used"}),
    "system.paging.usage": ("system.paging.usage", {SYSTEM_PAGING_STATE: "used"}),
    "system.paging.utilization": ("system.paging.utilization", {SYSTEM_PAGING_STATE: "used"}),
    "system.disk.io.read": ("system.disk.io", {DISK_IO_DIRECTION: "read"}),
    "system.disk.io.write": ("system.disk.io", {DISK_IO_DIRECTION: "write"}),
    "system.network.io.receive": ("system.network.io", {NETWORK_IO_DIRECTION: "receive"}),
    "system.network.io.transmit": ("system.network.io", {NETWORK_IO_DIRECTION: "transmit"}),
    "system.filesystem.usage": ("system.filesystem.usage", {SYSTEM_FILESYSTEM_STATE: "used"}),
    "system.filesystem.utilization": ("system.filesystem.utilization", {SYSTEM_FILESYSTEM_STATE: "used"}),
    "hw.errors.corrected": ("hw.errors", {ERROR_TYPE: "corrected"}),
    "hw.errors.uncorrected": ("hw.errors", {ERROR_TYPE: "uncorrected"}),
}

# The semantic conventions' metrics the sampler records, by the instrument the conventions give them (the OpenTelemetry
# sink exports them so: a monotonic sum, a non-monotonic sum, a gauge). The sampler's other names in these namespaces
# (``hw.gpu.clock.sm``, ``process.tree.memory.usage``...) are not conventions: the backends prefix them.
SEMCONV_COUNTERS = frozenset({"system.disk.io", "system.network.io", "process.cpu.time", "hw.energy", "hw.errors"})
SEMCONV_UPDOWN = frozenset({
    "system.memory.usage", "system.memory.limit", "system.paging.usage", "system.filesystem.usage",
    "system.filesystem.limit", "process.memory.usage", "process.thread.count", "process.unix.file_descriptor.count",
    "hw.gpu.memory.usage", "hw.gpu.memory.limit", "container.memory.usage", "container.memory.working_set",
})
SEMCONV_GAUGES = frozenset({
    "system.cpu.utilization", "system.memory.utilization", "system.paging.utilization",
    "system.filesystem.utilization", "process.cpu.utilization", "hw.gpu.utilization", "hw.gpu.memory.utilization",
    "hw.power", "hw.temperature",
})
SEMCONV_METRICS = SEMCONV_COUNTERS | SEMCONV_UPDOWN | SEMCONV_GAUGES

# v1 names that v2 replaced without attributes: old name -> new name (also the series key)
RENAMED = {"process.open_file_descriptor.count": "process.unix.file_descriptor.count"}

_KEYS: dict[tuple[str, frozenset[tuple[str, Any]]], str] = {
    (name, frozenset(attributes.items())): key for key, (name, attributes) in SYSTEM_SERIES.items()
}


def series_key(name: str, attributes: Mapping[str, Any] | None) -> str:
    """One key per series, the same for a v1 and a v2 record of it (see the module doc)."""
    if not attributes:
        return RENAMED.get(name, name)
    own = {k: v for k, v in attributes.items() if k not in DEVICE_KEYS}
    if not own:
        return name
    try:
        found = _KEYS.get((name, frozenset(own.items())))
    except TypeError:  # an unhashable value (a record written by something else): not one of ours
        found = None
    if found is not None:
        return found
    return name + "/" + "/".join(str(v) for v in own.values())
