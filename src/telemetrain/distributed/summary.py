"""The multi-rank diagnosis of a run as text lines, for ``telemetrain show``: communication per iteration, the late
ranks (``straggler`` events) and clock offsets. Stalls and why the workers ended are findings (``analysis.findings``:
``stalls``, ``crashes``), which ``show`` prints after these lines."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["agent_node", "diagnosis_lines"]


def agent_node(records: Iterable[Any], default: int) -> int:
    """The node an agent of ``telemetrain launch`` ran: the ``group_rank`` torch's rendezvous gave it, as its
    torchelastic events state it (``default``, its identity's, is torchrun's ``--node-rank``: 0 on every node under
    a c10d rendezvous, which assigns the nodes' ranks itself)."""
    for r in records:
        if r.kind == "event" and r.group == "torchelastic":
            group_rank = (r.attributes or {}).get("group_rank")
            if type(group_rank) is int and group_rank >= 0:
                return group_rank
    return default


def _ms(value: Any) -> str:
    return f"{value * 1e3:.2f} ms" if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def _bytes(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "-"


def diagnosis_lines(records: Sequence[Any]) -> list[str]:
    """Lines (possibly none) naming what the distributed diagnosis found in ``records`` (a run's, agents' included)."""
    lines: list[str] = []
    last_update: dict[int, dict[str, Any]] = {}
    stragglers: list[dict[str, Any]] = []
    clocks: dict[int, dict[str, Any]] = {}
    for r in records:
        if r.kind != "event":
            continue
        a = r.attributes or {}
        if r.group == "training" and r.name == "training_metrics_update" and "avg_comm_time_sec" in a:
            last_update[r.identity.rank] = a
        elif r.group == "cross_rank" and r.name == "straggler":
            stragglers.append(a)
        elif r.group == "clock" and r.name == "clock_offset" and r.identity.rank != 0:
            clocks[r.identity.rank] = a
    if last_update:
        lines.append("comm        communication per iteration (last window of each rank)")
        for rank, a in sorted(last_update.items()):
            n = a.get("window_iterations")
            per_iteration = a["comm_bytes"] / n if isinstance(a.get("comm_bytes"), int) and isinstance(n, int) \
                and n > 0 else None
            share = a.get("comm_wait_fraction")
            lines.append(f"  rank {rank}  in communication {_ms(a.get('avg_comm_time_sec'))}  waiting "
                         f"{_ms(a.get('avg_comm_wait_time_sec'))}"
                         + (f" ({share:.1%} of the time)" if isinstance(share, float) else "")
                         + f"  {_bytes(per_iteration)}/iteration ({a.get('comm_clock', '?')}-timed)")
    for a in stragglers:
        if a.get("kind") == "late":
            cause = "outside any phase" if a.get("phase") == "outside" else str(a.get("phase"))
            lines.append(f"straggler   rank {a.get('rank')} ({a.get('host')}) arrives last, cause {cause}: the "
                         f"others wait {_ms(a.get('cost_per_iteration_sec'))} per iteration for it (step "
                         f"{a.get('step')})")
        else:
            # a live event from one window: the findings (which see the whole run and the CPU wait) confirm it or not
            score = a.get("score")
            lines.append(f"straggler   rank {a.get('rank')} ({a.get('host')}) slow in {a.get('phase')}, "
                         f"{a.get('kind')} x{score:.2f}" if isinstance(score, (int, float)) else
                         f"straggler   rank {a.get('rank')} slow in {a.get('phase')}")
            lines[-1] += f" at step {a.get('step')} (live event; see findings)"
    for rank, a in sorted(clocks.items()):
        offset, error = a.get("offset_ns"), a.get("error_ns")
        if isinstance(offset, int) and isinstance(error, int):
            lines.append(f"clock       rank {rank}: {offset / 1e9:+.6f} s to rank 0 (+/- {error / 1e6:.3f} ms)")
    return lines
