"""Load a run directory for the report, file by file, telling a progress callback how far it is.

The result is ``store.open_run``'s (which reads every file in one go, silently); reading file by file lets a long
load show a bar. Errors are ``open_run``'s: ``FileNotFoundError`` for a missing path, ``NotARunError`` for a
directory that holds no run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..store.reader import Run, open_run

__all__ = ["Progress", "load_run"]

Progress = Callable[[str, int, int], None]
"""``progress(what, done, total)``: ``done`` of ``total`` units of the stage ``what`` (bytes while reading)."""


def load_run(path: str | os.PathLike[str], progress: Progress | None = None) -> Run:
    run = open_run(Path(path))  # the reader's own checks and messages for what is not a run
    if progress is None:
        return run
    logs = sorted(run.processes + run.agents, key=lambda log: log.path.name)  # in file-name order, as listed
    sizes = [sum(_size(f) for f in log.paths) for log in logs]
    total = max(sum(sizes), 1)
    done = 0
    for log, size in zip(logs, sizes, strict=True):
        progress(f"reading {log.path.name}", done, total)
        log.records  # noqa: B018 - read it now, so the bar follows
        done += size
    progress("read", total, total)
    return run


def _size(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError:
        return 0
