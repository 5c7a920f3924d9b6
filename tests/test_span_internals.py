"""The span and training internals of the speed work, through the real pipeline (a real ``Telemetry`` writing its run
store, real dispatcher and collector threads, the store read back):

1. ``SPAN_PAIR``: a short span travels as one packed tuple and comes back as a ``span_start`` and a ``span_end``;
   ``records.split_span_pair`` / ``unpack_all``; a typed sink gets ``SpanStart`` then ``SpanEnd``.
2. Routing: the pair only where both kinds go to the same sinks; muted groups; the ``span_routes`` cache.
3. The tracer's tick: the start of a span that outlives a tick is written while it is open (and survives SIGKILL).
4. Spans open in any thread at close end ``terminated``; ``Tracer.open_spans``.
5. The recorder's quiet (sampled-out) iterations: current span, sub-spans, failures, attributes, listeners.
6. The ``Reporter``: order, the ``MAX_PENDING`` bound, flush, a failing report, fork.

Nothing here asserts how fast a clock runs: what depends on a background thread is polled for with a generous
deadline (``WAIT_S``), and the tick is made short with ``flush_interval=0.05``.
"""

from __future__ import annotations

import contextvars
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from conftest import ListSink, helper_env, run_dir_of, telemetrain_threads
from telemetrain import SpanEnd, SpanStart, Telemetry
from telemetrain.identity import Identity
from telemetrain.records import SPAN_PAIR, PackedSource, split_span_pair, unpack_all
from telemetrain.sinks import Sink
from telemetrain.spans import Span, current_span, span, tracer
from telemetrain.store import open_run
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig, reports

WAIT_S = 10.0  # only a failure gets near it
TESTS = Path(__file__).parent
ITERATION = "training_single_iteration"


# -- fixtures and helpers ----------------------------------------------------------------------------------------------


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Telemetry]]:
    """``make(default=False, **kwargs)``: a ``Telemetry`` writing under ``tmp_path`` (``default=True``: installed as the
    default instance). Closed at the end of the test, which then waits for the threads it started to end."""
    before = set(telemetrain_threads())
    made: list[Telemetry] = []
    installed = []

    def build(default: bool = False, **kwargs: Any) -> Telemetry:
        t = Telemetry(store=tmp_path, **kwargs)
        made.append(t)
        if default:
            telemetrain.set_telemetry(t)
            installed.append(t)
        return t

    yield build
    if installed:
        telemetrain.reset()
    for t in made:
        t.close()
    _wait_for(lambda: not [th for th in telemetrain_threads() if th not in before])


def _wait_for(predicate: Callable[[], Any], timeout: float = WAIT_S, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def _read(t: Telemetry, kinds: str | None = None) -> list[Any]:
    assert t.flush(), "flush did not finish"
    assert t.run_dir is not None
    return open_run(t.run_dir).records(kinds)


def _read_unflushed(t: Telemetry, kinds: str | None = None) -> list[Any]:
    """What the store holds now (the run directory may not exist yet)."""
    assert t.run_dir is not None
    try:
        return open_run(t.run_dir).records(kinds)
    except (FileNotFoundError, ValueError):
        return []


def _of(records: Sequence[Any], kind: str, name: str | None = None) -> list[Any]:
    return [r for r in records if r.kind == kind and (name is None or r.name == name)]


def _for_id(records: Sequence[Any], span_id: str) -> tuple[list[Any], list[Any]]:
    """(span_start records, span_end records) of one span id."""
    return ([r for r in records if r.kind == "span_start" and r.span_id == span_id],
            [r for r in records if r.kind == "span_end" and r.span_id == span_id])


def _one_pair(records: Sequence[Any], s: Span) -> tuple[Any, Any]:
    starts, ends = _for_id(records, s.span_id_hex)
    assert len(starts) == 1 and len(ends) == 1, f"{s!r}: {len(starts)} starts, {len(ends)} ends"
    return starts[0], ends[0]


class Probe(Sink):
    """A user sink: keeps the kind of every packed tuple it is handed (``write_packed``) and every typed record
    (``write``)."""

    name = "probe"

    def __init__(self) -> None:
        self.packed_kinds: list[str] = []
        self.packed: list[tuple[Any, ...]] = []
        self.records: list[Any] = []
        self._lock = threading.Lock()

    def write_packed(self, packed: Sequence[tuple[Any, ...]], source: PackedSource) -> None:
        with self._lock:
            self.packed_kinds.extend(p[0] for p in packed)
            self.packed.extend(packed)
        super().write_packed(packed, source)

    def write(self, records: Sequence[Any]) -> None:
        with self._lock:
            self.records.extend(records)


def _recorder(t: Telemetry, every: int = 5, **config: Any) -> TrainingRecorder:
    cfg = TrainingTelemetryConfig(global_batch_size_or_fn=1, log_every_n_train_iterations=every, **config)
    r = TrainingRecorder(cfg, telemetry=t)
    r.on_app_start()
    r.on_train_start(0)
    return r


def _begin(r: TrainingRecorder) -> Span:
    """``on_training_single_iteration_start``, which returns the iteration's span."""
    it = r.on_training_single_iteration_start()
    assert it is not None
    return it


def _reports(records: Sequence[Any]) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in _of(records, "event", "training_metrics_update")]


# -- 1. SPAN_PAIR ------------------------------------------------------------------------------------------------------


def test_short_spans_travel_as_one_pair_and_read_back_as_start_and_end(make: Callable[..., Telemetry]) -> None:
    t = make()
    probe = Probe()
    t.add_sink(probe)  # every kind, like the run store: the pair path stays on
    with span("root", telemetry=t, batch=3, tag="a") as root:
        root.set_attribute("loss", 0.5)
        root.set_attribute("tag", "b")  # the same key after the start: the end carries the new value
        with span("child", telemetry=t) as child:
            with span("grandchild", telemetry=t, depth=2) as grandchild:
                pass
        with span("sibling", telemetry=t) as sibling:
            sibling.set_attribute("only_end", True)
    with pytest.raises(ValueError, match="boom"):
        with span("failing", telemetry=t) as failing:
            raise ValueError("boom")
    assert t.span_routes("spans")[2] is True

    records = _read(t)
    # on the way: one tuple per span, no separate start or end tuples
    assert probe.packed_kinds.count(SPAN_PAIR) == 5
    assert "span_start" not in probe.packed_kinds and "span_end" not in probe.packed_kinds

    spans = [root, child, grandchild, sibling, failing]
    for s in spans:
        start, end = _one_pair(records, s)
        assert (start.name, end.name) == (s.name, s.name) and start.group == end.group == "spans"
        assert start.trace_id == s.trace_id_hex and len(start.trace_id) == 32
        assert start.mono_ns == s.start_ns and end.mono_ns == s.end_ns
        assert end.duration_ns == s.end_ns - s.start_ns == end.mono_ns - start.mono_ns
        assert end.wall_ns - start.wall_ns == end.duration_ns  # one record pair, one clock offset
        assert start.identity == end.identity == t.identity
    assert _one_pair(records, root)[0].parent_id == ""
    assert _one_pair(records, child)[0].parent_id == root.span_id_hex
    assert _one_pair(records, grandchild)[0].parent_id == child.span_id_hex
    assert _one_pair(records, sibling)[0].parent_id == root.span_id_hex
    assert _one_pair(records, failing)[0].parent_id == ""
    assert len({_one_pair(records, s)[0].trace_id for s in (root, child, grandchild, sibling)}) == 1
    assert _one_pair(records, failing)[0].trace_id != root.trace_id_hex

    start, end = _one_pair(records, root)
    assert start.attributes == {"batch": 3, "tag": "a"}
    assert end.attributes == {"loss": 0.5, "tag": "b"}
    assert (end.status, end.error) == ("ok", "")
    assert _one_pair(records, grandchild)[0].attributes == {"depth": 2}
    assert _one_pair(records, grandchild)[1].attributes is None
    assert _one_pair(records, sibling)[0].attributes is None
    assert _one_pair(records, sibling)[1].attributes == {"only_end": True}
    assert _one_pair(records, child)[0].attributes is None and _one_pair(records, child)[1].attributes is None
    end = _one_pair(records, failing)[1]
    assert end.status == "error" and "ValueError" in end.error and "boom" in end.error

    # the real packed pair round-trips to what the store gave back
    real = [p for p in probe.packed if p[0] == SPAN_PAIR and p[4] == "root"]
    assert len(real) == 1
    typed = unpack_all(real[0], t.identity, t.wall_offset_ns)
    assert [type(r) for r in typed] == [SpanStart, SpanEnd]
    assert typed[0].attributes == {"batch": 3, "tag": "a"} and typed[1].attributes == {"loss": 0.5, "tag": "b"}
    assert typed[0].span_id == typed[1].span_id == root.span_id_hex


@pytest.mark.parametrize(
    ("before", "after"),
    [({}, {}), ({"a": 1, "b": "x"}, {}), ({}, {"c": 2.5}), ({"a": 1}, {"a": 2, "d": None, "e": "y"})],
    ids=["no-attributes", "start-only", "end-only", "both"],
)
def test_split_span_pair_and_unpack_all_round_trip(before: dict[str, Any], after: dict[str, Any]) -> None:
    identity = Identity(run_id="r", session_tag="s", perf_tag="p", rank=0, local_rank=0, world_size=1, host="h",
                        pid=1)
    span_id, parent_id, trace_id = 0xABC0000000000001, 0xABC0000000000002, (7 << 64) | 0xABC0000000000002
    head = (SPAN_PAIR, 1_000_000, 99, "grp", "nm", span_id, parent_id, trace_id, 500, "error", "E: why")
    # the layout spans.py packs: the head, then (only with attributes) n_start, start keys/values, end keys/values
    packed = head if not (before or after) else (
        *head, len(before), *before, *before.values(), *after, *after.values())
    begin, end = split_span_pair(packed)
    assert begin[:8] == ("span_start", 1_000_000, 99, "grp", "nm", span_id, parent_id, trace_id)
    assert end[:9] == ("span_end", 1_000_500, 99, "grp", "nm", span_id, 500, "error", "E: why")

    offset = 10**18
    start_rec, end_rec = unpack_all(packed, identity, offset)
    assert isinstance(start_rec, SpanStart) and isinstance(end_rec, SpanEnd)
    assert start_rec == SpanStart(1_000_000, 1_000_000 + offset, identity, "grp", "nm", f"{span_id:016x}",
                                  f"{parent_id:016x}", f"{trace_id:032x}", before or None)
    assert end_rec == SpanEnd(1_000_500, 1_000_500 + offset, identity, "grp", "nm", f"{span_id:016x}", 500, "error",
                              after or None, "E: why")


def test_a_typed_sink_gets_span_start_then_span_end(make: Callable[..., Telemetry]) -> None:
    t = make()
    probe = Probe()
    t.add_sink(probe)
    with span("outer", telemetry=t, k="v") as outer:
        with span("inner", telemetry=t) as inner:
            inner.set_attribute("x", 1)
    assert t.flush()
    got = [(type(r), r.span_id) for r in probe.records if r.kind in ("span_start", "span_end")]
    assert got == [(SpanStart, inner.span_id_hex), (SpanEnd, inner.span_id_hex),
                   (SpanStart, outer.span_id_hex), (SpanEnd, outer.span_id_hex)]
    by_kind = {(type(r), r.name): r for r in probe.records}
    assert by_kind[(SpanStart, "inner")].parent_id == outer.span_id_hex
    assert by_kind[(SpanStart, "outer")].attributes == {"k": "v"}
    assert by_kind[(SpanEnd, "inner")].attributes == {"x": 1}
    assert by_kind[(SpanEnd, "inner")].duration_ns == inner.duration_ns


# -- 2. routing --------------------------------------------------------------------------------------------------------


def test_a_span_end_only_sink_turns_the_pair_off(make: Callable[..., Telemetry]) -> None:
    t = make()
    ends_only = ListSink("ends_only")
    t.add_sink(ends_only, kinds=["span_end"])
    with span("a", telemetry=t, start_attr=1) as a:
        with span("b", telemetry=t) as b:
            b.set_attribute("end_attr", 2)
    assert t.span_routes("spans")[2] is False
    records = _read(t)
    assert {r.kind for r in ends_only.records} == {"span_end"}
    assert sorted(r.span_id for r in ends_only.records) == sorted([a.span_id_hex, b.span_id_hex])
    assert [r.attributes for r in ends_only.records if r.name == "b"] == [{"end_attr": 2}]
    a_start, _ = _one_pair(records, a)
    b_start, b_end = _one_pair(records, b)
    assert a_start.attributes == {"start_attr": 1} and b_end.attributes == {"end_attr": 2}
    assert b_start.parent_id == a.span_id_hex


def test_a_muted_group_writes_no_span(make: Callable[..., Telemetry]) -> None:
    t = make()
    t.mute("hush")
    ended: list[str] = []
    tracer(t).on_end("muted", lambda s: ended.append(s.name))
    with span("muted", group="hush", telemetry=t, a=1) as s:
        s.set_attribute("b", 2)
        with span("muted_child", group="hush", telemetry=t):
            pass
    t.event("marker")  # so that the run exists
    records = _read(t)
    assert [r for r in records if r.kind in ("span_start", "span_end")] == []
    assert [r.name for r in records] == ["marker"]
    assert ended == ["muted"]  # listeners still hear it
    assert t.span_routes("hush") == (False, False, False)


def test_the_span_route_cache_follows_sinks_added_and_removed(make: Callable[..., Telemetry]) -> None:
    t = make()
    with span("before", telemetry=t) as before:
        pass
    assert t.span_routes("spans")[2] is True
    late = ListSink("late")
    t.add_sink(late, kinds=["span_end"])
    with span("during", telemetry=t) as during:
        pass
    assert t.span_routes("spans")[2] is False
    assert t.flush()
    assert [(r.kind, r.span_id) for r in late.records] == [("span_end", during.span_id_hex)]

    everything = ListSink("everything")
    t.add_sink(everything)  # all kinds: still not paired (the late sink takes only ends)
    with span("during2", telemetry=t) as during2:
        pass
    assert t.flush()
    assert [(r.kind, r.span_id) for r in everything.records if r.kind.startswith("span")] == [
        ("span_start", during2.span_id_hex), ("span_end", during2.span_id_hex)]

    t.remove_sink(late)
    t.remove_sink(everything)
    with span("after", telemetry=t) as after:
        pass
    assert t.span_routes("spans")[2] is True
    records = _read(t)
    for s in (before, during, during2, after):
        _one_pair(records, s)
    # while attached it got every span end; once removed, nothing more
    assert [r.span_id for r in late.records] == [during.span_id_hex, during2.span_id_hex]


def test_reading_span_routes_first_does_not_stop_the_tick(make: Callable[..., Telemetry]) -> None:
    t = make(flush_interval=0.05)
    tracer(t)
    assert t.span_routes("spans")[2] is True  # a public read of the routes, before any span
    t.event("marker")
    with span("long", telemetry=t) as s:
        found = _wait_for(lambda: _for_id(_read(t), s.span_id_hex)[0], timeout=3.0, interval=0.05)
    assert found, "the start of a span open for many ticks was never written"


# -- 3. the tick -------------------------------------------------------------------------------------------------------


def test_the_tick_writes_the_start_of_a_long_span_while_it_is_open(make: Callable[..., Telemetry]) -> None:
    t = make(flush_interval=0.05)
    t.event("marker")  # the run directory exists from here on
    entered, release = threading.Event(), threading.Event()
    got: dict[str, Any] = {}

    def work() -> None:
        with span("long", telemetry=t, phase="open") as s:
            got["long"] = s
            with span("short_child", telemetry=t) as c:
                got["child"] = c
            entered.set()
            release.wait(WAIT_S)
            s.set_attribute("done", True)

    th = threading.Thread(target=work)
    th.start()
    try:
        assert entered.wait(WAIT_S)
        s = got["long"]
        assert s in tracer(t).open_spans
        # flushing does not write it; only the tick does (within a tick or two of flush_interval=0.05)
        assert _wait_for(lambda: _for_id(_read(t), s.span_id_hex)[0]), "the tick never wrote the start"
        starts, ends = _for_id(_read(t), s.span_id_hex)
        assert len(starts) == 1 and ends == []  # still open: no end yet
        assert starts[0].mono_ns == s.start_ns  # its real start time, not the tick's
        assert starts[0].attributes == {"phase": "open"} and starts[0].parent_id == ""
    finally:
        release.set()
        th.join(WAIT_S)
    assert not th.is_alive()
    records = _read(t)
    start, end = _one_pair(records, s)  # exactly one start: the end did not write it again
    assert end.status == "ok" and end.attributes == {"done": True}
    assert end.duration_ns == s.end_ns - s.start_ns
    child_start, _ = _one_pair(records, got["child"])
    assert child_start.parent_id == s.span_id_hex and child_start.trace_id == start.trace_id
    assert tracer(t).open_spans == []


def test_spans_ending_around_the_tick_have_exactly_one_start_and_end(make: Callable[..., Telemetry]) -> None:
    """Spans of 0-80 ms in four threads with a 50 ms tick: the tick and the end race for each one's start."""
    t = make(flush_interval=0.05)
    done: list[Span] = []
    lock = threading.Lock()

    def work(seed: int) -> None:
        for i in range(25):
            with span("racer", telemetry=t, seed=seed, i=i) as s:
                time.sleep(((seed * 31 + i * 17) % 9) * 0.01)
            with lock:
                done.append(s)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(WAIT_S * 3)
    assert len(done) == 100
    records = _read(t)
    for s in done:
        start, end = _one_pair(records, s)
        assert start.mono_ns == s.start_ns and end.mono_ns == s.end_ns and end.status == "ok"
        assert start.attributes == {"seed": start.attributes["seed"], "i": start.attributes["i"]}
    assert len(_of(records, "span_start", "racer")) == len(_of(records, "span_end", "racer")) == 100
    assert tracer(t).open_spans == []


_SIGKILL_CHILD = """
import os, signal, sys, time
from telemetrain import Telemetry
from telemetrain.spans import span
from telemetrain.store import open_run

t = Telemetry(store=sys.argv[1], flush_interval=0.05)
t.event("child_up")
with span("doomed", telemetry=t, why="sigkill") as s:
    print(s.span_id_hex, flush=True)
    deadline = time.monotonic() + 15  # the tick writes the start within a tick or two; this is only a bound
    while time.monotonic() < deadline:
        time.sleep(0.02)
        try:
            if any(r.name == "doomed" for r in open_run(t.run_dir).records("span_start")):
                break
        except Exception:
            pass
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_span_open_past_a_tick_is_in_the_store_after_sigkill(tmp_path: Path) -> None:
    run_id, session = f"kill-{uuid.uuid4().hex[:8]}", "span-internals"
    proc = subprocess.run([sys.executable, "-c", _SIGKILL_CHILD, str(tmp_path)], capture_output=True, text=True,
                          env=helper_env(run_id, session), cwd=TESTS, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    span_id = proc.stdout.strip()
    records = open_run(tmp_path / session / run_id).records()
    starts, ends = _for_id(records, span_id)
    assert [(r.name, r.attributes) for r in starts] == [("doomed", {"why": "sigkill"})], proc.stderr
    assert ends == []  # killed: the reader shows it open


# -- 4. terminated at close ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("ticked", [False, True], ids=["start-not-written-yet", "start-written-by-the-tick"])
def test_a_with_span_open_in_another_thread_ends_terminated_at_close(
    make: Callable[..., Telemetry], ticked: bool
) -> None:
    # flush_interval 30 s: no tick before the close (the span is still waiting to travel as a pair); 0.05: ticked
    t = make(flush_interval=0.05 if ticked else 30.0)
    entered, release = threading.Event(), threading.Event()
    got: dict[str, Any] = {}

    def work() -> None:
        try:
            with span("worker", telemetry=t) as s:
                got["span"] = s
                entered.set()
                release.wait(WAIT_S)
                s.set_attribute("late", 1)  # after the close: recorded nowhere
            got["end_ns_after_exit"] = s.end_ns
        except BaseException as exc:  # noqa: BLE001 - the test checks that nothing was raised
            got["raised"] = exc

    th = threading.Thread(target=work)
    th.start()
    try:
        assert entered.wait(WAIT_S)
        s = got["span"]
        t.event("marker")
        if ticked:
            assert _wait_for(lambda: _for_id(_read(t), s.span_id_hex)[0]), "the tick never wrote the start"
        assert s in tracer(t).open_spans
        assert t.close()
        assert s.status == "terminated" and s.ended
        end_ns = s.end_ns
        records = open_run(run_dir_of(t)).records()
        start, end = _one_pair(records, s)
        assert end.status == "terminated" and "still open" in end.error
        assert end.duration_ns == end_ns - s.start_ns and start.mono_ns == s.start_ns
    finally:
        release.set()
        th.join(WAIT_S)
    assert not th.is_alive()
    assert "raised" not in got, got.get("raised")
    assert got["end_ns_after_exit"] == end_ns and s.status == "terminated"  # its exit changed nothing
    records = open_run(run_dir_of(t)).records()
    assert len(_for_id(records, s.span_id_hex)[0]) == 1 and len(_for_id(records, s.span_id_hex)[1]) == 1
    assert tracer(t).open_spans == []


def test_leaving_a_with_span_terminated_at_close_restores_the_threads_current_span(
    make: Callable[..., Telemetry]
) -> None:
    t = make()
    entered, release = threading.Event(), threading.Event()
    got: dict[str, Any] = {}

    def work() -> None:
        with span("worker", telemetry=t):
            entered.set()
            release.wait(WAIT_S)
        got["after"] = current_span()

    th = threading.Thread(target=work)
    th.start()
    assert entered.wait(WAIT_S)
    t.close()
    release.set()
    th.join(WAIT_S)
    assert got["after"] is None


def test_open_spans_lists_the_open_spans_of_every_thread(make: Callable[..., Telemetry]) -> None:
    t = make()
    tr = tracer(t)
    ready = [threading.Event(), threading.Event()]
    release = threading.Event()
    got: dict[int, Span] = {}

    def work(n: int) -> None:
        with span(f"thread{n}", telemetry=t) as s:
            got[n] = s
            ready[n].set()
            release.wait(WAIT_S)

    with span("main_with", telemetry=t) as main_with:
        started = tr.start("main_started", make_current=False)
        threads = [threading.Thread(target=work, args=(n,)) for n in range(2)]
        for n, th in enumerate(threads):
            th.start()
            assert ready[n].wait(WAIT_S)  # one after the other: their start order is known
        try:
            assert tr.open_spans == [main_with, started, got[0], got[1]]  # oldest first
        finally:
            release.set()
            for th in threads:
                th.join(WAIT_S)
        assert tr.open_spans == [main_with, started]
        started.end()
    assert tr.open_spans == []


# -- 5. the recorder's quiet iterations ---------------------------------------------------------------------------


def test_quiet_iterations_are_current_and_their_sub_spans_timed_but_not_exported(
    make: Callable[..., Telemetry]
) -> None:
    t = make(default=True)
    r = _recorder(t, every=5)
    loop = r._loop
    assert loop is not None and current_span() is loop
    seen = []
    forwards: list[Span] = []
    for k in range(10):
        it = _begin(r)
        cur = current_span()
        with span("model_forward", group="training") as fwd:
            inner = current_span()
        forwards.append(fwd)
        r.on_training_single_iteration_end()
        seen.append((k, it, cur, fwd, inner, current_span()))
    iteration_ids = []
    for k, it, cur, fwd, inner, after in seen:
        exported = k % 5 == 0
        assert cur is it and cur is not None and cur.name == ITERATION and cur.exported is exported, k
        assert fwd.parent is it and fwd.exported is exported and inner is fwd, k
        assert after is loop, k
        if exported:
            iteration_ids.append(it.span_id_hex)
        else:
            assert it.span_id_hex == "" and fwd.span_id_hex == ""
    r.on_train_end()
    records = _read(t)
    fwd_starts = _of(records, "span_start", "model_forward")
    assert [f.parent_id for f in fwd_starts] == iteration_ids  # only the exported iterations' forwards
    assert len(_of(records, "span_end", "model_forward")) == 2
    assert [s.span_id for s in _of(records, "span_start", ITERATION)] == iteration_ids
    assert {s.parent_id for s in _of(records, "span_start", ITERATION)} == {loop.span_id_hex}
    # every iteration's forward time reaches the split, exported or not
    reps = _reports(records)
    assert [a["current_iteration"] for a in reps] == [4, 9]
    for n, a in enumerate(reps):
        window = forwards[5 * n:5 * n + 5]
        assert a["window_iterations"] == 5
        assert a["avg_forward_time_sec"] == pytest.approx(sum(f.duration_ns / 1e9 for f in window) / 5, rel=1e-9)
    r.on_app_end()


def test_a_failure_in_a_quiet_iteration_exports_the_child_and_the_iteration(make: Callable[..., Telemetry]) -> None:
    t = make(default=True)
    r = _recorder(t, every=5)
    loop = r._loop
    assert loop is not None
    iterations: list[Span] = []
    got: dict[str, Span] = {}
    for k in range(4):
        it = _begin(r)
        iterations.append(it)
        if k == 2:  # sampled out
            assert not it.exported
            with pytest.raises(RuntimeError, match="nan loss"):
                with span("model_backward", group="training") as got["failed"]:
                    raise RuntimeError("nan loss")
            assert got["failed"].exported and it.exported
            with span("optimizer_update", group="training") as got["sibling"]:  # the iteration is exported now
                pass
            assert got["sibling"].exported and got["sibling"].parent is it
        r.on_training_single_iteration_end()
        assert current_span() is loop
    quiet_after = _begin(r)  # k = 4: a fresh quiet span, not the exported one
    assert not quiet_after.exported and quiet_after is not iterations[2]
    r.on_training_single_iteration_end()
    r.on_train_end()
    records = _read(t)

    child_start, child_end = _one_pair(records, got["failed"])
    it_start, it_end = _one_pair(records, iterations[2])
    assert child_end.status == "error" and "nan loss" in child_end.error
    assert child_start.parent_id == it_start.span_id == iterations[2].span_id_hex
    assert it_start.parent_id == loop.span_id_hex and it_start.trace_id == child_start.trace_id
    assert it_start.mono_ns == iterations[2].start_ns  # its real start
    assert it_end.status == "ok" and it_end.mono_ns == iterations[2].end_ns
    assert _one_pair(records, got["sibling"])[0].parent_id == it_start.span_id
    # exported iterations: the sampled one (k = 0) and the failed one; the others are not in the store
    assert sorted(s.span_id for s in _of(records, "span_start", ITERATION)) == sorted(
        [iterations[0].span_id_hex, iterations[2].span_id_hex])
    assert len(_of(records, "span_end", ITERATION)) == 2
    r.on_app_end()


def test_attributes_set_on_a_quiet_iteration_do_not_leak(make: Callable[..., Telemetry]) -> None:
    t = make(default=True)
    r = _recorder(t, every=5)
    spans: list[Span] = []
    for k in range(6):
        it = _begin(r)
        spans.append(it)
        if k == 1:
            assert current_span() is it
            it.set_attribute("leak", k)
        if k == 2:  # the same quiet span, reused: what k = 1 set is gone
            it.set_attribute("mine", k)
            with pytest.raises(KeyError):
                with span("data_loading", group="training"):
                    raise KeyError("no batch")
        r.on_training_single_iteration_end()
    r.on_train_end()
    assert spans[1] is spans[2]  # the reused quiet span (that is what could leak)
    records = _read(t)
    _, failed_end = _one_pair(records, spans[2])
    assert failed_end.attributes == {"mine": 2}
    _, exported_end = _one_pair(records, spans[5])
    assert exported_end.attributes is None
    assert all("leak" not in (rec.attributes or {}) for rec in records if rec.kind in ("span_start", "span_end"))
    r.on_app_end()


def test_an_iteration_listener_is_called_for_every_iteration_with_an_ended_span(
    make: Callable[..., Telemetry]
) -> None:
    t = make(default=True)
    r = _recorder(t, every=5)
    calls: list[tuple[bool, bool, int, str]] = []
    tracer(t).on_end(ITERATION, lambda s: calls.append((s.ended, s.exported, s.duration_ns, s.name)))
    durations = []
    for _ in range(12):
        it = _begin(r)
        with span("zero_grad", group="training"):
            pass
        r.on_training_single_iteration_end()
        durations.append(it.end_ns - it.start_ns if it.exported else None)
    r.on_train_end()
    assert len(calls) == 12
    assert [c[1] for c in calls] == [k % 5 == 0 for k in range(12)]
    assert all(c[0] for c in calls) and all(c[3] == ITERATION for c in calls)
    assert all(c[2] >= 0 for c in calls)
    for c, d in zip(calls, durations, strict=True):
        if d is not None:
            assert c[2] == d
    r.on_app_end()


def test_a_quiet_iteration_is_current_under_a_user_span_inside_the_loop(make: Callable[..., Telemetry]) -> None:
    t = make(default=True)
    r = _recorder(t, every=5)
    got = []
    with span("epoch", group="training"):
        for _ in range(3):
            it = _begin(r)
            with span("model_forward", group="training") as fwd:
                pass
            got.append((current_span() is it, fwd.parent is it, fwd.exported is it.exported))
            r.on_training_single_iteration_end()
    r.on_train_end()
    assert got == [(True, True, True)] * 3
    r.on_app_end()


def test_a_span_of_another_thread_is_not_swallowed_by_a_quiet_iteration(make: Callable[..., Telemetry]) -> None:
    t = make(default=True)
    r = _recorder(t, every=5)
    ctx = contextvars.copy_context()  # a worker thread that inherits the loop as its current span
    got: list[Span] = []

    def upload() -> None:
        with span("checkpoint_upload", group="training") as s:
            got.append(s)

    for _ in range(3):
        r.on_training_single_iteration_start()
        th = threading.Thread(target=ctx.run, args=(upload,))
        th.start()
        th.join(WAIT_S)
        r.on_training_single_iteration_end()
    r.on_train_end()
    assert [(s.parent.name if s.parent else None, s.exported) for s in got] == [("training_loop", True)] * 3
    r.on_app_end()


# -- 6. the reporter -------------------------------------------------------------------------------------------------


def test_reports_come_out_in_order_when_the_loop_outruns_the_collector(make: Callable[..., Telemetry]) -> None:
    t = make(default=True, queue_capacity=1_000_000)
    r = _recorder(t, every=10, warmup_iterations=0)
    start, end = r.on_training_single_iteration_start, r.on_training_single_iteration_end
    for _ in range(20_000):
        start()
        end()
    r.on_train_end()
    records = _read(t, "event")
    reps = _reports(records)
    assert len(reps) == 2000
    assert [a["current_iteration"] for a in reps] == list(range(9, 20_000, 10))
    assert [a["num_iterations"] for a in reps] == list(range(10, 20_001, 10))
    assert all(a["window_iterations"] == 10 for a in reps) and not any(a["final"] for a in reps)
    assert r.errors == 0 and not r._reporter._pending
    r.on_app_end()


def test_pending_reports_stay_within_max_pending_and_none_is_lost(
    make: Callable[..., Telemetry], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reports, "MAX_PENDING", 2)
    t = make(default=True, queue_capacity=1_000_000)
    r = _recorder(t, every=1, warmup_iterations=0)
    pending = r._reporter._pending
    lengths = []
    # first with the collector thread held off (it waits for the reporter's lock, which this thread holds
    # re-entrantly): only the bound makes the training thread compute; then with the collector free
    with r._reporter._lock:
        for _ in range(300):
            r.on_training_single_iteration_start()
            r.on_training_single_iteration_end()
            lengths.append(len(pending))
    for _ in range(3000):
        r.on_training_single_iteration_start()
        r.on_training_single_iteration_end()
        lengths.append(len(pending))
    r.on_train_end()
    assert max(lengths) == 2  # reached (the collector was held off), never passed
    reps = _reports(_read(t, "event"))
    assert [a["current_iteration"] for a in reps] == list(range(3300))
    assert r.errors == 0
    r.on_app_end()


def test_a_flush_mid_training_makes_every_report_so_far_visible(
    make: Callable[..., Telemetry], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = make(default=True)
    r = _recorder(t, every=10, warmup_iterations=0)
    monkeypatch.setattr(r._reporter, "tick", lambda now_ns: None)  # the collector computes nothing: only the flush
    for _ in range(95):
        r.on_training_single_iteration_start()
        r.on_training_single_iteration_end()
    assert len(r._reporter._pending) == 9
    assert t.flush()
    assert not r._reporter._pending
    reps = _reports(open_run(run_dir_of(t)).records("event"))
    assert [a["current_iteration"] for a in reps] == list(range(9, 95, 10))
    for _ in range(5):
        r.on_training_single_iteration_start()
        r.on_training_single_iteration_end()
    r.on_train_end()
    reps = _reports(_read(t, "event"))
    assert [a["current_iteration"] for a in reps] == list(range(9, 100, 10))
    r.on_app_end()


def test_a_report_that_raises_is_an_error_event_and_the_next_reports_follow(
    make: Callable[..., Telemetry], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = make(default=True)
    real = reports.compute
    calls = {"n": 0}

    def compute_once_failing(snap: Any, state: Any, behind: bool = False) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 3:
            raise ZeroDivisionError("injected")
        return real(snap, state, behind)

    monkeypatch.setattr(reports, "compute", compute_once_failing)
    r = _recorder(t, every=10, warmup_iterations=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(60):
            r.on_training_single_iteration_start()
            r.on_training_single_iteration_end()
        r.on_train_end()
        records = _read(t, "event")
    assert calls["n"] == 6
    assert [a["current_iteration"] for a in _reports(records)] == [9, 19, 39, 49, 59]
    errors = [e for e in records if e.name == "error"]
    assert len(errors) == 1 and errors[0].severity == "error" and errors[0].group == "training"
    assert errors[0].attributes["callback"] == "training_metrics_update"
    assert "ZeroDivisionError" in errors[0].attributes["error_message"]
    assert "injected" in errors[0].attributes["error_message"]
    assert r.errors == 1
    assert any("training_metrics_update" in str(w.message) for w in caught)
    r.on_app_end()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_with_pending_reports_does_not_duplicate_them(make: Callable[..., Telemetry]) -> None:
    t = make(default=True)
    r = _recorder(t, every=10, warmup_iterations=0)
    # hold the collector off (it waits for the reporter's lock) so that reports are pending at the fork
    with r._reporter._lock:
        for _ in range(50):
            r.on_training_single_iteration_start()
            r.on_training_single_iteration_end()
        assert len(r._reporter._pending) == 5
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork of a multi-threaded process (3.12+)
            pid = os.fork()
        if pid == 0:  # the child: a flush would write the parent's pending reports if it had kept them
            code = 1
            try:
                signal.alarm(20)  # never outlive the test
                code = 0 if t.flush(5.0) and not r._reporter._pending else 2
            finally:
                os._exit(code)
    deadline = time.monotonic() + WAIT_S * 2
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    assert os.waitstatus_to_exitcode(status) == 0
    for _ in range(10):
        r.on_training_single_iteration_start()
        r.on_training_single_iteration_end()
    r.on_train_end()
    reps = _reports(_read(t, "event"))
    assert [a["current_iteration"] for a in reps] == list(range(9, 60, 10))  # each once, whichever process
    r.on_app_end()


# -- the tick under concurrent span churn ------------------------------------------------------------------------


def test_the_tick_survives_spans_started_and_ended_in_other_threads(make: Callable[..., Telemetry]) -> None:
    t = make(flush_interval=0.05)
    t.mute("bulk")  # churn without records: only the tracer's bookkeeping is exercised
    tr = tracer(t)
    held = [tr.start("held", group="bulk", make_current=False) for _ in range(50_000)]
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            tr.start("churn", group="bulk", make_current=False).end()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # many thread switches, so a switch lands inside the tick's loop
    th = threading.Thread(target=churn)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            th.start()
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and not caught:
                with span("long", telemetry=t):  # open past a tick: the tick has a deferred span to write
                    time.sleep(0.06)
    finally:
        stop.set()
        th.join(WAIT_S)
        sys.setswitchinterval(old)
    for s in held:
        s.end()
    failures = [str(w.message) for w in caught if "task failed" in str(w.message)]
    assert failures == []
    t.event("marker")
    with span("after_churn", telemetry=t) as s:
        found = _wait_for(lambda: _for_id(_read(t), s.span_id_hex)[0], timeout=3.0, interval=0.05)
    assert found, "the tick no longer writes the start of a long span"


def test_a_callback_span_terminated_at_close_is_no_longer_current(tmp_path: Path) -> None:
    """A span from Tracer.start (made current) still open at close: ended as terminated, and what was current at its
    start is current again, so later spans in this thread do not become its children."""
    t = Telemetry(store=tmp_path)
    before = current_span()
    s = tracer(t).start("left_open")
    assert current_span() is s
    t.close()
    assert s.status == "terminated" and current_span() is before
