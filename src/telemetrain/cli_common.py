"""What every ``telemetrain`` subcommand shares: the one-line error, how a run directory argument is resolved, and the
formatting of values, durations, tables and paths in their text."""

from __future__ import annotations

import argparse
import math
import shlex
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO, TypeGuard, TypeVar

from .store.layout import default_root
from .store.reader import find_runs
from .text import printable

__all__ = ["SHOWN_ROWS", "CLIError", "existing_dir", "few", "fmt_config", "fmt_duration", "fmt_value",
           "int_at_least", "is_number", "iso", "json_value", "quoted", "resolve_run", "table"]

T = TypeVar("T")
SHOWN_ROWS = 16  # per-process (per-host) rows a summary prints before it keeps only the first and the outliers


class CLIError(Exception):
    """A problem to report as one line on stderr, exit status 2, without a traceback."""


def int_at_least(minimum: int, meaning: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least ``minimum`` (``meaning`` says what the bound means: "0: all
    rows", so that a negative number, a typo, is not taken as a second way to ask for all)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}{f' ({meaning})' if meaning else ''}, got {value}")
        return value
    return parse


def existing_dir(target: str | None) -> Path:
    """``target`` (None: the default store root) when it is a directory; else a CLIError saying what to do."""
    base = Path(target) if target is not None else default_root()
    if not base.exists():
        if target is None:
            raise CLIError(f"no runs yet: {base} does not exist (run `telemetrain demo`, or pass a run directory)")
        raise CLIError(f"no such directory: {base}")
    if not base.is_dir():
        raise CLIError(f"{base} is a file; a run is a directory holding run.json and rank-<R>.<pid>.jsonl files")
    return base


def resolve_run(target: str | None, err: TextIO) -> Path:
    """The run directory to show: ``target`` itself when it is a run, else the newest run under it."""
    base = existing_dir(target)
    runs = find_runs(base)
    if base in runs:
        return base
    if not runs:
        raise CLIError(f"{base} is not a telemetrain run directory (no run.json, no rank-*.jsonl) and holds no runs")
    if len(runs) > 1:
        listing = f"telemetrain show --list {shlex.quote(str(base))}"
        print(printable(f"note: {base} holds {len(runs)} runs; showing the newest (list them: {listing})"), file=err)
    return runs[-1]


# -- formatting, for the commands' text ------------------------------------------------------------------------------


def iso(wall_ns: int) -> str:
    dt = datetime.fromtimestamp(wall_ns / 1e9, tz=timezone.utc)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fmt_value(value: Any) -> str:
    """Numbers for people: ints as they are, floats to 6 significant digits, nan/inf/-inf spelled so."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.6g}"


def fmt_config(value: Any) -> str:
    """Config values as written (``1.0`` stays ``1.0``), non-finite floats as nan/inf."""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else fmt_value(value)
    return str(value)


def fmt_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3f} s"
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}h{minutes:02d}m{secs:06.3f}s" if hours else f"{minutes}m{secs:06.3f}s"


def table(rows: Sequence[tuple[Any, ...]], indent: str = "  ") -> list[str]:
    """Left-aligned columns (the last one unpadded)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows]


def few(items: Sequence[T], *, keep: Callable[[T], bool] = lambda item: False, every: bool = False,
        extremes: Callable[[T], float | None] | None = None) -> tuple[list[T], int]:
    """The items a summary lists, in their order: all of them up to ``SHOWN_ROWS`` (or with ``every``), else the
    first ``SHOWN_ROWS // 2``, those ``keep`` marks (the outliers, the damaged) and, with ``extremes``, the first item
    of its lowest and the first of its highest value (None: not known); and how many it left out. A job of thousands
    of ranks would otherwise print thousands of lines."""
    if every or len(items) <= SHOWN_ROWS:
        return list(items), 0
    ends: set[int] = set()
    if extremes is not None:
        known = [(value, i) for i, x in enumerate(items) if (value := extremes(x)) is not None]
        if known:
            ends = {min(known)[1], max(known, key=lambda vi: (vi[0], -vi[1]))[1]}
    shown = [x for i, x in enumerate(items) if i < SHOWN_ROWS // 2 or i in ends or keep(x)]
    return shown, len(items) - len(shown)


def json_value(value: Any) -> Any:
    """``value`` for ``--json`` output: NaN and infinities as the strings the store's numeric fields use (a bare
    ``NaN`` is not JSON: jq and strict parsers reject the whole output), inside dicts, lists and tuples too."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return value


def is_number(value: object) -> TypeGuard[float]:
    """An int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def quoted(path: Path | str) -> str:
    return shlex.quote(str(path))
