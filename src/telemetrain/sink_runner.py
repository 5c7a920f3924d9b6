"""What every attached sink's runner shares -- its ``FailurePolicy`` and ``SinkStats``, the failure accounting and
suspension, the count of records in a batch -- and ``InlineRunner``, which writes in the caller's thread (hooks, and
sinks that ask for it). ``dispatch.BackgroundRunner`` (a queue and a thread per sink) builds on ``_Runner``; the
failure policy itself is described in ``dispatch``."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from .containment import PartialWriteError, call_bounded, describe, is_interrupt, warn_safely
from .records import PAIRS, PackedSource, unpack_all

if TYPE_CHECKING:
    from .sinks.base import Sink


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
    in_flight: int = 0  # records in the batch the sink is writing now (a stuck sink's: neither delivered nor dropped)
    suspended: bool = False
    abandoned: bool = False  # the sink did not finish within close()'s timeout: left behind, its queue dropped
    last_error: str = ""


# Reports a diagnostic: (what, runner, count, message).
Reporter = Callable[[str, "_Runner", int, str], None]

_kind_of = itemgetter(0)
_is_pair = PAIRS.__contains__


def count_records(batch: list[Any]) -> int:
    """Records in a batch of packed tuples: a pair stands for two (see records.PAIRS). C-level loops only."""
    return len(batch) + sum(map(_is_pair, map(_kind_of, batch)))



class _Runner:
    """What the two runners share: counters and the failure policy."""

    _background = False  # (True on dispatch.BackgroundRunner: its stats say so)

    def __init__(self, sink: Sink, policy: FailurePolicy, report: Reporter, source: PackedSource) -> None:
        # Guards taking from the queue and the drop counters; never taken on the hot path. Re-entrant: a signal
        # handler that flushes can interrupt the main thread while it holds the lock (health(), a direct flush).
        self._take_lock = threading.RLock()
        self.sink = sink
        self.source = source
        self.policy = policy
        self._report = report
        self._reset_failure_state()

    def _reset_failure_state(self) -> None:
        """Fresh counters and failure state: at construction and in a forked child, whose counts start at zero (an
        outage inherited from the parent made its first write report a negative loss)."""
        self.stats = SinkStats(sink=self.sink.name, background=self._background)
        self._consecutive = 0
        self._failed_before_outage = 0  # stats.failed when the current run of failures began
        self._unheard_drops = 0  # "dropped" reported while this sink was suspended: the others heard it, it did not
        self._suspended_until = 0.0
        self._backoff = self.policy.backoff_s
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
        n = count_records(batch) if counted else 0
        stats.in_flight = n
        try:
            self.sink.write_packed(batch, self.source)
        except BaseException as exc:  # nothing a sink raises may reach training
            stats.in_flight = 0
            if counted and isinstance(exc, PartialWriteError):  # part of the batch is stored: only the rest failed
                written = min(max(exc.written, 0), n)
                stats.delivered += written
                n -= written
            self._on_failure(exc, n)
            if is_interrupt(exc):
                raise
        else:
            stats.in_flight = 0
            stats.delivered += n
            if self._consecutive:
                self._recovered()

    def _recovered(self) -> None:
        """The first success after failures: the policy reset, the suspension lifted, what the outage cost told."""
        stats = self.stats
        self._consecutive = 0
        self._backoff = self.policy.backoff_s
        if stats.suspended:
            stats.suspended = False
            self._report("sink_resumed", self, 0, "")
        lost = stats.failed - self._failed_before_outage
        if lost:  # the sink itself heard none of its sink_error records: it gets their sum now
            self._report("sink_outage", self, lost, f"while it failed ({stats.last_error})")
        with self._take_lock:  # (the trimmer's thread adds to it)
            unheard, self._unheard_drops = self._unheard_drops, 0
        if unheard:  # and the records dropped while it was suspended (the run store: a full disk's backoff)
            self._report("outage_dropped", self, unheard, "sink suspended")

    def _on_failure(self, exc: BaseException, n: int) -> None:
        stats = self.stats
        if not self._consecutive:
            self._failed_before_outage = stats.failed
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
        done, exc, interrupt = call_bounded(getattr(self.sink, what), timeout, f"{self.sink.name}-{what}")
        if exc is not None:
            self._on_failure(exc, 0)
            if interrupt:  # only when it ran on this (main) thread: in the helper thread it is no Ctrl-C
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
                if time.monotonic() < self._suspended_until:
                    self._deliver([packed], counted=counted)  # counted as dropped
                    return
                # The backoff is over: handle() again. (Through _deliver it was write_packed(), which a sink that
                # implements only handle() does not have: it failed, and the sink stayed suspended for good.)
                self._suspended_until = 0.0
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
                        self._recovered()

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
        self._reset_failure_state()
        self.sink.after_fork_in_child()
