"""What the run store says ended a run whose training loop was still open: the error of the spans closed at exit,
from a real subprocess -- a Ctrl-C turned into ``sys.exit(1)`` (what Lightning does) and a plain ``sys.exit(3)``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from telemetrain.analysis.findings.crashes import is_user_interrupt

_LOOP = textwrap.dedent(
    """
    import os, signal, sys, time
    from telemetrain import Telemetry
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    store, how = sys.argv[1], sys.argv[2]
    t = Telemetry(store=store)
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=2),
                           telemetry=t)
    rec.on_app_start()
    rec.on_train_start(train_iterations_start=0)
    for _ in range(4):
        rec.on_training_single_iteration_start()
        rec.on_training_single_iteration_end()
    assert t.flush()
    if how == "ctrl-c":
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
        except KeyboardInterrupt:
            sys.exit(1)  # Lightning's _call_and_handle_interrupt
    sys.exit(3)
    """
)


@pytest.mark.parametrize(("how", "returncode", "cause", "user"),
                         [("ctrl-c", 1, "the process was stopped by SIGINT", True),
                          ("exit3", 3, "the process exited on an uncaught SystemExit(3)", False)])
def test_the_spans_open_at_exit_say_what_ended_the_process(tmp_path: Path, how: str, returncode: int, cause: str,
                                                           user: bool) -> None:
    """Both said "still open when telemetry closed (exit or signal)": a Ctrl-C under Lightning was not told from a
    crash, and a failing exit code was not named."""
    proc = subprocess.run([sys.executable, "-c", _LOOP, str(tmp_path), how], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == returncode, proc.stderr[-2000:]
    ends = [json.loads(line) for f in tmp_path.rglob("*.jsonl") for line in f.read_text().splitlines()]
    errors = {r["name"]: r.get("error") for r in ends if r["kind"] == "span_end" and r["status"] == "terminated"}
    assert set(errors) == {"application", "training_loop"}
    for error in errors.values():
        assert error == f"still open when telemetry closed: {cause}"
        assert is_user_interrupt(error) is user
