"""Smoke tests of bench/bench_core.py, bench/bench_stats.py and bench/bench_training.py: the quick runs work and print
their tables and checks (bench_core.py: all five ratio checks).

Timing is noisy (shared machines, CI), so PASS is not asserted: only that every check is computed from finite
numbers.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_core.py"
BENCH_STATS = BENCH.with_name("bench_stats.py")


def _quick_run(
    script: Path, tmp_path: Path, header: str, rows: Sequence[str], may_skip: tuple[str, ...]
) -> tuple[str, dict[str, Any]]:
    """Run ``script --quick --quiet --json`` from ``tmp_path`` (not from the checkout, so the script's sibling import
    must work from anywhere); check that it succeeds, prints the table ``header`` and every one of ``rows``, skips only
    the sections named in ``may_skip`` and writes finite medians. Returns stdout and the JSON results."""
    out_json = tmp_path / f"{script.stem}.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--quiet", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,  # nothing may be written to the checkout (the run store goes to a temp dir)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout

    assert header in out
    for row in rows:
        assert row in out, f"missing row {row!r}"
    skipped = [line for line in out.splitlines() if line.startswith("- SKIPPED")]
    assert all(line.startswith(tuple(f"- SKIPPED {name}" for name in may_skip)) for line in skipped), skipped

    data = json.loads(out_json.read_text())
    for r in data["results"]:
        assert math.isfinite(r["median_ns"]) and math.isfinite(r["best_ns"]), r
    return out, data


def test_bench_core_quick(tmp_path: Path) -> None:
    for peer in ("torch", "prometheus_client", "opentelemetry.sdk", "psutil"):
        pytest.importorskip(peer)
    rows = (
        "empty function call",
        'torchelastic | metrics.put_metric("m", 1, "grp")',
        "prometheus_client | Counter.inc()",
        "opentelemetry-sdk | counter.add(1)",
        '(a) metrics.put_metric("m", 1, "quiet")',
        "(b) metrics.put_metric",
        "(c) @metrics.prof overhead",
        "(d) events.record",
        "(e) t.metric",
        "throughput run 1",
        "put_metric as fast as possible",
    )
    # only the "pieces" section (which reads telemetrain internals) may be skipped
    out, data = _quick_run(BENCH, tmp_path, "| library | operation | median ns/op | best ns/op |", rows, ("pieces",))

    checks = re.findall(r"^check (\d): (PASS|GAP|SKIP): (.*)$", out, flags=re.MULTILINE)
    assert [int(c[0]) for c in checks] == [1, 2, 3, 4, 5], out
    assert all(status in ("PASS", "GAP") for _, status, _ in checks), checks

    assert [c["num"] for c in data["checks"]] == [1, 2, 3, 4, 5]
    for c in data["checks"][:4]:
        for key in ("ours_ns", "peer_ns", "ratio"):
            assert math.isfinite(c[key]) and c[key] > 0, c
    c5 = data["checks"][4]
    assert math.isfinite(c5["records_per_s"]) and c5["records_per_s"] > 0, c5
    assert math.isfinite(c5["rss_growth_mb"]), c5
    assert c5["dropped"] > 0, c5  # the flood offers more than the 10,000-record queue takes
    assert data["writer"]["throughput"]["all_written"], data["writer"]["throughput"]
    assert data["writer"]["caller_side"]["dropped"] == 0, data["writer"]["caller_side"]


def test_bench_stats_quick(tmp_path: Path) -> None:
    """bench/bench_stats.py --quick runs, prints its rows, memory table and checks, and writes its JSON. Timing and
    the PASS/FAIL verdicts are not asserted: only that each check is computed."""
    pytest.importorskip("torch")
    rows = (
        "baseline | empty function call",
        "torch.monitor | Stat([MEAN,COUNT], 600s).add(1.0), no handler",
        "torch.monitor | Stat([MEAN,COUNT], 600s).add(nx()), no handler",
        "torch.monitor | Stat([MEAN,COUNT], 600s).add(1.0), no-op handler registered",
        "telemetrain.monitor | Stat([MEAN,COUNT], 600s).add(1.0)",
        "telemetrain.monitor | Stat([MEAN,COUNT], 600s).add(nx())",
        'telemetrain.stats | Stat(["mean","count"], window=600).add(1.0)',
        'telemetrain.stats | Stat(["mean","count"], window=600).add(nx())',
        'paired | telemetrain.stats Stat(["mean","count"]).add(1.0), interleaved with torch',
        "telemetrain.stats | Stat([count,mean,p50,p90,p99], samples=100).add(nx())",
        "telemetrain.stats | Stat([count,mean,p50,p90,p99], window=600).add(nx())",
        "2 threads x Stat([MEAN,COUNT], 600s).add(1.0), one Stat: per thread",
        '2 threads x Stat(["mean","count"], window=600).add(1.0), one Stat: aggregate',
        "baseline | `with contextlib.nullcontext(): pass`",
        "`with s.time(): pass`",
        "@s.time overhead",
        "close one window: 2048 lognormal samples, [count,mean,p50,p90,p99,histogram]",
        "pieces | method call + type check",
    )
    # only the "pieces" section (which reads telemetrain internals) and torch's private _WaitCounter may be skipped
    out, data = _quick_run(
        BENCH_STATS,
        tmp_path,
        "| library | operation | median ns/op | best ns/op | ratio to peer | peer | n |",
        rows,
        ("pieces", "torch.monitor._WaitCounter"),
    )
    assert "| memory scenario | samples | pending |" in out

    checks = re.findall(r"^check (\w+): (PASS|FAIL|INFO|SKIP): (.*)$", out, flags=re.MULTILINE)
    ids = [c[0] for c in checks]
    expected = ["1a", "1b", "1c", "1d", "2a", "2b", "3a", "3b", "3c", "3d", "4a", "4b"]
    expected += [f"5{x}" for x in "abcdefghi"] + [f"6{x}" for x in "abcde"] + ["7"]
    assert ids == expected, ids
    assert all(status != "SKIP" for _, status, _ in checks), checks
    targets = re.findall(r"^target (\d): (PASS|FAIL|SKIP): ", out, flags=re.MULTILINE)
    assert [t[0] for t in targets] == ["1", "3", "4", "5", "7"], targets
    assert all(status in ("PASS", "FAIL") for _, status in targets), targets

    for key in ("versions", "args", "results", "threads", "memory", "window_close", "store", "checks", "notes"):
        assert key in data, key
    assert [c["id"] for c in data["checks"]] == expected
    for c in data["checks"]:
        for key in ("ours_ns", "peer_ns", "ratio", "held_bytes", "bound_bytes", "median_us"):
            if key in c and c[key] is not None:
                assert math.isfinite(c[key]) and c[key] > 0, c
    for r in data["results"]:
        assert r["ratio"] is None or math.isfinite(r["ratio"]), r
    assert len(data["threads"]) == 4
    for th in data["threads"]:
        assert isinstance(th["exact"], bool) and th["repeats"], th
    assert len(data["memory"]) == 9
    for m in data["memory"]:
        for key in ("held_bytes", "samples_and_buckets_bytes", "peak_bytes", "bound_bytes"):
            assert isinstance(m[key], int) and m[key] > 0, m
    assert len(data["window_close"]) == 5
    for key in ("stat_records_in_store", "reported_windows", "dropped", "ok"):
        assert key in data["store"], data["store"]
    assert data["store"]["stat_records_in_store"] > 0


BENCH_TRAINING = BENCH.with_name("bench_training.py")


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def test_bench_training_quick(tmp_path: Path) -> None:
    """bench/bench_training.py --quick runs, prints its rows and checks, and writes its JSON. Timing and the PASS/FAIL
    verdicts are not asserted: only that each check is computed. A peer that is not installed (nv-one-logger,
    OpenTelemetry SDK, torch) has its section skipped with a note, and its rows are not expected."""
    has_one_logger = _importable("yaml") and _importable(
        "nv_one_logger.training_telemetry.api.training_telemetry_provider"
    )
    has_otel = _importable("opentelemetry.sdk.trace")
    has_torch = _importable("torch")
    rows = [
        "baseline | empty function call `f()`",
        "telemetrain | 1 train iteration: TrainingRecorder.on_training_single_iteration_start(); _end(), iterations",
        "telemetrain | same, iterations 1k-3k of the same loop",
        "telemetrain | same, iterations 20k-22k of the same loop",
        "telemetrain | reference: a fresh loop's iterations 1k-2k",
        "telemetrain | same, mean over the whole loop",
        "telemetrain | 1 train iteration: training.callbacks.on_training_single_iteration_start(); _end()",
        'telemetrain | `with span("it"): pass`, root span -> async JSONL (caller side)',
        'telemetrain | `with span("it"): pass` inside an open `span("parent")`, child span',
        'telemetrain | `with span("it"): pass`, root span -> async JSONL, writer awake',
        "pieces | recorder iteration, log_every_n_train_iterations=10**9 (no metrics report), training thread CPU",
        "pieces | report capture amortised per iteration",
        "pieces | one metrics report computed and emitted",
        '`tr.span("it")` (builds the Span, not entered)',
    ]
    may_skip = ["pieces"]
    if has_one_logger:
        rows += [
            "nv-one-logger | 1 train iteration: on_training_single_iteration_start(); _end(), iterations 0-1k",
            "nv-one-logger | same, iterations 10k-11k of the same loop",
        ]
    else:
        may_skip.append("one-logger")
    if has_otel:
        rows += [
            'opentelemetry-sdk | `with tracer.start_as_current_span("it"): pass`, root, BatchSpanProcessor',
            'paired | telemetrain `with span("it"): pass` root, interleaved with OTel',
            'paired | telemetrain `with span("it"): pass` child, interleaved with OTel',
        ]
    else:
        may_skip.append("otel-spans")
    if has_torch:
        rows += [
            "training run | MLP 768-768-768-10, batch 64, 30 steps",
            "full lifecycle telemetry, ns per step",
            "training run | telemetry overhead per step",
            "training run | control: no telemetry vs no telemetry",
            "training run | the same telemetry calls around empty bodies",
        ]
    else:
        may_skip.append("training")
    out, data = _quick_run(
        BENCH_TRAINING,
        tmp_path,
        "| library | operation | median ns/op | best ns/op | ratio to peer | peer | n |",
        rows,
        tuple(may_skip),
    )

    checks = re.findall(r"^check (\w+): (PASS|FAIL|INFO|SKIP): (.*)$", out, flags=re.MULTILINE)
    ids = [c[0] for c in checks]
    expected = ["1a", *(["1c"] if has_one_logger else []), "1b", "1d", "2a", "2b", "3", "4"]
    assert ids == expected, ids
    status = dict((c[0], c[1]) for c in checks)
    assert status["1b"] in ("PASS", "FAIL") and status["4"] in ("PASS", "FAIL"), checks
    for cid, present in (("1a", has_one_logger), ("2a", has_otel), ("2b", has_otel), ("3", has_torch)):
        assert (status[cid] in ("PASS", "FAIL")) if present else status[cid] == "SKIP", (cid, checks)
    targets = re.findall(r"^target (\w+): (PASS|FAIL|SKIP): ", out, flags=re.MULTILINE)
    assert [t[0] for t in targets] == ["1a", "1b", "2", "3", "4"], targets

    for key in ("versions", "args", "results", "ours", "ours_callbacks", "ours_store", "checks", "notes"):
        assert key in data, key
    assert [c["id"] for c in data["checks"]] == expected
    for c in data["checks"]:
        for key in ("ours_ns", "peer_ns", "ratio", "cpu_ratio"):
            if key in c and c[key] is not None:
                assert math.isfinite(c[key]) and c[key] > 0, c
    for r in data["results"]:
        assert r["ratio"] is None or math.isfinite(r["ratio"]), r
    # every iteration child wrote its run store completely (a correctness check, not a timing)
    assert data["ours_store"] and all(v["ok"] for v in data["ours_store"]), data["ours_store"]
    assert data["span_store"]["caller side"]["ok"], data["span_store"]


BENCH_SYSTEM = BENCH.with_name("bench_system.py")


def test_bench_system_quick(tmp_path: Path) -> None:
    """bench/bench_system.py --quick runs, prints its rows and checks, and writes its JSON. Timing and the PASS/FAIL
    verdicts are not asserted: only that each check is computed from finite numbers."""
    pytest.importorskip("psutil")
    has_torch = _importable("torch")
    rows = [
        "telemetrain.system | one cycle: host + process tree + disk + net, thread CPU",
        "telemetrain.system | same, all-in process CPU (the store's writer included)",
        "telemetrain.system | one cycle: the default sampler",
        "pieces | source process alone",
        "pieces | source host alone",
        "telemetrain.system | live sampler thread every 0.05 s",
    ]
    if has_torch:
        rows += [
            "training run | MLP 512-512-512-10, batch 64, 30 steps: sampler off",
            "sampler on at 1 s, ns per step",
            "training run | control: sampler off vs off",
        ]
    out, data = _quick_run(
        BENCH_SYSTEM,
        tmp_path,
        "| library | operation | median ns/op | best ns/op | ratio to peer | peer | n |",
        rows,
        () if has_torch else ("training",),
    )
    checks = re.findall(r"^check (\w+): (PASS|FAIL|SKIP): (.*)$", out, flags=re.MULTILINE)
    assert [c[0] for c in checks] == ["1a", "1b", "2"], checks
    status = dict((c[0], c[1]) for c in checks)
    assert status["1a"] in ("PASS", "FAIL") and status["1b"] in ("PASS", "FAIL"), checks
    assert status["2"] in (("PASS", "FAIL") if has_torch else ("SKIP",)), checks
    for key in ("versions", "args", "results", "thread", "records_per_cycle", "checks", "notes"):
        assert key in data, key
    assert data["thread"]["samples"] >= 2 and data["thread"]["errors"] == 0
    for c in data["checks"]:
        for key in ("cycle_ns", "share", "ratio", "control", "cpu_ratio"):
            if key in c:
                assert math.isfinite(c[key]) and c[key] > 0, c


BENCH_SINKS = BENCH.with_name("bench_sinks.py")


def test_bench_sinks_quick(tmp_path: Path) -> None:
    """bench/bench_sinks.py --quick runs, prints its rows and checks, and writes its JSON. Timing and the PASS/FAIL
    verdicts of check 2 are not asserted; the delivery checks (every record delivered to every sink, nothing dropped or
    failed) are. A backend whose package is not installed has its rows and checks skipped with a note."""
    backends = {
        "prometheus": ("c", "run store + PrometheusSink(port=0)", ("prometheus_client",)),
        "otel": ("d", "run store + OTelSink(SDK TracerProvider, MeterProvider + InMemoryMetricReader)",
                 ("opentelemetry.sdk.metrics",)),
        "tensorboard": ("e", "run store + TensorBoardSink(tmpdir)", ("tensorboard",)),
        "mlflow": ("f", "run store + MLflowSink(file store)", ("mlflow",)),
    }
    present = {key: all(_importable(m) for m in modules) for key, (_, _, modules) in backends.items()}
    variants = [
        "baseline: a no-op function with metric's signature (loop and call floor)",
        "run store alone",
        "run store + do-nothing background sink (control)",
    ] + [label for key, (_, label, _) in backends.items() if present[key]]
    measures = [
        "paced: training-thread CPU",
        "paced: wall",
        "burst: training-thread CPU",
        "burst: wall",
        "paced: other threads' CPU per record",
        "burst: other threads' CPU per record",
    ]
    rows = [f"| {m} | {v} |" for m in measures for v in variants if not ("other" in m and v.startswith("baseline"))]
    out, data = _quick_run(
        BENCH_SINKS,
        tmp_path,
        "| library | operation | median ns/op | best ns/op | ratio to do-nothing sink | ratio to store alone | n |",
        rows,
        tuple(key for key, ok in present.items() if not ok),
    )

    checks = re.findall(r"^check (\w+): (PASS|FAIL|INFO|SKIP): (.*)$", out, flags=re.MULTILINE)
    assert [c[0] for c in checks] == ["1a", "1b", "1c", "1d", "1e", "1f", "2b", "2c", "2d", "2e", "2f"], checks
    status = dict((c[0], c[1]) for c in checks)
    assert status["1a"] == status["1b"] == "PASS" and status["2b"] == "INFO", checks
    for key, (letter, _, _) in backends.items():
        assert status["1" + letter] == ("PASS" if present[key] else "SKIP"), (key, checks)
        assert status["2" + letter] in (("PASS", "FAIL") if present[key] else ("SKIP",)), (key, checks)

    for key in ("versions", "args", "results", "rounds", "checks", "notes"):
        assert key in data, key
    assert len(data["results"]) == len(rows)
    for r in data["results"]:
        assert math.isfinite(r["median_ns"]) and r["median_ns"] > 0, r
        for col in ("ratio_control", "ratio_store"):
            assert r[col] is None or (math.isfinite(r[col]) and r[col] > 0), r
    for mode in ("paced", "burst"):
        for key, runs in data["rounds"][mode].items():
            assert len(runs) == 2, (mode, key)  # --quick: 2 rounds
            for run in runs:
                if key != "no-op call":
                    assert run["ok"] and run["health"]["dropped"] == 0 and run["health"]["failed"] == 0, run


BENCH_CROSS_RANK = BENCH.with_name("bench_cross_rank.py")


def test_bench_cross_rank_quick(tmp_path: Path) -> None:
    """bench/bench_cross_rank.py --quick launches one round of each mode (2 gloo ranks each) and computes its check
    from the aggregator's own exchange count and CPU time."""
    pytest.importorskip("torch")
    out_json = tmp_path / "cross_rank.json"
    proc = subprocess.run([sys.executable, str(BENCH_CROSS_RANK), "--quick", "--quiet", "--json", str(out_json)],
                          capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for mode in ("| off |", "| ours |", "| inline |"):
        assert mode in proc.stdout
    data = json.loads(out_json.read_text())
    ours = next(r for r in data["rows"] if r["mode"] == "ours")
    assert ours["exchanges"] == 6  # 300 steps, one exchange every 50 (the final report is not exchanged)
    assert math.isfinite(ours["direct_share"]) and ours["exchange_cpu_ms"] > 0
    assert data["checks"][0]["status"] in ("PASS", "FAIL")


BENCH_REPORT = BENCH.with_name("bench_report.py")


def test_bench_report_quick(tmp_path: Path) -> None:
    """bench/bench_report.py --quick runs, prints its rows and check, and writes its JSON. Timing and the PASS/FAIL
    verdict are not asserted: only that the check is computed from finite numbers."""
    out, data = _quick_run(
        BENCH_REPORT, tmp_path,
        "| library | operation | CPU median s | CPU best s | wall median s | wall best s | CPU ratio to read | n |",
        ("read: store.open_run", "load: report.load.load_run", "analyse: report.model.build_model",
         "render: report.html.render", "report, total: write_report"), ())
    checks = re.findall(r"^check (\w+): (PASS|FAIL|SKIP): (.*)$", out, flags=re.MULTILINE)
    assert [(c[0], c[1] in ("PASS", "FAIL")) for c in checks] == [("1", True)], checks
    for r in data["results"]:
        assert math.isfinite(r["cpu_median_ns"]) and r["cpu_median_ns"] > 0, r
    assert math.isfinite(data["checks"][0]["seconds"]) and data["run"]["records"] > 0


BENCH_HF = BENCH.with_name("bench_hf.py")


def test_bench_hf_quick(tmp_path: Path) -> None:
    """bench/bench_hf.py --quick runs, prints its rows and its three checks, and writes its JSON. Timing and the
    PASS/FAIL verdicts of checks 1 and 2 are not asserted; check 3 (every telemetry run wrote its lifecycle) is."""
    pytest.importorskip("transformers")
    rows = (
        "baseline | empty function call `f()`",
        "plain loop | 1 step: recorder.on_training_single_iteration_start(); _end() (the plain-loop case)",
        "hf callback | 1 step (accumulation 2): the callback's 5 hooks called directly",
        "hf dispatch | 1 step's 5 events through CallbackHandler, default callbacks only",
        "hf dispatch | adding the callback to a Trainer: marginal cost per step (difference)",
        "Trainer + TelemetrainHFCallback, ns per optimizer step",
        "Trainer + TelemetrainHFCallback, process CPU ns per optimizer step",
    )
    header = "| library | operation | median ns/op | best ns/op | ratio to peer | peer | n |"
    out, data = _quick_run(BENCH_HF, tmp_path, header, rows, ())
    checks = re.findall(r"^check (\d): (PASS|FAIL|SKIP): (.*)$", out, flags=re.MULTILINE)
    assert [c[0] for c in checks] == ["1", "2", "3"] and checks[2][1] == "PASS", checks
    assert data["training"]["stores"] and all(s["ok"] for s in data["training"]["stores"])


BENCH_BRIDGE = BENCH.with_name("bench_torchelastic_bridge.py")


def test_bench_torchelastic_bridge_quick(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    rows = ('torchelastic | metrics.put_metric("m", 1, "grp"), null handler',
            'bridge | torch metrics.put_metric("m", 1, "grp") -> run store (caller side)',
            "bridge | torch events.record(prebuilt Event) -> run store (caller side)",
            'telemetrain | metrics.put_metric("m", 1, "grp") -> run store (the drop-in)')
    _, data = _quick_run(BENCH_BRIDGE, tmp_path, "| library | operation | median ns/op | best ns/op | ratio to peer |",
                         rows, ())
    assert all(r["ratio"] > 0 for r in data["results"] if r["ratio"] is not None)


def test_bench_lightning_quick(tmp_path: Path) -> None:
    """bench/bench_lightning.py --quick runs, prints its rows and checks, writes its JSON (timing not asserted)."""
    pytest.importorskip("lightning")
    rows = ("| lightning callback | 1 step (accumulation 2): on_train_batch_start/_end x2, called directly |",
            "+ TelemetrainCallback, process CPU ns per optimizer step",
            "in training.training_iteration(), process CPU ns per optimizer step")
    out, _ = _quick_run(BENCH.with_name("bench_lightning.py"), tmp_path,
                        "| library | operation | median ns/op | best ns/op |", rows, ())
    checks = re.findall(r"^check (\d): (PASS|GAP|FAIL|SKIP): (.*)$", out, flags=re.MULTILINE)
    assert [c[0] for c in checks] == ["1", "2", "3", "4"] and checks[3][1] == "PASS", checks


def test_bench_attributes_smoke(tmp_path: Path) -> None:
    """bench_attributes.py (no baseline tree here): every row is measured and every record shape sized."""
    script = BENCH.with_name("bench_attributes.py")
    out_json = tmp_path / "attributes.json"
    proc = subprocess.run([sys.executable, str(script), "--rounds", "1", "--n", "2000", "--repeats", "1",
                           "--json", str(out_json)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out_json.read_text())
    assert {r["op"] for r in data["rows"]} >= {"t.metric(name, value, group)", "t.metric(..., attributes=1 label)"}
    assert all(math.isfinite(r["ours_ns"]) and r["baseline_ns"] is None for r in data["rows"])
    sizes = dict(data["sizes"])
    assert sizes["metric + 1 attribute (system.disk.io)"] > sizes["metric, no unit/step/attributes"] > 0


def test_bench_scale_quick(tmp_path: Path) -> None:
    """bench_scale.py --quick: writes a small run through the real writer (cached), times the four readers by both
    paths and ``query`` by DuckDB, and reports every number the issue asks for (the bounds are for the big sizes)."""
    pytest.importorskip("duckdb")
    script = BENCH.with_name("bench_scale.py")
    out_json = tmp_path / "scale.json"
    argv = [sys.executable, str(script), "--quick", "--repeats", "1", "--cache", str(tmp_path / "cache"),
            "--commands", "report,compare,goodput,show,query", "--json", str(out_json)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out_json.read_text())
    [size] = data["sizes"]
    for engine in ("duckdb", "python"):
        for command in ("report", "compare", "goodput", "show"):
            r = size[engine][command]
            assert r["ok"] and r["wall_s"] > 0 and r["peak_rss"] > 10 << 20, (engine, command, r)
    # the user's SQL: DuckDB only (query has no pure-Python path), and it answered
    assert size["duckdb"]["query"]["ok"] and "query" not in size["python"]
    assert any("query on 2 x 5,000" in line for line in data["checks"])
    assert size["compaction"]["records_per_s"] > 0 and 0 < size["disk"]["parquet_share"] < 1
    assert data["extrapolation_1024x1M"]["jsonl_bytes"] > data["extrapolation_1024x1M"]["parquet_bytes"] > 0
    rerun = subprocess.run([*argv[:-2], "--write-only"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert rerun.returncode == 0 and "writing" not in rerun.stderr  # cached: nothing written again


def test_bench_restarts_small(tmp_path: Path) -> None:
    """bench_restarts.py on small sessions: it writes 1 and 2 attempts through the real writer, the second session's
    goodput sees the killed attempt, and both readers are timed."""
    pytest.importorskip("duckdb")
    script = BENCH.with_name("bench_restarts.py")
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, str(script), "--attempts", "1,2", "--ranks", "2", "--iterations", "10000",
                           "--repeats", "1", "--cache", str(cache)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    assert [r["attempts"] for r in rows] == [1, 2]
    for row in rows:
        for command in ("report", "goodput"):
            assert row[command]["cpu_s"] > 0 and row[command]["peak_rss"] > 10 << 20, (row, command)
    from telemetrain.training.goodput import goodput

    g = goodput(cache / "store" / "restarts-2x2x10000")
    assert [r.status for r in g.runs] == ["killed", "finished"]
    # the killed attempt: 15,000 iterations, 5,000 past its checkpoint at 10,000 (lost); the restart redoes none
    assert g.runs[0].lost_iterations == 5000 and g.productive_iterations == 20000


def test_bench_comm_quick(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    rows = ("CommMonitor.begin + end, a new_group", "tdist.all_reduce(x) (default group)",
            "iteration, a program's handler chained behind ours", "signal.signal(SIGTERM, h) once ours are installed")
    _, data = _quick_run(BENCH.with_name("bench_comm.py"), tmp_path, "| library | operation | median ns/op |", rows, ())
    chained = [r for r in data["results"] if r["operation"].startswith("iteration, a program's handler")]
    assert len(chained) == 1 and math.isfinite(chained[0]["ratio"]) and chained[0]["ratio"] > 0
