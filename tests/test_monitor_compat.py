"""``telemetrain.monitor`` against the real ``torch.monitor``, side by side.

torch.monitor keeps its handlers in one process-global list (in C++); every handler a test registers there goes
through the ``register`` fixture, which unregisters it at teardown. ``telemetrain.monitor`` keeps its handlers on the
default Telemetry (the ``telemetry`` fixture), so it always runs under that fixture.

Never run here against torch.monitor: ``window_size`` 0 (SIGFPE kills the process), a handler that logs, registers
or unregisters (self-deadlock under its global mutex, with the GIL held: the whole process hangs), unregistering a
handle twice (undefined behaviour in C++).
"""

from __future__ import annotations

import datetime
import inspect
import math
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.monitor as tm

import telemetrain
from conftest import run_dir_of
from telemetrain import monitor
from telemetrain.dispatch import TelemetryWarning
from telemetrain.store import open_run
from telemetrain.telemetry import _default

MODULES = {"torch": tm, "telemetrain": monitor}
TORCH_AGGS = ("VALUE", "MEAN", "COUNT", "SUM", "MAX", "MIN")

# -- helpers ---------------------------------------------------------------------------------------------------------


@pytest.fixture(params=["torch", "telemetrain"])
def mon(request: pytest.FixtureRequest) -> types.ModuleType:
    """torch.monitor, or telemetrain.monitor with the ``telemetry`` fixture as the default instance."""
    if request.param == "telemetrain":
        request.getfixturevalue("telemetry")
    return MODULES[request.param]


def collector_threads() -> list[threading.Thread]:
    return [th for th in threading.enumerate() if th.name == "telemetrain-collector" and th.is_alive()]


def is_ours(mod: types.ModuleType) -> bool:
    return mod is monitor


class Registrar:
    """``register(callback, module=monitor)`` registers a handler; ``register.unregister(handle)`` unregisters it
    now; the fixture unregisters the rest at teardown (before the ``telemetry`` fixture closes the default instance,
    since it is set up after it). Each torch handle is unregistered once only: a second time is UB in torch."""

    def __init__(self) -> None:
        self.handles: list[tuple[types.ModuleType, Any]] = []

    def __call__(self, callback: Callable[[Any], None], module: types.ModuleType = monitor) -> Any:
        handle = module.register_event_handler(callback)
        self.handles.append((module, handle))
        return handle

    def unregister(self, handle: Any) -> None:
        for i, (module, h) in enumerate(self.handles):
            if h is handle:
                del self.handles[i]
                module.unregister_event_handler(handle)
                return
        raise AssertionError("not registered through this fixture")

    def close(self) -> None:
        while self.handles:
            module, handle = self.handles.pop()
            if module is monitor and _default.telemetry is None:
                continue  # its Telemetry is already gone, and the handlers with it
            module.unregister_event_handler(handle)


@pytest.fixture
def register() -> Iterator[Registrar]:
    registrar = Registrar()
    yield registrar
    registrar.close()


def now() -> datetime.datetime:
    return datetime.datetime.now()


def stat_events(events: list[Any]) -> list[dict[str, Any]]:
    return [dict(e.data) for e in events if e.name == monitor.STAT_EVENT]


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def run_with_timeout(fn: Callable[[], None], timeout: float = 10.0) -> None:
    """Run ``fn`` in a thread: a deadlock fails the test instead of hanging it. Re-raises what ``fn`` raised."""
    outcome: dict[str, BaseException] = {}

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome["exc"] = exc

    th = threading.Thread(target=target, name="test-monitor-timeout", daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), f"deadlock: still running after {timeout} s"
    if "exc" in outcome:
        raise outcome["exc"]


def pybind_params(fn: Any) -> list[tuple[str, str | None]]:
    """(name, default text) of each parameter in a pybind11 signature line (``__init__(self: X, a: T = 1) -> None``),
    ``self`` left out."""
    doc = inspect.getdoc(fn)
    assert doc is not None, fn
    first = doc.splitlines()[0]
    inner = first[first.index("(") + 1 : first.rindex(")")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for part in parts:
        name = part.split(":")[0].strip()
        default = part.split("=", 1)[1].strip() if "=" in part else None
        if name != "self":
            out.append((name, default))
    return out


def our_params(fn: Any) -> list[tuple[str, Any]]:
    """(name, default) of the positional-or-keyword parameters (our keyword-only extras left out)."""
    return [
        (p.name, None if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.name != "self"
    ]


# -- A. torch.monitor's own tests (test/test_monitor.py), against both --------------------------------------------


def test_interval_stat(mon: types.ModuleType, register: Registrar) -> None:
    events: list[Any] = []
    register(events.append, mon)
    s = mon.Stat("asdf", (mon.Aggregation.SUM, mon.Aggregation.COUNT), datetime.timedelta(milliseconds=1))
    assert s.name == "asdf"
    for _ in range(100):
        s.add(3)
        if events:
            break
        time.sleep(0.001)
    if not events:  # ours closes on time from the collector thread: give it a moment after the last add
        wait_for(lambda: bool(events), 2.0)
    assert len(events) >= 1
    assert events[0].name == mon.STAT_EVENT


def test_fixed_count_stat(mon: types.ModuleType) -> None:
    s = mon.Stat("asdf", (mon.Aggregation.SUM, mon.Aggregation.COUNT), datetime.timedelta(hours=100), 3)
    s.add(1)
    s.add(2)
    assert s.name == "asdf"
    assert s.count == 2
    s.add(3)
    assert s.count == 0
    assert s.get() == {mon.Aggregation.SUM: 6.0, mon.Aggregation.COUNT: 3}


def test_non_finite_samples_reach_handlers_as_counts(mon: types.ModuleType, register: Registrar) -> None:
    """compat.md's row: torch's arithmetic turns a window's sum and mean into NaN/inf; ours keeps the finite samples'
    aggregates and hands the non-finite ones to handlers as ``<name>.nan_count``/``<name>.inf_count``."""
    events: list[Any] = []
    register(events.append, mon)
    agg = mon.Aggregation
    s = mon.Stat("loss", (agg.SUM, agg.MEAN, agg.MAX, agg.COUNT), datetime.timedelta(hours=1), 4)
    for value in (1.0, float("inf"), 2.0, float("nan")):
        s.add(value)
    (data,) = [e.data for e in events if e.name == "torch.monitor.Stat"]
    if is_ours(mon):
        assert data == {"loss.sum": 3.0, "loss.mean": 1.5, "loss.max": 2.0, "loss.count": 4.0,
                        "loss.nan_count": 1.0, "loss.inf_count": 1.0}
    else:
        assert math.isnan(data["loss.sum"]) and math.isnan(data["loss.mean"]) and data["loss.count"] == 4.0
        assert set(data) == {"loss.sum", "loss.mean", "loss.max", "loss.count"}


def test_log_event(mon: types.ModuleType) -> None:
    e = mon.Event(
        name="torch.monitor.TestEvent",
        timestamp=now(),
        data={"str": "a string", "float": 1234.0, "int": 1234},
    )
    assert e.name == "torch.monitor.TestEvent"
    assert e.timestamp is not None
    assert e.data is not None
    assert e.data == {"str": "a string", "float": 1234.0, "int": 1234}
    mon.log_event(e)


def test_event_handler(mon: types.ModuleType, register: Registrar) -> None:
    events: list[Any] = []
    handle = register(events.append, mon)
    e = mon.Event(name="torch.monitor.TestEvent", timestamp=now(), data={})
    mon.log_event(e)
    assert len(events) == 1
    assert events[0] == e
    mon.log_event(e)
    assert len(events) == 2
    register.unregister(handle)
    mon.log_event(e)
    assert len(events) == 2


def test_tensorboard_event_handler(mon: types.ModuleType, register: Registrar, tmp_path: Path) -> None:
    """TestMonitorTensorboard.test_event_handler, with a real SummaryWriter read back by tensorboard's reader."""
    pytest.importorskip("tensorboard", reason="the writer and reader are tensorboard's (the [tensorboard] extra)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # type: ignore[import-untyped]
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp_path / "tb"
    before = time.time()
    with SummaryWriter(log_dir=str(logdir)) as w:
        handle = register(mon.TensorboardEventHandler(w), mon)
        s = mon.Stat("asdf", [mon.Aggregation.SUM, mon.Aggregation.COUNT], datetime.timedelta(hours=1), 5)
        for i in range(10):
            s.add(i)
        assert s.count == 0
        del s
        register.unregister(handle)
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    scalars = {tag: [ev.value for ev in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    if mon is tm:
        # torch: the window is capped at 5 samples and samples 5..9 are dropped for the rest of the hour
        assert scalars == {"asdf.sum": [10], "asdf.count": [5]}
    else:
        # fix "max_samples closes the window and starts the next: no sample is dropped": two windows
        assert scalars == {"asdf.sum": [10, 35], "asdf.count": [5, 5]}
    # walltime is the event's timestamp (naive local time) read as epoch seconds: close to now
    for tag in acc.Tags()["scalars"]:
        for ev in acc.Scalars(tag):
            assert before - 5 <= ev.wall_time <= time.time() + 5


# -- B. names and signatures -----------------------------------------------------------------------------------------

# data_value_t is a pybind type placeholder, TYPE_CHECKING a typing import: docs/compat.md says neither is provided.
NOT_CLAIMED = {"TYPE_CHECKING", "data_value_t"}


def test_every_torch_monitor_name_exists() -> None:
    torch_names = {n for n in dir(tm) if not n.startswith("_")} - NOT_CLAIMED
    assert {"Stat", "Event", "log_event", "STAT_EVENT", "TensorboardEventHandler"} <= torch_names  # sanity
    for name in sorted(torch_names):
        assert hasattr(monitor, name), name
        assert name in monitor.__all__, name
    assert monitor.STAT_EVENT == tm.STAT_EVENT == "torch.monitor.Stat"


def test_aggregation_members_and_module_aliases() -> None:
    assert set(TORCH_AGGS) == set(tm.Aggregation.__members__)
    for name in TORCH_AGGS:
        member = monitor.Aggregation[name]
        assert member.name == name
        assert getattr(monitor, name) is member
        assert getattr(tm, name) == tm.Aggregation.__members__[name]  # torch's own aliases, for the record
    # C++ values (torch's Python binding gives VALUE the NONE value 0: its bug, see test_value_records_last_value)
    assert {n: int(monitor.Aggregation[n]) for n in TORCH_AGGS} == {
        "VALUE": 1,
        "MEAN": 2,
        "COUNT": 3,
        "SUM": 4,
        "MAX": 5,
        "MIN": 6,
    }
    # (torch stubs its pybind enum as an Enum, without the __int__ it has)
    assert {n: int(tm.Aggregation.__members__[n]) for n in TORCH_AGGS if n != "VALUE"} == {  # type: ignore[call-overload]
        "MEAN": 2,
        "COUNT": 3,
        "SUM": 4,
        "MAX": 5,
        "MIN": 6,
    }


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (monitor.Stat, tm.Stat.__init__),
        (monitor.Event, tm.Event.__init__),
        (monitor.log_event, tm.log_event),
        (monitor.register_event_handler, tm.register_event_handler),
        (monitor.unregister_event_handler, tm.unregister_event_handler),
    ],
    ids=["Stat", "Event", "log_event", "register_event_handler", "unregister_event_handler"],
)
def test_signatures_match(ours: Any, theirs: Any) -> None:
    their = pybind_params(theirs)
    mine = our_params(ours)
    assert [n for n, _ in mine] == [n for n, _ in their]
    for (name, default), (_, their_default) in zip(mine, their, strict=True):
        if their_default is None:
            assert default is None, name
        else:
            assert default == int(their_default), name


def test_stat_signature_is_torchs() -> None:
    assert our_params(monitor.Stat) == [
        ("name", None),
        ("aggregations", None),
        ("window_size", None),
        ("max_samples", 2**63 - 1),
    ]
    assert [n for n, _ in pybind_params(tm.Stat.__init__)] == ["name", "aggregations", "window_size", "max_samples"]
    assert our_params(monitor.TensorboardEventHandler) == our_params(tm.TensorboardEventHandler) == [("writer", None)]


def test_keyword_construction(mon: types.ModuleType) -> None:
    s = mon.Stat(
        name="kw",
        aggregations=[mon.Aggregation.SUM, mon.Aggregation.COUNT],
        window_size=datetime.timedelta(hours=100),
        max_samples=2,
    )
    s.add(1.5)
    s.add(2.5)
    assert s.name == "kw"
    assert s.get() == {mon.Aggregation.SUM: 4.0, mon.Aggregation.COUNT: 2.0}
    ts = now()
    e = mon.Event(name="kw.event", timestamp=ts, data={"a": 1})
    assert (e.name, e.data) == ("kw.event", {"a": 1})
    assert abs((e.timestamp - ts).total_seconds()) < 0.001  # torch rounds to microseconds via mktime


def test_float_window_size_is_seconds(mon: types.ModuleType) -> None:
    s = mon.Stat("f", [mon.Aggregation.COUNT], 3600.0, 2)  # pybind's duration caster: float seconds
    s.add(1)
    s.add(1)
    assert s.get() == {mon.Aggregation.COUNT: 2.0}


@pytest.mark.parametrize("mod", ["torch", "telemetrain"])
def test_stat_name_and_count_are_read_only(mod: str, request: pytest.FixtureRequest) -> None:
    if mod == "telemetrain":
        request.getfixturevalue("telemetry")
    m = MODULES[mod]
    s = m.Stat("ro", [m.Aggregation.SUM], datetime.timedelta(hours=100))
    with pytest.raises(AttributeError):
        s.count = 3
    with pytest.raises(AttributeError):
        s.name = "other"
    assert s.name == "ro"


def test_stat_event_data_keys_and_float_values(mon: types.ModuleType, register: Registrar) -> None:
    events: list[Any] = []
    register(events.append, mon)
    A = mon.Aggregation
    s = mon.Stat("lat", [A.MEAN, A.COUNT, A.SUM, A.MAX, A.MIN], datetime.timedelta(hours=100), 2)
    s.add(1)
    s.add(2)
    assert len(events) == 1
    ev = events[0]
    assert ev.name == mon.STAT_EVENT == "torch.monitor.Stat"
    assert isinstance(ev.timestamp, datetime.datetime)
    assert abs((ev.timestamp - now()).total_seconds()) < 60  # naive local time in both
    assert ev.data == {"lat.mean": 1.5, "lat.count": 2.0, "lat.sum": 3.0, "lat.max": 2.0, "lat.min": 1.0}
    assert {k: type(v) for k, v in ev.data.items()} == dict.fromkeys(ev.data, float)


def test_get_keys_are_aggregation_members_with_float_values(mon: types.ModuleType) -> None:
    A = mon.Aggregation
    s = mon.Stat("g", [A.MEAN, A.COUNT, A.SUM, A.MAX, A.MIN], datetime.timedelta(hours=100), 3)
    # before the first window closes: zeros, as floats (COUNT included)
    before = s.get()
    assert before == {A.MEAN: 0.0, A.COUNT: 0.0, A.SUM: 0.0, A.MAX: 0.0, A.MIN: 0.0}
    assert all(type(v) is float for v in before.values())
    for v in (4, -2, 7):
        s.add(v)
    got = s.get()
    assert got == {A.MEAN: 3.0, A.COUNT: 3.0, A.SUM: 9.0, A.MAX: 7.0, A.MIN: -2.0}
    assert all(isinstance(k, A) for k in got)
    assert all(type(v) is float for v in got.values())


def test_torch_aggregation_members_are_accepted(telemetry: telemetrain.Telemetry) -> None:
    TA = tm.Aggregation
    s = monitor.Stat("mixed", [TA.VALUE, TA.MEAN, TA.COUNT, TA.SUM, TA.MAX, TA.MIN], datetime.timedelta(hours=100), 2)
    s.add(1)
    s.add(5)
    A = monitor.Aggregation
    assert s.get() == {A.VALUE: 5.0, A.MEAN: 3.0, A.COUNT: 2.0, A.SUM: 6.0, A.MAX: 5.0, A.MIN: 1.0}


# -- C. one test per documented fix -----------------------------------------------------------------------------------


def test_value_records_last_value(telemetry: telemetrain.Telemetry, register: Registrar) -> None:
    """Fix: Aggregation.VALUE records the last value (torch binds it to NONE: it records nothing)."""
    theirs: list[Any] = []
    register(theirs.append, tm)
    # (torch's stub types Stat's window_size as an int; the binding takes a timedelta)
    ts = tm.Stat("v", [tm.Aggregation.VALUE, tm.Aggregation.SUM], datetime.timedelta(hours=100), 2)  # type: ignore[arg-type]
    ts.add(3)
    ts.add(4)
    assert int(tm.Aggregation.VALUE) == 0  # type: ignore[call-overload]
    assert tm.Aggregation.VALUE not in ts.get()  # torch: no value at all
    assert ts.get() == {tm.Aggregation.SUM: 7.0}
    assert stat_events(theirs) == [{"v.sum": 7.0}]

    ours: list[Any] = []
    register(ours.append)
    s = monitor.Stat("v", [monitor.VALUE, monitor.SUM], datetime.timedelta(hours=100), 2)
    s.add(3)
    s.add(4)
    assert s.get() == {monitor.VALUE: 4.0, monitor.SUM: 7.0}
    assert stat_events(ours) == [{"v.value": 4.0, "v.sum": 7.0}]


def test_window_closes_on_time_without_another_add(telemetry: telemetrain.Telemetry, register: Registrar) -> None:
    """Fix: windows close at their time boundary (the collector thread), not at the next add()."""
    # torch: a 1 ms window that has long ended is reported only by the next add()
    theirs: list[Any] = []
    register(theirs.append, tm)
    ts = tm.Stat("t", [tm.Aggregation.SUM, tm.Aggregation.COUNT], datetime.timedelta(milliseconds=10))  # type: ignore[arg-type]
    ts.add(1)  # a first add never closes anything (the window before it is empty)
    time.sleep(0.05)
    assert stat_events(theirs) == []  # its window ended 40+ ms ago: nothing reported
    ts.add(10)
    assert stat_events(theirs) == [{"t.sum": 1.0, "t.count": 1.0}]  # only now
    del ts

    ours: list[Any] = []
    register(ours.append)
    s = monitor.Stat("t", [monitor.SUM, monitor.COUNT], 0.05)
    s.add(1)
    s.add(2)
    assert wait_for(lambda: bool(stat_events(ours)), 5.0), "the window never closed without another add()"
    events = stat_events(ours)
    assert sum(e["t.count"] for e in events) == 2.0
    assert sum(e["t.sum"] for e in events) == 3.0
    assert s.count == 0


def test_max_samples_drops_nothing(telemetry: telemetrain.Telemetry, register: Registrar) -> None:
    """Fix: max_samples closes the window and starts the next; no sample is dropped."""
    theirs: list[Any] = []
    register(theirs.append, tm)
    ts = tm.Stat("m", [tm.Aggregation.SUM, tm.Aggregation.COUNT], datetime.timedelta(hours=100), 5)  # type: ignore[arg-type]
    for i in range(23):
        ts.add(i)
    assert ts.count == 0  # torch: 18 of the 23 samples dropped
    assert stat_events(theirs) == [{"m.sum": 10.0, "m.count": 5.0}]

    ours: list[Any] = []
    register(ours.append)
    s = monitor.Stat("m", [monitor.SUM, monitor.COUNT], datetime.timedelta(hours=100), 5)
    for i in range(23):
        s.add(i)
    assert s.count == 3
    assert [e["m.count"] for e in stat_events(ours)] == [5.0, 5.0, 5.0, 5.0]
    telemetry.flush()  # the open window (3 samples)
    events = stat_events(ours)
    assert sum(e["m.count"] for e in events) == 23
    assert sum(e["m.sum"] for e in events) == sum(range(23))


def test_max_samples_drops_nothing_under_threads(telemetry: telemetrain.Telemetry, register: Registrar) -> None:
    ours: list[Any] = []
    register(ours.append)
    s = monitor.Stat("mt", [monitor.COUNT], datetime.timedelta(hours=100), 7)

    def work() -> None:
        for _ in range(5000):
            s.add(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    counts = [e["mt.count"] for e in stat_events(ours)]
    assert set(counts) == {7.0}
    assert sum(counts) + s.count == 20000


@pytest.mark.parametrize(
    "window",
    [
        0,
        0.0,
        -1,
        -0.5,
        0.0005,
        datetime.timedelta(0),
        datetime.timedelta(microseconds=500),
        datetime.timedelta(seconds=-1),
        float("nan"),
    ],
    ids=repr,
)
def test_bad_window_size_is_value_error(telemetry: telemetrain.Telemetry, window: Any) -> None:
    """Fix: torch dies of SIGFPE on a 0 ms window (never called here) and accepts negative ones."""
    with pytest.raises(ValueError, match="window_size"):
        monitor.Stat("w", [monitor.SUM], window)


def test_window_size_of_one_ms_is_accepted(telemetry: telemetrain.Telemetry) -> None:
    """The smallest window there is, as a ``timedelta`` or as seconds: taken as it is (not refused, not rounded)."""
    for window in (datetime.timedelta(milliseconds=1), 0.001):
        stat = monitor.Stat("w", [monitor.SUM], window)
        stat.close()
        assert stat.window == 0.001 and stat._window_ns == 1_000_000


@pytest.mark.parametrize("max_samples", [0, -1])
def test_bad_max_samples_is_value_error(telemetry: telemetrain.Telemetry, max_samples: int) -> None:
    """Fix: max_samples < 1 is a ValueError whose message explains torch's -1 trap."""
    with pytest.raises(ValueError, match="-1") as info:
        monitor.Stat("m", [monitor.SUM], datetime.timedelta(hours=1), max_samples)
    assert "max_samples" in str(info.value)


def test_torch_max_samples_minus_one_keeps_one_sample() -> None:
    """What the ValueError above protects from: torch's stub documents -1, which keeps the first sample per window."""
    ts = tm.Stat("m", [tm.Aggregation.SUM, tm.Aggregation.COUNT], datetime.timedelta(hours=100), -1)  # type: ignore[arg-type]
    for v in (1, 2, 3):
        ts.add(v)
    assert ts.count == 0
    assert ts.get() == {tm.Aggregation.SUM: 1.0, tm.Aggregation.COUNT: 1.0}


def test_bool_stays_bool(telemetry: telemetrain.Telemetry, register: Registrar, read_run: Any) -> None:
    """Fix: bool event data stays bool, to handlers and in the run store (torch: 1.0/0.0)."""
    theirs: list[Any] = []
    register(theirs.append, tm)
    tm.log_event(tm.Event("flags", now(), {"on": True, "off": False}))
    assert theirs[0].data == {"on": 1.0, "off": 0.0}
    assert {type(v) for v in theirs[0].data.values()} == {float}

    ours: list[Any] = []
    register(ours.append)
    e = monitor.Event("flags", now(), {"on": True, "off": False, "n": 1})
    assert e.data["on"] is True
    monitor.log_event(e)
    assert ours[0].data["on"] is True and ours[0].data["off"] is False
    assert type(ours[0].data["n"]) is int
    (rec,) = [r for r in read_run(telemetry, "event") if r.name == "flags"]
    assert rec.attributes["on"] is True
    assert rec.attributes["off"] is False
    assert type(rec.attributes["n"]) is int


def test_event_data_mutation_sticks(telemetry: telemetrain.Telemetry, register: Registrar) -> None:
    """Fix: event.data is the event's own dict (torch returns a copy each time, so a mutation is lost)."""
    te = tm.Event("m", now(), {"a": 1})
    te.data["b"] = 2
    assert te.data == {"a": 1}

    e = monitor.Event("m", now(), {"a": 1})
    e.data["b"] = 2
    assert e.data == {"a": 1, "b": 2}

    def mutate(ev: Any) -> None:
        ev.data["seen"] = True

    register(mutate)
    monitor.log_event(e)
    assert e.data["seen"] is True  # a handler's change is visible to the caller


def test_event_data_mutation_is_still_checked(telemetry: telemetrain.Telemetry) -> None:
    e = monitor.Event("m", now(), {"a": 1})
    with pytest.raises(TypeError, match="'k'"):
        e.data["k"] = [1, 2]  # type: ignore[assignment]
        monitor.log_event(e)


def test_timezone_aware_timestamp_is_kept(telemetry: telemetrain.Telemetry, register: Registrar, read_run: Any) -> None:
    ts = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone(datetime.timedelta(hours=5)))
    ours: list[Any] = []
    register(ours.append)
    e = monitor.Event("tz", ts, {})
    assert e.timestamp == ts and e.timestamp.tzinfo is ts.tzinfo
    monitor.log_event(e)
    assert ours[0].timestamp.utcoffset() == datetime.timedelta(hours=5)
    (rec,) = [r for r in read_run(telemetry, "event") if r.name == "tz"]
    assert rec.attributes["torch.monitor.timestamp"] == pytest.approx(ts.timestamp())


def test_handler_may_log_register_and_unregister(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    """Fix: handlers run with no lock held (torch: self-deadlock; never run there). Under a thread with a timeout."""
    seen: list[str] = []
    late_seen: list[str] = []
    handles: dict[str, Any] = {}

    def late(ev: Any) -> None:
        late_seen.append(ev.name)

    def reentrant(ev: Any) -> None:
        seen.append(ev.name)
        if ev.name == "outer":
            handles["late"] = monitor.register_event_handler(late)
            monitor.log_event(monitor.Event("inner", now(), {}))
            monitor.unregister_event_handler(handles["reentrant"])  # itself

    def scenario() -> None:
        handles["reentrant"] = monitor.register_event_handler(reentrant)
        monitor.log_event(monitor.Event("outer", now(), {}))
        monitor.log_event(monitor.Event("after", now(), {}))
        monitor.unregister_event_handler(handles["late"])

    run_with_timeout(scenario)
    assert seen == ["outer", "inner"]
    assert late_seen == ["inner", "after"]
    assert [r.name for r in read_run(telemetry, "event")] == ["outer", "inner", "after"]


def test_handler_may_use_the_stat_that_is_reporting(telemetry: telemetrain.Telemetry, register: Registrar) -> None:
    """torch emits a stat's window holding the stat's mutex: a handler that adds to it deadlocks. Ours does not."""
    got: list[dict[Any, float]] = []
    s = monitor.Stat("self", [monitor.SUM, monitor.COUNT], datetime.timedelta(hours=100), 2)

    def handler(ev: Any) -> None:
        if ev.name == monitor.STAT_EVENT and not got:
            got.append(s.get())
            s.add(100)

    register(handler)

    def scenario() -> None:
        s.add(1)
        s.add(2)

    run_with_timeout(scenario)
    assert got == [{monitor.SUM: 3.0, monitor.COUNT: 2.0}]
    assert s.count == 1


def test_raising_handler_is_contained(telemetry: telemetrain.Telemetry, register: Registrar, read_run: Any) -> None:
    """Fix: a raising handler stops neither the others nor the caller; warned once; a handler_error diagnostic."""
    calls: list[str] = []

    def boom(ev: Any) -> None:
        raise RuntimeError("boom")

    # torch, for the record: the exception reaches log_event's caller and the later handler is skipped
    theirs = [register(lambda ev: calls.append("t-first"), tm), register(boom, tm)]
    theirs.append(register(lambda ev: calls.append("t-last"), tm))
    with pytest.raises(RuntimeError, match="boom"):
        tm.log_event(tm.Event("x", now(), {}))
    assert calls == ["t-first"]
    for h in theirs:
        register.unregister(h)
    calls.clear()

    register(lambda ev: calls.append("first"))
    register(boom)
    register(lambda ev: calls.append("last"))
    with pytest.warns(TelemetryWarning, match="handler raised RuntimeError: boom"):
        monitor.log_event(monitor.Event("x", now(), {}))
    assert calls == ["first", "last"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor.log_event(monitor.Event("y", now(), {}))
        s = monitor.Stat("s", [monitor.SUM], datetime.timedelta(hours=100), 1)
        s.add(1.0)  # the window reaches the raising handler inside add(): add() does not raise either
    assert calls == ["first", "last"] * 3
    assert [w for w in caught if issubclass(w.category, TelemetryWarning)] == []  # warned once only
    diags = [r for r in read_run(telemetry, "diagnostic") if r.name == "handler_error"]
    assert len(diags) == 1
    assert "boom" in diags[0].message


def test_unregister_twice_is_harmless(telemetry: telemetrain.Telemetry) -> None:
    events: list[Any] = []
    handle = monitor.register_event_handler(events.append)
    monitor.unregister_event_handler(handle)
    monitor.unregister_event_handler(handle)  # torch: UB (erase(end())); never run there
    monitor.log_event(monitor.Event("x", now(), {}))
    assert events == []
    again = monitor.register_event_handler(events.append)  # the same callable can come back
    monitor.log_event(monitor.Event("x", now(), {}))
    monitor.unregister_event_handler(again)
    assert len(events) == 1


@pytest.mark.parametrize("bad", [None, "handle", 42, print], ids=repr)
def test_unregister_non_handle_is_type_error(telemetry: telemetrain.Telemetry, bad: Any) -> None:
    with pytest.raises(TypeError, match="EventHandlerHandle"):
        monitor.unregister_event_handler(bad)


def test_unregister_torch_handle_is_type_error(telemetry: telemetrain.Telemetry, register: Registrar) -> None:
    handle = register(lambda ev: None, tm)
    with pytest.raises(TypeError, match="EventHandlerHandle"):
        monitor.unregister_event_handler(handle)


def test_handle_cannot_be_built_directly(mon: types.ModuleType) -> None:
    with pytest.raises(TypeError):
        mon.EventHandlerHandle(lambda ev: None)


def test_recursive_handler_is_cut_off(telemetry: telemetrain.Telemetry, register: Registrar, read_run: Any) -> None:
    """Fix: a handler that logs an event for every event it gets is cut off 8 levels deep, counted, warned once."""
    calls: list[str] = []

    def again(ev: Any) -> None:
        calls.append(ev.name)
        monitor.log_event(monitor.Event("again", now(), {}))

    handle = register(again)
    with pytest.warns(TelemetryWarning, match="deep"):
        monitor.log_event(monitor.Event("start", now(), {}))  # no RecursionError
    assert calls[0] == "start"
    assert len(calls) == 8  # docs/compat.md: "cut off 8 levels deep"
    register.unregister(handle)
    # the depth is back to 0 for the next event
    later: list[str] = []
    register(lambda ev: later.append(ev.name))
    monitor.log_event(monitor.Event("later", now(), {}))
    assert later == ["later"]
    assert [r.name for r in read_run(telemetry, "diagnostic")].count("handler_recursion") == 1


# -- D. the pipeline --------------------------------------------------------------------------------------------------


def test_windows_are_stat_records(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    A = monitor.Aggregation
    s = monitor.Stat("loss", [A.VALUE, A.MEAN, A.COUNT, A.SUM, A.MAX, A.MIN], datetime.timedelta(hours=100), 4)
    for v in (1, 2, 3, 6):
        s.add(v)
    (rec,) = [r for r in read_run(telemetry, "stat") if r.name == "loss"]
    assert rec.group == "torch.monitor" == monitor.GROUP
    assert rec.sample_count == 4
    assert list(rec.values) == ["value", "mean", "count", "sum", "max", "min"]
    assert rec.values == {"value": 6, "mean": 3.0, "count": 4, "sum": 12, "max": 6, "min": 1}
    assert rec.start_mono_ns <= rec.mono_ns


def test_logged_events_are_event_records(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    ts = now()
    monitor.log_event(monitor.Event("my.event", ts, {"s": "x", "f": 1.5, "i": 7, "b": True}))
    (rec,) = [r for r in read_run(telemetry, "event") if r.name == "my.event"]
    assert rec.group == "torch.monitor"
    attrs = dict(rec.attributes)
    assert attrs.pop("torch.monitor.timestamp") == pytest.approx(ts.timestamp())
    assert attrs == {"s": "x", "f": 1.5, "i": 7, "b": True}
    assert attrs["b"] is True and type(attrs["i"]) is int


def test_flush_reports_the_open_window(telemetry: telemetrain.Telemetry, register: Registrar, read_run: Any) -> None:
    events: list[Any] = []
    register(events.append)
    s = monitor.Stat("open", [monitor.SUM, monitor.COUNT], datetime.timedelta(hours=100))
    s.add(2)
    s.add(3)
    assert stat_events(events) == []
    assert telemetry.flush()
    assert stat_events(events) == [{"open.sum": 5.0, "open.count": 2.0}]
    recs = [r for r in read_run(telemetry, "stat") if r.name == "open"]
    assert [(r.sample_count, r.values) for r in recs] == [(2, {"sum": 5, "count": 2})]
    assert s.count == 0


def test_close_reports_the_open_window(telemetry: telemetrain.Telemetry) -> None:
    s = monitor.Stat("at_close", [monitor.SUM, monitor.COUNT], datetime.timedelta(hours=100))
    s.add(4)
    assert telemetry.close()
    recs = [r for r in open_run(run_dir_of(telemetry)).records("stat") if r.name == "at_close"]
    assert [(r.group, r.sample_count, r.values) for r in recs] == [("torch.monitor", 1, {"sum": 4, "count": 1})]


def _run_python(code: str, tmp_path: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_exit_reports_the_open_window_and_torch_is_not_imported(tmp_path: Path) -> None:
    out = _run_python(
        f"""
        import sys, datetime
        import telemetrain
        from telemetrain import monitor
        t = telemetrain.Telemetry(store={str(tmp_path)!r})
        telemetrain.set_telemetry(t)
        s = monitor.Stat("at_exit", [monitor.SUM], datetime.timedelta(hours=100))
        s.add(9)
        monitor.log_event(monitor.Event("e", datetime.datetime.now(), {{"b": True}}))
        assert "torch" not in sys.modules, "telemetrain.monitor imported torch"
        print(t.run_dir)
        """,
        tmp_path,
    )
    run = open_run(Path(out.strip().splitlines()[-1]))
    assert [(r.name, r.values) for r in run.records("stat")] == [("at_exit", {"sum": 9})]
    assert [r.name for r in run.records("event")] == ["e"]


# -- E. bad input -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((1, "now", {}), "name"),
        ((None, "now", {}), "name"),
        (("x", 1.0, {}), "timestamp"),
        (("x", "2024-01-01", {}), "timestamp"),
        (("x", "now", {"k": [1]}), "'k'"),
        (("x", "now", {"k": None}), "'k'"),
        (("x", "now", {"k": {"nested": 1}}), "'k'"),
        (("x", "now", {1: 2}), "key"),
        (("x", "now", [("k", 1)]), "data"),
    ],
    ids=["name-int", "name-none", "ts-float", "ts-str", "data-list", "data-none", "data-dict", "data-key", "data-seq"],
)
def test_bad_event_is_type_error(mon: types.ModuleType, args: tuple[Any, ...], field: str) -> None:
    name, ts, data = args
    ts = now() if ts == "now" else ts
    with pytest.raises(TypeError) as info:
        mon.Event(name, ts, data)
    if is_ours(mon):
        assert field in str(info.value)


def test_bad_event_attribute_assignment_is_type_error(mon: types.ModuleType) -> None:
    e = mon.Event("x", now(), {"a": 1})
    with pytest.raises(TypeError):
        e.name = 3
    with pytest.raises(TypeError):
        e.timestamp = "later"
    with pytest.raises(TypeError):
        e.data = {"a": None}
    assert (e.name, e.data) == ("x", {"a": 1})


@pytest.mark.parametrize("value", ["x", None, [1.0]], ids=repr)
def test_stat_add_non_number_is_type_error(mon: types.ModuleType, value: Any) -> None:
    s = mon.Stat("a", [mon.Aggregation.SUM], datetime.timedelta(hours=100))
    with pytest.raises(TypeError):
        s.add(value)


def test_unknown_aggregation_is_value_error(telemetry: telemetrain.Telemetry) -> None:
    with pytest.raises(ValueError, match="unknown aggregation 'bogus'") as info:
        monitor.Stat("u", ["bogus"], datetime.timedelta(hours=1))
    for name in ("value", "count", "sum", "mean", "min", "max", "stddev", "histogram", "p99"):
        assert name in str(info.value)


@pytest.mark.parametrize("aggregations", ["sum", 42, [42], [None]], ids=repr)
def test_aggregations_of_wrong_type_are_type_error(telemetry: telemetrain.Telemetry, aggregations: Any) -> None:
    with pytest.raises(TypeError, match="aggregations"):
        monitor.Stat("u", aggregations, datetime.timedelta(hours=1))


@pytest.mark.parametrize("window", ["60", None, [1]], ids=repr)
def test_window_size_of_wrong_type_is_type_error(telemetry: telemetrain.Telemetry, window: Any) -> None:
    with pytest.raises(TypeError, match="window_size"):
        monitor.Stat("w", [monitor.SUM], window)


@pytest.mark.parametrize("max_samples", [1.5, "5", True], ids=repr)
def test_max_samples_of_wrong_type_is_type_error(telemetry: telemetrain.Telemetry, max_samples: Any) -> None:
    with pytest.raises(TypeError, match="max_samples"):
        monitor.Stat("m", [monitor.SUM], datetime.timedelta(hours=1), max_samples)


def test_log_event_of_non_event_is_type_error(mon: types.ModuleType) -> None:
    other = monitor if mon is tm else tm
    with pytest.raises(TypeError):
        mon.log_event("event")
    with pytest.raises(TypeError):
        mon.log_event(None)
    with pytest.raises(TypeError):
        mon.log_event(other.Event("x", now(), {}))  # the other module's Event


def test_log_event_of_non_event_names_the_argument(telemetry: telemetrain.Telemetry) -> None:
    with pytest.raises(TypeError, match="event must be"):
        monitor.log_event({"name": "x"})  # type: ignore[arg-type]


@pytest.mark.parametrize("callback", [42, "print", object()], ids=repr)
def test_register_non_callable_is_type_error(mon: types.ModuleType, callback: Any) -> None:
    with pytest.raises(TypeError):
        mon.register_event_handler(callback)


def test_register_none_is_type_error(telemetry: telemetrain.Telemetry) -> None:
    # torch accepts None (an empty std::function) and every later log_event then raises RuntimeError
    # "bad_function_call"; never run there, it would poison torch's process-global handler list
    with pytest.raises(TypeError, match="callable"):
        monitor.register_event_handler(None)  # type: ignore[arg-type]


def test_tensorboard_handler_needs_a_writer(telemetry: telemetrain.Telemetry) -> None:
    with pytest.raises(TypeError, match="add_scalar"):
        monitor.TensorboardEventHandler(object())


def test_tensorboard_handler_ignores_other_events(mon: types.ModuleType) -> None:
    calls: list[tuple[Any, ...]] = []

    class Writer:
        def add_scalar(self, *args: Any, **kwargs: Any) -> None:
            calls.append((args, kwargs))

    h = mon.TensorboardEventHandler(Writer())
    h(mon.Event("not.a.stat", now(), {"a": 1.0}))
    assert calls == []
    ts = now()
    h(mon.Event(mon.STAT_EVENT, ts, {"a.sum": 2.0}))
    assert calls == [(("a.sum", 2.0), {"walltime": pytest.approx(ts.timestamp())})]


# -- F. extras --------------------------------------------------------------------------------------------------------


def test_quantiles_stddev_histogram(telemetry: telemetrain.Telemetry, register: Registrar, read_run: Any) -> None:
    events: list[Any] = []
    register(events.append)
    A = monitor.Aggregation
    s = monitor.Stat(
        "q", [A.P50, A.P90, A.P99, "p99.9", A.STDDEV, A.HISTOGRAM, A.COUNT], datetime.timedelta(hours=100), 100
    )
    samples = list(range(1, 101))
    for v in samples:
        s.add(v)
    got = s.get()
    assert got[A.P50] == pytest.approx(np.percentile(samples, 50))
    assert got[A.P90] == pytest.approx(np.percentile(samples, 90))
    assert got[A.P99] == pytest.approx(np.percentile(samples, 99))
    assert got["p99.9"] == pytest.approx(np.percentile(samples, 99.9))
    assert got[A.STDDEV] == pytest.approx(np.std(samples))  # population, numpy's default
    assert got[A.COUNT] == 100.0
    assert A.HISTOGRAM not in got  # not a number: in the stat record instead
    assert all(type(v) is float for v in got.values())
    (data,) = stat_events(events)
    assert set(data) == {"q.p50", "q.p90", "q.p99", "q.p99.9", "q.stddev", "q.count"}
    assert all(type(v) is float for v in data.values())
    (rec,) = [r for r in read_run(telemetry, "stat") if r.name == "q"]
    assert rec.histogram is not None
    assert rec.values["p50"] == pytest.approx(50.5)


def test_rate(telemetry: telemetrain.Telemetry) -> None:
    s = monitor.Stat("r", [monitor.RATE, monitor.COUNT], datetime.timedelta(hours=100), 10)
    for _ in range(10):
        s.add(1)
    got = s.get()
    assert got[monitor.COUNT] == 10.0
    assert got[monitor.RATE] > 0 and math.isfinite(got[monitor.RATE])


def test_report_empty_gives_count_zero_windows(
    telemetry: telemetrain.Telemetry, register: Registrar, read_run: Any
) -> None:
    events: list[Any] = []
    register(events.append)
    quiet = monitor.Stat("quiet", [monitor.COUNT, monitor.SUM], 0.02)
    loud = monitor.Stat("loud", [monitor.COUNT, monitor.SUM], 0.02, report_empty=True)
    quiet.add(1)
    loud.add(1)

    def empties(name: str) -> list[dict[str, Any]]:
        return [d for d in stat_events(events) if d.get(f"{name}.count") == 0.0]

    assert wait_for(lambda: len(empties("loud")) >= 2, 5.0), "no empty window reported"
    assert empties("loud")[0] == {"loud.count": 0.0, "loud.sum": 0.0}
    time.sleep(0.05)  # a couple more boundaries for the quiet one
    assert empties("quiet") == []  # the default (as torch): empty windows emit nothing
    assert [d["quiet.count"] for d in stat_events(events) if "quiet.count" in d] == [1.0]
    recs = read_run(telemetry, "stat")
    assert any(r.name == "loud" and r.sample_count == 0 for r in recs)
    assert not any(r.name == "quiet" and r.sample_count == 0 for r in recs)


def test_the_sign_of_infinite_samples(mon: types.ModuleType, register: Registrar) -> None:
    """compat.md's row: torch's arithmetic keeps an infinity's sign in max/min/sum/mean; ours counts +inf and -inf
    alike in ``inf_count`` and leaves them out of the aggregates, so a window of -inf only reports its counts (and
    the sum of its finite samples: 0);
    VALUE (broken in torch: it records nothing) keeps the last sample as it is."""
    events: list[Any] = []
    register(events.append, mon)
    agg = mon.Aggregation
    s = mon.Stat("grad", (agg.VALUE, agg.SUM, agg.MEAN, agg.MAX, agg.MIN, agg.COUNT), datetime.timedelta(hours=1), 2)
    for value in (float("-inf"), float("-inf")):
        s.add(value)
    (data,) = [e.data for e in events if e.name == "torch.monitor.Stat"]
    if is_ours(mon):
        # sum: that of the finite samples (none), as in a window that mixes them
        assert data == {"grad.value": float("-inf"), "grad.sum": 0.0, "grad.count": 2.0, "grad.inf_count": 2.0}
    else:
        assert data == {"grad.sum": float("-inf"), "grad.mean": float("-inf"), "grad.max": float("-inf"),
                        "grad.min": float("-inf"), "grad.count": 2.0}


def test_a_tensor_sample_is_refused_rather_than_synchronised(mon: types.ModuleType, register: Registrar) -> None:
    """compat.md's row: torch converts a 0-d tensor itself (on CUDA, a device sync inside ``add``); ours refuses it
    with the hint to call ``.item()``, and takes numpy scalars, bools and ints as torch does."""
    import torch

    events: list[Any] = []
    register(events.append, mon)
    agg = mon.Aggregation
    s = mon.Stat("loss", (agg.SUM, agg.COUNT), datetime.timedelta(hours=1), 4)
    for value in (np.float32(2.0), True, 3):
        s.add(value)
    if is_ours(mon):
        with pytest.raises(TypeError, match=r"\.item\(\)"):
            s.add(torch.tensor(1.5))
        s.add(torch.tensor(1.5).item())
    else:
        s.add(torch.tensor(1.5))
    (data,) = [e.data for e in events if e.name == "torch.monitor.Stat"]
    assert data == {"loss.sum": 7.5, "loss.count": 4.0}
