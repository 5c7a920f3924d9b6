"""Smoke test of bench/bench_core.py: the quick run works and prints its table and all five ratio checks.

Timing is noisy (shared machines, CI), so PASS is not asserted: only that every check is computed from finite
numbers.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_core.py"


def test_bench_core_quick(tmp_path: Path) -> None:
    for peer in ("torch", "prometheus_client", "opentelemetry.sdk", "psutil"):
        pytest.importorskip(peer)
    out_json = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--quiet", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,  # nothing may be written to the checkout (the run store goes to a temp dir)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout

    assert "| library | operation | median ns/op | best ns/op |" in out
    for row in (
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
    ):
        assert row in out, f"missing row {row!r}"
    skipped = [line for line in out.splitlines() if line.startswith("- SKIPPED")]
    # only the "pieces" section (which reads telemetrain internals) may be skipped
    assert all(line.startswith("- SKIPPED pieces") for line in skipped), skipped

    checks = re.findall(r"^check (\d): (PASS|GAP|SKIP): (.*)$", out, flags=re.MULTILINE)
    assert [int(c[0]) for c in checks] == [1, 2, 3, 4, 5], out
    assert all(status in ("PASS", "GAP") for _, status, _ in checks), checks

    data = json.loads(out_json.read_text())
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
    for r in data["results"]:
        assert math.isfinite(r["median_ns"]) and math.isfinite(r["best_ns"]), r
