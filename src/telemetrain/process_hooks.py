"""Process lifecycle: flush at exit and on SIGTERM/SIGINT, re-initialise in a forked child.

The exit close is registered at import (see the end of this module); the signal handlers the first time a
``Telemetry`` starts a background runner. Signal handlers chain to the handler that was installed before ours: a
Python handler is called after our flush; the default action is restored and the signal re-raised, so the process
still dies of it (torchelastic reads the exit status); an ignored signal stays ignored. A handler the program sets
after ours (``signal.signal``, wrapped at install: ``_chain_signal``) takes the place of the one we chain to, so it
runs after our flush and ours stays. Handlers can only be installed from the main thread; from another thread we try
again later.

Every wait is bounded: the exit close has ``EXIT_FLUSH_TIMEOUT_S`` and a signal ``SIGNAL_FLUSH_TIMEOUT_S`` for all
the live instances together (each gets at least ``MIN_SHARE_S``), and a sink that does not finish in that grace
period is abandoned (``Telemetry.close``), so a stuck sink never keeps a process from exiting or from dying of the
signal it was sent.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any, NoReturn, Protocol

from .containment import is_interrupt

__all__ = ["ending", "ending_cause", "install", "received_signal", "track"]

EXIT_FLUSH_TIMEOUT_S = 5.0
SIGNAL_FLUSH_TIMEOUT_S = 3.0
MIN_SHARE_S = 0.5  # each live Telemetry's least share of a budget, though an earlier one used all of it
_SIGNALS = ("SIGTERM", "SIGINT")


class _Tracked(Protocol):
    def close(self, timeout: float | None = ...) -> bool: ...
    def flush(self, timeout: float | None = ...) -> bool: ...
    def _after_fork_in_child(self) -> None: ...


_live: weakref.WeakSet[Any] = weakref.WeakSet()
_installed: dict[str, Any] = {"atexit": False, "fork": False, "mp_pid": 0}
_previous: dict[int, Any] = {}
_lock = threading.Lock()


def track(telemetry: _Tracked) -> None:
    """Called for every new Telemetry: the fork hook must exist before the first fork (DataLoader workers start
    before the first metric), so it is registered here; it starts no thread and opens no file."""
    _live.add(telemetry)
    if not _installed["fork"] and hasattr(os, "register_at_fork"):
        with _lock:
            if not _installed["fork"]:
                os.register_at_fork(after_in_child=_after_fork_in_child)
                _installed["fork"] = True


def untrack(telemetry: _Tracked) -> None:
    _live.discard(telemetry)


def _close_all(timeout: float = EXIT_FLUSH_TIMEOUT_S) -> None:
    _for_each_live("close", timeout)


def _flush_all(timeout: float) -> None:
    _for_each_live("flush", timeout)


def _for_each_live(what: str, timeout: float) -> None:
    """``close``/``flush`` every live Telemetry within one budget. Contains everything an instance raises but the
    user's Ctrl-C (``containment.is_interrupt``), which is raised once every instance had its turn."""
    deadline = time.monotonic() + timeout
    interrupted: BaseException | None = None
    for t in list(_live):
        try:
            getattr(t, what)(max(MIN_SHARE_S, deadline - time.monotonic()))
        except BaseException as exc:  # noqa: BLE001 - exit and the signal must go on
            if is_interrupt(exc):
                interrupted = exc
    if interrupted is not None:
        raise interrupted


_dying_of: dict[str, int] = {}  # "signal": the signal this process is dying of, once our handler re-raises it
_received: dict[str, int] = {}  # "signal": the last SIGTERM/SIGINT our handler passed on to a Python handler
_exit_code: dict[str, object] = {}  # "code": the argument of the last sys.exit call


def _note_exit(code: str | int | None = None) -> NoReturn:
    """``sys.exit``, noting its code: Python's exit path keeps a SystemExit's code from atexit handlers, and a run
    that ends in ``sys.exit(3)`` (or Lightning's ``sys.exit(1)`` after a Ctrl-C) did not succeed."""
    if threading.current_thread() is threading.main_thread():  # elsewhere it only ends that thread
        _exit_code["code"] = code
    _real_exit(code)


_real_exit = sys.exit


def ending() -> str | None:
    """Why the process is ending, for a sink closing now (an MLflow run's final status): ``"killed"`` while our
    handler closes everything before dying of SIGTERM/SIGINT, at any exit after a SIGTERM/SIGINT our handler passed
    on to a Python handler (a preemption: Lightning's ``SIGTERMException`` is a ``SystemExit(0)``, a user's handler
    may ``sys.exit(1)``; Lightning's Ctrl-C ends in ``sys.exit(1)``), and at an exit after an uncaught
    ``KeyboardInterrupt``; ``"failed"`` at exit after an uncaught exception (``sys.last_type``, set when Python
    printed it) or a non-zero ``sys.exit``; else None (a normal exit, or an explicit close)."""
    if "signal" in _dying_of:
        return "killed"
    if not _exiting["now"]:
        return None
    if "signal" in _received:  # a preemption: Lightning's SIGTERMException is a SystemExit(0)
        return "killed"
    last = getattr(sys, "last_type", None)
    if isinstance(last, type) and issubclass(last, KeyboardInterrupt):
        return "killed"
    if last is not None:
        return "failed"
    code = _exit_code.get("code")
    if code is not None and code != 0:  # sys.exit's rule: None and 0 are a success, any other value a failure
        return "failed"
    return None


def ending_cause() -> str | None:
    """What is ending the process, for spans still open at close: ``"SIGTERM"``/``"SIGINT"`` while our handler
    closes everything before dying of it, or at any exit after one (Lightning's Ctrl-C, a preemption); the type name
    of the uncaught exception at exit (``KeyboardInterrupt``: a Ctrl-C Python's own handler raised); ``SystemExit(3)``
    after a non-zero ``sys.exit``; else None."""
    signum = _dying_of.get("signal")
    if signum is not None:
        return signal_name(signum)
    if not _exiting["now"]:
        return None
    last = getattr(sys, "last_type", None)
    received = received_signal()
    if received is not None and not (isinstance(last, type) and issubclass(last, KeyboardInterrupt)):
        return received  # the signal decides, as for ``ending`` (an uncaught Ctrl-C names itself)
    if isinstance(last, type):
        return last.__name__
    code = _exit_code.get("code")
    return None if code is None or code == 0 else f"SystemExit({code!r})"


def received_signal() -> str | None:
    """The SIGTERM/SIGINT our handler passed on to a Python handler (``"SIGTERM"``), once one was: that handler may
    end the process by ``sys.exit`` or an exception (Lightning's ``SIGTERMException``, torchelastic's
    ``SignalException``), and that exit is the signal's doing; else None."""
    signum = _received.get("signal")
    return None if signum is None else signal_name(signum)


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15; ``"signal 99"`` for a number with no name here."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


_exiting = {"now": False}


def _at_exit() -> None:
    _exiting["now"] = True
    _close_all()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        _received["signal"] = signum
        _flush_all(SIGNAL_FLUSH_TIMEOUT_S)
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        # die of the signal, as the process would have without us
        _dying_of["signal"] = signum
        _close_all(SIGNAL_FLUSH_TIMEOUT_S)
        _real_signal(signum, signal.SIG_DFL)  # (signal.signal would keep ours: _chain_signal)
        os.kill(os.getpid(), signum)
    else:  # SIG_IGN: the signal was being ignored; keep ignoring it, but our data is safe either way
        _flush_all(SIGNAL_FLUSH_TIMEOUT_S)


def _install_signals() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for name in _SIGNALS:
        signum = getattr(signal, name, None)
        if signum is None or signum in _previous:
            continue
        try:
            current = _real_getsignal(signum)
            if current is _on_signal:
                continue
            _real_signal(signum, _on_signal)
        except (ValueError, OSError):  # not the main interpreter, or not allowed here
            continue
        _previous[signum] = _base[signum] = current
    if _previous and signal.signal is _real_signal:
        signal.signal, signal.getsignal = _chain_signal, _chained_getsignal


_real_signal = signal.signal
_real_getsignal = signal.getsignal
_base: dict[int, Any] = {}  # per signal, the handler ours replaced at install


def _chain_signal(signalnum: Any, handler: Any) -> Any:
    """``signal.signal`` once ours are installed: a SIGTERM/SIGINT handler set after ours (yours, Lightning's,
    torchelastic's) goes behind ours rather than replacing it, so the store is flushed before it runs, and a
    ``sys.exit`` it makes is known to follow the signal (an MLflow run KILLED, not FAILED). It is still called, as is
    SIG_DFL (ours then dies of the signal, after closing) and SIG_IGN (ignored, after a flush); ``signal.getsignal``
    returns it. Without this a handler that reset SIG_DFL and re-raised the signal lost every record not yet flushed
    and left the MLflow run RUNNING."""
    if signalnum in _previous and _real_getsignal(signalnum) is _on_signal:
        _real_signal(signalnum, _on_signal)  # raises as signal.signal would: another thread, a bad handler
        if handler is not _on_signal and not callable(handler) and handler not in (signal.SIG_DFL, signal.SIG_IGN):
            raise TypeError(f"signal handler must be signal.SIG_IGN, signal.SIG_DFL, or a callable object, "
                            f"got {type(handler).__name__}")
        old = _previous[signalnum]
        _previous[signalnum] = _base[signalnum] if handler is _on_signal else handler
        return old
    return _real_signal(signalnum, handler)


def _chained_getsignal(signalnum: Any) -> Any:
    """``signal.getsignal``, which names the handler ours calls (``_chain_signal``) rather than ours."""
    current = _real_getsignal(signalnum)
    if current is _on_signal and signalnum in _previous:
        return _previous[signalnum]
    return current


class _MpSentinel:
    """multiprocessing's after-fork registry holds its keys weakly: this object lives as long as the module."""


_MP_SENTINEL = _MpSentinel()


def _mp_child_started(_: object) -> None:
    # Runs inside multiprocessing's child bootstrap, after it cleared the finalizers inherited from the parent.
    # Its children leave through os._exit (atexit is skipped) but run these finalizers first.
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        _installed["mp_pid"] = os.getpid()
        mp_util.Finalize(None, _close_all, exitpriority=100)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    for t in list(_live):
        try:
            t._after_fork_in_child()
        except BaseException:  # noqa: BLE001 - a child must start even if our reset failed
            pass
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        mp_util.register_after_fork(_MP_SENTINEL, _mp_child_started)


def exiting() -> bool:
    """Whether the exit close has run: a record emitted now (an atexit handler that runs after ours) is lost."""
    return _exiting["now"]


def install() -> None:
    """Idempotent; cheap after the first call in a process."""
    with _lock:
        _install_signals()
        if sys.exit is _real_exit:
            sys.exit = _note_exit
        _register_mp_finalizer_if_child()


def _register_mp_finalizer_if_child() -> None:
    """In a multiprocessing child whose first record came after the fork, register the exit flush here."""
    mp = sys.modules.get("multiprocessing")
    if mp is None or _installed.get("mp_pid") == os.getpid():
        return
    try:
        in_child = mp.parent_process() is not None
    except Exception:  # noqa: BLE001
        return
    if in_child:
        _installed["mp_pid"] = os.getpid()
        _mp_child_started(None)


# Registered at import, not with the other hooks at the first record: atexit runs its handlers last registered
# first, so an atexit handler that a program registered after importing telemetrain but before its first record
# (a job-end event, a final metric) ran after our close and its records were lost. (No thread, no file: only a
# callback.)
atexit.register(_at_exit)
_installed["atexit"] = True
