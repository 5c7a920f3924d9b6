"""What a rank was doing, as plain values for a ``stall_evidence`` record: every Python thread's stack, the open
spans (which phase, since when), the collective entered and not left, and the NCCL/gloo Flight Recorder's dump.

Read from another thread than the one that is stuck (the watchdog's): ``sys._current_frames`` sees every thread's
Python frames, even one blocked inside a C++ call (its last Python line is the call).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from ..training.names import PHASES

__all__ = ["FLIGHT_RECORDER_DIR", "collective_state", "dump_flight_recorder", "flight_recorder_enabled",
           "phase_state", "thread_stacks"]

FLIGHT_RECORDER_DIR = "flight-recorder"
_FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def thread_stacks(limit: int = 64_000, per_thread: int = 16_000) -> str:
    """Every Python thread's stack, the main thread first, most recent call last (as a traceback), cut to ``limit``
    characters in all and ``per_thread`` each (the innermost frames are the ones kept)."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    parts = []
    for ident in sorted(frames, key=lambda i: (i != main, names.get(i, "~"), i)):
        text = "".join(traceback.format_stack(frames[ident]))
        if len(text) > per_thread:
            text = "...\n" + text[-per_thread:]
        label = names.get(ident, "?") + (" (main)" if ident == main else "") + (" (this watchdog)" if ident == me
                                                                               else "")
        parts.append(f"Thread {label} [{ident}]:\n{text}")
    out = "\n".join(parts)
    return out if len(out) <= limit else out[:limit] + f"\n... ({len(out) - limit} characters more left out)"


def phase_state(progress: dict[str, Any] | None, now_ns: int) -> dict[str, Any]:
    """Where in the iteration the training thread is: ``phase`` (a phase name: ``forward``...; ``outside`` inside an
    iteration but in no sub-phase; ``between_iterations`` in the loop outside any iteration; the pausing span's name
    in a checkpoint save/load or validation; ``no_training`` outside a training loop), and since when."""
    if progress is None:
        return {"phase": "no_training"}
    out: dict[str, Any] = {"step": progress["completed"] - 1, "iterations_done": progress["completed"]}
    current = progress.get("phase")
    started = progress.get("iteration_start_ns") or 0
    if progress.get("paused_in"):
        out["phase"] = progress["paused_in"]
    elif current is not None and (not started or current[1] >= started):
        out["phase"] = PHASES.get(current[0], current[0])
        out["phase_span"] = current[0]
        out["phase_for_s"] = (now_ns - current[1]) / 1e9
    elif started:
        out["phase"] = "outside"
    elif progress.get("loop_open"):
        out["phase"] = "between_iterations"
    else:
        out["phase"] = "no_training"
    if started:
        out["iteration_for_s"] = (now_ns - started) / 1e9
    last = progress.get("last_end_ns") or 0
    if last:
        out["since_last_iteration_s"] = (now_ns - last) / 1e9
    return out


def open_spans(tracer: Any, now_ns: int, limit: int = 50) -> list[str]:
    """The tracer's open spans (exported ones: sampled-out iterations and their phases are in ``phase_state``),
    innermost last: ``name (group) open for Ns [thread id]``."""
    try:
        spans = tracer.open_spans
    except Exception:  # noqa: BLE001 - evidence is best effort
        return []
    out = [f"{s.name} ({s.group}) open for {(now_ns - s.start_ns) / 1e9:.3f}s" for s in spans[-limit:]]
    return out


def collective_state(monitor: Any, now_ns: int, failed: Any = None) -> dict[str, Any]:
    """``failed`` (the failure being reported), else the last collective entered and not left (``collective_state``
    "waiting"), else the last that failed ("failed"), with its kind, process group, sequence number in that group,
    bytes, phase and age; and the last one that completed."""
    if monitor is None:
        return {"collective_state": "unknown"}
    out: dict[str, Any] = {}
    ops = monitor.open_ops()
    op = failed if failed is not None else ops[-1] if ops else monitor.last_failed
    if op is not None:
        d = op.describe(now_ns)
        # the sequence number in its group (the one every member agrees on), and the group: ranks of different
        # groups have different counts in a clean job (stall_view compares them per group)
        out.update({"collective": d["kind"], "collective_seq": d["group_seq"], "collective_bytes": d["bytes"],
                    "collective_phase": d["phase"], "collective_state": "waiting" if op.state == "open" else "failed",
                    "collective_group": d["group"], "collective_group_ranks": d["group_ranks"],
                    "collective_group_size": d["group_size"]})
        if op.state == "open":
            out["collective_for_s"] = d.get("open_for_s", 0.0)
        if d.get("error"):
            out["collective_error"] = str(d["error"])[:2000]
        out["collectives_open"] = len(ops)
    else:
        out["collective_state"] = "none"
    done = monitor.last_done
    if done is not None:
        out["last_completed_collective"] = done.kind
        out["last_completed_seq"] = done.group_seq
        out["last_completed_group"] = done.group
    out["collectives_total"] = monitor.count
    return out


def flight_recorder_enabled() -> bool:
    """Whether torch's Flight Recorder is on (``TORCH_FR_BUFFER_SIZE``/``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0) in a
    process that uses torch.distributed (we never import torch for this)."""
    if "torch.distributed" not in sys.modules:
        return False
    for name in _FR_ENV:
        try:
            if int(os.environ.get(name, "0") or 0) > 0:
                return True
        except ValueError:
            continue
    return False


def dump_flight_recorder(run_dir: Path | None, rank: int, pid: int) -> str:
    """Ask torch for its Flight Recorder buffer and write it beside the run, ``flight-recorder/rank-<R>.<pid>.json``
    (torch's JSON dump; the pickle dump too, ``.pkl``, for torch's own ``fr_trace`` analyser: written, never read
    by us). Returns the JSON's path, or "" (off, unavailable, or it failed: then ``error: ...``)."""
    if run_dir is None or not flight_recorder_enabled():
        return ""
    try:
        import torch._C._distributed_c10d as c10d

        to_json = getattr(c10d, "_dump_nccl_trace_json", None) or getattr(c10d, "_dump_fr_trace_json", None)
        to_pickle = getattr(c10d, "_dump_nccl_trace", None) or getattr(c10d, "_dump_fr_trace", None)
        if to_json is None:
            return "error: this torch has no Flight Recorder dump"
        folder = run_dir / FLIGHT_RECORDER_DIR
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"rank-{rank}.{pid}.{time.strftime('%Y%m%dT%H%M%S')}"
        path = folder / f"{stem}.json"
        path.write_bytes(to_json())
        if to_pickle is not None:
            (folder / f"{stem}.pkl").write_bytes(to_pickle())
        return str(path)
    except Exception as exc:  # noqa: BLE001 - evidence is best effort
        return f"error: {type(exc).__name__}: {exc}"[:500]
