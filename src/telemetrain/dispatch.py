"""Background delivery: one bounded queue and one worker thread per I/O sink.

The training thread only appends a packed record (see ``records``) to a ``collections.deque``: the route of a
record is the deque's own ``append`` (a C call, atomic under the GIL, no lock, no Python frame). The worker wakes
every ``interval`` seconds (or on ``flush()``), takes everything queued and hands it to the sink as one batch. Each
I/O sink has its own queue and thread, so a slow or blocked sink delays and drops only its own records.

Drop policy: a queue holds at most ``capacity`` records. Because the hot path does not check (a check would cost a
Python call per record, ~100 ns, more than everything else the call does), one trimmer thread per process enforces
the bound every ``TRIM_INTERVAL_S`` (20 ms) while queues fill, backing off to ``TRIM_IDLE_MAX_S`` (160 ms) while
none does: what is above capacity is dropped, newest first, and counted exactly. A queue found over capacity also
gets a guarded route that drops in the producers' own threads (``BackgroundRunner.trim``), so memory stays bounded
whatever the number of producer threads, and when the sink's own thread is blocked. Drops are reported as a
``Diagnostic`` record and warned about once.

Every wait on a sink is bounded: its write, flush and close run in its own thread; a sink that does not finish
within ``close()``'s timeout is abandoned (counted, reported, warned). Whatever user code raises is contained,
``BaseException`` included, except a ``KeyboardInterrupt`` on the main thread (``is_interrupt``).

Failure policy (``FailurePolicy``): a batch whose ``write`` raises is counted as failed and dropped; after
``max_consecutive`` failures in a row the sink is suspended for ``backoff_s`` seconds (doubling on each further
failure up to ``backoff_max_s``), records offered meanwhile are dropped and counted, then the next batch is tried
again. A success resets the backoff. The first failure is warned about once and every failure streak is reported.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from itertools import repeat, starmap
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from .containment import PartialWriteError, TelemetryWarning, call_bounded, describe, is_interrupt, warn_safely
from .records import PAIRS, PackedSource, unpack_all

if TYPE_CHECKING:
    from .sinks.base import Sink

__all__ = [  # the containment names are re-exported: the rest of the package imports them from here
    "BackgroundRunner",
    "FailurePolicy",
    "InlineRunner",
    "PartialWriteError",
    "SinkStats",
    "TelemetryWarning",
    "call_bounded",
    "describe",
    "is_interrupt",
    "warn_safely",
]


@dataclasses.dataclass(frozen=True)
class FailurePolicy:
    max_consecutive: int = 5
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_consecutive < 1:
            raise ValueError(f"max_consecutive must be >= 1, got {self.max_consecutive}")
        if not self.backoff_s > 0 or not self.backoff_max_s >= self.backoff_s:
            raise ValueError("backoff_s must be > 0 and backoff_max_s >= backoff_s")


@dataclasses.dataclass
class SinkStats:
    """Counters of one attached sink (see ``Telemetry.health()``)."""

    sink: str
    background: bool
    delivered: int = 0
    dropped: int = 0  # not delivered: offered to a full queue, or while suspended
    dropped_suspended: int = 0  # the part of ``dropped`` offered while the sink was suspended after failures
    failed: int = 0  # records in batches whose write raised
    failures: int = 0  # write calls that raised
    suspended: bool = False
    abandoned: bool = False  # the sink did not finish within close()'s timeout: left behind, its queue dropped
    last_error: str = ""


# Reports a diagnostic: (what, runner, count, message).
Reporter = Callable[[str, "_Runner", int, str], None]


TRIM_INTERVAL_S = 0.02
TRIM_IDLE_MAX_S = 0.16  # the trimmer's tick while no queue is filling (see _Trimmer._run)
GUARD_HOLD_S = 2.0  # an overflowed queue keeps its guarded route this long after its last drop (see trim)
_kind_of = itemgetter(0)
_is_pair = PAIRS.__contains__


def count_records(batch: list[Any]) -> int:
    """Records in a batch of packed tuples: a pair stands for two (see records.PAIRS). C-level loops only."""
    return len(batch) + sum(map(_is_pair, map(_kind_of, batch)))


def _pop_into(out: list[Any], pop: Callable[[], Any], n: int) -> None:
    """Pop up to ``n`` items into ``out`` in one C-level loop (no bytecode runs, so the GIL is not given up half-way
    and a producer thread cannot slip in between). Stops early, keeping what it took, if the deque runs empty (a
    re-entrant drain by a signal handler took the rest)."""
    try:
        out.extend(starmap(pop, repeat((), n)))
    except IndexError:
        pass


class _Runner:
    """What the two runners share: counters and the failure policy."""

    def __init__(self, sink: Sink, policy: FailurePolicy, report: Reporter, source: PackedSource) -> None:
        # Guards taking from the queue and the drop counters; never taken on the hot path. Re-entrant: a signal
        # handler that flushes can interrupt the main thread while it holds the lock (health(), a direct flush).
        self._take_lock = threading.RLock()
        self.sink = sink
        self.source = source
        self.policy = policy
        self._report = report
        self.stats = SinkStats(sink=sink.name, background=isinstance(self, BackgroundRunner))
        self._consecutive = 0
        self._suspended_until = 0.0
        self._backoff = policy.backoff_s
        self._warned = False

    def _deliver(self, batch: list[Any], *, counted: bool = True) -> None:
        """Hand a batch of packed records to the sink, containing any failure. Never raises (but a real interrupt,
        see ``is_interrupt``). ``counted=False`` for telemetrain's own diagnostics, which are not part of the
        delivered/dropped record counts."""
        stats = self.stats
        if self._suspended_until:
            if time.monotonic() < self._suspended_until:
                if not counted:
                    return
                n = count_records(batch)
                with self._take_lock:
                    stats.dropped += n
                    stats.dropped_suspended += n
                return
            self._suspended_until = 0.0
        try:
            self.sink.write_packed(batch, self.source)
        except BaseException as exc:  # nothing a sink raises may reach training
            n = count_records(batch) if counted else 0
            if counted and isinstance(exc, PartialWriteError):  # part of the batch is stored: only the rest failed
                written = min(max(exc.written, 0), n)
                stats.delivered += written
                n -= written
            self._on_failure(exc, n)
            if is_interrupt(exc):
                raise
        else:
            if counted:
                stats.delivered += count_records(batch)
            if self._consecutive:
                self._consecutive = 0
                self._backoff = self.policy.backoff_s
                if stats.suspended:
                    stats.suspended = False
                    self._report("sink_resumed", self, 0, "")

    def _on_failure(self, exc: BaseException, n: int) -> None:
        stats = self.stats
        stats.failures += 1
        stats.failed += n
        stats.last_error = describe(exc)
        self._consecutive += 1
        self._report("sink_error", self, n, stats.last_error)
        if not self._warned:
            self._warned = True
            warn_safely(
                f"telemetrain: sink {self.sink.name!r} failed ({stats.last_error}); training continues, failures are "
                "counted in Telemetry.health() and written as diagnostic records. Further failures are not warned."
            )
        if self._consecutive >= self.policy.max_consecutive:
            self._suspended_until = time.monotonic() + self._backoff
            self._report("sink_suspended", self, 0, f"for {self._backoff:g} s after {self._consecutive} failures")
            self._backoff = min(self._backoff * 2, self.policy.backoff_max_s)
            stats.suspended = True

    def _call(self, what: str, timeout: float | None) -> bool:
        """The sink's ``flush``/``close`` outside its runner's thread (an inline sink; a background sink that never
        got a record), waited for at most ``timeout`` in a helper thread: an inline sink is supposed to be cheap,
        but a console on a stalled pipe or a user's sink may block. True if it returned."""
        from .sinks.base import Sink  # the base class: its methods do nothing, so there is nothing to wait for

        if getattr(type(self.sink), what, None) is getattr(Sink, what):
            return True
        done, exc = call_bounded(getattr(self.sink, what), timeout, f"{self.sink.name}-{what}")
        if exc is not None:
            self._on_failure(exc, 0)
            if is_interrupt(exc):  # only when it ran on this (main) thread
                raise exc
        if not done:
            self._abandoned(f"{what}()", timeout, 0)
        return done

    def _abandoned(self, what: str, timeout: float | None, dropped: int) -> None:
        """The sink's ``what`` did not return in time: it is left behind (its thread, if any, is a daemon), counted,
        reported to the other sinks (the run store hears it: it closes last) and warned about."""
        self.stats.abandoned = True
        message = f"{what} did not return within {timeout or 0:g} s; the sink was abandoned"
        if dropped:
            message += f" with {dropped} records still queued (counted as dropped)"
        self._report("sink_abandoned", self, dropped, message)
        warn_safely(f"telemetrain: sink {self.sink.name!r}: {message}")


class InlineRunner(_Runner):
    """Runs a cheap sink in the caller's thread, with the same failure containment."""

    def __init__(self, sink: Sink, policy: FailurePolicy, report: Reporter, source: PackedSource) -> None:
        super().__init__(sink, policy, report, source)
        handle = sink.handle
        stats = self.stats
        self._closed = False

        local = threading.local()

        def deliver_one(packed: Any, counted: bool = True) -> None:
            if getattr(local, "active", False):
                # The sink (a MetricHandler, say) emitted into its own route from inside handle(): that record goes to
                # the other sinks, not round again through this one (which would recurse until the stack ran out).
                if counted:
                    stats.dropped += count_records([packed])
                return
            if self._suspended_until:
                self._deliver([packed], counted=counted)
                return
            local.active = True
            try:
                _deliver_now(packed, counted)
            finally:
                local.active = False

        def _deliver_now(packed: Any, counted: bool) -> None:
            try:
                records = unpack_all(packed, source.identity_of(packed[2]), source.wall_offset_ns)
            except BaseException as exc:  # noqa: BLE001 - e.g. a token of another instance: contained, counted
                self._on_failure(exc, count_records([packed]) if counted else 0)
                return
            for record in records:
                try:
                    handle(record)
                except BaseException as exc:  # a sink's handle(), whatever it raises
                    self._on_failure(exc, 1 if counted else 0)
                    if is_interrupt(exc):  # the user's Ctrl-C, arriving while the sink ran: counted, then raised
                        raise
                else:
                    if counted:  # telemetrain's own diagnostics are not part of the record counts
                        stats.delivered += 1
                    if self._consecutive:
                        self._consecutive = 0
                        self._backoff = self.policy.backoff_s

        self.enqueue: Callable[[Any], None] = deliver_one
        self.enqueue_diagnostic: Callable[[Any], None] = lambda packed: deliver_one(packed, False)

    def start(self) -> None:
        pass

    def request_stop(self) -> None:
        pass

    def nudge(self) -> None:
        pass

    def flush(self, timeout: float | None = None) -> bool:
        if self._closed or self.stats.abandoned:
            return not self.stats.abandoned
        return self._call("flush", timeout)

    def close(self, timeout: float | None = None) -> bool:
        if self._closed:
            return not self.stats.abandoned
        deadline = None if timeout is None else time.monotonic() + timeout
        self._closed = True
        if not self._call("flush", timeout):
            return False
        return self._call("close", None if deadline is None else max(0.0, deadline - time.monotonic()))

    def after_fork_in_child(self) -> None:
        self._take_lock = threading.RLock()
        self.sink.after_fork_in_child()


class BackgroundRunner(_Runner):
    """A sink behind a bounded queue and its own daemon thread."""

    def __init__(
        self,
        sink: Sink,
        policy: FailurePolicy,
        report: Reporter,
        source: PackedSource,
        *,
        capacity: int = 100_000,
        interval: float = 0.2,
        on_wake: Callable[[], None] | None = None,
        on_route_change: Callable[[], None] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"queue capacity must be >= 1, got {capacity}")
        if not interval > 0:
            raise ValueError(f"flush interval must be > 0 seconds, got {interval}")
        super().__init__(sink, policy, report, source)
        self.capacity = capacity
        self.interval = interval
        # A queue this long after a drain means the producers outpace one batch per interval: drain again at once
        # rather than sleep (see _run).
        self.backlog = max(1, capacity // 8)
        self._on_wake = on_wake
        # Called when ``enqueue`` changes (see trim): the owner re-resolves its routes, which hold the old one.
        self._on_route_change = on_route_change
        self._reported_drops = 0
        self._warned_drops = False
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        """Fresh queue, locks and thread state: at construction and in a forked child."""
        self._queue: deque[Any] = deque()
        self._append = self._queue.append
        self._take_lock = threading.RLock()
        self._guarded = False  # the route is _guarded_append (the queue overflowed lately: see trim)
        self._overflowed_at = 0.0
        self._guard_counter = itertools.count()  # next(): one per record the guard dropped, plus one per read
        self._count_drop = self._guard_counter.__next__
        self._guard_reads = 0
        self._guard_folded = 0
        self._close_lock = threading.RLock()
        self._sink_closed = False
        self._wake = threading.Event()
        self._cv = threading.Condition(threading.RLock())
        self._flush_requested = 0
        self._flush_done = 0
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False
        # The hot path: the route is this C method itself. The bound is the trimmer's job (module docstring).
        self.enqueue: Callable[[Any], None] = self._append
        # Diagnostics wait apart: they must not be trimmed, nor counted as dropped records. A sink that stays blocked
        # keeps only the latest of them.
        self._diagnostics: deque[Any] = deque(maxlen=1000)
        self.enqueue_diagnostic: Callable[[Any], None] = self._diagnostics.append

    def _guarded_append(self, packed: Any) -> None:
        """The route while the queue overflows (see ``trim``): a record that finds the queue full is dropped right
        here, in the producer's own thread, and counted on a C-level counter (``next`` of an ``itertools.count``
        is atomic under the GIL: no lock, so a consumer that holds one cannot stall the producers). A Python call
        (~0.2 us) instead of the bare C append, only while records are being dropped anyway."""
        if len(self._queue) < self.capacity:
            self._append(packed)
        else:
            self._count_drop()
            if packed[0] in PAIRS:
                self._count_drop()

    def _fold_guard_drops(self) -> None:
        """Under the take lock: add the drops counted by ``_guarded_append`` to the stats. Reading the counter
        advances it too, so the reads so far are subtracted."""
        total = next(self._guard_counter) - self._guard_reads
        self._guard_reads += 1
        new = total - self._guard_folded
        if new:
            self._guard_folded = total
            self.stats.dropped += new
            self._overflowed_at = time.monotonic()

    def _trim_excess(self) -> None:
        """Pop what is above capacity, newest first, in one C call, and count it, with the guard's drops (under the
        take lock: exact)."""
        with self._take_lock:
            self._fold_guard_drops()
            n = len(self._queue) - self.capacity  # under the lock: the worker may have drained meanwhile
            if n > 0:
                dropped: list[Any] = []
                _pop_into(dropped, self._queue.pop, n)
                self.stats.dropped += count_records(dropped)
                self._overflowed_at = time.monotonic()

    def trim(self) -> int:
        """Keep the queue within capacity: drop what is above it, newest first, counted; report new drops; return
        the queue length. Called by the trimmer thread, by the writer when it finds the queue over capacity, and by
        ``Telemetry.health()`` (so its counts are exact when read).

        The excess goes in one C-level call (``_pop_into``), but a thread has to get the GIL to make it, and with
        many producer threads spinning in Python it waits for it (0.1-0.6 s measured with 8): meanwhile the queue
        grew without bound (8 threads x 1M records: ~1 GB). So an overflow also switches the queue's route to
        ``_guarded_append``, which drops the records that find the queue full in the producers' own threads: memory
        then stays within capacity (plus one record per producer thread) whatever the threads, and the plain C append
        comes back once the queue has not overflowed for ``GUARD_HOLD_S`` and is nearly empty. Counted exactly: the
        trimmer's drops under the lock that every consumer takes, the guard's on an atomic counter."""
        queue = self._queue
        self._trim_excess()
        if len(queue) >= self.capacity:
            if not self._guarded and self._on_route_change is not None:
                self._guarded = True
                self.enqueue = self._guarded_append
                self._on_route_change()
        elif (self._guarded and len(queue) <= self.capacity // 8
              and time.monotonic() - self._overflowed_at > GUARD_HOLD_S and self._on_route_change is not None):
            self._guarded = False
            self.enqueue = self._append
            self._on_route_change()
        if self.stats.dropped != self._reported_drops:
            self._report_drops()
        return len(queue)

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None or self._closed:
            return
        with self._cv:
            if self._thread is None and not self._closed:
                if sys.is_finalizing():
                    return  # a thread started now would never run: flush and close deliver inline instead
                thread = threading.Thread(target=self._run, name=f"telemetrain-{self.sink.name}", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # "can't create new thread at interpreter shutdown" (3.12+, from atexit)
                    return
                self._thread = thread
                _trimmer.watch(self)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def flush(self, timeout: float | None = 5.0) -> bool:
        """Deliver everything queued before this call and flush the sink. False if the sink did not finish in time.
        The sink is only ever called from its own thread, so a sink that blocks costs the caller ``timeout`` at
        most."""
        if self._closed:
            return not self.stats.abandoned  # nothing can be queued any more, and the sink is closed (or stuck)
        if not self.running:
            if self._thread is None and not self._queue and not self._diagnostics:
                return self._call("flush", timeout)  # never started, nothing to write: no thread of its own yet
            self.start()
            if not self.running:  # no thread can be started (interpreter shutdown): deliver in the caller's thread
                self._drain_once(flush_sink=True)
                return True
        with self._cv:
            self._flush_requested += 1
            target = self._flush_requested
            self._wake.set()
            return self._cv.wait_for(lambda: self._flush_done >= target or not self.running, timeout)

    def request_stop(self) -> None:
        """Ask the thread to deliver what is queued, close the sink and stop, without waiting (see ``close``)."""
        self._stopping = True
        self._wake.set()

    def nudge(self) -> None:
        """Wake the thread now to write what is queued (a close is coming: the queue is then shorter)."""
        self._wake.set()

    def close(self, timeout: float | None = 5.0) -> bool:
        """Deliver what is queued, close the sink and stop the thread. False if the sink did not finish within
        ``timeout``: it is then abandoned (``SinkStats.abandoned``, its queue counted as dropped, a
        ``sink_abandoned`` diagnostic) and its daemon thread left behind, so a stuck sink never holds up the caller,
        the exit or a signal handler for longer than ``timeout``.

        The sink's last write, flush and ``close()`` run in its own thread, never in the caller's. Idempotent and
        re-entrant: a second close (another thread, atexit, a signal handler interrupting the first) waits for the
        same thread, within its own timeout, and the sink is closed once."""
        if self._closed:
            return not self.stats.abandoned
        if self._thread is None and not self._queue and not self._diagnostics:
            return self._close_unused(timeout)
        if not self.running:
            self.start()
        thread = self._thread
        self.request_stop()
        if thread is not None and thread is not threading.current_thread() and thread.is_alive():
            thread.join(timeout)
            if thread.is_alive():  # a stuck sink: leave the daemon thread behind rather than hang the exit
                with self._close_lock:
                    if self._closed:
                        return not self.stats.abandoned
                    self._closed = True
                _trimmer.unwatch(self)  # nothing new reaches this queue once its Telemetry is closing
                self._abandoned("its write, flush or close()", timeout, self._abandon_queue())
                return False
        with self._close_lock:
            if self._closed:
                return not self.stats.abandoned
            if not self._sink_closed:  # no thread ran the close (interpreter shutdown, or called from the sink)
                _trimmer.unwatch(self)
                self._drain_once(flush_sink=True)
                self.trim()
                self._close_sink()
            self._closed = True
        return True

    def _close_unused(self, timeout: float | None) -> bool:
        """Close a runner whose thread never started and that holds nothing (a sink that never got a record): its
        sink's flush and close in a helper thread, bounded like the rest."""
        with self._close_lock:
            if self._closed:
                return not self.stats.abandoned
            self._closed = True
            self._sink_closed = True
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._call("flush", timeout):
            return False
        return self._call("close", None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _close_sink(self) -> None:
        with self._close_lock:
            if self._sink_closed:
                return
            self._sink_closed = True
        self._contained(self.sink.close)

    def _contained(self, method: Callable[[], None]) -> None:
        """The sink's ``flush`` or ``close``, in this thread, whatever it raises counted (a real interrupt, see
        ``is_interrupt``, still raised)."""
        try:
            method()
        except BaseException as exc:  # a sink's flush() or close(), whatever it raises
            self._on_failure(exc, 0)
            if is_interrupt(exc):
                raise

    def _abandon_queue(self) -> int:
        """Nobody will write what a stuck sink has queued: free the memory, and count it as dropped."""
        with self._take_lock:
            self._fold_guard_drops()
            n = count_records(list(self._queue))
            self._queue.clear()
            self.stats.dropped += n
        if n:
            self._report_drops()
        return n

    def after_fork_in_child(self) -> None:
        # What is queued belongs to the parent (its own thread writes it); the parent's thread does not exist here.
        self.stats = SinkStats(sink=self.sink.name, background=True)
        self._reported_drops = 0
        self._warned_drops = False
        self._reset_process_state()
        self.sink.after_fork_in_child()

    # -- the worker ------------------------------------------------------------------------------------------------

    def _run(self) -> None:
        # Wakes every ``interval`` counted from the previous wake-up, not from the end of the drain; at once while a
        # backlog is left after a drain; and when the trimmer finds the queue half full (``nudge``). Sleeping a whole
        # interval after every batch made the period interval + write time, and a queue had to hold a whole period
        # of records: the default store dropped records at 300k/s. Idle, it still wakes once per interval.
        wake = self._wake
        queue = self._queue
        due = time.monotonic() + self.interval
        while True:
            wait = due - time.monotonic()
            if wait > 0 and len(queue) < self.backlog:
                wake.wait(wait)
            wake.clear()
            due = time.monotonic() + self.interval
            with self._cv:
                requested = self._flush_requested
            stopping = self._stopping
            try:
                self._drain_once(flush_sink=requested > self._flush_done or stopping)
                if stopping:
                    self.trim()
                    self._close_sink()
            except BaseException as exc:  # noqa: BLE001 - _deliver contains sinks; this is a last line: never die
                self._on_failure(exc, 0)
            if requested > self._flush_done:
                with self._cv:
                    self._flush_done = requested
                    self._cv.notify_all()
            if stopping:
                _trimmer.unwatch(self)
                return

    def _drain_once(self, *, flush_sink: bool) -> None:
        if self._on_wake is not None:
            self._on_wake()
        diagnostics = self._diagnostics
        if diagnostics:
            self._deliver([diagnostics.popleft() for _ in range(len(diagnostics))], counted=False)
        queue = self._queue
        popleft = queue.popleft
        capacity = self.capacity
        # What is queued now, and no more: records that keep arriving while the sink writes wait for the next
        # wake-up, so a flush or stop request is answered even under a steady stream (or a sink that emits).
        remaining = len(queue)
        while remaining > 0:
            batch: list[Any] = []
            with self._take_lock:  # the trimmer may pop from the right meanwhile; the lock keeps n exact
                # at most a queue's worth per batch: the queue can overshoot between trims, a batch need not
                _pop_into(batch, popleft, min(remaining, capacity))
            if not batch:  # emptied under us by a re-entrant drain (a signal handler's flush)
                break
            remaining -= len(batch)
            self._deliver(batch)
            del batch
            if len(queue) > capacity:  # producers outpace the trimmer (many threads, a busy GIL): bound it here too
                self.trim()
        if self.stats.dropped != self._reported_drops:
            self._report_drops()
        if flush_sink:
            self._contained(self.sink.flush)

    def _report_drops(self) -> None:
        with self._take_lock:
            dropped = self.stats.dropped
            new = dropped - self._reported_drops
            if new <= 0:
                return
            self._reported_drops = dropped
        queue_full = dropped - self.stats.dropped_suspended
        self._report("dropped", self, new, f"queue capacity {self.capacity}" if queue_full else "sink suspended")
        if queue_full and not self._warned_drops:
            self._warned_drops = True
            warn_safely(
                f"telemetrain: sink {self.sink.name!r} is not keeping up; records are being dropped (queue capacity "
                f"{self.capacity}). Counts are in Telemetry.health() and in diagnostic records."
            )


class _Trimmer:
    """One daemon thread per process that keeps every started background queue within its capacity (with the
    writers' help, and the producers' own while a queue overflows: see ``BackgroundRunner.trim``).

    Process infrastructure like the signal and fork hooks, so one per process rather than per ``Telemetry``. It runs
    only while some runner is started, and exits when none is left.
    """

    def __init__(self) -> None:
        self._after_fork()

    def _after_fork(self) -> None:
        self._runners: weakref.WeakSet[BackgroundRunner] = weakref.WeakSet()
        self._lock = threading.RLock()  # re-entrant: a signal handler's close may unwatch while watch() holds it
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def watch(self, runner: BackgroundRunner) -> None:
        with self._lock:
            self._runners.add(runner)
            if self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(self._stop,), name="telemetrain-trimmer")
                self._thread.daemon = True
                self._thread.start()

    def unwatch(self, runner: BackgroundRunner) -> None:
        with self._lock:
            self._runners.discard(runner)
            thread = self._thread
            if self._runners or thread is None:
                return
            self._thread = None  # the last runner is gone: stop now rather than at the next tick
            self._stop.set()
        if thread is not threading.current_thread():
            thread.join(1.0)


    def _run(self, stop: threading.Event) -> None:
        # Every 20 ms while records flow; a quiet process (no queue filling) backs off, doubling up to 160 ms: a
        # Python thread's wake-up costs ~80 us on a VM, and 50 of them a second were most of an idle Telemetry's
        # CPU (0.6% of a core). The first tick of a burst after a quiet spell comes at most 160 ms late.
        interval = TRIM_INTERVAL_S
        previous: dict[int, int] = {}
        while not stop.wait(interval):
            with self._lock:
                runners = list(self._runners)
            sizes: dict[int, int] = {}
            filling = False
            for runner in runners:
                try:
                    size = runner.trim()
                except BaseException:  # noqa: BLE001 - keep trimming the others (a reporter hook that raised)
                    continue
                sizes[id(runner)] = size
                if size > runner.capacity // 2:  # filling faster than one batch per interval: write it now
                    runner.nudge()
                if size > runner.capacity // 8 or size - previous.get(id(runner), 0) > runner.capacity // 64:
                    filling = True
            previous = sizes
            interval = TRIM_INTERVAL_S if filling else min(interval * 2, TRIM_IDLE_MAX_S)


_trimmer = _Trimmer()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_trimmer._after_fork)
