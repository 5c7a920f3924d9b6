"""Rollbacks beyond the report's curves: the findings' spikes of a run whose restart wrote to the same run, by the
record-by-record readers and by SQL (a restart's pid need not be higher: pid namespaces, containers)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from telemetrain import Telemetry, identity_from_env
from telemetrain.report.model import build_model
from telemetrain.show import read_for_show
from telemetrain.store import open_run
from telemetrain.store.engine import engine_for


def _process(root: Path, pid: int, steps: range, spike_at: int | None = None) -> None:
    """One process of run ``rb`` (rank 0), its file named by ``pid``: a flat, slightly noisy loss, ``spike_at`` 50x."""
    t = Telemetry(identity_from_env({}, run_id="rb", session_tag="s", rank=0, world_size=1, pid=pid), store=root)
    for step in steps:
        t.log({"loss": 50.0 if step == spike_at else 1.0 + 0.01 * (step % 7)}, step=step, group="train")
    assert t.close()


def _findings(run_dir: Path) -> tuple[list[Any], list[Any]]:
    """The findings of the report and of ``show``, by the path ``TELEMETRAIN_ENGINE`` asks for."""
    sql = engine_for([run_dir])
    try:
        return (list(build_model(open_run(run_dir), engine=sql).findings),
                list(read_for_show(open_run(run_dir), sql).findings.findings))
    finally:
        if sql is not None:
            sql.close()


def _spike_titles(run_dir: Path) -> tuple[list[str], list[str]]:
    """The spike findings' titles of the report and of ``show``."""
    report, show = _findings(run_dir)
    return [f.title for f in report if f.kind == "spike"], [f.title for f in show if f.kind == "spike"]


def test_a_restart_with_a_lower_pid_is_read_after_the_process_it_restarted(tmp_path: Path, engine: str) -> None:
    """Attempt 1 (pid 9000) logs steps 0-59; the restart (pid 100, started later) goes back to 40 and spikes at 42,
    its 3rd point. Read in start order the spike has the 60 points before it as its history; by pid (show's Python
    path, and every SQL path) the restart came first and its spike had too few points before it to be tested."""
    _process(tmp_path, 9000, range(60))
    _process(tmp_path, 100, range(40, 100), spike_at=42)
    run_dir = tmp_path / "s" / "rb"
    assert sorted(p.pid for p in open_run(run_dir).processes) == [100, 9000]
    report, show = _spike_titles(run_dir)
    assert report == show == ["loss spike: train/loss at step 42"]


def test_the_first_nan_is_the_first_written_whatever_the_pids(tmp_path: Path, engine: str) -> None:
    """The first attempt (pid 9000) logs a NaN at step 30, its restart (pid 100) one at step 45: the first is at step
    30 (by pid, the restart's was met first: step 45)."""
    for pid, steps, bad in ((9000, range(60), 30), (100, range(40, 100), 45)):
        t = Telemetry(identity_from_env({}, run_id="rb", session_tag="s", rank=0, world_size=1, pid=pid),
                      store=tmp_path)
        for step in steps:
            t.log({"accuracy": float("nan") if step == bad else 0.5}, step=step, group="eval")
        assert t.close()
    run_dir = tmp_path / "s" / "rb"
    sql = engine_for([run_dir])
    try:
        found = [*build_model(open_run(run_dir), engine=sql).findings,
                 *read_for_show(open_run(run_dir), sql).findings.findings]
    finally:
        if sql is not None:
            sql.close()
    nan = [f for f in found if f.kind == "nan/inf"]
    assert len(nan) == 2 and {f.evidence.steps for f in nan} == {(30, 30)}


def _loss_run(root: Path, run_id: str, attempts: list[tuple[range, float]]) -> Path:
    """One process logging train/loss = 2 - slope x step over each (steps, slope) in turn; a NaN after step 50 of a
    slope-0 attempt (it diverged: the reason it was rolled back)."""
    t = Telemetry(identity_from_env({}, run_id=run_id, session_tag="s", rank=0, world_size=1), store=root)
    for steps, slope in attempts:
        for step in steps:
            value = 2.0 - slope * step if slope else (float("nan") if step > 50 else 0.5)
            t.log({"loss": value}, step=step, group="train")
    assert t.close()
    return root / "s" / run_id


def test_compare_reads_the_latest_attempt_of_a_run_that_rolled_back(tmp_path: Path, engine: str) -> None:
    """The candidate's first attempt dropped to 0.5 at step 45 then went NaN; it rolled back to 40 and trained on to
    100, reaching the baseline's final loss (~1.01) only near its end. compare's steps-to-reach, level and
    divergence are the latest attempt's: the abandoned dip is not a reach at step 45, its NaN no divergence."""
    from telemetrain.analysis.compare_quality import compare_quality
    from telemetrain.analysis.samples import read_samples

    baseline = _loss_run(tmp_path, "base", [(range(100), 0.01)])
    candidate = _loss_run(tmp_path, "cand", [(range(45), 0.01), (range(45, 60), 0.0), (range(40, 100), 0.0101)])
    q = compare_quality(read_samples(candidate), read_samples(baseline))
    assert q is not None and q.step == 99.0
    assert q.candidate_diverged is None and q.baseline_diverged is None
    assert q.reach_step is not None and q.reach_step > 90  # (the abandoned attempt was below it from step 45)
    assert 1.0 < q.candidate_value < q.baseline_value  # (its steep latest attempt: not the abandoned 0.5)


def test_tail_follows_the_latest_attempt_whatever_the_pids(tmp_path: Path) -> None:
    """tail's first frame of a run whose restart (pid 100) went back from step 59 to 40: polled file by file and
    caught up by SQL, the loss line ends at the restart's step 79 with its value (by pid, the restart's points came
    first and the abandoned attempt's were taken for the latest: 10 at step 59)."""
    pytest.importorskip("duckdb")
    from telemetrain.analysis.tail import TailState
    from telemetrain.store.engine import Engine

    for pid, steps, value in ((9000, range(60), 10.0), (100, range(40, 80), 1.0)):
        t = Telemetry(identity_from_env({}, run_id="rb", session_tag="s", rank=0, world_size=1, pid=pid),
                      store=tmp_path)
        for step in steps:
            t.log({"loss": 1.0 if step < 40 else value}, step=step, group="train")
        assert t.close()
    run_dir = tmp_path / "s" / "rb"
    polled = TailState(run_dir)
    polled.poll()
    caught = TailState(run_dir)
    with Engine([run_dir]) as engine:
        caught.catch_up(engine)
    caught.poll()
    for state in (polled, caught):
        # (the step: the last bucket's mean step, 2 steps a bucket at tail's 64 buckets a series)
        assert re.search(r"  1 at step 7[6-9]  \(train/loss\)$", state.loss_summary())
        curve = state.curves.curve("train", "loss")
        assert curve is not None and [(r.from_step, r.to_step) for r in curve.rollbacks] == [(59, 40)]


_WRITER = """
import pathlib, sys, time
from telemetrain import Telemetry, identity_from_env
root = pathlib.Path(sys.argv[1])
t = Telemetry(identity_from_env({}, run_id="rb", session_tag="s", rank=0, world_size=1), store=root)
for step in range(60):
    t.log({"loss": 1.0 if step < 40 else 10.0}, step=step, group="train")
assert t.flush()
(root / "attempt-1").touch()
while not (root / "go").exists():
    time.sleep(0.01)
for step in range(40, 80):  # back to the checkpoint at step 40
    t.log({"loss": 1.0}, step=step, group="train")
assert t.close()
"""


def test_tail_follows_a_run_that_rolls_back_while_it_polls(tmp_path: Path) -> None:
    """A real writer goes back from step 59 to 40 between two of tail's polls: the loss line shows the diverged
    attempt, then the latest one, the rollback marked once."""
    import subprocess
    import sys
    import time

    from telemetrain.analysis.tail import TailState

    src = str(Path(__file__).resolve().parents[1] / "src")
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], env={"PYTHONPATH": src, "PATH":
                                                                                   "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "attempt-1").exists():
            assert writer.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        state = TailState(tmp_path / "s" / "rb")
        state.poll()
        assert re.search(r"  10 at step 5[6-9]  \(train/loss\)$", state.loss_summary())
        (tmp_path / "go").touch()
        assert writer.wait(timeout=120) == 0
    finally:
        writer.kill()
    state.poll()
    assert re.search(r"  1 at step 7[6-9]  \(train/loss\)$", state.loss_summary())
    curve = state.curves.curve("train", "loss")
    assert curve is not None and [(r.from_step, r.to_step) for r in curve.rollbacks] == [(59, 40)]
    assert {p.mean for p in curve.lines[0].points} == {1.0} and curve.abandoned_points == 20


_LOOP = """
import sys
import telemetrain
from telemetrain import Telemetry, identity_from_env, training
pid, start, end, fail = (int(a) for a in sys.argv[2:])
t = Telemetry(identity_from_env({}, run_id="rb", session_tag="s", rank=0, world_size=1, pid=pid), store=sys.argv[1])
telemetrain.set_telemetry(t)
training.configure(training.TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=5))
try:
    with training.application(), training.training_loop(train_iterations_start=start):
        for i in range(start, end):
            with training.training_iteration():
                pass
        if fail:
            raise RuntimeError("diverged")
except RuntimeError:
    pass
assert t.close()
"""


def test_tail_catch_up_and_polling_agree_on_a_restart_with_a_lower_pid(tmp_path: Path) -> None:
    """The first process (pid 9000) trains to iteration 60 and its loop fails; the restart (pid 100) resumes at 40 and
    trains on to 80, its loop ending ok. Polled and caught up by SQL, the rank is at the restart's last report (79) and
    its loop ok (by pid, the SQL catch-up took the first process's last report, 59, and its failed
    loop)."""
    import subprocess
    import sys

    pytest.importorskip("duckdb")
    from telemetrain.analysis.tail import TailState
    from telemetrain.store.engine import Engine

    src = str(Path(__file__).resolve().parents[1] / "src")
    for args in (("9000", "0", "60", "1"), ("100", "40", "80", "0")):
        subprocess.run([sys.executable, "-c", _LOOP, str(tmp_path), *args], check=True, timeout=120,
                       env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    run_dir = tmp_path / "s" / "rb"
    polled = TailState(run_dir)
    polled.poll()
    caught = TailState(run_dir)
    with Engine([run_dir]) as engine:
        caught.catch_up(engine)
    caught.poll()
    seen = [(s.ranks[0].iteration, s.ranks[0].loop_status, s.eta()) for s in (polled, caught)]
    assert seen[0] == seen[1]
    assert seen[0][:2] == (79, "ok")


def _attempt(root: Path, pid: int, steps: range, slow_from: int, start_ms: float) -> None:
    """One process of run ``rw``, ranks 0 and 1 in turn (the same pid: ranks in containers): a report every 10
    iterations of 100 ms, 250 ms from ``slow_from`` (the attempt that was restarted got slow)."""
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    for rank in (0, 1):
        t = Telemetry(identity_from_env({}, run_id="rw", session_tag="s", rank=rank, world_size=2, pid=pid),
                      store=root)
        r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=10),
                             telemetry=t)
        now = start_ms
        r.on_train_start(steps.start, start_time_msec=now)
        for step in steps:
            r.on_training_single_iteration_start(now)
            now += (250.0 if step >= slow_from else 100.0) * (1 + 0.01 * ((step * 7 + rank) % 5))
            r.on_training_single_iteration_end(now)
            now += 1.0
        r.on_train_end(now)
        assert t.close()


@pytest.mark.parametrize("engine", ["python", "duckdb"], indirect=True)
def test_a_slow_attempt_that_was_rolled_back_is_no_slowdown_of_the_steps_its_restart_ran(tmp_path: Path,
                                                                                          engine: str) -> None:
    """The first attempt (pid 9000) got 2.5x slower from step 100 and was restarted from step 100 (pid 100, started
    later, so read first by pid) which ran on clean to 300: the steps 100..199 the final model saw were fast."""
    import time

    base = time.time() * 1000 - 200_000
    _attempt(tmp_path, 9000, range(200), 100, base)
    _attempt(tmp_path, 100, range(100, 300), 10**9, base + 60_000)
    report, show = _findings(tmp_path / "s" / "rw")
    assert [f.title for f in report] == [f.title for f in show] == []
