"""Readers on a run whose training process is still running (a subprocess that waits on its stdin), then once its
loop has ended or it was killed: ``compare`` says the loop is open and leaves goodput out (its work since its last
checkpoint would count as lost: 0%); the report calls it still running, not a crash -- and a crash once SIGKILLed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import telemetrain
from conftest import helper_env, train_empty_iterations
from telemetrain.analysis import compare_runs
from telemetrain.cli import main
from telemetrain.report import write_report
from telemetrain.training.goodput import goodput

# Trains 40 iterations, flushes, says "ready", waits for a line on stdin, then trains 10 more and ends its loop.
TRAIN = """
import sys
from telemetrain import Telemetry
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
t = Telemetry(store=sys.argv[1])
r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=32, log_every_n_train_iterations=5), telemetry=t)
r.on_app_start()
r.on_train_start(0)
def train(n):
    for _ in range(n):
        r.on_training_single_iteration_start()
        sum(range(20_000))
        r.on_training_single_iteration_end()
train(40)
assert t.flush()
print("ready", flush=True)
sys.stdin.readline()
train(10)
r.on_train_end()
r.on_app_end()
t.close()
"""
# The same, with a checkpoint of its first 30 iterations saved before it says "ready".
TRAIN_SAVED = TRAIN.replace("train(40)", "train(30)\nr.on_save_checkpoint_start(30)\n"
                            "r.on_save_checkpoint_success(30)\nr.on_save_checkpoint_end()\ntrain(10)")


def _start(store: Path, script: str = TRAIN, **rank: str) -> subprocess.Popen[str]:
    """The training process, once it has trained and flushed its first 40 iterations (``rank``: RANK, WORLD_SIZE)."""
    proc = subprocess.Popen([sys.executable, "-c", script, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=helper_env("live", "s", pythonpath=Path(__file__).parent.parent / "src",
                                                      **rank))
    assert proc.stdout is not None and proc.stdin is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        proc.wait()
        pytest.fail("the training process did not start")
    return proc


def _notes(comparison: telemetrain.analysis.Comparison) -> list[str]:
    return [n for c in comparison.candidates for n in c.notes]


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc`` (if still there) and close its pipes."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(20)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def _baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A finished run of 60 iterations to compare a live one with."""
    monkeypatch.setenv("TELEMETRAIN_RUN_ID", "base")
    with telemetrain.Telemetry(store=tmp_path / "base") as t:
        train_empty_iterations(t, 60, batch=32, log_every=5)
    return tmp_path / "base" / "base" / "base"


def test_compare_and_goodput_live_run_so_far_then_killed(tmp_path: Path, engine: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    baseline = _baseline(tmp_path, monkeypatch)
    live = tmp_path / "s" / "live"
    proc = _start(tmp_path)
    try:
        running = compare_runs(live, baseline, force=True)
        so_far = goodput(live.parent)
    finally:
        _kill(proc)
    assert any("has not ended (still running" in n for n in _notes(running)), _notes(running)
    rows = {m.metric: m for m in running.candidates[0].metrics}
    assert "samples_per_second" in rows and rows["goodput"].candidate_median > 0  # its 40 iterations so far
    assert [r.status for r in so_far.runs] == ["running"] and so_far.productive_iterations == 40
    assert so_far.goodput > 0 and so_far.badput.lost_progress == 0
    killed = compare_runs(live, baseline, force=True)
    assert any("has not ended (killed" in n for n in _notes(killed)), _notes(killed)
    assert "goodput" not in [m.metric for m in killed.candidates[0].metrics]
    after = goodput(live.parent)
    assert [r.status for r in after.runs] == ["killed"] and after.lost_iterations == 40 and after.goodput == 0


def test_compare_leaves_out_goodput_when_another_rank_was_killed(tmp_path: Path, engine: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 trains to its end; rank 1 of the same run is SIGKILLed mid-loop (its loop never ended): the run is not
    complete, so goodput is not compared, and the note names rank 1 (rank 0's own goodput was shown as complete)."""
    baseline = _baseline(tmp_path, monkeypatch)
    live = tmp_path / "s" / "live"
    killed = _start(tmp_path, RANK="1", LOCAL_RANK="1", WORLD_SIZE="2")
    ended = _start(tmp_path, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2")
    try:
        assert ended.stdin is not None
        ended.stdin.write("\n")
        ended.stdin.flush()
        assert ended.wait(60) == 0
        running = compare_runs(live, baseline, force=True)  # rank 1 still trains: the goodput so far, said so
    finally:
        _kill(ended)
        _kill(killed)
    assert any("rank 1" in n and "has not ended (still running" in n for n in _notes(running)), _notes(running)
    assert "goodput" in [m.metric for m in running.candidates[0].metrics]
    assert goodput(live.parent, rank=0).runs[0].open_loop is False  # rank 0's own view: complete
    for candidate, base in ((live, baseline), (baseline, live)):
        comparison = compare_runs(candidate, base, force=True)
        notes = _notes(comparison)
        assert "goodput" not in [m.metric for m in comparison.candidates[0].metrics], notes
        assert any("rank 1" in n and "has not ended (killed" in n for n in notes), notes
        assert any("goodput not compared" in n for n in notes), notes


def test_compare_keeps_goodput_of_a_run_a_sigterm_ended(tmp_path: Path, engine: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM (a preemption, an elastic agent's closing signal on a restart) ends the loop at close: goodput calls
    the run killed, its figures exact, and compare shows its goodput (the loop ended; only a SIGKILLed one is open)."""
    baseline = _baseline(tmp_path, monkeypatch)
    live = tmp_path / "s" / "live"
    proc = _start(tmp_path, TRAIN_SAVED)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == -signal.SIGTERM
    finally:
        _kill(proc)
    after = goodput(live.parent)
    [run] = after.runs
    assert (run.status, run.open_loop, run.productive_iterations, run.lost_iterations) == ("killed", False, 30, 10)
    for candidate, base in ((live, baseline), (baseline, live)):
        comparison = compare_runs(candidate, base, force=True)
        assert not any("has not ended" in n or "goodput not compared" in n for n in _notes(comparison)), \
            _notes(comparison)
        rows = {m.metric: m for m in comparison.candidates[0].metrics}
        assert rows["goodput"].verdict == "not tested"
        assert (rows["goodput"].candidate_median if candidate == live else rows["goodput"].baseline_median) > 0


def test_report_live_run_is_still_running_not_a_crash_until_killed(tmp_path: Path, engine: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    proc = _start(tmp_path)
    try:
        live = write_report(tmp_path / "s" / "live", tmp_path / "live.html").read_text()
    finally:
        _kill(proc)
    assert "<b>still running</b>" in live
    assert "crash:" not in live
    killed = write_report(tmp_path / "s" / "live", tmp_path / "killed.html").read_text()
    assert "<b>still running</b>" not in killed
    assert "crash: training_loop and application were killed" in killed


def _show(run: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert main(["show", *flags, str(run)]) == 0
    return capsys.readouterr().out


def test_show_live_run_is_still_running_not_a_crash_until_killed(tmp_path: Path, engine: str,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "s" / "live"
    proc = _start(tmp_path)
    try:
        live = _show(run, capsys)
        live_json = json.loads(_show(run, capsys, "--json"))
    finally:
        _kill(proc)
    assert "still running" in live and "crash" not in live, live
    assert live_json["running"] is True and not [f for f in live_json["findings"] if f["kind"] == "crash"]
    killed = _show(run, capsys)
    assert "crash: training_loop and application were killed" in killed and "still running (" not in killed, killed
