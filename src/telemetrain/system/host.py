"""Host-wide samples through psutil: CPU, memory, swap, disk and network I/O, filesystem usage.

Host metrics describe the whole machine, so by default only local rank 0 of a node records them (``Sampler(host=)``).

Choices, each to avoid a number that looks right and is not:

- CPU utilisation is computed from ``psutil.cpu_times()`` deltas kept here, not ``psutil.cpu_percent()``, whose state
  is global to the process (another caller of it would shorten our interval) and whose first call returns a
  meaningless 0. The first sample has no utilisation (absent), nor one closer than ``process.MIN_RATE_S`` to the
  previous one (CPU times are counted in 10 ms ticks: that interval is measured with the next sample instead); guest
  time is already inside user time on Linux and is not counted twice. On Linux the hypervisor's steal (time a virtual
  CPU wanted to run while another guest had the physical one) is also given on its own, ``system.cpu.steal``, a share
  of all CPU time like the utilisation (which counts it as busy): nothing else inside a guest shows it, and
  ``compare`` takes it as contention.
- Disk and network I/O are bytes since the sampler started, summed per device from per-device deltas: a device that
  appears, disappears or whose counter goes backwards is re-based instead of producing a negative or a jump. Only
  physical devices are summed where Linux says which are (``/sys/block/X/device``, ``/sys/class/net/X/device``), so a
  device-mapper volume and its disk, or a bond and its members, are not counted twice; where none is physical (a
  container's veth) every device but loopback counts. RDMA traffic (NCCL over InfiniBand verbs) bypasses these
  counters. Both are host-wide figures: Linux does not namespace them per container.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import psutil

from .base import Cycle
from .names import GROUP, filesystem_group
from .process import MIN_RATE_S, TICK_S
from .units import ratio

__all__ = ["HostSource", "resolve_paths"]


class _DeviceSum:
    """Bytes since the first reading, summed over devices, from per-device monotone deltas."""

    __slots__ = ("_last", "total")

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self.total = 0

    def update(self, readings: dict[str, int]) -> int:
        last = self._last
        for device, value in readings.items():
            previous = last.get(device)
            if previous is not None and value >= previous:
                self.total += value - previous
            last[device] = value  # new device, or a counter that went back: re-based here
        for gone in [d for d in last if d not in readings]:
            del last[gone]
        return self.total


def _physical(names: Sequence[str], sys_dir: str, skip: tuple[str, ...]) -> list[str]:
    """The devices Linux marks as physical (a ``device`` link), else all but the obvious virtual ones."""
    physical = [n for n in names if os.path.exists(os.path.join(sys_dir, n, "device"))]
    return physical or [n for n in names if not n.startswith(skip)]


def resolve_paths(paths: Sequence[str]) -> list[str]:
    """Existing absolute paths, one per filesystem (the first path given for it), in the given order."""
    seen: set[int] = set()
    out: list[str] = []
    for path in paths:
        absolute = os.path.abspath(os.fspath(path))
        try:
            dev = os.stat(absolute).st_dev
        except OSError:
            out.append(absolute)  # kept: its failure to read is recorded, once, like any other
            continue
        if dev not in seen:
            seen.add(dev)
            out.append(absolute)
    return out


class HostSource:
    name = "host"

    def __init__(self, disk_paths: Sequence[str]) -> None:
        self._paths = resolve_paths(disk_paths)
        # (busy, total, steal or None) seconds at the previous sample
        self._cpu: tuple[float, float, float | None] | None = None
        self._disk_read, self._disk_write = _DeviceSum(), _DeviceSum()
        self._net_recv, self._net_sent = _DeviceSum(), _DeviceSum()
        self._disks: tuple[tuple[str, ...], list[str]] = ((), [])  # (devices seen, devices summed)
        self._nics: tuple[tuple[str, ...], list[str]] = ((), [])

    def describe(self) -> dict[str, Any]:
        vm = psutil.virtual_memory()
        return {
            "host.cpu_count": psutil.cpu_count() or 0,
            "host.memory_total_bytes": int(vm.total),
            "host.filesystems": ",".join(self._paths),
        }

    def sample(self, cycle: Cycle) -> None:
        add = cycle.add
        times = cycle.read("host.cpu", psutil.cpu_times)
        if times is not None:
            total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
            busy = total - times.idle - getattr(times, "iowait", 0.0)
            steal = getattr(times, "steal", None)  # Linux only
            last = self._cpu
            d_total = 0.0 if last is None else total - last[1]
            if last is None or d_total < 0:  # the first, or counters that went back (CPUs offlined): start again
                self._cpu = (busy, total, steal)
            # (the host's total CPU time also moves in ticks: over MIN_RATE_S of wall time, each CPU's can read a
            # tick short; else measured with the next sample: too short)
            elif d_total >= (MIN_RATE_S - TICK_S) * (psutil.cpu_count() or 1):
                # iowait can go backwards on Linux: clamp to the possible range
                add(GROUP, "system.cpu.utilization", min(1.0, max(0.0, (busy - last[0]) / d_total)))
                if steal is not None and last[2] is not None:
                    add(GROUP, "system.cpu.steal", min(1.0, max(0.0, (steal - last[2]) / d_total)))
                self._cpu = (busy, total, steal)

        vm = cycle.read("host.memory", psutil.virtual_memory)
        if vm is not None:
            used = int(vm.total - vm.available)
            add(GROUP, "system.memory.usage", used)
            add(GROUP, "system.memory.limit", int(vm.total))
            add(GROUP, "system.memory.utilization", ratio(used, vm.total))
        swap = cycle.read("host.swap", psutil.swap_memory)
        if swap is not None:
            add(GROUP, "system.paging.usage", int(swap.used))
            add(GROUP, "system.paging.utilization", ratio(swap.used, swap.total))

        disks = cycle.read("host.disk_io", lambda: psutil.disk_io_counters(perdisk=True, nowrap=False))
        if disks:
            if tuple(disks) != self._disks[0]:  # devices came or went: choose again
                self._disks = (tuple(disks), _physical(sorted(disks), "/sys/block", ("loop", "ram", "zram")))
            chosen = {d: disks[d] for d in self._disks[1] if d in disks}
            add(GROUP, "system.disk.io.read", self._disk_read.update({d: c.read_bytes for d, c in chosen.items()}))
            add(GROUP, "system.disk.io.write", self._disk_write.update({d: c.write_bytes for d, c in chosen.items()}))
        nics = cycle.read("host.network_io", lambda: psutil.net_io_counters(pernic=True, nowrap=False))
        if nics:
            if tuple(nics) != self._nics[0]:
                self._nics = (tuple(nics), [n for n in _physical(sorted(nics), "/sys/class/net", ("lo",)) if n != "lo"])
            chosen_n = {n: nics[n] for n in self._nics[1] if n in nics}
            received = self._net_recv.update({n: c.bytes_recv for n, c in chosen_n.items()})
            add(GROUP, "system.network.io.receive", received)
            sent = self._net_sent.update({n: c.bytes_sent for n, c in chosen_n.items()})
            add(GROUP, "system.network.io.transmit", sent)

        for path in self._paths:
            usage = cycle.read(f"host.filesystem {path}", functools.partial(psutil.disk_usage, path))
            if usage is not None:
                group = filesystem_group(path)
                add(group, "system.filesystem.usage", int(usage.used))
                add(group, "system.filesystem.limit", int(usage.total))
                add(group, "system.filesystem.utilization", ratio(usage.used, usage.used + usage.free))
