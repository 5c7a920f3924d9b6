"""MLflowSink: a local file store read back with MlflowClient; a server that is down and a bad URI are contained."""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

import telemetrain
from conftest import run_dir_of
from telemetrain.hparams import log_hyperparams
from telemetrain.records import StatWindow
from telemetrain.semconv import series_key
from telemetrain.sinks.mlflow import MLflowSink, metric_key
from telemetrain.store import open_run


@pytest.fixture
def store_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this switch
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # MLflow's own usage reporting
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return (tmp_path / "mlruns").as_uri()


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, int, str]]:
    """(step, timestamp ms, repr(value)) of every value of a metric, sorted (repr: NaN compares equal to itself)."""
    return sorted((m.step, m.timestamp, repr(m.value)) for m in client.get_metric_history(run_id, key))


def health_of(t: telemetrain.Telemetry) -> dict[str, Any]:
    sinks: list[dict[str, Any]] = t.health()["sinks"]
    (s,) = [s for s in sinks if s["sink"] == "mlflow"]
    return s


def test_keys_follow_the_groups_and_stay_valid() -> None:
    assert metric_key("default", "loss") == "loss"
    assert metric_key("system", "system.cpu.utilization") == "system/system.cpu.utilization"
    assert metric_key("system.gpu.0", "hw.gpu.utilization") == "system/gpu.0/hw.gpu.utilization"
    assert metric_key("system.filesystem./data/../x", "u") == "system/filesystem./data/_/x/u"
    assert metric_key("training", "train.mfu") == "training/train.mfu"
    assert metric_key("my group", "a:b{c}") == "my group/a_b_c_"


def test_metrics_params_and_run_status_read_back(tmp_path: Path, store_uri: str) -> None:
    config = {"lr": 3e-4, "model": {"layers": 12, "act": "gelu"}, "amp": True, "note": None}
    t = telemetrain.Telemetry(store=tmp_path / "store", config=config)
    sink = MLflowSink(store_uri, experiment_name="telemetrain-test")
    t.add_sink(sink)
    t.event("update_training_telemetry_config", {"global_batch_size": 256, "seq_length": 2048}, group="training")
    for i, v in enumerate([1.5, float("nan"), float("inf"), float("-inf"), 2**40, True]):
        t.metric("loss", v, step=10 * i)
    for v in (0.25, 0.5, 0.75):
        t.metric("system.cpu.utilization", v, "system", unit="1")  # no step: the global step (50)
        t.metric("hw.gpu.utilization", v / 2, "system.gpu.0", unit="1", attributes={"hw.id": "0", "hw.type": "gpu"})
    for direction, value in (("read", 10), ("write", 30)):  # a series per attribute value
        t.metric("system.disk.io", value, "system", unit="By", attributes={"disk.io.direction": direction})
    t.metric("train.phase.duration", 0.02, "training", unit="s", step=49, attributes={"train.phase": "forward"})
    log_hyperparams({"optimizer": {"name": "adamw"}, "batch_size": 32}, telemetry=t)
    for i in range(2500):  # more than one log_batch call's worth
        t.metric("many", float(i), step=i)
    mono, wall = t.now()
    for n in range(2):
        values = {"mean": 1.5 + n, "p99": 2.5 + n}
        t.emit(StatWindow(mono + n, wall + n * 1_000_000, t.identity, "default", "latency", mono, 4, values, "s"))
    t.event("training_metrics_update", {"current_iteration": 49, "mfu": 0.38, "final": True, "peak_source": "x"},
            group="training")
    t.event("training_metrics_update", {"current_iteration": 99, "mfu": 0.4}, group="training")
    t.close()

    client = MlflowClient(store_uri)
    exp = client.get_experiment_by_name("telemetrain-test")
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_id == sink.run_id and run.info.status == "FINISHED"
    assert run.info.run_name == t.identity.run_id
    params = run.data.params
    # the run's config, flattened, as MLflow's own log_params writes values (str)
    run_config = {k: params[k] for k in ("lr", "model.layers", "model.act", "amp", "note")}
    assert run_config == {"lr": "0.0003", "model.layers": "12", "model.act": "gelu", "amp": "True", "note": "None"}
    assert params["optimizer.name"] == "adamw" and params["batch_size"] == "32"  # logged hyperparameters
    assert params["identity.run_id"] == t.identity.run_id and params["identity.rank"] == "0"
    assert params["config.global_batch_size"] == "256" and params["config.seq_length"] == "2048"

    want: dict[str, list[tuple[int, int, str]]] = {}
    global_step = 0
    for r in open_run(run_dir_of(t)).records():
        ms = r.wall_ns // 1_000_000
        if r.kind == "metric":
            global_step = max(global_step, r.step or 0)
            key = metric_key(r.group, series_key(r.name, r.attributes))
            want.setdefault(key, []).append((r.step if r.step is not None else global_step, ms, repr(float(r.value))))
        elif r.kind == "stat":
            for agg, v in r.values.items():
                want.setdefault(f"latency/{agg}", []).append((global_step, ms, repr(float(v))))
    assert sorted(run.data.metrics) == sorted(want)
    for key, points in want.items():
        assert history(client, run.info.run_id, key) == sorted(points), key
    loss = [float(v) for _, _, v in history(client, run.info.run_id, "loss")]
    assert math.isnan(loss[1]) and loss[2:4] == [math.inf, -math.inf] and loss[4] == 2.0**40
    assert [s for s, _, _ in history(client, run.info.run_id, "system/gpu.0/hw.gpu.utilization")] == [50, 50, 50]
    assert [v for _, _, v in history(client, run.info.run_id, "system/system.disk.io.write")] == ["30.0"]
    assert "training/train.phase.duration/forward" in run.data.metrics
    assert not any(key.startswith("training_metrics_update/") for key in run.data.metrics)  # no second copy


def test_attached_run_gets_the_data_and_is_left_running(tmp_path: Path, store_uri: str) -> None:
    client = MlflowClient(store_uri)
    run = client.create_run("0", run_name="mine")
    t = telemetrain.Telemetry(store=False)
    t.add_sink(MLflowSink(store_uri, run_id=run.info.run_id))
    t.metric("acc", 0.9, step=3)
    t.close()
    got = client.get_run(run.info.run_id)
    assert got.info.status == "RUNNING"  # its owner ends it
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "acc")] == [(3, 0.9)]
    assert got.data.params["identity.run_id"] == t.identity.run_id


def test_a_resumed_job_attaching_to_its_run_is_not_a_sink_failure(tmp_path: Path, store_uri: str) -> None:
    # The run an earlier attempt of the job wrote (MLFLOW_RUN_ID resumed): its identity.* params and config differ
    # from this process's. MLflow refuses to change a param, so sending them again failed a batch (counted, warned as
    # a sink failure) on every resume; they are now the first values, kept, and the change is warned about once.
    client = MlflowClient(store_uri)
    first = telemetrain.Telemetry(store=False, config={"lr": 0.2})
    first_sink = MLflowSink(store_uri, experiment_name="resume", end_run=False)
    first.add_sink(first_sink)
    first.metric("loss", 2.0, step=1)
    first.close()
    assert first_sink.run_id is not None
    t = telemetrain.Telemetry(store=False, config={"lr": 0.1, "warmup": 100})
    t.add_sink(MLflowSink(store_uri, run_id=first_sink.run_id))
    with pytest.warns(RuntimeWarning, match="identity.run_id|lr") as caught:
        t.metric("loss", 1.0, step=2)
        t.close()
    assert not [w for w in caught if "failed" in str(w.message)]
    assert health_of(t)["failures"] == 0
    params = client.get_run(first_sink.run_id).data.params
    assert params["lr"] == "0.2" and params["warmup"] == "100"  # the first value kept, the new one logged
    assert params["identity.run_id"] == first.identity.run_id
    assert [(m.step, m.value) for m in client.get_metric_history(first_sink.run_id, "loss")] == [(1, 2.0), (2, 1.0)]


def test_a_changed_config_keeps_the_first_value_and_warns_once(tmp_path: Path, store_uri: str) -> None:
    t = telemetrain.Telemetry(store=False)
    sink = MLflowSink(store_uri)
    t.add_sink(sink)
    t.event("update_training_telemetry_config", {"global_batch_size": 256}, group="training")
    assert t.flush()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.event("update_training_telemetry_config", {"global_batch_size": 512, "seq_length": 8}, group="training")
        t.metric("x", 1.0)
        assert t.flush()
    t.close()
    assert any("global_batch_size" in str(w.message) for w in caught)
    assert health_of(t)["failed"] == 0
    assert sink.run_id is not None
    params = MlflowClient(store_uri).get_run(sink.run_id).data.params
    assert params["config.global_batch_size"] == "256" and params["config.seq_length"] == "8"


def test_a_later_identity_renames_the_run_and_updates_its_tags(tmp_path: Path, store_uri: str) -> None:
    # rank 0 of a job whose world size is learned after the first record (set_identity after init_process_group)
    t = telemetrain.Telemetry(store=False)
    sink = MLflowSink(store_uri)
    t.add_sink(sink)
    t.metric("x", 1.0, step=0)
    assert t.flush()
    first = t.identity
    assert sink.run_id is not None
    assert MlflowClient(store_uri).get_run(sink.run_id).data.tags["identity.world_size"] == "1"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.set_identity(world_size=8, local_rank=0)
        t.metric("x", 2.0, step=1)
        t.close()
    assert not [w for w in caught if "mlflow" in str(w.message).lower()], [str(w.message) for w in caught]
    assert health_of(t)["failed"] == 0
    run = MlflowClient(store_uri).get_run(sink.run_id)
    assert run.info.run_name == f"{first.run_id}-rank0"  # named as a run of 8 ranks is
    assert run.data.tags["identity.world_size"] == "8" and run.data.tags["identity.rank"] == "0"
    assert run.data.params["identity.world_size"] == "1"  # MLflow params cannot change: the first value stays
    assert [m.value for m in MlflowClient(store_uri).get_metric_history(sink.run_id, "x")] == [1.0, 2.0]


def test_a_given_run_name_stays_when_the_identity_changes(tmp_path: Path, store_uri: str) -> None:
    t = telemetrain.Telemetry(store=False)
    sink = MLflowSink(store_uri, run_name="mine", tags={"team": "a"})
    t.add_sink(sink)
    t.metric("x", 1.0)
    assert t.flush()
    t.set_identity(world_size=4)
    t.metric("x", 2.0)
    t.close()
    assert sink.run_id is not None
    run = MlflowClient(store_uri).get_run(sink.run_id)
    assert run.info.run_name == "mine" and run.data.tags["team"] == "a"
    assert run.data.tags["identity.world_size"] == "4"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


@pytest.mark.parametrize("kind", ["server_down", "bad_uri"])
def test_an_unreachable_tracking_server_is_contained_and_counted(
    tmp_path: Path, store_uri: str, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail at once rather than back off for minutes
    uri = f"http://127.0.0.1:{_closed_port()}" if kind == "server_down" else "nosuchscheme://nowhere"
    t = telemetrain.Telemetry(store=tmp_path / "store")
    t.add_sink(MLflowSink(uri, experiment_name="e"))
    with pytest.warns(telemetrain.TelemetryWarning, match="sink 'mlflow' failed"):
        for i in range(3):
            t.metric("loss", float(i), step=i)  # never raises into the caller
        assert t.flush()
    s = health_of(t)
    assert s["failed"] == 3 and s["failures"] >= 1 and s["delivered"] == 0 and s["last_error"]
    t.close()
    records = open_run(run_dir_of(t)).records()
    assert [r.value for r in records if r.kind == "metric"] == [0.0, 1.0, 2.0]  # the run store got everything
    assert any(r.kind == "diagnostic" and r.name == "sink_error" and r.sink == "mlflow" for r in records)


def test_importing_without_mlflow_names_the_extra() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["mlflow"] = None  # as if the [mlflow] extra were not installed
        try:
            import telemetrain.sinks.mlflow
        except ImportError as exc:
            print(exc)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'telemetrain[mlflow]'" in proc.stdout


_ENDING = textwrap.dedent(
    """
    import os, signal, sys, time
    import telemetrain
    from telemetrain.sinks.mlflow import MLflowSink
    uri, how = sys.argv[1], sys.argv[2]
    t = telemetrain.Telemetry(store=False)
    t.add_sink(MLflowSink(uri, experiment_name="ending", run_name=how))
    t.metric("loss", 0.5, "train", step=1)
    t.flush()  # the run exists
    if how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)  # our handler closes the Telemetry, then the process dies of it
        time.sleep(30)
    if how == "sigint":
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: Python's KeyboardInterrupt, uncaught
        time.sleep(30)
    if how == "exit":  # a thread's sys.exit ends the thread alone: not how the process ended
        import threading
        thread = threading.Thread(target=sys.exit, args=(4,))
        thread.start()
        thread.join()
    if how in ("exit0", "exit3"):
        sys.exit(int(how[4:]))
    if how == "raise3":  # written out at the top level: Python hands its code to no exit hook
        raise SystemExit(3)
    if how == "exception":
        raise RuntimeError("the training job failed")
    """
)


@pytest.mark.parametrize(("how", "status", "returncode"),
                         [("exit", "FINISHED", 0), ("sigterm", "KILLED", -15), ("exception", "FAILED", 1),
                          ("sigint", "KILLED", -2), ("exit0", "FINISHED", 0), ("exit3", "FAILED", 3),
                          ("raise3", "FINISHED", 3)])
def test_the_run_ends_with_the_process_fate(tmp_path: Path, store_uri: str, how: str, status: str,
                                            returncode: int) -> None:
    """A normal exit ends the run FINISHED; dying of SIGTERM (torchelastic stopping a worker), KILLED; an uncaught
    exception or a non-zero sys.exit, FAILED; a Ctrl-C, KILLED -- so MLflow's run list tells them apart. A
    ``raise SystemExit(3)`` written out ends it FINISHED: the known limit docs/backends/mlflow.md states (if this
    changes, the doc must)."""
    proc = subprocess.run([sys.executable, "-c", _ENDING, store_uri, how], capture_output=True, text=True, timeout=60)
    assert proc.returncode == returncode, proc.stderr
    client = MlflowClient(store_uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "ending"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == how and run.info.status == status
    assert [m.value for m in client.get_metric_history(run.info.run_id, "train/loss")] == [0.5]


def test_a_batch_whose_later_request_fails_counts_only_the_rest_as_failed(tmp_path: Path, store_uri: str) -> None:
    """MLflow takes at most MAX_METRICS_PER_BATCH metrics a request: when a later request of a batch fails, the
    metrics of the earlier ones are stored, and their records are delivered, not counted as lost."""
    from mlflow.utils.validation import MAX_METRICS_PER_BATCH

    t = telemetrain.Telemetry(store=False, flush_interval=math.inf)  # one batch per flush
    sink = MLflowSink(store_uri, experiment_name="split")
    t.add_sink(sink)
    t.metric("a", 1.0, step=0)
    assert t.flush()
    # the file store keeps metric "a" as a file: "a/b" (a directory under it) is refused, a real failure
    with pytest.warns(telemetrain.TelemetryWarning, match="sink 'mlflow' failed"):
        for i in range(MAX_METRICS_PER_BATCH):
            t.metric("x", float(i), step=i)
        t.metric("a/b", 2.0, step=1)
        t.metric("y", 3.0, step=1)
        assert t.flush()
    s = health_of(t)
    client = MlflowClient(store_uri)
    stored = len(client.get_metric_history(sink.run_id or "", "x"))
    assert stored == MAX_METRICS_PER_BATCH  # the first request of the batch got through
    assert s["delivered"] == 1 + stored and s["failed"] == 2, s
    t.close()
