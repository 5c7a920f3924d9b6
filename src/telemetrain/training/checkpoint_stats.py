"""What the recorder keeps of checkpoints: a checkpoint's size on disk and the count/total/min/max of save and load
times (plain data, apart from the recorder's callbacks so each is read on its own)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


def path_bytes(path: str | os.PathLike[str] | None) -> int | None:
    """Size of a checkpoint file, or of every file under a checkpoint directory; None when it cannot be read."""
    if path is None:
        return None
    try:
        if os.path.isdir(path):
            total = 0
            for root, _, files in os.walk(path):
                for name in files:
                    try:
                        total += os.path.getsize(os.path.join(root, name))
                    except OSError:
                        pass
            return total
        return os.path.getsize(path)
    except OSError:
        return None


@dataclass
class Durations:
    """Count/total/min/max of some durations (checkpoint saves, loads), in seconds."""

    count: int = 0
    total: float = 0.0
    min: float | None = None
    max: float | None = None
    bytes_total: int = 0
    bytes_last: int | None = None
    _attributes: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)

    def add(self, seconds: float, size: int | None = None) -> None:
        self._attributes.clear()  # (as_attributes' cache)
        self.count += 1
        self.total += seconds
        self.min = seconds if self.min is None else min(self.min, seconds)
        self.max = seconds if self.max is None else max(self.max, seconds)
        if size is not None:
            self.bytes_total += size
            self.bytes_last = size

    def as_attributes(self, prefix: str) -> dict[str, Any]:
        """Cached until the next ``add`` (each metrics report reads them: a dict build per report otherwise)."""
        cached = self._attributes.get(prefix)
        if cached is None:
            cached = self._attributes[prefix] = self._build(prefix)
        return cached

    def _build(self, prefix: str) -> dict[str, Any]:
        if not self.count:
            return {f"{prefix}_count": 0}
        out: dict[str, Any] = {
            f"{prefix}_count": self.count,
            f"{prefix}_time_total_sec": self.total,
            f"{prefix}_time_min_sec": self.min,
            f"{prefix}_time_max_sec": self.max,
            f"{prefix}_time_mean_sec": self.total / self.count,
        }
        if self.bytes_last is not None:
            out[f"{prefix}_size_bytes"] = self.bytes_last
            out[f"{prefix}_size_total_bytes"] = self.bytes_total
        return out
