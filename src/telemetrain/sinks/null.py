"""A sink that discards everything (benchmarks, and explicitly listening without output)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import Sink


class NullSink(Sink):
    name = "null"
    background = False

    def write(self, records: Sequence[Any]) -> None:
        pass

    def handle(self, record: Any) -> None:
        pass
