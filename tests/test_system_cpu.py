"""CPU utilisations: relative to the CPUs the process may use (in a container with a CPU quota, cgroup v2 ``cpu.max``
or v1 ``cpu.cfs_quota_us``, the quota; fake cgroup trees in a tmp dir), and given only over intervals long enough for
CPU times counted in clock ticks. The real process's CPU time.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import telemetrain
from conftest import run_dir_of
from telemetrain.cli import summarize
from telemetrain.store import open_run

pytest.importorskip("psutil", reason="telemetrain.system needs psutil (the [system] extra)")

from telemetrain.system.base import Cycle
from telemetrain.system.cgroup import cgroup_cpu_limit
from telemetrain.system.process import MIN_RATE_S, ProcessTreeSource


def _tree(root: Path, files: dict[str, str], self_cgroup: str) -> tuple[str, str]:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text + "\n")
    (root / "self.cgroup").write_text(self_cgroup)
    return str(root / "fs"), str(root / "self.cgroup")


@pytest.mark.parametrize(("files", "self_cgroup", "cpus"), [
    # cgroup v2 (Kubernetes): the pod's limit under an unlimited parent
    ({"fs/cgroup.controllers": "cpu", "fs/kubepods/cpu.max": "max 100000", "fs/kubepods/pod1/cpu.max": "150000 100000"},
     "0::/kubepods/pod1\n", 1.5),
    # an ancestor's limit tighter than the cgroup's own: the least counts
    ({"fs/cgroup.controllers": "cpu", "fs/a/cpu.max": "200000 100000", "fs/a/b/cpu.max": "max 100000"},
     "0::/a/b\n", 2.0),
    # a container that sees the host's path while its own cgroup is mounted at the root
    ({"fs/cgroup.controllers": "cpu", "fs/cpu.max": "50000 100000"}, "0::/docker/0123abcd\n", 0.5),
    ({"fs/cgroup.controllers": "cpu", "fs/x/cpu.max": "max 100000"}, "0::/x\n", None),  # unlimited
    ({"fs/cgroup.controllers": "cpu", "fs/x/cpu.max": "garbage"}, "0::/x\n", None),  # unreadable: no limit made up
    # cgroup v1: the cpu hierarchy's CFS quota (-1: none)
    ({"fs/cpu,cpuacct/job/cpu.cfs_quota_us": "300000", "fs/cpu,cpuacct/job/cpu.cfs_period_us": "100000"},
     "4:cpu,cpuacct:/job\n0::/\n", 3.0),
    ({"fs/cpu/cpu.cfs_quota_us": "-1", "fs/cpu/cpu.cfs_period_us": "100000"}, "2:cpu:/\n", None),
    ({}, "0::/\n", None),  # no cgroup filesystem
])
def test_the_cgroup_cpu_quota_is_read_from_the_cgroup_and_its_ancestors(
        tmp_path: Path, files: dict[str, str], self_cgroup: str, cpus: float | None) -> None:
    assert cgroup_cpu_limit(*_tree(tmp_path, files, self_cgroup)) == cpus


def test_without_cgroups_there_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(str(tmp_path), str(tmp_path / "absent")) is None
    real = cgroup_cpu_limit()  # this machine's own: none, or a positive number of CPUs
    assert real is None or real > 0


def _burn(cpu_seconds: float) -> None:
    end = time.process_time() + cpu_seconds
    while time.process_time() < end:
        pass


def test_process_cpu_utilization_is_relative_to_the_quota(tmp_path: Path) -> None:
    root, self_cgroup = _tree(tmp_path, {"fs/cgroup.controllers": "cpu", "fs/job/cpu.max": "50000 100000"}, "0::/job\n")
    source = ProcessTreeSource(tree=False, cgroup_root=root, self_cgroup=self_cgroup)
    assert source.describe()["process.cpu_count"] == 0.5  # what the start event says utilisations are relative to

    def fail(what: str, exc: BaseException) -> None:
        raise AssertionError(what) from exc

    values = []
    for mono_ns in (0, 2_000_000_000):  # the cycles' own clock: 2 s apart
        cycle = Cycle(mono_ns, fail, thorough=True)
        source.sample(cycle)
        values.append({name: value for _, name, value in cycle.values})
        _burn(0.05)
    cpu_s = values[1]["process.cpu.time"] - values[0]["process.cpu.time"]
    assert cpu_s > 0
    # a process using its whole half CPU reads 1.0: CPU seconds / (2 s x 0.5 CPU), not / (2 s x the host's CPUs)
    assert values[1]["process.cpu.utilization"] == pytest.approx(cpu_s / (2.0 * 0.5))


def test_show_gives_cores_for_a_fractional_cpu_count(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=tmp_path)
    t.event("system.sampler.start", {"interval_s": 10.0, "process.cpu_count": 1.5}, group="system")
    for value in (0.5, 1.0):
        t.metric("process.memory.usage", 1 << 20, "system", unit="By")
        t.metric("process.cpu.utilization", value, "system", unit="1")
    t.close()
    text = "\n".join(summarize(open_run(run_dir_of(t))))
    assert re.search(r"cpu mean 75\.0% = 1\.12 cores, max 100\.0%", text), text


def test_cpu_rates_over_short_intervals_wait_for_enough_ticks(tmp_path: Path) -> None:
    """CPU times are counted in 10 ms ticks: cycles 3 ms apart each read 0 or a few ticks. The rate is given once the
    cycles span ``MIN_RATE_S``, then right within two ticks over that span. The cycles' clock is this process's CPU
    clock (exact), so a process that is all CPU reads one CPU busy."""
    root, self_cgroup = _tree(tmp_path, {}, "0::/\n")  # no quota: the affinity's CPUs
    source = ProcessTreeSource(tree=False, cgroup_root=root, self_cgroup=self_cgroup)
    cpus = source.describe()["process.cpu_count"]

    def fail(what: str, exc: BaseException) -> None:
        raise AssertionError(what) from exc

    rates = []
    for _ in range(int(3 * MIN_RATE_S / 0.003)):
        cycle = Cycle(time.process_time_ns(), fail, thorough=True)
        source.sample(cycle)
        rates += [value for _, name, value in cycle.values if name == "process.cpu.utilization"]
        _burn(0.003)
    assert 2 <= len(rates) <= 5, rates  # not one a cycle
    for rate in rates:  # one CPU busy, off by at most two ticks (user, system) over MIN_RATE_S: 10% of a CPU
        assert rate * cpus == pytest.approx(1.0, abs=0.11), rates


def test_host_cpu_utilization_is_not_given_over_a_few_ticks(tmp_path: Path) -> None:
    from telemetrain.system.host import HostSource

    source = HostSource([str(tmp_path)])

    def cpu(burn_s: float) -> list[float]:
        _burn(burn_s)
        cycle = Cycle(time.monotonic_ns(), lambda what, exc: None, thorough=True)
        source.sample(cycle)
        return [value for _, name, value in cycle.values if name == "system.cpu.utilization"]

    assert cpu(0) == []  # the first: no interval
    assert cpu(0.02) == []  # 2 ticks of one CPU: 0, 50% or 100% by where the ticks fell
    time.sleep(MIN_RATE_S)  # now the interval is long enough
    assert len(cpu(0)) == 1
