"""Smoke tests of bench/bench_core.py and bench/bench_stats.py: the quick runs work and print their tables and
checks (bench_core.py: all five ratio checks).

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

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_core.py"
BENCH_STATS = BENCH.with_name("bench_stats.py")


def _quick_run(
    script: Path, tmp_path: Path, header: str, rows: Sequence[str], may_skip: tuple[str, ...]
) -> tuple[str, dict]:
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
