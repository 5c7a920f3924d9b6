"""Whether a process that wrote a run is still the one alive under its pid: its start, recorded in its file's header
(``process_start``), against the start of the process that now holds the pid. A pid is reused once its process is
gone, so "the pid exists" alone does not say the writer lives; nor does silence say it died (a long checkpoint
save, a slow validation)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["boot_id", "process_start", "same_process"]


def boot_id() -> str | None:
    """This boot of this host (Linux ``/proc/sys/kernel/random/boot_id``): a start in clock ticks is since boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def process_start(pid: int) -> dict[str, Any] | None:
    """The start of process ``pid``, as a key a later process of the same pid does not share: on Linux the boot id
    and field 22 of ``/proc/<pid>/stat`` (starttime, clock ticks since boot: exact, unlike a wall time, which moves
    with the clock); elsewhere psutil's ``create_time`` where psutil is installed; else None (not known)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        # the command name (field 2) may hold spaces and parentheses: count fields after its last ")"
        ticks = int(stat[stat.rindex(b")") + 2:].split()[19])  # fields from 3 on: field 22 is the 20th
        boot = boot_id()
        if boot is not None:
            return {"pid": pid, "boot_id": boot, "start_ticks": ticks}
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    try:
        return {"pid": pid, "create_time": float(psutil.Process(pid).create_time())}
    except Exception:  # noqa: BLE001 - gone, not allowed, or not supported here: not known
        return None


def same_process(recorded: Any) -> bool | None:
    """Whether the process a header's ``process_start`` describes is alive now: True (the same pid, started at the
    same time), False (gone: no such pid, a pid reused by another process, or a host rebooted since), None when it
    cannot be told (no usable record, no way to read a process's start here)."""
    if not isinstance(recorded, dict) or type(recorded.get("pid")) is not int or recorded["pid"] <= 0:
        return None
    boot = recorded.get("boot_id")
    if isinstance(boot, str) and boot_id() not in (None, boot):
        return False  # rebooted: every process of that boot is gone
    now = process_start(recorded["pid"])
    if now is None:
        try:
            os.kill(recorded["pid"], 0)
        except ProcessLookupError:
            return False
        except OSError:
            return None
        return None
    if "start_ticks" in recorded and "start_ticks" in now:
        return bool(recorded["start_ticks"] == now["start_ticks"] and recorded.get("boot_id") == now["boot_id"])
    created, current = recorded.get("create_time"), now.get("create_time")
    if isinstance(created, (int, float)) and isinstance(current, float):
        return abs(created - current) < 0.01  # (psutil's own rounding)
    return None
