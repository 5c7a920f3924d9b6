"""The clock-offset round trips between two real gloo ranks: on a busy host (long round trips) a rank goes on past
its minimum until a short round trip bounds the error, and rank 0 follows however many it makes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("_clock_worker.py")
SKEW_NS = 2_500_000_000


def run_pair(tmp_path: Path, slow: int, rounds: int, max_rounds: int) -> list[dict[str, Any]]:
    init = tmp_path / "init"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(rank), str(init), str(tmp_path / f"{rank}.json"),
                               str(slow), str(rounds), str(max_rounds)], env=env, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]


def test_long_round_trips_make_a_rank_go_on_until_a_short_one(tmp_path: Path) -> None:
    zero, one = run_pair(tmp_path, slow=5, rounds=4, max_rounds=16)
    assert zero["found"] == [0, 0, 0] and zero["again"] == [0, 0, 0]
    offset, error, rtt = one["found"]
    # the first 5 round trips each took >= 3 ms: the minimum of 4 was not enough, and it stopped at the first short one
    assert 6 <= one["round_trips"] <= 16
    assert rtt < 3_000_000 and error == (rtt + 1) // 2
    assert abs(offset - SKEW_NS) <= error + 100_000  # the stated error holds (clock reading jitter)
    assert one["again"] is not None and zero["gathered"] == one["gathered"] == [[0.0], [1.0]]


def test_max_rounds_caps_the_round_trips(tmp_path: Path) -> None:
    zero, one = run_pair(tmp_path, slow=100, rounds=3, max_rounds=3)
    assert one["round_trips"] == 3 and one["found"][2] >= 3_000_000  # every one was long: the estimate says so
    offset, error, _ = one["found"]
    assert abs(offset - SKEW_NS) <= error + 100_000
    assert zero["again"] == [0, 0, 0] and zero["gathered"] == one["gathered"]


def test_bad_rounds_are_refused_by_name_on_every_rank(tmp_path: Path) -> None:
    for result in run_pair(tmp_path, slow=0, rounds=2, max_rounds=8):
        assert result["errors"] == ["rounds must be at least 1, got 0", "max_rounds (2) must be at least rounds (4)"]
