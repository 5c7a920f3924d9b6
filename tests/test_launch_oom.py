"""The launcher's agent and a worker killed by SIGKILL: the agent outlives its worker and reads its memory cgroup's
OOM-kill count into the ``worker_failed`` event, so the crash finding names the container's OOM killer -- with a real
cgroup v1 memory limit and the kernel's real OOM killer where this process may make one (root, v1 memory hierarchy),
skipped otherwise -- and does not name it for a worker that SIGKILLed itself."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _memory_cgroup import limited_memory_cgroup
from telemetrain.analysis.findings.worker_exits import WorkerExit, exit_finding_text, meaning
from telemetrain.report.model import build_model
from telemetrain.store.reader import find_runs, open_run

HERE = Path(__file__).parent
MiB = 1 << 20




@pytest.fixture
def limited_cgroup() -> Iterator[str]:
    """A real child of this process's v1 memory cgroup, limited to 1.5 GiB: room for the agent (torch imported),
    not for a worker that allocates without end."""
    with limited_memory_cgroup("telemetrain-launch", 1536 * MiB) as child:
        yield child


def _launch_in(cgroup: str, tmp_path: Path, end: str) -> list[dict[str, Any]]:
    """``telemetrain launch`` of one ``_oom_worker.py`` (``END``) in ``cgroup``: the agent's worker_failed events."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_"))}
    env.update({"TELEMETRAIN_DIR": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1", "END": end,
                "PYTHONPATH": str(HERE.parent / "src") + os.pathsep + env.get("PYTHONPATH", "")})
    launch = [sys.executable, "-m", "telemetrain.cli", "launch", "--nproc-per-node", "1", "--monitor-interval", "0.1",
              str(HERE / "_oom_worker.py")]
    # the launcher joins the cgroup before it starts: its worker is born in it
    script = f"echo $$ > {shlex.quote(os.path.join(cgroup, 'cgroup.procs'))} && exec {shlex.join(launch)}"
    proc = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (path,) = find_runs(tmp_path / "runs")
    return [dict(r.attributes) for r in open_run(path).records("event", agents=True)
            if (r.group, r.name) == ("launcher", "worker_failed")]


def _crash_findings(tmp_path: Path) -> list[str]:
    (path,) = find_runs(tmp_path / "runs")
    return [f"{f.title} -- {f.detail}" for f in build_model(open_run(path)).findings if f.title.startswith("crash")]


def test_a_worker_killed_by_its_cgroups_oom_killer_is_named_so_by_the_agent(tmp_path: Path,
                                                                           limited_cgroup: str) -> None:
    (failed,) = _launch_in(limited_cgroup, tmp_path, "oom")
    assert "oom_kill 1" in Path(limited_cgroup, "memory.oom_control").read_text()  # the kernel's OOM killer did it
    assert (failed["exitcode"], failed["oom_kills"], failed["cgroup"]) == (-signal.SIGKILL, 1, limited_cgroup)
    (crash,) = _crash_findings(tmp_path)
    assert crash.startswith("crash: rank 0 was killed by the container's OOM killer (SIGKILL, exit code -9) --"), crash
    assert f"memory cgroup {limited_cgroup} counted 1 OOM kill(s)" in crash


def test_a_worker_that_sigkills_itself_is_not_blamed_on_the_oom_killer(tmp_path: Path, limited_cgroup: str) -> None:
    (failed,) = _launch_in(limited_cgroup, tmp_path, "kill")
    assert (failed["exitcode"], failed["oom_kills"], failed["cgroup"]) == (-signal.SIGKILL, 0, limited_cgroup)
    (crash,) = _crash_findings(tmp_path)
    assert crash.startswith("crash: rank 0 died of SIGKILL (exit code -9) --") and "OOM killer" in crash
    assert "not its container's OOM killer" in crash and "killed by the container's OOM killer" not in crash


def test_the_exit_reads_the_agents_count_and_says_nothing_of_it_where_unread() -> None:
    oom = WorkerExit(0, -9, oom_kills=2, cgroup="/c")
    assert oom.oom_killed and "counted 2 OOM kill(s)" in meaning(oom)
    unread = WorkerExit(0, -9)
    assert not unread.oom_killed and "most often the kernel's out-of-memory killer" in meaning(unread)
    # a worker that died with an error while another was OOM-killed: only the SIGKILL is the OOM killer's
    found = exit_finding_text([WorkerExit(0, -9, first=True, oom_kills=1), WorkerExit(1, 1, oom_kills=1)])
    assert found is not None and found[0] == "crash: rank 0 was killed by the container's OOM killer (SIGKILL, " \
                                              "exit code -9) first"
