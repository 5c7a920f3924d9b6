"""Steps logged again within one run (report/curves.py): a rollback to a checkpoint, in the process or after a restart
writing to the same run, makes the curve follow the latest attempt of each step, the abandoned stretch drawn dimmed
and the rollback marked; the same step logged several times on purpose (gradient-accumulation micro-batches) is not
a rollback. Runs written by the library, read back by the report and by compare's samples."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis.samples import read_samples
from telemetrain.report import write_report
from telemetrain.report.curves import DETAIL_POINTS, MAX_ROLLBACKS, Curve, CurveBuilder, Rollback
from telemetrain.report.model import build_model
from telemetrain.store import open_run
from telemetrain.store.engine import engine_for

GOOD, DIVERGED = 1.0, 10.0


def _attempt(root: Path, steps: range, value: float, run_id: str = "rb") -> None:
    t = Telemetry(identity_from_env({}, run_id=run_id, session_tag="s", rank=0, world_size=1), store=root)
    for step in steps:
        t.log({"loss": value}, step=step, group="train")
    assert t.close()


_RESTART = """
import sys
from telemetrain import Telemetry, identity_from_env
t = Telemetry(identity_from_env({}, run_id="rb", session_tag="s", rank=0, world_size=1), store=sys.argv[1])
for step in range(40, 80):
    t.log({"loss": 1.0}, step=step, group="train")
assert t.close()
"""


def _loss(run_dir: Path) -> tuple[dict[float, float], Curve]:
    """The report's train/loss curve, by the path ``TELEMETRAIN_ENGINE`` asks for."""
    sql = engine_for([run_dir])
    try:
        model = build_model(open_run(run_dir), engine=sql)
    finally:
        if sql is not None:
            sql.close()
    curve = next(c for c in model.curves if c.title == "train/loss")
    return {p.x: p.mean for p in curve.lines[0].points}, curve


def test_a_restart_that_rolls_back_is_followed_not_averaged(tmp_path: Path, engine: str) -> None:
    """Attempt 1 logs steps 0-59 and diverges from step 40; the job restarts (another process, same run) from the
    checkpoint at step 40 and logs 40-79. The chart averaged steps 40-59 of both attempts (5.5)."""
    _attempt(tmp_path, range(40), GOOD)
    _attempt(tmp_path, range(40, 60), DIVERGED)  # (same process: appended to its file, the restart is the child)
    src = str(Path(__file__).resolve().parents[1] / "src")
    subprocess.run([sys.executable, "-c", _RESTART, str(tmp_path)], check=True, timeout=120,
                   env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    run_dir = tmp_path / "s" / "rb"
    assert len(open_run(run_dir).processes) == 2
    sql = engine_for([run_dir])
    assert (sql is None) == (engine == "python")
    if sql is not None:
        sql.close()
    by_step, curve = _loss(run_dir)
    assert sorted(by_step) == [float(s) for s in range(80)]
    assert set(by_step.values()) == {GOOD}  # the latest attempt of every step
    assert curve.rollbacks == (Rollback(0, 59, 40),)
    abandoned = curve.abandoned[0].points
    assert [p.x for p in abandoned] == [float(s) for s in range(40, 60)] and {p.mean for p in abandoned} == {DIVERGED}
    assert curve.points == 100 and curve.abandoned_points == 20
    page = write_report(run_dir, tmp_path / "r.html").read_text()
    assert 'class="abandoned"' in page and 'class="rollback"' in page
    assert "went back 1 time(s) (59 to 40)" in page
    # compare reads the same curve: the loss at the end is the latest attempt's
    samples = read_samples(run_dir)
    loss = samples.curves.curve("train", "loss")
    assert loss is not None and {p.mean for p in loss.lines[0].points} == {GOOD}


def test_an_in_process_rollback_is_the_same(tmp_path: Path, engine: str) -> None:
    """One process that goes back to step 20 (an in-job restart from its checkpoint) and logs on."""
    t = Telemetry(identity_from_env({}, run_id="rb", session_tag="s", rank=0, world_size=1), store=tmp_path)
    for step in range(30):
        t.log({"loss": DIVERGED if step >= 20 else GOOD}, step=step, group="train")
    for step in range(20, 40):
        t.log({"loss": GOOD}, step=step, group="train")
    assert t.close()
    by_step, curve = _loss(tmp_path / "s" / "rb")
    assert set(by_step.values()) == {GOOD} and len(by_step) == 40
    assert curve.rollbacks == (Rollback(0, 29, 20),)


def test_a_bucket_that_straddles_the_rollback_step_keeps_only_the_latest_attempt(tmp_path: Path, engine: str) -> None:
    """600 steps draw in buckets of 4; the job goes back from step 549 to 531, inside the bucket of steps 528-531:
    that bucket keeps steps 528-530 of the first attempt and 531 of the second, its diverged 531 moves to the
    abandoned line (the SQL path split it; the record pass kept both attempts' 531 in it)."""
    t = Telemetry(identity_from_env({}, run_id="rb", session_tag="s", rank=0, world_size=1), store=tmp_path)
    for step in range(550):
        t.log({"loss": DIVERGED if step >= 531 else GOOD}, step=step, group="train")
    for step in range(531, 600):
        t.log({"loss": GOOD}, step=step, group="train")
    assert t.close()
    by_step, curve = _loss(tmp_path / "s" / "rb")
    assert curve.bucket_width == 4 and curve.rollbacks == (Rollback(0, 549, 531),)
    assert set(by_step.values()) == {GOOD}, {x: m for x, m in by_step.items() if m != GOOD}
    straddling = next(p for p in curve.lines[0].points if 528 <= p.x < 532)
    assert (straddling.x, straddling.n) == (529.5, 4)
    abandoned = curve.abandoned[0].points
    assert {p.mean for p in abandoned} == {DIVERGED} and curve.abandoned_points == 19 and curve.points == 619
    assert sum(p.n for p in abandoned) == 19 and abandoned[0].x == 531.0


def _fed(points: list[tuple[int, float]]) -> CurveBuilder:
    b = CurveBuilder()
    for wall, (step, value) in enumerate(points):
        b.add(0, "train", "loss", step, value, 1_000 + wall)
    return b


def test_a_split_straddling_bucket_is_the_bucket_of_the_latest_attempts_points() -> None:
    """Micro-batches (two values a step) and NaNs around the step gone back to (531, inside the bucket of 528-531):
    the curve is the one of the latest attempt's points fed alone, slot for slot (count, sum, min, max, where the max
    and the first NaN were, wall time); the abandoned points are the first attempt's 531-549."""
    def value(attempt: int, step: int, micro: int) -> float:
        return math.nan if step % 7 == 0 and micro else float(attempt * 100 + step % 13 + micro)

    first = [(step, value(1, step, micro)) for step in range(550) for micro in range(2)]
    second = [(step, value(2, step, micro)) for step in range(531, 600) for micro in range(2)]
    rolled = _fed(first + second).curve("train", "loss")
    kept = [(s, v) for s, v in first if s < 531] + second
    alone = _fed(kept).curve("train", "loss")
    assert rolled is not None and alone is not None and rolled.bucket_width == alone.bucket_width == 4
    assert rolled.rollbacks == (Rollback(0, 549, 531),)
    # (the wall times differ: the alone-fed points were fed earlier)
    assert [dataclasses.replace(p, seconds=0) for p in rolled.lines[0].points] == \
        [dataclasses.replace(p, seconds=0) for p in alone.lines[0].points]
    assert rolled.abandoned_points == 38 and rolled.nonfinite == alone.nonfinite
    left = [v for s, v in first if s >= 531]
    assert sum(p.n for p in rolled.abandoned[0].points) == sum(1 for v in left if not math.isnan(v))


def test_a_rollback_past_the_points_held_keeps_the_straddling_bucket_whole() -> None:
    """A rollback further back than the points held one by one (2 x DETAIL_POINTS): the bucket holding the step gone
    back to cannot be split and keeps both attempts' values (its resolution), the buckets past it are abandoned."""
    back = 2 * DETAIL_POINTS + 100
    b = _fed([(step, GOOD) for step in range(3_000)] + [(step, DIVERGED) for step in range(3_000 - back, 3_100)])
    curve = b.curve("train", "loss")
    assert curve is not None and curve.rollbacks == (Rollback(0, 2_999, 3_000 - back),)
    width = int(curve.bucket_width)
    assert (3_000 - back) % width  # (it straddles)
    [straddling] = [p for p in curve.lines[0].points if p.lo <= GOOD < DIVERGED <= p.hi]
    assert straddling.x // width == (3_000 - back) // width


def test_micro_batches_at_one_step_are_that_steps_values_not_rollbacks(tmp_path: Path, engine: str) -> None:
    """Gradient accumulation logging each of 4 micro-batches at the same step: no rollback, each step the mean of its
    four values (min..max kept), nothing dimmed."""
    t = Telemetry(identity_from_env({}, run_id="rb", session_tag="s", rank=0, world_size=1), store=tmp_path)
    for step in range(30):
        for micro in range(4):
            t.log({"loss": 1.0 + micro}, step=step, group="train")
    assert t.close()
    by_step, curve = _loss(tmp_path / "s" / "rb")
    assert len(by_step) == 30 and set(by_step.values()) == {2.5}
    assert curve.rollbacks == () and curve.abandoned == ()
    assert {(p.lo, p.hi, p.n) for p in curve.lines[0].points} == {(1.0, 4.0, 4)}
    assert 'class="rollback"' not in write_report(tmp_path / "s" / "rb", tmp_path / "r.html").read_text()


def test_a_step_that_restarts_every_epoch_is_not_a_rollback_storm() -> None:
    """A batch index logged as the step, back to 0 every epoch: past MAX_ROLLBACKS the series' step is not training
    progress; every value counts again (as without the rule) and no rollback is marked."""
    b = CurveBuilder()
    epochs = MAX_ROLLBACKS + 4
    for epoch in range(epochs):
        for batch in range(10):
            b.add(0, "train", "loss", batch, float(epoch), epoch * 10 + batch)
    curve = b.curve("train", "loss")
    assert curve is not None and curve.rollbacks == () and curve.abandoned == ()
    mean = sum(range(epochs)) / epochs
    assert [p.mean for p in curve.lines[0].points] == pytest.approx([mean] * 10)
    assert {p.n for p in curve.lines[0].points} == {epochs}


def test_rollbacks_in_a_long_run_keep_memory_bounded_and_buckets_coarse() -> None:
    """A 1M-step series that rolls back 10 times (each 5,000 steps): the builder's buckets, kept and abandoned,
    stay within twice its capacity, and the memory held small; the curve has the latest attempt at the end."""
    b = CurveBuilder(capacity=64)
    tracemalloc.start()
    step = 0
    for attempt in range(11):
        end = (attempt + 1) * 100_000
        while step < end:
            b.add(0, "train", "loss", step, 1.0 if attempt == 10 else 2.0, step)
            step += 1
        if attempt < 10:
            step -= 5_000
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    s = b._series[("train", "loss")][0]
    assert len(s.buckets) <= 64 and len(s.abandoned) <= 64
    assert held < 256 * 1024
    curve = b.curve("train", "loss")
    # (buckets of 16,384 steps by then: a rollback inside one leaves it whole in the curve, at its resolution)
    assert curve is not None and len(curve.rollbacks) == 10 and 0 < curve.abandoned_points <= 50_000
    assert curve.bucket_width >= 8192 and curve.lines[0].points[-1].mean == 1.0
