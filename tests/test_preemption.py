"""A preempted job: SIGTERM received, then an exit of the program's own (a handler's ``sys.exit``, Lightning's
``SIGTERMException``, a ``SystemExit(0)``). Every reader says it was killed, as it says of a process the signal
killed: MLflow (a real file store) KILLED, the spans the exit went through ``stopped by SIGTERM``, goodput and
``show --list`` killed, the findings no crash. Real subprocesses; a real Lightning Trainer on CPU."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from telemetrain.analysis.findings.crashes import is_user_interrupt
from telemetrain.report.model import build_model
from telemetrain.show_list import list_runs
from telemetrain.span_lifecycle import is_signal_kill
from telemetrain.store import open_run
from telemetrain.training.goodput import goodput

_HANDLED = textwrap.dedent(
    """
    import os, signal, sys
    import telemetrain
    from telemetrain.spans import span
    from telemetrain.sinks.mlflow import MLflowSink
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    store, uri, code = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t = telemetrain.Telemetry(store=store)
    t.add_sink(MLflowSink(uri, experiment_name="preempt"))
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=2),
                           telemetry=t)
    rec.on_app_start()
    rec.on_train_start(train_iterations_start=0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(code))  # a preemption handler: save, then exit
    for i in range(6):
        rec.on_training_single_iteration_start()
        with span("step_body", telemetry=t):
            if i == 4:
                os.kill(os.getpid(), signal.SIGTERM)
        rec.on_training_single_iteration_end()
    """
)


def _mlflow_status(uri: str, experiment: str) -> str:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == experiment]
    (run,) = client.search_runs([exp.experiment_id])
    return str(run.info.status)


def _readers_say_killed(store: Path) -> None:
    (run_dir,) = {p.parent for p in store.rglob("run.json")}
    report = goodput(run_dir.parent)
    assert [r.status for r in report.runs] == ["killed"]
    out = io.StringIO()
    list_runs(str(store), out, as_json=True)  # (by SQL: span_lifecycle.END_STATUS_SQL)
    assert [r["status"] for r in json.loads(out.getvalue())] == ["killed"]
    stops = [f for f in build_model(open_run(run_dir)).findings if f.kind in ("crash", "interrupted")]
    assert stops and all("killed by SIGTERM" in f.title for f in stops), [f.title for f in stops]


@pytest.fixture
def mlflow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)


@pytest.mark.usefixtures("mlflow_env")
@pytest.mark.parametrize("code", [0, 1])
def test_an_exit_after_sigterm_reads_killed_everywhere(tmp_path: Path, code: int) -> None:
    """``sys.exit(1)`` from the handler: MLflow said KILLED but the span the exit went through said
    ``SystemExit: 1`` and goodput ``crash``; ``sys.exit(0)``: MLflow said FINISHED."""
    store, uri = tmp_path / "store", (tmp_path / "mlruns").as_uri()
    proc = subprocess.run([sys.executable, "-c", _HANDLED, str(store), uri, str(code)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "TELEMETRAIN_RUN_ID": "pre"})
    assert proc.returncode == code, proc.stderr[-2000:]
    assert _mlflow_status(uri, "preempt") == "KILLED"
    ends = [json.loads(line) for f in store.rglob("*.jsonl") for line in f.read_text().splitlines()]
    errors = {r["name"]: r.get("error", "") for r in ends if r["kind"] == "span_end" and r["status"] != "ok"}
    assert set(errors) == {"step_body", "training_single_iteration", "training_loop", "application"}
    assert errors["step_body"] == f"SystemExit: {code}; the process was stopped by SIGTERM"
    assert all(is_signal_kill(e) and not is_user_interrupt(e) for e in errors.values()), errors
    _readers_say_killed(store)


_LIGHTNING = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    import lightning.pytorch as pl
    from telemetrain import Telemetry
    from telemetrain.integrations.lightning import TelemetrainCallback
    from telemetrain.sinks.mlflow import MLflowSink

    store, uri = sys.argv[1], sys.argv[2]
    t = Telemetry(store=store)
    t.add_sink(MLflowSink(uri, experiment_name="lightning"))

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
        def training_step(self, batch, i):
            if i == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # the scheduler preempts the job
            return self.layer(batch[0]).sum()
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4)), batch_size=4)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[TelemetrainCallback(telemetry=t)])
    trainer.fit(Model(), data)
    """
)


@pytest.mark.usefixtures("mlflow_env")
def test_a_lightning_job_preempted_by_sigterm_reads_killed(tmp_path: Path) -> None:
    """Lightning's SignalConnector notes the SIGTERM and its loops raise ``SIGTERMException``, a ``SystemExit``
    with code 0: the MLflow run ended FINISHED and the training loop ``error`` (goodput: crash)."""
    store, uri = tmp_path / "store", (tmp_path / "mlruns").as_uri()
    proc = subprocess.run([sys.executable, "-c", _LIGHTNING, str(store), uri], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TELEMETRAIN_RUN_ID": "pl"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _mlflow_status(uri, "lightning") == "KILLED"
    _readers_say_killed(store)


_HF = textwrap.dedent(
    """
    import os, signal, sys
    os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch, transformers
    from telemetrain import Telemetry
    from telemetrain.integrations.hf import TelemetrainHFCallback
    from telemetrain.sinks.mlflow import MLflowSink

    store, uri, out = sys.argv[1], sys.argv[2], sys.argv[3]
    t = Telemetry(store=store)
    t.add_sink(MLflowSink(uri, experiment_name="hf"))

    class Tokens(torch.utils.data.Dataset):
        def __init__(self):
            self.ids = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(0))
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class Preempt(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # the scheduler preempts the job

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64,
                                                                 n_positions=32, bos_token_id=0, eos_token_id=0))
    args = transformers.TrainingArguments(output_dir=out, max_steps=10, per_device_train_batch_size=4,
                                          report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no")
    cb = TelemetrainHFCallback(telemetry=t)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[cb, Preempt()])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a preemption handler: save, then exit
    with cb.guard():
        trainer.train()
    """
)


@pytest.mark.usefixtures("mlflow_env")
def test_a_hugging_face_job_preempted_by_sigterm_reads_killed(tmp_path: Path) -> None:
    """The Trainer's ``guard()`` ended the open spans with ``SystemExit: 1``, the handler's exit after the SIGTERM:
    goodput and the findings said crash where MLflow said KILLED."""
    pytest.importorskip("transformers")
    store, uri = tmp_path / "store", (tmp_path / "mlruns").as_uri()
    proc = subprocess.run([sys.executable, "-c", _HF, str(store), uri, str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TELEMETRAIN_RUN_ID": "hf"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert _mlflow_status(uri, "hf") == "KILLED"
    ends = [json.loads(line) for f in store.rglob("*.jsonl") for line in f.read_text().splitlines()]
    errors = [r.get("error", "") for r in ends if r["kind"] == "span_end" and r["status"] != "ok"]
    assert errors and all(is_signal_kill(e) for e in errors), errors
    _readers_say_killed(store)


_ON_EXCEPTION = textwrap.dedent(
    """
    import os, signal, sys
    import telemetrain
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    t = telemetrain.Telemetry(store=sys.argv[1])
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=2),
                           telemetry=t)
    rec.on_app_start()
    rec.on_train_start(train_iterations_start=0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        for i in range(6):
            rec.on_training_single_iteration_start()
            if i == 4:
                os.kill(os.getpid(), signal.SIGTERM)
            rec.on_training_single_iteration_end()
    except BaseException as exc:
        rec.on_exception(exc)  # as an integration's exception hook does, before its end hooks
        rec.on_train_end()
        rec.on_app_end()
        raise
    """
)


_CONTEXTS = textwrap.dedent(
    """
    import os, signal, sys
    import telemetrain
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
    from telemetrain.training.context import TrainingContexts

    t = telemetrain.Telemetry(store=sys.argv[1])
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=2),
                           telemetry=t)
    ctx = TrainingContexts(lambda: rec)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    with ctx.application(), ctx.training_loop(0):
        for i in range(6):
            with ctx.training_iteration():
                if i == 4:
                    os.kill(os.getpid(), signal.SIGTERM)
    """
)


@pytest.mark.parametrize("script", [_ON_EXCEPTION, _CONTEXTS], ids=["on_exception", "contexts"])
def test_an_exception_hook_after_sigterm_says_the_signal(tmp_path: Path, script: str) -> None:
    """``on_exception`` (the integrations' exception hook) and the training context managers marked the open spans
    ``SystemExit: 1``: a crash to goodput, for a preempted job."""
    store = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-c", script, str(store)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TELEMETRAIN_RUN_ID": "exc"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    ends = [json.loads(line) for f in store.rglob("*.jsonl") for line in f.read_text().splitlines()]
    errors = {r["name"]: r.get("error", "") for r in ends if r["kind"] == "span_end" and r["status"] != "ok"}
    assert {"training_loop", "application"} <= set(errors), errors
    assert all(is_signal_kill(e) for e in errors.values()), errors
    (run_dir,) = {p.parent for p in store.rglob("run.json")}
    assert [r.status for r in goodput(run_dir.parent).runs] == ["killed"]
