"""What every ``telemetrain`` subcommand shares: the one-line error and how a run directory argument is resolved."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TextIO

from .store.layout import default_root
from .store.reader import find_runs
from .text import printable

__all__ = ["CLIError", "resolve_run"]


class CLIError(Exception):
    """A problem to report as one line on stderr, exit status 2, without a traceback."""


def resolve_run(target: str | None, err: TextIO) -> Path:
    """The run directory to show: ``target`` itself when it is a run, else the newest run under it."""
    base = Path(target) if target is not None else default_root()
    if not base.exists():
        if target is None:
            raise CLIError(f"no runs yet: {base} does not exist (run `telemetrain demo`, or pass a run directory)")
        raise CLIError(f"no such directory: {base}")
    if not base.is_dir():
        raise CLIError(f"{base} is a file; a run is a directory holding run.json and rank-<R>.<pid>.jsonl files")
    runs = find_runs(base)
    if base in runs:
        return base
    if not runs:
        raise CLIError(f"{base} is not a telemetrain run directory (no run.json, no rank-*.jsonl) and holds no runs")
    if len(runs) > 1:
        listing = f"telemetrain show --list {shlex.quote(str(base))}"
        print(printable(f"note: {base} holds {len(runs)} runs; showing the newest (list them: {listing})"), file=err)
    return runs[-1]
