"""Attacks on the core's promises (issue 15, items 10-12 and 14-17): a stuck sink at close, exit and SIGTERM;
BaseException subclasses from user code; symlinks planted in the run store; unusable names; non-JSON values; many
producer threads into a slow sink; a full disk; hostile run paths printed by the CLI.

Real subprocesses, signals, files and filesystems; no mocks. Timeouts only turn a hang into a failure: nothing
asserts a wall-clock duration.
"""

from __future__ import annotations

import asyncio
import datetime
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from conftest import helper_env
from telemetrain import Telemetry, TelemetryWarning, monitor
from telemetrain.collector import collector
from telemetrain.stats import Gauge
from telemetrain.store import open_run

SESSION = "adversarial"
HANG_S = 60.0  # a subprocess that has not ended by then is hung


def _run_script(
    tmp_path: Path, code: str, *args: object, sigterm: bool = False, env: dict[str, str] | None = None
) -> tuple[int | None, str, str, Path]:
    """Run ``code`` in a fresh interpreter with the run store under ``tmp_path``; it prints ``ready`` when it wants
    a SIGTERM (``sigterm=True``). Returns (exit status or None if it hung and was killed, stdout, stderr, run dir)."""
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    environ = helper_env(run_id, SESSION, TELEMETRAIN_DIR=str(tmp_path), **(env or {}))
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environ, cwd=tmp_path)
    try:
        if sigterm:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", line + (proc.stderr.read() if proc.stderr else "")
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return None, out, err, tmp_path / SESSION / run_id
    return proc.returncode, out, err, tmp_path / SESSION / run_id


# -- 10. a stuck sink never hangs close(), the exit or SIGTERM --------------------------------------------------------

STUCK = """
import signal, sys, threading
from telemetrain import Telemetry
from telemetrain.sinks import Sink

method, background, ending = sys.argv[1], sys.argv[2] == "background", sys.argv[3]


class Stuck(Sink):
    name = "stuck"

    def write(self, records):
        pass

    def handle(self, record):
        pass


def hang(self):
    threading.Event().wait()  # never returns: a backend that hangs on its last call


setattr(Stuck, method, hang)
sink = Stuck()
sink.background = background
if ending == "chained":
    def own_handler(signum, frame):  # the program's own SIGTERM handler, installed before telemetrain's
        print("own handler", flush=True)
        sys.exit(42)
    signal.signal(signal.SIGTERM, own_handler)
t = Telemetry()
t.add_sink(sink)
for i in range(100):
    t.metric("seq", i, "train")
if ending == "close":
    print("close returned", t.close(timeout=2), flush=True)
    print("health", t.health()["sinks"], flush=True)
elif ending in ("sigterm", "chained"):
    print("ready", flush=True)
    threading.Event().wait(60)  # the test sends SIGTERM; 60 s later the test has failed anyway
    print("SIGTERM did not end the process", flush=True)
sys.exit(7)
"""


@pytest.mark.parametrize(
    ("method", "background", "ending", "status"),
    [
        ("close", "background", "close", 7),
        ("close", "background", "exit", 7),
        ("close", "background", "sigterm", -signal.SIGTERM),
        ("close", "background", "chained", 42),
        ("flush", "inline", "close", 7),
        ("close", "inline", "sigterm", -signal.SIGTERM),
    ],
)
def test_a_stuck_sink_is_abandoned_and_the_process_ends_as_it_should(
    tmp_path: Path, method: str, background: str, ending: str, status: int
) -> None:
    """A sink whose close() or flush() never returns: close(timeout) returns False within its timeout, the exit
    and SIGTERM (after the program's own handler, chained) end the process with its own status, every record is in
    the run store, and so is a ``sink_abandoned`` diagnostic naming the sink."""
    returncode, out, err, run_dir = _run_script(tmp_path, STUCK, method, background, ending,
                                                sigterm=ending in ("sigterm", "chained"))
    assert returncode == status, f"exit status {returncode} (None: hung); stdout {out!r}; stderr {err[-2000:]}"
    if ending == "close":
        assert "close returned False" in out
        assert "'abandoned': True" in out
    if ending == "chained":
        assert "own handler" in out
    run = open_run(run_dir)
    assert [r.value for r in run.records("metric")] == list(range(100))
    abandoned = [r for r in run.records("diagnostic") if r.name == "sink_abandoned"]
    assert [r.sink for r in abandoned] == ["stuck"], [tuple(r) for r in run.records("diagnostic")]
    assert "TelemetryWarning" in err and "abandoned" in err


MLFLOW_HANGS_AT_THE_END = """
import os, signal, sys, threading
from pathlib import Path
from telemetrain import Telemetry
from telemetrain.sinks.mlflow import MLflowSink

uri, ending = sys.argv[1], sys.argv[2]
t = Telemetry()
sink = MLflowSink(uri, experiment_name="hang")
t.add_sink(sink)
t.metric("loss", 0.5, "train", step=1)
assert t.flush(30)  # the run exists and has its metric
# From now on the tracking store hangs: its run's meta file becomes a FIFO nobody writes to, so the final status
# update (set_terminated reads it first) blocks forever, as a tracking server that stops answering would.
[meta] = Path(uri.removeprefix("file://")).glob(f"*/{sink.run_id}/meta.yaml")
meta.unlink()
os.mkfifo(meta)
if ending == "sigterm":
    print("ready", flush=True)
    threading.Event().wait(60)
sys.exit(0)
"""


@pytest.mark.parametrize(("ending", "status"), [("exit", 0), ("sigterm", -signal.SIGTERM)])
def test_a_tracking_store_that_hangs_on_the_final_status_update_does_not_hang_the_process(
    tmp_path: Path, ending: str, status: int
) -> None:
    """MLflow's own client, its store hanging on ``set_terminated``: the exit and SIGTERM still end the process in
    their grace period, with the right status, and the abandoned sink is recorded in the run store."""
    pytest.importorskip("mlflow")
    uri = (tmp_path / "mlruns").as_uri()
    env = {"MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_DISABLE_TELEMETRY": "true"}
    returncode, _, err, run_dir = _run_script(tmp_path, MLFLOW_HANGS_AT_THE_END, uri, ending,
                                                sigterm=ending == "sigterm", env=env)
    assert returncode == status, f"exit status {returncode} (None: hung); stderr {err[-2000:]}"
    run = open_run(run_dir)
    assert [r.value for r in run.records("metric")] == [0.5]
    assert [r.sink for r in run.records("diagnostic") if r.name == "sink_abandoned"] == ["mlflow"]


# -- 11. BaseException subclasses from user code are contained ------------------------------------------------------


class CustomBaseError(BaseException):
    """Neither an Exception nor one of Python's own: a library's control-flow signal, say."""


BASE_EXCEPTIONS = [SystemExit(3), asyncio.CancelledError(), CustomBaseError("custom"), GeneratorExit()]


@pytest.mark.parametrize("raised", BASE_EXCEPTIONS, ids=lambda e: type(e).__name__)
def test_a_gauge_raising_a_base_exception_never_reaches_flush_or_close(tmp_path: Path, raised: BaseException) -> None:
    """flush() and close() read every gauge: one that raises SystemExit (or CancelledError, or any BaseException)
    is counted and warned about, and the close still writes every record."""
    t = Telemetry(store=tmp_path)

    def broken() -> float:
        raise raised

    gauge = Gauge("broken", broken, interval=None, telemetry=t)
    for i in range(1000):
        t.metric("seq", i, "train")
    with pytest.warns(TelemetryWarning, match="gauge 'broken' raised"):
        assert t.flush()
    assert t.close()
    assert gauge.errors == 2  # read at the flush and at the close
    run = open_run(t.run_dir)
    assert [r.value for r in run.records("metric") if r.name == "seq"] == list(range(1000))
    assert [r.name for r in run.records("diagnostic")] == ["gauge_error"]


def test_a_keyboard_interrupt_on_the_main_thread_propagates_and_loses_nothing(tmp_path: Path) -> None:
    """The one exception let through: KeyboardInterrupt on the main thread is the user's Ctrl-C arriving while a
    gauge runs. flush() raises it at once; close() raises it after closing the sinks, so what was queued is
    written."""
    t = Telemetry(store=tmp_path)
    Gauge("interrupted", lambda: (_ for _ in ()).throw(KeyboardInterrupt()), interval=None, telemetry=t)
    for i in range(100):
        t.metric("seq", i, "train")
    with pytest.raises(KeyboardInterrupt):
        t.flush()
    with pytest.raises(KeyboardInterrupt):
        t.close()
    assert t.close()  # done already: the sinks were closed before the interrupt was raised
    assert [r.value for r in open_run(t.run_dir).records("metric")] == list(range(100))


def test_a_keyboard_interrupt_raised_in_a_background_thread_is_contained(tmp_path: Path) -> None:
    """Off the main thread no real interrupt is ever delivered: a KeyboardInterrupt from a gauge read by the
    collector thread is a gauge failure like any other, and the collector goes on."""
    t = Telemetry(store=tmp_path)
    calls = []

    def gauge() -> float:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return float(len(calls))

    with pytest.warns(TelemetryWarning, match="gauge 'g' raised KeyboardInterrupt"):
        g = Gauge("g", gauge, interval=0.01, telemetry=t)
        _wait_until(lambda: len(calls) >= 3, "the collector to read the gauge again")
    assert g.errors == 1
    assert t.close()


GAUGE_EXITS_AT_EXIT = """
from telemetrain import Telemetry
from telemetrain.stats import Gauge

t = Telemetry(flush_interval=3600)  # the writer sleeps: all 10,000 records are still queued at exit


def exits():
    raise SystemExit(5)


Gauge("exits", exits, interval=None, telemetry=t)
for i in range(10_000):
    t.metric("seq", i, "train")
"""


def test_a_gauge_raising_system_exit_at_exit_costs_no_queued_record(tmp_path: Path) -> None:
    """At exit the close reads the gauge first: its SystemExit used to abort the close and lose every queued
    record. Now the 10,000 records are written, the failure is a diagnostic, and the exit status is the program's."""
    returncode, _, err, run_dir = _run_script(tmp_path, GAUGE_EXITS_AT_EXIT)
    assert returncode == 0, err[-2000:]
    run = open_run(run_dir)
    assert [r.value for r in run.records("metric") if r.name == "seq"] == list(range(10_000))
    assert [(r.name, r.sink) for r in run.records("diagnostic")] == [("gauge_error", "exits")]


@pytest.mark.parametrize("raised", [SystemExit(0), asyncio.CancelledError()], ids=lambda e: type(e).__name__)
def test_a_torch_monitor_handler_calling_sys_exit_does_not_kill_the_collector(tmp_path: Path,
                                                                             raised: BaseException) -> None:
    """The collector thread closes every time window of the process: a torch.monitor event handler that calls
    sys.exit while it delivers a window must not end it. Windows keep closing; the failure is counted."""
    t = Telemetry(store=tmp_path)
    seen: list[str] = []

    def handler(event: monitor.Event) -> None:
        seen.append(event.name)
        raise raised

    monitor.register_event_handler(handler, telemetry=t)
    stat = monitor.Stat("loss", [monitor.Aggregation.MEAN], datetime.timedelta(milliseconds=20), telemetry=t)
    with pytest.warns(TelemetryWarning, match="event handler raised"):
        for i in range(10_000):  # until three windows were delivered, each in a new window of the collector's
            stat.add(float(i))
            if len(seen) >= 3:
                break
            time.sleep(0.001)
    assert len(seen) >= 3, "the collector stopped closing windows after the handler's first exit"
    assert collector.running
    assert t.close()
    assert len(open_run(t.run_dir).records("stat")) >= 3


class BadRepr:
    """A value the store writes with repr(), whose repr raises a BaseException."""

    def __init__(self, raised: BaseException) -> None:
        self.raised = raised

    def __repr__(self) -> str:
        raise self.raised


@pytest.mark.parametrize("raised", BASE_EXCEPTIONS, ids=lambda e: type(e).__name__)
def test_an_attribute_whose_repr_raises_costs_one_record_not_the_batch(tmp_path: Path, raised: BaseException) -> None:
    t = Telemetry(store=tmp_path, flush_interval=3600)
    for i in range(50):
        t.metric("seq", i, "train")
    t.event("bad", {"value": BadRepr(raised)})
    for i in range(50, 100):
        t.metric("seq", i, "train")
    assert t.close()
    assert t.health()["failed"] == 0
    run = open_run(t.run_dir)
    assert [r.value for r in run.records("metric")] == list(range(100))
    [diagnostic] = run.records("diagnostic")
    assert diagnostic.name == "unencodable" and "event 'events'/'bad'" in diagnostic.message
    assert type(raised).__name__ in diagnostic.message and diagnostic.record_count == 1
    assert t.store is not None and t.store.unencodable == 1


def _wait_until(predicate: Any, what: str, timeout: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)
