"""Attacks on the core's promises (issue 15, items 10-12 and 14-17): a stuck sink at close, exit and SIGTERM;
BaseException subclasses from user code; symlinks planted in the run store; unusable names; non-JSON values; many
producer threads into a slow sink; a full disk; hostile run paths printed by the CLI.

Real subprocesses, signals, files and filesystems; no mocks. Timeouts only turn a hang into a failure: nothing
asserts a wall-clock duration.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from conftest import as_default, helper_env, run_dir_of
from telemetrain import Identity, Telemetry, TelemetryWarning, cli, identity_from_env, monitor
from telemetrain.collector import collector
from telemetrain.records import Diagnostic, Event, MetricPoint, Record, SpanEnd, SpanStart, StatWindow
from telemetrain.sinks import Sink
from telemetrain.spans import tracer
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
    environ = helper_env(run_id, SESSION, TELEMETRAIN_DIR=str(tmp_path))
    environ.update(env or {})
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
    run = open_run(run_dir_of(t))
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
    assert [r.value for r in open_run(run_dir_of(t)).records("metric")] == list(range(100))


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


class ClosesWithKeyboardInterrupt(Sink):
    name = "closes-with-ki"
    background = False  # its flush and close run in a helper thread, bounded by close()'s timeout

    def write(self, records: Any) -> None:
        pass

    def close(self) -> None:
        raise KeyboardInterrupt


def test_a_keyboard_interrupt_an_inline_sinks_close_raises_in_its_helper_thread_is_contained(tmp_path: Path) -> None:
    """close() waits for an inline sink's close in a helper thread: a KeyboardInterrupt raised there is no Ctrl-C
    (that reaches the main thread's wait), yet it was raised into the caller because the check ran on the main
    thread."""
    t = Telemetry(store=tmp_path)
    t.add_sink(ClosesWithKeyboardInterrupt())
    t.metric("seq", 1, "train")
    with pytest.warns(TelemetryWarning, match="closes-with-ki"):
        try:
            t.close()
        except KeyboardInterrupt:  # (caught: a KeyboardInterrupt would end the whole test session)
            t.close()
            pytest.fail("the helper thread's KeyboardInterrupt reached the caller of close()")
    [stats] = [s for s in t.health()["sinks"] if s["sink"] == "closes-with-ki"]
    assert stats["failures"] == 1 and stats["last_error"].startswith("KeyboardInterrupt")
    assert [r.value for r in open_run(run_dir_of(t)).records("metric")] == [1]


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
    assert len(open_run(run_dir_of(t)).records("stat")) >= 3


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
    run = open_run(run_dir_of(t))
    assert [r.value for r in run.records("metric")] == list(range(100))
    [diagnostic] = run.records("diagnostic")
    assert diagnostic.name == "unencodable" and "event 'events'/'bad'" in diagnostic.message
    assert type(raised).__name__ in diagnostic.message and diagnostic.record_count == 1
    assert t.store is not None and t.store.unencodable == 1


def _json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _wait_until(predicate: Any, what: str, timeout: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


# -- 12. symbolic links planted in the run store are never followed ----------------------------------------------------


def _fixed_identity(run_id: str = "linked") -> Identity:
    return identity_from_env({}, run_id=run_id, session_tag=SESSION)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    return victim


@pytest.mark.parametrize("planted", ["rank_file_link", "rank_file_fifo", "run_json_link", "old_temp_name_link"])
def test_a_link_planted_where_a_run_file_will_be_created_is_not_followed(tmp_path: Path, planted: str) -> None:
    """The attacker knows the name the writer will create (the pid is no secret) and puts a symbolic link (or a
    FIFO) there first. The file it points at is untouched; every record is still written, to a fresh file."""
    victim = _victim(tmp_path)
    root = tmp_path / "store"
    identity = _fixed_identity()
    run_path = root / SESSION / identity.run_id
    run_path.mkdir(parents=True)
    rank_file = run_path / f"rank-0.{os.getpid()}.jsonl"
    if planted == "rank_file_link":
        rank_file.symlink_to(victim)
    elif planted == "rank_file_fifo":
        os.mkfifo(rank_file)
    elif planted == "run_json_link":
        (run_path / "run.json").symlink_to(victim)
    else:  # the temporary name run.json used to be written under first
        (run_path / f".run.json.{os.getpid()}.tmp").symlink_to(victim)
    with Telemetry(identity, store=root, config={"lr": 0.1}) as t:
        for i in range(10):
            t.metric("seq", i, "train")
    assert victim.read_text() == "precious\n"
    assert t.store is not None and t.store.path is not None
    written = t.store.path
    assert not written.is_symlink()
    if planted.startswith("rank"):  # the name was taken: the next free one
        assert written.name == f"rank-0.{os.getpid()}.1.jsonl"
    lines = _json_lines(written)
    assert lines[0]["kind"] == "process" and [line["value"] for line in lines[1:]] == list(range(10))
    if planted != "run_json_link":
        meta = run_path / "run.json"
        assert not meta.is_symlink() and json.loads(meta.read_text())["config"] == {"lr": 0.1}


@pytest.mark.parametrize("linked", ["session", "run"])
def test_a_run_directory_that_is_a_link_is_refused(tmp_path: Path, linked: str) -> None:
    """A session or run directory below the store root that is a symbolic link is refused: nothing is written
    where it points, and the refusal is a counted, warned, reported sink failure, not a crash of the program."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "store"
    identity = _fixed_identity()
    if linked == "session":
        root.mkdir()
        (root / SESSION).symlink_to(elsewhere, target_is_directory=True)
    else:
        (root / SESSION).mkdir(parents=True)
        (root / SESSION / identity.run_id).symlink_to(elsewhere, target_is_directory=True)
    t = Telemetry(identity, store=root)
    t.metric("seq", 1, "train")
    with pytest.warns(TelemetryWarning, match="symbolic link"):
        t.flush()
    t.close()
    assert list(elsewhere.iterdir()) == []
    stats = t.health()
    assert stats["failed"] == 1 and "not a real directory" in stats["sinks"][0]["last_error"]


def test_a_store_root_that_is_a_link_is_the_users_choice(tmp_path: Path) -> None:
    """The root is what the user named (store=..., TELEMETRAIN_DIR): a link there is followed."""
    real = tmp_path / "fast-disk"
    real.mkdir()
    (tmp_path / "runs").symlink_to(real, target_is_directory=True)
    with Telemetry(_fixed_identity(), store=tmp_path / "runs") as t:
        t.metric("seq", 1, "train")
    assert [r.value for r in open_run(real / SESSION / "linked").records("metric")] == [1]


def test_run_files_are_replaced_atomically_without_writing_through_a_link(tmp_path: Path) -> None:
    """``RunDir.replace_file`` (for a run.json that must change) renames a new file over the old one: a link in
    its place is replaced, the file it pointed at untouched."""
    from telemetrain.store.files import open_run_dir

    victim = _victim(tmp_path)
    root = tmp_path / "store"
    with open_run_dir(root, "s", "r") as directory:
        assert directory.create_once("run.json", b"{}\n")
        assert not directory.create_once("run.json", b'{"second": true}\n')  # never overwritten
        (root / "s" / "r" / "run.json").unlink()
        (root / "s" / "r" / "run.json").symlink_to(victim)
        assert not directory.create_once("run.json", b"{}\n")  # nor a link followed
        directory.replace_file("run.json", b'{"v": 2}\n')
    assert victim.read_text() == "precious\n"
    meta = root / "s" / "r" / "run.json"
    assert not meta.is_symlink() and json.loads(meta.read_text()) == {"v": 2}
    assert sorted(p.name for p in (root / "s" / "r").iterdir()) == ["run.json"]  # no temporary file left behind


# -- 14. names -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", ["a/b", "a\\b", "a\0b", "x" * 129, ".."], ids=["slash", "backslash", "nul", "long", "dots"]
)
@pytest.mark.parametrize("field", ["run_id", "session_tag"])
def test_a_name_that_becomes_a_directory_is_refused_at_the_call(field: str, bad: str) -> None:
    with pytest.raises(ValueError, match=f"Identity.{field}"):
        identity_from_env({}, **{field: bad})
    t = Telemetry(store=False)
    with pytest.raises(ValueError, match=f"Identity.{field}"):
        t.set_identity(None, **{field: bad})
    t.close()


@pytest.mark.parametrize("store", ["runs\0x", "y" * 256], ids=["nul", "long component"])
def test_an_unusable_store_path_is_refused_at_the_call(tmp_path: Path, store: str) -> None:
    with pytest.raises(ValueError, match="store"):
        Telemetry(store=tmp_path / store)


def test_an_overlong_run_id_from_the_environment_is_shortened_deterministically_and_stays_unique(
    tmp_path: Path,
) -> None:
    """A job scheduler's run id of 300 characters: every rank shortens it the same way (a prefix and a hash of the
    whole), two ids that differ only at the end stay two runs, and the run is written."""
    long_a, long_b = "job-" + "x" * 300 + "-a", "job-" + "x" * 300 + "-b"
    a1 = identity_from_env({"TELEMETRAIN_RUN_ID": long_a, "TELEMETRAIN_SESSION_TAG": long_a})
    a2 = identity_from_env({"TELEMETRAIN_RUN_ID": long_a, "TELEMETRAIN_SESSION_TAG": long_a})
    b = identity_from_env({"TELEMETRAIN_RUN_ID": long_b, "TELEMETRAIN_SESSION_TAG": long_b})
    assert a1.run_id == a2.run_id and a1.session_tag == a1.run_id
    assert a1.run_id != b.run_id and a1.run_id.startswith("job-xxx")
    assert len(a1.run_id.encode()) <= 128
    for identity in (a1, b):
        with Telemetry(identity, store=tmp_path) as t:
            t.metric("seq", 1, "train")
        assert [r.value for r in open_run(tmp_path / identity.session_tag / identity.run_id).records("metric")] == [1]


class Color(str, enum.Enum):
    RED = "red"


@pytest.mark.parametrize("key", [(1, 2), frozenset({"a"}), object(), 3, None], ids=lambda k: type(k).__name__)
def test_event_attribute_keys_that_are_not_strings_are_refused(tmp_path: Path, key: Any) -> None:
    """A JSON object's keys are strings: a tuple, frozenset, object (or int) key would be stored under a made-up
    text or lose the record in the writer. Refused at the call, naming the argument; a str Enum member is text."""
    from telemetrain import events

    with as_default(Telemetry(store=tmp_path)) as t:
        with pytest.raises(TypeError, match="attributes keys must be str"):
            t.event("e", {"ok": 1, key: 2})
        with pytest.raises(TypeError, match=r"event\.metadata keys must be str"):
            events.record(events.Event("e", events.EventSource.WORKER, metadata={key: 1}))
        with pytest.raises(TypeError, match="attributes keys must be str"):
            tracer(t).start("s", attributes={key: 1})
        t.event("kept", {Color.RED: 1})
    [event] = open_run(run_dir_of(t)).records("event")
    assert event.name == "kept" and event.attributes == {"red": 1}


# -- 15. every line written is valid JSON the reader loads ----------------------------------------------------------


def _refuse_constant(token: str) -> Any:
    raise AssertionError(f"bare {token} in the run store: not valid JSON")


def _all_lines_valid(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in run_dir.glob("rank-*.jsonl"):
        out += [json.loads(line, parse_constant=_refuse_constant) for line in path.read_text().splitlines()]
    return out


@pytest.mark.parametrize(
    ("event", "error", "match"),
    [
        (dict(name=float("nan")), TypeError, "event.name must be a str"),
        (dict(name=None), TypeError, "event.name must be a str"),
        (dict(name="e", metadata=[("k", 1)]), TypeError, "event.metadata must be a dict"),
        (dict(name="e", metadata="k=1"), TypeError, "event.metadata must be a dict"),
    ],
    ids=["nan name", "None name", "list metadata", "str metadata"],
)
def test_a_torchelastic_event_of_the_wrong_shape_is_refused_at_the_call(
    tmp_path: Path, event: dict[str, Any], error: type[Exception], match: str
) -> None:
    from telemetrain import events

    with as_default(Telemetry(store=tmp_path)) as t:
        with pytest.raises(error, match=match):
            events.record(events.Event(source=events.EventSource.WORKER, **event))
        events.record(events.Event("fine", events.EventSource.WORKER, metadata={"loss": float("nan")}))
    lines = _all_lines_valid(run_dir_of(t))
    assert [line["name"] for line in lines if line["kind"] == "event"] == ["fine"]
    [fine] = open_run(run_dir_of(t)).records("event")
    assert math.isnan(fine.attributes["loss"])  # NaN in a value is data


def _typed(t: Telemetry, kind: str, **changes: Any) -> Any:
    mono, wall = t.now()
    bases: dict[str, Record] = {
        "metric": MetricPoint(mono, wall, t.identity, "g", "m", 1.0, "", 3),
        "event": Event(mono, wall, t.identity, "g", "e", "info", {"k": 1}, "", ""),
        "span_start": SpanStart(mono, wall, t.identity, "g", "s", "00000000000000ab", "", "0" * 32, None),
        "span_end": SpanEnd(mono, wall, t.identity, "g", "s", "00000000000000ab", 1000, "ok", None, ""),
        "stat": StatWindow(mono, wall, t.identity, "g", "w", mono - 10, 3, {"mean": 1.0}, "s", None),
        "diagnostic": Diagnostic(mono, wall, t.identity, "g", "d", "sink", 1, "message"),
    }
    return bases[kind]._replace(**changes)


@pytest.mark.parametrize(
    ("kind", "changes", "field"),
    [
        ("span_end", {"duration_ns": float("nan")}, "duration_ns"),
        ("span_end", {"duration_ns": 1.5}, "duration_ns"),
        ("span_start", {"span_id": float("inf")}, "span_id"),
        ("span_start", {"trace_id": None}, "trace_id"),
        ("metric", {"step": float("nan")}, "step"),
        ("metric", {"value": "1.0"}, "value"),
        ("metric", {"name": float("nan")}, "name"),
        ("metric", {"mono_ns": float("inf")}, "mono_ns"),
        ("event", {"attributes": {(1,): 2}}, "attributes"),
        ("event", {"event_id": float("nan")}, "event_id"),
        ("stat", {"sample_count": float("inf")}, "sample_count"),
        ("stat", {"values": {"mean": "x"}}, "values"),
        ("diagnostic", {"record_count": float("nan")}, "record_count"),
    ],
)
def test_a_typed_record_with_a_bad_field_is_refused_by_emit_naming_it(
    tmp_path: Path, kind: str, changes: dict[str, Any], field: str
) -> None:
    with Telemetry(store=tmp_path) as t:
        with pytest.raises(TypeError, match=rf"record\.{field}\b"):
            t.emit(_typed(t, kind, **changes))
        for good in ("metric", "event", "span_start", "span_end", "stat", "diagnostic"):
            t.emit(_typed(t, good))
        t.emit(_typed(t, "metric", value=float("inf")))  # NaN and infinities as values are data
        t.emit(_typed(t, "stat", values={"mean": float("nan")}))
    lines = _all_lines_valid(run_dir_of(t))
    assert len(lines) == 1 + 6 + 2  # the header and every good record, nothing else
    run = open_run(run_dir_of(t))
    assert run.corrupt == 0 and len(run.records()) == 8


def test_the_writer_never_writes_an_invalid_line_whatever_reaches_it(tmp_path: Path) -> None:
    """The last line of defence, behind the checks at the call: a packed record with a NaN name or a float
    duration, routed directly, becomes an ``unencodable`` diagnostic line, valid JSON."""
    with Telemetry(store=tmp_path) as t:
        route = t.route("metric", "g")
        route(("metric", time.monotonic_ns(), t._token, "g", float("nan"), 1.0))
        t.route("span_end", "g")(("span_end", time.monotonic_ns(), t._token, "g", "s", 1, float("nan"), "ok", ""))
        route(("metric", time.monotonic_ns(), t._token, "g", "fine", 1.0))
    lines = _all_lines_valid(run_dir_of(t))
    assert [line["name"] for line in lines[1:]] == ["unencodable", "unencodable", "fine"]
    assert open_run(run_dir_of(t)).corrupt == 0


def test_an_integer_past_64_bits_is_refused_at_the_call_or_replaced_never_written(tmp_path: Path) -> None:
    """The reader (and the columnar copy) take 64-bit integers only: a step or duration past them was accepted,
    written, and then skipped by every reader as a corrupt line."""
    with Telemetry(store=tmp_path) as t:
        with pytest.raises(ValueError, match="step"):
            t.metric("x", 1.0, "g", step=1e30)  # type: ignore[arg-type]  # a whole float: accepted, but too big
        with pytest.raises(ValueError, match="step"):
            t.log({"x": 1.0}, step=float(2**64))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"record\.step\b"):
            t.emit(_typed(t, "metric", step=2**64))
        with pytest.raises(ValueError, match=r"record\.duration_ns\b"):
            t.emit(_typed(t, "span_end", duration_ns=-(2**63) - 1))
        t.metric("x", 1.0, "g", step=2**63)  # a plain int on the hot path is not range-checked: the encoder is
        t.metric("x", 2.0, "g", step=2**63 - 1)
    run = open_run(run_dir_of(t))
    assert run.corrupt == 0
    assert [r.step for r in run.records("metric")] == [2**63 - 1]
    [diagnostic] = run.records("diagnostic")
    assert diagnostic.name == "unencodable" and "64-bit" in diagnostic.message


# -- 16. memory stays bounded whatever the number of producer threads ----------------------------------------------

MANY_PRODUCERS = """
import json, resource, sys, threading, time, warnings
from telemetrain import Telemetry
from telemetrain.sinks import Sink

threads, per_thread, capacity = map(int, sys.argv[1:4])
warnings.simplefilter("ignore")  # the drop warning: the counts are checked below


class Slow(Sink):
    name = "slow"
    def __init__(self):
        self.received = 0
    def write(self, records):
        self.received += sum(1 for r in records if r.kind == "metric")  # not its own drop diagnostics
        time.sleep(0.05)  # a backend far slower than 8 threads can produce


t = Telemetry(store=False, queue_capacity=capacity)
sink = Slow()
t.add_sink(sink)
t.metric("warm", 0, "train")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux: the peak so far


def produce():
    metric = t.metric
    for i in range(per_thread):
        metric("seq", i, "train")


workers = [threading.Thread(target=produce) for _ in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert t.close(30)
[stats] = t.health()["sinks"]
print(json.dumps({"growth_mb": (peak - before) / 1024, "offered": threads * per_thread + 1, **stats,
                  "received": sink.received}))
"""


def test_many_producer_threads_into_a_slow_sink_stay_within_the_queue_capacity(tmp_path: Path) -> None:
    """8 threads flood a sink that takes 50 ms per batch. The queue holds 20,000 records (~3 MB): the process's peak
    RSS may grow by the queue, the batch in the sink's hands and the interpreter's slack, never by the flood (4M
    records, ~600 MB if they were kept). Drops are counted exactly. (No timing asserted.)"""
    returncode, out, err, _ = _run_script(tmp_path, MANY_PRODUCERS, 8, 500_000, 20_000)
    assert returncode == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])
    assert result["received"] == result["delivered"]
    assert result["delivered"] + result["dropped"] == result["offered"]
    assert result["dropped"] > 0
    assert result["growth_mb"] < 80, f"peak RSS grew by {result['growth_mb']:.0f} MB"


# -- issue 17: the writer keeps up with a high offered rate --------------------------------------------------------


class SlowWrites(Sink):
    """Each batch takes 50 ms of wall time (GIL released): a remote backend's round trip."""

    name = "slow-writes"

    def __init__(self) -> None:
        self.metrics = 0

    def write(self, records: Any) -> None:
        self.metrics += sum(1 for r in records if r.kind == "metric")
        time.sleep(0.05)


def test_the_writer_drains_a_filling_queue_before_its_interval_is_up() -> None:
    """40,000 records/s offered for 4 s into the default queue (100,000) of a sink whose writes take 50 ms, with a
    5 s flush interval: a writer that waits for its interval, then sleeps it again after every batch, holds 200,000
    records at its first wake-up and drops half. The writer is woken when the queue is half full and drains while a
    backlog is left, so nothing is dropped. (The producer is paced; only a stall of the whole process of over a
    second could make a record wait long enough to be dropped.)"""
    t = Telemetry(store=False, flush_interval=5.0)
    sink = SlowWrites()
    t.add_sink(sink)
    rate, total = 40_000, 160_000
    start = time.perf_counter()
    for block in range(0, total, 400):  # 10 ms of records at a time
        due = start + block / rate
        if due > time.perf_counter():
            time.sleep(due - time.perf_counter())
        for i in range(block, block + 400):
            t.metric("seq", i, "train")
    assert t.close(HANG_S)
    [stats] = t.health()["sinks"]
    assert stats["dropped"] == 0 and stats["delivered"] == sink.metrics == total


# -- 17. a full disk: a partly written batch is counted exactly ----------------------------------------------------

FILL_THE_DISK = """
import json, os, resource, signal, sys
from telemetrain import FailurePolicy, Telemetry

root, how = sys.argv[1], sys.argv[2]
if how == "rlimit":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else exceeding RLIMIT_FSIZE kills the process
# never suspended (every batch is tried), the writer drains only at flush(): one os.write per 100 records
t = Telemetry(store=root, flush_interval=3600, failure_policy=FailurePolicy(max_consecutive=10**9))
t.metric("seq", -1, "train")
assert t.flush()
if how == "rlimit":  # room for ~60 more lines
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(t.store.path) + 6_000, resource.RLIM_INFINITY))
emitted = 1
for batch in range(40):
    for i in range(100):
        t.metric("seq", emitted, "train")
        emitted += 1
    t.flush()
t.close()
[stats] = t.health()["sinks"]
print(json.dumps({"emitted": emitted, "run_dir": str(t.run_dir), **stats}))
"""


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Any:
    """A real 256 KiB tmpfs (needs root: skipped otherwise)."""
    mountpoint = tmp_path / "small"
    mountpoint.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mountpoint)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], capture_output=True)


@pytest.mark.parametrize("how", ["tmpfs", "rlimit"])
def test_a_full_disk_counts_a_partly_written_batch_exactly(tmp_path: Path, how: str, request: Any) -> None:
    """The disk fills in the middle of a batch: the records whose lines reached the file whole are delivered, only
    the rest failed; lines on disk + failed == emitted (never more: the partial batch is not counted twice)."""
    root = request.getfixturevalue("small_filesystem") if how == "tmpfs" else tmp_path / "store"
    returncode, out, err, _ = _run_script(tmp_path, FILL_THE_DISK, root, how)
    assert returncode == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])
    run = open_run(result["run_dir"])
    on_disk = len(run.records("metric"))
    assert result["failed"] > 0 and on_disk > 1, result  # the disk did fill, after some records were written
    assert result["dropped"] == 0
    assert on_disk == result["delivered"]
    assert on_disk + result["failed"] == result["emitted"], (on_disk, result)


REOPEN_AFTER_A_CUT_LINE = """
import json, os, resource, signal, sys, warnings
from telemetrain import FailurePolicy, Telemetry

warnings.simplefilter("ignore")  # the store's failure: counted, checked below
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
t = Telemetry(store=sys.argv[1], flush_interval=3600, failure_policy=FailurePolicy(max_consecutive=10**9))
t.metric("seq", 0, "train")
assert t.flush()
limit = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(t.store.path) + 250, limit[1]))
for i in range(1, 100):
    t.metric("seq", i, "train")
t.flush()  # cut mid-line by the limit (a full disk)
resource.setrlimit(resource.RLIMIT_FSIZE, limit)  # space is back
t.set_identity(perf_tag="after")  # the config's perf tag: a new header in the same file
for i in range(100, 110):
    t.metric("seq", i, "train")
assert t.close()
[stats] = t.health()["sinks"]
print(json.dumps({"run_dir": str(t.run_dir), "failed": stats["failed"]}))
"""


def test_a_file_reopened_after_a_cut_line_keeps_its_new_header(tmp_path: Path) -> None:
    """A new identity reopens the process's file (the perf tag arrives); if a full disk had cut its last line, the
    new header was glued to that line and lost with it, and the later records were read with the old identity."""
    returncode, out, err, _ = _run_script(tmp_path, REOPEN_AFTER_A_CUT_LINE, tmp_path / "store")
    assert returncode == 0, err[-3000:]
    run = open_run(json.loads(out.splitlines()[-1])["run_dir"])
    later = [r for r in run.records("metric") if r.value >= 100]
    assert [r.value for r in later] == list(range(100, 110))
    assert {r.identity.perf_tag for r in later} == {"after"}
    assert run.corrupt == 1 and run.torn == 0  # only the cut line


def test_the_run_store_records_what_a_full_disk_cost_it_once_space_is_back(tmp_path: Path) -> None:
    """A failing sink's sink_error diagnostics go to the other sinks only, so the run store, the one sink the
    readers see, never recorded the records a full disk cost it: report and show said nothing of them. Once it
    writes again it records their sum."""
    returncode, out, err, _ = _run_script(tmp_path, REOPEN_AFTER_A_CUT_LINE, tmp_path / "store")
    assert returncode == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])
    assert result["failed"] > 0
    errors = [d for d in open_run(result["run_dir"]).records("diagnostic") if d.name == "sink_error"]
    assert [(d.sink, d.record_count) for d in errors] == [("jsonl", result["failed"])]


SUSPENDED_BY_A_FULL_DISK = """
import json, os, resource, signal, sys, time, warnings
from telemetrain import FailurePolicy, Telemetry

warnings.simplefilter("ignore")  # the store's failure: counted, checked below
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
t = Telemetry(store=sys.argv[1], flush_interval=3600,
              failure_policy=FailurePolicy(max_consecutive=1, backoff_s=2.0, backoff_max_s=2.0))
t.metric("seq", 0, "train")
assert t.flush()
limit = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(t.store.path), limit[1]))  # the disk is full
t.metric("seq", 1, "train")
t.flush()  # fails: the store is suspended for 2 s
for i in range(2, 12):  # offered while it is suspended: dropped
    t.metric("seq", i, "train")
t.flush()
resource.setrlimit(resource.RLIMIT_FSIZE, limit)  # space is back
while t.health()["sinks"][0]["suspended"]:  # polls until the backoff is over and a write succeeds
    time.sleep(0.1)
    t.metric("seq", 100, "train")
    t.flush()
assert t.close()
[stats] = t.health()["sinks"]
print(json.dumps({"run_dir": str(t.run_dir), "failed": stats["failed"], "dropped": stats["dropped_suspended"]}))
"""


def test_the_run_store_records_what_it_dropped_while_suspended_by_a_full_disk(tmp_path: Path) -> None:
    """A suspended sink hears no diagnostic, so the records the run store dropped during a full disk's backoff
    were in health() and warned about but never in the store: report and show under-counted the loss."""
    returncode, out, err, _ = _run_script(tmp_path, SUSPENDED_BY_A_FULL_DISK, tmp_path / "store")
    assert returncode == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])
    assert result["failed"] == 1 and result["dropped"] >= 10
    diagnostics = open_run(result["run_dir"]).records("diagnostic")
    assert [(d.sink, d.record_count) for d in diagnostics if d.name == "sink_error"] == [("jsonl", 1)]
    assert sum(d.record_count for d in diagnostics if d.name == "dropped") == result["dropped"]


FORKED_DURING_AN_OUTAGE = """
import json, os, resource, signal, sys, warnings
from telemetrain import FailurePolicy, Telemetry

warnings.simplefilter("ignore")  # the store's failures: counted, checked below
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
t = Telemetry(store=sys.argv[1], flush_interval=3600, failure_policy=FailurePolicy(max_consecutive=10**9))
t.metric("seq", 0, "train")
assert t.flush()
limit = resource.getrlimit(resource.RLIMIT_FSIZE)


def outage(i):
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(t.store.path), limit[1]))  # the disk is full
    t.metric("seq", i, "train")
    t.flush()
    resource.setrlimit(resource.RLIMIT_FSIZE, limit)


outage(1)
t.metric("seq", 2, "train")
assert t.flush()  # written again: the first outage is over
outage(3)  # the second one is under way when a DataLoader worker forks
pid = os.fork()
if pid == 0:
    t.metric("seq", 10, "train")
    os._exit(0 if t.close() else 1)
_, status = os.waitpid(pid, 0)
assert status == 0
assert t.close()
print(json.dumps({"run_dir": str(t.run_dir), "child": pid}))
"""


def test_a_child_forked_during_a_store_outage_reports_no_loss_of_its_own(tmp_path: Path) -> None:
    """The child's counters start at zero but it inherited the parent's outage: its first write reported the
    recovery of the parent's outage as a sink_error of -1 records in the child's file."""
    returncode, out, err, _ = _run_script(tmp_path, FORKED_DURING_AN_OUTAGE, tmp_path / "store")
    assert returncode == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])
    [child] = [p for p in open_run(result["run_dir"]).processes if p.pid == result["child"]]
    assert [r.value for r in child.records if r.kind == "metric"] == [10]
    assert [(r.name, r.record_count) for r in child.records if r.kind == "diagnostic"] == []


HEADER_CUT_BY_A_FULL_DISK = """
import dataclasses, json, resource, signal, sys, warnings
from telemetrain import FailurePolicy, Telemetry, identity_from_env

warnings.simplefilter("ignore")  # the store's failure: counted, checked below
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
identity = dataclasses.replace(identity_from_env(), world_size=2)
first = Telemetry(store=sys.argv[1], identity=identity)  # rank 0 creates the run directory and run.json
first.metric("seq", 0, "train")
assert first.close()
t = Telemetry(store=sys.argv[1], identity=dataclasses.replace(identity, rank=1),
              failure_policy=FailurePolicy(max_consecutive=10**9))
limit = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (20, limit[1]))  # the disk fills while rank 1 writes its header
t.metric("seq", 1, "train")
t.flush()
resource.setrlimit(resource.RLIMIT_FSIZE, limit)  # space is back
t.metric("seq", 2, "train")
assert t.close()
print(json.dumps({"run_dir": str(t.run_dir)}))
"""


def test_a_header_cut_by_a_full_disk_is_written_again_before_the_records(tmp_path: Path) -> None:
    """The header's write failed and the file stayed open as if it had been written: the records that followed had
    no header (the cut one was the file's first line), and readers gave the process the host "unknown", no versions
    and no argv."""
    returncode, out, err, _ = _run_script(tmp_path, HEADER_CUT_BY_A_FULL_DISK, tmp_path / "store")
    assert returncode == 0, err[-3000:]
    run = open_run(json.loads(out.splitlines()[-1])["run_dir"])
    [log] = [p for p in run.processes if p.identity.rank == 1]
    assert log.identity.host == socket.gethostname()
    assert log.header["argv"] and log.header["versions"]["telemetrain"]
    assert [r.value for r in log.records if r.kind == "metric"] == [2]
    assert run.corrupt == 0 and run.torn == 0  # the cut header was taken back


AT_EXIT = """
import atexit, sys

if sys.argv[1] == "before-import":
    def last():
        import telemetrain
        telemetrain.event("job_end")

    atexit.register(last)
import telemetrain

if sys.argv[1] == "after-import":
    atexit.register(lambda: telemetrain.event("job_end"))  # before the first record, as a job's setup does
telemetrain.metric("loss", 1.0, "train")
"""


def test_a_record_from_an_atexit_handler_registered_after_the_import_is_written(tmp_path: Path) -> None:
    """telemetrain registered its exit close at the first record: an atexit handler the program registered before
    that ran after the close (atexit runs the last registered first), and its records were silently lost."""
    returncode, _, err, run = _run_script(tmp_path, AT_EXIT, "after-import")
    assert returncode == 0, err[-3000:]
    assert "TelemetryWarning" not in err
    assert [(r.kind, r.name) for r in open_run(run).records()] == [("metric", "loss"), ("event", "job_end")]


def test_a_record_emitted_after_the_exit_close_is_warned_about(tmp_path: Path) -> None:
    """A handler registered before telemetrain was imported still runs after its close: its record cannot be
    written, and that is said rather than silent."""
    returncode, _, err, run = _run_script(tmp_path, AT_EXIT, "before-import")
    assert returncode == 0, err[-3000:]
    assert "record (event, group 'events') was emitted after telemetrain closed at exit" in err
    assert [(r.kind, r.name) for r in open_run(run).records()] == [("metric", "loss")]


SUSPENDED_AT_CLOSE = """
import json, os, resource, signal, sys, warnings
from telemetrain import FailurePolicy, Telemetry

warnings.simplefilter("ignore")  # the store's failure: counted, checked below
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
t = Telemetry(store=sys.argv[1], flush_interval=3600,
              failure_policy=FailurePolicy(max_consecutive=1, backoff_s=3600, backoff_max_s=3600))
t.metric("seq", 0, "train")
assert t.flush()
limit = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(t.store.path), limit[1]))  # the disk is full
t.metric("seq", 1, "train")
t.flush()  # fails: the store is suspended for an hour
resource.setrlimit(resource.RLIMIT_FSIZE, limit)  # space is back
t.event("job_end")  # the program's last record
assert t.close()
print(json.dumps({"run_dir": str(t.run_dir), "health": t.health()["sinks"][0]}))
"""


def test_a_store_suspended_at_close_gets_a_last_try(tmp_path: Path) -> None:
    """The close drained a suspended store as any batch: the program's last records (the application's end, the
    final report) were dropped though the disk had space again, and the outage was never recorded."""
    returncode, out, err, _ = _run_script(tmp_path, SUSPENDED_AT_CLOSE, tmp_path / "store")
    assert returncode == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])
    assert result["health"]["dropped"] == 0 and result["health"]["failed"] == 1
    records = open_run(result["run_dir"]).records()
    assert [(r.kind, r.name) for r in records if r.kind != "diagnostic"] == [("metric", "seq"), ("event", "job_end")]
    assert [(d.name, d.record_count) for d in records if d.kind == "diagnostic"] == [("sink_error", 1)]


HOSTILE = "evil\x1b]0;pwned\x07\x1b[2J\rdir"  # retitle the terminal, clear it, return the cursor


def _no_control(text: str) -> None:
    assert not any(c in text for c in "\x1b\x07\r"), f"raw control characters printed: {text!r}"


@pytest.mark.parametrize(
    "argv",
    [["show", "{run}x"], ["report", "{run}x"], ["compare", "{run}", "--baseline", "{run}x"], ["goodput", "{run}x"],
     ["trace", "{run}x"]],
    ids=lambda a: a[0],
)
def test_cli_errors_print_a_hostile_run_path_escaped(tmp_path: Path, capsys: Any, argv: list[str]) -> None:
    """A run path holding terminal control sequences (a hostile name in a shared store) is printed escaped in
    every error message: the user sees ``\\x1b``, the terminal gets no escape sequence."""
    root = tmp_path / HOSTILE
    with Telemetry(_fixed_identity(), store=root) as t:
        t.metric("seq", 1, "train")
    run = str(t.run_dir)
    assert cli.main([a.format(run=run) for a in argv]) == 2
    captured = capsys.readouterr()
    _no_control(captured.out + captured.err)
    assert "telemetrain: error:" in captured.err and "\\x1b" in captured.err


def test_report_prints_a_hostile_run_path_escaped(tmp_path: Path, capsys: Any) -> None:
    root = tmp_path / HOSTILE
    with Telemetry(_fixed_identity(), store=root) as t:
        t.metric("seq", 1, "train")
    assert cli.main(["report", str(t.run_dir), "-o", str(tmp_path / "r.html")]) == 0
    captured = capsys.readouterr()
    _no_control(captured.out + captured.err)
    assert "for run" in captured.out and "\\x1b" in captured.out


# -- a fork while the writer thread opens the run's first file --------------------------------------------------------

FORK_WHILE_OPENING = """
import os, platform, sys, threading, time
from telemetrain import Telemetry

entered, release = threading.Event(), threading.Event()
real_get = platform._Processor.get


def slow_get():  # `uname -p`, held up in any thread but the main one until the parent has forked
    if threading.current_thread() is not threading.main_thread():
        entered.set()
        release.wait()
    return real_get()


platform._Processor.get = staticmethod(slow_get)
t = Telemetry(flush_interval=0.01)
t.metric("parent", 0, "train")
while not entered.is_set() and not (t.store.path and os.path.getsize(t.store.path)):
    time.sleep(0.001)  # the writer thread is inside uname -p, or opened its file without it
pid = os.fork()
if pid == 0:
    t.metric("child", 1, "train")
    os._exit(0 if t.close(10) else 3)
release.set()
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
assert t.close()
"""


def test_a_fork_while_the_writer_opens_its_first_file_leaves_the_child_able_to_write(tmp_path: Path) -> None:
    """A DataLoader worker forked as the first records are written: the writer thread read the host's platform for
    run.json then, and the child inherited the lock it held (functools.cached_property's, until Python 3.12), so the
    child's writer blocked for good and its records were lost."""
    returncode, out, err, run_dir = _run_script(tmp_path, FORK_WHILE_OPENING)
    assert returncode == 0, err[-3000:]
    assert out.split() == ["0"], "the child's close did not finish"
    names = sorted(r.name for r in open_run(run_dir).records("metric"))
    assert names == ["child", "parent"]
