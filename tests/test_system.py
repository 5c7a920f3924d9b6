"""telemetrain.system: real psutil on this machine (with real child processes and DataLoader workers burning CPU and
holding memory), the real nvidia-ml-py (its absent-GPU path here; the GPU path where a GPU is), unit conversions,
fork, start/stop races, SIGTERM and exit, failures, arguments, and ``show``.

No test asserts wall-clock time: CPU figures are checked against CPU time the workers themselves measured.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from _device_sim import skip_if_cuda_in_use
from conftest import helper_env, run_dir_of, run_helper_process
from telemetrain import TelemetryWarning
from telemetrain.store import open_run

psutil = pytest.importorskip("psutil", reason="telemetrain.system needs psutil (the [system] extra)")

from telemetrain import system  # noqa: E402 - after the skip: it needs psutil
from telemetrain.cli import summarize  # noqa: E402
from telemetrain.stats import Gauge, registry  # noqa: E402
from telemetrain.system import Sampler, devices, names, units  # noqa: E402
from telemetrain.system.nvml import NvmlSource  # noqa: E402
from telemetrain.system.process import MIN_RATE_S  # noqa: E402
from telemetrain.system.process import _cpu_count as process_cpus  # noqa: E402

MiB = 1 << 20
SESSION = "system-tests"


@pytest.fixture
def t(tmp_path: Path) -> Iterator[telemetrain.Telemetry]:
    telemetry = telemetrain.Telemetry(store=tmp_path)
    try:
        yield telemetry
    finally:
        telemetry.close()
        system.stop_sampler()


def _metrics(t: telemetrain.Telemetry, name: str, group: str = "system") -> list[Any]:
    assert t.flush()
    return [r for r in open_run(run_dir_of(t)).records("metric") if r.name == name and r.group == group]


def _events(t: telemetrain.Telemetry, name: str) -> list[Any]:
    assert t.flush()
    return [r for r in open_run(run_dir_of(t)).records("event") if r.name == name]


def _cpu_count() -> float:
    """The CPUs the sampler's utilisations are relative to: the affinity's, or a container's CPU quota where less."""
    return process_cpus()


def _nvml_gpus() -> tuple[int, str]:
    """(number of GPUs NVML sees, why none) on this machine, with the real nvidia-ml-py."""
    try:
        import pynvml
    except ImportError:
        return 0, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return 0, f"NVML does not start here ({exc}): no NVIDIA driver/GPU on this machine"
    count = int(pynvml.nvmlDeviceGetCount())
    return count, "" if count else "NVML sees no GPU"


# -- units and accumulators -------------------------------------------------------------------------------------------


def test_unit_conversions_and_absence() -> None:
    assert units.percent_to_ratio(37) == pytest.approx(0.37)
    assert units.milli(251_500) == pytest.approx(251.5)  # mW -> W, mJ -> J
    assert units.mhz_to_hz(1980) == 1_980_000_000 and isinstance(units.mhz_to_hz(1980), int)
    assert units.joules_to_kwh(7.2e6) == pytest.approx(2.0)
    assert units.ratio(3, 4) == pytest.approx(0.75)
    # absent stays absent: never 0
    for fn in (units.percent_to_ratio, units.milli, units.mhz_to_hz):
        assert fn(None) is None
    assert units.ratio(None, 4) is None and units.ratio(3, None) is None
    assert units.ratio(0, 0) is None  # no swap: no swap utilisation, rather than 0 of 0
    # every unit the sampler puts on a record is one of them or a UCUM count annotation
    for unit, _ in names.CATALOGUE.values():
        assert unit in units.UNITS.values() or (unit.startswith("{") and unit.endswith("}")), unit


def test_energy_counter_differences_wraps_and_resets() -> None:
    c = units.EnergyCounter()
    assert c.update(5_000_000) == 0.0  # mJ since driver load: the first reading is the zero
    assert c.update(5_250_500) == pytest.approx(250.5)
    near_wrap = units.COUNTER_WRAP - 1_000
    c2 = units.EnergyCounter()
    c2.update(near_wrap)
    assert c2.update(2_000) == pytest.approx(3.0)  # 1000 mJ to the wrap + 2000 mJ after it
    assert (c2.wraps, c2.resets) == (1, 0)
    # a driver reload: the counter restarts near 0; the energy since the reset is added, nothing is subtracted
    assert c.update(400) == pytest.approx(250.9)
    assert (c.wraps, c.resets) == (0, 1)
    assert c.update(1_400) == pytest.approx(251.9) and c.joules == pytest.approx(251.9)
    # a step back that is no restart from 0 (a glitch): nothing added, and the next reading counts from the higher one
    g = units.EnergyCounter()
    g.update(9_000_000_000)  # 9 MJ since the driver loaded
    g.update(9_000_010_000)
    assert g.update(9_000_009_000) == pytest.approx(10.0) and (g.glitches, g.resets) == (1, 0)
    assert g.update(9_000_012_000) == pytest.approx(12.0)


def test_power_integration_is_trapezoidal_and_breaks_at_gaps() -> None:
    p = units.PowerIntegrator()
    s = 1_000_000_000
    assert p.update(0, 100.0) == 0.0
    assert p.update(2 * s, 100.0) == pytest.approx(200.0)  # 100 W for 2 s
    assert p.update(3 * s, 300.0) == pytest.approx(400.0)  # ramp 100 -> 300 W over 1 s: 200 J
    assert p.update(4 * s, None) == pytest.approx(400.0)  # unreadable: the gap is not guessed
    assert p.update(10 * s, 50.0) == pytest.approx(400.0)  # a new segment starts
    assert p.update(11 * s, 50.0) == pytest.approx(450.0)


# -- GPU selection (pure logic over NVML's device list) ---------------------------------------------------------------

UUIDS = [f"GPU-{i}aaaaaaa-0000-0000-0000-00000000000{i}" for i in range(4)]


def _pick(**kw: Any) -> tuple[list[int], list[int | None], str]:
    args = {"requested": None, "cuda_visible": None, "local_rank": None, "torch_device": None, **kw}
    chosen, reason = devices.select_gpus(UUIDS, **args)
    return [c.nvml_index for c in chosen], [c.cuda_index for c in chosen], reason


def test_gpu_selection_follows_cuda_visible_devices_and_local_rank() -> None:
    assert _pick() == ([0, 1, 2, 3], [0, 1, 2, 3], "")  # one process, nothing restricted: every visible GPU
    assert _pick(local_rank=2) == ([2], [2], "")  # torchrun: cuda:LOCAL_RANK
    assert _pick(cuda_visible="3,1", local_rank=1) == ([1], [1], "")  # visible device 1 of this process is GPU 1
    assert _pick(cuda_visible="2", local_rank=5) == ([2], [0], "")  # SLURM: one GPU per task, whatever the rank
    assert _pick(cuda_visible="GPU-3aa,GPU-0") == ([3, 0], [0, 1], "")  # UUID prefixes, in CUDA's order
    assert _pick(cuda_visible="1,2", torch_device=1, local_rank=0) == ([2], [1], "")  # torch's device wins
    assert _pick(requested="all", cuda_visible="1") == ([0, 1, 2, 3], [None, 0, None, None], "")
    assert _pick(requested=(1, "GPU-3"), cuda_visible="2,0") == ([0, 3], [1, None], "")
    chosen, _, reason = _pick(cuda_visible="")
    assert chosen == [] and "empty" in reason
    chosen, _, reason = _pick(cuda_visible="0,1", local_rank=3)
    assert chosen == [] and "local rank 3" in reason and "gpus=" in reason
    assert _pick(cuda_visible="1,-1,2")[0] == [1]  # CUDA stops at the first invalid entry
    chosen, _, reason = _pick(cuda_visible="MIG-abc")
    assert chosen == [] and "MIG" in reason
    chosen, _, reason = _pick(requested=(7,))
    assert chosen == [] and "not visible" in reason
    assert devices.select_gpus([], requested=None, cuda_visible=None, local_rank=None, torch_device=None) == (
        [], "NVML sees no GPU")


# -- host and process tree: real psutil -------------------------------------------------------------------------------


def test_host_and_process_metrics_have_base_units_and_sane_values(t: telemetrain.Telemetry, tmp_path: Path) -> None:
    s = Sampler(t, interval=60, host=True, disk_paths=["/", tmp_path])
    first = s.sample_now()
    _burn(MIN_RATE_S)  # a rate needs that long an interval (CPU times are counted in ticks)
    second = s.sample_now()
    assert ("system", "process.cpu.utilization") not in first  # a rate needs two samples: absent, not 0
    for key in ("system.cpu.utilization", "process.cpu.utilization", "process.tree.cpu.utilization"):
        assert 0.0 <= second[("system", key)] <= 1.0, key
    assert second[("system", "process.cpu.utilization")] > 0  # we burnt CPU between the samples
    if hasattr(psutil.cpu_times(), "steal"):  # Linux: the hypervisor's steal, a share of the same CPU time
        assert 0.0 <= second[("system", "system.cpu.steal")] <= second[("system", "system.cpu.utilization")]
    else:
        assert ("system", "system.cpu.steal") not in second
    assert ("system", "system.cpu.steal") not in first
    vm = psutil.virtual_memory()
    assert second[("system", "system.memory.limit")] == vm.total
    usage = second[("system", "system.memory.usage")]
    assert isinstance(usage, int) and 0 < usage <= vm.total
    assert second[("system", "system.memory.utilization")] == pytest.approx(usage / vm.total)
    rss = second[("system", "process.memory.usage")]
    assert isinstance(rss, int) and rss == pytest.approx(psutil.Process().memory_info().rss, rel=0.2)
    assert second[("system", "process.thread.count")] >= threading.active_count()  # + threads Python does not know
    assert second[("system", "process.cpu.time")] >= first[("system", "process.cpu.time")] + 0.03  # 10 ms ticks
    swap = psutil.swap_memory()
    assert (("system", "system.paging.utilization") in second) == (swap.total > 0)
    for name in ("system.disk.io.read", "system.disk.io.write", "system.network.io.receive",
                 "system.network.io.transmit"):
        if ("system", name) in first:  # bytes since the sampler started: a counter from 0
            assert first[("system", name)] == 0 and second[("system", name)] >= 0
    fs_groups = {g for g, _ in second if g.startswith("system.filesystem.")}
    assert "system.filesystem./" in fs_groups
    for group in fs_groups:
        used = second[(group, "system.filesystem.usage")]
        assert 0 < used <= second[(group, "system.filesystem.limit")]
        assert 0.0 < second[(group, "system.filesystem.utilization")] <= 1.0
    assert s.errors == 0, s.error_counts
    # records carry the unit; limits are recorded when they change, not every cycle
    s.sample_now()
    points = _metrics(t, "system.memory.usage")
    assert len(points) == 3 and {p.unit for p in points} == {"By"}
    assert len(_metrics(t, "system.memory.limit")) == 1
    assert {p.unit for p in _metrics(t, "process.cpu.utilization")} == {"1"}


def test_records_carry_the_conventions_names_and_attributes(t: telemetrain.Telemetry, tmp_path: Path) -> None:
    """Format v2: a direction or state is an attribute of one series (OpenTelemetry's), not a part of the name;
    latest() keeps the series keys (the v1 names of the split series); the device is an attribute too."""
    s = Sampler(t, interval=60, host=True, disk_paths=[tmp_path])
    s.sample_now()
    latest = s.latest()
    disk = {p.attributes["disk.io.direction"]: p.value for p in _metrics(t, "system.disk.io")}
    if ("system", "system.disk.io.read") in latest:
        assert disk == {"read": latest[("system", "system.disk.io.read")],
                        "write": latest[("system", "system.disk.io.write")]}
        assert {p.unit for p in _metrics(t, "system.disk.io")} == {"By"}
    assert not _metrics(t, "system.disk.io.read") and not _metrics(t, "system.network.io.receive")
    for p in _metrics(t, "system.network.io"):
        assert p.attributes["network.io.direction"] in ("receive", "transmit")
    (memory,) = _metrics(t, "system.memory.usage")
    assert memory.attributes == {"system.memory.state": "used"}
    assert _metrics(t, "system.memory.limit")[0].attributes is None
    (filesystem,) = [r for r in open_run(run_dir_of(t)).records("metric") if r.name == "system.filesystem.usage"]
    assert filesystem.attributes["system.filesystem.state"] == "used"
    mountpoint = Path(filesystem.attributes["system.filesystem.mountpoint"])
    assert os.path.ismount(mountpoint) and mountpoint in (tmp_path, *tmp_path.parents)
    if hasattr(psutil.Process(), "num_fds"):
        assert _metrics(t, "process.unix.file_descriptor.count")  # not the deprecated open_file_descriptor name
        assert ("system", "process.unix.file_descriptor.count") in latest
    assert not _metrics(t, "process.open_file_descriptor.count")


def test_host_metrics_only_on_local_rank_zero_by_default(tmp_path: Path) -> None:
    ident = telemetrain.identity_from_env(env={})
    for local_rank, host in ((0, True), (1, False)):
        with telemetrain.Telemetry(ident.replace(local_rank=local_rank, rank=local_rank, world_size=2),
                                   store=tmp_path) as tel:
            got = Sampler(tel, gpus=[]).sample_now()
        assert (("system", "system.memory.usage") in got) is host
        assert ("system", "process.memory.usage") in got  # every rank: its own process


def _burn(cpu_seconds: float) -> float:
    t0 = time.process_time()
    while time.process_time() - t0 < cpu_seconds:
        pass
    return time.process_time() - t0


# A process that holds MB MiB (touched, so resident), reports "ready", burns CPU on "burn" and reports the CPU time it
# burnt, then waits for its stdin to close; with a depth > 0 it first starts a child of its own and relays.
TREE_WORKER = textwrap.dedent(
    """
    import subprocess, sys, time
    depth, mb, burn = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    hold = bytearray(b"\\1") * (mb << 20)
    child = None
    if depth:
        child = subprocess.Popen([sys.executable, "-c", sys.argv[4], str(depth - 1), *sys.argv[2:]],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "burn"
    if child:
        child.stdin.write("burn\\n"); child.stdin.flush()
    t0 = time.process_time()
    while time.process_time() - t0 < burn:
        pass
    burnt = time.process_time() - t0
    if child:
        burnt += float(child.stdout.readline())
    print(burnt, flush=True)
    sys.stdin.read()
    if child:
        child.stdin.close(); child.wait()
    """
)


def _tree_source(s: Sampler) -> Any:
    return next(source for source in s._sources or () if source.name == "process")


@pytest.mark.parametrize("scan", ["proc", "psutil"])
def test_process_tree_counts_descendants_cpu_and_memory(t: telemetrain.Telemetry, scan: str) -> None:
    """A child with a grandchild (each holding 48 MiB and burning 0.3 s of CPU) and a second child started after the
    first sample: all show up in the process-tree figures, not in this process's own. ``scan``: descendants found
    by the incremental /proc scan (Linux) or by psutil (elsewhere)."""
    mb, burn = 48, 0.3
    procs = [subprocess.Popen([sys.executable, "-c", TREE_WORKER, "1", str(mb), str(burn), TREE_WORKER],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)]
    try:
        assert procs[0].stdout is not None and procs[0].stdout.readline().strip() == "ready"
        s = Sampler(t, interval=60, gpus=[])
        s.sample_now()  # builds the sources
        tree = _tree_source(s)
        if scan == "psutil":
            tree._descendants = None
        elif tree._descendants is None:
            pytest.skip("no /proc here: psutil finds the descendants")
        ncpu = _cpu_count()
        first = s.sample_now()
        assert tree.pids == {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
        after_first = time.monotonic()
        assert first[("system", "process.children.count")] == 2  # child and grandchild
        own_rss = first[("system", "process.memory.usage")]
        assert first[("system", "process.tree.memory.usage")] >= own_rss + 2 * mb * MiB
        # a worker born after the first sample counts with all its CPU time
        procs.append(subprocess.Popen([sys.executable, "-c", TREE_WORKER, "0", str(mb), str(burn)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        burnt = 0.0
        for p in procs:
            assert p.stdout is not None and p.stdin is not None
            if p is procs[-1]:
                assert p.stdout.readline().strip() == "ready"
            p.stdin.write("burn\n")
            p.stdin.flush()
        for p in procs:
            assert p.stdout is not None
            burnt += float(p.stdout.readline())
        before_second = time.monotonic()
        second = s.sample_now()
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in procs:
            p.wait(30)
    assert burnt >= 3 * burn
    elapsed = before_second - after_first  # a lower bound of the interval the sampler measured
    tree_cpu = second[("system", "process.tree.cpu.utilization")] * elapsed * ncpu
    own_cpu = second[("system", "process.cpu.utilization")] * elapsed * ncpu
    assert tree_cpu - own_cpu >= 0.9 * burnt, (tree_cpu, own_cpu, burnt)
    assert own_cpu < 0.5 * burnt  # this process mostly waited on pipes
    assert second[("system", "process.children.count")] == 3
    tree_extra = second[("system", "process.tree.memory.usage")] - second[("system", "process.memory.usage")]
    assert tree_extra >= 3 * mb * MiB
    # the children are gone: the tree is this process alone again
    third = s.sample_now()
    assert third[("system", "process.children.count")] == 0
    assert third[("system", "process.tree.memory.usage")] == third[("system", "process.memory.usage")]


def test_an_orphaned_grandchild_leaves_the_tree(t: telemetrain.Telemetry) -> None:
    """When a descendant dies, its children are re-parented away from this process: no longer in the tree (the
    incremental scan still has their old parent cached)."""
    code = "import subprocess, time; c = subprocess.Popen(['sleep', '60']); print(c.pid, flush=True); time.sleep(60)"
    middle = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert middle.stdout is not None
    orphan = int(middle.stdout.readline())
    try:
        s = Sampler(t, interval=60, gpus=[])
        assert s.sample_now()[("system", "process.children.count")] == 2
        tree = _tree_source(s)
        assert tree.pids == {os.getpid(), middle.pid, orphan}
        middle.kill()
        middle.wait()
        new_parent = psutil.Process(orphan).ppid()
        assert new_parent != middle.pid  # re-parented
        if new_parent == os.getpid():
            pytest.skip("this process is a subreaper: the orphan stays in its tree")
        s.sample_now()
        assert tree.pids == {os.getpid()}
        assert s.latest()[("system", "process.children.count")] == 0
    finally:
        middle.kill()
        middle.wait()
        try:
            psutil.Process(orphan).kill()
        except psutil.NoSuchProcess:
            pass


class _BurningDataset:
    """Each item waits for ``go``, burns CPU in the DataLoader worker that fetches it and returns the CPU time it
    burnt."""

    def __init__(self, n: int, burn: float, go: Any) -> None:
        self.n, self.burn, self.go = n, burn, go

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> float:
        self.go.wait()
        return _burn(self.burn)


_worker_buffer: list[bytearray] = []


def _hold_memory(ready: Any, worker_id: int) -> None:
    _worker_buffer.append(bytearray(b"\1") * (48 * MiB))  # resident while the worker lives
    ready.release()


def test_dataloader_workers_show_in_the_process_tree(t: telemetrain.Telemetry) -> None:
    import functools
    import multiprocessing

    torch = pytest.importorskip("torch", reason="a real DataLoader needs torch")
    ctx = multiprocessing.get_context("fork")
    go, ready = ctx.Event(), ctx.Semaphore(0)
    loader = torch.utils.data.DataLoader(
        _BurningDataset(24, 0.02, go), batch_size=2, num_workers=2, multiprocessing_context=ctx,
        persistent_workers=True, worker_init_fn=functools.partial(_hold_memory, ready),
    )
    s = Sampler(t, interval=60, gpus=[])
    it = iter(loader)  # starts the workers; their first items wait for `go`
    try:
        for _ in range(2):
            assert ready.acquire(timeout=60)
        first = s.sample_now()
        after_first = time.monotonic()
        go.set()  # every item's CPU is burnt between the two samples
        burnt = sum(float(batch.sum()) for batch in it)
        before_second = time.monotonic()
        second = s.sample_now()
    finally:
        go.set()
        del it, loader
    assert first[("system", "process.children.count")] >= 2
    assert first[("system", "process.tree.memory.usage")] - first[("system", "process.memory.usage")] >= 2 * 48 * MiB
    ncpu = _cpu_count()
    tree_cpu = second[("system", "process.tree.cpu.utilization")] * (before_second - after_first) * ncpu
    own_cpu = second[("system", "process.cpu.utilization")] * (before_second - after_first) * ncpu
    assert burnt >= 24 * 0.02
    assert tree_cpu - own_cpu >= 0.9 * burnt, (tree_cpu, own_cpu, burnt)
    assert second[("system", "process.children.count")] >= 2


# -- GPUs: the absent path everywhere, the NVML path where a GPU is ----------------------------------------------------


def test_no_gpu_means_absent_gpu_metrics_and_one_recorded_reason(
    t: telemetrain.Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs everywhere for real: here NVML does not start (no driver); on a GPU machine no device is visible."""
    skip_if_cuda_in_use()  # (torch's allocator is then read whatever CUDA_VISIBLE_DEVICES says now)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    s = Sampler(t, interval=60)
    s.sample_now()
    got = s.sample_now()
    assert not [k for k in got if k[0].startswith(("system.gpu.", "system.cuda."))]
    (event,) = _events(t, "system.gpu.unavailable")
    reason = event.attributes["reason"]
    assert reason and ("NVML" in reason or "CUDA_VISIBLE_DEVICES is empty" in reason or "nvidia-ml-py" in reason)
    assert s.errors == 0  # an absent GPU is not a failure
    start = _events(t, "system.sampler.start")[0].attributes
    assert start["gpu.devices"] == "" and start["gpu.reason"] == reason


def test_real_nvml_without_a_driver_gives_the_reason() -> None:
    count, why = _nvml_gpus()
    if count:
        pytest.skip("a GPU is here: the GPU path is tested instead")
    if "not installed" in why:
        pytest.skip("nvidia-ml-py is not installed (the [system] extra)")
    source = NvmlSource(None, None)
    assert source.devices == [] and "NVML did not start" in source.reason


def test_without_nvidia_ml_py_the_reason_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    source = NvmlSource(None, None)
    assert source.devices == [] and "nvidia-ml-py is not installed" in source.reason
    assert "telemetrain[system]" in source.reason


def test_nvml_metrics_on_a_real_gpu(t: telemetrain.Telemetry) -> None:
    count, why = _nvml_gpus()
    if not count:
        pytest.skip(f"no NVIDIA GPU: {why}")
    s = Sampler(t, interval=60, gpus="all")
    s.sample_now()
    _burn(0.3)
    got = s.sample_now()
    groups = sorted({g for g, _ in got if g.startswith("system.gpu.")})
    assert len(groups) == count
    for g in groups:
        values = {name: v for (group, name), v in got.items() if group == g}
        if "hw.gpu.utilization" in values:
            assert 0.0 <= values["hw.gpu.utilization"] <= 1.0
        # (0 is right on an idle GPU: NVML's v2 "used", as nvidia-smi's, leaves out the driver's reserve, and this
        # test may run in a process that has no CUDA context)
        assert 0 <= values["hw.gpu.memory.usage"] <= values["hw.gpu.memory.limit"] and values["hw.gpu.memory.limit"] > 0
        if "hw.power" in values:
            assert 1.0 < values["hw.power"] < 2000.0  # W, not mW
            assert values["hw.power"] <= values.get("hw.gpu.power.limit", 2000.0) * 1.5
        if "hw.temperature" in values:
            assert 0 < values["hw.temperature"] < 120  # Cel
        if "hw.gpu.clock.sm" in values:
            assert 1e8 < values["hw.gpu.clock.sm"] < 1e10  # Hz, not MHz
        energy = values.get("hw.energy", values.get("hw.energy.integrated"))
        assert energy is not None and 0.0 < energy < 2000.0 * 60  # J since the first sample, a fraction of a second
    devices_ev = _events(t, "system.gpu.device")
    assert len(devices_ev) == count and all(e.attributes["uuid"].startswith(("GPU-", "gpu-")) for e in devices_ev)


def test_cuda_allocator_is_not_read_before_the_program_initialises_cuda(t: telemetrain.Telemetry) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_initialized():
        pytest.skip("CUDA is already initialised in this process")
    got = Sampler(t, interval=60, gpus=[]).sample_now()
    assert not [k for k in got if k[0].startswith("system.cuda.")]
    assert not torch.cuda.is_initialized()  # the sampler never initialises CUDA


def test_cuda_allocator_on_a_real_gpu(t: telemetrain.Telemetry) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch here")
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    got = Sampler(t, interval=60).sample_now()
    k = torch.cuda.current_device()
    assert got[(f"system.cuda.{k}", "torch.cuda.memory.allocated")] >= x.numel()
    assert got[(f"system.cuda.{k}", "torch.cuda.memory.reserved")] >= got[(f"system.cuda.{k}",
                                                                          "torch.cuda.memory.allocated")]
    assert got[(f"system.cuda.{k}", "torch.cuda.ooms")] == 0


# -- lifecycle: thread, gauges, races, fork, SIGTERM, exit ------------------------------------------------------------


def _sampler_threads() -> list[threading.Thread]:
    return [th for th in threading.enumerate() if th.name == "telemetrain-sampler" and th.is_alive()]


def test_start_samples_at_once_and_stop_takes_a_last_sample(t: telemetrain.Telemetry) -> None:
    s = system.start_sampler(t, interval=3600, gpus=[])
    assert system.start_sampler(t, interval=3600, gpus=[]) is s  # idempotent
    assert s.first_sample.wait(30) and s.running and len(_sampler_threads()) == 1
    assert s.stop() and s.stop()  # idempotent
    assert not s.running and not _sampler_threads()
    assert s.samples == 2  # the first at start (no waiting an interval), the last at stop
    assert len(_metrics(t, "process.memory.usage")) == 2
    (stop,) = _events(t, "system.sampler.stop")
    assert stop.attributes["final_sample"] is True and stop.attributes["samples"] == 2
    assert stop.attributes["reason"] == "stop" and stop.attributes["cpu_seconds"] > 0
    # a new session on the same sampler
    s.start()
    assert s.first_sample.wait(30)
    t.close()  # closing the Telemetry stops it, with a last sample, before the sinks close
    assert not s.running and not _sampler_threads()
    stops = [e.attributes for e in open_run(t.run_dir).records("event") if e.name == "system.sampler.stop"]
    assert [a["reason"] for a in stops] == ["stop", "close"] and stops[-1]["final_sample"] is True
    with pytest.raises(RuntimeError, match="closed"):
        s.start()


def test_the_thread_samples_every_interval(t: telemetrain.Telemetry) -> None:
    s = Sampler(t, interval=0.02, gpus=[]).start()
    try:
        deadline = time.monotonic() + 30
        while s.samples < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        s.stop()
    assert s.samples >= 6 and s.errors == 0


def test_a_sampler_its_closed_telemetry_did_not_stop_ends_its_thread(t: telemetrain.Telemetry) -> None:
    """The safety net for a start() that races the Telemetry's close (the close's hook then misses it): the thread
    sees the Telemetry closed at its next wake-up and ends instead of sampling into nothing for ever."""
    s = Sampler(t, interval=0.01, gpus=[]).start()
    assert s.first_sample.wait(30)
    t.extensions["system.sampler"].samplers.discard(s)  # as if it had started just after the close's hook ran
    t.close()
    deadline = time.monotonic() + 30
    while (s.running or _sampler_threads()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not s.running and not _sampler_threads()
    assert s.stop()  # already stopped: nothing to do


def test_samples_are_gauges_in_the_registry_without_extra_records(t: telemetrain.Telemetry) -> None:
    s = Sampler(t, interval=3600, gpus=[]).start()
    assert s.first_sample.wait(30)
    gauge = registry(t).get("process.memory.usage")
    assert isinstance(gauge, Gauge) and gauge.unit == "By" and gauge.group == "system"
    assert gauge.read() == s.latest()[("system", "process.memory.usage")]
    n = len(_metrics(t, "process.memory.usage"))
    assert t.flush() and len(_metrics(t, "process.memory.usage")) == n  # a flush adds no copies
    s.stop()
    assert registry(t).get("process.memory.usage") is None  # not sampled any more: gone


def test_start_stop_races_from_many_threads(t: telemetrain.Telemetry) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def hammer(k: int) -> None:
        try:
            barrier.wait()
            for i in range(15):
                if (i + k) % 3:
                    system.start_sampler(t, interval=0.01, gpus=[])
                else:
                    system.stop_sampler()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert system.stop_sampler()
    assert not errors and not _sampler_threads()
    sampler = system.get_sampler()
    assert sampler is not None and not sampler.running and sampler.errors == 0
    starts, stops = _events(t, "system.sampler.start"), _events(t, "system.sampler.stop")
    assert len(starts) == len(stops) >= 1  # every session that started was stopped, each with its last sample
    assert all(e.attributes["final_sample"] for e in stops)


FORK_CODE = textwrap.dedent(
    """
    import json, os, sys, threading
    import telemetrain
    from telemetrain import system
    t = telemetrain.Telemetry(store=sys.argv[1])
    s = system.start_sampler(t, interval=0.05, gpus=[])
    s.first_sample.wait(30)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        seen = {"running": s.running, "threads": [th.name for th in threading.enumerate()]}
        child = system.start_sampler(t, interval=3600, gpus=[])
        child.first_sample.wait(30)
        seen["child_samples"] = child.samples
        t.close()
        os.write(w, json.dumps(seen).encode())
        os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    seen = json.loads(os.read(r, 65536))
    seen.update(child_pid=pid, status=status, parent_running=s.running)
    t.close()
    print(json.dumps(seen))
    """
)


def test_fork_child_inherits_no_running_sampler(tmp_path: Path) -> None:
    import json

    run_id = f"fork-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run([sys.executable, "-c", FORK_CODE, str(tmp_path)], capture_output=True, text=True,
                          timeout=60, env=helper_env(run_id, SESSION))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["status"] == 0 and seen["parent_running"] is True
    assert seen["running"] is False and "telemetrain-sampler" not in seen["threads"]
    assert seen["child_samples"] == 1
    run = open_run(tmp_path / SESSION / run_id)
    child = [p for p in run.processes if p.pid == seen["child_pid"]]
    assert len(child) == 1  # the child's own file, its records with its pid
    starts = [r for r in child[0].records if r.kind == "event" and r.name == "system.sampler.start"]
    assert [r.attributes["process.pid"] for r in starts] == [seen["child_pid"]]
    child_points = [r for r in child[0].records if r.kind == "metric" and r.name == "process.memory.usage"]
    assert len(child_points) == 2  # its first sample and its last, at close; none of the parent's
    (parent,) = [p for p in run.processes if p.pid != seen["child_pid"]]
    assert sum(1 for r in parent.records if r.kind == "event" and r.name == "system.sampler.start") == 1


SIGNAL_CODE = textwrap.dedent(
    """
    import sys, time
    import telemetrain
    from telemetrain import system
    t = telemetrain.Telemetry(store=sys.argv[1])
    s = system.start_sampler(t, interval=3600, gpus=[])
    s.first_sample.wait(30)
    print("ready", flush=True)
    if sys.argv[2] == "wait":
        time.sleep(60)
    """
)


@pytest.mark.parametrize("how", ["sigterm", "exit"])
def test_last_sample_at_sigterm_and_at_exit(tmp_path: Path, how: str) -> None:
    run_id = f"{how}-{uuid.uuid4().hex[:8]}"
    code = f"import sys; sys.argv = ['x', {str(tmp_path)!r}, {('wait' if how == 'sigterm' else 'exit')!r}]\n"
    returncode, path, stderr = run_helper_process(tmp_path, code + SIGNAL_CODE, run_id, SESSION,
                                                  sigterm=how == "sigterm", timeout=30)
    assert returncode == (-signal.SIGTERM if how == "sigterm" else 0), stderr
    records = open_run(path).records()
    points = [r for r in records if r.kind == "metric" and r.name == "process.memory.usage"]
    assert len(points) == 2  # at start and the last one at close, never an interval (1 h) later
    (stop,) = [r for r in records if r.kind == "event" and r.name == "system.sampler.stop"]
    assert stop.attributes["reason"] == "close" and stop.attributes["final_sample"] is True
    assert points[-1].mono_ns <= stop.mono_ns


# -- failures and arguments -------------------------------------------------------------------------------------------


def test_a_failing_read_is_counted_warned_once_recorded_and_the_rest_goes_on(
    t: telemetrain.Telemetry, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-dir" / "x"
    s = Sampler(t, interval=60, gpus=[], disk_paths=["/", missing])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = s.sample_now()
        second = s.sample_now()
    ours = [w for w in caught if issubclass(w.category, TelemetryWarning)]
    assert len(ours) == 1 and str(missing) in str(ours[0].message)
    assert s.errors == 2 and s.error_counts == {f"host.filesystem {missing}": 2}
    for got in (first, second):
        assert ("system.filesystem./", "system.filesystem.usage") in got  # the others are read
        assert not [k for k in got if k[0] == f"system.filesystem.{missing}"]  # absent, not 0
    assert t.flush()
    diagnostics = [r for r in open_run(run_dir_of(t)).records("diagnostic") if r.name == "sampler_error"]
    assert len(diagnostics) == 1 and diagnostics[0].sink == "system.sampler"
    assert "FileNotFoundError" in diagnostics[0].message


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"interval": "1"}, TypeError, "interval"),
        ({"interval": True}, TypeError, "interval"),
        ({"interval": 0}, ValueError, "interval"),
        ({"interval": float("nan")}, ValueError, "interval"),
        ({"interval": -1.0}, ValueError, "interval"),
        ({"gpus": 0}, TypeError, "gpus"),
        ({"gpus": "GPU-123"}, TypeError, "gpus"),
        ({"gpus": [True]}, TypeError, "gpus"),
        ({"gpus": [-1]}, ValueError, "gpus"),
        ({"disk_paths": "/"}, TypeError, "disk_paths"),
        ({"disk_paths": [3]}, TypeError, "disk_paths"),
        ({"host": "yes"}, TypeError, "host"),
        ({"process_tree": 1}, TypeError, "process_tree"),
        ({"cuda_allocator": None}, TypeError, "cuda_allocator"),
        ({"telemetry": object()}, TypeError, "telemetry"),
    ],
)
def test_bad_arguments_raise_at_the_call(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        system.start_sampler(**kwargs)
    sampler = system.get_sampler()
    assert sampler is None or not sampler.running


def test_stop_checks_its_timeout(t: telemetrain.Telemetry) -> None:
    s = Sampler(t, gpus=[])
    with pytest.raises(TypeError, match="timeout"):
        s.stop("5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        s.stop(-1.0)


def test_config_flag_from_the_environment(t: telemetrain.Telemetry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(system.sampler.ENV, raising=False)
    assert system.enable_from_env(t) is None
    monkeypatch.setenv(system.sampler.ENV, "every minute")
    with pytest.warns(TelemetryWarning, match="TELEMETRAIN_SYSTEM"):
        assert system.enable_from_env(t) is None
    monkeypatch.setenv(system.sampler.ENV, "0.5")
    s = system.enable_from_env(t)
    assert s is not None and s.running and s.interval == 0.5 and s.telemetry is t
    monkeypatch.setenv(system.sampler.ENV, "on")
    s2 = system.enable_from_env(t)
    assert s2 is not None and s2.interval == system.DEFAULT_INTERVAL_S and not s.running
    assert system.stop_sampler()


def test_the_default_instance_starts_the_sampler_the_environment_asks_for(tmp_path: Path) -> None:
    """$TELEMETRAIN_SYSTEM on the default Telemetry (the one module-level APIs build on first use): its run has
    samples, at the interval asked for, from the first use on; without the variable, none."""
    code = textwrap.dedent(
        """
        import telemetrain
        from telemetrain import metrics
        metrics.put_metric("m", 1, "g")  # the first use builds the default instance from the environment
        telemetrain.get_telemetry().close()
        """
    )
    found = {}
    for flag in ("0.5", None):
        run_id = f"env-{flag}-{uuid.uuid4().hex[:8]}"
        extra = {"TELEMETRAIN_DIR": str(tmp_path)} | ({system.sampler.ENV: flag} if flag else {})
        proc = subprocess.run([sys.executable, "-c", code], env=helper_env(run_id, SESSION, pythonpath=None, **extra),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        records = open_run(tmp_path / SESSION / run_id).records()
        found[flag] = [r for r in records if r.kind == "event" and r.name == "system.sampler.start"]
        assert any(r.kind == "metric" and r.name == "m" for r in records)
    (start,) = found["0.5"]
    assert start.attributes["interval_s"] == 0.5
    assert found[None] == []


def test_importing_needs_psutil_and_starts_nothing() -> None:
    code = textwrap.dedent(
        """
        import sys, threading
        import telemetrain
        assert "psutil" not in sys.modules and threading.active_count() == 1  # core: standard library, no thread
        sys.modules["psutil"] = None  # as if the [system] extra were not installed
        try:
            import telemetrain.system
        except ImportError as exc:
            print(exc)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'telemetrain[system]'" in proc.stdout and "psutil" in proc.stdout
    ok = subprocess.run([sys.executable, "-c", "import threading, telemetrain.system; "
                         "print(threading.active_count())"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip() == "1", ok.stderr  # no thread at import


# -- show -------------------------------------------------------------------------------------------------------------


def test_show_summarises_cpu_memory_gpus_and_run_energy(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=tmp_path)
    s = Sampler(t, interval=60, host=True, gpus=[])
    s.sample_now()
    _burn(MIN_RATE_S)  # a rate needs that long an interval (CPU times are counted in ticks)
    s.sample_now()
    # two GPUs' energy as the NVML source records it (J since the sampler started); GPU 1 sampled by two processes
    # would be counted once: here one process, rising values, the last one counts
    for value in (0.0, 1.8e6, 3.6e6):
        t.metric("hw.energy", value, "system.gpu.0", unit="J")
    t.metric("hw.energy.integrated", 1.8e6, "system.gpu.1", unit="J")
    for value in (0.5, 1.0):
        t.metric("hw.gpu.utilization", value, "system.gpu.0", unit="1")
    t.close()
    lines = summarize(open_run(run_dir_of(t)))
    text = "\n".join(lines)
    assert "system      sampled by 1 process(es) every 60 s" in text

    def row(who: str, what: str) -> str:
        found = [line for line in lines if re.match(rf"^  {re.escape(who)} +{re.escape(what)} +\S", line)]
        assert len(found) == 1, (who, what, text)
        return found[0]

    host = f"host {t.identity.host}"
    assert re.search(r"mean \d+\.\d% +max \d+\.\d% of all CPUs$", row(host, "cpu"))
    assert re.search(r"mean [\d.]+ [KMG]iB +max [\d.]+ [KMG]iB of [\d.]+ GiB", row(host, "memory"))
    assert "used max" in row(host, "filesystem /")
    process = row(f"rank 0 pid {os.getpid()}", "process")
    assert re.search(r"rss max [\d.]+ MiB, with descendants max [\d.]+ MiB \(\d+ descendant process\(es\) at most\); "
                     r"cpu mean [\d.]+% = [\d.]+ cores", process), process
    assert row(host, "gpu 0").endswith("util mean 75% max 100%")
    assert "energy      5,400,000.0 J = 1.5 kWh from 2 GPU(s)" in text
    assert "1 energy counter" in text and "1 integrated from power" in text


def test_the_demo_records_system_samples(demo_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    run = open_run(demo_run[0])
    names_seen = {r.name for r in run.records("metric") if r.group == "system"}
    assert {"process.memory.usage", "process.tree.memory.usage", "system.memory.usage"} <= names_seen
    assert [r.name for r in run.records("event") if r.name.startswith("system.sampler.")] == [
        "system.sampler.start", "system.sampler.stop"]
    text = "\n".join(summarize(run))
    assert "system      sampled by 1 process(es) every 1 s" in text and "memory" in text


class _DeviceValues:
    """A source adding what the NVML and allocator sources add on a GPU machine (no GPU here): the sampler's
    publishing turns each series key into the conventions' record."""

    name = "devices"

    def sample(self, cycle: Any) -> None:
        cycle.add("system.gpu.1", "hw.power", 312.5)
        cycle.add("system.gpu.1", "hw.errors.uncorrected", 2)
        cycle.add("system.gpu.1", "hw.gpu.clock.sm", 1.98e9)
        cycle.add("system.cuda.0", "torch.cuda.memory.allocated", 1024)

    def describe(self) -> dict[str, Any]:
        return {}


def test_device_series_carry_the_devices_attributes(t: telemetrain.Telemetry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Sampler, "_build_sources", lambda self: [_DeviceValues()])
    s = Sampler(t, interval=60, host=False, gpus=[], cuda_allocator=False)
    s.sample_now()
    assert s.latest()[("system.gpu.1", "hw.errors.uncorrected")] == 2  # keyed by series, as before
    records = {(r.group, r.name): r for r in open_run(run_dir_of(t)).records("metric")} if t.flush() else {}
    power = records[("system.gpu.1", "hw.power")]
    assert (power.unit, power.attributes) == ("W", {"hw.id": "1", "hw.type": "gpu"})
    errors = records[("system.gpu.1", "hw.errors")]
    assert errors.attributes == {"error.type": "uncorrected", "hw.id": "1", "hw.type": "gpu"}
    assert errors.unit == "{error}"
    assert records[("system.gpu.1", "hw.gpu.clock.sm")].attributes == {"hw.id": "1", "hw.type": "gpu"}
    assert records[("system.cuda.0", "torch.cuda.memory.allocated")].attributes == {"torch.cuda.device": 0}
