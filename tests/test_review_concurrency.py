"""Review findings: concurrency and data loss in the delivery path (dispatch, telemetry, process hooks), the
compatible APIs and the reader.

Each test states the guarantee it checks and fails on the code it was written against. Timeouts only turn a hang
into a failure; no test asserts how long something took.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from conftest import ListSink, run_dir_of
from telemetrain import MetricPoint, Telemetry, TelemetryWarning, events, metrics
from telemetrain.dispatch import BackgroundRunner
from telemetrain.sinks.base import Sink
from telemetrain.store import open_run
from telemetrain.telemetry import _default

HANG_S = 20.0  # generous: only turns a hang into a failure


class GatedSink(ListSink):
    """``write`` signals ``entered`` and then waits for ``gate`` before keeping the batch."""

    def __init__(self, name: str = "gated") -> None:
        super().__init__(name)
        self.entered = threading.Event()
        self.gate = threading.Event()

    def write(self, records: Sequence[Any]) -> None:
        self.entered.set()
        self.gate.wait(HANG_S)
        super().write(records)


def _runner(t: Telemetry, sink: Sink) -> Any:
    [a] = [a for a in t._router.attachments if a.sink is sink]
    return a.runner


def _wait_until(cond: Callable[[], bool], what: str, timeout: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


def _join_worker(runner: Any) -> None:
    """Wait for an abandoned (released) dispatcher thread to end, so the test leaks no thread."""
    thread = runner._thread
    if thread is not None:
        thread.join(HANG_S)


@pytest.fixture
def quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TelemetryWarning)
        yield


# -- 1. the worker's drain loop runs until the queue is empty: with steady input it never ends ----------------------


class SlowSink(ListSink):
    """A sink that takes a while per batch (a network backend, a slow terminal)."""

    def write(self, records: Sequence[Any]) -> None:
        time.sleep(0.02)
        super().write(records)


def test_flush_completes_while_producers_keep_emitting(quiet: None) -> None:
    """flush() delivers what was queued *before* the call. ``_drain_once`` loops ``while queue:``, so as long as one
    record arrives during each write, the loop never ends: the flush request is never acknowledged and flush()
    times out (False) although everything emitted before it was written long ago. (close() then abandons the sink
    and clears its queue, and the wall-clock offset is never re-read: ``_on_wake`` runs once per loop.)"""
    t = Telemetry(store=False)
    sink = SlowSink("slow")
    t.add_sink(sink)
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            t.metric("step", i, "train")
            i += 1
            time.sleep(0.001)  # a modest, steady rate: ~1 record per ms

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        _wait_until(lambda: len(sink.records) > 0, "the first batch")
        t.metric("marker", 1, "train")
        flushed = t.flush(timeout=3.0)
        marker_written = any(r.name == "marker" for r in list(sink.records))
    finally:
        stop.set()
        producer.join(HANG_S)
        t.close()
    assert marker_written, "the record emitted before flush() was not written"
    assert flushed, "flush() timed out although everything emitted before it had been written"


class SelfReportingSink(ListSink):
    """A sink that records a metric about each batch it writes, into the Telemetry it belongs to."""

    def __init__(self, t: Telemetry) -> None:
        super().__init__("self_reporting")
        self.t = t
        self.batches = 0

    def write(self, records: Sequence[Any]) -> None:
        self.batches += 1
        super().write(records)
        self.t.metric("batch_size", len(records), "sink_stats")


def test_sink_that_emits_from_write_does_not_spin_forever(quiet: None) -> None:
    """A sink whose write() emits one record that it listens to itself refills its own queue on every write, so
    the ``while queue:`` drain loop spins forever (hundreds of thousands of one-record batches per second, one core
    busy) and flush() never completes."""
    t = Telemetry(store=False)
    sink = SelfReportingSink(t)
    t.add_sink(sink)
    try:
        t.metric("loss", 0.5, "train")
        flushed = t.flush(timeout=2.0)
    finally:
        t.close()
    assert flushed, f"flush() never completed: the sink's own records kept the drain loop busy ({sink.batches} batches)"


# -- 2. an exception whose str() fails escapes the containment ------------------------------------------------------


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")


class UnprintableFailingSink(Sink):
    def __init__(self, *, background: bool) -> None:
        self.name = "unprintable"
        self.background = background

    def write(self, records: Sequence[Any]) -> None:
        raise UnprintableError()


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_sink_exception_with_failing_str_is_contained(background: bool, quiet: None) -> None:
    """``_on_failure`` formats ``f"{type(exc).__name__}: {exc}"`` outside any try: if ``str(exc)`` raises, that error
    escapes. Inline, it reaches the caller of ``metric()``; in the background it kills the dispatcher thread, after
    which flush() drains in the caller's thread and raises there (and records are silently never delivered)."""
    t = Telemetry(store=False)
    sink = UnprintableFailingSink(background=background)
    t.add_sink(sink)
    try:
        t.metric("x", 1, "train")  # must not raise
        assert t.flush(HANG_S)  # must not raise
        t.metric("x", 2, "train")
        assert t.flush(HANG_S)
        [stats] = t.health()["sinks"]
        assert stats["failures"] == 2 and stats["failed"] == 2, stats
        if background:
            assert _runner(t, sink).running, "the dispatcher thread died"
    finally:
        t.close()


class UnprintableEverywhereError(Exception):
    """``str()`` raises and ``repr()`` returns a non-string: a warning that formats either fails."""

    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")

    def __repr__(self) -> Any:
        return 42


class UnprintableEventHandler(events.EventHandler):
    def record(self, event: events.Event) -> None:
        raise UnprintableEverywhereError()


class UnprintableMetricHandler(metrics.MetricHandler):
    def emit(self, metric_data: Any) -> None:
        raise UnprintableEverywhereError()


def test_compatible_api_handler_exception_with_failing_repr_is_contained(telemetry: Telemetry, quiet: None) -> None:
    """events.record() and a hand-built MetricStream warned with ``{exc!r}`` inside their containment: a handler's
    exception whose repr fails (or is not a str) reached the caller instead of being warned about."""
    events.configure(UnprintableEventHandler())
    try:
        with pytest.warns(RuntimeWarning, match="handler UnprintableEventHandler raised UnprintableEverywhereError"):
            events.record(events.Event("handler_fails", events.EventSource.WORKER))  # must not raise
    finally:
        events.configure(events.NullEventHandler())
    with pytest.warns(Warning, match="handler UnprintableMetricHandler raised UnprintableEverywhereError"):
        metrics.MetricStream("train", UnprintableMetricHandler()).add_value("x", 1.0)  # must not raise


class InterruptedMetricHandler(metrics.MetricHandler):
    def emit(self, metric_data: Any) -> None:
        raise KeyboardInterrupt


def test_ctrl_c_in_a_hand_built_metric_streams_handler_reaches_the_main_thread(telemetry: Telemetry,
                                                                                quiet: None) -> None:
    """containment.is_interrupt: the main thread's KeyboardInterrupt is the user's Ctrl-C and is never swallowed;
    a hand-built MetricStream's handler swallowed it."""
    with pytest.raises(KeyboardInterrupt):
        metrics.MetricStream("train", InterruptedMetricHandler()).add_value("x", 1.0)


# -- 3. close() of a stuck sink forgets its queue without counting it --------------------------------------------------


def test_close_of_stuck_sink_counts_abandoned_records_as_dropped(quiet: None) -> None:
    """close() gives up on a stuck sink and clears its queue (``self._queue.clear()``) without counting what was in
    it: delivered + dropped + failed no longer adds up to what was offered, and nothing reports the loss."""
    t = Telemetry(store=False)
    sink = GatedSink()
    t.add_sink(sink)
    runner = _runner(t, sink)
    try:
        t.metric("x", 0, "train")
        assert sink.entered.wait(HANG_S)  # the writer is stuck on record 0
        for i in range(1, 11):
            t.metric("x", i, "train")  # queued behind it
        assert t.close(timeout=0.3) is False  # the sink is stuck: close gives up
    finally:
        sink.gate.set()
        _join_worker(runner)
    [stats] = t.health()["sinks"]
    assert stats["delivered"] == 1  # record 0, once released
    assert stats["delivered"] + stats["dropped"] + stats["failed"] == 11, stats


# -- 4. a close() that finds a close in progress returns True at once --------------------------------------------------


def test_second_close_waits_for_the_close_in_progress(quiet: None) -> None:
    """``Telemetry.close`` sets ``_closed`` first, so a second close() (another thread, the atexit hook, or the
    signal handler interrupting the first) returns True immediately, while the first is still draining: True is
    returned although records emitted before it are not written."""
    t = Telemetry(store=False)
    sink = GatedSink()
    t.add_sink(sink)
    runner = _runner(t, sink)
    first = threading.Thread(target=t.close, args=(HANG_S,))
    try:
        t.metric("x", 0, "train")
        assert sink.entered.wait(HANG_S)
        t.metric("x", 1, "train")
        first.start()
        _wait_until(lambda: t.closed, "the first close() to begin")
        threading.Timer(0.2, sink.gate.set).start()  # the sink recovers shortly after the second close() begins
        second = t.close(timeout=HANG_S)
        written = len(sink.records)
    finally:
        sink.gate.set()
        first.join(HANG_S)
        _join_worker(runner)
    assert second is True
    assert written == 2, f"close() returned True with {written} of 2 records written"


SIGTERM_DURING_CLOSE = """
import os, signal, sys, threading, time
from telemetrain import Telemetry
from telemetrain.sinks.jsonl import RunStoreSink

class SlowStore(RunStoreSink):
    def write_packed(self, packed, source):
        time.sleep(0.4)  # a slow disk; the signal handler's 3 s budget covers both batches
        super().write_packed(packed, source)

t = Telemetry(store=False)
store = SlowStore(sys.argv[1])
t.add_sink(store)
t.metric("a", 1, "train")  # the writer picks it up at its first wake-up and spends 0.4 s on it
time.sleep(0.3)
t.metric("b", 2, "train")  # queued behind it
print(store.run_dir_for(t.identity), flush=True)

def terminate_during_close():
    while not t.closed:
        time.sleep(0.001)
    time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)  # as torchelastic does while this worker is exiting

threading.Thread(target=terminate_during_close, daemon=True).start()
t.close(timeout=30)
print("close returned", flush=True)
"""


def test_sigterm_during_close_still_writes_queued_records(tmp_path: Path) -> None:
    """SIGTERM arriving while the program is inside close() (at exit, say): the handler's close() sees the instance
    already closed and returns at once, then the handler kills the process, so what the interrupted close() had not
    written yet is lost, though the same signal a moment earlier would have flushed it all within its 3 s budget."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TELEMETRAIN_")}
    env["TELEMETRAIN_RUN_ID"] = "sigterm-during-close"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SIGTERM_DURING_CLOSE), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == -signal.SIGTERM, proc.stdout + proc.stderr
    run_dir = Path(proc.stdout.splitlines()[0])
    names = sorted(r.name for r in open_run(run_dir).records("metric")) if run_dir.exists() else []
    assert names == ["a", "b"], f"records on disk after SIGTERM during close(): {names}"


# -- 5. remove_sink() holds the instance lock while it drains the removed sink -----------------------------------------


def test_remove_sink_does_not_block_other_producers(quiet: None) -> None:
    """remove_sink() detaches (which clears every cached route) and then closes the runner *under* ``Telemetry._lock``,
    joining its thread for up to ``timeout``. Every producer's next call re-resolves its route, which takes the same
    lock: the training thread blocks until the removed sink has drained (here: until it is released)."""
    t = Telemetry(store=False)
    slow = GatedSink("slow")
    other = ListSink("other")
    t.add_sink(slow, groups="slow")
    t.add_sink(other, groups="train")
    slow_runner = _runner(t, slow)
    stepped = threading.Event()
    remover = threading.Thread(target=t.remove_sink, args=(slow, HANG_S))

    def train() -> None:
        t.metric("loss", 1.0, "train")
        stepped.set()

    trainer = threading.Thread(target=train)
    try:
        t.metric("x", 0, "slow")
        t.metric("loss", 0.5, "train")  # resolved and cached before the removal
        assert slow.entered.wait(HANG_S)
        remover.start()
        _wait_until(lambda: slow not in t.sinks, "the sink to be detached")
        trainer.start()
        returned = stepped.wait(5.0)
    finally:
        slow.gate.set()
        remover.join(HANG_S)
        trainer.join(HANG_S)
        _join_worker(slow_runner)
        t.close()
    assert returned, "a training-thread metric() blocked while remove_sink() drained another sink"


# -- 6. put_metric takes the route from one default instance and the token from another --------------------------------


def test_put_metric_during_set_telemetry_never_poisons_a_batch(quiet: None) -> None:
    """put_metric reads ``_default.metric_routes_get`` and later ``_default.telemetry._token`` separately: with
    set_telemetry() in another thread, a record lands in one instance's queue carrying the other instance's identity
    token. ``identity_of`` then raises KeyError in the writer and the *whole batch* (every other record in it) is
    counted as failed and lost."""
    t1 = Telemetry(store=False, queue_capacity=10_000_000)
    t2 = Telemetry(store=False, queue_capacity=10_000_000)
    s1, s2 = ListSink("s1"), ListSink("s2")
    t1.add_sink(s1)
    t2.add_sink(s2)
    t2.set_identity(role="other")  # t2's records now carry token 2, a token t1 never issued
    previous = telemetrain.set_telemetry(t1)
    assert previous is None
    stop = threading.Event()
    offered = [0]

    def produce() -> None:
        put = metrics.put_metric
        while not stop.is_set():
            put("m", 1, "train")
            offered[0] += 1

    def swap() -> None:
        while not stop.is_set():
            telemetrain.set_telemetry(t2)
            telemetrain.set_telemetry(t1)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=produce), threading.Thread(target=swap)]
    try:
        for th in threads:
            th.start()
        time.sleep(1.0)
    finally:
        stop.set()
        for th in threads:
            th.join(HANG_S)
        sys.setswitchinterval(switch)
        t1.flush()
        t2.flush()
        h1, h2 = t1.health(), t2.health()
        telemetrain.reset()  # closes whichever of the two is the default now
        t1.close()
        t2.close()
    assert h1["failed"] == 0 and h2["failed"] == 0, (h1["sinks"][0]["last_error"], h1["failed"], h2["failed"])
    assert len(s1.records) + len(s2.records) == offered[0]


# -- 7. emit() of a record with a bad identity poisons the run-store batch --------------------------------------------


def test_emit_of_a_bad_record_is_refused_and_never_costs_other_records(tmp_path: Path, quiet: None) -> None:
    """emit() does not check the record's identity: ``_token_for(None)`` registers None as an identity, and the
    run-store writer's ``_switch_to(None)`` raises outside its per-record containment, so the whole batch fails:
    the good records after the bad one are lost, and those before it are on disk *and* counted as failed."""
    t = Telemetry(store=tmp_path)
    try:
        for i in range(5):
            t.metric("good", i, "train")
        mono, wall = t.now()
        rejected = False
        try:
            t.emit(MetricPoint(mono, wall, None, "train", "bad", 1.0))  # type: ignore[arg-type]
        except TypeError:
            rejected = True
        for i in range(5, 10):
            t.metric("good", i, "train")
        t.flush()
        health = t.health()
        run_dir = run_dir_of(t)
    finally:
        t.close()
    good = sorted(r.value for r in open_run(run_dir).records("metric") if r.name == "good")
    assert good == list(range(10)), f"good records on disk: {good}"
    assert health["failed"] == 0, health["sinks"][0]["last_error"]
    assert rejected, "emit() accepted a record whose identity is None"


# -- 8. diagnostics are counted as records by inline sinks -------------------------------------------------------------


class AlwaysFailingSink(Sink):
    name = "always_failing"

    def write(self, records: Sequence[Any]) -> None:
        raise OSError("broken")


def test_diagnostics_are_not_counted_as_delivered_records_by_inline_sinks(quiet: None) -> None:
    """A background runner delivers telemetrain's own diagnostics with ``counted=False``; an inline runner's
    ``enqueue_diagnostic`` is its ordinary ``deliver_one``, which adds them to ``delivered`` (and to ``dropped``
    while suspended), so an inline sink's counts exceed what was offered to it."""
    t = Telemetry(store=False)
    inline = ListSink("inline", background=False)
    t.add_sink(inline)
    t.add_sink(AlwaysFailingSink())
    try:
        for i in range(10):
            t.metric("x", i, "train")
        t.flush()
        stats = {s["sink"]: s for s in t.health()["sinks"]}
    finally:
        t.close()
    assert any(r.kind == "diagnostic" for r in inline.records)  # the other sink's failure was reported to it
    assert stats["inline"]["delivered"] == 10, stats["inline"]


# -- 9. events: the handler's failure is contained, but its warning is not ---------------------------------------------


class RaisingEventHandler(events.EventHandler):
    def record(self, event: events.Event) -> None:
        raise RuntimeError("handler bug")


def test_event_handler_failure_is_contained_when_warnings_are_errors(telemetry: Telemetry, read_run: Any) -> None:
    """architecture.md: nothing a sink or hook raises reaches the caller, and a warning cannot either (under
    ``-W error`` ours are swallowed). events.record() warns with a bare ``warnings.warn`` when a configured
    EventHandler raises (and for an unknown destination): under ``-W error`` that warning reaches the caller."""
    events.configure(RaisingEventHandler())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            events.record(events.Event("handler_fails", events.EventSource.WORKER))
            events.record(events.Event("unknown_destination", events.EventSource.WORKER), "no-such-destination-x1")
    finally:
        events.configure(events.NullEventHandler())
    assert [r.name for r in read_run(telemetry, "event")] == ["handler_fails", "unknown_destination"]  # both kept


# -- 10. bad arguments that are not a clear TypeError/ValueError -------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda t: t.metric("x", 1.0, "train", unit=5), id="metric-unit-int"),
        pytest.param(lambda t: t.metric("x", 1.0, "train", step=2.7), id="metric-step-fractional"),
        pytest.param(lambda t: t.metric("x", 1.0, "train", step=float("inf")), id="metric-step-inf"),
        pytest.param(lambda t: t.event("e", group="train", event_id=5), id="event-id-int"),
        pytest.param(lambda t: t.event("e", group="train", span_id=None), id="event-span-id-none"),
    ],
)
def test_bad_optional_arguments_are_clear_errors(call: Callable[[Telemetry], None], tmp_path: Path) -> None:
    """unit/step/event_id/span_id are not checked: a non-str unit or id is written into the run store as a number or
    null (the format says string) or replaced by an "unencodable" diagnostic; a fractional step is silently
    truncated; an infinite step raises OverflowError."""
    t = Telemetry(store=tmp_path)
    try:
        with pytest.raises((TypeError, ValueError)) as info:
            call(t)
        assert not isinstance(info.value, OverflowError)
    finally:
        t.close()


@pytest.mark.parametrize(("timeout", "error"), [("5", TypeError), (True, TypeError), (float("nan"), ValueError)])
@pytest.mark.parametrize("method", ["flush", "close"])
def test_a_bad_timeout_is_a_clear_error_naming_it(tmp_path: Path, method: str, timeout: Any,
                                                  error: type[Exception]) -> None:
    """A str timeout failed inside the arithmetic ("unsupported operand type(s) for +"), NaN was taken as 0."""
    t = Telemetry(store=tmp_path)
    try:
        with pytest.raises(error, match="timeout"):
            getattr(t, method)(timeout)
    finally:
        t.close()


@pytest.mark.parametrize("timeout", [float("inf"), 1e30])
def test_an_infinite_timeout_waits_without_a_limit(tmp_path: Path, timeout: float) -> None:
    """``flush(math.inf)`` raised OverflowError out of a lock's wait: no TypeError or ValueError, and it reached the
    training loop that asked to wait as long as it takes."""
    t = Telemetry(store=tmp_path)
    t.metric("x", 1.0, "train")
    assert t.flush(timeout)
    assert t.close(timeout)
    assert [r.value for r in open_run(run_dir_of(t)).records("metric")] == [1.0]


def test_an_infinite_flush_interval_keeps_the_writer_thread_alive(tmp_path: Path) -> None:
    """``flush_interval=math.inf`` (write only on flush and close) was accepted, and the writer thread died at its
    first wait with OverflowError, a traceback on stderr; every flush then wrote in the caller's thread."""
    t = Telemetry(store=tmp_path, flush_interval=float("inf"))
    try:
        t.metric("x", 1.0, "train")
        assert t.flush()
        [runner] = [a.runner for a in t._router.attachments if a.sink is t.store]
        assert isinstance(runner, BackgroundRunner) and runner.running, "the writer thread died"
        assert [r.value for r in open_run(run_dir_of(t)).records("metric")] == [1.0]
    finally:
        assert t.close()


class HandleOnly(Sink):
    """An inline sink that implements only ``handle`` (as the base class allows), down for its first calls."""

    name = "handle-only"
    background = False

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.values: list[Any] = []

    def handle(self, record: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("backend down")
        self.values.append(record.value)


def test_an_inline_sink_implementing_only_handle_recovers_after_its_backoff(tmp_path: Path, quiet: None) -> None:
    """After the backoff, the first record went to ``write_packed`` (the batch path), which such a sink does not
    implement: NotImplementedError, suspended again, every later record dropped."""
    t = Telemetry(store=tmp_path, failure_policy=telemetrain.FailurePolicy(max_consecutive=2, backoff_s=0.01,
                                                                           backoff_max_s=0.01))
    sink = HandleOnly(failures=2)
    t.add_sink(sink)
    t.metric("x", 0, "train")
    t.metric("x", 1, "train")  # the second failure in a row: suspended for 10 ms
    time.sleep(0.05)  # the backoff is a time: let it pass
    for i in range(2, 5):
        t.metric("x", i, "train")
    [stats] = [s for s in t.health()["sinks"] if s["sink"] == "handle-only"]
    assert t.close()
    assert sink.values == [2, 3, 4]
    assert stats["failures"] == 2 and stats["dropped"] == 0 and not stats["suspended"]
    told = [(d.name, d.sink) for d in open_run(run_dir_of(t)).records("diagnostic")]
    assert told == [("sink_error", "handle-only")] * 2 + [("sink_suspended", "handle-only"),
                                                          ("sink_resumed", "handle-only")]


class ReprRaises:
    """A wrong argument whose repr raises (a CUDA tensor's after a device error, say)."""

    def __repr__(self) -> str:
        raise RuntimeError("repr of this object fails")


@pytest.mark.parametrize(
    ("call", "arg"),
    [
        pytest.param(lambda t: t.metric("x", ReprRaises(), "train"), "value", id="metric-value"),
        pytest.param(lambda t: t.metric("x", 1.0, "train", attributes={"k": ReprRaises()}), "attributes",
                     id="metric-attribute"),
        pytest.param(lambda t: t.log({"x": ReprRaises()}), "metrics", id="log-value"),
    ],
)
def test_a_wrong_argument_whose_repr_raises_is_still_a_type_error_naming_it(
    call: Callable[[Telemetry], None], arg: str, tmp_path: Path
) -> None:
    """The TypeError's message showed the value's repr: one that raised replaced the TypeError naming the
    argument with its own error."""
    t = Telemetry(store=tmp_path)
    try:
        with pytest.raises(TypeError, match=arg):
            call(t)
    finally:
        t.close()


# -- 11. fork while another thread builds the default instance ---------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_while_default_is_being_built_does_not_hang_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """get_telemetry() builds the default instance while holding ``_default.lock``; the lock is not re-created after
    a fork (unlike every other lock of the pipeline), so a child forked at that moment (a DataLoader worker) hangs
    forever at its first put_metric."""
    monkeypatch.setenv("TELEMETRAIN_STORE", "0")
    Telemetry(store=False).close()  # any program that built one has the fork hooks registered
    # (_default.lock held: where get_telemetry() is while it builds the default instance)
    code = _fork_while_held(_default.lock, lambda: metrics.put_metric("x", 1, "train"))
    telemetrain.reset()
    assert code == 0, "the forked child hung in put_metric on the inherited lock"


def _fork_while_held(lock: Any, use: Callable[[], None]) -> int:
    """Fork while another thread holds ``lock``; the child's exit status: 0 if ``use()`` returned within 5 s."""
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            holding.set()
            release.wait(HANG_S)

    th = threading.Thread(target=holder)
    th.start()
    try:
        assert holding.wait(HANG_S)
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status only
            code = 7
            try:
                done = threading.Event()

                def run() -> None:
                    use()
                    done.set()

                threading.Thread(target=run, daemon=True).start()
                code = 0 if done.wait(5.0) else 7
            finally:
                os._exit(code)
    finally:
        release.set()
        th.join(HANG_S)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_fork_while_timed_span_builds_its_recorder_does_not_hang_the_child() -> None:
    """one-logger's ``timed_span`` builds its recorder under a module lock that was not re-created after a fork: a
    child forked while another thread held it (a DataLoader worker) hung forever at its first ``timed_span``."""
    module = importlib.import_module("telemetrain.training.timed_span")

    def use() -> None:
        with module.timed_span("custom_span"):
            pass

    assert _fork_while_held(module._lock, use) == 0, "the forked child hung in timed_span on the inherited lock"


# -- 12. reader: a well-formed JSON line with wrongly typed fields -----------------------------------------------------


def test_reader_counts_a_wrongly_typed_line_as_corrupt(tmp_path: Path) -> None:
    """decode_line checks JSON syntax but not field types: a line whose ``mono_ns`` is null loads as a record, is
    not counted as corrupt, and ``Run.records()`` then crashes sorting on it."""
    t = Telemetry(store=tmp_path)
    t.metric("a", 1, "train")
    t.close()
    assert t.store is not None and t.store.path is not None
    with open(t.store.path, "a") as fh:
        fh.write('{"v":1,"kind":"metric","mono_ns":null,"wall_ns":1,"group":"train","name":"b","value":2}\n')
    run = open_run(run_dir_of(t))
    assert [r.name for r in run.records()] == ["a"]
    assert run.corrupt == 1


def test_a_report_computed_while_the_training_thread_submits_is_not_lost() -> None:
    """The collector reads the reporter's pending items (``Reporter._waits``: the batch sharing one CPU reading)
    while the training thread appends to them: reading them must not fail ('deque mutated during iteration' lost a
    report in a 64-rank run)."""
    from telemetrain.training.reports import Reporter, Snapshot

    errors: list[BaseException] = []
    reporter = Reporter(lambda snap, values: None, errors.append)
    reporter._pending.extend(object() for _ in range(200_000))  # type: ignore[misc]  # (not Snapshots: only read, never computed)
    snap = object.__new__(Snapshot)
    stop = threading.Event()

    def submitting() -> None:
        while not stop.is_set():
            reporter._pending.append(object())  # type: ignore[arg-type]
            reporter._pending.popleft()

    thread = threading.Thread(target=submitting)
    thread.start()
    try:
        for _ in range(30):
            try:
                reporter._waits(snap, 1.0)
            except RuntimeError as exc:
                errors.append(exc)
    finally:
        stop.set()
        thread.join(HANG_S)
    assert not errors, errors[:1]
