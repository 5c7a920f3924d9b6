"""A SIGTERM handler the program installs after telemetrain's (``signal.signal`` once a Telemetry runs: the user's,
Lightning's, torchelastic's): the run's end must still be recorded -- the store flushed, the MLflow run ended with the
right status, the spans closed -- whatever that handler does, and the handler must still be the program's. Real
subprocesses, a real MLflow file store."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

_PROGRAM = textwrap.dedent(
    """
    import os, signal, sys, time
    import telemetrain
    from telemetrain.sinks.mlflow import MLflowSink
    from telemetrain.spans import tracer

    uri, store, how = sys.argv[1], sys.argv[2], sys.argv[3]
    t = telemetrain.Telemetry(store=store)
    t.add_sink(MLflowSink(uri, experiment_name="user", run_name=how))
    stop = []

    def handler(signum, frame):
        if how == "exit1":
            sys.exit(1)
        if how == "redeliver":  # die of it, as the default action would
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        stop.append(signum)  # "flag": a graceful stop, the loop ends cleanly

    with tracer(t).span("work"):
        t.metric("loss", 0.5, "train", step=1)
        assert t.flush()  # the MLflow run exists; our handlers are installed
        old = signal.signal(signal.SIGTERM, handler)
        assert signal.getsignal(signal.SIGTERM) is handler  # still the program's handler
        assert signal.signal(signal.SIGTERM, old) is handler and signal.getsignal(signal.SIGTERM) is old
        signal.signal(signal.SIGTERM, handler)
        t.metric("loss", 0.25, "train", step=2)  # not flushed
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(3000):
            if stop:
                break
            time.sleep(0.01)
    """
)


@pytest.mark.parametrize(("how", "returncode", "status", "span"),
                         [("exit1", 1, "KILLED", "error"), ("redeliver", -15, "KILLED", "terminated"),
                          ("flag", 0, "KILLED", "ok")])
def test_a_handler_installed_after_ours_still_gets_the_run_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, returncode: int, status: str, span: str) -> None:
    """Ours never ran: a handler that reset SIG_DFL and re-raised the signal lost the records not yet flushed (the
    second loss, the span) and left the MLflow run RUNNING; one that called ``sys.exit(1)`` ended it FAILED, as a
    crash, though a SIGTERM stopped it. A handler that only sets a flag, the loop then ending cleanly (a graceful
    preemption: save and exit 0), ends it KILLED too: a SIGTERM received decides, whatever the exit (the rule of
    ``process_hooks.ending``, as for Lightning's ``SIGTERMException``); its spans, which nothing failed, end ok."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    uri, store = (tmp_path / "mlruns").as_uri(), tmp_path / "store"
    proc = subprocess.run([sys.executable, "-c", _PROGRAM, uri, str(store), how], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == returncode, proc.stderr[-2000:]
    records = [json.loads(line) for f in store.rglob("*.jsonl") for line in f.read_text().splitlines()]
    assert [r["value"] for r in records if r["kind"] == "metric" and r["name"] == "loss"] == [0.5, 0.25]
    assert [r["status"] for r in records if r["kind"] == "span_end" and r["name"] == "work"] == [span]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("user")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == status
    assert [m.value for m in client.get_metric_history(run.info.run_id, "train/loss")] == [0.5, 0.25]
