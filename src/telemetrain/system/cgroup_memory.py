"""The memory limit of this process's cgroup (a container's ``--memory``, a Kubernetes memory limit, Slurm's
``ConstrainRAMSpace``) and the container's usage, OOM kills and memory pressure against it.

A job in a container dies of the cgroup's OOM killer (SIGKILL, no traceback) when the cgroup's charged memory reaches
its limit, long before the host runs out: host memory says nothing about it. So when a limit applies the sampler reads
the cgroup that sets it -- the one with the least limit along the process's cgroup and its ancestors, each of which
limits it -- resolved once at start:

- cgroup v2 (https://docs.kernel.org/admin-guide/cgroup-v2.html#memory-interface-files): ``memory.max`` (``max``:
  no limit), ``memory.current``, ``memory.events`` (``oom``: times the limit was hit and reclaim failed; ``oom_kill``:
  processes the OOM killer killed in the cgroup and its descendants), ``memory.stat``'s ``inactive_file`` and
  ``memory.pressure`` (PSI: ``some``/``full
  avg10``, the share of the last 10 s in which some/all tasks stalled on memory;
  https://docs.kernel.org/accounting/psi.html).
- cgroup v1 (https://docs.kernel.org/admin-guide/cgroup-v1/memory.html): ``memory.limit_in_bytes`` (unlimited reads
  as a huge number, ``PAGE_COUNTER_MAX`` pages: 9223372036854771712 with 4 KiB pages), ``memory.usage_in_bytes``,
  ``memory.stat``'s ``total_inactive_file``, ``memory.oom_control``'s ``oom_kill`` (Linux 4.13+) and
  ``memory.failcnt`` (times usage hit the limit). No PSI.

The usage counts page cache, which the kernel reclaims before it kills: a job that reads its data set fills its limit
with cache and runs on. The working set -- usage less the inactive file cache, as cAdvisor and the kubelet count it
(OpenTelemetry's ``container.memory.working_set``) -- is what nears the limit before an OOM kill, so the utilization
is the working set's share of the limit (``k8s.container.memory.limit_utilization``'s definition).

A limit of at least ``UNLIMITED`` bytes (2^60) is no limit: no series then, not a giant number. Paths are resolved
once; each sample opens and reads each file (a cgroup file read is generated at open, ~10 us). The limit is read at
every sample too (a container's limit can be resized while it runs). The event counts are recorded as the sampler's
other counters, from 0 at its start (the kills before it are not this run's). Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .base import Cycle
from .cgroup import CGROUP_ROOT, SELF_CGROUP, _chain, _read
from .names import GROUP

__all__ = ["CGROUP_ROOT", "SELF_CGROUP", "UNLIMITED", "CgroupMemory", "CgroupMemorySource", "find_cgroup_memory",
           "oom_kill_count"]

UNLIMITED = 1 << 60  # bytes: a limit at or above this is none (v1's "unlimited" is ~2^63)


def _limit(text: str | None) -> int | None:
    """Bytes of a limit file's text; None for ``max``, a huge value or what is not a number."""
    try:
        value = int(text or "")
    except ValueError:
        return None
    return value if 0 < value < UNLIMITED else None


@dataclass(frozen=True)
class CgroupMemory:
    """The cgroup whose memory limit binds this process: its version (1 or 2) and directory."""

    version: int
    directory: str

    def _file(self, v2: str, v1: str) -> str:
        return os.path.join(self.directory, v2 if self.version == 2 else v1)

    @property
    def limit_file(self) -> str:
        return self._file("memory.max", "memory.limit_in_bytes")

    @property
    def usage_file(self) -> str:
        return self._file("memory.current", "memory.usage_in_bytes")

    @property
    def events_file(self) -> str:
        return self._file("memory.events", "memory.oom_control")

    @property
    def stat_file(self) -> str:
        return os.path.join(self.directory, "memory.stat")


def _binding(dirs: list[str], limit_name: str) -> tuple[int, str] | None:
    limits = [(v, d) for d in dirs if (v := _limit(_read(os.path.join(d, limit_name)))) is not None]
    return min(limits) if limits else None


def find_cgroup_memory(root: str | None = None, self_cgroup: str | None = None) -> CgroupMemory | None:
    """The cgroup with the least memory limit among this process's and its ancestors (v1 or v2), None without a
    limit or cgroups. ``root``: where the cgroup filesystems are mounted; ``self_cgroup``: ``/proc/<pid>/cgroup``
    (None: this module's ``CGROUP_ROOT`` and ``SELF_CGROUP``, read at the call)."""
    root = CGROUP_ROOT if root is None else root
    text = _read(SELF_CGROUP if self_cgroup is None else self_cgroup)
    if text is None:
        return None
    root = os.path.normpath(root)
    found: list[tuple[int, str, int]] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers and os.path.isfile(os.path.join(root, "cgroup.controllers")):
            if (b := _binding(_chain(root, path), "memory.max")) is not None:
                found.append((b[0], b[1], 2))
        elif "memory" in controllers.split(","):
            mount = next((m for m in (os.path.join(root, controllers), os.path.join(root, "memory"))
                          if os.path.isdir(m)), None)
            if mount is not None and (b := _binding(_chain(mount, path), "memory.limit_in_bytes")) is not None:
                found.append((b[0], b[1], 1))
    if not found:
        return None
    _, directory, version = min(found)
    return CgroupMemory(version, directory)


def _counts(text: str) -> dict[str, int]:
    """``key value`` lines (memory.events, memory.oom_control) as a dict of the integer ones."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def oom_kill_count(cgroup: CgroupMemory) -> int | None:
    """The processes the cgroup's OOM killer has killed since the cgroup was made (v2 ``memory.events``, v1
    ``memory.oom_control``: Linux 4.13+); None where it cannot be read."""
    text = _read(cgroup.events_file)
    return None if text is None else _counts(text).get("oom_kill")


def _inactive_file(text: str, version: int) -> int | None:
    """The inactive file cache of ``memory.stat`` (v1: the hierarchical ``total_`` one, as its usage is)."""
    key = "inactive_file" if version == 2 else "total_inactive_file"
    return _counts(text).get(key)


def _avg10(text: str) -> dict[str, float]:
    """``some``/``full`` -> avg10 as a fraction, from a PSI file (``some avg10=1.50 avg60=...``)."""
    out = {}
    for line in text.splitlines():
        kind, _, fields = line.partition(" ")
        for field in fields.split():
            if field.startswith("avg10="):
                out[kind] = float(field[6:]) / 100.0
    return out


def _text(path: str) -> str:
    """The file's text; raises (the cycle counts the failure) where ``cgroup._read`` would hide it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536).decode()  # (memory.stat: ~1.5 KiB)
    finally:
        os.close(fd)


class CgroupMemorySource:
    """The container's memory against its cgroup's limit (series ``container.memory.*``, group ``system``)."""

    name = "container"

    def __init__(self, cgroup: CgroupMemory) -> None:
        self.cgroup = cgroup
        c = cgroup
        self._limit, self._usage, self._events, self._stat = c.limit_file, c.usage_file, c.events_file, c.stat_file
        # (absent files -- a kernel without PSI, booted psi=0 -- are not read, rather than failing every sample)
        pressure, failcnt = os.path.join(c.directory, "memory.pressure"), os.path.join(c.directory, "memory.failcnt")
        self._pressure = pressure if c.version == 2 and os.path.exists(pressure) else None
        self._failcnt = failcnt if c.version == 1 and os.path.exists(failcnt) else None
        self._since_start: dict[str, tuple[int, int]] = {}  # counter -> (previous reading, total since start)

    def _counter(self, name: str, reading: int | None) -> int | None:
        """Events since the sampler started, as the sampler's other counters (the cgroup's count since its creation
        would credit this run with kills before it); a reading below the previous (a new cgroup) counts from 0."""
        if reading is None:
            return None
        previous, total = self._since_start.get(name, (reading, 0))
        total += reading - previous if reading >= previous else reading
        self._since_start[name] = (reading, total)
        return total

    def describe(self) -> dict[str, str | int]:
        return {"container.cgroup": self.cgroup.directory, "container.cgroup.version": self.cgroup.version}

    def sample(self, cycle: Cycle) -> None:
        add = cycle.add
        limit_text = cycle.read("container.memory.limit", lambda: _text(self._limit))
        usage_text = cycle.read("container.memory.usage", lambda: _text(self._usage))
        limit = _limit(limit_text) if limit_text is not None else None
        usage = int(usage_text) if usage_text is not None and usage_text.strip().isdigit() else None
        add(GROUP, "container.memory.usage", usage)
        working_set = None
        if usage is not None:
            stat = cycle.read("container.memory.stat", lambda: _text(self._stat))
            inactive = _inactive_file(stat, self.cgroup.version) if stat is not None else None
            working_set = max(0, usage - inactive) if inactive is not None else None
            add(GROUP, "container.memory.working_set", working_set)
        if limit is not None:  # lifted while running: no limit series (not a giant number)
            add(GROUP, "container.memory.limit", limit)
            if working_set is not None:
                add(GROUP, "container.memory.utilization", working_set / limit)
        events = cycle.read("container.memory.events", lambda: _counts(_text(self._events)))
        if events is not None:
            add(GROUP, "container.memory.oom_kills", self._counter("oom_kills", events.get("oom_kill")))
            if self.cgroup.version == 2:
                add(GROUP, "container.memory.ooms", self._counter("ooms", events.get("oom")))
        if self._failcnt is not None:
            failcnt = cycle.read("container.memory.failcnt", lambda: int(_text(self._failcnt or "")))
            add(GROUP, "container.memory.limit_hits", self._counter("limit_hits", failcnt))
        if self._pressure is not None:
            psi = cycle.read("container.memory.pressure", lambda: _avg10(_text(self._pressure or "")))
            if psi is not None:
                add(GROUP, "container.memory.pressure.some", psi.get("some"))
                add(GROUP, "container.memory.pressure.full", psi.get("full"))
