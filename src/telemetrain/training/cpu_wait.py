"""The process's time on a CPU and its wait for one, read at each report: what tells a step that got slower from a
machine that got busier.

Linux keeps, per thread, the nanoseconds it ran on a CPU and the nanoseconds it was runnable but waiting on a run
queue (``/proc/<pid>/task/<tid>/schedstat``: "time spent on the cpu", "time spent waiting on a runqueue"; see
https://docs.kernel.org/scheduler/sched-stats.html). Summed over the process's threads -- the training thread, and
the threads that do its work elsewhere (intra-op pools, gloo's communication threads) -- they give, per report
window, ``cpu_time_sec`` and ``cpu_wait_sec``: ``wait / (cpu + wait)`` is the share of the process's runnable time
that another process had the CPU (contention). The findings engine and ``compare`` take that share out of a window's
times before calling a change a slowdown.

The training thread's own two counts are read alongside (``train_thread_cpu_time_sec``,
``train_thread_cpu_wait_sec``): the straggler rule asks whether *that* thread was kept off a CPU. The process's sum
cannot say: a thread that sleeps or blocks on I/O every iteration (a slow data loader) and the communication threads
that wake with it wait for a CPU at every wake-up on a busy machine, so the sum grows with the sleeping, while the
training thread itself waits only at its own wake-ups.

Read by the reporter, off the training thread, when it computes a report (one directory listing and one small read
per thread: ~15 us per thread). A thread that ended since the previous report takes its counts with it (the delta
is clamped at 0). Elsewhere (no ``/proc``, a kernel without schedstats) ``read`` returns None and reports carry
neither figure.
"""

from __future__ import annotations

import os

__all__ = ["read"]

_TASKS = "/proc/self/task"
_available = os.path.exists(f"{_TASKS}/{os.getpid()}/schedstat")


def read(thread: int | None = None) -> tuple[int, int, int, int] | None:
    """(ns on a CPU, ns waiting for one) summed over this process's live threads, then the same two of ``thread``
    alone (a native thread id: ``threading.get_native_id()``; -1, -1 when it is not given or not alive), or None
    where not available."""
    global _available
    if not _available:
        return None
    cpu = wait = 0
    thread_cpu = thread_wait = -1
    mine = str(thread) if thread is not None else ""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        _available = False
        return None
    for tid in tids:
        try:
            fd = os.open(f"{_TASKS}/{tid}/schedstat", os.O_RDONLY)
        except OSError:  # the thread ended meanwhile
            continue
        try:
            fields = os.read(fd, 128).split()
            on, waited = int(fields[0]), int(fields[1])
            cpu += on
            wait += waited
            if tid == mine:
                thread_cpu, thread_wait = on, waited
        except (OSError, ValueError, IndexError):
            continue
        finally:
            os.close(fd)
    return cpu, wait, thread_cpu, thread_wait
