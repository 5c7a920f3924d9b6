"""torch's own ``torch.distributed.elastic.metrics``/``events`` modules, used unchanged, reaching the run store through
``telemetrain.integrations.torchelastic.install``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.elastic import events as te_events
from torch.distributed.elastic import metrics as te_metrics
from torch.distributed.elastic.events import handlers as te_handlers
from torch.distributed.elastic.metrics import api as te_metrics_api

import telemetrain
from conftest import run_dir_of
from telemetrain.integrations.torchelastic import install
from telemetrain.store.reader import open_run


@pytest.fixture
def telemetry(tmp_path: Path) -> Any:
    t = telemetrain.Telemetry(store=tmp_path)
    yield t
    t.close()


def records(t: telemetrain.Telemetry, kind: str) -> list[Any]:
    t.flush()
    return open_run(run_dir_of(t)).records(kind)


def test_put_metric_and_prof_reach_the_store(telemetry: telemetrain.Telemetry) -> None:
    with install(telemetry):
        te_metrics.put_metric("batches", 3, "loader")
        te_metrics.put_metric("lr", 0.5)  # type: ignore[arg-type]  # torch's default group (torch annotates an int)

        @te_metrics.prof(group="trainer")  # type: ignore[untyped-decorator]  # (torch's: unannotated)
        def step() -> int:
            return 1

        @te_metrics.prof
        def broken() -> None:
            raise RuntimeError("boom")

        step()
        with pytest.raises(RuntimeError):
            broken()
    got = {(r.group, r.name): r for r in records(telemetry, "metric")}
    assert got[("loader", "batches")].value == 3 and got[("torchelastic", "lr")].value == 0.5
    step_key = "test_put_metric_and_prof_reach_the_store.<locals>.step"
    assert got[("trainer", f"{step_key}.success")].value == 1
    assert got[("trainer", f"{step_key}.duration.ms")].unit == "ms"
    broken_key = "test_put_metric_and_prof_reach_the_store.<locals>.broken"
    assert got[("torchelastic", f"{broken_key}.failure")].value == 1


def test_uninstall_restores_torchs_handlers(telemetry: telemetrain.Telemetry) -> None:
    before_metrics = te_metrics_api._default_metrics_handler
    before_null = te_handlers._log_handlers["null"]
    bridge = install(telemetry, rendezvous=True)
    assert te_metrics_api._default_metrics_handler is bridge.metric_handler
    assert te_handlers._log_handlers["telemetrain"] is bridge.event_handler
    bridge.uninstall()
    bridge.uninstall()  # idempotent
    assert te_metrics_api._default_metrics_handler is before_metrics
    assert te_handlers._log_handlers["null"] is before_null and "telemetrain" not in te_handlers._log_handlers
    assert isinstance(te_handlers._log_handlers["dynamic_rendezvous"], logging.NullHandler)
    te_metrics.put_metric("after", 1)
    te_events.record(te_events.Event("after", te_events.EventSource.WORKER))
    telemetry.metric("marker", 1)
    assert [r.name for r in records(telemetry, "metric")] == ["marker"]
    assert not [r for r in records(telemetry, "metric") if r.name == "after"]
    assert not [r for r in records(telemetry, "event") if r.name == "after"]


def test_events_are_structured_and_levels_cannot_drop_them(telemetry: telemetrain.Telemetry,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGLEVEL", "WARNING")  # torch's event loggers would drop INFO events
    with install(telemetry, rendezvous=True):
        meta: dict[str, te_events.EventMetadataValue] = {"state": "FAILED", "global_rank": 3,
                "metadata": '{"local_rank": [1], "role_world_size": [4], "entry_point": "train.py"}'}
        te_events.record(te_events.Event("torchelastic.worker.status.FAILED", te_events.EventSource.WORKER,
                                         metadata=meta))  # the default "null" destination
        te_events.record(te_events.Event("custom", te_events.EventSource.AGENT, timestamp=1234,
                                         metadata={"k": 1.5}), destination="telemetrain")
        te_events.construct_and_record_rdzv_event(run_id="job", message="joined",
                                                  node_state=te_events.NodeState.RUNNING, name="next_rendezvous",
                                                  rank=0)
    by_name = {e.name: e for e in records(telemetry, "event")}
    failed = by_name["torchelastic.worker.status.FAILED"]
    assert failed.group == "torchelastic" and failed.severity == "error"
    assert failed.attributes["worker.local_rank"] == 1 and failed.attributes["worker.role_world_size"] == 4
    assert failed.attributes["global_rank"] == 3 and failed.attributes["source"] == "WORKER"
    custom = by_name["custom"]
    assert custom.attributes["k"] == 1.5 and custom.attributes["timestamp_ms"] == 1234 and custom.severity == "info"
    (rdzv,) = [e for e in by_name.values() if e.group == "torchelastic.rendezvous"]
    assert rdzv.name.endswith(":next_rendezvous") and rdzv.attributes["message"] == "joined"
    assert rdzv.attributes["node_state"] == "RUNNING" and rdzv.attributes["rank"] == 0


def test_monitor_loop_metrics_are_kept_on_change_and_heartbeat(telemetry: telemetrain.Telemetry) -> None:
    with install(telemetry, heartbeat_s=3600):
        for value in [2] * 50 + [1] * 50:
            te_metrics.put_metric("workers.default.remaining_restarts", value)
            te_metrics.put_metric("LocalElasticAgent._monitor_workers.duration.ms", 7)
        for _ in range(30):
            te_metrics.put_metric("workers.default.healthy", 1)
        te_metrics.put_metric("workers.default.run_total", 1)  # not a monitor-loop metric: always kept
        te_metrics.put_metric("workers.default.run_total", 1)
    got = [(r.name, r.value) for r in records(telemetry, "metric")]
    # kept when it changes, and the held-back latest value once more at uninstall (the state at the end)
    assert [v for n, v in got if n == "workers.default.remaining_restarts"] == [2, 1, 1]
    # a duration is not kept for changing
    assert [v for n, v in got if n == "LocalElasticAgent._monitor_workers.duration.ms"] == [7, 7]
    assert [v for n, v in got if n == "workers.default.healthy"] == [1, 1]
    assert [v for n, v in got if n == "workers.default.run_total"] == [1, 1]


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")


def test_a_bridge_failure_whose_str_fails_never_reaches_torch(telemetry: telemetrain.Telemetry) -> None:
    """The once-only warning formatted the exception with ``{exc}`` inside the containment: a listener's exception
    whose str() raises reached torch's put_metric."""
    def listener(group: str, name: str, value: Any) -> None:
        raise _Unprintable()

    bridge = install(telemetry, on_metric=listener)
    try:
        with pytest.warns(telemetrain.TelemetryWarning, match="_Unprintable: <unprintable>"):
            te_metrics.put_metric("x", 1)  # must not raise
        assert bridge.metric_handler.contained.failures == 1
    finally:
        bridge.uninstall()


def test_a_failing_bridge_never_reaches_torch(telemetry: telemetrain.Telemetry) -> None:
    def listener(group: str, name: str, value: Any) -> None:
        raise RuntimeError("listener bug")

    bridge = install(telemetry, on_metric=listener)
    try:
        with pytest.warns(telemetrain.TelemetryWarning, match="torchelastic metric bridge failed"):
            te_metrics.put_metric("x", 1)  # recorded, then the listener fails: contained
        te_metrics.put_metric("y", 2)
        assert bridge.metric_handler.contained.failures == 2
        te_metrics.put_metric("bad", "not a number")  # type: ignore[arg-type]  # torch does not check; we keep it
        handler = logging.getLogger("torchelastic-events-telemetrain").handlers[-1]
        handler.emit(logging.makeLogRecord({"msg": "%s", "args": (object(),)}))  # not JSON: kept as a log line
    finally:
        bridge.uninstall()
    got = records(telemetry, "metric")
    assert [r.name for r in got] == ["x", "y"]
    by_name = {e.name: e for e in records(telemetry, "event")}
    assert by_name["non_numeric_metric"].attributes == {"name": "bad", "value": "'not a number'"}
    assert by_name["torchelastic_log"].attributes["message"].startswith("<object object")


def test_install_checks_its_arguments(telemetry: telemetrain.Telemetry) -> None:
    with pytest.raises(TypeError, match="rendezvous"):
        install(telemetry, rendezvous="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="heartbeat_s"):
        install(telemetry, heartbeat_s=-1)
    assert te_metrics_api._default_metrics_handler.__class__.__name__ == "NullMetricHandler"


def test_the_example_routes_torchs_calls_into_the_store(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[1] / "examples" / "torchelastic_bridge.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRAIN_")}
    env["TELEMETRAIN_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, str(example)], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    from telemetrain.store.reader import find_runs

    (run_dir,) = find_runs(tmp_path)
    run = open_run(run_dir)
    names = {(r.group, r.name) for r in run.records("metric")}
    assert {("trainer", "loss"), ("trainer", "__main__.train_step.success")} <= names
    assert [e.name for e in run.records("event")] == ["checkpoint.saved"]


def test_a_rendezvous_event_is_one_record_whichever_module_records_it(telemetry: telemetrain.Telemetry) -> None:
    """The launcher's agent records rendezvous events through torch's module (bridged), a program through the drop-in:
    dashboards key on one group, and the fields torch leaves empty are kept the same way by both."""
    from telemetrain import events

    fields: dict[str, Any] = {"name": "h.py:join", "run_id": "job", "message": "joined", "hostname": "host-a",
                              "pid": 7, "master_endpoint": "", "rank": None, "local_id": 2, "error_trace": ""}
    with install(telemetry, events=False, metrics=False, rendezvous=True):
        te_events.record_rdzv_event(te_events.RdzvEvent(node_state=te_events.NodeState.FAILED, **fields))
    telemetrain.set_telemetry(telemetry)  # the drop-in records on the default instance
    try:
        events.record_rdzv_event(events.RdzvEvent(node_state=events.NodeState.FAILED, **fields))
        bridged, dropped_in = [(e.group, e.name, e.severity, e.attributes) for e in records(telemetry, "event")]
    finally:
        telemetrain.reset()
    assert bridged == dropped_in
    assert bridged[:3] == ("torchelastic.rendezvous", "h.py:join", "error")
    assert bridged[3]["rank"] is None and bridged[3]["master_endpoint"] == "" and bridged[3]["node_state"] == "FAILED"
