"""A plain-text progress bar on a stream (stderr), redrawn in place with ``\\r``."""

from __future__ import annotations

import time
from typing import TextIO

__all__ = ["TextProgress"]


class TextProgress:
    """``TextProgress(stream)(what, done, total)`` draws ``what [#####-----]  50%``; redraws at most every
    ``interval`` seconds, except the last step of a stage; ``close()`` ends the line."""

    def __init__(self, stream: TextIO, *, width: int = 30, interval: float = 0.1) -> None:
        self.stream = stream
        self.width = width
        self.interval = interval
        self._last = 0.0
        self._shown = False

    def __call__(self, what: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < self.interval:
            return
        self._last = now
        fraction = min(1.0, done / total) if total > 0 else 1.0
        filled = int(fraction * self.width)
        line = f"\r{what[:40]:<40} [{'#' * filled}{'-' * (self.width - filled)}] {fraction:4.0%}"
        self.stream.write(line)
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False
