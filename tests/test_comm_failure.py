"""A collective that fails -- a dead peer's all-reduce, a comm hook's future failing, a hook raising at launch -- or
one still in flight when the user's own exception ends the process leaves exactly one ``stall_evidence`` record
naming it, written before the process exits, whichever thread sees the failure first, and the training's exception
reaches the user unchanged (issue 19). Real gloo process groups and DDP in subprocesses
(``tests/_comm_failure_worker.py``); the watchdog there never looks on its own (poll 60 s)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from telemetrain.store.reader import find_runs, open_run

WORKER = str(Path(__file__).with_name("_comm_failure_worker.py"))
TIMEOUT_S = 180


def run_worker(tmp_path: Path, scenario: str, world: int) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_", "TORCH_FR"))}
    env.update({"OMP_NUM_THREADS": "1", "WORLD_SIZE": str(world)})
    init, store = str(tmp_path / "pg-init"), str(tmp_path / "runs")
    peers = [subprocess.Popen([sys.executable, WORKER, scenario, str(r), str(world), init, store],
                              env={**env, "RANK": str(r)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for r in range(1, world)]
    try:
        result = subprocess.run([sys.executable, WORKER, scenario, "0", str(world), init, store],
                                env={**env, "RANK": "0"}, capture_output=True, text=True, timeout=TIMEOUT_S,
                                check=False)
    finally:
        for p in peers:
            p.kill()
            p.wait()
    (path,) = find_runs(tmp_path / "runs")
    evidence = [r for r in open_run(path).records("event") if r.group == "watchdog" and r.name == "stall_evidence"]
    return result, evidence


def test_a_dead_peers_failed_all_reduce_leaves_one_record_naming_it(tmp_path: Path) -> None:
    result, evidence = run_worker(tmp_path, "dead_peer", 2)
    assert result.returncode == 1 and "gloo" in result.stderr, result.stderr[-3000:]
    (e,) = evidence
    a = e.attributes
    assert (a["reason"], a["collective"], a["collective_state"], a["collective_phase"]) == \
        ("collective_failed", "all_reduce", "failed", "backward")
    # the first all-reduce to fail is named; the step's other buckets failed with it, in the same record
    assert a["step"] == 1 and a["last_completed_seq"] < a["collective_seq"] <= a["collectives_total"]
    assert "gloo" in a["collective_error"] and e.severity == "error"
    # (the rank's own phase: backward when the watchdog's thread wrote it, outside when the close did, after the
    # exception had left backward; the collective's phase is where it was launched)
    assert a["phase"] in ("backward", "outside")
    assert any(s.startswith("training_loop (training) open for") for s in a["open_spans"])


@pytest.mark.parametrize(("scenario", "message"), [
    ("future_fails", "RuntimeError: the all-reduce failed in flight"),
    ("hook_raises", "RuntimeError: the hook could not launch its all-reduce"),
])
def test_a_comm_hooks_failure_leaves_one_record_and_its_error_reaches_the_user(tmp_path: Path, scenario: str,
                                                                             message: str) -> None:
    result, evidence = run_worker(tmp_path, scenario, 1)
    assert result.returncode == 1 and message in result.stderr, result.stderr[-3000:]
    assert "telemetrain" not in result.stderr.split("Traceback")[0]  # nothing of ours before the user's traceback
    (e,) = evidence
    a = e.attributes
    assert (a["reason"], a["collective"], a["collective_state"], a["collective_phase"], a["step"]) == \
        ("collective_failed", "all_reduce", "failed", "backward", 1)
    assert a["phase"] in ("backward", "outside")  # (see the dead peer's test)
    assert message.split(": ", 1)[1] in a["collective_error"]


def test_a_collective_in_flight_when_the_users_error_ends_the_process_is_named(tmp_path: Path) -> None:
    result, evidence = run_worker(tmp_path, "user_error_in_flight", 1)
    assert result.returncode == 1 and result.stderr.rstrip().endswith("ValueError: the user's own error"), \
        result.stderr[-3000:]
    (e,) = evidence
    a = e.attributes
    assert (a["reason"], a["collective"], a["collective_state"], a["collective_phase"], a["step"]) == \
        ("exit", "all_to_all", "waiting", "other", 1)
    assert e.severity == "warning" and a["collective_for_s"] >= 0
    assert a["phase"] == "outside" and any(s.startswith("training_loop (training) open for") for s in a["open_spans"])
