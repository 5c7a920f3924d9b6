"""How the stall watchdog's thread is woken, and what it leaves for a fatal signal (a base class of
``StallWatchdog``): a non-blocking self-pipe the thread waits on, made the process's signal wakeup fd so that a
SIGTERM wakes the thread even while the training thread is blocked in C++ (someone else's wakeup fd is left in
place), given back at stop and let go in a forked child; and faulthandler's stacks file for SIGABRT/SIGSEGV
(``fatal-stacks/rank-<R>.<pid>.txt`` beside the run), removed at stop when empty."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import select
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ..dispatch import describe
from ..telemetry import Telemetry

__all__ = ["FATAL_DIR", "WatchdogSignals"]

FATAL_DIR = "fatal-stacks"


class WatchdogSignals:
    """The wakeup pipe, the signal wakeup fd and the fatal-signal stacks of a ``StallWatchdog`` (which sets these
    fields in ``__init__``)."""

    telemetry: Telemetry
    _pipe: tuple[int, int] | None
    _old_wakeup: int  # -2: ours is the process's signal wakeup fd
    _signal: str
    _signal_reported: bool
    _fatal: TextIO | None

    if TYPE_CHECKING:  # (the watchdog's)
        def _warn(self, message: str) -> None: ...

    def _open_pipe(self, on_signal: bool) -> None:
        """The pipe the thread waits on; with ``on_signal``, from the main thread, also the signal wakeup fd."""
        self._pipe = os.pipe()
        for fd in self._pipe:
            os.set_blocking(fd, False)
        if on_signal and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                old = signal.set_wakeup_fd(self._pipe[1], warn_on_full_buffer=False)
                if old != -1:  # someone else's (asyncio's): theirs stays
                    signal.set_wakeup_fd(old)
                else:
                    self._old_wakeup = -2  # ours is installed

    def _give_back_wakeup(self) -> None:
        """Ours no longer the signal wakeup fd (only the main thread can change it)."""
        if self._old_wakeup == -2 and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                current = signal.set_wakeup_fd(-1)
                if self._pipe is None or current != self._pipe[1]:
                    signal.set_wakeup_fd(current)  # someone installed theirs after us: leave it
            self._old_wakeup = -1

    def _signals_after_fork(self) -> None:
        """In a forked child: the parent's stacks file, wakeup fd and pipe let go."""
        self._fatal = None
        self._give_back_wakeup()
        self._old_wakeup = -1
        if self._pipe is not None:
            for fd in self._pipe:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._pipe = None

    def _wait(self, timeout: float) -> None:
        pipe = self._pipe
        if pipe is None:
            time.sleep(timeout)
            return
        with contextlib.suppress(OSError, ValueError):
            ready, _, _ = select.select([pipe[0]], [], [], timeout)
            if ready:
                self._read_pipe()

    def _read_pipe(self) -> None:
        pipe = self._pipe
        if pipe is None:
            return
        try:
            data = os.read(pipe[0], 4096)
        except (BlockingIOError, OSError):
            return
        if int(signal.SIGTERM) in data and not self._signal_reported:
            self._signal = "SIGTERM"

    def _wake(self) -> None:
        pipe = self._pipe
        if pipe is not None:
            with contextlib.suppress(OSError):
                os.write(pipe[1], b"\0")

    def _enable_fatal_stacks(self) -> None:
        run_dir = self.telemetry.run_dir
        if run_dir is None:
            return
        try:
            identity = self.telemetry.identity
            folder = Path(run_dir) / FATAL_DIR
            folder.mkdir(parents=True, exist_ok=True)
            self._fatal = open(folder / f"rank-{identity.rank}.{identity.pid}.txt", "w")
            faulthandler.enable(file=self._fatal, all_threads=True)
        except OSError as exc:
            self._warn(f"no fatal-signal stacks: {describe(exc)}")

    def _disable_fatal_stacks(self) -> None:
        if self._fatal is not None:
            with contextlib.suppress(Exception):
                faulthandler.disable()
                path = Path(self._fatal.name)
                self._fatal.close()
                if path.stat().st_size == 0:
                    path.unlink()
                    with contextlib.suppress(OSError):
                        path.parent.rmdir()
            self._fatal = None
