"""The process's one trimmer thread: it keeps every started background queue within its capacity (the hot path never
checks), ticking every ``TRIM_INTERVAL_S`` while queues fill and backing off to ``TRIM_IDLE_MAX_S`` while none does
(``dispatch`` describes the drop policy)."""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .dispatch import BackgroundRunner

TRIM_INTERVAL_S = 0.02
TRIM_IDLE_MAX_S = 0.16  # the trimmer's tick while no queue is filling (see _Trimmer._run)


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
