"""The process's time on a CPU and its wait for one, read at each report: what tells a step that got slower from a
machine that got busier.

Linux keeps, per thread, the nanoseconds it ran on a CPU and the nanoseconds it was runnable but waiting on a run
queue (``/proc/<pid>/task/<tid>/schedstat``: "time spent on the cpu", "time spent waiting on a runqueue"; see
https://docs.kernel.org/scheduler/sched-stats.html). Summed over the process's threads -- the training thread, and
the threads that do its work elsewhere (intra-op pools, gloo's communication threads) -- they give, per report
window, ``cpu_time_sec`` and ``cpu_wait_sec``: ``wait / (cpu + wait)`` is the share of the process's runnable time
that another process had the CPU (contention). The findings engine and ``compare`` take that share out of a window's
times before calling a change a slowdown.

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


def read() -> tuple[int, int] | None:
    """(ns on a CPU, ns waiting for one) summed over this process's live threads, or None where not available."""
    global _available
    if not _available:
        return None
    cpu = wait = 0
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
            cpu += int(fields[0])
            wait += int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
        finally:
            os.close(fd)
    return cpu, wait
