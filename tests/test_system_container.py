"""A container's memory against its cgroup limit: the reader (planted cgroup v1 and v2 trees in a tmp dir, this
machine's real cgroup files, and a real cgroup with a memory limit where this process may make one), the sampler's
series, and the finding that names a likely OOM kill -- end to end with a real process killed by SIGKILL (by the
kernel's OOM killer in a real cgroup, where one can be made; by itself under a planted tree otherwise) -- and never
on a run that ended normally, near its limit or not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from _memory_cgroup import limited_memory_cgroup, own_memory_cgroup

pytest.importorskip("psutil")

from telemetrain.analysis.findings import analyse
from telemetrain.analysis.findings.builder import InputBuilder
from telemetrain.system.base import Cycle
from telemetrain.system.cgroup_memory import CgroupMemory, CgroupMemorySource, find_cgroup_memory

HERE = Path(__file__).parent
MiB = 1 << 20
V1_UNLIMITED = "9223372036854771712"  # PAGE_COUNTER_MAX pages of 4 KiB: what v1 reads without a limit


def _tree(root: Path, files: dict[str, str], self_cgroup: str) -> tuple[str, str]:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "fs").mkdir(exist_ok=True)
    (root / "self.cgroup").write_text(self_cgroup)
    return str(root / "fs"), str(root / "self.cgroup")


def _sample(source: CgroupMemorySource) -> tuple[dict[str, int | float], list[str]]:
    failed: list[str] = []
    cycle = Cycle(0, lambda what, exc: failed.append(what))
    source.sample(cycle)
    return {name: value for _, name, value in cycle.values}, failed


V2 = {
    "fs/cgroup.controllers": "cpu memory",
    "fs/kubepods/memory.max": "max",
    "fs/kubepods/pod1/memory.max": str(512 * MiB),
    "fs/kubepods/pod1/memory.current": str(384 * MiB),
    "fs/kubepods/pod1/memory.stat": f"anon {200 * MiB}\nfile {184 * MiB}\nactive_file {56 * MiB}\n"
                                    f"inactive_file {128 * MiB}\nslab 0\n",
    "fs/kubepods/pod1/memory.events": "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n",
    "fs/kubepods/pod1/memory.pressure": "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\n"
                                        "full avg10=2.00 avg60=0.50 avg300=0.10 total=45\n",
    "fs/kubepods/pod1/ctr/memory.max": "max",
}
V1 = {
    "fs/memory/memory.limit_in_bytes": V1_UNLIMITED,
    "fs/memory/docker/memory.limit_in_bytes": str(256 * MiB),
    "fs/memory/docker/memory.usage_in_bytes": str(64 * MiB),
    "fs/memory/docker/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
    "fs/memory/docker/memory.failcnt": "7",
    "fs/memory/docker/memory.stat": f"cache 0\ninactive_file {4 * MiB}\ntotal_inactive_file {16 * MiB}\n",
    "fs/memory/docker/abc/memory.limit_in_bytes": V1_UNLIMITED,
}


def test_cgroup_v2_the_least_limit_along_the_ancestry_is_sampled_with_its_events_and_pressure(tmp_path: Path) -> None:
    cgroup = find_cgroup_memory(*_tree(tmp_path, V2, "0::/kubepods/pod1/ctr\n"))
    assert cgroup == CgroupMemory(2, str(tmp_path / "fs/kubepods/pod1"))
    source = CgroupMemorySource(cgroup)
    values, failed = _sample(source)
    assert failed == []
    assert values == {
        "container.memory.usage": 384 * MiB, "container.memory.limit": 512 * MiB,
        "container.memory.working_set": 256 * MiB,  # less the inactive file cache, which the kernel reclaims
        "container.memory.utilization": 0.5, "container.memory.oom_kills": 0, "container.memory.ooms": 0,
        "container.memory.pressure.some": 0.125, "container.memory.pressure.full": 0.02,
    }
    # the event counts are the sampler's counters, from 0 at its start: the cgroup's kills before it are not the run's
    (tmp_path / "fs/kubepods/pod1/memory.events").write_text("oom 5\noom_kill 4\n")
    values, _ = _sample(source)
    assert (values["container.memory.oom_kills"], values["container.memory.ooms"]) == (2, 2)


def test_the_event_counts_are_exported_as_counters_the_rest_as_gauges() -> None:
    from telemetrain.cumulative import is_cumulative
    from telemetrain.system.names import CATALOGUE

    container = {name: unit for name, (unit, _) in CATALOGUE.items() if name.startswith("container.")}
    assert {n for n, unit in container.items() if is_cumulative(n, unit)} == {
        "container.memory.oom_kills", "container.memory.ooms", "container.memory.limit_hits"}


def test_cgroup_v1_limit_usage_oom_kills_and_failcnt(tmp_path: Path) -> None:
    # the hybrid layout of this kind of host: v1 controllers, a v2 hierarchy with no controllers
    cgroup = find_cgroup_memory(*_tree(tmp_path, V1, "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n"))
    assert cgroup == CgroupMemory(1, str(tmp_path / "fs/memory/docker"))
    values, failed = _sample(CgroupMemorySource(cgroup))
    assert failed == []
    assert values == {
        "container.memory.usage": 64 * MiB, "container.memory.limit": 256 * MiB,
        "container.memory.working_set": 48 * MiB,  # v1: the hierarchical total_inactive_file, as its usage is
        "container.memory.utilization": 0.1875, "container.memory.oom_kills": 0, "container.memory.limit_hits": 0,
    }


@pytest.mark.parametrize(("files", "self_cgroup", "expected"), [
    # a container that sees the host's cgroup path while its own cgroup is mounted at the root (Docker, v1 and v2)
    ({"fs/memory/memory.limit_in_bytes": str(2 << 30)}, "7:memory:/docker/0123abcd\n", (1, "fs/memory")),
    ({"fs/cgroup.controllers": "memory", "fs/memory.max": str(3 << 30)}, "0::/docker/0123abcd\n", (2, "fs")),
    # v1 and v2 both limit (a hybrid host): the least binds
    ({"fs/cgroup.controllers": "memory", "fs/x/memory.max": str(3 << 30), "fs/memory/x/memory.limit_in_bytes":
      str(1 << 30)}, "4:memory:/x\n0::/x\n", (1, "fs/memory/x")),
])
def test_the_binding_cgroup_is_found_where_a_container_sees_it(
        tmp_path: Path, files: dict[str, str], self_cgroup: str, expected: tuple[int, str]) -> None:
    assert find_cgroup_memory(*_tree(tmp_path, files, self_cgroup)) == CgroupMemory(
        expected[0], str(tmp_path / expected[1]))


@pytest.mark.parametrize(("files", "self_cgroup"), [
    ({"fs/cgroup.controllers": "memory", "fs/x/memory.max": "max"}, "0::/x\n"),  # v2 unlimited
    ({"fs/memory/memory.limit_in_bytes": V1_UNLIMITED, "fs/memory/x/memory.limit_in_bytes": V1_UNLIMITED},
     "3:memory:/x\n"),  # v1 "unlimited": a huge number, not a limit
    ({"fs/cgroup.controllers": "memory", "fs/x/memory.max": "garbage"}, "0::/x\n"),  # unreadable: none made up
    ({}, "0::/\n"),  # no cgroup filesystem
])
def test_no_limit_is_no_container_source(tmp_path: Path, files: dict[str, str], self_cgroup: str) -> None:
    assert find_cgroup_memory(*_tree(tmp_path, files, self_cgroup)) is None


def test_a_limit_lifted_while_running_gives_no_limit_series_and_a_file_gone_is_a_counted_failure(
        tmp_path: Path) -> None:
    cgroup = find_cgroup_memory(*_tree(tmp_path, V2, "0::/kubepods/pod1\n"))
    assert cgroup is not None
    source = CgroupMemorySource(cgroup)
    (tmp_path / "fs/kubepods/pod1/memory.max").write_text("max\n")
    values, failed = _sample(source)
    assert "container.memory.limit" not in values and "container.memory.utilization" not in values
    assert values["container.memory.working_set"] == 256 * MiB
    assert values["container.memory.usage"] == 384 * MiB
    (tmp_path / "fs/kubepods/pod1/memory.events").unlink()  # the cgroup removed under the job
    values, failed = _sample(source)
    assert failed == ["container.memory.events"]
    assert "container.memory.oom_kills" not in values and values["container.memory.usage"] == 384 * MiB




def test_this_machines_real_cgroup_files_agree_with_the_reader() -> None:
    if not os.path.exists("/proc/self/cgroup") or not os.path.isdir("/sys/fs/cgroup"):
        pytest.skip("no cgroups here")
    cgroup = find_cgroup_memory()
    own = own_memory_cgroup()
    if cgroup is None:
        if own is None:
            pytest.skip("no v1 memory cgroup here (v2 alone, or none): the planted v2 trees stand for it")
        # then neither this process's v1 memory cgroup nor an ancestor up to the mount has a limit, as read here
        d = Path(own)
        while d != Path("/sys/fs/cgroup/memory").parent:
            assert not (d / "memory.limit_in_bytes").exists() or \
                int((d / "memory.limit_in_bytes").read_text()) >= 1 << 60, d
            d = d.parent
        return
    values, failed = _sample(CgroupMemorySource(cgroup))
    assert failed == [] and 0 < values["container.memory.usage"]
    assert values["container.memory.limit"] == int(Path(cgroup.limit_file).read_text().replace("max", "0"))


@pytest.fixture
def limited_cgroup() -> Iterator[str]:
    """A real child of this process's v1 memory cgroup with a 96 MiB limit (root, v1 memory hierarchy writable)."""
    with limited_memory_cgroup("telemetrain-test", 96 * MiB) as child:
        yield child


def _job(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_"))}
    full.update({"TELEMETRAIN_DIR": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1", **env})
    src = str(HERE.parent / "src")
    full["PYTHONPATH"] = src + os.pathsep + full.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, str(HERE / "_oom_job.py")], env=full, capture_output=True, timeout=300)


def _run_dir(tmp_path: Path) -> Path:
    (run_json,) = (tmp_path / "runs").rglob("run.json")
    return run_json.parent


def _findings(run_dir: Path) -> dict[str, list[str]]:
    """The findings of report (its Python and its SQL readers) and show as 'title -- detail' lines (``tail`` follows
    a run as live: a loop still open is no crash there, so neither is an OOM kill)."""
    sys.path.insert(0, str(HERE))
    from _planted import report_findings, show_findings
    from telemetrain.report.model import build_model
    from telemetrain.store import open_run
    from telemetrain.store.engine import Engine

    with Engine([run_dir]) as engine:
        by_sql = list(build_model(open_run(run_dir), engine=engine).findings)
    return {surface: [f"{f.title} -- {f.detail}" for f in found]
            for surface, found in (("report", report_findings(run_dir)), ("report by SQL", by_sql),
                                   ("show", show_findings(run_dir)))}


def test_a_job_killed_by_its_real_cgroups_oom_killer_gets_an_oom_kill_finding(
        tmp_path: Path, limited_cgroup: str) -> None:
    proc = _job(tmp_path, {"MODE": "real", "CGROUP_DIR": limited_cgroup})
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert "oom_kill 1" in Path(limited_cgroup, "memory.oom_control").read_text()  # the kernel's OOM killer did it
    for surface, found in _findings(_run_dir(tmp_path)).items():
        oom = [f for f in found if f.startswith("oom kill:")]
        assert len(oom) == 1, (surface, found)
        assert "likely killed by the container's OOM killer" in oom[0] and "cgroup memory limit 96.0 MiB" in oom[0]


def test_a_worker_killed_by_the_real_cgroups_oom_killer_is_counted_and_a_run_that_ended_normally_gets_no_finding(
        tmp_path: Path, limited_cgroup: str) -> None:
    from telemetrain.cli import summarize
    from telemetrain.store import open_run

    proc = _job(tmp_path, {"MODE": "worker", "CGROUP_DIR": limited_cgroup})
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert "oom_kill 1" in Path(limited_cgroup, "memory.oom_control").read_text()
    for surface, found in _findings(_run_dir(tmp_path)).items():
        assert not [f for f in found if f.startswith(("oom kill:", "crash:"))], (surface, found)
    (row,) = [line for line in summarize(open_run(_run_dir(tmp_path))) if " container " in line]
    assert "of its cgroup limit 96.0 MiB" in row and "; 1 OOM kill(s) in the cgroup while sampled" in row, row


def _planted_job(tmp_path: Path, usage_fraction: float, end: str, cache_fraction: float = 0.0) -> dict[str, list[str]]:
    root, self_cgroup = _tree(tmp_path, V2, "0::/kubepods/pod1\n")
    proc = _job(tmp_path, {"MODE": "planted", "CGROUP_ROOT": root, "SELF_CGROUP": self_cgroup, "END": end,
                           "CGROUP_DIR": str(tmp_path / "fs/kubepods/pod1"),
                           "USAGE": str(int(usage_fraction * 512 * MiB)),
                           "INACTIVE": str(int(cache_fraction * 512 * MiB))})
    assert proc.returncode == (-signal.SIGKILL if end == "kill" else 0), proc.stderr.decode()[-2000:]
    return _findings(_run_dir(tmp_path))


def test_a_killed_job_at_its_planted_cgroup_limit_gets_an_oom_kill_finding(tmp_path: Path) -> None:
    for surface, found in _planted_job(tmp_path, 0.97, "kill").items():
        oom = [f for f in found if f.startswith("oom kill:")]
        assert len(oom) == 1, (surface, found)
        assert "last working set (usage less inactive file cache) 496.6 MiB (97.0% of the limit" in oom[0]
        assert "cgroup memory limit 512.0 MiB" in oom[0]
        assert "oom_kill counter did not rise" in oom[0]
        assert any(f.startswith("crash:") for f in found)  # the crash is still said, with its likely cause apart


@pytest.mark.parametrize(("fraction", "end", "cache"), [
    (0.40, "ok", 0.0), (0.97, "ok", 0.0),  # ended normally, near its limit or not
    (0.40, "kill", 0.0),  # killed far from its limit (preempted, killed by hand)
    (0.99, "kill", 0.50),  # killed with its limit full of page cache: the kernel would have reclaimed it first
])
def test_no_oom_kill_finding_on_a_run_that_ended_normally_or_was_killed_far_from_its_limit(
        tmp_path: Path, fraction: float, end: str, cache: float) -> None:
    for surface, found in _planted_job(tmp_path, fraction, end, cache).items():
        assert not [f for f in found if f.startswith("oom kill:")], (surface, found)


def test_the_oom_kill_counter_rising_is_evidence_even_below_the_limit() -> None:
    b = InputBuilder()
    for i, (usage, kills) in enumerate([(100, 0), (200, 0), (300, 1), (250, 1)]):
        b.metric(0, "h", "system", "container.memory.limit", None, 1000, i)
        b.metric(0, "h", "system", "container.memory.usage", None, usage, i)
        b.metric(0, "h", "system", "container.memory.oom_kills", None, kills, i)
    b.host(0, "h")
    b.span_failure("training_loop", 0, "never ended")
    (oom,) = [f for f in analyse(b.build()).findings if f.kind == "oom kill"]
    assert "rose by 1" in oom.detail and "last usage 250 B (25.0% of the limit" in oom.detail  # no working set read
    clean = InputBuilder()
    for i in range(3):
        clean.metric(0, "h", "system", "container.memory.limit", None, 1000, i)
        clean.metric(0, "h", "system", "container.memory.usage", None, 990, i)
    assert not [f for f in analyse(clean.build()).findings if f.kind == "oom kill"]


def test_show_and_the_report_give_the_containers_memory_against_its_limit_by_python_and_by_sql(
        tmp_path: Path) -> None:
    from telemetrain.cli import summarize
    from telemetrain.report.html import render
    from telemetrain.report.model import build_model
    from telemetrain.store import open_run
    from telemetrain.store.engine import Engine

    found = _planted_job(tmp_path, 0.97, "ok", 0.50)
    assert not [f for fs in found.values() for f in fs if f.startswith("oom kill:")]
    run = open_run(_run_dir(tmp_path))
    with Engine([run.path]) as engine:
        for lines in (summarize(run), summarize(run, engine)):
            (row,) = [line for line in lines if " container " in line]
            assert row.split(" container ", 1)[0].strip().startswith("host ")  # the container's, not a rank's
            assert ("memory mean 496.6 MiB  max 496.6 MiB of its cgroup limit 512.0 MiB (97.0% at peak); working "
                    "set max 240.6 MiB (47.0% of the limit); 0 OOM kill(s) in the cgroup while sampled; memory "
                    "pressure (some, 10 s) max 12%") in row, row
        for model in (build_model(run), build_model(run, engine=engine)):
            (chart,) = [series for title, _, series in model.system if title.startswith("container memory")]
            # (the working set's share: the usage's page cache is reclaimed before a kill)
            assert len(chart) == 1 and all(v == pytest.approx(0.47, abs=1e-3) for _, v in chart[0].points)
            assert ("Container memory: usage max 496.6 MiB of its cgroup limit 512.0 MiB (97.0%); working set (usage "
                    "less inactive file cache) max 240.6 MiB (47.0% of the limit: the OOM killer acts near 100%).") \
                in render(model)
