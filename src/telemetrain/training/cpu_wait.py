"""The process's time on a CPU and its wait for one, per report window: what tells a step that got slower from a
machine that got busier.

The CPU time is the process's CPU clock (``time.process_time_ns``: ``CLOCK_PROCESS_CPUTIME_ID``), and the training
thread's its own (``time.thread_time_ns``), read by the training thread when it captures a report (``clocks``: two
clock reads, ~1-10 us) and at the loop's start: ``cpu_time_sec`` and ``train_thread_cpu_time_sec`` are their
differences over exactly the window. The process's clock counts every thread that ran in the window, those that
started and ended between two reports included (a checkpoint writer, compile workers, a data loader's short-lived
threads), and knows nothing of thread ids. It replaced a sum over the threads' schedstat counts, which missed both:
a thread that ended before the next reading took what it had added since the previous one with it (measured: 15-17%
of a loop's CPU lost beside a thread that started and ended threads working 5 ms each), a running thread's count
lagged by up to a scheduler tick, and the reader's delay shifted CPU between neighbouring windows.

The wait has no process-wide count: Linux keeps, per thread, the nanoseconds it was runnable but waiting on a run
queue (``/proc/<pid>/task/<tid>/schedstat``, second field; https://docs.kernel.org/scheduler/sched-stats.html).
Summed over the process's threads -- the training thread, and the threads that do its work elsewhere (intra-op
pools, gloo's communication threads) -- per report window that is ``cpu_wait_sec``: ``wait / (cpu + wait)`` is the
share of the process's runnable time that another process had the CPU (contention). The findings engine and
``compare`` take that share out of a window's times before calling a change a slowdown. The training thread's own
wait is read alongside (``train_thread_cpu_wait_sec``): the straggler rule asks whether *that* thread was kept off a
CPU. The process's sum cannot say: a thread that sleeps or blocks on I/O every iteration (a slow data loader) and the
communication threads that wake with it wait for a CPU at every wake-up on a busy machine, so the sum grows with the
sleeping, while the training thread itself waits only at its own wake-ups.

The threads' counts are read by the reporter, off the training thread, when it computes a report (one directory
listing and one small read per thread: ~15-20 us per thread). A window's wait is the threads' own increments
(``since``), not the difference of two sums: a thread that ended since the previous report would take its whole
count out of the sum; per thread it takes only what it added after the previous reading (the part of the wait that
is lost, as a thread's CPU time was). A thread id is reused only after the kernel's cyclic allocation has gone
round ``pid_max`` ids (measured: 3,000 threads started and ended in turn got 3,000 distinct ids), so one reused
between two reports is taken as a new thread when its counts are below the old one's, and otherwise not detected:
telling them apart by the thread's start time would read ``/proc/<tid>/stat`` for every thread at every report,
three times the cost. Elsewhere (no ``/proc``, a kernel without schedstats) ``read_threads`` returns None and reports
carry no wait.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["Counts", "clocks", "read", "read_threads", "since"]

_TASKS = "/proc/self/task"
_available = os.path.exists(f"{_TASKS}/{os.getpid()}/schedstat")

Counts = dict[str, tuple[int, int]]
"""A reading: native thread id (as ``/proc`` names it) -> (ns on a CPU, ns waiting for one)."""


def clocks() -> tuple[int, int, int, int]:
    """(monotonic ns, the process's CPU ns, the calling thread's CPU ns, its native id): what a window's CPU time is
    taken from."""
    return time.monotonic_ns(), time.process_time_ns(), time.thread_time_ns(), threading.get_native_id()


def read_threads() -> Counts | None:
    """Each live thread of this process's two counts, or None where not available."""
    global _available
    if not _available:
        return None
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        _available = False
        return None
    counts: Counts = {}
    for tid in tids:
        try:
            fd = os.open(f"{_TASKS}/{tid}/schedstat", os.O_RDONLY)
        except OSError:  # the thread ended meanwhile
            continue
        try:
            fields = os.read(fd, 128).split()
            counts[tid] = (int(fields[0]), int(fields[1]))
        except (OSError, ValueError, IndexError):
            continue
        finally:
            os.close(fd)
    return counts


def read(thread: int | None = None) -> tuple[int, int, int, int] | None:
    """(ns on a CPU, ns waiting for one) summed over this process's live threads, then the same two of ``thread``
    alone (a native thread id: ``threading.get_native_id()``; -1, -1 when it is not given or not alive), or None
    where not available."""
    counts = read_threads()
    if counts is None:
        return None
    mine = counts.get(str(thread), (-1, -1)) if thread is not None else (-1, -1)
    return sum(c for c, _ in counts.values()), sum(w for _, w in counts.values()), mine[0], mine[1]


def since(last: Counts, now: Counts, thread: int | None = None) -> tuple[int, ...]:
    """(ns on a CPU, ns waiting for one) the process's threads added from reading ``last`` to reading ``now``, then
    the same two of ``thread`` when it was alive at both. Per thread: one that started meanwhile counts whole, one
    that ended counts nothing (what it added after ``last`` is lost with it, not its whole count), and a thread id
    reused by a new thread (counts below the old one's) counts whole."""
    cpu = wait = 0
    for tid, (on, waited) in now.items():
        was_on, was_waiting = last.get(tid, (0, 0))
        if on < was_on or waited < was_waiting:
            was_on = was_waiting = 0
        cpu += on - was_on
        wait += waited - was_waiting
    mine = str(thread)
    if thread is not None and mine in last and mine in now:
        return cpu, wait, now[mine][0] - last[mine][0], now[mine][1] - last[mine][1]
    return cpu, wait
