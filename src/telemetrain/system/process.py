"""This process and its descendants through psutil: CPU, resident memory, threads, file descriptors, child count.

DataLoader workers, torch.compile workers and any ``subprocess`` the job starts are descendants of the training
process; a sampler that watches one pid misses their CPU and memory, which is where input pipelines spend theirs.

- CPU utilisation is CPU seconds (user + system) in the interval / (interval x CPUs this process may run on: its
  affinity's, or its cgroup's CPU quota where that is less, ``cgroup.py``), OpenTelemetry's
  ``process.cpu.utilization``: 1.0 means every allowed CPU busy (a container at its ``--cpus`` limit). Per process the
  previous CPU time is kept, keyed by (pid, start time) so a reused pid is a new process. A descendant first seen now
  counts with all its CPU time if it was born after the previous sample (the normal case: the tree is scanned every
  cycle), else from now on. Born when: on Linux its start in clock ticks since boot against ``CLOCK_BOOTTIME`` at that
  sample (a wall-clock step moves neither; psutil's create time can read up to 1 s early: /proc/stat's boot time is
  whole seconds), elsewhere psutil's create time against the wall clock. A descendant that exits between two samples
  takes its CPU time since the previous sample with it (it is not in the parent's ``children_*`` times until reaped,
  and those would count earlier intervals again).
- Tree memory is the sum of resident set sizes. Pages a forked worker still shares with its parent (copy-on-write)
  count once per process, as ``top`` shows them: an upper bound of the tree's real footprint.
- Finding descendants needs every process's parent. psutil's ``children(recursive=True)`` reads
  ``/proc/<pid>/stat`` of every process on the host at each call (~10 us each: ~1 ms with 100 processes, ~10 ms with
  1000). On Linux the scan here lists ``/proc`` and reads the parent only of processes it has not seen before: a
  parent changes only by re-parenting, when the parent dies, and a process whose cached parent is gone is no longer
  reachable from this one, as it should be. Every 20th scan reads them all again, so a pid reused between two scans,
  or a re-parenting to a subreaper inside the tree, is seen within 20 scans. Other systems use psutil. Periodic
  samples also scan at most as often as keeps the scans under 0.5% of one core (their measured cost x 200); between
  scans the known descendants are still read, and the dead ones dropped. The first sample, the last and those taken
  on demand always scan.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil

from .base import Cycle
from .cgroup import CGROUP_ROOT, SELF_CGROUP, cgroup_cpu_limit
from .names import GROUP

__all__ = ["ProcessTreeSource"]

SCAN_COST_FACTOR = 200  # at most 1/200 of the time scanning for descendants

_Key = tuple[int, float]  # (pid, create time): a pid can be reused


FULL_SCAN_EVERY = 20
_PROC = "/proc"


class _ProcDescendants:
    """Descendants of a pid from ``/proc`` (Linux), with each process's (parent, start time) cached by pid."""

    def __init__(self, root: int) -> None:
        self.root = root
        self._parent: dict[int, tuple[int, int]] = {}  # pid -> (ppid, start time in clock ticks)
        self.scans = 0

    @staticmethod
    def _read(pid: int) -> tuple[int, int] | None:
        try:
            fd = os.open(f"{_PROC}/{pid}/stat", os.O_RDONLY)
            try:
                data = os.read(fd, 1024)
            finally:
                os.close(fd)
            fields = data[data.rindex(b")") + 2 :].split()  # the name may hold spaces and parentheses
            return int(fields[1]), int(fields[19])
        except (OSError, ValueError, IndexError):  # gone meanwhile
            return None

    def __call__(self) -> list[tuple[int, int]]:
        """(pid, start time) of every descendant."""
        full = self.scans % FULL_SCAN_EVERY == 0
        self.scans += 1
        pids = [int(name) for name in os.listdir(_PROC) if name.isdigit()]
        known = self._parent
        fresh: dict[int, tuple[int, int]] = {}
        for pid in pids:
            entry = None if full else known.get(pid)
            if entry is None:
                entry = self._read(pid)
                if entry is None:
                    continue
            fresh[pid] = entry
        self._parent = fresh  # the gone ones dropped
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in fresh.items():
            children.setdefault(ppid, []).append(pid)
        out: dict[int, int] = {}
        todo = list(children.get(self.root, ()))
        while todo:
            pid = todo.pop()
            if pid != self.root and pid not in out:
                out[pid] = fresh[pid][1]
                todo.extend(children.get(pid, ()))
        return list(out.items())


def _affinity_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on macOS or Windows
        return psutil.cpu_count() or 1


def _cpu_count(cgroup_root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP) -> int | float:
    """CPUs this process may use: its affinity's, or its cgroup's CPU quota where that is less (a container's
    ``--cpus``; ``cgroup.cgroup_cpu_limit``), a fraction where the quota is one."""
    cpus = _affinity_cpus()
    limit = cgroup_cpu_limit(cgroup_root, self_cgroup)
    if limit is None or limit >= cpus:
        return cpus
    return int(limit) if limit == int(limit) else limit


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _boot_s() -> float | None:
    """Seconds since boot on the clock /proc's start times use (Linux), None elsewhere."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return None if clock is None else time.clock_gettime(clock)


# CPU times are counted in clock ticks (10 ms at Linux's USER_HZ of 100; user and system time each truncated): over a
# short interval a difference of two readings is off by up to two ticks, so that 5 ms after the previous sample a
# process burning one CPU reads 0 or 2 or more. A rate is given once its interval (its cycles', summed) is at least
# this long: off by at most 10% of one CPU then, 2% over 1 s.
MIN_RATE_S = 20 / _CLK_TCK
TICK_S = 1 / _CLK_TCK  # one tick of the CPU time counters


class _Rate:
    """CPU seconds / (seconds x CPUs), summed over cycles until they span ``MIN_RATE_S``."""

    __slots__ = ("capacity", "cpu", "elapsed")

    def __init__(self) -> None:
        self.cpu = self.capacity = self.elapsed = 0.0

    def add(self, cpu_s: float | None, elapsed_s: float | None, cpus: float) -> float | None:
        """This cycle's CPU seconds over its interval: the rate, or None while too short (or unknown: starts over)."""
        if cpu_s is None or elapsed_s is None or elapsed_s <= 0:
            self.cpu = self.capacity = self.elapsed = 0.0
            return None
        self.cpu += cpu_s
        self.capacity += elapsed_s * cpus
        self.elapsed += elapsed_s
        if self.elapsed < MIN_RATE_S:
            return None  # carried over to the next cycle's
        value = self.cpu / self.capacity
        self.cpu = self.capacity = self.elapsed = 0.0
        return value


class ProcessTreeSource:
    name = "process"

    def __init__(self, tree: bool = True, *, cgroup_root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP) -> None:
        self._cgroup = (cgroup_root, self_cgroup)  # where the CPU quota is read (cgroup.cgroup_cpu_limit)
        self._root = psutil.Process(os.getpid())
        self._root_key: _Key = (self._root.pid, self._root.create_time())
        self._tree = tree
        self._members: dict[int, psutil.Process] = {}
        linux = os.path.isfile(f"{_PROC}/{self._root.pid}/stat")
        self._descendants = _ProcDescendants(self._root.pid) if linux else None
        self._starts: dict[int, int] = {}  # members' start times, as the scanner read them
        self._cpu: dict[_Key, float] = {}  # CPU seconds at the previous sample
        self._last_mono: int | None = None
        self._rate, self._tree_rate = _Rate(), _Rate()
        self._last_sample_at: tuple[float, float | None] | None = None  # (wall, boot-clock) s at the previous sample
        self._scanned_last_cycle = False
        self._next_scan_ns = 0
        self.scan_cost_ns = 0
        self.scans = 0

    def describe(self) -> dict[str, Any]:
        return {"process.pid": self._root.pid, "process.tree": self._tree,
                "process.cpu_count": _cpu_count(*self._cgroup)}

    @property
    def pids(self) -> frozenset[int]:
        return frozenset((self._root.pid, *self._members))

    def _scan(self, cycle: Cycle) -> None:
        t0 = time.thread_time_ns()
        members: dict[int, psutil.Process] = {}
        scanner = self._descendants
        if scanner is not None:
            found_pids = cycle.read("process.children", scanner)
            if found_pids is None:
                return
            starts: dict[int, int] = {}
            for pid, start in found_pids:
                known = self._members.get(pid)
                if known is not None and self._starts.get(pid) == start:
                    members[pid] = known  # the same process: keep its object (psutil caches its identity)
                    starts[pid] = start
                    continue
                try:
                    members[pid] = psutil.Process(pid)
                    starts[pid] = start
                except psutil.Error:  # gone meanwhile
                    continue
            self._starts = starts
        else:
            found = cycle.read("process.children", lambda: self._root.children(recursive=True))
            if found is None:
                return
            for proc in found:
                known = self._members.get(proc.pid)
                try:
                    same = known is not None and known.create_time() == proc.create_time()
                except psutil.Error:
                    continue
                members[proc.pid] = known if same and known is not None else proc
        self._members = members
        self.scans += 1
        self.scan_cost_ns = time.thread_time_ns() - t0
        self._next_scan_ns = cycle.mono_ns + self.scan_cost_ns * SCAN_COST_FACTOR

    def _born_since(self, previous: tuple[float, float | None] | None, pid: int, create_time: float) -> bool:
        """Whether a descendant found now started after the previous sample (None: there was none)."""
        if previous is None:
            return False
        start = self._starts.get(pid)
        if start is not None and previous[1] is not None:
            return (start + 1) / _CLK_TCK >= previous[1]  # a start is truncated to its tick: born in that tick counts
        return create_time >= previous[0]

    def sample(self, cycle: Cycle) -> None:
        add = cycle.add
        root = self._root
        cpu_count = _cpu_count(*self._cgroup)  # read each cycle: a container's quota can be resized while it runs
        elapsed_s = None if self._last_mono is None else (cycle.mono_ns - self._last_mono) / 1e9
        first_seen_counts = self._scanned_last_cycle  # a newcomer was born after the previous sample
        sampled_before = self._last_sample_at
        self._last_sample_at = (time.time(), _boot_s())
        scanned = False
        if self._tree and (cycle.thorough or cycle.mono_ns >= self._next_scan_ns):
            self._scan(cycle)
            scanned = True

        cpu_now: dict[_Key, float] = {}
        with root.oneshot():
            times = cycle.read("process.cpu", root.cpu_times)
            memory = cycle.read("process.memory", root.memory_info)
            add(GROUP, "process.thread.count", cycle.read("process.threads", root.num_threads))
        if hasattr(root, "num_fds"):
            add(GROUP, "process.unix.file_descriptor.count", cycle.read("process.fds", root.num_fds))
        root_rss = None if memory is None else int(memory.rss)
        add(GROUP, "process.memory.usage", root_rss)
        root_delta = None
        if times is not None:
            seconds = times.user + times.system
            cpu_now[self._root_key] = seconds
            add(GROUP, "process.cpu.time", seconds)
            previous = self._cpu.get(self._root_key)
            if previous is not None:
                root_delta = max(0.0, seconds - previous)
        add(GROUP, "process.cpu.utilization", self._rate.add(root_delta, elapsed_s, cpu_count))

        if self._tree:
            tree_delta = root_delta
            tree_rss = root_rss
            live = 0
            for pid, proc in list(self._members.items()):
                try:
                    with proc.oneshot():
                        if proc.status() == psutil.STATUS_ZOMBIE:
                            raise psutil.ZombieProcess(pid)
                        child_times = proc.cpu_times()
                        rss = proc.memory_info().rss
                        key = (pid, proc.create_time())
                except psutil.NoSuchProcess:  # exited (or a zombie waiting to be reaped): not a live member
                    del self._members[pid]
                    continue
                except psutil.Error as exc:  # AccessDenied: a descendant that changed user
                    cycle.fail("process.tree", exc)
                    continue
                live += 1
                seconds = child_times.user + child_times.system
                cpu_now[key] = seconds
                previous = self._cpu.get(key)
                if previous is not None:
                    delta: float | None = max(0.0, seconds - previous)
                elif first_seen_counts or self._born_since(sampled_before, pid, key[1]):
                    delta = seconds  # born since the previous sample: all its CPU time is in this interval
                else:
                    delta = None  # found late (the scan was skipped): counted from now on
                if tree_delta is not None and delta is not None:
                    tree_delta += delta
                if tree_rss is not None:
                    tree_rss += int(rss)
            add(GROUP, "process.children.count", live)
            add(GROUP, "process.tree.memory.usage", tree_rss)
            add(GROUP, "process.tree.cpu.utilization", self._tree_rate.add(tree_delta, elapsed_s, cpu_count))
        self._cpu = cpu_now
        self._last_mono = cycle.mono_ns
        self._scanned_last_cycle = scanned
        cycle.pids = self.pids
