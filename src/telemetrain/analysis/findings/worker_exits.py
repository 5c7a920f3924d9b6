"""Why a launched job's workers ended, read as a cause to act on: the launcher's ``worker_failed`` events (one per
failed worker of a failed attempt: the one the agent restarts from, or torchelastic's ``ChildFailedError`` when it
gives up) name each worker's exit code and which failure the agent observed first. The first failure is the cause;
the others usually follow from it (a collective that lost its peer, the agent stopping the rest with SIGTERM).
Standard library only: ``show`` and the report read it.

A negative exit code is the signal that ended the process; each common one has its usual meaning in a training job.
A SIGKILL has a known sender when the agent read its container's cgroup: the agent outlives its workers, and at a
worker's SIGKILL it records how many processes the cgroup's OOM killer killed since it last looked (``oom_kills``,
``cgroup``): more than none, the worker was killed by the container's OOM killer; none, it was not that killer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .fmt import ranges

__all__ = ["EVENT", "WorkerExit", "describe_exit", "exit_finding_text", "first_causes", "first_failures", "meaning",
           "worker_exits"]

EVENT = ("launcher", "worker_failed")  # (group, name) of the events read here

_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
            11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}
_MEANINGS = {
    "SIGKILL": "sent from outside the program, which cannot catch it: most often the kernel's out-of-memory killer "
               "(`dmesg` on its host says so) or the scheduler",
    "SIGTERM": "a request to stop: the scheduler (a preemption, a time limit) or an operator",
    "SIGINT": "an interrupt (Ctrl-C)",
    "SIGHUP": "its terminal or session went away",
    "SIGABRT": "an abort in native code (a failed C++/CUDA assertion, NCCL's watchdog): the rank's stderr has the "
               "message",
    "SIGSEGV": "a crash in native code (a C/C++/CUDA extension): the rank's stderr or a core dump has the stack",
    "SIGBUS": "a bad memory access, often a full /dev/shm (DataLoader workers share batches there) or a "
              "memory-mapped file truncated under it",
    "SIGILL": "an instruction this CPU lacks (a binary built for another machine)",
    "SIGFPE": "an arithmetic fault in native code",
    "SIGPIPE": "it wrote to a pipe whose reader had gone",
}


@dataclass(frozen=True, slots=True)
class WorkerExit:
    """A failed worker as the agent saw it end."""

    rank: int
    exitcode: int
    pid: int | None = None
    message: str = ""
    first: bool | None = None  # the agent's first observed failure (None: recorded before the launcher kept it)
    oom_kills: int | None = None  # the cgroup's OOM kills the agent counted at this SIGKILL (None: not read)
    cgroup: str = ""

    @property
    def oom_killed(self) -> bool:
        """Killed by its container's OOM killer: a SIGKILL while the cgroup's OOM-kill count rose."""
        return self.signal == "SIGKILL" and bool(self.oom_kills)

    @property
    def signal(self) -> str | None:
        """The signal's name when a signal ended the process (a negative exit code)."""
        return _SIGNALS.get(-self.exitcode, f"signal {-self.exitcode}") if self.exitcode < 0 else None


def worker_exits(events: Iterable[Mapping[str, Any]]) -> list[WorkerExit]:
    """The exits of ``events`` (the attributes of ``launcher/worker_failed`` events), by rank; malformed ones left
    out (a store is read as found)."""
    out = []
    for a in events:
        rank, code, pid = a.get("rank"), a.get("exitcode"), a.get("pid")
        if type(rank) is not int or type(code) is not int:
            continue
        first, kills = a.get("first_failure"), a.get("oom_kills")
        out.append(WorkerExit(rank, code, pid if type(pid) is int else None, str(a.get("message") or ""),
                              first if isinstance(first, bool) else None,
                              kills if type(kills) is int and kills >= 0 else None, str(a.get("cgroup") or "")))
    return sorted(out, key=lambda e: e.rank)


def first_failures(exits: list[WorkerExit]) -> list[WorkerExit]:
    """The failures that came first: the one the agent observed first; for a run recorded without that, the exits
    that are not the agent's SIGTERM to the survivors (all of them when every worker got SIGTERM: the job itself
    was stopped)."""
    if any(e.first for e in exits):
        return [e for e in exits if e.first]
    others = [e for e in exits if e.signal != "SIGTERM"]
    return others or list(exits)


def describe_exit(e: WorkerExit) -> str:
    """``died of SIGKILL (exit code -9)``, ``exited with code 1``."""
    if e.oom_killed:
        return f"was killed by the container's OOM killer ({e.signal}, exit code {e.exitcode})"
    if e.signal is not None:
        return f"died of {e.signal} (exit code {e.exitcode})"
    return f"exited with code {e.exitcode}"


def meaning(e: WorkerExit) -> str:
    """What such an exit usually means in a training job."""
    where = f" {e.cgroup}" if e.cgroup else ""
    if e.oom_killed:
        return (f"its container's memory cgroup{where} counted {e.oom_kills} OOM kill(s) as it died: the job's memory "
                "reached the container's limit (raise the limit, or lower the job's host memory: DataLoader workers, "
                "prefetch, pinned buffers)")
    if e.signal == "SIGKILL" and e.oom_kills == 0:
        return (f"sent from outside the program, which cannot catch it; not its container's OOM killer (the memory "
                f"cgroup{where} counted no OOM kill): the host's OOM killer (`dmesg` on its host says so), the "
                "scheduler or an operator")
    if e.signal is not None:
        return _MEANINGS.get(e.signal, "a signal ended it")
    detail = e.message if e.message and not e.message.startswith("To enable traceback") else ""
    return "the program ended with an error" + (f": {detail}" if detail else " (the rank's traceback is in its "
                                                                           "stderr or its error file)")


def first_causes(first: list[WorkerExit]) -> list[tuple[str, WorkerExit]]:
    """The first failures by exit code: ("rank 1 died of SIGTERM (exit code -15)", one of them), ranks as ranges."""
    by_code: dict[tuple[int, bool], list[WorkerExit]] = {}
    for e in first:
        by_code.setdefault((e.exitcode, e.oom_killed), []).append(e)
    return [(f"rank {ranges([e.rank for e in group])} {describe_exit(group[0])}", group[0])
            for group in by_code.values()]


def exit_finding_text(exits: list[WorkerExit]) -> tuple[str, str] | None:
    """The title and text of the finding naming the cause, or None without exits."""
    if not exits:
        return None
    first = first_failures(exits)
    causes = first_causes(first)
    title = "crash: " + "; ".join(who for who, _ in causes) + (" first" if len(first) < len(exits) else "")
    pids = {e.rank: e.pid for e in first if e.pid is not None}
    text = " ".join(f"{who}" + (f" (pid {pids[lead.rank]})" if len(first) == 1 and lead.rank in pids else "")
                    + f": {meaning(lead)}." for who, lead in causes)
    rest = [e for e in exits if e not in first]
    stopped = [e for e in rest if e.signal == "SIGTERM"]
    other = [e for e in rest if e.signal != "SIGTERM"]
    if stopped:
        text += (f" Then rank(s) {ranges([e.rank for e in stopped])} were stopped by the agent (SIGTERM), "
                 "as it stops every worker once one fails.")
    if other:
        text += " Then " + "; ".join(f"rank {e.rank} {describe_exit(e)}" for e in other) + "."
    return title, text
