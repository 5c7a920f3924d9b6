"""The core: identity, the run-store codec, routing, the Telemetry object's lifecycle, the run-store reader."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from conftest import IDENTITY_ENV, as_default, run_dir_of, telemetrain_threads
from telemetrain import Diagnostic, Event, Identity, MetricPoint, SpanEnd, SpanStart, StatWindow, identity_from_env
from telemetrain.records import KINDS, Record
from telemetrain.sinks import Sink
from telemetrain.store import NotARunError, find_runs, open_run
from telemetrain.store.codec import decode_line, encode

# -- identity ----------------------------------------------------------------------------------------------------------

ELASTIC_ENV = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "GROUP_RANK": "2",
    "ROLE_NAME": "trainer",
    "TORCHELASTIC_RUN_ID": "job42",
    "TORCHELASTIC_RESTART_COUNT": "3",
}


def test_identity_from_torchelastic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in ELASTIC_ENV.items():
        monkeypatch.setenv(k, v)
    for ident in (identity_from_env(), identity_from_env(env=ELASTIC_ENV), telemetrain.Telemetry(store=False).identity):
        assert (ident.rank, ident.local_rank, ident.world_size, ident.group_rank) == (5, 1, 8, 2)
        assert ident.restart_count == 3
        assert ident.role == "trainer"
        assert ident.run_id == "job42.3"
        assert ident.session_tag == "job42"
        assert ident.pid == os.getpid()
        assert ident.host == socket.gethostname()


def test_identity_defaults_without_env() -> None:
    ident = identity_from_env(env={})
    assert (ident.rank, ident.local_rank, ident.world_size, ident.group_rank, ident.restart_count) == (0, 0, 1, 0, 0)
    assert ident.session_tag == ident.run_id  # a session of one run
    assert ident.run_id and "/" not in ident.run_id
    assert identity_from_env(env={}).run_id != identity_from_env(env={"TELEMETRAIN_RUN_ID": "x"}).run_id


def test_telemetrain_variables_override(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        **ELASTIC_ENV,
        "TELEMETRAIN_RUN_ID": "my-run",
        "TELEMETRAIN_SESSION_TAG": "my-session",
        "TELEMETRAIN_PERF_TAG": "bert-large",
    }
    ident = identity_from_env(env=env)
    assert (ident.run_id, ident.session_tag, ident.perf_tag) == ("my-run", "my-session", "bert-large")
    assert ident.rank == 5  # the torchrun variables still give the rank
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert telemetrain.Telemetry(store=False).identity == ident.replace(host=ident.host, pid=ident.pid)


def test_session_tag_sources() -> None:
    assert identity_from_env(env={"SLURM_JOB_ID": "777"}).session_tag == "slurm-777"
    both = identity_from_env(env={"SLURM_JOB_ID": "777", "TORCHELASTIC_RUN_ID": "job"})
    assert both.session_tag == "job"
    placeholder = identity_from_env(env={"TORCHELASTIC_RUN_ID": "none"})  # torchrun's default --rdzv-id
    assert placeholder.session_tag == f"none-{os.getppid()}"
    assert placeholder.run_id == f"none-{os.getppid()}.0"


def test_identity_names_are_made_safe_for_paths() -> None:
    ident = identity_from_env(env={"TORCHELASTIC_RUN_ID": "team/job 1"})
    assert "/" not in ident.run_id and "/" not in ident.session_tag
    assert ident.session_tag == "team_job_1"
    assert ident.run_id == "team_job_1.0"


def test_keyword_overrides_win() -> None:
    ident = identity_from_env(env={"RANK": "0", "WORLD_SIZE": "1", "TELEMETRAIN_RUN_ID": "r"}, rank=3, world_size=4)
    assert (ident.rank, ident.world_size, ident.run_id) == (3, 4, "r")
    assert identity_from_env(env={}, run_id="given").run_id == "given"


@pytest.mark.parametrize("name", ["RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT"])
def test_bad_integer_variable_is_named(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=name):
        identity_from_env(env={name: "abc"})
    monkeypatch.setenv(name, "1.5")
    with pytest.raises(ValueError, match=name):
        telemetrain.Telemetry(store=False)


def test_rank_outside_world_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="rank"):
        identity_from_env(env={"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="rank"):
        identity_from_env(env={}, rank=-1)
    with pytest.raises(ValueError, match="world_size"):
        identity_from_env(env={"WORLD_SIZE": "0"})
    monkeypatch.setenv("RANK", "2")  # WORLD_SIZE unset means 1
    with pytest.raises(ValueError, match="rank"):
        telemetrain.Telemetry(store=False)


def test_identity_validation() -> None:
    good = identity_from_env(env={})
    with pytest.raises(ValueError):
        good.replace(run_id="a/b")
    with pytest.raises(ValueError):
        good.replace(session_tag="..")
    with pytest.raises(TypeError):
        good.replace(rank="0")
    with pytest.raises(TypeError):
        good.replace(run_id=5)
    assert Identity.from_dict({**good.as_dict(), "unknown_field": 1}) == good


# -- codec -------------------------------------------------------------------------------------------------------------

IDENT = Identity(
    run_id="r", session_tag="s", perf_tag="p", rank=1, local_rank=1, world_size=2, host="h", pid=123, group_rank=0
)
NAN, INF = math.nan, math.inf


def same(a: Any, b: Any) -> bool:
    """Equality in which NaN equals NaN, and the type is part of the value."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


ATTRS = {
    "nan": NAN,
    "inf": INF,
    "ninf": -INF,
    "str_nan": "NaN",
    "str_inf": "Infinity",
    "nested": {"x": [NAN, 1, "NaN"]},
}

RECORDS: list[Record] = [
    MetricPoint(10, 20, IDENT, "g", "loss", 0.25, "ratio", 7),
    MetricPoint(10, 20, IDENT, "g", "count", 3),
    MetricPoint(10, 20, IDENT, "g", "nan", NAN),
    MetricPoint(10, 20, IDENT, "g", "inf", INF, "s", None),
    MetricPoint(10, 20, IDENT, "g", "ninf", -INF),
    MetricPoint(10, 20, IDENT, "g", "flag", True),
    MetricPoint(10, 20, IDENT, "system", "system.disk.io", 4096, "By", None, {"disk.io.direction": "read"}),
    MetricPoint(10, 20, IDENT, "g", "labelled", 1.5, "", 3, {"nan": NAN, "str_nan": "NaN", "flag": False, "n": 2}),
    Event(11, 21, IDENT, "events", "ckpt", "warning", dict(ATTRS), "e-1", "s-1"),
    Event(11, 21, IDENT, "events", "plain", "info", None, "", ""),
    Event(11, 21, IDENT, "events", "strings", "info", {"a": "NaN", "b": "-Infinity", "n": None, "t": True}, "", ""),
    SpanStart(12, 22, IDENT, "spans", "train.step", "sp-1", "sp-0", "tr-1", {"step": 4, "lr": NAN}),
    SpanStart(12, 22, IDENT, "spans", "root", "sp-0"),
    SpanEnd(13, 23, IDENT, "spans", "train.step", "sp-1", 123_456, "error", {"tokens": INF}, "ValueError: x"),
    SpanEnd(13, 23, IDENT, "spans", "root", "sp-0", 5),
    StatWindow(14, 24, IDENT, "stats", "step_time", 4, 3, {"mean": NAN, "max": INF, "min": -INF, "count": 3}, "s"),
    StatWindow(14, 24, IDENT, "stats", "empty", 4, 0, {}, ""),
    Diagnostic(15, 25, IDENT, "telemetrain", "sink_error", "jsonl", 3, 'RuntimeError: "quoted"\nnewline'),
]


def _reject_constant(name: str) -> Any:
    raise AssertionError(f"the line holds a bare {name}, which is not JSON")


@pytest.mark.parametrize("record", RECORDS, ids=[f"{r.kind}-{r.name}" for r in RECORDS])
def test_codec_round_trip(record: Any) -> None:
    line = encode(record)
    assert line.endswith("\n") and line.count("\n") == 1
    obj = json.loads(line, parse_constant=_reject_constant)  # strict JSON: non-finite floats are encoded
    assert obj["v"] == 2 and obj["kind"] == record.kind
    back = decode_line(line, IDENT)
    assert type(back) is type(record)
    assert same(tuple(back), tuple(record)), (back, record)
    assert back.identity is IDENT
    assert same(tuple(decode_line(line.encode(), IDENT)), tuple(record))  # bytes too


def test_every_record_kind_is_covered() -> None:
    assert {r.kind for r in RECORDS} == set(KINDS)


def test_string_nan_attribute_stays_a_string() -> None:
    for attrs in ({"a": "NaN"}, {"a": "NaN", "b": NAN}):  # without and with a real NaN beside it
        back = decode_line(encode(Event(1, 2, IDENT, "g", "n", "info", attrs)), IDENT)
        assert back.attributes["a"] == "NaN"
        assert type(back.attributes["a"]) is str
    back = decode_line(encode(Event(1, 2, IDENT, "g", "n", "info", {"b": NAN})), IDENT)
    assert math.isnan(back.attributes["b"])


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        "[1, 2]",
        '{"v": 3, "kind": "metric", "mono_ns": 1, "wall_ns": 1, "group": "g", "name": "n", "value": 1}',
        '{"v": true, "kind": "metric", "mono_ns": 1, "wall_ns": 1, "group": "g", "name": "n", "value": 1}',
        '{"v": 2, "kind": "metric", "mono_ns": 1, "wall_ns": 1, "group": "g", "name": "n", "value": 1, '
        '"attributes": [1]}',
        '{"v": 1, "kind": "bogus", "mono_ns": 1, "wall_ns": 1, "group": "g", "name": "n"}',
        '{"v": 1, "kind": "metric", "mono_ns": 1, "wall_ns": 1, "group": "g", "name": "n", "value": "lots"}',
    ],
)
def test_decode_rejects_bad_lines(line: str) -> None:
    with pytest.raises(ValueError):
        decode_line(line, IDENT)


# -- routing -----------------------------------------------------------------------------------------------------------


class ListSink(Sink):
    """Keeps what it receives. Inline unless told otherwise."""

    background = False

    def __init__(self, name: str = "list", background: bool = False) -> None:
        self.name = name
        self.background = background
        self.records: list[Any] = []
        self.closed = False

    def write(self, records: Sequence[Any]) -> None:
        self.records.extend(records)

    def close(self) -> None:
        self.closed = True

    def names(self) -> list[str]:
        return [r.name for r in self.records]


class FailingSink(ListSink):
    def write(self, records: Sequence[Any]) -> None:
        raise OSError("disk full")


@pytest.fixture
def bare() -> Any:
    """A Telemetry with no run store, not the default."""
    t = telemetrain.Telemetry(store=False)
    yield t
    t.close()


def test_sinks_get_only_their_kinds_and_groups(bare: telemetrain.Telemetry) -> None:
    events_g, metrics_any, everything = ListSink("events_g"), ListSink("metrics_any"), ListSink("everything")
    bare.add_sink(events_g, kinds=["event"], groups=["g"])
    bare.add_sink(metrics_any, kinds="metric")
    bare.add_sink(everything)
    bare.metric("m.g", 1, "g")
    bare.event("e.g", group="g")
    bare.event("e.h", group="h")
    bare.metric("m.h", 2, "h")
    assert events_g.names() == ["e.g"]
    assert metrics_any.names() == ["m.g", "m.h"]
    assert everything.names() == ["m.g", "e.g", "e.h", "m.h"]
    assert all(r.identity is bare.identity for r in everything.records)
    assert isinstance(events_g.records[0], Event) and isinstance(metrics_any.records[0], MetricPoint)


def test_listening(bare: telemetrain.Telemetry) -> None:
    assert not bare.listening("metric", "g") and not bare.listening("event", "g")
    sink = ListSink()
    attachment = bare.add_sink(sink, kinds=["event"], groups=["g"])
    assert bare.listening("event", "g")
    assert not bare.listening("event", "h")
    assert not bare.listening("metric", "g")
    bare.remove_sink(attachment)
    assert not bare.listening("event", "g")
    assert sink.closed


def test_remove_sink_stops_delivery(bare: telemetrain.Telemetry) -> None:
    kept, removed = ListSink("kept"), ListSink("removed")
    bare.add_sink(kept)
    bare.add_sink(removed)
    bare.metric("a", 1)
    bare.remove_sink(removed)
    bare.metric("b", 2)
    assert kept.names() == ["a", "b"]
    assert removed.names() == ["a"] and removed.closed
    assert removed not in bare.sinks and kept in bare.sinks


def test_mute_and_unmute(bare: telemetrain.Telemetry) -> None:
    sink = ListSink()
    bare.add_sink(sink)
    bare.mute("noisy", "other")
    assert not bare.listening("metric", "noisy") and not bare.listening("event", "other")
    assert bare.listening("metric", "fine")
    bare.metric("dropped", 1, "noisy")
    bare.event("dropped", group="other")
    bare.metric("kept", 1, "fine")
    bare.unmute("noisy")
    assert bare.listening("metric", "noisy")
    bare.metric("back", 2, "noisy")
    assert sink.names() == ["kept", "back"]
    with pytest.raises(TypeError):
        bare.mute(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        bare.mute("")


def test_sink_default_kinds_and_background_override(bare: telemetrain.Telemetry) -> None:
    class EventsOnly(ListSink):
        kinds = frozenset({"event"})

    own = EventsOnly("own")
    bare.add_sink(own)
    bare.metric("m", 1)
    bare.event("e")
    assert own.names() == ["e"]

    queued = ListSink("queued")
    bare.add_sink(queued, background=True)
    bare.metric("later", 1)
    assert "telemetrain-queued" in [th.name for th in telemetrain_threads()]
    assert bare.flush()
    assert queued.names() == ["later"]


def test_failing_sink_is_contained_and_reported(bare: telemetrain.Telemetry) -> None:
    witness = ListSink("witness")
    bare.add_sink(witness)
    bare.add_sink(FailingSink("failing"))
    with pytest.warns(telemetrain.TelemetryWarning, match="disk full"):
        bare.metric("x", 1)
    bare.metric("y", 2)
    health = bare.health()
    assert health["failed"] == 2
    (failing,) = [s for s in health["sinks"] if s["sink"] == "failing"]
    assert failing["failures"] == 2 and "disk full" in failing["last_error"]
    diagnostics = [r for r in witness.records if r.kind == "diagnostic"]
    assert [d.name for d in diagnostics] == ["sink_error", "sink_error"]
    assert diagnostics[0].sink == "failing" and "disk full" in diagnostics[0].message
    assert [r.name for r in witness.records if r.kind == "metric"] == ["x", "y"]


# -- Telemetry arguments and lifecycle ---------------------------------------------------------------------------------


def test_telemetry_argument_validation(bare: telemetrain.Telemetry) -> None:
    for capacity in (0, -1, 1.5, "10"):
        with pytest.raises(ValueError, match="queue_capacity"):
            telemetrain.Telemetry(store=False, queue_capacity=capacity)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="flush_interval"):
        telemetrain.Telemetry(store=False, flush_interval=0)
    with pytest.raises(TypeError, match="store"):
        telemetrain.Telemetry(store=123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="identity"):
        telemetrain.Telemetry("run-1", store=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sink"):
        bare.add_sink(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bogus"):
        bare.add_sink(ListSink(), kinds=["event", "bogus"])
    with pytest.raises(TypeError):
        bare.add_sink(ListSink(), groups=[""])
    assert bare.sinks == []  # nothing half-attached
    with pytest.raises(TypeError):
        telemetrain.set_telemetry("default")  # type: ignore[arg-type]


def test_emit_arguments_are_checked(bare: telemetrain.Telemetry) -> None:
    bare.add_sink(ListSink())
    with pytest.raises(TypeError, match="value"):
        bare.metric("x", "1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="group"):
        bare.metric("x", 1, 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name"):
        bare.metric("", 1)
    with pytest.raises(TypeError, match="step"):
        bare.metric("x", 1, step="3")  # type: ignore[arg-type]


def test_import_starts_no_thread_and_no_torch(tmp_path: Path) -> None:
    code = """
import json, sys, threading
before = {id(t) for t in threading.enumerate()}
import telemetrain, telemetrain.metrics, telemetrain.events
def new():
    return [t.name for t in threading.enumerate() if id(t) not in before]
out = {"after_import": new(), "torch": "torch" in sys.modules}
t = telemetrain.Telemetry(store=sys.argv[1], default=False)  # not the default: that one is built from the env
out["after_construct"] = new()
out["files_before_record"] = __import__("os").listdir(sys.argv[1])
telemetrain.metrics.put_metric("x", 1)  # the default instance: built now, no store (TELEMETRAIN_STORE=0)
out["after_default_metric"] = new()
t.metric("x", 1)
out["after_record"] = new()
t.close()
out["after_close"] = [n for n in new() if n.startswith("telemetrain-")]
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k not in IDENTITY_ENV}
    env["TELEMETRAIN_STORE"] = "0"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["after_import"] == []
    assert out["torch"] is False
    assert out["after_construct"] == []
    assert out["files_before_record"] == []
    assert out["after_default_metric"] == []
    # one writer per background sink, plus the per-process trimmer that keeps queues within their capacity
    assert sorted(out["after_record"]) == ["telemetrain-jsonl", "telemetrain-trimmer"]
    assert out["after_close"] == []


def test_thread_starts_with_the_first_record(tmp_path: Path) -> None:
    before = set(threading.enumerate())

    def started() -> list[str]:
        return [th.name for th in threading.enumerate() if th not in before and th.is_alive()]

    t = telemetrain.Telemetry(store=tmp_path)
    try:
        assert started() == []
        assert list(tmp_path.iterdir()) == []  # nothing opened either
        t.metric("x", 1)
        assert sorted(started()) == ["telemetrain-jsonl", "telemetrain-trimmer"]
        t.metric("y", 2)
        t.event("z")
        # one thread per background sink (plus the process's trimmer), not per record
        assert sorted(started()) == ["telemetrain-jsonl", "telemetrain-trimmer"]
    finally:
        assert t.close()
    assert started() == []


def test_close_is_idempotent_and_later_emits_are_ignored(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=tmp_path)
    sink = ListSink()
    t.add_sink(sink)
    t.metric("before", 1)
    assert t.close() is True
    assert t.closed
    assert t.close() is True
    t.metric("after", 1)
    t.event("after")
    t.emit(MetricPoint(1, 2, t.identity, "default", "after", 1))
    assert not t.listening("metric", "default")
    assert t.flush()
    assert sink.names() == ["before"] and sink.closed
    assert [r.name for r in open_run(run_dir_of(t)).records()] == ["before"]
    with pytest.raises(RuntimeError, match="closed"):
        t.add_sink(ListSink())
    with telemetrain.Telemetry(store=False) as ctx:
        assert not ctx.closed
    assert ctx.closed


def test_reset_makes_a_fresh_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TELEMETRAIN_DIR", str(tmp_path))
    first = telemetrain.get_telemetry()
    try:
        assert telemetrain.get_telemetry() is first
        telemetrain.metric("x", 1)
        telemetrain.flush()
        assert first.run_dir is not None and first.run_dir.is_relative_to(tmp_path)
        assert [r.name for r in open_run(first.run_dir).records()] == ["x"]
        telemetrain.reset()
        assert first.closed
        second = telemetrain.get_telemetry()
        assert second is not first and not second.closed
        mine = telemetrain.Telemetry(store=False, default=False)  # made the default below, by hand
        assert telemetrain.set_telemetry(mine) is second
        assert telemetrain.get_telemetry() is mine
        second.close()
    finally:
        telemetrain.reset()
    assert telemetrain.telemetry._default.telemetry is None


def test_default_from_env_without_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TELEMETRAIN_STORE", "off")
    try:
        t = telemetrain.get_telemetry()
        assert t.store is None and t.run_dir is None
        telemetrain.metric("x", 1)
        assert not t.listening("metric", "default")
    finally:
        telemetrain.reset()
    assert list(tmp_path.iterdir()) == []


# -- the run store -----------------------------------------------------------------------------------------------------


def _ident(pid: int, rank: int = 0, world: int = 2, run_id: str = "run-1") -> Identity:
    return Identity(
        run_id=run_id,
        session_tag="sess",
        perf_tag="perf",
        rank=rank,
        local_rank=rank,
        world_size=world,
        host="h",
        pid=pid,
    )


def test_reader_orders_processes_by_wall_time(tmp_path: Path) -> None:
    a, b = _ident(1001, rank=0), _ident(1002, rank=1)
    ta, tb = telemetrain.Telemetry(a, store=tmp_path), telemetrain.Telemetry(b, store=tmp_path)
    try:
        # each process's own monotonic clock agrees with its wall clock; the two processes interleave in wall time
        for wall, (t, ident) in zip([100, 200, 300, 400, 500], [(ta, a), (tb, b)] * 3, strict=False):
            t.emit(MetricPoint(wall + (0 if t is ta else 10_000), wall, ident, "g", f"{ident.rank}@{wall}", wall))
        tb.emit(Event(50, 50, b, "events", "1@50"))  # emitted last, earliest in time
        assert ta.flush() and tb.flush()
    finally:
        ta.close()
        tb.close()
    run = open_run(run_dir_of(ta))
    assert ta.run_dir == tb.run_dir
    assert [r.name for r in run.records()] == ["1@50", "0@100", "1@200", "0@300", "1@400", "0@500"]
    assert [r.name for r in run.records("event")] == ["1@50"]
    assert run.ranks == [0, 1]
    assert [(p.rank, p.pid) for p in run.processes] == [(0, 1001), (1, 1002)]
    assert all(r.identity == (a if r.name.startswith("0@") else b) for r in run.records())
    assert (run.run_id, run.session_tag, run.perf_tag) == ("run-1", "sess", "perf")
    assert len(run) == 6 and run.torn == 0 and run.corrupt == 0


def test_reader_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_run(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NotARunError):
        open_run(empty)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(NotARunError):
        open_run(tmp_path / "file.txt")
    assert issubclass(NotARunError, ValueError)


def test_reader_points_at_nested_runs(tmp_path: Path) -> None:
    with telemetrain.Telemetry(_ident(1), store=tmp_path) as t:
        t.metric("x", 1)
    with pytest.raises(NotARunError, match="1 run"):
        open_run(tmp_path)


def test_reader_skips_a_torn_last_line(tmp_path: Path) -> None:
    with telemetrain.Telemetry(_ident(1), store=tmp_path) as t:
        t.metric("x", 1)
        t.metric("y", 2)
    (path,) = run_dir_of(t).glob("rank-*.jsonl")
    with open(path, "a") as fh:
        fh.write('{"v":1,"kind":"metric","mono_ns":1')
    run = open_run(run_dir_of(t))
    assert [r.name for r in run.records()] == ["x", "y"]
    assert run.torn == 1 and run.corrupt == 0


def test_find_runs(tmp_path: Path) -> None:
    assert find_runs(tmp_path / "missing") == []
    assert find_runs(tmp_path) == []
    dirs: list[Path] = []
    for run_id in ("zzz-first", "aaa-second"):
        with telemetrain.Telemetry(_ident(1, run_id=run_id), store=tmp_path) as t:
            t.metric("x", 1)
        dirs.append(run_dir_of(t))
    assert find_runs(tmp_path) == dirs  # oldest first, not by name
    assert find_runs(tmp_path / "sess") == dirs
    assert find_runs(dirs[1]) == [dirs[1]]


def test_run_json_is_written_once_with_identity(tmp_path: Path) -> None:
    first = _ident(1001)
    t1 = telemetrain.Telemetry(first, store=tmp_path, config={"lr": 0.1})
    t2 = telemetrain.Telemetry(first.replace(pid=1002), store=tmp_path, config={"lr": 0.2})
    try:
        assert not (tmp_path / "sess").exists()  # nothing written before the first record
        t1.metric("a", 1)
        assert t1.flush()
        meta_path = run_dir_of(t1) / "run.json"
        written = meta_path.read_bytes()
        meta = json.loads(written)
        assert meta["format"] == "telemetrain-run" and meta["v"] == 1
        assert (meta["run_id"], meta["session_tag"], meta["perf_tag"]) == ("run-1", "sess", "perf")
        assert (meta["world_size"], meta["restart_count"]) == (2, 0)
        assert meta["created_by"] == first.as_dict()
        assert meta["config"] == {"lr": 0.1}
        t2.metric("b", 2)
        assert t2.flush()
        assert meta_path.read_bytes() == written
        assert sorted(p.name for p in run_dir_of(t1).iterdir()) == [
            "rank-0.1001.jsonl", "rank-0.1002.jsonl", "run.json"
        ]
    finally:
        t1.close()
        t2.close()
    run = open_run(run_dir_of(t1))
    assert run.meta["created_by"]["pid"] == 1001
    assert [(p.pid, [r.name for r in p.records]) for p in run.processes] == [(1001, ["a"]), (1002, ["b"])]
    assert run.processes[1].identity == first.replace(pid=1002)


def test_prof_pairs_count_as_two_records_everywhere(tmp_path: Path) -> None:
    """@prof queues success+duration as one packed pair; every count and every sink must still see two records."""
    from telemetrain import metrics

    t = telemetrain.Telemetry(store=tmp_path)
    seen: list[str] = []

    class Collect(Sink):
        name = "collect"

        def write(self, records: Any) -> None:
            seen.extend(r.name for r in records)

    t.add_sink(Collect())
    with as_default(t):

        @metrics.prof(group="p")
        def work() -> int:
            return 1

        for _ in range(10):
            work()
        assert t.flush()
        stats = {s["sink"]: s for s in t.health()["sinks"]}
        assert stats["jsonl"]["delivered"] == 20 and stats["collect"]["delivered"] == 20
    key = "test_prof_pairs_count_as_two_records_everywhere.<locals>.work"  # torchelastic's rule: the qualname
    assert seen == [f"{key}.success", f"{key}.duration.ms"] * 10
    names = [r.name for r in open_run(run_dir_of(t)).records("metric")]
    assert names == seen


def test_identity_under_slurm_without_torchrun() -> None:
    """srun starts the ranks itself: every rank of a job step must land in the same run, with its SLURM rank."""
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "8",
        "SLURM_NODEID": "2",
        "SLURM_RESTART_COUNT": "1",
    }
    ranks = [identity_from_env(env={**env, "SLURM_PROCID": str(r)}) for r in (5, 6)]
    a = ranks[0]
    assert (a.rank, a.local_rank, a.world_size, a.group_rank, a.restart_count) == (5, 1, 8, 2, 1)
    assert a.run_id == "slurm-4242.0.1" and a.session_tag == "slurm-4242"
    assert {r.run_id for r in ranks} == {a.run_id}  # the ranks agree without talking
    # torchrun inside a SLURM allocation: torchrun's variables win
    b = identity_from_env(env={**env, "RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "job", "LOCAL_RANK": "0"})
    assert (b.rank, b.world_size, b.run_id, b.session_tag) == (0, 2, "job.0", "job")


def test_identity_under_open_mpi() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}
    i = identity_from_env(env=env)
    assert (i.rank, i.local_rank, i.world_size) == (3, 1, 4)


def test_store_root_is_pinned_when_the_instance_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative root resolves against the working directory at construction: a later chdir does not move the run."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    t = telemetrain.Telemetry(identity_from_env(env={}), store="runs")
    monkeypatch.chdir(tmp_path / "b")
    try:
        t.metric("x", 1)
        assert t.flush()
    finally:
        t.close()
    assert t.run_dir is not None and t.run_dir.is_relative_to(tmp_path / "a" / "runs")
    assert open_run(t.run_dir).records()[0].name == "x"
    assert list((tmp_path / "b").iterdir()) == []


def test_a_handler_that_emits_into_its_own_group_is_not_called_again(tmp_path: Path) -> None:
    """A MetricHandler that itself calls put_metric for the group it handles: the nested value reaches the run store,
    but not the handler again (which would recurse until the stack ran out)."""
    from telemetrain import metrics

    t = telemetrain.Telemetry(identity_from_env(env={}), store=tmp_path)
    seen: list[str] = []

    class Echo(metrics.MetricHandler):
        def emit(self, metric_data: metrics.MetricData) -> None:
            seen.append(metric_data.name)
            metrics.put_metric(metric_data.name + ".echo", 1, metric_data.group_name)

    with as_default(t):
        metrics.configure(Echo(), "g")
        metrics.put_metric("x", 1, "g")
        assert t.flush()
        health = t.health()
    assert seen == ["x"]
    assert [r.name for r in open_run(run_dir_of(t)).records()] == ["x", "x.echo"]
    assert health["failed"] == 0


def test_reader_orders_records_that_carry_their_own_wall_time(tmp_path: Path) -> None:
    ident = identity_from_env(env={})
    t = telemetrain.Telemetry(ident, store=tmp_path)
    try:
        t.metric("now", 1)
        mono, wall = t.now()
        # its own times, both clocks (as every producer stamps them: the reader orders a process by mono_ns)
        t.emit(MetricPoint(mono - 10**9, wall - 10**9, ident, "g", "replayed.a.second.ago", 2))  # later in the file
        assert t.flush()
    finally:
        t.close()
    assert [r.name for r in open_run(run_dir_of(t)).records()] == ["replayed.a.second.ago", "now"]


def test_flush_after_close_is_a_harmless_no_op(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(identity_from_env(env={}), store=tmp_path)
    t.metric("x", 1)
    assert t.close()
    assert t.flush()
    t.metric("after", 2)  # recorded nowhere, raises nothing
    assert t.health()["failed"] == 0
    assert [r.name for r in open_run(run_dir_of(t)).records()] == ["x"]


def test_numpy_scalars_are_numbers(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    t = telemetrain.Telemetry(identity_from_env(env={}), store=tmp_path)
    values = [np.float32(1.5), np.float64("nan"), np.int64(3), np.uint8(7), np.bool_(True)]
    try:
        for v in values:
            t.metric("x", v)
        assert t.flush()
    finally:
        t.close()
    got = [r.value for r in open_run(run_dir_of(t)).records()]
    assert [type(v) for v in got] == [float, float, int, int, bool]
    assert got[0] == 1.5 and math.isnan(got[1]) and got[2:] == [3, 7, True]


def test_a_tensor_value_is_refused_with_a_hint_and_never_synchronised(tmp_path: Path) -> None:
    """telemetrain never calls .item() for the caller (it would synchronise a GPU): the error says what to do."""
    torch = pytest.importorskip("torch")
    t = telemetrain.Telemetry(identity_from_env(env={}), store=tmp_path)
    try:
        with pytest.raises(TypeError, match=r"value must be an int or float, got Tensor.*tensor\.item\(\)"):
            t.metric("loss", torch.tensor(0.5))
        t.metric("loss", torch.tensor(0.5).item())
        assert t.flush()
    finally:
        t.close()
    assert [r.value for r in open_run(run_dir_of(t)).records()] == [0.5]
