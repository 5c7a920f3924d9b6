"""Exporter delivery: each exporter's calls run in order on that exporter's own thread, never on the caller's.

The caller hands a call over and, by default, waits for it for up to ``wait_s`` seconds, so that when a callback
returns its exports are done (one-logger's synchronous behaviour, which its users' tests rely on) -- but an exporter
that once takes longer than that is *detached*: from then on nobody waits for it (warned once, counted), and its
queue is bounded (``capacity`` calls; the excess is dropped and counted, and the exporter is told with one
``export_telemetry_data_error``). So an exporter that blocks costs the training thread ``wait_s`` once, at most;
``wait_s=0`` never waits at all.

Failures are contained as one-logger contains them, per exporter: a call that raises is counted, the exporter
receives one ``export_telemetry_data_error`` (``NO_TELEMETRY_DATA`` if nothing had succeeded yet, else
``INCOMPLETE_TELEMETRY_DATA``), and after 5 failures in all it is disabled for the rest of the run. Nothing an
exporter does -- raise, block, raise ``BaseException`` -- reaches the caller.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..dispatch import describe, warn_safely
from .events import TelemetryDataError

__all__ = ["DISABLE_AFTER_FAILURES", "TELEMETRY_DATA_ERROR", "ExporterChannel"]

DISABLE_AFTER_FAILURES = 5  # one-logger's count: failures in all, not in a row
_IDLE_EXIT_S = 5.0  # a channel's thread exits after this long with nothing to do (and restarts on the next call)
_CLOSE = "close"
TELEMETRY_DATA_ERROR = "_telemetry_data_error"  # a telemetry data error, typed and deduplicated when delivered

_channels: weakref.WeakSet[ExporterChannel] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for channel in list(_channels):
        channel._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class ExporterChannel:
    """The calls to one exporter, delivered in order from one background thread."""

    def __init__(self, exporter: Any, *, wait_s: float = 1.0, capacity: int = 10_000,
                 on_failure: Callable[[str, str], None] | None = None) -> None:
        self.exporter = exporter
        self.name = type(exporter).__name__
        self.wait_s = wait_s
        self.capacity = capacity
        self._on_failure = on_failure
        # one-logger's per-exporter state
        self.num_errors = 0
        self.any_data_exported_successfully = False
        self.force_disabled = False
        self.telemetry_data_error_reported = False
        # ours
        self.delivered = 0
        self.dropped = 0
        self.detached = False
        self.waits_timed_out = 0
        self._drop_reported = False
        self._closing = False
        self._retired = False  # closed by its owner: sent nothing more (retire_if_closed)
        self._warned = False
        self._after_fork_in_child()
        _channels.add(self)

    def _after_fork_in_child(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[tuple[str, tuple[Any, ...]]] = collections.deque()
        self._submitted = 0
        self._done = 0
        self._thread: threading.Thread | None = None

    # -- the caller's side ------------------------------------------------------------------------------------------

    def submit(self, method: str, *args: Any) -> int:
        """Queue ``exporter.<method>(*args)``; returns its sequence number (0: not queued)."""
        with self._cond:
            if self._retired:
                return 0
            if method != _CLOSE and (self.force_disabled or self._closing):
                return 0  # (a disabled exporter is still closed, as one-logger closes every exporter)
            if len(self._queue) >= self.capacity:
                self.dropped += 1
                if self.dropped == 1:
                    warn_safely(f"telemetrain: exporter {self.name} is {self.capacity} calls behind: further calls are "
                                "dropped (counted) until it catches up", stacklevel=3)
                return 0
            self._queue.append((method, args))
            self._submitted += 1
            seq = self._submitted
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"telemetrain-exporter-{self.name}",
                                                daemon=True)
                self._thread.start()
            else:
                self._cond.notify_all()
            return seq

    def wait(self, seq: int, timeout: float | None = None) -> bool:
        """Wait until call ``seq`` (and every call before it) has run, for at most ``timeout`` (default ``wait_s``).
        A detached channel is not waited for (except by ``close``, which passes its own timeout). Returns whether
        the call has run."""
        limit = self.wait_s if timeout is None else timeout
        if seq <= 0 or (self.detached and timeout is None) or limit <= 0:
            return self._done >= seq
        with self._cond:
            if self._done >= seq:
                return True
            deadline = time.monotonic() + limit
            while self._done < seq:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self._thread is None and not self._queue):
                    break
                self._cond.wait(remaining)
            if self._done >= seq:
                return True
            if timeout is None and not self.detached:
                self.detached = True
                self.waits_timed_out += 1
                warn_safely(f"telemetrain: exporter {self.name} took more than {limit:g} s: callbacks no longer wait "
                            "for it (its calls still run, in order, on its own thread)", stacklevel=3)
            return False

    def retire_if_closed(self) -> bool:
        """When the exporter says it is closed (its ``closed`` property, one-logger's and ours): nothing more is sent
        to it, its close included, and True. Its owner closed it before the recorder closes (a test's teardown, a
        program's own shutdown), so the spans the recorder then stops are not this exporter's errors."""
        try:
            closed = getattr(self.exporter, "closed", False) is True
        except Exception:  # noqa: BLE001 - a property that raises: the exporter is not known to be closed
            closed = False
        if closed:
            with self._cond:
                self._closing = self._retired = True
                self._cond.notify_all()
        return closed

    def close(self, timeout: float = 5.0) -> bool:
        """Queue ``exporter.close()``, then wait up to ``timeout`` for everything queued to run (and the thread to
        end)."""
        deadline = time.monotonic() + timeout
        seq = self.submit(_CLOSE)
        with self._cond:
            self._closing = True
            thread = self._thread
        done = self.wait(seq, timeout) if seq else True
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(deadline - time.monotonic(), 0.0))
        return done

    def stats(self) -> dict[str, Any]:
        return {"exporter": self.name, "delivered": self.delivered, "errors": self.num_errors,
                "dropped": self.dropped, "disabled": self.force_disabled, "detached": self.detached,
                "pending": len(self._queue)}

    # -- the delivery thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._queue:
                    if self._retired:  # nothing more will come (close waits for this thread)
                        self._thread = None
                        cond.notify_all()
                        return
                    if self._drop_pending():
                        break
                    if not cond.wait(_IDLE_EXIT_S) and not self._queue:
                        self._thread = None  # (a submit after this starts a new thread)
                        cond.notify_all()
                        return
                item = self._queue.popleft() if self._queue else None
            if item is None:
                self._report_telemetry_data_error(
                    f"{self.dropped} export call(s) dropped: exporter {self.name} could not keep up")
                continue
            method, args = item
            self._deliver(method, args)
            with cond:
                self._done += 1
                cond.notify_all()
                if method == _CLOSE and not self._queue:
                    self._thread = None
                    return

    def _drop_pending(self) -> bool:
        if self.dropped and not self._drop_reported:
            self._drop_reported = True
            return True
        return False

    def _deliver(self, method: str, args: tuple[Any, ...]) -> None:
        if self.force_disabled and method != _CLOSE:
            return
        if method == TELEMETRY_DATA_ERROR:  # (its type depends on what this exporter has done so far)
            self._report_telemetry_data_error(*args)
            return
        try:
            getattr(self.exporter, method)(*args)
            self.delivered += 1
            self.any_data_exported_successfully = True
        except BaseException as exc:  # noqa: BLE001 - an exporter must not kill delivery (nor the process)
            if method == _CLOSE:
                self._failed(method, exc)
                return
            self.num_errors += 1
            self._failed(method, exc)
            self._report_telemetry_data_error(f"Error exporting data via exporter {self.name}: {describe(exc)}")
            if self.num_errors >= DISABLE_AFTER_FAILURES and not self.force_disabled:
                self.force_disabled = True  # (recorded through on_failure; the first failure was warned about)
                self._failed("(all calls)", RuntimeError(f"disabled after {self.num_errors} failures"))

    def _report_telemetry_data_error(self, message: str, attributes: Any = None) -> None:
        """one-logger's rule: each exporter hears of a gap in its data once."""
        if self.telemetry_data_error_reported:
            return
        self.telemetry_data_error_reported = True
        kind = (TelemetryDataError.ErrorType.INCOMPLETE_TELEMETRY_DATA if self.any_data_exported_successfully
                else TelemetryDataError.ErrorType.NO_TELEMETRY_DATA)
        try:
            self.exporter.export_telemetry_data_error(TelemetryDataError.create(kind, message, attributes))
        except BaseException as exc:  # noqa: BLE001
            self._failed("export_telemetry_data_error", exc)

    def _failed(self, method: str, exc: BaseException) -> None:
        text = describe(exc)
        if not self._warned:
            self._warned = True
            warn_safely(f"telemetrain: exporter {self.name}.{method} raised {text} (contained: training goes on; "
                        "counted in the exporter's stats)", stacklevel=2)
        callback = self._on_failure
        if callback is not None:
            try:
                callback(f"{self.name}.{method}", text)
            except Exception:  # noqa: BLE001
                pass
