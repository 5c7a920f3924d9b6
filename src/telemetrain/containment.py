"""Containment: what telemetrain does with a failure so that it never reaches training.

``is_interrupt`` is the rule (everything user code run by telemetrain raises is contained, ``BaseException``
included, except a ``KeyboardInterrupt`` on the main thread: the user's Ctrl-C); ``warn_safely`` warns without ever
raising; ``describe`` names an exception whose ``__str__`` may itself raise; ``call_bounded`` waits for a call at
most so long; ``PartialWriteError`` is how a sink says part of a batch was stored. Used by the dispatcher, the
sinks, the stats and the compatible APIs (``dispatch`` re-exports them).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

__all__ = ["PartialWriteError", "TelemetryWarning", "call_bounded", "describe", "is_interrupt", "warn_safely"]


class TelemetryWarning(RuntimeWarning):
    """A telemetry failure that was contained: training goes on, the record of it is in the run store."""


def is_interrupt(exc: BaseException) -> bool:
    """The one exception telemetrain's containment lets through: ``KeyboardInterrupt`` on the main thread.

    Python runs signal handlers on the main thread only, so there a ``KeyboardInterrupt`` is the user's Ctrl-C (or a
    SIGINT handler chained to Python's default) arriving while telemetry code happens to run, and it must reach the
    program. Everything else that user code run by telemetry raises -- ``SystemExit``, ``asyncio.CancelledError``,
    ``GeneratorExit``, a custom ``BaseException``, and a ``KeyboardInterrupt`` raised in any other thread, where no
    real interrupt is ever delivered -- is contained: counted, warned once, never raised into the caller or the
    background thread."""
    return isinstance(exc, KeyboardInterrupt) and threading.current_thread() is threading.main_thread()


def warn_safely(message: str, category: type[Warning] = TelemetryWarning, stacklevel: int = 2) -> None:
    """Warn without ever raising: under ``-W error`` a warning is an exception, and it must not reach training.
    ``stacklevel`` counts from the caller of this function, as ``warnings.warn``'s does from its caller."""
    try:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
    except BaseException as exc:  # a filter or showwarning hook that raises, even SystemExit
        if is_interrupt(exc):
            raise


class PartialWriteError(OSError):
    """Raised by a sink whose write stopped part-way (a full disk, a later request of a split batch): ``written`` of
    the batch's records are stored whole, the rest are not. The runner counts the first as delivered and only the
    rest as failed. ``cause``: what stopped it (an ``OSError``'s errno and strerror are kept)."""

    def __init__(self, written: int, cause: Exception) -> None:
        if isinstance(cause, OSError):
            super().__init__(cause.errno, cause.strerror)
        else:
            super().__init__(str(cause))
        self.written = written
        self.cause = cause

    def __str__(self) -> str:
        return f"{self.cause} (after {self.written} records were written)"


def call_bounded(fn: Callable[[], None], timeout: float | None,
                 name: str) -> tuple[bool, BaseException | None, bool]:
    """Run ``fn`` in a daemon thread and wait at most ``timeout`` seconds: (finished, what it raised, whether that
    is the user's Ctrl-C: ``is_interrupt`` where it was raised, so never one raised in the helper thread). A call
    that does not finish is left behind (it can hold nothing of ours). Inline when no thread can be started
    (interpreter shutdown) or when there is no timeout."""
    outcome: list[tuple[BaseException | None, bool]] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who contains it
            outcome.append((exc, is_interrupt(exc)))
        else:
            outcome.append((None, False))

    thread = threading.Thread(target=run, name=f"telemetrain-{name}", daemon=True) if timeout is not None else None
    try:
        if thread is None:
            raise RuntimeError("no timeout")
        thread.start()
    except RuntimeError:  # "can't create new thread at interpreter shutdown", or no timeout: the caller's thread
        run()
        return (True, *outcome[0])
    thread.join(timeout)
    return (True, *outcome[0]) if outcome else (False, None, False)


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, even one whose ``__str__`` itself raises."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except BaseException:  # noqa: BLE001 - a broken __str__ must not escape the containment it is part of
        return f"{type(exc).__name__}: <unprintable>"
