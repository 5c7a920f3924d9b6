"""Review findings: torchelastic-compatible behaviour that telemetrain gets wrong, side by side with the real torch
modules where that is meaningful. Each test asserts the correct behaviour and fails on the bug it names."""

from __future__ import annotations

import _thread
import enum
import json
import os
import subprocess
import sys
import textwrap
import time
import types
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.elastic.events as tevents
import torch.distributed.elastic.metrics.api as tapi

import telemetrain
from conftest import ListHandler, recorder
from telemetrain import events, metrics

# -- helpers ---------------------------------------------------------------------------------------------------------


class Group(str, enum.Enum):
    """A str-valued enum of metric groups: a common way to keep group names in one place."""

    TRAIN = "review-train"


class Name(str, enum.Enum):
    LOSS = "loss"


class CustomStr(str):
    """A str subclass whose ``__str__`` is not its text."""

    def __str__(self) -> str:
        return "not-the-name"


# -- metrics -----------------------------------------------------------------------------------------------------------


def test_put_metric_accepts_a_str_enum_group(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, read_run: Any
) -> None:
    """A str subclass is a str: torchelastic routes it like its value. telemetrain's put_metric passes its own
    ``isinstance(group, str)`` check, then the router's ``type(group) is str`` check raises TypeError ("group must
    be a str, got Group") -- unless the plain-str group happened to be resolved first (order-dependent)."""
    theirs = recorder(tapi.MetricHandler)
    torch_metrics.configure(theirs)
    torch_metrics.put_metric("x", 1, Group.TRAIN)
    assert [(d.group_name, d.name, d.value) for d in theirs.data] == [("review-train", "x", 1)]

    ours = recorder(metrics.MetricHandler)
    metrics.configure(ours)
    metrics.put_metric("x", 1, Group.TRAIN)
    assert [(d.group_name, d.name, d.value) for d in ours.data] == [("review-train", "x", 1)]
    assert [(r.group, r.name, r.value) for r in read_run(telemetry, "metric")] == [("review-train", "x", 1)]


def test_prof_with_a_str_enum_group_does_not_break_the_call(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, read_run: Any
) -> None:
    """Worse than put_metric: ``@prof(group=Group.TRAIN)`` decorates fine, then every call raises TypeError from
    the wrapper's ``finally`` -- after the profiled function returned, so its result is lost."""

    def step() -> int:
        return 7

    assert torch_metrics.prof(group=Group.TRAIN)(step)() == 7
    assert metrics.prof(group=Group.TRAIN)(step)() == 7
    names = [r.name.rsplit(".", 2)[-2:] for r in read_run(telemetry, "metric")]
    assert names == [["step", "success"], ["duration", "ms"]]


def test_metric_name_str_subclass_keeps_its_text(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, read_run: Any
) -> None:
    """``check_name`` turns a str subclass into ``str(name)``: ``Name.LOSS`` becomes "Name.LOSS" (a str-mixin
    Enum's ``__str__``), a subclass overriding ``__str__`` gets that text. torchelastic passes the name through, so
    its handler sees a name equal to "loss"; the stored name should be the string's own text."""
    theirs, ours = recorder(tapi.MetricHandler), recorder(metrics.MetricHandler)
    torch_metrics.configure(theirs, "g")
    metrics.configure(ours, "g")
    for name in (Name.LOSS, CustomStr("tokens")):
        torch_metrics.put_metric(name, 1, "g")
        metrics.put_metric(name, 1, "g")
    assert [d.name for d in theirs.data] == ["loss", "tokens"]
    assert [d.name for d in ours.data] == ["loss", "tokens"]
    assert [r.name for r in read_run(telemetry, "metric")] == ["loss", "tokens"]


def test_configure_accepts_a_torchelastic_metric_handler(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, read_run: Any
) -> None:
    """README: "Your MetricHandler subclasses ... keep working". A handler written against torchelastic's
    ``MetricHandler`` base (e.g. in a shared package that still imports torch's module) is rejected by
    ``telemetrain.metrics.configure`` with TypeError."""
    handler = recorder(tapi.MetricHandler)
    metrics.configure(handler, "g")
    metrics.put_metric("x", 3, "g")
    assert [(d.group_name, d.name, d.value) for d in handler.data] == [("g", "x", 3)]


def test_put_metric_accepts_a_numpy_bool(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    """docs/compat.md: values may be "int, float, bool, numpy scalars". ``numpy.bool_`` is a numpy scalar but not
    registered with ``numbers``, so ``check_value`` raises TypeError for e.g. ``(pred == y).all()``."""
    np = pytest.importorskip("numpy")
    metrics.put_metric("all_correct", np.bool_(True), "g")
    metrics.put_metric("loss", np.float32(0.5), "g")
    assert [r.value for r in read_run(telemetry, "metric")] == [True, 0.5]


# -- events: record ----------------------------------------------------------------------------------------------------


def test_record_accepts_a_torchelastic_event(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    """torchelastic's agent builds its own Event objects (``agent.get_event_succeeded()``, which torch's launcher
    passes to ``events.record``). With the import swapped, ``telemetrain.events.record`` raises TypeError for them,
    where torchelastic's ``record`` takes them."""
    ev = tevents.Event("torchelastic.worker.status.SUCCEEDED", tevents.EventSource.AGENT, metadata={"k": 1})
    tevents.record(ev)
    events.record(ev)  # type: ignore[arg-type]  # (documented to take torchelastic's Event; annotated ours only)
    (rec,) = read_run(telemetry, "event")
    assert (rec.group, rec.name) == ("torchelastic", ev.name)
    assert rec.attributes == {"k": 1, "torchelastic.source": "AGENT", "torchelastic.timestamp": ev.timestamp}


def test_record_rdzv_event_accepts_a_torchelastic_rdzv_event(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    ev = tevents.RdzvEvent("h.py:join", "job", "joined", "host", 42, tevents.NodeState.RUNNING)
    tevents.record_rdzv_event(ev)
    events.record_rdzv_event(ev)  # type: ignore[arg-type]  # (the same, for RdzvEvent)
    (rec,) = read_run(telemetry, "event")
    assert (rec.group, rec.name, rec.attributes["node_state"]) == ("torchelastic.rendezvous", "h.py:join", "RUNNING")


def test_record_an_event_without_metadata(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    """``Event(..., metadata=None)``: torchelastic serialises ``"metadata": null``; telemetrain's record raises
    TypeError ("Value after * must be an iterable") from flattening the metadata."""
    tevents.record(tevents.Event("x", tevents.EventSource.AGENT, metadata=None), "null")  # type: ignore[arg-type]
    ev = events.Event("x", events.EventSource.AGENT, metadata=None)  # type: ignore[arg-type]
    events.record(ev)
    (rec,) = read_run(telemetry, "event")
    assert rec.name == "x" and rec.attributes == {
        "torchelastic.source": "AGENT",
        "torchelastic.timestamp": ev.timestamp,
    }


def test_record_rdzv_event_with_an_empty_name(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    """torchelastic records any RdzvEvent, an empty or missing name included; so does ``record_rdzv_event`` (its
    events are packed directly, not through ``Telemetry.event``, whose name check would refuse them): each is kept,
    named "" in the run store."""
    for name in ("", None):
        tevents.record_rdzv_event(tevents.RdzvEvent(name, "job", "m", "host", 1, tevents.NodeState.INIT))  # type: ignore[arg-type]
        events.record_rdzv_event(events.RdzvEvent(name, "job", "m", "host", 1, events.NodeState.INIT))  # type: ignore[arg-type]
    stored = [r for r in read_run(telemetry, "event") if r.group == "torchelastic.rendezvous"]
    assert [(r.name, r.attributes["run_id"], r.attributes["node_state"]) for r in stored] == [("", "job", "INIT")] * 2


def test_record_keeps_a_metadata_key_named_source(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    """The stored attributes are the metadata plus "source" (the EventSource); a metadata key "source" is silently
    overwritten by it, so the caller's value is lost from the run store."""
    events.record(events.Event("loader.stall", events.EventSource.WORKER, metadata={"source": "s3://bucket", "k": 1}))
    (rec,) = read_run(telemetry, "event")
    assert "s3://bucket" in rec.attributes.values()
    assert "WORKER" in rec.attributes.values()


def test_record_keeps_the_callers_timestamp_in_the_run_store(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    """An Event whose caller set ``timestamp`` (ms since the epoch) keeps it on the object, but the stored record
    carries only the time of the ``record()`` call: the event's own time is lost from the run store."""
    ts = 1_600_000_000_000
    events.record(events.Event("replayed", events.EventSource.AGENT, timestamp=ts))
    (rec,) = read_run(telemetry, "event")
    assert (rec.attributes or {}).get("torchelastic.timestamp") == ts


# -- events: containment -----------------------------------------------------------------------------------------------


class RaisingEventHandler(events.EventHandler):
    def record(self, event: events.Event) -> None:
        raise RuntimeError("handler is broken")


def test_raising_event_handler_is_contained_under_warnings_as_errors(telemetry: telemetrain.Telemetry,
                                                                    read_run: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """compat.md: "a raising handler is contained". Under ``-W error`` the containment's own warning must not raise
    into ``record()``'s caller either; the events are kept, and the handler's failure is warned about once."""
    monkeypatch.setattr(events, "_warned_handlers", {})
    events.configure(RaisingEventHandler())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            events.record(events.Event("a", events.EventSource.AGENT))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            events.record(events.Event("b", events.EventSource.AGENT))
    finally:
        events.configure(events.NullEventHandler())
    assert caught == []  # warned once, for "a" (swallowed under -W error), not again for "b"
    assert [r.name for r in read_run(telemetry, "event")] == ["a", "b"]


def test_unknown_destination_does_not_raise_under_warnings_as_errors(telemetry: telemetrain.Telemetry,
                                                                     read_run: Any) -> None:
    """compat.md: an unknown destination "warns once, keeps the event ... never break the caller". Under
    ``-W error`` the warning must not be raised into the caller; the event is in telemetrain's own sinks."""
    destination = f"nope-{uuid.uuid4().hex[:8]}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        events.record(events.Event("a", events.EventSource.AGENT), destination)
    with pytest.warns(RuntimeWarning, match=destination):
        events.record(events.Event("other", events.EventSource.AGENT), f"{destination}-2")
    assert [r.name for r in read_run(telemetry, "event")] == ["a", "other"]


# -- events: console destination next to torchelastic ---------------------------------------------------------------

_CONSOLE_SCRIPT = textwrap.dedent(
    """
    import io, json, warnings
    import telemetrain
    from telemetrain import events
    telemetrain.set_telemetry(telemetrain.Telemetry(store=False))
    out = io.StringIO()
    events.get_logging_handler("console").setStream(out)
    events.record(events.Event("ours-before", events.EventSource.AGENT), "console")
    warnings.filterwarnings("ignore")
    import torch.distributed.elastic.events as tevents  # imported after telemetrain logged to "console"
    tevents.get_logging_handler("console").setStream(out)
    tevents.record(tevents.Event("theirs", tevents.EventSource.AGENT), "console")
    events.record(events.Event("ours-after", events.EventSource.AGENT), "console")
    telemetrain.reset()
    print(json.dumps([json.loads(line)["name"] for line in out.getvalue().splitlines()]))
    """
)


def test_console_events_print_once_when_torchelastic_is_imported_later(tmp_path: Path) -> None:
    """Both libraries log to the logger ``torchelastic-events-console``. telemetrain reuses torchelastic's handler
    only if torchelastic's module is already loaded when telemetrain first logs; otherwise torchelastic later adds
    its own handler to the same logger and every event, torchelastic's and telemetrain's, is printed twice."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRAIN_")}
    proc = subprocess.run(
        [sys.executable, "-c", _CONSOLE_SCRIPT], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = json.loads(proc.stdout.strip().splitlines()[-1])
    assert names == ["ours-before", "theirs", "ours-after"]


# -- events: construct_and_record_rdzv_event ---------------------------------------------------------------------------


def test_construct_and_record_rdzv_event_without_a_python_caller(
    telemetry: telemetrain.Telemetry,
    torch_rdzv_handler: ListHandler,
    monkeypatch: pytest.MonkeyPatch,
    read_run: Any,
) -> None:
    """torchelastic names such an event ``no_file:`` (its ``inspect.stack()`` has one entry); telemetrain's
    ``sys._getframe(1)`` raises ValueError ("call stack is not deep enough") and the event is lost. This happens for
    a function called straight from C: a thread entry point, an ``atexit`` callback."""
    errors: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: errors.append(u.exc_value))
    # a thread entry point is called from C: the function has no Python caller frame
    _thread.start_new_thread(tevents.construct_and_record_rdzv_event, ("job", "m", tevents.NodeState.INIT))
    deadline = time.monotonic() + 5
    while not torch_rdzv_handler.messages and time.monotonic() < deadline:
        time.sleep(0.05)
    (theirs,) = torch_rdzv_handler.messages
    assert json.loads(theirs)["name"] == "no_file:"

    _thread.start_new_thread(events.construct_and_record_rdzv_event, ("job", "m", events.NodeState.INIT))
    recs: list[Any] = []
    deadline = time.monotonic() + 5
    while not recs and not errors and time.monotonic() < deadline:
        time.sleep(0.05)
        telemetry.flush()
        if telemetry.run_dir is not None and telemetry.run_dir.exists():
            recs = read_run(telemetry, "event")
    assert errors == []
    (rec,) = recs
    assert rec.name == "no_file:"


def test_a_new_raising_handler_is_warned_even_where_it_reuses_a_dead_ones_id(telemetry: telemetrain.Telemetry,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Handlers are warned about once each: a new one at a dead one's address (CPython reuses them) is a new one."""
    monkeypatch.setattr(events, "_warned_handlers", {})
    try:
        with pytest.warns(RuntimeWarning, match="RaisingEventHandler raised RuntimeError"):
            first = RaisingEventHandler()
            events.configure(first)
            events.record(events.Event("a", events.EventSource.AGENT))
        dead = id(first)
        events.configure(events.NullEventHandler())
        del first
        reused = None
        for _ in range(10_000):  # find a new handler at the dead one's address
            candidate = RaisingEventHandler()
            if id(candidate) == dead:
                reused = candidate
                break
        if reused is None:
            pytest.skip("no new handler reused the dead one's address")
        events.configure(reused)
        with pytest.warns(RuntimeWarning, match="RaisingEventHandler raised RuntimeError"):
            events.record(events.Event("b", events.EventSource.AGENT))
        with warnings.catch_warnings(record=True) as caught:  # and once only
            warnings.simplefilter("always")
            events.record(events.Event("c", events.EventSource.AGENT))
        assert caught == []
    finally:
        events.configure(events.NullEventHandler())
