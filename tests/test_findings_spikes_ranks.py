"""The spike rule over many ranks (findings/values.py, "Many ranks"): each rank's loss tested at every step makes
chance spikes somewhere in a clean job of hundreds of ranks; the correction over ranks keeps them out, and still
finds a spike of one rank and a spike of every rank at one step. Real runs written to a store by in-process ranks,
read by ``run_findings`` (Python), ``show`` by SQL and ``tail``."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from conftest import run_dir_of
from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis.findings import run_findings
from telemetrain.analysis.findings.inputs import ValueSeries
from telemetrain.analysis.findings.thresholds import Thresholds
from telemetrain.analysis.findings.values import _series_spikes, spikes
from telemetrain.store import open_run

RANKS, STEPS = 256, 200


def _loss(rank: int) -> list[float]:
    """A rank's loss per step: a falling curve times (1 + 10% Student-t, 3 degrees of freedom) -- the heavy tails of
    per-rank micro-batches (a batch of hard samples now and then)."""
    rng = random.Random(rank)
    out = []
    for step in range(STEPS):
        t = rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3)
        out.append((0.3 + 2.0 * math.exp(-step / 100)) * (1 + 0.1 * t))
    return out


def _job(root: Path, planted: dict[tuple[int | None, int], float]) -> Path:
    """RANKS in-process ranks of run "sp" logging ``loss`` every step; ``planted``: (rank, or None for every rank,
    step) -> the factor that step's loss is multiplied by."""
    run_dir = None
    for rank in range(RANKS):
        t = Telemetry(identity_from_env({}, run_id="sp", session_tag="s", rank=rank, world_size=RANKS), store=root)
        for step, value in enumerate(_loss(rank)):
            factor = planted.get((rank, step), planted.get((None, step), 1.0))
            t.metric("loss", value * factor, step=step)
        assert t.close(30)
        run_dir = run_dir_of(t)
    assert run_dir is not None
    return run_dir


def _readers(run_dir: Path) -> dict[str, list[Any]]:
    from telemetrain.analysis.tail import TailState
    from telemetrain.show import read_for_show
    from telemetrain.store.engine import Engine

    out = {"python": [f for f in run_findings(open_run(run_dir)).findings if f.kind == "spike"]}
    pytest.importorskip("duckdb")
    with Engine([run_dir]) as engine:
        out["show sql"] = [f for f in read_for_show(open_run(run_dir), engine).findings.findings if f.kind == "spike"]
    tail = TailState(run_dir)
    tail.poll()
    out["tail"] = [f for f in tail.findings().findings if f.kind == "spike"]
    return out


def test_a_clean_job_of_many_ranks_has_no_loss_spike(tmp_path: Path) -> None:
    th = Thresholds()
    # each rank's series alone: some of them cross spike_z by chance (what the correction is for)
    chance = [r for r in range(RANKS) if _series_spikes(ValueSeries("loss", "loss", r, list(enumerate(_loss(r)))), th)]
    assert chance  # (ranks 125 and 129 of these seeds)
    for reader, found in _readers(_job(tmp_path, {})).items():
        assert [f.title for f in found] == [], reader


def test_a_spike_of_one_rank_and_one_of_every_rank_are_still_found(tmp_path: Path) -> None:
    run_dir = _job(tmp_path, {(37, 120): 100.0, (None, 160): 8.0})
    for reader, found in _readers(run_dir).items():
        assert len(found) == 1, (reader, [f.title for f in found])
        e = found[0].evidence
        assert found[0].title == "loss spike: loss at steps 120, 160", reader
        assert e.steps == (120, 160) and 37 in e.ranks and len(e.ranks) > RANKS // 2, reader


def test_one_rank_is_tested_as_before_and_ranks_logging_the_same_loss_spike_together() -> None:
    th = Thresholds()
    rng = random.Random(1)
    base = [(s, 1.0 + rng.gauss(0, 0.01)) for s in range(100)]
    jump = [*base[:60], (60, 4.5), *base[61:]]  # z ~ 300 against a 1% noise: a spike of one rank alone
    assert [f.evidence.steps for f in spikes([ValueSeries("loss", "loss", 0, jump)], th) if f.evidence] == [(60, 60)]
    # 1,024 ranks, one of them with that spike: under the union bound over the ranks (15 x 32 = 480), but nothing
    # else in the family crosses spike_z: the cut is 15 x sqrt(1 / spike_alpha) = 150
    noisy = [ValueSeries("loss", "loss", r, base if r else jump) for r in range(1024)]
    assert [f.evidence.ranks for f in spikes(noisy, th) if f.evidence] == [(0,)]
    # every rank logging the all-reduced loss: the same modest spike on each, at one step, is the job's
    small = [*base[:60], (60, 4.0), *base[61:]]
    same = [ValueSeries("loss", "loss", r, small) for r in range(1024)]
    (f,) = spikes(same, th)
    assert f.evidence is not None and f.evidence.steps == (60, 60) and len(f.evidence.ranks) == 1024


def test_a_loss_of_another_group_is_its_own_series_not_a_spike_of_the_training_loss(tmp_path: Path) -> None:
    """``train``'s falling loss then ``val``'s loss, both named ``loss``: read as one series, val's first points (far
    above the last training losses) were a "loss spike" of a clean run."""
    pytest.importorskip("duckdb")
    from telemetrain.report.model import build_model
    from telemetrain.store.engine import Engine

    t = Telemetry(identity_from_env({}, run_id="groups", session_tag="s", rank=0, world_size=1), store=tmp_path)
    rng = random.Random(3)
    for step in range(200):
        t.log({"loss": 5.0 * math.exp(-step / 20) + 0.01 * (1 + 0.01 * rng.random())}, step=step, group="train")
    for step in range(0, 200, 5):
        t.log({"loss": 2.0 + 0.01 * rng.random()}, step=step, group="val")
    assert t.close(30)
    run_dir = run_dir_of(t)
    found = _readers(run_dir)
    found["report"] = [f for f in build_model(open_run(run_dir)).findings if f.kind == "spike"]
    with Engine([run_dir]) as engine:
        found["report sql"] = [f for f in build_model(open_run(run_dir), engine=engine).findings if f.kind == "spike"]
    for reader, spikes_found in found.items():
        assert [f.title for f in spikes_found] == [], reader
    # and a spike of the validation loss is named by its group
    t = Telemetry(identity_from_env({}, run_id="groups2", session_tag="s", rank=0, world_size=1), store=tmp_path)
    for step in range(60):
        t.log({"loss": 1.0 + 0.01 * rng.random()}, step=step, group="train")
        t.log({"loss": (9.0 if step == 40 else 2.0) + 0.01 * rng.random()}, step=step, group="val")
    assert t.close(30)
    for reader, spikes_found in _readers(run_dir_of(t)).items():
        assert [f.title for f in spikes_found] == ["loss spike: val/loss at step 40"], reader
