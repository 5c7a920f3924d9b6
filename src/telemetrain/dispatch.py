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
again (and the close's last one, whatever the backoff). A success resets the backoff. The first failure is warned
about once and every failure streak is reported.

The parts every runner shares and ``InlineRunner`` are in ``sink_runner``; the trimmer thread in ``queue_trimmer``.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import repeat, starmap
from typing import TYPE_CHECKING, Any

from .containment import PartialWriteError, TelemetryWarning, call_bounded, describe, is_interrupt, warn_safely
from .records import PAIRS, PackedSource

if TYPE_CHECKING:
    from .sinks.base import Sink
from .queue_trimmer import TRIM_IDLE_MAX_S as TRIM_IDLE_MAX_S  # (re-exported, as TRIM_INTERVAL_S)
from .queue_trimmer import TRIM_INTERVAL_S as TRIM_INTERVAL_S
from .queue_trimmer import _trimmer
from .sink_runner import FailurePolicy, InlineRunner, Reporter, SinkStats, _Runner, count_records

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



GUARD_HOLD_S = 2.0  # an overflowed queue keeps its guarded route this long after its last drop (see trim)


def _pop_into(out: list[Any], pop: Callable[[], Any], n: int) -> None:
    """Pop up to ``n`` items into ``out`` in one C-level loop (no bytecode runs, so the GIL is not given up half-way
    and a producer thread cannot slip in between). Stops early, keeping what it took, if the deque runs empty (a
    re-entrant drain by a signal handler took the rest)."""
    try:
        out.extend(starmap(pop, repeat((), n)))
    except IndexError:
        pass


class BackgroundRunner(_Runner):
    """A sink behind a bounded queue and its own daemon thread."""

    _background = True

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
                self._suspended_until = 0.0  # the last write (see _run)
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
        self._reset_failure_state()
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
            if stopping:  # the last write: a suspended sink gets one try (the disk may be back), not a drop
                self._suspended_until = 0.0
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
        if diagnostics:  # reported to this sink while it wrote (its own drops, its recovery): the close's drain is
            # the last one, so they are written now rather than at a next one
            self._deliver([diagnostics.popleft() for _ in range(len(diagnostics))], counted=False)
        if flush_sink:
            self._contained(self.sink.flush)

    def _report_drops(self) -> None:
        with self._take_lock:
            dropped = self.stats.dropped
            new = dropped - self._reported_drops
            if new <= 0:
                return
            self._reported_drops = dropped
            if self.stats.suspended:  # _report skips a suspended sink: it hears of these once it writes again
                self._unheard_drops += new
        queue_full = dropped - self.stats.dropped_suspended
        self._report("dropped", self, new, f"queue capacity {self.capacity}" if queue_full else "sink suspended")
        if queue_full and not self._warned_drops:
            self._warned_drops = True
            warn_safely(
                f"telemetrain: sink {self.sink.name!r} is not keeping up; records are being dropped (queue capacity "
                f"{self.capacity}). Counts are in Telemetry.health() and in diagnostic records."
            )
