"""``telemetrain show --json``: the summary's figures as strict JSON, the same by both reader paths."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from conftest import write_odd_run
from telemetrain import cli
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

ENGINES = ["python"] + (["duckdb"] if importlib.util.find_spec("duckdb") is not None else [])


def _strict(text: str) -> Any:
    def bare(literal: str) -> None:
        raise AssertionError(f"bare {literal} in the output: not JSON")

    return json.loads(text, parse_constant=bare)


def _show(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert cli.main(["show", *argv, "--json"]) == 0
    return _strict(capsys.readouterr().out)


def _trained(root: Path, run_id: str, steps: int = 40) -> Path:
    """Two ranks of a run through the training recorder: report windows every 5 iterations, a checkpoint at 20."""
    for rank in (0, 1):
        identity = telemetrain.identity_from_env({}, run_id=run_id, session_tag="sess", rank=rank, world_size=2)
        t = telemetrain.Telemetry(identity, store=root)
        recorder = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=5),
                                    telemetry=t)
        recorder.on_app_start()
        recorder.on_train_start(0)
        for step in range(steps):
            recorder.on_training_single_iteration_start()
            t.log({"loss": 2.0 / (1 + step) + rank}, step=step, group="train")
            recorder.on_training_single_iteration_end()
            if step == 19:
                recorder.on_save_checkpoint_start(step + 1)
                recorder.on_save_checkpoint_success(step + 1)
                recorder.on_save_checkpoint_end()
        recorder.on_train_end()
        recorder.on_app_end()
        assert t.close()
    return root / "sess" / run_id


@pytest.mark.parametrize("engine", ENGINES)
def test_nan_inf_problems_and_diagnostics_are_strict_json(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEMETRAIN_ENGINE", engine)
    run_dir = write_odd_run(tmp_path)
    data = _show(capsys, str(run_dir))
    assert (data["run_id"], data["session_tag"], data["ranks"], data["run_json"]) == ("odd", "s", [2], "ok")
    assert data["config"] == {"bad": "Infinity"}
    metrics = {m["name"]: m for m in data["metrics"] if m["group"] == "m"}
    assert metrics["nan"]["last"] == "NaN" and metrics["nan"]["rank"] == 2 and metrics["inf"]["last"] == "Infinity"
    assert (metrics["neg"]["last"], metrics["neg"]["step"], metrics["neg"]["count"]) == ("-Infinity", 7, 1)
    problems = data["problems"]
    assert (problems["torn_lines"], problems["corrupt_lines"], problems["diagnostics"], problems["spans_not_ok"]) == (
        1, 1, 1, 3)
    assert {"group": "training", "name": "checkpoint_save_sync", "status": "error", "count": 2, "ranks": "2"} in \
        problems["failed_spans"]
    assert problems["sink_diagnostics"] == [{"name": "sink_error", "sink": "mysink", "count": 1, "records": 3,
                                             "message": "boom"}]
    checkpoints = data["checkpoints"]
    assert (checkpoints["saves"], checkpoints["spans"], checkpoints["not_ok"]) == (1, 3, 2)
    assert checkpoints["longest"]["rank"] == 2 and checkpoints["longest"]["step"] is None
    assert data["training"] is None and data["goodput"] is None  # no training lifecycle: nothing made up


def test_a_trained_run_gives_its_figures_goodput_and_findings_the_same_by_both_readers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = _trained(tmp_path, "r1")
    shown = {}
    for engine in ENGINES:
        monkeypatch.setenv("TELEMETRAIN_ENGINE", engine)
        shown[engine] = _show(capsys, str(run_dir))
    data = shown["python"]
    assert all(other == data for other in shown.values())  # the same object, whichever reader
    assert data["ranks"] == [0, 1] and data["processes"] == 2
    training = data["training"]
    assert (training["rank"], training["ranks_reporting"], training["checkpoints_saved"]) == (0, 2, 1)
    window = training["last_window"]
    assert (window["num_iterations"], window["current_iteration"]) == (40, 39)
    assert window["samples_per_second"] > 0 and training["phase_clock"] == "host"
    loss = next(m for m in data["metrics"] if (m["group"], m["name"]) == ("train", "loss"))
    assert (loss["rank"], loss["ranks"], loss["count"], loss["step"]) == (0, 2, 80, 39)
    assert loss["last"] == pytest.approx(2.0 / 40)
    goodput = data["goodput"]
    assert goodput["session_tag"] == "sess" and 0 < goodput["goodput"] <= 1
    assert data["findings"] == []  # a clean run: nothing fires
    cli_text = capsys.readouterr()
    assert cli.main(["show", str(run_dir)]) == 0
    assert "findings    0" in capsys.readouterr().out and cli_text.err == ""


def test_list_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = _trained(tmp_path, "a1", steps=10)
    second = _trained(tmp_path, "a2", steps=15)
    listed = _show(capsys, "--list", str(tmp_path))
    assert [item["run"] for item in listed] == [str(first), str(second)]
    assert [(item["status"], item["iterations"]) for item in listed] == [("finished", 10), ("finished", 15)]
    assert all(item["duration_s"] > 0 and item["records"] > 0 for item in listed)
