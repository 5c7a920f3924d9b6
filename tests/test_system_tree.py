"""The process tree's CPU when the descendant scan was skipped (a periodic sample under the scan-cost budget): a worker
first found late counts only its CPU from then on, never the CPU it burnt before the previous sample."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import telemetrain

pytest.importorskip("psutil", reason="telemetrain.system needs psutil (the [system] extra)")

from telemetrain.system import Sampler  # after the skip: it needs psutil
from telemetrain.system.process import _cpu_count as process_cpus

BURN_S = 0.4
WORKER = f"""
import sys, time
end = time.thread_time() + {BURN_S}
while time.thread_time() < end:
    pass
print("burnt", flush=True)
sys.stdin.read()
"""


def _tree(s: Sampler) -> Any:
    return next(source for source in s._sources or () if source.name == "process")


@pytest.mark.parametrize("scan", ["proc", "psutil"])
def test_a_worker_found_late_does_not_bring_its_earlier_cpu(telemetry: telemetrain.Telemetry, scan: str) -> None:
    s = Sampler(telemetry, interval=60, host=False, gpus=[], cuda_allocator=False)
    s.sample_now()  # scans: no descendant yet
    tree = _tree(s)
    if scan == "psutil":
        tree._descendants = None
    elif tree._descendants is None:
        pytest.skip("no /proc here: psutil finds the descendants")
    # born well after that sample (psutil's create time can read up to 1 s early: /proc/stat's boot time is whole
    # seconds), and before the next one
    time.sleep(1.2)
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "burnt"
        tree._next_scan_ns = 1 << 62  # the next periodic sample skips the scan, as when scans are over budget
        skipped = s._cycle(start=False, thorough=False)
        assert ("system", "process.children.count") in skipped and skipped[("system", "process.children.count")] == 0
        t0 = time.monotonic()
        time.sleep(0.2)  # the worker waits on stdin: idle all this interval
        found = s.sample_now()  # scans: the worker is found now, born before the previous sample
        elapsed = time.monotonic() - t0
    finally:
        if worker.stdin is not None:
            worker.stdin.close()
        worker.wait(30)
    assert found[("system", "process.children.count")] == 1 and s.errors == 0, s.error_counts
    ncpu = process_cpus()  # the affinity's CPUs, or a container's quota where less: what the figures divide by
    # the measured interval is at least `elapsed`: an upper bound of the CPU seconds the tree's figure stands for
    tree_extra = (found[("system", "process.tree.cpu.utilization")] - found[("system", "process.cpu.utilization")])
    assert tree_extra * ncpu * (elapsed + 0.2) < BURN_S / 2, (tree_extra, elapsed)


def test_a_worker_born_after_a_skipped_scan_brings_all_its_cpu(telemetry: telemetrain.Telemetry) -> None:
    s = Sampler(telemetry, interval=60, host=False, gpus=[], cuda_allocator=False)
    s.sample_now()
    tree = _tree(s)
    if tree._descendants is None:
        pytest.skip("no /proc here: start times from psutil are too coarse to tell")
    tree._next_scan_ns = 1 << 62
    s._cycle(start=False, thorough=False)  # no scan; the worker is born just after it
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "burnt"
        found = s.sample_now()
        cpu = sum(psutil_cpu(worker.pid))
    finally:
        if worker.stdin is not None:
            worker.stdin.close()
        worker.wait(30)
    assert found[("system", "process.children.count")] == 1 and s.errors == 0, s.error_counts
    assert found[("system", "process.tree.cpu.utilization")] > found[("system", "process.cpu.utilization")]
    assert cpu >= BURN_S


def psutil_cpu(pid: int) -> tuple[float, float]:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user, times.system


DATALOADER_JOB = """
import torch.utils.data as tud
import telemetrain
from telemetrain.system import get_sampler


class Probe(tud.Dataset[int]):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        telemetrain.metric("worker.item", float(i), "data")  # builds the worker's default instance from the env
        s = get_sampler()
        return int(s is not None and s.running)


if __name__ == "__main__":
    telemetrain.metric("main.x", 1.0, "train")
    s = get_sampler()
    print("parent", int(s is not None and s.running))
    loader = tud.DataLoader(Probe(), num_workers=1, multiprocessing_context="spawn", batch_size=None)
    print("workers", sum(loader))
"""


def test_a_spawned_dataloader_worker_starts_no_sampler_of_its_own(tmp_path: Path) -> None:
    """$TELEMETRAIN_SYSTEM is inherited: a spawn/forkserver worker would sample the host again and its own tree,
    which its parent's tree already counts."""
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(DATALOADER_JOB, encoding="utf-8")
    env = {**os.environ, "TELEMETRAIN_SYSTEM": "1", "TELEMETRAIN_STORE": str(tmp_path / "runs"), "LOCAL_RANK": "0"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "parent 1" in done.stdout and "workers 0" in done.stdout, done.stdout + done.stderr
