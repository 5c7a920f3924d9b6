#!/usr/bin/env python3
"""The system sampler's cost (``telemetrain.system``): CPU per sampling cycle, its share of one core at a 1 s
interval, and a small CPU training run with the sampler on at 1 s against the same run without it.

Sections (every row names what it is compared with):

  cycle      CPU time of one sampling cycle, measured with ``time.thread_time_ns`` around ``--cycles`` cycles taken
             with ``Sampler.sample_now()`` in this thread (a thorough cycle: the descendant scan runs every time, as it
             does in the sampler's own cycles at a 1 s interval), median and best of ``--repeats``; the process has
             ``--children`` idle child processes (as DataLoader workers), so the process-tree part reads a tree.
             Rows: host + process tree + disk + net (the issue's definition: ``gpus=[]``, no allocator); everything
             the default sampler reads here (NVML and the allocator where present); each source alone; and the
             all-in cost of a cycle in process CPU time (``time.process_time_ns``: every thread, the run store's
             writer encoding and writing the records included, ``flush()`` inside the timed region). Targets: one
             cycle <= 2 ms of CPU (1a), and at a 1 s interval < 0.5% of one core (1b: all-in cycle CPU / 1 s).
  thread     the real sampler thread at a ``--thread-interval`` for ``--thread-seconds``: its own accounting of the
             CPU its cycles took (``Sampler.cpu_ns``), per cycle (information: wake-ups and the GIL included)
  training   a small CPU training run (an MLP on synthetic data generated in-process, ``torch.set_num_threads(1)``):
             plain (P), with ``start_sampler(interval=1.0)`` running during the run (T), plain again (Q), in rotating
             order over ``--train-rounds`` rounds; ratio = median over rounds of T / mean(P, Q), control = median of
             Q / P (the method's noise floor here), and the same ratio in process CPU time (every thread: the
             sampler's direct cost). Target 2: ratio <= 1.01, "no measurable change"

Method: ``_method.py`` beside this script (options, machine description, table, notes). CPU times, not wall times,
for the cycle rows; wall time for the training rows.

Usage:
    python bench/bench_system.py                  # full run (~1 min), markdown on stdout, progress on stderr
    python bench/bench_system.py --quick          # short smoke run (< 20 s)
    python bench/bench_system.py --json out.json  # also write the raw results
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from time import perf_counter_ns, process_time_ns, thread_time_ns
from typing import TYPE_CHECKING, Any, cast

import _method
from _method import NOTES, RESULTS, new_row, progress, row_of

if TYPE_CHECKING:
    from telemetrain.system.nvml import NvmlSource
    from telemetrain.system.process import ProcessTreeSource

warnings.filterwarnings("ignore")  # torch's "Failed to initialize NumPy" where numpy is absent

ARGS: Any
EXTRA: dict[str, Any] = {}
DISTS = ("telemetrain", "psutil", "nvidia-ml-py", "torch")
CYCLE_LIMIT_NS = 2_000_000  # target 1a: one cycle <= 2 ms of CPU
CORE_SHARE_LIMIT = 0.005  # target 1b: < 0.5% of one core at a 1 s interval
TRAIN_LIMIT = 1.01  # target 2


def _record(row: dict[str, Any], peer: dict[str, Any] | None = None) -> dict[str, Any]:
    return _method.record_with_peer(row, peer)


def _host_processes() -> int:
    return sum(1 for name in os.listdir("/proc") if name.isdigit()) if os.path.isdir("/proc") else -1


# -- 1. one sampling cycle ------------------------------------------------------------------------------------------


def _cycle_cpu(sampler: Any, cycles: int) -> tuple[list[float], list[float]]:
    """Per repeat: thread CPU ns per cycle, and process CPU ns per cycle with the store's writing included."""
    thread_ns, process_ns = [], []
    telemetry = sampler.telemetry
    for _ in range(ARGS.repeats):
        if ARGS.collect:
            gc.collect()
        telemetry.flush()
        p0, t0 = process_time_ns(), thread_time_ns()
        for _ in range(cycles):
            sampler.sample_now()
        t1 = thread_time_ns()
        telemetry.flush()  # the writer thread encodes and writes this repeat's records: counted in process time
        p1 = process_time_ns()
        thread_ns.append((t1 - t0) / cycles)
        process_ns.append((p1 - p0) / cycles)
    return thread_ns, process_ns


def section_cycle(tmpdir: str) -> None:
    import telemetrain
    from telemetrain.system import Sampler
    from telemetrain.system.base import Cycle

    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
                for _ in range(ARGS.children)]
    try:
        t = telemetrain.Telemetry(store=os.path.join(tmpdir, "cycle"))
        lib = "telemetrain.system"
        issue = Sampler(t, interval=1.0, host=True, gpus=[], cuda_allocator=False)
        issue.sample_now()  # sources built, first readings taken
        assert issue._sources is not None
        what = f"{ARGS.children} child processes, {_host_processes()} processes on the host"
        thread_ns, process_ns = _cycle_cpu(issue, ARGS.cycles)
        _record(new_row(lib, f"one cycle: host + process tree + disk + net, thread CPU ({what})", thread_ns,
                        ARGS.cycles))
        _record(new_row(lib, "same, all-in process CPU (the store's writer included)", process_ns, ARGS.cycles))
        EXTRA["records_per_cycle"] = len(issue.latest())
        EXTRA["tree_scan_ns"] = next(
            cast("ProcessTreeSource", s).scan_cost_ns for s in issue._sources if s.name == "process"
        )
        full = Sampler(t, interval=1.0, host=True)
        full.sample_now()
        assert full._sources is not None
        thread_full, _ = _cycle_cpu(full, ARGS.cycles)
        nvml = cast("NvmlSource | None", next((s for s in full._sources if s.name == "nvml"), None))
        gpus = f"{len(nvml.devices)} GPU(s)" if nvml is not None else "no NVML source"
        reason = f": {nvml.reason}" if nvml is not None and nvml.reason else ""
        _record(new_row(lib, f"one cycle: the default sampler (+ NVML, allocator; {gpus}{reason}), thread CPU",
                        thread_full, ARGS.cycles))
        for source in full._sources:
            samples = []
            for _ in range(ARGS.repeats):
                t0 = thread_time_ns()
                for _ in range(ARGS.cycles):
                    cycle = Cycle(time.monotonic_ns(), lambda what, exc: None, thorough=True)
                    source.sample(cycle)
                samples.append((thread_time_ns() - t0) / ARGS.cycles)
            _record(new_row("pieces", f"source {source.name} alone, thread CPU per cycle", samples, ARGS.cycles))
        _container_source_alone(tmpdir)
        for s in (issue, full):
            assert s.errors == 0, s.error_counts
        t.close()
    finally:
        for child in children:
            child.kill()
            child.wait()


def _container_source_alone(tmpdir: str) -> None:
    """The container memory source (``cgroup_memory``) alone: on a real cgroup with a memory limit -- this process's
    own where it has one; else a child of its v1 memory cgroup made for the measure (root) -- else on a planted v2
    tree of plain files (which reads cheaper than the kernel's generated cgroup files: said in the row)."""
    from telemetrain.system.base import Cycle
    from telemetrain.system.cgroup_memory import CgroupMemory, CgroupMemorySource, find_cgroup_memory

    cgroup, made, where = find_cgroup_memory(), None, "this process's cgroup (v{})"
    if cgroup is None:
        own = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                    if "memory" in line.split(":", 2)[1].split(",")), None) if os.path.exists("/proc/self/cgroup") \
            else None
        path = os.path.join("/sys/fs/cgroup/memory", (own or "/").lstrip("/"), f"bench-{os.getpid()}")
        try:
            os.mkdir(path)
            made = path
            Path(path, "memory.limit_in_bytes").write_text(str(1 << 30))
            cgroup, where = CgroupMemory(1, path), "a real v1 cgroup made for the measure"
        except OSError:
            root = Path(tmpdir, "cgroup")
            (root / "c").mkdir(parents=True)
            for name, text in (("memory.max", str(1 << 30)), ("memory.current", str(1 << 29)),
                               ("memory.stat", "anon 1\nfile 2\ninactive_file 3\n" * 20),
                               ("memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"),
                               ("memory.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                                                   "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")):
                (root / "c" / name).write_text(text)
            cgroup, where = CgroupMemory(2, str(root / "c")), "a planted v2 tree of plain files"
    try:
        source = CgroupMemorySource(cgroup)
        failed: list[str] = []
        samples = []
        for _ in range(ARGS.repeats):
            t0 = thread_time_ns()
            for _ in range(ARGS.cycles):
                source.sample(Cycle(time.monotonic_ns(), lambda what, exc: failed.append(what), thorough=True))
            samples.append((thread_time_ns() - t0) / ARGS.cycles)
        assert not failed, failed
        _record(new_row("pieces", f"source container alone ({where.format(cgroup.version)}), thread CPU per cycle",
                        samples, ARGS.cycles))
    finally:
        if made is not None:
            os.rmdir(made)


# -- 2. the live thread ---------------------------------------------------------------------------------------------


def section_thread(tmpdir: str) -> None:
    import telemetrain
    from telemetrain.system import Sampler

    t = telemetrain.Telemetry(store=os.path.join(tmpdir, "thread"))
    s = Sampler(t, interval=ARGS.thread_interval, host=True, gpus=[], cuda_allocator=False).start()
    time.sleep(ARGS.thread_seconds)
    s.stop()
    t.close()
    row = new_row("telemetrain.system", f"live sampler thread every {ARGS.thread_interval} s for "
                  f"{ARGS.thread_seconds} s: its cycles' thread CPU ({s.samples} cycles)",
                  [s.cpu_ns / max(1, s.samples)], s.samples)
    _record(row)
    EXTRA["thread"] = {"samples": s.samples, "cpu_ns": s.cpu_ns, "errors": s.errors}


# -- 3. a small training run, sampler on at 1 s vs off --------------------------------------------------------------


class _Trainer:
    def __init__(self, steps: int) -> None:
        import torch

        torch.set_num_threads(1)
        self.torch, self.steps = torch, steps
        self.hidden, self.batch, self.classes = 512, 64, 10

    def run(self) -> None:
        torch = self.torch
        nn = torch.nn
        torch.manual_seed(0)
        h = self.hidden
        model = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, self.classes))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        loss_fn = nn.CrossEntropyLoss()
        for _ in range(self.steps):
            x = torch.randn(self.batch, h, generator=g)
            y = torch.randint(0, self.classes, (self.batch,), generator=g)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()


def section_training(tmpdir: str) -> None:
    import telemetrain
    from telemetrain.system import start_sampler, stop_sampler

    tr = _Trainer(ARGS.train_steps)
    tr.run()  # warm-up: first calls, allocator
    orders = (("P", "T", "Q"), ("T", "Q", "P"), ("Q", "P", "T"))
    runs: dict[str, list[int]] = {"P": [], "T": [], "Q": []}
    cpu: dict[str, list[int]] = {"P": [], "T": [], "Q": []}
    ratios, cpu_ratios, controls, samples = [], [], [], []
    for k in range(ARGS.train_rounds):
        t = telemetrain.Telemetry(store=os.path.join(tmpdir, f"train_{k}"))
        for variant in orders[k % 3]:
            if ARGS.collect:
                gc.collect()
            c0, t0 = process_time_ns(), perf_counter_ns()
            if variant == "T":
                sampler = start_sampler(t, interval=1.0)
                tr.run()
                stop_sampler()  # its last sample is part of the run's cost
                samples.append(sampler.samples)
            else:
                tr.run()
            runs[variant].append(perf_counter_ns() - t0)
            cpu[variant].append(process_time_ns() - c0)
        t.close()
        p, tt, q = runs["P"][-1], runs["T"][-1], runs["Q"][-1]
        ratios.append(2 * tt / (p + q))
        cpu_ratios.append(2 * cpu["T"][-1] / (cpu["P"][-1] + cpu["Q"][-1]))
        controls.append(q / p)
        progress(f"training round {k + 1}/{ARGS.train_rounds} ({''.join(orders[k % 3])}): plain {p / 1e9:.3f} s / "
                 f"{q / 1e9:.3f} s, sampler on {tt / 1e9:.3f} s ({samples[-1]} samples): ratio {ratios[-1]:.4f} (CPU "
                 f"time {cpu_ratios[-1]:.4f}), control {controls[-1]:.4f}")
    steps = tr.steps
    what = f"MLP {tr.hidden}-{tr.hidden}-{tr.hidden}-{tr.classes}, batch {tr.batch}, {steps} steps"
    p_row = _record(new_row("training run", f"{what}: sampler off, ns per step",
                            [x / steps for x in runs["P"] + runs["Q"]], steps))
    t_row = _record(new_row("training run", f"{what}: sampler on at 1 s, ns per step",
                            [x / steps for x in runs["T"]], steps), p_row)
    t_row["ratio"], t_row["pair_ratios"] = statistics.median(ratios), ratios
    c_row = _record(new_row("training run", "control: sampler off vs off (Q/P, the same rounds), ns per step",
                            [x / steps for x in runs["Q"]], steps), p_row)
    c_row["ratio"], c_row["pair_ratios"] = statistics.median(controls), controls
    t_row["cpu_ratio"] = statistics.median(cpu_ratios)
    EXTRA["training"] = {"ratios": ratios, "cpu_ratios": cpu_ratios, "controls": controls, "samples": samples,
                         "runs_ns": runs, "cpu_ns": cpu}
    NOTES.append(
        f"training run: torch.set_num_threads(1); {ARGS.train_rounds} rounds of plain (P), sampler on at 1 s (T), "
        "plain (Q) in rotating order; the T run includes start_sampler (its first sample) and stop_sampler (its last): "
        f"{statistics.median(samples):.0f} samples a run. Ratio T / mean(P, Q) per round: "
        + ", ".join(f"{r:.4f}" for r in ratios) + "; control Q / P: " + ", ".join(f"{r:.4f}" for r in controls)
        + f". Process CPU time (all threads, the sampler's and the store writer's included), median of T / mean(P, Q): "
        f"{statistics.median(cpu_ratios):.4f}: the sampler's direct cost, which the wall-time ratio cannot resolve on "
        "a shared machine (see the control)."
    )


# -- checks and output ----------------------------------------------------------------------------------------------


def checks() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cycle = row_of("telemetrain.system", "one cycle: host + process tree + disk + net, thread CPU")
    allin = row_of("telemetrain.system", "same, all-in process CPU")
    if cycle is None or allin is None:
        out += [{"id": i, "status": "SKIP", "text": "not measured"} for i in ("1a", "1b")]
    else:
        ns = cycle["median_ns"]
        out.append({"id": "1a", "title": "one sampling cycle (host + process tree + disk + net) <= 2 ms of CPU",
                    "status": "PASS" if ns <= CYCLE_LIMIT_NS else "FAIL", "cycle_ns": ns,
                    "text": f"{ns / 1e3:,.0f} us of thread CPU per cycle (best {cycle['best_ns'] / 1e3:,.0f} us)"})
        share = allin["median_ns"] / 1e9
        out.append({"id": "1b", "title": "at a 1 s interval < 0.5% of one core", "status":
                    "PASS" if share < CORE_SHARE_LIMIT else "FAIL", "share": share,
                    "text": f"{allin['median_ns'] / 1e3:,.0f} us all-in per cycle = {share:.3%} of one core at 1 s"})
    train = next((r for r in RESULTS if r["library"] == "training run" and "sampler on" in r["operation"]), None)
    control = row_of("training run", "control")
    if train is None or train.get("ratio") is None or control is None:
        out.append({"id": "2", "status": "SKIP", "text": "not measured (torch not installed?)"})
    else:
        out.append({"id": "2", "title": "training run with the sampler on at 1 s <= 1.01x without",
                    "status": "PASS" if train["ratio"] <= TRAIN_LIMIT else "FAIL", "ratio": train["ratio"],
                    "control": control["ratio"], "cpu_ratio": train["cpu_ratio"],
                    "text": f"median ratio {train['ratio']:.4f} (control {control['ratio']:.4f}; limit {TRAIN_LIMIT}); "
                    f"process CPU time ratio {train['cpu_ratio']:.4f}"})
    return out


def render_table() -> str:
    def cells(r: dict[str, Any]) -> list[str]:
        return ["" if r.get("ratio") is None else f"{r['ratio']:.4f}x",
                "" if r.get("peer") is None else r["peer"].replace("|", "\\|")]

    return _method.render_table([("ratio to peer", "---:"), ("peer", "---")], cells)


def main(argv: list[str] | None = None) -> int:
    global ARGS
    ap = _method.parser(__doc__, "short smoke run (< 20 s)")
    ap.add_argument("--cycles", type=int, default=200, help="sampling cycles per repeat")
    ap.add_argument("--children", type=int, default=4, help="idle child processes (a process tree to read)")
    ap.add_argument("--thread-interval", type=float, default=0.05)
    ap.add_argument("--thread-seconds", type=float, default=2.0)
    ap.add_argument("--train-steps", type=int, default=600)
    ap.add_argument("--train-rounds", type=int, default=7, help="rounds of three runs (plain, sampler on, plain)")
    ap.add_argument("--only", help="comma-separated sections to run")
    ARGS = _method.parse_args(ap, argv)
    ARGS.collect = not ARGS.quick
    if ARGS.quick:
        ARGS.repeats, ARGS.cycles, ARGS.children, ARGS.warmup_s = 2, 20, 2, 0.1
        ARGS.thread_interval, ARGS.thread_seconds = 0.05, 0.3
        ARGS.train_steps, ARGS.train_rounds = 30, 2

    tmpdir = tempfile.mkdtemp(prefix="bench_system_")
    load_before = _method.loadavg()
    _method.spin(ARGS.warmup_s)
    sections = [
        ("cycle", lambda: section_cycle(tmpdir)),
        ("thread", lambda: section_thread(tmpdir)),
        ("training", lambda: section_training(tmpdir)),
    ]
    try:
        failed = _method.run_sections(sections, lambda name: name != "training", ARGS.only)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    load_after = _method.loadavg()
    results_checks = checks()

    _method.print_header(DISTS, load_before, load_after)
    print(f"method: median and best of {ARGS.repeats} repeats of {ARGS.cycles} cycles (CPU time: thread_time_ns, "
          f"process_time_ns); training: {ARGS.train_rounds} rounds of three runs, perf_counter_ns")
    _method.print_report(render_table(), results_checks, ARGS.json, DISTS, (load_before, load_after), ARGS, EXTRA)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    sys.exit(main())
