"""One readable line per record on a terminal (or any text stream). Colour only when the stream is a TTY."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from ..text import printable
from .base import Sink

_COLORS = {
    "metric": "\x1b[36m",
    "event": "\x1b[32m",
    "span_start": "\x1b[34m",
    "span_end": "\x1b[34m",
    "stat": "\x1b[35m",
    "diagnostic": "\x1b[33m",
}
_SEVERITY_COLORS = {"warning": "\x1b[33m", "error": "\x1b[31m", "critical": "\x1b[1;31m"}
_RESET = "\x1b[0m"
_DIM = "\x1b[2m"


def _value(v: Any) -> str:
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    return printable(str(v))  # one record, one line: no raw newlines or terminal escapes


def _attrs(attributes: Any) -> str:
    if not attributes:
        return ""
    return " " + " ".join(f"{k}={_value(v)}" for k, v in attributes.items())


def format_record(record: Any) -> tuple[str, str]:
    """(kind label, body) of one record."""
    kind = record.kind
    if kind == "metric":
        unit = f" {record.unit}" if record.unit else ""
        step = f" step={record.step}" if record.step is not None else ""
        labels = _attrs(record.attributes)  # (a metric's dimension labels, format v2)
        return "metric", f"{_value(record.group)}/{_value(record.name)} = {_value(record.value)}{unit}{step}{labels}"
    if kind == "event":
        return "event", f"{_value(record.group)}/{_value(record.name)} [{record.severity}]{_attrs(record.attributes)}"
    if kind == "span_start":
        return "span>", f"{record.name}{_attrs(record.attributes)}"
    if kind == "span_end":
        err = f" error={record.error}" if record.error else ""
        return "span<", f"{record.name} {record.duration_ns / 1e6:.3f} ms {record.status}{err}"
    if kind == "stat":
        values = " ".join(f"{k}={_value(v)}" for k, v in record.values.items())
        return "stat", f"{record.group}/{record.name} n={record.sample_count} {values}"
    if kind == "diagnostic":
        return "telemetrain", f"{record.name} sink={record.sink} count={record.record_count} {record.message}".rstrip()
    return kind, repr(record)


class ConsoleSink(Sink):
    """``HH:MM:SS.mmm rank R kind  body``; behind the dispatcher because a terminal can block."""

    name = "console"
    background = True
    ranks = "zero"  # one copy per job, not per rank (Sink.ranks; add_sink(..., ranks="all") to have every rank)

    def __init__(self, stream: TextIO | None = None, *, color: bool | None = None) -> None:
        self._stream = stream
        self._color = color

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def _use_color(self) -> bool:
        if self._color is not None:
            return self._color
        if os.environ.get("NO_COLOR"):
            return False
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def write(self, records: Sequence[Any]) -> None:
        color = self._use_color()
        out = []
        for record in records:
            label, body = format_record(record)
            wall_s = record.wall_ns / 1e9
            stamp = time.strftime("%H:%M:%S", time.localtime(wall_s)) + f".{int(wall_s * 1000) % 1000:03d}"
            rank = f"rank {record.identity.rank}"
            if color:
                c = _SEVERITY_COLORS.get(getattr(record, "severity", ""), _COLORS.get(record.kind, ""))
                out.append(f"{_DIM}{stamp} {rank}{_RESET} {c}{label:<6}{_RESET} {body}\n")
            else:
                out.append(f"{stamp} {rank} {label:<6} {body}\n")
        self.stream.write("".join(out))

    def flush(self) -> None:
        self.stream.flush()
