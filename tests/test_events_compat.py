"""``telemetrain.events`` against the real ``torch.distributed.elastic.events``, side by side."""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import logging
import os
import socket
import time
import typing
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import torch.distributed.elastic.events as tevents

import telemetrain
from conftest import ListHandler, norm_type
from telemetrain import events

# -- helpers ---------------------------------------------------------------------------------------------------------


class CollectingEventHandler(events.EventHandler):
    def __init__(self) -> None:
        self.events: list[events.Event] = []

    def record(self, event: events.Event) -> None:
        self.events.append(event)


class RaisingEventHandler(events.EventHandler):
    def record(self, event: events.Event) -> None:
        raise RuntimeError("event handler is broken")


@pytest.fixture
def destination() -> Iterator[Callable[..., str]]:
    """``destination(handler, name=None)``: register a logging destination for this test; put things back after."""
    previous: dict[str, logging.Handler | None] = {}

    def register(handler: logging.Handler, name: str | None = None) -> str:
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        if name not in previous:
            previous[name] = events._log_handlers.get(name)
        events.register_logging_handler(name, handler)
        return name

    yield register
    for name, old in previous.items():
        if old is not None:
            events.register_logging_handler(name, old)  # re-points the logger back too
        else:
            handler = events._log_handlers.pop(name, None)
            logger = events._events_loggers.pop(name, None)
            if logger is not None and handler is not None:
                logger.removeHandler(handler)


def _fields(cls: type) -> list[tuple[str, Any, Any, Any]]:
    hints = typing.get_type_hints(cls)
    return [
        (
            f.name,
            norm_type(hints[f.name]),
            f.default,
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    ]


def as_torchelastic(ev: events.Event) -> Any:
    """The same event as torchelastic's own class: what it would log."""
    return tevents.Event(ev.name, tevents.EventSource[ev.source.name], ev.timestamp, dict(ev.metadata))


def make_event(**kw: Any) -> events.Event:
    kw.setdefault("name", "torchelastic.worker.status.SUCCEEDED")
    kw.setdefault("source", events.EventSource.WORKER)
    return events.Event(**kw)


# -- shapes ----------------------------------------------------------------------------------------------------------


def test_enums_match_torchelastic() -> None:
    pairs: list[tuple[type[enum.Enum], type[enum.Enum]]] = [
        (events.EventSource, tevents.EventSource), (events.NodeState, tevents.NodeState)
    ]
    for ours, theirs in pairs:
        assert [(m.name, m.value) for m in ours] == [(m.name, m.value) for m in theirs]
        assert issubclass(ours, str)
    assert events.NodeState.FAILED == "FAILED" and events.EventSource.AGENT == "AGENT"


def test_event_fields_match_torchelastic_plus_id_and_mono_ns() -> None:
    ours, theirs = _fields(events.Event), _fields(tevents.Event)
    assert ours[: len(theirs)] == theirs
    assert [f[0] for f in ours[len(theirs) :]] == ["id", "mono_ns"]
    extra = {f.name: f for f in dataclasses.fields(events.Event)}
    assert extra["id"].default == "" and extra["mono_ns"].default == 0
    assert not extra["id"].compare and not extra["mono_ns"].compare
    assert events.EventMetadataValue == tevents.EventMetadataValue


def test_rdzv_event_fields_match_torchelastic() -> None:
    assert _fields(events.RdzvEvent) == _fields(tevents.RdzvEvent)


def test_event_equality_ignores_id_and_mono_ns() -> None:
    a = make_event(timestamp=5, metadata={"k": 1})
    b = make_event(timestamp=5, metadata={"k": 1}, id="x", mono_ns=9)
    assert a == b
    assert a != make_event(timestamp=6, metadata={"k": 1})


# -- serialize / deserialize -------------------------------------------------------------------------------------------

METADATA: dict[str, events.EventMetadataValue] = {
    "run_id": "job", "global_rank": 11, "total_run_time": 5.5, "ok": True, "raw_error": None
}


def test_event_round_trip() -> None:
    ev = make_event(timestamp=1712345678901, metadata=dict(METADATA), id="abc-1", mono_ns=123)
    back = events.Event.deserialize(ev.serialize())
    assert back == ev
    assert (back.id, back.mono_ns) == ("abc-1", 123)
    assert back.source is events.EventSource.WORKER
    assert events.Event.deserialize(ev) is ev
    assert str(ev) == ev.serialize() == json.dumps(dataclasses.asdict(ev))


def test_serialized_form_is_torchelastics_plus_two_keys() -> None:
    ours = make_event(timestamp=7, metadata=dict(METADATA))
    theirs = tevents.Event(ours.name, tevents.EventSource.WORKER, 7, dict(METADATA))
    ours_obj, theirs_obj = json.loads(ours.serialize()), json.loads(theirs.serialize())
    assert {k: v for k, v in ours_obj.items() if k not in ("id", "mono_ns")} == theirs_obj
    assert list(ours_obj)[:4] == list(theirs_obj)


def test_deserialize_reads_torchelastic_output() -> None:
    theirs = tevents.Event("torchelastic.worker.status.FAILED", tevents.EventSource.AGENT, 0, dict(METADATA))
    back = events.Event.deserialize(theirs.serialize())
    assert isinstance(back, events.Event)
    assert (back.name, back.source, back.timestamp, back.metadata) == (
        theirs.name,
        events.EventSource.AGENT,
        0,
        METADATA,
    )
    assert (back.id, back.mono_ns) == ("", 0)


def test_deserialize_reads_torchelastic_style_json() -> None:
    # the shape of a real agent line (torchelastic issue #60716): nested metadata as a JSON string, no id/mono_ns
    line = (
        '{"name": "torchelastic.worker.status.SUCCEEDED", "source": "WORKER", "timestamp": 0, '
        '"metadata": {"run_id": "none", "global_rank": 11, "state": "SUCCEEDED", "raw_error": null, '
        '"metadata": "{\\"group_world_size\\": 1}", "agent_restarts": 0}}'
    )
    ev = events.Event.deserialize(line)
    assert ev.source is events.EventSource.WORKER
    assert ev.metadata["global_rank"] == 11 and ev.metadata["raw_error"] is None
    assert json.loads(cast(str, ev.metadata["metadata"])) == {"group_world_size": 1}
    assert tevents.Event.deserialize(line) == tevents.Event(ev.name, tevents.EventSource.WORKER, 0, ev.metadata)


def test_deserialize_rejects_other_types() -> None:
    with pytest.raises(TypeError):
        events.Event.deserialize(42)
    with pytest.raises(TypeError):
        events.RdzvEvent.deserialize(None)


def _rdzv(lib: Any, **kw: Any) -> Any:
    args = {
        "name": "DynamicRendezvousHandler._join",
        "run_id": "job-1",
        "message": "joined",
        "hostname": "node-3",
        "pid": 4242,
        "node_state": lib.NodeState.RUNNING,
        "master_endpoint": "node-0:29500",
        "rank": 3,
        "local_id": 1,
        **kw,
    }
    return lib.RdzvEvent(**args)


def test_rdzv_event_round_trip_and_str() -> None:
    ev = _rdzv(events)
    assert events.RdzvEvent.deserialize(ev.serialize()) == ev
    assert events.RdzvEvent.deserialize(ev) is ev
    assert str(ev) == ev.serialize() == json.dumps(dataclasses.asdict(ev))
    failed = _rdzv(events, node_state=events.NodeState.FAILED, rank=None, local_id=None, error_trace="tb")
    assert events.RdzvEvent.deserialize(str(failed)) == failed


def test_rdzv_event_serialization_is_torchelastics() -> None:
    ours, theirs = _rdzv(events), _rdzv(tevents)
    assert ours.serialize() == theirs.serialize()
    back = events.RdzvEvent.deserialize(theirs.serialize())
    assert back == ours and back.node_state is events.NodeState.RUNNING


# -- record(event) ---------------------------------------------------------------------------------------------------


def test_record_stamps_and_stores_the_event(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    ev = make_event(metadata={"global_rank": 1, "state": "SUCCEEDED", "raw_error": None})
    assert ev.timestamp == 0 and ev.id == "" and ev.mono_ns == 0
    events.record(ev)
    assert type(ev.timestamp) is int
    assert abs(ev.timestamp - time.time() * 1000) < 60_000
    assert ev.id and ev.mono_ns > 0
    (rec,) = read_run(telemetry, "event")
    assert (rec.group, rec.name, rec.severity) == ("torchelastic", ev.name, "info")
    assert rec.attributes == {
        "global_rank": 1,
        "state": "SUCCEEDED",
        "raw_error": None,
        "torchelastic.source": "WORKER",  # namespaced: a metadata key "source" must survive
        "torchelastic.timestamp": ev.timestamp,  # the event's own time, whoever set it
    }
    assert rec.event_id == ev.id
    assert rec.mono_ns == ev.mono_ns
    assert rec.wall_ns // 1_000_000 == ev.timestamp
    assert rec.identity == telemetry.identity
    assert ev.metadata == {"global_rank": 1, "state": "SUCCEEDED", "raw_error": None}  # the caller's dict untouched


def test_record_keeps_a_caller_timestamp(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    ev = make_event(timestamp=1_600_000_000_000)
    events.record(ev)
    assert ev.timestamp == 1_600_000_000_000
    (rec,) = read_run(telemetry, "event")
    assert rec.event_id == ev.id


def test_record_gives_unique_ids(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    evs = [make_event(name=f"e{i}") for i in range(5)]
    for ev in evs:
        events.record(ev)
    assert len({ev.id for ev in evs}) == 5
    assert [r.event_id for r in read_run(telemetry, "event")] == [ev.id for ev in evs]


def test_record_rejects_a_non_event(telemetry: telemetrain.Telemetry) -> None:
    with pytest.raises(TypeError):
        events.record({"name": "x"})  # type: ignore[arg-type]


def test_record_to_console_logs_the_json(
    telemetry: telemetrain.Telemetry, destination: Callable[..., str], read_run: Any
) -> None:
    collector = ListHandler()
    destination(collector, "console")
    ev = make_event(metadata={"k": "v"})
    events.record(ev, destination="console")
    (log_record,) = collector.records
    assert log_record.name == "torchelastic-events-console"
    assert log_record.levelno == logging.INFO
    # exactly the line torchelastic logs for the same event, so its own Event.deserialize reads it
    assert log_record.getMessage() == as_torchelastic(ev).serialize()
    assert tevents.Event.deserialize(log_record.getMessage()) == as_torchelastic(ev)
    assert events.Event.deserialize(log_record.getMessage()) == ev
    logger = logging.getLogger("torchelastic-events-console")
    assert logger.propagate is False
    assert [r.name for r in read_run(telemetry, "event")] == [ev.name]


def test_record_to_null_logs_nothing(telemetry: telemetrain.Telemetry, destination: Callable[..., str]) -> None:
    collector = ListHandler()
    name = destination(collector)
    events.record(make_event())  # default destination: null
    events.record(make_event(), "null")
    assert collector.records == []
    events.record(make_event(), name)
    assert len(collector.records) == 1


def test_console_event_is_printed_once_next_to_torchelastic(telemetry: telemetrain.Telemetry) -> None:
    """Both libraries log to the logger named ``torchelastic-events-console``; each event must come out once."""
    handlers = [events.get_logging_handler("console"), tevents.get_logging_handler("console")]
    saved = [h.stream for h in handlers]  # type: ignore[attr-defined]
    out = io.StringIO()
    for h in handlers:
        h.setStream(out)  # type: ignore[attr-defined]
    try:
        theirs = tevents.Event("printed_by_torch", tevents.EventSource.AGENT)
        tevents.record(theirs, "console")
        ours = make_event(name="printed_by_telemetrain")
        events.record(ours, "console")
    finally:
        for h, stream in zip(handlers, saved, strict=True):
            h.setStream(stream)  # type: ignore[attr-defined]
    lines = out.getvalue().splitlines()
    assert lines.count(theirs.serialize()) == 1, lines
    assert lines.count(as_torchelastic(ours).serialize()) == 1, lines


def test_unknown_destination_warns_once_and_still_stores(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    dest = f"does-not-exist-{uuid.uuid4().hex[:8]}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        events.record(make_event(name="first"), dest)
        events.record(make_event(name="second"), dest)
    ours = [w for w in caught if dest in str(w.message)]
    assert len(ours) == 1
    assert issubclass(ours[0].category, RuntimeWarning)
    assert ours[0].filename == __file__  # points at the caller
    assert [r.name for r in read_run(telemetry, "event")] == ["first", "second"]


def test_get_logging_handler(destination: Callable[..., str]) -> None:
    for name in ("console", "dynamic_rendezvous", "null"):
        assert type(events.get_logging_handler(name)) is type(tevents.get_logging_handler(name))
    assert isinstance(events.get_logging_handler(), logging.NullHandler)
    with pytest.raises(KeyError):
        events.get_logging_handler("nope")
    with pytest.raises(KeyError):
        tevents.get_logging_handler("nope")


def test_the_packages_get_logging_handler_is_the_one_the_loggers_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in torch, ``_get_or_create_logger`` looks ``get_logging_handler`` up in the package, so a test (torch's own
    ``lib_test.py``) that patches ``events.get_logging_handler`` gives a destination the logger of its choice."""
    for module in (events, tevents):
        chosen = logging.NullHandler()
        monkeypatch.setattr(module, "get_logging_handler", lambda destination="null", h=chosen: h)
        logger = module._get_or_create_logger(f"patched-{uuid.uuid4().hex}")
        assert logger.handlers == [chosen]


def test_register_logging_handler_adds_and_replaces_a_destination(
    telemetry: telemetrain.Telemetry, destination: Callable[..., str]
) -> None:
    first, second = ListHandler(), ListHandler()
    name = destination(first)
    assert events.get_logging_handler(name) is first
    ev1 = make_event(name="one")
    events.record(ev1, name)
    destination(second, name)  # replace: the logger is re-pointed
    ev2 = make_event(name="two")
    events.record(ev2, name)
    assert first.messages == [as_torchelastic(ev1).serialize()]
    assert second.messages == [as_torchelastic(ev2).serialize()]
    assert first.records[0].name == f"torchelastic-events-{name}"
    with pytest.raises(TypeError):
        events.register_logging_handler("", ListHandler())
    with pytest.raises(TypeError):
        events.register_logging_handler("x", object())  # type: ignore[arg-type]


# -- event handlers ----------------------------------------------------------------------------------------------------


def test_configured_handler_receives_each_event(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    handler = CollectingEventHandler()
    events.configure(handler)
    evs = [make_event(name="a"), make_event(name="b", source=events.EventSource.AGENT)]
    for ev in evs:
        events.record(ev)
    assert handler.events == evs
    assert all(got is ev for got, ev in zip(handler.events, evs, strict=True))
    assert all(ev.id and ev.timestamp for ev in handler.events)  # stamped before the handler sees it
    assert len(read_run(telemetry, "event")) == 2


def test_raising_handler_is_contained(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    events.configure(RaisingEventHandler())
    with pytest.warns(RuntimeWarning, match="event handler is broken"):
        events.record(make_event(name="a"))
    events.record(make_event(name="b"))
    assert [r.name for r in read_run(telemetry, "event")] == ["a", "b"]


def test_configure_rejects_a_non_handler(telemetry: telemetrain.Telemetry) -> None:
    with pytest.raises(TypeError, match="EventHandler"):
        events.configure(lambda ev: None)  # type: ignore[arg-type]


def test_null_event_handler_is_a_handler(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    events.configure(events.NullEventHandler())
    events.record(make_event())
    assert len(read_run(telemetry, "event")) == 1


# -- rendezvous events -------------------------------------------------------------------------------------------------

RDZV_FIELDS = (
    "run_id",
    "message",
    "hostname",
    "pid",
    "node_state",
    "master_endpoint",
    "rank",
    "local_id",
    "error_trace",
)


def test_construct_and_record_rdzv_event(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    events.construct_and_record_rdzv_event(run_id="job-1", message="joined", node_state=events.NodeState.RUNNING)
    (rec,) = read_run(telemetry, "event")
    assert rec.name == "test_events_compat.py:test_construct_and_record_rdzv_event"
    assert rec.group == "torchelastic.rendezvous"
    assert rec.severity == "info"
    assert rec.attributes == {
        "run_id": "job-1",
        "message": "joined",
        "hostname": socket.getfqdn(),
        "pid": os.getpid(),
        "node_state": "RUNNING",
        "master_endpoint": "",
        "rank": None,
        "local_id": None,
        "error_trace": "",
    }


def test_construct_and_record_rdzv_event_with_a_name(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    events.construct_and_record_rdzv_event(
        "job-1", "synced", events.NodeState.SUCCEEDED, name="Handler.sync", hostname="h", pid=7, rank=2, local_id=0
    )
    (rec,) = read_run(telemetry, "event")
    assert rec.name == "test_events_compat.py:Handler.sync"
    assert (rec.attributes["hostname"], rec.attributes["pid"], rec.attributes["rank"]) == ("h", 7, 2)
    assert rec.attributes["local_id"] == 0 and rec.attributes["node_state"] == "SUCCEEDED"


def test_failed_rdzv_event_carries_the_traceback(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    try:
        raise ConnectionError("store unreachable")
    except ConnectionError:
        events.construct_and_record_rdzv_event(run_id="job-1", message="failed", node_state=events.NodeState.FAILED)
    (rec,) = read_run(telemetry, "event")
    assert rec.severity == "error"
    assert rec.attributes["node_state"] == "FAILED"
    trace = rec.attributes["error_trace"]
    assert trace.startswith("Traceback") and "ConnectionError: store unreachable" in trace


def test_rdzv_event_matches_torchelastic(
    telemetry: telemetrain.Telemetry, torch_rdzv_handler: ListHandler, destination: Callable[..., str], read_run: Any
) -> None:
    ours_log = ListHandler()
    kw: dict[str, Any] = {"run_id": "job-9", "message": "m", "hostname": "host-a", "pid": 99, "rank": 1, "local_id": 4}
    try:
        raise TimeoutError("rendezvous timed out")
    except TimeoutError:
        tevents.construct_and_record_rdzv_event(node_state=tevents.NodeState.FAILED, **kw)
        # torchelastic's handler and ours sit on one logger name: take torchelastic's off before ours logs
        logging.getLogger("torchelastic-events-dynamic_rendezvous").removeHandler(torch_rdzv_handler)
        destination(ours_log, "dynamic_rendezvous")
        events.construct_and_record_rdzv_event(node_state=events.NodeState.FAILED, **kw)
    (theirs_line,) = torch_rdzv_handler.messages
    (ours_line,) = ours_log.messages
    theirs, ours = json.loads(theirs_line), json.loads(ours_line)
    assert ours == theirs
    assert ours["name"] == "test_events_compat.py:test_rdzv_event_matches_torchelastic"
    (rec,) = read_run(telemetry, "event")
    assert rec.name == ours["name"]
    assert {k: rec.attributes[k] for k in RDZV_FIELDS} == {k: ours[k] for k in RDZV_FIELDS}


def test_record_rdzv_event(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    ev = _rdzv(events)
    events.record_rdzv_event(ev)
    (rec,) = read_run(telemetry, "event")
    assert (rec.group, rec.name, rec.severity) == ("torchelastic.rendezvous", ev.name, "info")
    expected = dataclasses.asdict(ev)
    del expected["name"]
    expected["node_state"] = "RUNNING"
    assert rec.attributes == expected
    with pytest.raises(TypeError):
        events.record_rdzv_event(make_event())  # type: ignore[arg-type]


# -- the native event call ---------------------------------------------------------------------------------------------


def test_native_event(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    events.event("checkpoint.saved", {"step": 10, "path": "/ckpt/10"}, severity="warning")
    telemetry.event("loader.stall", {"seconds": 1.5}, severity="error", group="data")
    telemetrain.event("plain")
    recs = read_run(telemetry, "event")
    assert [(r.group, r.name, r.severity, r.attributes) for r in recs] == [
        ("events", "checkpoint.saved", "warning", {"step": 10, "path": "/ckpt/10"}),
        ("data", "loader.stall", "error", {"seconds": 1.5}),
        ("events", "plain", "info", None),
    ]
    assert all(r.identity == telemetry.identity for r in recs)


@pytest.mark.parametrize("severity", ["warn", "INFO", "", "fatal"])
def test_native_event_rejects_bad_severity(telemetry: telemetrain.Telemetry, severity: str) -> None:
    with pytest.raises(ValueError, match="severity"):
        events.event("x", severity=severity)
    with pytest.raises(ValueError, match="severity"):
        telemetry.event("x", severity=severity)


@pytest.mark.parametrize("attributes", [[("a", 1)], "a=1", 5], ids=["list", "str", "int"])
def test_native_event_rejects_non_mapping_attributes(telemetry: telemetrain.Telemetry, attributes: Any) -> None:
    with pytest.raises(TypeError, match="attributes"):
        events.event("x", attributes)
    with pytest.raises(TypeError, match="attributes"):
        telemetry.event("x", attributes)


def test_native_event_rejects_bad_names_and_groups(telemetry: telemetrain.Telemetry) -> None:
    with pytest.raises(ValueError):
        events.event("")
    with pytest.raises(TypeError):
        events.event(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        events.event("x", group=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        events.event("x", group="")


def test_native_event_copies_attributes(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    attrs: dict[str, Any] = {"step": 1}
    events.event("e", attrs)
    attrs["step"] = 2
    attrs["added"] = True
    telemetry.event("f", attrs)
    attrs.clear()
    recs = read_run(telemetry, "event")
    assert [r.attributes for r in recs] == [{"step": 1}, {"step": 2, "added": True}]
