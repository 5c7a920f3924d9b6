"""Numbers for the findings' sentences."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["bytes_", "ranges", "seconds"]


def seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if abs(value) < 1e-3:
        return f"{value * 1e6:.3g} us"
    if abs(value) < 1:
        return f"{value * 1e3:.3g} ms"
    if abs(value) < 120:
        return f"{value:.3g} s"
    if abs(value) < 7200:
        return f"{value / 60:.3g} min"
    return f"{value / 3600:.3g} h"


def bytes_(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def ranges(values: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``1..3, 7``."""
    ordered = sorted(set(values))
    if not ordered:
        return ""
    parts = []
    start = prev = ordered[0]
    for v in ordered[1:]:
        if v != prev + 1:
            parts.append(f"{start}..{prev}" if prev != start else str(start))
            start = v
        prev = v
    parts.append(f"{start}..{prev}" if prev != start else str(start))
    return ", ".join(parts[:6]) + (f" (+{len(parts) - 6} more)" if len(parts) > 6 else "")
