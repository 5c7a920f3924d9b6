"""``telemetrain.integrations.torch_monitor``: torch's own ``torch.monitor`` (its C++ ``Stat`` and ``log_event``)
reaching the run store through the bridge."""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

monitor = pytest.importorskip("torch.monitor")

import telemetrain  # noqa: E402
from telemetrain.integrations import torch_monitor  # noqa: E402
from telemetrain.store import open_run  # noqa: E402


@pytest.fixture
def t(tmp_path: Path) -> Iterator[telemetrain.Telemetry]:
    telemetry = telemetrain.Telemetry(store=tmp_path)
    try:
        yield telemetry
    finally:
        telemetry.close()


def stored(t: telemetrain.Telemetry, kind: str) -> list[Any]:
    assert t.flush()
    assert t.run_dir is not None
    return [r for r in open_run(t.run_dir).records(kind) if r.group == "torch.monitor"]


def test_log_event_reaches_the_run_store(t: telemetrain.Telemetry) -> None:
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, 678000)
    with torch_monitor.install(t) as bridge:
        monitor.log_event(monitor.Event("epoch_done", when, {"epoch": 3, "loss": 0.25, "phase": "train"}))
    [event] = stored(t, "event")
    assert event.name == "epoch_done"
    assert event.attributes["epoch"] == 3 and event.attributes["loss"] == 0.25 and event.attributes["phase"] == "train"
    assert event.attributes["torch.monitor.timestamp"] == pytest.approx(when.timestamp(), abs=1e-6)
    assert abs(event.wall_ns - round(when.timestamp() * 1e9)) < 1000  # the record is at the event's own time
    assert bridge.events == 1 and bridge.failures == 0


def test_a_torch_stat_window_becomes_a_metric_per_aggregation(t: telemetrain.Telemetry) -> None:
    aggs = [monitor.Aggregation.MEAN, monitor.Aggregation.COUNT, monitor.Aggregation.MAX, monitor.Aggregation.SUM]
    with torch_monitor.install(t) as bridge:
        # max_samples=3: torch closes the window at the 4th add (its window closes at the next add, not on time)
        stat = monitor.Stat("step_time", aggs, datetime.timedelta(hours=1), 3)
        for value in (1.0, 2.0, 6.0, 100.0):
            stat.add(value)
    metrics = {m.name: m.value for m in stored(t, "metric")}
    assert metrics == {"step_time.mean": 3.0, "step_time.count": 3.0, "step_time.max": 6.0, "step_time.sum": 9.0}
    assert bridge.stat_windows == 1
    assert not stored(t, "event")  # the Stat's window event is not also stored as an event


def test_nan_is_stored_as_data(t: telemetrain.Telemetry) -> None:
    with torch_monitor.install(t):
        stat = monitor.Stat("loss", [monitor.Aggregation.MAX], datetime.timedelta(hours=1), 1)
        stat.add(float("nan"))
        stat.add(1.0)
        monitor.log_event(monitor.Event("probe", datetime.datetime.now(), {"value": float("nan")}))
    [metric] = stored(t, "metric")
    assert metric.name == "loss.max" and math.isnan(metric.value)
    [event] = stored(t, "event")
    assert math.isnan(event.attributes["value"])


def test_install_is_idempotent_and_remove_stops_forwarding(t: telemetrain.Telemetry) -> None:
    bridge = torch_monitor.install(t)
    assert torch_monitor.install(t) is bridge and bridge.active
    with pytest.raises(ValueError, match="remove"):
        torch_monitor.install(t, group="other")
    monitor.log_event(monitor.Event("once", datetime.datetime.now(), {}))  # one handler: recorded once
    bridge.remove()
    bridge.remove()  # a second remove does nothing
    assert not bridge.active
    monitor.log_event(monitor.Event("after_remove", datetime.datetime.now(), {}))
    assert [e.name for e in stored(t, "event")] == ["once"]
    again = torch_monitor.install(t, group="mine")
    assert again is not bridge
    monitor.log_event(monitor.Event("again", datetime.datetime.now(), {}))
    again.remove()
    assert t.flush()
    assert t.run_dir is not None
    assert [(e.group, e.name) for e in open_run(t.run_dir).records("event")] == [("torch.monitor", "once"),
                                                                               ("mine", "again")]


def test_one_bridge_per_telemetry_and_closing_removes_it(tmp_path: Path) -> None:
    a, b = telemetrain.Telemetry(store=tmp_path / "a"), telemetrain.Telemetry(store=tmp_path / "b")
    try:
        bridge_a, bridge_b = torch_monitor.install(a), torch_monitor.install(b)
        assert bridge_a is not bridge_b
        monitor.log_event(monitor.Event("both", datetime.datetime.now(), {}))
        assert [e.name for e in stored(a, "event")] == [e.name for e in stored(b, "event")] == ["both"]
        a.close()
        assert not bridge_a.active and bridge_b.active
        monitor.log_event(monitor.Event("b_only", datetime.datetime.now(), {}))
        assert [e.name for e in stored(b, "event")] == ["both", "b_only"]
    finally:
        a.close()
        b.close()
    assert not bridge_b.active


def test_the_default_telemetry(telemetry: telemetrain.Telemetry) -> None:
    with torch_monitor.install() as bridge:
        assert bridge.telemetry is telemetry
        monitor.log_event(monitor.Event("to_default", datetime.datetime.now(), {}))
    assert [e.name for e in stored(telemetry, "event")] == ["to_default"]


def test_a_failure_in_recording_never_reaches_the_caller(t: telemetrain.Telemetry,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with torch_monitor.install(t) as bridge:
        def broken(record: Any) -> None:
            raise RuntimeError("pipeline broken")

        monkeypatch.setattr(t, "emit", broken)  # (our side fails; torch.monitor is the real one)
        with pytest.warns(telemetrain.TelemetryWarning, match="could not be recorded: RuntimeError: pipeline broken"):
            monitor.log_event(monitor.Event("lost", datetime.datetime.now(), {}))
            monitor.log_event(monitor.Event("lost_too", datetime.datetime.now(), {}))  # counted, not warned again
            bridge.drain()
        assert bridge.failures == 2
        monkeypatch.undo()
        monitor.log_event(monitor.Event("recorded", datetime.datetime.now(), {}))
    assert [e.name for e in stored(t, "event")] == ["recorded"]
    t.close()
    monitor.log_event(monitor.Event("after_close", datetime.datetime.now(), {}))  # no bridge left: nothing happens


def test_events_are_recorded_without_a_flush(t: telemetrain.Telemetry) -> None:
    """The collector thread turns them into records (every 100 ms) while the program runs."""
    with torch_monitor.install(t) as bridge:
        monitor.log_event(monitor.Event("soon", datetime.datetime.now(), {}))
        deadline = time.monotonic() + 30
        while bridge.events == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bridge.events == 1


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="telemetry must be a Telemetry"):
        torch_monitor.install("t")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group must be a non-empty str"), telemetrain.Telemetry(store=False) as t:
        torch_monitor.install(t, group="")


THREADS_SCRIPT = """
import datetime, faulthandler, sys, threading
import torch.monitor as monitor
import telemetrain
from telemetrain.integrations import torch_monitor
faulthandler.dump_traceback_later(50, exit=True)  # a deadlock: a traceback and exit 1, not a hung test
t = telemetrain.Telemetry(store=sys.argv[1])
bridge = torch_monitor.install(t)
def log(i):
    for k in range(300):
        monitor.log_event(monitor.Event("tick", datetime.datetime.now(), {"thread": i, "k": k}))
threads = [threading.Thread(target=log, args=(i,)) for i in range(4)]
for th in threads:
    th.start()
for k in range(50):
    t.flush()  # draining meanwhile
for th in threads:
    th.join()
bridge.remove()
t.close()
print(bridge.events, bridge.failures)
"""


def test_threads_logging_at_once_do_not_deadlock(tmp_path: Path) -> None:
    """torch.monitor holds its lock while it calls handlers and waits for it holding the GIL: a Python handler that
    loses the GIL deadlocks the threads that log (torch 2.13). The bridge's handler is C code: it cannot."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", THREADS_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1200", "0"]
    [run] = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    ticks = [e for e in open_run(run).records("event") if e.name == "tick"]
    assert sorted((e.attributes["thread"], e.attributes["k"]) for e in ticks) == [
        (i, k) for i in range(4) for k in range(300)]


FORK_WHILE_DRAINING = """
import os, signal, sys, threading
import telemetrain
from telemetrain.integrations import torch_monitor

t = telemetrain.Telemetry(store=sys.argv[1])
bridge = torch_monitor.install(t)
entered, release = threading.Event(), threading.Event()


class SlowEvent:  # an event the collector thread is converting when the fork comes
    @property
    def name(self):
        entered.set()
        release.wait()
        return "slow"


bridge._pending.append(SlowEvent())
assert entered.wait(30), "the collector did not drain"
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a hang dies of SIGALRM
    t.flush()
    t.close()
    os._exit(0)
release.set()
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
t.close()
"""


def test_a_child_forked_while_the_collector_drains_does_not_hang(tmp_path: Path) -> None:
    """The collector drains the bridge under its lock every 100 ms: a child forked meanwhile (a DataLoader worker)
    inherited the lock held, and its flush, its close and so its exit waited for it for good."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", FORK_WHILE_DRAINING, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0"], "the child hung in flush() or close()"


def test_the_example_runs(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[1] / "examples" / "torch_monitor_bridge.py"
    proc = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "TELEMETRAIN_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step_time_ms.mean x" in proc.stdout and "epoch_end {" in proc.stdout
