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
per thread: ~15 us per thread). A window's figures are the threads' own increments (``since``), not the difference of
two sums: a thread that ended since the previous report would take its whole count out of the sum and cut the
window's figure by all the CPU it ever used (to 0, for a data loader worker that ran for an hour); per thread it takes
only what it added after the previous reading. Elsewhere (no ``/proc``, a kernel without schedstats) ``read_threads``
returns None and reports carry neither figure.
"""

from __future__ import annotations

import os

__all__ = ["Counts", "read", "read_threads", "since"]

_TASKS = "/proc/self/task"
_available = os.path.exists(f"{_TASKS}/{os.getpid()}/schedstat")

Counts = dict[str, tuple[int, int]]
"""A reading: native thread id (as ``/proc`` names it) -> (ns on a CPU, ns waiting for one)."""


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
