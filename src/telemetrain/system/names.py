"""The names, units and groups of everything the sampler records (the table in ``docs/system.md``).

Names and attributes follow OpenTelemetry's semantic conventions where one exists (``system.*``, ``process.*``,
``hw.*``). The sources add each value under its *series key*: the record name, or for a series that a convention
splits by an attribute, the name with the attribute's value (``system.disk.io.read`` is ``system.disk.io`` with
``disk.io.direction=read``; ``semconv.SYSTEM_SERIES``). ``record_series`` turns a key into the record's name, unit and
attributes; ``Sampler.latest()`` keeps the keys. Per-device metrics carry the device in the *group*, and in the
convention's attribute:

    system                     host-wide and this process's metrics
    system.gpu.<i>             GPU ``i`` in NVML's numbering (``nvidia-smi``'s), one group per device; ``hw.id`` = i,
                               ``hw.type`` = ``gpu``
    system.cuda.<k>            the torch.cuda caching allocator of CUDA device ``k`` (this process's numbering);
                               ``torch.cuda.device`` = k
    system.filesystem.<path>   the filesystem holding ``path``; ``system.filesystem.mountpoint``

Standard library only.
"""

from __future__ import annotations

import os
from typing import Any

from ..semconv import HW_ID, HW_TYPE, SYSTEM_FILESYSTEM_MOUNTPOINT, SYSTEM_SERIES, TORCH_CUDA_DEVICE

__all__ = ["CATALOGUE", "GROUP", "SET_ON_CHANGE", "cuda_group", "filesystem_group", "gpu_group", "record_series"]

GROUP = "system"


def gpu_group(nvml_index: int) -> str:
    return f"{GROUP}.gpu.{nvml_index}"


def cuda_group(cuda_index: int) -> str:
    return f"{GROUP}.cuda.{cuda_index}"


def filesystem_group(path: str) -> str:
    return f"{GROUP}.filesystem.{path}"


# series key -> (unit, description). The unit is what the record carries.
CATALOGUE: dict[str, tuple[str, str]] = {
    # host (group "system"; by default from local rank 0 only: one copy per node)
    "system.cpu.utilization": ("1", "busy fraction of all CPUs of the host since the previous sample"),
    "system.cpu.steal": ("1", "fraction of all CPU time of the host another guest of the hypervisor had since the "
                         "previous sample (Linux steal; inside system.cpu.utilization)"),
    "system.memory.usage": ("By", "host memory in use (total - available)"),
    "system.memory.limit": ("By", "host memory total"),
    "system.memory.utilization": ("1", "usage / limit"),
    "system.paging.usage": ("By", "swap in use"),
    "system.paging.utilization": ("1", "swap in use / swap total (absent without swap)"),
    "system.disk.io.read": ("By", "bytes read from all disks since the sampler started (host-wide)"),
    "system.disk.io.write": ("By", "bytes written to all disks since the sampler started (host-wide)"),
    "system.network.io.receive": ("By", "bytes received on all interfaces but loopback since the sampler started"),
    "system.network.io.transmit": ("By", "bytes sent on all interfaces but loopback since the sampler started"),
    # this process's container: its cgroup's memory limit and what is charged against it (group "system", host only;
    # only where a cgroup memory limit applies: cgroup_memory.py)
    "container.memory.usage": ("By", "memory charged to the container's cgroup (cgroup v2 memory.current, v1 "
                               "memory.usage_in_bytes: page cache included)"),
    "container.memory.working_set": ("By", "usage less the inactive file cache (memory.stat inactive_file, v1 "
                                     "total_inactive_file): what the kernel cannot reclaim before an OOM kill"),
    "container.memory.limit": ("By", "the cgroup's memory limit (v2 memory.max, v1 memory.limit_in_bytes)"),
    "container.memory.utilization": ("1", "working set / limit: the cgroup's OOM killer acts near 1"),
    "container.memory.oom_kills": ("{process}", "processes the cgroup's OOM killer killed since the sampler started "
                                   "(v2 memory.events oom_kill, v1 memory.oom_control oom_kill)"),
    "container.memory.ooms": ("{event}", "times usage hit the limit and reclaim failed since the sampler started "
                              "(v2 memory.events oom)"),
    "container.memory.limit_hits": ("{event}", "times usage hit the limit since the sampler started (v1 "
                                    "memory.failcnt)"),
    "container.memory.pressure.some": ("1", "share of the last 10 s some of the cgroup's tasks stalled on memory "
                                       "(v2 memory.pressure some avg10)"),
    "container.memory.pressure.full": ("1", "share of the last 10 s all of the cgroup's tasks stalled on memory "
                                       "(v2 memory.pressure full avg10)"),
    # filesystems (group "system.filesystem.<path>")
    "system.filesystem.usage": ("By", "bytes used on the filesystem"),
    "system.filesystem.limit": ("By", "filesystem size"),
    "system.filesystem.utilization": ("1", "used / (used + available to unprivileged users)"),
    # this process and its descendants (group "system"; every rank)
    "process.cpu.utilization": ("1", "CPU time of this process / (elapsed time x CPUs available to it)"),
    "process.cpu.time": ("s", "CPU time (user + system) of this process since it started"),
    "process.memory.usage": ("By", "resident set size of this process"),
    "process.thread.count": ("{thread}", "threads of this process"),
    "process.unix.file_descriptor.count": ("{file_descriptor}", "open file descriptors of this process"),
    "process.tree.cpu.utilization": ("1", "as process.cpu.utilization, over this process and all its descendants"),
    "process.tree.memory.usage": ("By", "resident set sizes of this process and its descendants, summed"),
    "process.children.count": ("{process}", "live descendants (DataLoader workers, compile workers, ...)"),
    # NVIDIA GPUs (group "system.gpu.<i>")
    # NVML's own sample period (1/6 s to 1 s by product), not the sampler's interval: each value is a snapshot
    "hw.gpu.utilization": ("1", "fraction of NVML's last sample period (1/6 s to 1 s, not the sampler's interval) "
                           "in which a kernel ran (NVML 'gpu')"),
    "hw.gpu.memory_controller.utilization": ("1", "fraction of NVML's last sample period (1/6 s to 1 s) in which "
                                             "device memory was read or written"),
    "hw.gpu.memory.usage": ("By", "device memory used (all processes)"),
    "hw.gpu.memory.limit": ("By", "device memory total"),
    "hw.gpu.memory.utilization": ("1", "usage / limit"),
    "hw.gpu.process.memory.usage": ("By", "device memory of this process and its descendants, as NVML lists it"),
    "hw.power": ("W", "board power draw"),
    "hw.gpu.power.limit": ("W", "enforced power limit"),
    "hw.energy": ("J", "energy since the sampler started, from the GPU's energy counter"),
    "hw.energy.integrated": ("J", "energy since the sampler started, integrated from power samples (no counter)"),
    "hw.temperature": ("Cel", "GPU core temperature"),
    "hw.gpu.clock.sm": ("Hz", "SM clock"),
    "hw.gpu.clock.memory": ("Hz", "memory clock"),
    "hw.gpu.throttle.power": ("1", "1 while clocks are held down by the power cap or power brake, else 0"),
    "hw.gpu.throttle.thermal": ("1", "1 while clocks are held down by a thermal slowdown, else 0"),
    "hw.gpu.throttle.hw_slowdown": ("1", "1 during a hardware slowdown, else 0"),
    "hw.gpu.throttle.reasons": ("{bitmask}", "NVML's clock event reason bit mask, as read"),
    "hw.errors.corrected": ("{error}", "corrected ECC errors since driver load (volatile)"),
    "hw.errors.uncorrected": ("{error}", "uncorrected ECC errors since driver load (volatile)"),
    # torch.cuda caching allocator (group "system.cuda.<k>")
    "torch.cuda.memory.allocated": ("By", "bytes in live tensors"),
    "torch.cuda.memory.allocated.peak": ("By", "peak of allocated since start or torch.cuda.reset_peak_memory_stats"),
    "torch.cuda.memory.reserved": ("By", "bytes held by the caching allocator"),
    "torch.cuda.memory.reserved.peak": ("By", "peak of reserved"),
    "torch.cuda.alloc_retries": ("{retry}", "cudaMalloc retries after freeing the cache (memory pressure)"),
    "torch.cuda.ooms": ("{error}", "out-of-memory errors the allocator raised"),
}

# Values that rarely change (sizes, limits) are recorded at the first sample and then only when they change; the
# gauges still read them at any time.
SET_ON_CHANGE = frozenset(
    {
        "system.memory.limit",
        "container.memory.limit",
        "system.filesystem.limit",
        "hw.gpu.memory.limit",
        "hw.gpu.power.limit",
    }
)


def _mountpoint(path: str) -> str:
    """The mount point of the filesystem holding ``path`` (the path itself when it cannot be told)."""
    current = os.path.abspath(path)
    try:
        while not os.path.ismount(current):
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
    except OSError:
        return path
    return current


def device_attributes(group: str) -> dict[str, Any]:
    """The attributes that name the device of a group (none for ``system``)."""
    if group.startswith(f"{GROUP}.gpu."):
        return {HW_ID: group[len(GROUP) + 5 :], HW_TYPE: "gpu"}
    if group.startswith(f"{GROUP}.cuda."):
        index = group[len(GROUP) + 6 :]
        return {TORCH_CUDA_DEVICE: int(index) if index.isdigit() else index}
    if group.startswith(f"{GROUP}.filesystem."):
        return {SYSTEM_FILESYSTEM_MOUNTPOINT: _mountpoint(group[len(GROUP) + 12 :])}
    return {}


def record_series(group: str, key: str) -> tuple[str, str, dict[str, Any] | None]:
    """(record name, unit, attributes) of a sampled series: the convention's name and attributes, the device's."""
    name, attributes = SYSTEM_SERIES.get(key, (key, {}))
    merged = {**attributes, **device_attributes(group)}
    return name, CATALOGUE.get(key, ("", ""))[0], merged or None
