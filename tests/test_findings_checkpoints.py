"""The slow checkpoint rank rule (``analysis/findings/checkpoints.py``): a rank whose checkpoint saves take much
longer than the other ranks' is named with its save time, the others' median and what it cost the job; ranks that
save in similar times, a rank that writes for all, a checkpoint saved by one rank and a one-off hiccup are not
findings. The rule on plain saves, then on real runs written by the training recorder, read by report, show and tail (in
Python and by SQL)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from conftest import run_dir_of
from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis.findings import CheckpointSave, FindingsInput, Thresholds, analyse, run_findings
from telemetrain.store import open_run
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

KIND = "slow checkpoint rank"


def _saves(times: dict[int, list[float]], name: str = "checkpoint_save_sync",
           every: int | None = 100) -> list[CheckpointSave]:
    """Each rank's saves, the k-th at step (k + 1) x ``every`` (None: no step named)."""
    return [CheckpointSave(rank, name, None if every is None else (k + 1) * every, s)
            for rank, seconds in times.items() for k, s in enumerate(seconds)]


def _slow(saves: list[CheckpointSave], **hosts: Any) -> list[Any]:
    found = analyse(FindingsInput(checkpoint_saves=saves, hosts={int(k[1:]): v for k, v in hosts.items()}))
    return [f for f in found.findings if f.kind == KIND]


def test_a_rank_that_saves_slowly_is_named_with_its_time_the_median_and_the_cost() -> None:
    times = {r: [2.0, 2.1, 1.95, 2.05] for r in range(8)}
    times[5] = [9.0, 8.0, 10.0, 9.5]
    (f,) = _slow(_saves(times), r5="node-b")
    e = f.evidence
    assert e.ranks == (5,) and e.steps == (100, 400)
    assert e.value == pytest.approx(9.25) and e.reference == pytest.approx(2.025)
    assert e.effect == pytest.approx(9.25 / 2.025)
    # each checkpoint: its save less the other ranks' median, which every other rank waited at the next collective
    assert e.cost_seconds == pytest.approx((9.0 - 2.0) + (8.0 - 2.1) + (10.0 - 1.95) + (9.5 - 2.05))
    assert f.severity == "warning" and "rank 5" in f.title
    assert "node-b" in f.detail and "4 of its 4 checkpoint(s)" in f.detail and "storage" in f.detail
    assert "lowest rank" not in f.detail


def test_ranks_that_save_in_similar_times_are_no_finding() -> None:
    # a shared filesystem's spread: every rank within 40% of the others, one a little slower each time
    times = {r: [3.0 + 0.3 * ((r * 7 + k) % 5) for k in range(6)] for r in range(16)}
    times[3] = [s * 1.4 for s in times[3]]
    assert _slow(_saves(times)) == []


def test_rank_0_writing_for_all_is_not_a_slow_rank() -> None:
    # torch.save on rank 0 while the others' saves return at once (they wait at the barrier after it)
    times = {0: [30.0, 31.0, 29.0], **{r: [0.001, 0.002, 0.001] for r in range(1, 8)}}
    assert _slow(_saves(times)) == []
    # rank 0 writing more than the others, who save a little of their own: named, saying what it may be
    times = {0: [6.0, 6.2, 5.9], **{r: [0.5, 0.5, 0.5] for r in range(1, 8)}}
    (f,) = _slow(_saves(times))
    assert f.evidence.ranks == (0,) and "lowest rank" in f.detail and "sharding the save" in f.detail
    # and saves that only rank 0 records are not compared at all
    assert _slow(_saves({0: [30.0, 31.0, 29.0]})) == []


def test_the_ranks_writing_for_all_are_compared_among_themselves() -> None:
    # the first data-parallel replica's 4 ranks write the state, the other 12 ranks' saves are empty: no slow rank
    times = {r: [5.0 + 0.2 * ((r + k) % 3) for k in range(4)] if r < 4 else [0.02, 0.03, 0.02, 0.02]
             for r in range(16)}
    assert _slow(_saves(times)) == []
    # one of those writers takes 3x the others: named, against the writers' median
    times[2] = [15.0, 16.0, 15.5, 15.0]
    (f,) = _slow(_saves(times))
    assert f.evidence.ranks == (2,) and 5.0 <= f.evidence.reference <= 5.4


def test_a_one_off_slow_save_among_many_checkpoints_is_not_a_slow_rank() -> None:
    times = {r: [2.0] * 10 for r in range(4)}
    times[2] = [2.0] * 9 + [8.0]
    assert _slow(_saves(times)) == []
    times[2] = [8.0] * 5 + [2.0] * 5  # half of its checkpoints: it is
    assert [f.evidence.ranks for f in _slow(_saves(times))] == [(2,)]


def test_small_differences_and_saves_without_a_step() -> None:
    # 3x slower but 0.4 s more: under the second a finding needs
    times = {r: [0.2] * 3 for r in range(4)}
    times[1] = [0.6] * 3
    assert _slow(_saves(times)) == []
    # without an iteration each rank's k-th save is one checkpoint
    times[1] = [5.0] * 3
    (f,) = _slow(_saves(times, every=None))
    assert f.evidence.ranks == (1,) and f.evidence.steps is None and "step" not in f.detail.split(":")[0]
    # the async save's blocking part counts too; other spans do not
    assert [f.evidence.ranks for f in _slow(_saves(times, "checkpoint_save_async"))] == [(1,)]
    assert _slow(_saves(times, "checkpoint_load")) == []


def test_the_thresholds_are_checked() -> None:
    with pytest.raises(ValueError, match="checkpoint_ratio"):
        Thresholds(checkpoint_ratio=1.0)
    with pytest.raises(ValueError, match="checkpoint_share"):
        Thresholds(checkpoint_share=2.0)
    times = {r: [2.0] * 3 for r in range(4)}
    times[1] = [3.5] * 3
    assert _slow(_saves(times)) == []  # 1.75x: under the default 2x
    found = analyse(FindingsInput(checkpoint_saves=_saves(times)), Thresholds(checkpoint_ratio=1.5))
    assert [f.evidence.ranks for f in found.findings if f.kind == KIND and f.evidence] == [(1,)]


# -- real runs: the training recorder's spans, read by report and show ------------------------------------------------


def _job(root: Path, save_s: dict[int, float | None], *, ranks: int = 4, checkpoints: int = 3) -> Path:
    """``ranks`` ranks of run "ck", each training 30 empty iterations and saving every 10, each save taking
    ``save_s[rank]`` seconds (0.5 s for a rank not named; absent: that rank records no save), given to the recorder
    as the save's start and end times (no sleeping)."""
    run_dir = None
    for rank in range(ranks):
        t = Telemetry(identity_from_env({}, run_id="ck", session_tag="s", rank=rank, world_size=ranks), store=root)
        r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=ranks, log_every_n_train_iterations=5),
                             telemetry=t)
        r.on_app_start()
        r.on_train_start(0)
        for step in range(10 * checkpoints):
            r.on_training_single_iteration_start()
            r.on_training_single_iteration_end()
            if step % 10 == 9 and (seconds := save_s.get(rank, 0.5)) is not None:
                start = time.time() * 1000
                r.on_save_checkpoint_start(global_step=step + 1, start_time_msec=start)
                r.on_save_checkpoint_success(global_step=step + 1, time_msec=start + seconds * 1000)
                r.on_save_checkpoint_end(finish_time_msec=start + seconds * 1000)
        r.on_train_end()
        r.on_app_end()
        assert t.close(30)
        run_dir = run_dir_of(t)
    assert run_dir is not None
    return run_dir


def _every_reader(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """The findings of the report (Python and SQL), ``show`` (Python and SQL), ``tail`` (polling and its SQL
    catch-up) and ``run_findings``."""
    from telemetrain.analysis.tail import TailState
    from telemetrain.report.model import build_model
    from telemetrain.show import read_for_show
    from telemetrain.store.engine import Engine

    out = {"run_findings": list(run_findings(open_run(run_dir)).findings)}
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    out["report"] = list(build_model(open_run(run_dir)).findings)
    out["show"] = list(read_for_show(open_run(run_dir)).findings.findings)
    pytest.importorskip("duckdb")
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    with Engine([run_dir]) as engine:
        out["report sql"] = list(build_model(open_run(run_dir), engine=engine).findings)
    with Engine([run_dir]) as engine:
        out["show sql"] = list(read_for_show(open_run(run_dir), engine).findings.findings)
    polled = TailState(run_dir)
    polled.poll()
    out["tail"] = list(polled.findings().findings)
    caught = TailState(run_dir)
    with Engine([run_dir]) as engine:
        caught.catch_up(engine)
    out["tail sql"] = list(caught.findings().findings)
    assert caught.records == polled.records  # the catch-up counts the save spans polling decodes
    return out


def test_every_reader_names_the_slow_checkpoint_rank_of_a_real_run(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = _job(tmp_path, {2: 6.0})
    for reader, found in _every_reader(run_dir, monkeypatch).items():
        slow = [f for f in found if f.kind == KIND]
        assert len(slow) == 1, (reader, [f.title for f in found])
        e = slow[0].evidence
        assert e.ranks == (2,) and e.steps == (10, 30), reader
        assert e.value == pytest.approx(6.0, abs=1e-3) and e.reference == pytest.approx(0.5, abs=1e-3), reader
        assert e.cost_seconds == pytest.approx(3 * 5.5, abs=1e-2), reader


@pytest.mark.parametrize("save_s", [{}, {r: None for r in range(1, 4)} | {0: 20.0},
                                    {0: 20.0, 1: 0.001, 2: 0.001, 3: 0.001}],
                         ids=["similar", "only-rank-0-saves", "rank-0-writes-for-all"])
def test_no_reader_finds_a_slow_checkpoint_rank_in_a_clean_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               save_s: dict[int, float | None]) -> None:
    run_dir = _job(tmp_path, save_s)
    for reader, found in _every_reader(run_dir, monkeypatch).items():
        assert [f.title for f in found if f.kind == KIND] == [], reader
