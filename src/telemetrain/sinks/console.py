"""One readable line per record on a terminal (or any text stream). Colour only when the stream is a TTY.

Numbers are rounded for people (4 significant digits, thousands grouped, seconds as ms or us); the run store keeps
them exact. By default the console is a progress view: each ``training_metrics_update`` becomes one progress line
(step of target, throughput, iteration time, MFU), and what that line already says, or what would flood the screen,
is left out: the derived ``training/train.*`` metrics, span starts, and the ends of iteration and phase spans.
``ConsoleSink(verbose=True)`` prints every record.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO, TypeGuard

from ..text import printable
from .base import Sink

_COLORS = {
    "metric": "\x1b[36m",
    "event": "\x1b[32m",
    "span_start": "\x1b[34m",
    "span_end": "\x1b[34m",
    "stat": "\x1b[35m",
    "diagnostic": "\x1b[33m",
    "progress": "\x1b[1m",
}
_SEVERITY_COLORS = {"warning": "\x1b[33m", "error": "\x1b[31m", "critical": "\x1b[1;31m"}
_RESET = "\x1b[0m"
_DIM = "\x1b[2m"

# The training lifecycle's names (training/names.py), spelled here: a sink imports no other part of the library.
_GROUP = "training"
_PROGRESS_EVENT = "training_metrics_update"
_LOOP = "training_loop"
# spans as frequent as iterations: their figures are in the progress line
_QUIET_SPANS = frozenset({
    "training_single_iteration", "validation_single_iteration", "testing_single_iteration", "data_loading",
    "model_forward", "model_backward", "optimizer_update", "zero_grad",
})


def _number(v: float) -> str:
    """4 significant digits; thousands grouped from 10,000 to 1e15 (beyond, 4 significant digits again:
    ``1.181e+21``); nan/inf spelled so."""
    if not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    if v == 0:
        return "0"
    if abs(v) >= 1e15:  # grouped digits past a float's 15-16 would print its binary noise (1e30 -> ...019,884,...)
        return f"{v:.4g}"
    if abs(v) >= 1e4:
        return f"{v:,.0f}"
    text = f"{v:.4g}"
    return text if "e" in text or "." not in text else text.rstrip("0").rstrip(".")


def _seconds(v: float) -> str:
    """A duration for people: 1.234 s, 10.21 ms, 35.2 us."""
    if not math.isfinite(v) or v == 0 or abs(v) >= 1:
        return f"{_number(v)} s"
    if abs(v) >= 1e-3:
        return f"{_number(v * 1e3)} ms"
    return f"{_number(v * 1e6)} us"


def _value(v: Any) -> str:
    if isinstance(v, float):
        return _number(v)
    return printable(str(v))  # one record, one line: no raw newlines or terminal escapes


def _with_unit(v: Any, unit: str) -> str:
    """A measured value: an int reading is a number for people too (``239,640,576 By``), unlike an int attribute
    (a pid, an id), which stays as it is."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if unit == "s":
            return _seconds(float(v))
        if type(v) is not float:
            if abs(v) >= 2**53:  # exact, grouped: a float would round it
                return f"{int(v):,}" + (f" {printable(unit)}" if unit else "")
            v = float(v)
    return _value(v) + (f" {printable(unit)}" if unit else "")


def _attrs(attributes: Any) -> str:
    if not attributes:
        return ""
    return " " + " ".join(f"{printable(str(k))}={_value(v)}" for k, v in attributes.items())


def _is_number(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def progress_line(a: Mapping[str, Any], target: int | None = None) -> str:
    """One ``training_metrics_update`` as a progress line: ``step 80/800 (10%)  2,784 samples/s  ...``."""
    parts = []
    current = a.get("current_iteration")
    if _is_number(current):
        step = int(current) + 1  # the iterations done, as the loop counts them
        parts.append(f"step {step:,}/{target:,} ({step / target:.0%})" if target else f"step {step:,}")
    for key, label in (("samples_per_second", "samples/s"), ("tokens_per_second", "tokens/s")):
        if _is_number(a.get(key)):
            parts.append(f"{_number(a[key])} {label}")
    times = [f"{q} {_seconds(a[f'{q}_iteration_time_sec'])}" for q in ("p50", "p99")
             if _is_number(a.get(f"{q}_iteration_time_sec"))]
    if times:
        parts.append("iteration " + " ".join(times))
    if _is_number(a.get("train_throughput_per_gpu")):
        parts.append(f"{_number(a['train_throughput_per_gpu'])} TFLOP/s per GPU")
    if _is_number(a.get("mfu")):
        parts.append(f"MFU {a['mfu']:.1%}")
    if a.get("final") is True:
        parts.append("(final)")
    return "  ".join(parts) or "training metrics update"


def format_record(record: Any) -> tuple[str, str]:
    """(kind label, body) of one record."""
    kind = record.kind
    if kind == "metric":
        step = f" step={record.step}" if record.step is not None else ""
        labels = _attrs(record.attributes)  # (a metric's dimension labels, format v2)
        return "metric", (f"{_value(record.group)}/{_value(record.name)} = {_with_unit(record.value, record.unit)}"
                          f"{step}{labels}")
    if kind == "event":
        return "event", f"{_value(record.group)}/{_value(record.name)} [{record.severity}]{_attrs(record.attributes)}"
    if kind == "span_start":
        return "span>", f"{_value(record.name)}{_attrs(record.attributes)}"
    if kind == "span_end":
        err = f" error={_value(record.error)}" if record.error else ""
        return "span<", f"{_value(record.name)} {_seconds(record.duration_ns / 1e9)} {record.status}{err}"
    if kind == "stat":
        values = " ".join(f"{k}={_value(v) if k == 'count' else _with_unit(v, record.unit)}"
                          for k, v in record.values.items())
        return "stat", f"{_value(record.group)}/{_value(record.name)} n={record.sample_count} {values}"
    if kind == "diagnostic":
        return "telemetrain", printable(
            f"{record.name} sink={record.sink} count={record.record_count} {record.message}".rstrip())
    return kind, printable(repr(record))


class ConsoleSink(Sink):
    """``HH:MM:SS.mmm rank R kind  body``; behind the dispatcher because a terminal can block. ``verbose``: every
    record (by default, a progress view: see the module docstring)."""

    name = "console"
    background = True
    ranks = "zero"  # one copy per job, not per rank (Sink.ranks; add_sink(..., ranks="all") to have every rank)

    def __init__(self, stream: TextIO | None = None, *, color: bool | None = None, verbose: bool = False) -> None:
        self._stream = stream
        self._color = color
        self.verbose = bool(verbose)
        self._targets: dict[Any, int] = {}  # identity -> the open training loop's iteration target

    def _line(self, record: Any) -> tuple[str, str] | None:
        """(label, body) of a record, or None when the progress view leaves it out."""
        kind = record.kind
        training = record.group == _GROUP
        if training and kind == "span_start" and record.name == _LOOP:
            target = (record.attributes or {}).get("train_iterations_target")
            if _is_number(target):
                self._targets[record.identity] = int(target)
        if self.verbose:
            return format_record(record)
        if training and kind == "event" and record.name == _PROGRESS_EVENT:
            return "train", progress_line(record.attributes or {}, self._targets.get(record.identity))
        if kind == "span_start" or (kind == "span_end" and record.name in _QUIET_SPANS and record.status == "ok"):
            return None
        if training and kind == "metric" and record.name.startswith("train."):
            return None  # the derived metrics: in the progress line
        return format_record(record)

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
            line = self._line(record)
            if line is None:
                continue
            label, body = line
            wall_s = record.wall_ns / 1e9
            stamp = time.strftime("%H:%M:%S", time.localtime(wall_s)) + f".{int(wall_s * 1000) % 1000:03d}"
            rank = f"rank {record.identity.rank}"
            if color:
                kind = "progress" if label == "train" else record.kind
                c = _SEVERITY_COLORS.get(getattr(record, "severity", ""), _COLORS.get(kind, ""))
                out.append(f"{_DIM}{stamp} {rank}{_RESET} {c}{label:<6}{_RESET} {body}\n")
            else:
                out.append(f"{stamp} {rank} {label:<6} {body}\n")
        self.stream.write("".join(out))

    def flush(self) -> None:
        self.stream.flush()
