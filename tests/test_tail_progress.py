"""``tail``'s loss sparkline and ETA (analysis/tail_progress.py), on a real run being written."""

from __future__ import annotations

import io
import math
import re
import time
from pathlib import Path

import pytest

from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis.tail import TailState, render, run_tail
from telemetrain.analysis.tail_progress import BLOCKS, Pace, format_eta, sparkline
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

BASE_MS = int(time.time() * 1000) - 60_000


def test_sparkline_scales_and_marks_nonfinite() -> None:
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == BLOCKS
    assert sparkline([3.0, 3.0]) == BLOCKS[0] * 2
    assert sparkline([1.0, math.nan, 2.0]) == BLOCKS[0] + "!" + BLOCKS[-1]
    assert len(sparkline([float(i) for i in range(1000)], 40)) == 40
    decades = sparkline([10.0, 1.0, 0.1, 0.01], 4, log=True)
    assert decades == BLOCKS[-1] + BLOCKS[5] + BLOCKS[2] + BLOCKS[0]  # even steps on a log scale
    assert sparkline([]) == ""


def test_pace_and_eta() -> None:
    pace = Pace()
    assert pace.eta_seconds(100, 9) is None  # nothing yet
    pace.report(0, 0, 9)
    assert pace.eta_seconds(100, 9) is None  # one report without its window's time: no pace yet
    pace.report(0, 2_000_000_000, 29)  # 20 iterations in 2 s (the reports' own times)
    assert pace.per_second() == 10.0
    assert pace.eta_seconds(100, 29) == 7.0
    assert pace.eta_seconds(None, 29) is None
    pace.report(0, 3_000_000_000, 5)  # a restart from a checkpoint: the pace starts over
    assert pace.per_second() is None
    pace.report(0, 9_000_000_000, 25, 20, 4.0)  # the window's own time: 5 iterations a second
    assert pace.per_second() == 5.0
    assert format_eta(7.0, 100, 29, False) == "0m07s (30/100)"
    assert format_eta(None, None, 29, False).startswith("- (no train_iterations_target")
    assert format_eta(None, 100, 99, False) == "done (100/100)"


def _write(root: Path, iterations: int, *, target: int | None, finish: bool) -> Path:
    identity = identity_from_env({}, run_id="live", session_tag="s", rank=0, world_size=1)
    t = Telemetry(identity, store=root)
    config = TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=10,
                                     train_iterations_target_or_fn=target, perf_tag_or_fn="p")
    r = TrainingRecorder(config, telemetry=t)
    now = BASE_MS
    r.on_app_start(now)
    r.on_train_start(0, start_time_msec=now)
    for step in range(iterations):
        r.on_training_single_iteration_start(now)
        now += 100  # 10 iterations a second
        r.on_training_single_iteration_end(now)
        t.log({"loss": 4.0 / (1 + step / 10), "val_loss": 5.0}, step=step, group="train")
    if finish:
        r.on_train_end(now)
        r.on_app_end(now)
    assert t.close()
    return root / "s" / "live"


def test_tail_shows_the_loss_sparkline_and_the_eta(tmp_path: Path) -> None:
    pytest.importorskip("rich")
    run = _write(tmp_path, 50, target=200, finish=False)
    state = TailState(run)
    state.poll()
    assert state.target == 200
    assert state.pace.per_second() == pytest.approx(10.0, rel=0.05)
    eta = state.eta()
    assert eta.endswith("(50/200)") and eta.startswith("0m1")  # 150 iterations at ~10/s: about 15 s
    summary = state.loss_summary()
    assert "(train/loss)" in summary and "at step 49" in summary  # the training loss, not val_loss
    spark = summary.split()[0]
    assert spark[0] == BLOCKS[-1] and spark[-1] == BLOCKS[0]  # falling
    out = io.StringIO()
    assert run_tail(run, out, interval=1.0, once=True, loss="val_loss") == 0
    frame = out.getvalue()
    assert "(train/val_loss)" in frame and "ETA " in frame


def test_tail_without_a_target_has_no_eta(tmp_path: Path) -> None:
    pytest.importorskip("rich")
    run = _write(tmp_path, 30, target=None, finish=True)
    state = TailState(run)
    state.poll()
    assert state.target is None and state.eta().startswith("- (no train_iterations_target")


def test_recent_events_are_the_latest_of_all_ranks_by_time_both_ways(tmp_path: Path) -> None:
    """The first frame reads rank after rank: the recent events must still be the latest by time, not the last
    rank's. Ranks 0..3 write warnings in turn (rank 0 the latest ones), polling and the SQL catch-up agree."""
    pytest.importorskip("duckdb", reason="the SQL catch-up needs the columnar extra (duckdb)")
    from telemetrain.store.engine import Engine

    writers = [Telemetry(identity_from_env({}, run_id="ev", session_tag="ev", rank=r, world_size=4), store=tmp_path)
               for r in range(4)]
    for i in range(6):
        for rank in (3, 2, 1, 0):  # rank 0 writes last in each round
            writers[rank].event("odd", {"i": i}, group="check", severity="warning")
            time.sleep(0.002)
    for t in writers:
        assert t.close()
    run_dir = next(p for p in (tmp_path / "ev").iterdir() if p.is_dir())
    polled = TailState(run_dir)
    polled.poll()
    caught = TailState(run_dir)
    with Engine([run_dir]) as engine:
        caught.catch_up(engine)
    for state in (polled, caught):
        shown = [(rank, text) for _, rank, _, _, text in state.recent]
        # the last 10 of 24 by time: rounds 4 and 5 (8 events) and rank 1 and rank 0 of round 3, oldest first
        assert shown == [(1, "i=3"), (0, "i=3")] + [(r, f"i={i}") for i in (4, 5) for r in (3, 2, 1, 0)]
        assert state.warnings == 24


def test_the_ranks_table_of_many_ranks_keeps_the_first_and_the_outliers(tmp_path: Path) -> None:
    """40 ranks: the table shows 8 rows, the rank furthest behind, the slowest, the longest silent and one whose loop
    failed, then how many it left out; 16 ranks or fewer are all shown."""
    pytest.importorskip("rich", reason="tail draws its view with rich (the [report] extra)")
    from rich.console import Console

    from telemetrain.analysis.tail import RankState

    def frame(n: int) -> str:
        state = TailState(tmp_path)
        now = time.time_ns()
        for r in range(n):
            state.ranks[r] = RankState(r, iteration=1000 - (37 if r == 17 else 0), wall_ns=now - (60 if r == 30 else 1)
                                       * 1_000_000_000, mean=0.02 * (3 if r == 25 else 1), reports=10,
                                       loop_status="error" if r == 33 else None)
        console = Console(width=160, record=True, file=io.StringIO())
        console.print(render(state, now))
        return console.export_text()

    text = frame(40)
    rows = [int(m) for m in re.findall(r"^│ +(\d+) │", text, re.M)]
    assert rows == [*range(8), 17, 25, 30, 33]
    assert "+28 │" in text and "more ranks" in text and "the first and the outliers of 40" in text
    assert [int(m) for m in re.findall(r"^│ +(\d+) │", frame(16), re.M)] == list(range(16))
