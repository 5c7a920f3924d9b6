#!/usr/bin/env python3
"""The dispatcher under load: the default run store at an offered rate, many producer threads into a slow sink, and
the idle cost. Each scenario runs in a fresh interpreter (``python bench_dispatch.py --scenario NAME``), so peak RSS
(``ru_maxrss``) and CPU times are its own.

Scenarios:

  offered   ``Telemetry()`` as a user gets it (run store on, default queue capacity 100,000 and flush interval 0.2 s);
            one producer thread offers ``Telemetry.metric`` at ``--rate`` records/s for ``--seconds`` s, paced in 1 ms
            slices (it catches up when it falls behind: the rate offered is the rate asked); then ``close()``.
            Reported: records dropped (``health()``), records in the file (counted), the writer's CPU time per
            record (the process's CPU time less the producer thread's). The claim: zero drops at 300k records/s.
  producers ``--threads`` threads x ``--per-thread`` records, as fast as they can, into a sink that sleeps 50 ms per
            batch (queue capacity 100,000, run store off): peak RSS growth (``ru_maxrss`` after the flood less before)
            and the accounting (delivered + dropped = offered). The claim: memory bounded by the capacity, not by
            the flood (a record in the queue is ~150 bytes: 100,000 are ~15 MB; the sink also holds a batch).
  idle      ``Telemetry()`` with one record written, then ``--idle-s`` s of nothing: the process's CPU time per
            second (the writer's and the trimmer's wake-ups).
  calls     the calling thread's CPU time (``time.thread_time_ns``) per call of ``put_metric``, ``Telemetry.event``
            with and without attributes and ``events.record``, writer parked (flush interval 3600 s), median of 7
            repeats of 50,000 calls: what the argument checks cost, measured in CPU time because wall time on a
            shared machine is mostly other jobs' time.

Usage:
    python bench/bench_dispatch.py                    # all scenarios, markdown on stdout
    python bench/bench_dispatch.py --quick            # short smoke run
    python bench/bench_dispatch.py --rates 300000,500000 --seconds 10

Timings are wall-clock on whatever machine runs it: on a shared machine they are indicative; the drop counts and
the RSS are what the claims are about.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _lines(path: Path, needle: bytes = b'"kind":"metric"') -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if needle in line)


def scenario_offered(rate: int, seconds: float) -> dict[str, Any]:
    import telemetrain

    with tempfile.TemporaryDirectory(prefix="bench_dispatch_") as tmp:
        t = telemetrain.Telemetry(store=tmp)  # the defaults: capacity 100,000, flush interval 0.2 s
        metric = t.metric
        metric("warm", 0, "warm")
        assert t.flush()
        total = int(rate * seconds)
        per_slice = max(1, rate // 1000)
        cpu0, thread0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
        sent = 0
        while sent < total:
            due = wall0 + sent / rate  # when this slice should start, at the rate asked
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            for i in range(sent, min(total, sent + per_slice)):
                metric("seq", i, "train")
            sent = min(total, sent + per_slice)
        offer_s = time.perf_counter() - wall0
        producer_cpu = time.thread_time() - thread0
        closed = t.close(60)
        cpu = time.process_time() - cpu0
        health = t.health()
        # every segment of this process (a 64 MiB segment rolls every ~0.6 M records here), less the warm-up record
        assert t.store is not None and t.store.path is not None  # made with store=; the warm-up record opened it
        path = t.store.path
        written = sum(_lines(f) for f in path.parent.glob(path.name.split(".")[0] + ".*jsonl")) - 1
    return {
        "rate": rate,
        "seconds": seconds,
        "offered": total,
        "offer_wall_s": offer_s,
        "achieved_rate": total / offer_s,
        "dropped": health["dropped"],
        "written": written,
        "closed": closed,
        "writer_cpu_us_per_record": (cpu - producer_cpu) / total * 1e6,
        "producer_cpu_us_per_record": producer_cpu / total * 1e6,
    }


def scenario_producers(threads: int, per_thread: int, capacity: int) -> dict[str, Any]:
    import telemetrain
    from telemetrain.sinks import Sink

    class Slow(Sink):
        name = "slow"

        def __init__(self) -> None:
            self.metrics = 0

        def write(self, records: Sequence[Any]) -> None:
            self.metrics += sum(1 for r in records if r.kind == "metric")
            time.sleep(0.05)

    warnings.simplefilter("ignore")  # the drop warning: the counts are reported
    t = telemetrain.Telemetry(store=False, queue_capacity=capacity)
    sink = Slow()
    t.add_sink(sink)
    t.metric("warm", 0, "train")
    assert t.flush()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def produce() -> None:
        metric = t.metric
        for i in range(per_thread):
            metric("seq", i, "train")

    workers = [threading.Thread(target=produce) for _ in range(threads)]
    wall0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - wall0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t.close(60)
    [stats] = t.health()["sinks"]
    offered = threads * per_thread + 1
    return {
        "threads": threads,
        "per_thread": per_thread,
        "capacity": capacity,
        "offered": offered,
        "delivered": stats["delivered"],
        "dropped": stats["dropped"],
        "exact": stats["delivered"] + stats["dropped"] == offered and sink.metrics == stats["delivered"],
        "flood_wall_s": wall,
        "rss_growth_mb": (peak - before) / 1024,  # ru_maxrss is KiB on Linux
    }


def scenario_idle(idle_s: float) -> dict[str, Any]:
    import telemetrain

    with tempfile.TemporaryDirectory(prefix="bench_dispatch_") as tmp:
        t = telemetrain.Telemetry(store=tmp)
        t.metric("one", 1, "train")
        assert t.flush()
        time.sleep(0.5)  # past the trimmer's back-off
        cpu0, wall0 = time.process_time(), time.perf_counter()
        time.sleep(idle_s)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        t.close()
    return {"idle_s": wall, "cpu_ms_per_s": cpu / wall * 1000, "core_percent": cpu / wall * 100}


def scenario_calls() -> dict[str, Any]:
    import gc

    import telemetrain
    from telemetrain import events, metrics

    with tempfile.TemporaryDirectory(prefix="bench_dispatch_") as tmp:
        t = telemetrain.Telemetry(store=tmp, flush_interval=3600, queue_capacity=10**8)
        telemetrain.set_telemetry(t)
        put, event, record = metrics.put_metric, t.event, events.record
        attributes = {"k": "v", "step": 1, "loss": 0.5}
        prebuilt = events.Event(name="bench", source=events.EventSource.WORKER, metadata={"k": "v", "step": 1})
        calls: dict[str, Callable[[], object]] = {
            'put_metric("m", 1, "grp")': lambda: put("m", 1, "grp"),
            'Telemetry.event("e")': lambda: event("e"),
            'Telemetry.event("e", {3 keys})': lambda: event("e", attributes),
            "events.record(Event, 2 metadata keys)": lambda: record(prebuilt),
        }
        out: dict[str, Any] = {}
        n = 50_000
        for name, call in calls.items():
            samples: list[float] = []
            for _ in range(7):
                gc.collect()
                c0 = time.thread_time_ns()
                for _ in range(n):
                    call()
                samples.append((time.thread_time_ns() - c0) / n)
                assert t.flush(120)
            out[name] = sorted(samples)[3]
        # the loop and the lambda, to subtract
        samples = []
        nothing: Callable[[], None] = lambda: None  # noqa: E731
        for _ in range(7):
            c0 = time.thread_time_ns()
            for _ in range(n):
                nothing()
            samples.append((time.thread_time_ns() - c0) / n)
        out["loop + lambda call"] = sorted(samples)[3]
        telemetrain.reset()
    return out


def run_one(name: str, args: list[str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--scenario", name, *args], capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"scenario {name} failed: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short smoke run")
    ap.add_argument("--rates", default="300000,400000", help="offered rates, records/s (comma-separated)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3, help="runs per offered rate")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--per-thread", type=int, default=1_000_000)
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--scenarios", default="offered,producers,idle,calls", help="which to run (comma-separated)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=int, help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.scenario:  # a child: one scenario, JSON on stdout
        if ns.scenario == "offered":
            out = scenario_offered(ns.rate, ns.seconds)
        elif ns.scenario == "producers":
            out = scenario_producers(ns.threads, ns.per_thread, ns.capacity)
        elif ns.scenario == "calls":
            out = scenario_calls()
        else:
            out = scenario_idle(ns.idle_s)
        print(json.dumps(out))
        return 0
    if ns.quick:
        ns.rates, ns.seconds, ns.runs, ns.per_thread, ns.idle_s = "300000", 1.0, 1, 100_000, 1.0
    results: dict[str, list[dict[str, Any]]] = {"offered": [], "producers": [], "idle": [], "calls": []}
    wanted = set(ns.scenarios.split(","))
    for rate in (int(r) for r in ns.rates.split(",")) if "offered" in wanted else ():
        for _ in range(ns.runs):
            r = run_one("offered", ["--rate", str(rate), "--seconds", str(ns.seconds)])
            results["offered"].append(r)
            print(f"offered {rate:,}/s: dropped {r['dropped']:,}", file=sys.stderr)
    if "producers" in wanted:
        results["producers"].append(run_one("producers", ["--threads", str(ns.threads), "--per-thread",
                                                          str(ns.per_thread), "--capacity", str(ns.capacity)]))
    if "idle" in wanted:
        results["idle"].append(run_one("idle", ["--idle-s", str(ns.idle_s)]))
    if "calls" in wanted:
        results["calls"].append(run_one("calls", []))

    import telemetrain

    print(f"telemetrain {telemetrain.__version__} from {Path(telemetrain.__file__).parent}; Python "
          f"{sys.version.split()[0]}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at the end\n")
    if results["offered"]:
        print("| offered (default store) | records | achieved rate /s | dropped | in the file | writer CPU us/record "
              "| producer CPU us/record |")
        print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results["offered"]:
        print(f"| {r['rate']:,}/s for {r['seconds']:g} s | {r['offered']:,} | {r['achieved_rate']:,.0f} | "
              f"{r['dropped']:,} | {r['written']:,} | {r['writer_cpu_us_per_record']:.2f} | "
              f"{r['producer_cpu_us_per_record']:.2f} |")
    for p in results["producers"]:
        print("\n| producers into a 50 ms/batch sink | offered | delivered | dropped | exact | flood s "
              "| peak RSS growth MB |")
        print("|---|---:|---:|---:|---|---:|---:|")
        print(f"| {p['threads']} threads x {p['per_thread']:,}, capacity {p['capacity']:,} | {p['offered']:,} | "
              f"{p['delivered']:,} | {p['dropped']:,} | {p['exact']} | {p['flood_wall_s']:.1f} | "
              f"{p['rss_growth_mb']:.1f} |")
    for i in results["idle"]:
        print(f"\nidle Telemetry (store on): {i['cpu_ms_per_s']:.2f} ms CPU per s ({i['core_percent']:.3f}% of a "
              f"core) over {i['idle_s']:.1f} s")
    for c in results["calls"]:
        print("\n| call (writer parked) | caller CPU ns |\n|---|---:|")
        for name, ns_per_call in c.items():
            print(f"| {name} | {ns_per_call:.0f} |")
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
