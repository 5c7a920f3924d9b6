#!/usr/bin/env python3
"""The hot-path cost of each backend sink: ``Telemetry.metric(name, value, group, step=...)`` ns per call on the
training thread with the run store alone, and with each backend sink attached next to it.

The claim measured (the backends issue): delivery is batched off the step -- the training thread only appends the
packed record to each attached sink's queue, and the sink's own thread does the rest -- so the hot path costs the
same whichever backend is attached. A do-nothing background sink (a ``telemetrain.sinks.Sink`` whose ``write`` does
nothing) is the control for "any second sink": a backend is compared with it, and with the run store alone.

Variants (each a fresh ``Telemetry(store=<tmp>)``, one per variant, round and mode):

  no-op call   a Python function with ``metric``'s signature that does nothing: the loop and call floor
  store        the run store alone
  do-nothing   the run store + the do-nothing background sink (the control)
  prometheus   the run store + ``PrometheusSink(port=0)`` (its HTTP server on a free loopback port)
  otel         the run store + ``OTelSink(TracerProvider(), MeterProvider(metric_readers=[InMemoryMetricReader()]))``
               (OpenTelemetry SDK; providers made with ``shutdown_on_exit=False`` and shut down after each variant)
  tensorboard  the run store + ``TensorBoardSink(<tmp>)`` (event files; google-crc32c's C CRC when installed)
  mlflow       the run store + ``MLflowSink("file://<tmp>", experiment_name="bench")`` (MLflow's local file store,
               ``MLFLOW_ALLOW_FILE_STORE=true``, ``MLFLOW_DISABLE_TELEMETRY=true``)

A backend whose package is not installed is skipped with a note.

Modes. Every call is ``metric(name, 0.5, "train", step=...)``, 10 names x 10 steps per block of 100 calls.

  paced   a training loop: ``--steps`` steps of (``--calls`` calls, then ``--pause-ms`` of ``time.sleep``: GIL-free, as
          a GPU step is, so the sinks' threads deliver there); only the calls are timed: ``time.thread_time_ns``, the
          training thread's CPU time (what the step pays), and ``perf_counter_ns`` (wall, with any GIL wait)
  burst   ``--burst-blocks`` x ``--calls`` calls back to back (below the queues' capacity: nothing is dropped) while
          the sinks' threads deliver concurrently: the worst case, their work competes with the loop for the GIL (and,
          on a 2-vCPU machine, for the CPU); wall and the training thread's CPU time. Every variant's Telemetry has
          ``flush_interval=--burst-interval`` (0.005 s) here: at the default 0.2 s a burst that fits in the queue
          (100,000 records) is over before the sinks' threads wake, and nothing would compete with it

Both modes also give the CPU time of every other thread (the store's writer, the sink's thread) per record, from the
start of the calls to the end of the flush after them (``process_time_ns`` less the training thread's): what delivery
costs off the step.

Rounds: ``--repeats`` rounds per mode, the variants interleaved in each round in rotating order (one process); before
each timed block a warm-up block of calls is delivered (the backend's first-batch setup: MLflow run, event file) and,
in a full run, ``gc.collect()`` runs; GC stays enabled. Median and best of the rounds; a ratio is the median of the
per-round ratios (the variant over the do-nothing sink, or over the store alone, measured in the same round). After
each variant its Telemetry is flushed and closed, and ``health()`` must show every record delivered to every sink,
nothing dropped or failed (checks 1a-1f). Check 2: each backend's paced training-thread CPU within 1.10x of the
do-nothing sink's (the issue's "the hot path cost must not change", with room for the noise: on the shared 2-vCPU
machine these ratios move by up to ~10% between runs).

Method: ``_method.py`` beside this script (options, machine description, table, notes).

Usage:
    python bench/bench_sinks.py                  # full run (~1-2 min), markdown on stdout, progress on stderr
    python bench/bench_sinks.py --quick          # short smoke run (< 20 s)
    python bench/bench_sinks.py --json out.json  # also write the raw results
"""

from __future__ import annotations

import gc
import importlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter_ns, process_time_ns, thread_time_ns
from typing import Any

import _method
from _method import NOTES, RESULTS, new_row, progress

# before anything imports mlflow (the sink modules are imported in main())
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
warnings.filterwarnings("ignore")  # MLflow's and the SDKs' deprecation chatter

ARGS: Any
EXTRA: dict[str, Any] = {}
DISTS = ("telemetrain", "prometheus-client", "opentelemetry-sdk", "tensorboard", "google-crc32c", "mlflow-skinny")
GROUP = "train"
NAMES = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "data_wait", "fwd_ms", "bwd_ms", "opt_ms", "mem_gb")
CPU_LIMIT = 1.10  # check 2: a backend's paced training-thread CPU <= 1.10x the do-nothing sink's
MEASURES = (  # (mode, key, library column)
    ("paced", "cpu", "paced: training-thread CPU"),
    ("paced", "wall", "paced: wall"),
    ("burst", "cpu", "burst: training-thread CPU"),
    ("burst", "wall", "burst: wall"),
    ("paced", "other", "paced: other threads' CPU per record"),
    ("burst", "other", "burst: other threads' CPU per record"),
)


# -- the variants ---------------------------------------------------------------------------------------------------


@dataclass
class Variant:
    key: str
    label: str
    check: str | None  # the id of its delivery check ("1a"...); None: no Telemetry (the no-op call)
    modules: tuple[str, ...] = ()  # what it needs imported (a missing one skips it)
    make: Callable[[str], tuple[Any, Callable[[], None] | None]] | None = None  # tmpdir -> (sink, cleanup)
    telemetry: bool = True


def _do_nothing_sink() -> Any:
    from telemetrain.sinks import Sink

    class DoNothing(Sink):
        name = "do-nothing"
        background = True

        def write(self, records: Any) -> None:
            pass

    return DoNothing()


def _prometheus(d: str) -> tuple[Any, None]:
    from telemetrain.sinks.prometheus import PrometheusSink

    return PrometheusSink(port=0), None


def _otel(d: str) -> tuple[Any, Callable[[], None]]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from telemetrain.sinks.otel import OTelSink

    # shutdown_on_exit=False: no atexit hook per round (the sink never shuts your providers down; we do, below)
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()], shutdown_on_exit=False)

    def cleanup() -> None:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return OTelSink(tracer_provider, meter_provider), cleanup


def _tensorboard(d: str) -> tuple[Any, None]:
    from telemetrain.sinks.tensorboard import TensorBoardSink

    return TensorBoardSink(os.path.join(d, "tb")), None


def _mlflow(d: str) -> tuple[Any, None]:
    from telemetrain.sinks.mlflow import MLflowSink

    return MLflowSink("file://" + os.path.join(d, "mlruns"), experiment_name="bench"), None


VARIANTS = (
    Variant("no-op call", "baseline: a no-op function with metric's signature (loop and call floor)", None,
            telemetry=False),
    Variant("store", "run store alone", "1a"),
    Variant("do-nothing", "run store + do-nothing background sink (control)", "1b",
            make=lambda d: (_do_nothing_sink(), None)),
    Variant("prometheus", "run store + PrometheusSink(port=0)", "1c", ("telemetrain.sinks.prometheus",), _prometheus),
    Variant("otel", "run store + OTelSink(SDK TracerProvider, MeterProvider + InMemoryMetricReader)", "1d",
            ("opentelemetry.sdk.metrics", "telemetrain.sinks.otel"), _otel),
    Variant("tensorboard", "run store + TensorBoardSink(tmpdir)", "1e", ("telemetrain.sinks.tensorboard",),
            _tensorboard),
    Variant("mlflow", "run store + MLflowSink(file store)", "1f", ("telemetrain.sinks.mlflow",), _mlflow),
)
BACKENDS = ("prometheus", "otel", "tensorboard", "mlflow")


def available_variants() -> list[Variant]:
    """The variants whose packages import; a missing one is skipped with a note."""
    out = []
    for v in VARIANTS:
        if ARGS.sinks is not None and v.key not in ("no-op call", "store", "do-nothing") and v.key not in ARGS.sinks:
            continue
        try:
            for module in v.modules:
                importlib.import_module(module)
        except ImportError as exc:
            _method.skip(v.key, exc)
            continue
        out.append(v)
    return out


# -- the timed loops ------------------------------------------------------------------------------------------------


def _noop_metric(name: str, value: float, group: str = "default", *, unit: str = "", step: int | None = None) -> None:
    pass


def _block_pairs(calls: int) -> list[tuple[int, str]]:
    """(step offset, name) of one block: the 10 names at steps +0, +1, ..., repeated to ``calls`` calls."""
    return [(i // len(NAMES), NAMES[i % len(NAMES)]) for i in range(calls)]


def paced(metric: Callable[..., None], steps: int, calls: int, pause_s: float, first_step: int) -> tuple[int, int]:
    """``steps`` x (``calls`` calls, then ``time.sleep(pause_s)``); (training-thread CPU ns, wall ns) of the calls."""
    pairs = _block_pairs(calls)
    span = pairs[-1][0] + 1
    cpu = wall = 0
    base = first_step
    sleep = time.sleep
    for _ in range(steps):
        w0 = perf_counter_ns()
        c0 = thread_time_ns()
        for offset, name in pairs:
            metric(name, 0.5, GROUP, step=base + offset)
        c1 = thread_time_ns()
        w1 = perf_counter_ns()
        cpu += c1 - c0
        wall += w1 - w0
        base += span
        sleep(pause_s)
    return cpu, wall


def burst(metric: Callable[..., None], blocks: int, calls: int, first_step: int) -> tuple[int, int]:
    """``blocks`` x ``calls`` calls back to back; (training-thread CPU ns, wall ns) of all of them."""
    pairs = _block_pairs(calls)
    span = pairs[-1][0] + 1
    base = first_step
    w0 = perf_counter_ns()
    c0 = thread_time_ns()
    for _ in range(blocks):
        for offset, name in pairs:
            metric(name, 0.5, GROUP, step=base + offset)
        base += span
    c1 = thread_time_ns()
    w1 = perf_counter_ns()
    return c1 - c0, w1 - w0


# -- one variant, one round -----------------------------------------------------------------------------------------


def run_once(v: Variant, mode: str, tmpdir: str) -> dict[str, Any]:
    """A fresh Telemetry (and sink) for ``v``, a warm-up block delivered, the timed block, then flush, close and the
    delivery counts. ns per call."""
    import telemetrain

    calls = ARGS.calls
    n = ARGS.steps * calls if mode == "paced" else ARGS.burst_blocks * calls
    d = tempfile.mkdtemp(dir=tmpdir)
    t = cleanup = None
    metric: Callable[..., None]  # Telemetry.metric, or the no-op call of the same shape
    try:
        if v.telemetry:
            kw = {"flush_interval": ARGS.burst_interval} if mode == "burst" else {}  # paced: the default, 0.2 s
            t = telemetrain.Telemetry(store=os.path.join(d, "store"), **kw)
            if v.make is not None:
                sink, cleanup = v.make(d)
                t.add_sink(sink)
            metric = t.metric
        else:
            metric = _noop_metric
        burst(metric, 1, calls, 0)  # warm-up: first calls; the backend's first batch (run, file, server) set up
        if t is not None:
            t.flush(timeout=ARGS.flush_timeout)
        if ARGS.collect:
            gc.collect()
        p0, c0 = process_time_ns(), thread_time_ns()
        if mode == "paced":
            cpu, wall = paced(metric, ARGS.steps, calls, ARGS.pause_ms / 1e3, 1000)
        else:
            cpu, wall = burst(metric, ARGS.burst_blocks, calls, 1000)
        w_flush = perf_counter_ns()
        flushed = t.flush(timeout=ARGS.flush_timeout) if t is not None else True
        flush_s = (perf_counter_ns() - w_flush) / 1e9
        other = (process_time_ns() - p0) - (thread_time_ns() - c0)  # the store's writer and the sink's thread
        out = {"cpu": cpu / n, "wall": wall / n, "other": other / n if t is not None else None, "calls": n,
               "flush_s": flush_s}
        if t is not None:
            closed = t.close(timeout=ARGS.flush_timeout)
            h = t.health()
            expected = n + calls
            sinks = [{k: s[k] for k in ("sink", "delivered", "dropped", "failed", "last_error")} for s in h["sinks"]]
            out["health"] = {"flushed": flushed, "closed": closed, "expected": expected, "sinks": sinks,
                             "dropped": h["dropped"], "failed": h["failed"]}
            out["ok"] = (flushed and closed and h["dropped"] == 0 and h["failed"] == 0 and len(sinks) == (
                2 if v.make is not None else 1) and all(s["delivered"] == expected for s in sinks))
        return out
    finally:
        if t is not None:
            t.close(timeout=ARGS.flush_timeout)
        if cleanup is not None:
            cleanup()
        shutil.rmtree(d, ignore_errors=True)


def section(mode: str, variants: list[Variant], tmpdir: str) -> None:
    rounds: dict[str, list[dict[str, Any]]] = {v.key: [] for v in variants}
    for r in range(ARGS.repeats):
        k = r % len(variants)
        order = variants[k:] + variants[:k]
        for v in order:
            rounds[v.key].append(run_once(v, mode, tmpdir))
        progress(f"{mode} round {r + 1}/{ARGS.repeats}: training-thread CPU ns/call: "
                 + ", ".join(f"{v.key} {rounds[v.key][-1]['cpu']:.0f}" for v in variants)
                 + ("" if all(x[-1].get("ok", True) for x in rounds.values()) else "  DELIVERY PROBLEM"))
    EXTRA.setdefault("rounds", {})[mode] = rounds
    n = rounds[variants[0].key][0]["calls"]
    for m, key, lib in MEASURES:
        if m != mode:
            continue
        for v in variants:
            samples = [x[key] for x in rounds[v.key]]
            if any(s is None for s in samples):
                continue
            row = new_row(lib, v.label, samples, n)
            row.update(variant=v.key, mode=mode, measure=key)
            for ref, col in (("do-nothing", "ratio_control"), ("store", "ratio_store")):
                refs = [x[key] for x in rounds.get(ref, [])]
                if v.key in (ref, "no-op call") or not refs:
                    row[col] = None
                else:
                    row[col + "_rounds"] = [a / b for a, b in zip(samples, refs, strict=True)]
                    row[col] = statistics.median(row[col + "_rounds"])
            RESULTS.append(row)
            ratio = "" if row.get("ratio_control") is None else f"  {row['ratio_control']:.3f}x do-nothing"
            progress(f"{lib:<38} {v.key:<12} {row['median_ns']:9.1f} ns (best {row['best_ns']:.1f}){ratio}")


# -- checks and output ----------------------------------------------------------------------------------------------


def checks(variants: list[Variant]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    measured = EXTRA.get("rounds", {})
    present = {v.key for v in variants}
    for v in VARIANTS:
        if v.check is None:
            continue
        runs = [x for mode in measured.values() for x in mode.get(v.key, [])]
        title = f"{v.key}: each Telemetry flushed and closed, health() shows all records delivered, none dropped/failed"
        if v.key not in present or not runs:
            out.append({"id": v.check, "title": title, "status": "SKIP", "text": "not measured"})
            continue
        bad = [x["health"] for x in runs if not x["ok"]]
        delivered = sum(s["delivered"] for x in runs for s in x["health"]["sinks"])
        dropped = sum(x["health"]["dropped"] for x in runs)
        failed = sum(x["health"]["failed"] for x in runs)
        text = (f"{len(runs)} Telemetry instances, {delivered:,} records delivered to "
                f"{len(runs[0]['health']['sinks'])} sink(s) each time, {dropped} dropped, {failed} failed")
        if bad:
            text += f"; {len(bad)} instance(s) not complete, first: {bad[0]}"
        out.append({"id": v.check, "title": title, "status": "FAIL" if bad else "PASS", "instances": len(runs),
                    "delivered": delivered, "dropped": dropped, "failed": failed, "text": text})

    def row(key: str, mode: str, measure: str) -> dict[str, Any] | None:
        return next((r for r in RESULTS if r["variant"] == key and r["mode"] == mode and r["measure"] == measure),
                    None)

    control = row("do-nothing", "paced", "cpu")
    if control is None or control.get("ratio_store") is None:
        out.append({"id": "2b", "title": "a second sink's cost (do-nothing / store alone)", "status": "SKIP",
                    "text": "not measured"})
    else:
        b = row("do-nothing", "burst", "cpu")
        store = row("store", "paced", "cpu")
        assert store is not None  # the control's ratio_store is to it
        burst_text = "" if b is None else f"; burst training-thread CPU {b['ratio_store']:.3f}x"
        out.append({"id": "2b", "title": "a second sink's cost (do-nothing sink / store alone)", "status": "INFO",
                    "ratio": control["ratio_store"],
                    "text": f"paced training-thread CPU {control['median_ns']:.0f} vs "
                    f"{store['median_ns']:.0f} ns/call: {control['ratio_store']:.3f}x"
                    + burst_text})
    for key in BACKENDS:
        check = next(v.check for v in VARIANTS if v.key == key)
        assert check is not None  # a backend has its delivery check
        cid = "2" + check[1]
        title = f"{key}: paced training-thread CPU <= {CPU_LIMIT:.2f}x the do-nothing sink's"
        r = row(key, "paced", "cpu")
        if r is None or r.get("ratio_control") is None:
            out.append({"id": cid, "title": title, "status": "SKIP", "text": "not measured"})
            continue
        b, bw = row(key, "burst", "cpu"), row(key, "burst", "wall")
        extra = "" if b is None or bw is None else (
            f"; burst: training-thread CPU {b['ratio_control']:.3f}x, wall {bw['ratio_control']:.3f}x")
        out.append({"id": cid, "title": title, "status": "PASS" if r["ratio_control"] <= CPU_LIMIT else "FAIL",
                    "ratio": r["ratio_control"], "ratio_store": r["ratio_store"],
                    "text": f"{r['median_ns']:.0f} ns/call, {r['ratio_control']:.3f}x the do-nothing sink, "
                    f"{r['ratio_store']:.3f}x the store alone (medians of per-round ratios)" + extra})
    return out


def render_table() -> str:
    def fmt(x: float | None) -> str:
        return "" if x is None else f"{x:.3f}x"

    def cells(r: dict[str, Any]) -> list[str]:
        return [fmt(r.get("ratio_control")), fmt(r.get("ratio_store"))]

    order = {(m, k): i for i, (m, k, _) in enumerate(MEASURES)}
    RESULTS.sort(key=lambda r: order[(r["mode"], r["measure"])])  # stable: variants keep their order
    return _method.render_table([("ratio to do-nothing sink", "---:"), ("ratio to store alone", "---:")], cells)


def _notes(variants: list[Variant]) -> None:
    keys = [v.key for v in variants]
    NOTES.append(
        f"every call: metric(name, 0.5, {GROUP!r}, step=...), {len(NAMES)} names; blocks of {ARGS.calls} calls; "
        f"paced: {ARGS.steps} steps of {ARGS.calls} calls + time.sleep({ARGS.pause_ms / 1e3}); burst: "
        f"{ARGS.burst_blocks * ARGS.calls:,} calls back to back, Telemetry(flush_interval={ARGS.burst_interval}) "
        "(paced: the default 0.2 s); n = calls timed per round. Variants per round in "
        f"rotating order: {', '.join(keys)}."
    )
    NOTES.append(
        "training-thread CPU = time.thread_time_ns around each block (paced: two reads per "
        f"{ARGS.calls} calls, included); it leaves out time spent waiting for the GIL while another thread holds it, "
        "which the wall rows include. Other threads' CPU per record = (process_time_ns - the training thread's) from "
        "the first timed call to the end of the flush after the block, over the records emitted: the run store's "
        "writer plus the sink's thread (and its library's own threads), i.e. what delivery costs off the step."
    )
    burst_rounds = EXTRA.get("rounds", {}).get("burst")
    if burst_rounds:
        flush = {k: statistics.median(x["flush_s"] for x in burst_rounds[k]) for k in keys if k != "no-op call"}
        NOTES.append("flush() after the burst, median seconds (the backlog the sink's thread still had): "
                     + ", ".join(f"{k} {s:.3f}" for k, s in flush.items()))
    if "tensorboard" in keys:
        from telemetrain.sinks import tensorboard as tb

        crc = "google-crc32c (C)" if getattr(tb, "_crc32c", None) is not None else "TensorBoard's pure-Python CRC"
        NOTES.append(f"TensorBoardSink frame checksum: {crc}.")
    NOTES.append(f"os.cpu_count()={os.cpu_count()}: in the burst the sinks' threads compete with the loop for the GIL"
                 " and the CPU; in the paced loop they deliver while it sleeps.")


def main(argv: list[str] | None = None) -> int:
    global ARGS
    ap = _method.parser(__doc__, "short smoke run (< 20 s)")
    ap.set_defaults(repeats=11)
    ap.add_argument("--steps", type=int, default=40, help="paced: steps per round")
    ap.add_argument("--calls", type=int, default=100, help="metric calls per step (per block)")
    ap.add_argument("--pause-ms", type=float, default=10.0, help="paced: time.sleep after each step's calls")
    ap.add_argument("--burst-blocks", type=int, default=300, help="burst: blocks of --calls calls per round")
    ap.add_argument("--burst-interval", type=float, default=0.005,
                    help="burst: the Telemetry's flush_interval (the sinks' threads wake during the burst)")
    ap.add_argument("--flush-timeout", type=float, default=120.0)
    ap.add_argument("--sinks", type=lambda s: s.split(","), help="comma-separated backends (default: all installed)")
    ap.add_argument("--only", help="comma-separated modes to run (paced, burst)")
    ARGS = _method.parse_args(ap, argv)
    ARGS.collect = not ARGS.quick
    if ARGS.quick:
        ARGS.repeats, ARGS.steps, ARGS.burst_blocks, ARGS.warmup_s = 2, 5, 20, 0.1
    if ARGS.burst_blocks * ARGS.calls >= 90_000:
        ap.error("--burst-blocks x --calls must stay below the queue capacity (100,000): nothing may be dropped")

    tmpdir = tempfile.mkdtemp(prefix="bench_sinks_")
    load_before = _method.loadavg()
    t_start = perf_counter_ns()
    variants = available_variants()
    _method.spin(ARGS.warmup_s)
    sections = [
        ("paced", lambda: section("paced", variants, tmpdir)),
        ("burst", lambda: section("burst", variants, tmpdir)),
    ]
    try:
        failed = _method.run_sections(sections, lambda name: True, ARGS.only)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    load_after = _method.loadavg()
    results_checks = checks(variants)
    _notes(variants)
    failed = failed or any(c["status"] == "FAIL" for c in results_checks if c["id"].startswith("1"))

    _method.print_header(DISTS, load_before, load_after)
    collect = "gc.collect() before each timed block" if ARGS.collect else "no gc.collect() (--quick)"
    print(f"method: {ARGS.repeats} rounds per mode, variants interleaved (rotating order), a fresh Telemetry per "
          f"variant and round; median and best of the rounds, ratios = median of per-round ratios; GC enabled, "
          f"{collect}; whole run {(perf_counter_ns() - t_start) / 1e9:.0f} s")
    _method.print_report(render_table(), results_checks, ARGS.json, DISTS, (load_before, load_after), ARGS, EXTRA)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    sys.exit(main())
