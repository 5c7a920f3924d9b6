"""compare among runs of one perf_tag and several workloads (a batch-size sweep under one tag): the baseline it picks
and the history whose spread sets the effect a change needs are of the candidate's workload (run.json's).

The runs are written through the real pipeline (``Telemetry`` + ``TrainingRecorder`` at explicit times, one rank)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from telemetrain import Telemetry, cli, identity_from_env
from telemetrain.analysis import compare_runs
from telemetrain.analysis.compare import REGRESSION
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

BASE_MS = 1_700_000_000_000


def write_run(root: Path, run_id: str, *, ms: float, batch: int = 8) -> Path:
    """A finished one-rank run of global batch ``batch`` whose iterations take ``ms`` (3% noise)."""
    identity = identity_from_env({}, run_id=run_id, session_tag=run_id, perf_tag="sweep", rank=0, world_size=1)
    t = Telemetry(identity, store=root)
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=batch, log_every_n_train_iterations=10,
                                                 perf_tag_or_fn="sweep"), telemetry=t)
    rng = random.Random(run_id)
    now = float(BASE_MS)
    r.on_app_start(now)
    r.on_train_start(0, start_time_msec=now)
    for _ in range(120):
        r.on_training_single_iteration_start(now)
        now += ms * rng.lognormvariate(0, 0.03)
        r.on_training_single_iteration_end(now)
    r.on_train_end(now)
    r.on_app_end(now + 1)
    assert t.close()
    return root / run_id / run_id


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Oldest first: the baseline (batch 8), a sweep's batch 4 and batch 16 runs, the candidate (batch 8, +20%)."""
    root = tmp_path_factory.mktemp("sweep")
    return {"root": root, "base": write_run(root, "base", ms=100.0),
            "small": write_run(root, "small", ms=50.0, batch=4), "big": write_run(root, "big", ms=200.0, batch=16),
            "cand": write_run(root, "cand", ms=120.0)}


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object], str]:
    code = cli.main(["compare", *argv, "--json", "--resamples", "200", "--no-goodput"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out else {}, captured.err


def test_the_default_baseline_is_a_run_of_the_candidates_workload(runs: dict[str, Path],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # the newest other run of the tag is the batch-16 one: picked, the comparison was refused as another workload
    code, out, err = _json(capsys, str(runs["cand"]), "--history", "0")
    assert code == 0, err
    assert f"baseline: {runs['base']} (newest other run" in err
    assert out["baseline"]["run_id"] == "base"  # type: ignore[index]
    # a candidate of a workload no other run has still gets the newest run of its tag, and the refusal says how
    code, _, err = _json(capsys, str(runs["big"]), "--history", "0")
    assert code == 2 and "global_batch_size 16 vs" in err


def test_runs_of_another_workload_are_not_history(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    # the batch 4 and 16 runs' medians (50 and 200 ms) around the baseline's 100 ms read as a between-run spread of
    # +/-99%: the candidate's +20% was "no significant change"
    c = compare_runs([runs["cand"]], runs["base"], history=[runs["small"], runs["big"]], goodput=False,
                     resamples=200)
    (cand,) = c.candidates
    it_row = cand.metric("iteration_time")
    assert it_row is not None and it_row.verdict == REGRESSION
    (note,) = [n for n in c.notes if n.startswith("history: left out 2 run(s) of another workload")]
    assert "small (global_batch_size 4 vs 8)" in note and "big (global_batch_size 16 vs 8)" in note
    code, out, err = _json(capsys, str(runs["cand"]), "--baseline", str(runs["base"]), "--history", "5")
    (metrics,) = [c["metrics"] for c in out["candidates"]]  # type: ignore[attr-defined]
    (it,) = [m for m in metrics if m["metric"] == "iteration_time" and m["scope"] == "run"]
    assert code == 0 and it["verdict"] == REGRESSION, err
