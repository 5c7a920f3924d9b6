"""Which ``Telemetry`` the module-level APIs write to: the README's native-API program writes one run, and a split of a
program's records between two instances is never silent (issue 15, item 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import telemetrain
from conftest import IDENTITY_ENV, run_dir_of
from telemetrain import TelemetryWarning, training
from telemetrain.stats import Stat
from telemetrain.store import find_runs, open_run
from telemetrain.telemetry import _default

# The README's native-API program, as a newcomer writes it: one explicit Telemetry, then the module-level APIs.
README_PROGRAM = """
import json, sys
import telemetrain
from telemetrain import events, metrics, training
from telemetrain.spans import span
from telemetrain.stats import Stat

t = telemetrain.Telemetry(store="runs", config={"lr": 3e-4})
t.metric("val.loss", 1.23, "eval", unit="1", step=100)
t.event("checkpoint.saved", {"path": "ckpt.pt"}, severity="info")
training.configure(training.TrainingTelemetryConfig(global_batch_size_or_fn=64, seq_length_or_fn=512,
                                                    log_every_n_train_iterations=2))
step_time = Stat("train.step_time", ["mean", "p50", "p99", "max"], samples=2, unit="s")
with training.application(), training.training_loop(train_iterations_start=0):
    for step in range(4):
        with training.training_iteration():
            with step_time.time():
                with training.forward(): pass
                with training.backward(): pass
                with span("my_custom_phase", step=step): pass
        if step == 2:
            with training.checkpoint_save(global_step=step, path="ckpt.pt"):
                with open("ckpt.pt", "w") as fh: fh.write("state")
metrics.put_metric("batches", 4, "loader")
events.record(events.Event(name="done", source=events.EventSource.WORKER))
t.close()
print(json.dumps({"run_dir": str(t.run_dir), "default_is_t": telemetrain.get_telemetry() is t}))
"""


def test_the_readme_program_writes_exactly_one_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in IDENTITY_ENV}
    env["PYTHONWARNINGS"] = "always"  # any warning would show on stderr
    proc = subprocess.run([sys.executable, "-c", README_PROGRAM], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["default_is_t"] is True
    assert find_runs(tmp_path) == [Path(out["run_dir"])]  # not a second one in ./telemetrain-runs
    assert not (tmp_path / "telemetrain-runs").exists()
    run = open_run(out["run_dir"])
    assert run.meta["config"] == {"lr": 3e-4}
    names = {(r.kind, r.name) for r in run.records()}
    for expected in [("metric", "val.loss"), ("event", "checkpoint.saved"),
                     ("event", "update_training_telemetry_config"), ("span_end", "application"),
                     ("span_end", "checkpoint_save_sync"), ("span_end", "my_custom_phase"), ("stat", "train.step_time"),
                     ("event", "training_metrics_update"), ("metric", "batches"), ("event", "done")]:
        assert expected in names


def test_the_first_open_instance_becomes_the_default_when_needed(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=tmp_path)
    try:
        assert _default.telemetry is None  # creating it changed nothing global
        stat = Stat("s", ["mean"], samples=1)
        stat.add(1.0)
        assert telemetrain.get_telemetry() is t
        assert t.flush()
        assert [r.name for r in open_run(run_dir_of(t)).records()] == ["s"]
    finally:
        telemetrain.reset()
    assert t.closed


def test_default_false_is_never_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEMETRAIN_STORE", "0")
    mine = telemetrain.Telemetry(store=tmp_path, default=False)
    try:
        assert telemetrain.get_telemetry() is not mine
    finally:
        telemetrain.reset()
        mine.close()


def test_default_true_installs_at_once_and_a_closed_default_is_replaced_quietly(tmp_path: Path) -> None:
    first = telemetrain.Telemetry(store=tmp_path / "a", default=True)
    try:
        assert telemetrain.get_telemetry() is first
        telemetrain.metric("x", 1)
        first.close()
        with warnings.catch_warnings():
            warnings.simplefilter("error", TelemetryWarning)  # the first one is closed: nothing is split
            second = telemetrain.Telemetry(store=tmp_path / "b")
        assert telemetrain.get_telemetry() is second
    finally:
        telemetrain.reset()


def test_default_true_over_a_default_in_use_warns(tmp_path: Path) -> None:
    first = telemetrain.Telemetry(store=tmp_path / "a")
    try:
        training.get_recorder()  # adopts first and binds a recorder to it
        assert telemetrain.get_telemetry() is first
        with pytest.warns(TelemetryWarning, match="replaces the default instance, which is open and already in use"):
            second = telemetrain.Telemetry(store=tmp_path / "b", default=True)
        assert telemetrain.get_telemetry() is second
    finally:
        telemetrain.reset()
        first.close()


def test_an_instance_made_after_module_level_calls_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEMETRAIN_DIR", str(tmp_path / "env"))
    implicit = telemetrain.get_telemetry()  # what `metrics.put_metric(...)` at import time of some module does
    try:
        with pytest.warns(TelemetryWarning, match="built from the environment by an earlier module-level call") as w:
            mine = telemetrain.Telemetry(store=tmp_path / "mine")
        assert str(tmp_path / "env") in str(w[0].message) and "default=True" in str(w[0].message)
        assert w[0].filename == __file__  # points at the line that made the second instance
        assert telemetrain.get_telemetry() is implicit  # unchanged: the warning says where records go
        mine.close()
    finally:
        telemetrain.reset()


def test_a_second_instance_after_the_first_was_adopted_warns(tmp_path: Path) -> None:
    first = telemetrain.Telemetry(store=tmp_path / "a")
    try:
        telemetrain.metric("x", 1)  # adopts first
        assert telemetrain.get_telemetry() is first
        with pytest.warns(TelemetryWarning, match="is the first Telemetry this program created"):
            second = telemetrain.Telemetry(store=tmp_path / "b")
        second.close()
        with warnings.catch_warnings():
            warnings.simplefilter("error", TelemetryWarning)
            telemetrain.Telemetry(store=tmp_path / "c", default=False).close()  # on purpose: no warning
    finally:
        telemetrain.reset()


def test_two_open_instances_and_a_module_level_call_warn(tmp_path: Path) -> None:
    a = telemetrain.Telemetry(store=tmp_path / "a")
    b = telemetrain.Telemetry(store=tmp_path / "b")
    try:
        with pytest.warns(TelemetryWarning, match="2 Telemetry instances are open and none is the default"):
            telemetrain.metric("x", 1)
        assert telemetrain.get_telemetry() is a  # the first created
        b.close()
    finally:
        telemetrain.reset()


def test_default_argument_is_checked() -> None:
    with pytest.raises(TypeError, match="default must be True, False or None"):
        telemetrain.Telemetry(store=False, default="yes")  # type: ignore[arg-type]
