"""Smoke test of bench/bench_dispatch.py: the quick run works, prints its tables and keeps its accounting exact.

Timing is noisy (shared machines, CI): drops at the offered rate are not asserted here, only that the numbers are
there and that the many-producers scenario counted every record.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_dispatch.py"


def test_bench_dispatch_quick(tmp_path: Path) -> None:
    out_json = tmp_path / "dispatch.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out_json)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| offered (default store) |" in proc.stdout and "| producers into a 50 ms/batch sink |" in proc.stdout
    assert "idle Telemetry (store on):" in proc.stdout
    data = json.loads(out_json.read_text())
    [offered] = data["offered"]
    assert offered["written"] + offered["dropped"] == offered["offered"]
    [producers] = data["producers"]
    assert producers["exact"] and producers["dropped"] > 0
    assert list(tmp_path.iterdir()) == [out_json]  # nothing left behind: the run stores went to temp dirs
