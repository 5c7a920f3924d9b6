"""The delivery half of ``Telemetry`` (its base class): the producers that hold data until a flush (``add_producer``,
collected newest first), detaching sinks (``remove_sink``; the rank-0-only ones when the rank turns out not to be 0),
``flush``, ``close`` (the other sinks drain in parallel, the run store closes last with its
own share of the timeout, a stuck sink is abandoned), ``health``, and the ``diagnostic`` records a failing sink
causes. ``telemetry`` holds the rest: identity, routing, sinks, and the emitting hot path.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from . import process_hooks
from .arguments import check_timeout
from .dispatch import BackgroundRunner, InlineRunner, describe, is_interrupt, warn_safely
from .router import Attachment, Router
from .sinks.base import Sink
from .sinks.jsonl import RunStoreSink

__all__ = ["STORE_CLOSE_BUDGET_S", "TelemetryDelivery"]

_monotonic_ns = time.monotonic_ns
STORE_CLOSE_BUDGET_S = 1.0  # the run store's share of close()'s timeout, after the other sinks (Telemetry.close)
_OWN = {"sink_outage": "sink_error", "outage_dropped": "dropped"}  # reports only the recovered sink hears


class TelemetryDelivery:
    """Flush, close and health of a ``Telemetry`` (which sets these fields in its ``__init__``)."""

    store: RunStoreSink | None
    _router: Router
    _lock: threading.RLock
    _closed: bool  # no new records are accepted
    _shut: bool  # and every sink has been closed
    _final_collect_done: bool
    _producers: list[Any]
    _hook_runners: dict[tuple[str, str | None], InlineRunner]
    _reporting: threading.local
    _token: int
    skipped_sinks: list[Sink]
    _rank_zero_only: list[Attachment]  # "zero" sinks attached while the rank was 0 (see _skip_rank_zero_sinks)

    if TYPE_CHECKING:  # (Telemetry's; process_hooks tracks a Telemetry by these methods)
        def _after_fork_in_child(self) -> None: ...

    def add_producer(self, producer: Any) -> None:
        """Something that holds data in memory and emits it later (stat windows, gauges, samplers):
        ``producer.collect(final)`` runs at the start of every ``flush()`` (final=False) and once at ``close()``
        before the sinks close (final=True); ``producer.after_fork_in_child()`` runs in a forked child."""
        if not callable(getattr(producer, "collect", None)):
            raise TypeError(f"producer must have a collect(final) method, got {type(producer).__name__}")
        with self._lock:
            self._producers.append(producer)

    def _collect(self, final: bool) -> None:
        # newest first: a producer built on another (the training recorder on the tracer) reports before it
        for producer in reversed(list(self._producers)):
            try:
                producer.collect(final)
            except BaseException as exc:  # flush and close go on, whatever a producer raised
                if is_interrupt(exc):  # the user's Ctrl-C on the main thread: theirs (see containment.is_interrupt)
                    raise
                warn_safely(f"telemetrain: collecting from {type(producer).__name__} failed: {describe(exc)}")

    # -- detaching sinks --------------------------------------------------------------------------------------------

    def remove_sink(self, sink_or_attachment: Sink | Attachment, timeout: float | None = 5.0) -> None:
        """Detach a sink, delivering what it has queued first, and close it."""
        with self._lock:
            removed = [a for a in self._router.attachments if a is sink_or_attachment or a.sink is sink_or_attachment]
            for a in removed:
                self._router.detach(a)
            self._rank_zero_only = [a for a in self._rank_zero_only if a not in removed]
        for a in removed:  # outside the lock: producers re-resolving their routes must not wait for this drain
            a.runner.close(timeout)

    def _skip_rank_zero_sinks(self) -> None:
        """A rank other than 0, set after the ``ranks="zero"`` sinks were attached (``mp.spawn``): they are detached,
        closed and listed in ``skipped_sinks``, as ``add_sink`` does (what they received before is delivered)."""
        with self._lock:
            leaving, self._rank_zero_only = self._rank_zero_only, []
            for a in leaving:
                self._router.detach(a)
            self.skipped_sinks.extend(a.sink for a in leaving)
        for a in leaving:  # outside the lock, as remove_sink
            a.runner.close(5.0)

    # -- delivery control ------------------------------------------------------------------------------------------

    def flush(self, timeout: float | None = 5.0) -> bool:
        """Deliver and flush everything emitted so far. False if a sink did not finish within ``timeout`` (every wait
        on a sink is bounded by it). A ``KeyboardInterrupt`` on the main thread propagates at once; what is queued
        stays queued for the next flush or the close."""
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._closed:
            self._collect(final=False)
        ok = True
        for a in list(self._router.attachments):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ok = a.runner.flush(left) and ok
        return ok

    def close(self, timeout: float | None = 5.0) -> bool:
        """Flush, stop the dispatcher threads and close the sinks, within ``timeout`` seconds in all. Idempotent.
        Later calls record nothing.

        False if some sink did not finish in time: it is abandoned (counted in ``health()``, a ``sink_abandoned``
        diagnostic in the run store) and left behind, so a stuck sink never hangs the program, its exit or a
        SIGTERM. A ``KeyboardInterrupt`` on the main thread while producers report (a gauge, say) is raised after
        the sinks are closed, so nothing queued is lost to it."""
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        interrupted: BaseException | None = None
        if not self._final_collect_done:  # open stat windows and the like are reported while sinks still listen
            self._final_collect_done = True
            try:
                self._collect(final=True)
            except BaseException as exc:  # noqa: BLE001 - only an interrupt gets here (see _collect)
                interrupted = exc
        with self._lock:
            if self._shut:
                if interrupted is not None:
                    raise interrupted
                return True
            # From here on nothing new is accepted. A second close while this one runs (another thread, atexit, a
            # signal handler interrupting it) does the remaining work rather than return early: the runners' close
            # is idempotent and re-entrant.
            self._closed = True
            attachments = list(self._router.attachments)
            hooks = list(self._hook_runners.values())
            self._router.invalidate()
        # The other sinks first, all draining in parallel (a stuck sink does not eat the others' time), while the run
        # store writes its backlog; the run store closes last, so what the others report while closing (drops, a
        # last failure, an abandoned sink) still reaches it. Its share of the timeout is kept for it.
        store = [a.runner for a in attachments if a.sink is self.store]
        others = [a.runner for a in attachments if a.sink is not self.store]
        for runner in others:
            runner.request_stop()
        for runner in store:
            runner.nudge()
        reserve = 0.0 if deadline is None or not store else min(STORE_CLOSE_BUDGET_S, (timeout or 0.0) / 4)
        ok = True
        for runner in others + hooks:
            left = None if deadline is None else max(0.0, deadline - reserve - time.monotonic())
            ok = runner.close(left) and ok
        for runner in store:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ok = runner.close(left) and ok
        if ok:
            self._shut = True
            process_hooks.untrack(self)
        if interrupted is not None:
            raise interrupted
        return ok

    @property
    def closed(self) -> bool:
        return self._closed

    def health(self) -> dict[str, Any]:
        """Counters per sink: delivered, dropped, failed, suspended, last error."""
        runners = [a.runner for a in self._router.attachments] + list(self._hook_runners.values())
        for r in runners:
            if isinstance(r, BackgroundRunner) and not r.closed:
                r.trim()  # settle the bound now, so the counts are exact at this moment
        sinks = [dict(vars(r.stats)) for r in runners]
        return {
            "sinks": sinks,
            "dropped": sum(s["dropped"] for s in sinks),
            "failed": sum(s["failed"] for s in sinks),
        }

    # -- diagnostics ---------------------------------------------------------------------------------------------

    def _report(self, what: str, runner: Any, count: int, message: str) -> None:
        """Write a diagnostic record to every sink that listens, except one that is failing."""
        if getattr(self._reporting, "active", False):
            return  # a sink failing while we report another failure: counted, not reported again
        self._reporting.active = True
        try:
            # "sink_outage"/"outage_dropped": a sink that works again hears the sum of the sink_error/dropped records
            # the others got while it failed or was suspended (the run store records its own full disk that way),
            # and only it.
            own = what in _OWN
            name = _OWN.get(what, what)
            record = ("diagnostic", _monotonic_ns(), self._token, "telemetrain", name, runner.sink.name, count, message)
            for a in list(self._router.attachments):
                if (a.runner is not runner) if own else (
                        a.runner.stats.suspended or (a.runner is runner and what != "dropped")):
                    continue  # a failing sink does not hear about its own failures
                if a.listens("diagnostic", "telemetrain"):
                    a.runner.enqueue_diagnostic(record)
        except BaseException as exc:  # reporting must never fail the caller
            if is_interrupt(exc):
                raise
        finally:
            self._reporting.active = False
