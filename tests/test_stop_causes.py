"""Why a training process stopped, as the findings say it: a real process stopped by Ctrl-C (SIGINT: Python's own
handler raises KeyboardInterrupt), by SIGTERM (a scheduler's stop), or by an uncaught exception. Telemetry closes the
spans still open with what was ending the process, so a user's Ctrl-C is an interruption and not a crash."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from conftest import run_helper_process
from telemetrain.report.model import build_model
from telemetrain.store import open_run

_LOOP = """
import os, signal, sys
from telemetrain import Telemetry
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
t = Telemetry(store=sys.argv[1] if len(sys.argv) > 1 else {store!r})
r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=5), telemetry=t)
r.on_app_start()
r.on_train_start(0)
print("ready", flush=True)
for i in range(100):
    r.on_training_single_iteration_start()
    if i == 30:
        {stop}
    r.on_training_single_iteration_end()
"""


@pytest.mark.parametrize(("stop", "code", "severity", "title", "said"), [
    ("os.kill(os.getpid(), signal.SIGINT)", -signal.SIGINT, "warning",  # (Python dies of SIGINT after printing it)
     "interrupted: training_loop and application stopped by an interrupt (Ctrl-C) on rank(s) 0",
     "the process exited on an uncaught KeyboardInterrupt"),
    ("os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM, "error",  # a preemption: killed, as MLflow says
     "crash: training_loop and application were killed by SIGTERM (preempted?) on rank(s) 0",
     "the process was stopped by SIGTERM"),
    ("raise RuntimeError('boom')", 1, "error",
     "crash: training_loop and application ended terminated on rank(s) 0",
     "the process exited on an uncaught RuntimeError"),
], ids=["ctrl-c", "sigterm", "exception"])
def test_the_findings_tell_a_ctrl_c_from_a_crash(tmp_path: Path, stop: str, code: int, severity: str, title: str,
                                                  said: str) -> None:
    returncode, run_dir, stderr = run_helper_process(
        tmp_path, _LOOP.format(store=str(tmp_path), stop=stop), "stopped", "stopped", sigterm=False)
    assert returncode == code, stderr
    stops = [f for f in build_model(open_run(run_dir)).findings if f.kind in ("crash", "interrupted")]
    assert [(f.severity, f.title) for f in stops] == [(severity, title)]
    assert said in stops[0].detail, stops[0].detail
