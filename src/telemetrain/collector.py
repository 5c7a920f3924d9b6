"""One daemon thread per process that runs timed work: closing time windows at their boundary, reading gauges.

torch.monitor closes a window only inside ``add()``, so a stat that goes quiet never reports its last window; here
the collector closes it at the boundary whatever the training thread does. A task is any object with a
``tick(now_ns) -> next due ns | None`` method; the collector holds it weakly (a task that is garbage-collected simply
stops), calls it at its due time and reschedules it with what it returns.

The thread starts with the first scheduled task (never at import) and exits as soon as no task is left (a task is
gone when cancelled or garbage-collected), so a closed ``Telemetry`` leaves no thread behind. A forked child
starts with no tasks and no thread (detected by pid, so the order of at-fork hooks does not matter); owners
reschedule their tasks there. Ticks are late when the interpreter is busy (under the GIL a waiting thread gets it
within ``sys.getswitchinterval()``, 5 ms by default): a window's record carries the time it was actually closed.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
import weakref
from typing import Any, Protocol

from .dispatch import describe, warn_safely

__all__ = ["Collector", "Task", "collector"]

class Task(Protocol):
    def tick(self, now_ns: int) -> int | None: ...


class Collector:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        # re-entrant: a signal handler's close (cancel) may interrupt this thread's own schedule()
        self._cond = threading.Condition(threading.RLock())
        self._heap: list[tuple[int, int, weakref.ref[Any]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._warned = False
        self._dirty = False  # some task was garbage-collected: prune before sleeping
        self._in_flight = False  # a task's tick is running (it may reschedule itself)

    def schedule(self, task: Task, due_ns: int) -> None:
        """Call ``task.tick`` at ``due_ns`` (monotonic) or soon after."""
        if self._pid != os.getpid():
            self._reset()
        with self._cond:
            heapq.heappush(self._heap, (due_ns, next(self._seq), weakref.ref(task)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="telemetrain-collector", daemon=True)
                self._thread.start()
            elif self._heap[0][0] == due_ns:
                self._cond.notify()

    def cancel(self, task: Task | None = None) -> None:
        """Forget ``task``'s scheduled calls, and those of garbage-collected tasks. When nothing is left, wait for the
        thread to end (up to 1 s), so that a closed ``Telemetry`` leaves no thread behind."""
        if self._pid != os.getpid():
            return
        with self._cond:
            self._heap = [entry for entry in self._heap if entry[2]() not in (task, None)]
            heapq.heapify(self._heap)
            self._cond.notify()
            thread = self._thread if not self._heap and not self._in_flight else None
        if thread is not None and thread is not threading.current_thread():
            thread.join(1.0)

    def poke(self) -> None:
        """A task was garbage-collected: let the thread drop it (and exit if it was the last). Called from weakref
        callbacks, which may run inside this very collector's locked code: never blocks."""
        self._dirty = True
        if self._pid == os.getpid() and self._cond.acquire(blocking=False):
            try:
                self._cond.notify()
            finally:
                self._cond.release()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._pid == os.getpid()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while True:
                    if self._dirty:
                        self._dirty = False
                        self._heap = [entry for entry in self._heap if entry[2]() is not None]
                        heapq.heapify(self._heap)
                    if not self._heap:
                        self._thread = None
                        return
                    due = self._heap[0][0]
                    now = time.monotonic_ns()
                    if due <= now:
                        _, _, ref = heapq.heappop(self._heap)
                        self._in_flight = True
                        break
                    cond.wait((due - now) / 1e9)
            task = ref()
            nxt = None
            if task is not None:
                try:
                    nxt = task.tick(now)
                except BaseException as exc:  # noqa: BLE001 - nor kill this thread: it closes every window
                    if not self._warned:
                        self._warned = True
                        warn_safely(f"telemetrain collector: a task failed and was dropped: {describe(exc)}")
            with cond:
                self._in_flight = False
                if nxt is not None:
                    heapq.heappush(self._heap, (nxt, next(self._seq), ref))
            del task


collector = Collector()
