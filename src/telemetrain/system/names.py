"""The names, units and groups of everything the sampler records (the table in ``docs/system.md``).

Names follow OpenTelemetry's semantic conventions where one exists (``system.*``, ``process.*``, ``hw.*``); a
direction that OpenTelemetry puts in an attribute (``disk.io.direction``) is the last part of the name here, because a
metric record has no attributes. Per-device metrics carry the device in the *group*:

    system                     host-wide and this process's metrics
    system.gpu.<i>             GPU ``i`` in NVML's numbering (``nvidia-smi``'s), one group per device
    system.cuda.<k>            the torch.cuda caching allocator of CUDA device ``k`` (this process's numbering)
    system.filesystem.<path>   the filesystem holding ``path``

Standard library only.
"""

from __future__ import annotations

__all__ = ["CATALOGUE", "GROUP", "SET_ON_CHANGE", "cuda_group", "filesystem_group", "gpu_group"]

GROUP = "system"


def gpu_group(nvml_index: int) -> str:
    return f"{GROUP}.gpu.{nvml_index}"


def cuda_group(cuda_index: int) -> str:
    return f"{GROUP}.cuda.{cuda_index}"


def filesystem_group(path: str) -> str:
    return f"{GROUP}.filesystem.{path}"


# name -> (unit, description). The unit is what the record carries.
CATALOGUE: dict[str, tuple[str, str]] = {
    # host (group "system"; by default from local rank 0 only: one copy per node)
    "system.cpu.utilization": ("1", "busy fraction of all CPUs of the host since the previous sample"),
    "system.memory.usage": ("By", "host memory in use (total - available)"),
    "system.memory.limit": ("By", "host memory total"),
    "system.memory.utilization": ("1", "usage / limit"),
    "system.paging.usage": ("By", "swap in use"),
    "system.paging.utilization": ("1", "swap in use / swap total (absent without swap)"),
    "system.disk.io.read": ("By", "bytes read from all disks since the sampler started (host-wide)"),
    "system.disk.io.write": ("By", "bytes written to all disks since the sampler started (host-wide)"),
    "system.network.io.receive": ("By", "bytes received on all interfaces but loopback since the sampler started"),
    "system.network.io.transmit": ("By", "bytes sent on all interfaces but loopback since the sampler started"),
    # filesystems (group "system.filesystem.<path>")
    "system.filesystem.usage": ("By", "bytes used on the filesystem"),
    "system.filesystem.limit": ("By", "filesystem size"),
    "system.filesystem.utilization": ("1", "used / (used + available to unprivileged users)"),
    # this process and its descendants (group "system"; every rank)
    "process.cpu.utilization": ("1", "CPU time of this process / (elapsed time x CPUs available to it)"),
    "process.cpu.time": ("s", "CPU time (user + system) of this process since it started"),
    "process.memory.usage": ("By", "resident set size of this process"),
    "process.thread.count": ("{thread}", "threads of this process"),
    "process.open_file_descriptor.count": ("{file_descriptor}", "open file descriptors of this process"),
    "process.tree.cpu.utilization": ("1", "as process.cpu.utilization, over this process and all its descendants"),
    "process.tree.memory.usage": ("By", "resident set sizes of this process and its descendants, summed"),
    "process.children.count": ("{process}", "live descendants (DataLoader workers, compile workers, ...)"),
    # NVIDIA GPUs (group "system.gpu.<i>")
    "hw.gpu.utilization": ("1", "fraction of the last sample period in which a kernel ran (NVML 'gpu')"),
    "hw.gpu.memory_controller.utilization": ("1", "fraction of the period device memory was read or written"),
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
        "system.filesystem.limit",
        "hw.gpu.memory.limit",
        "hw.gpu.power.limit",
    }
)
