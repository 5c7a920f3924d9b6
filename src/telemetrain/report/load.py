"""Load a run directory for the report, file by file, telling a progress callback how far it is.

The result is ``store.open_run``'s (which reads every file in one go, silently); reading file by file lets a long
load show a bar. Errors are ``open_run``'s: ``FileNotFoundError`` for a missing path, ``NotARunError`` for a
directory that holds no run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..store.codec import untag_nonfinite
from ..store.layout import RUN_META, is_agent_file, is_process_file
from ..store.reader import ProcessLog, Run, open_run, read_process_file

__all__ = ["Progress", "load_run"]

Progress = Callable[[str, int, int], None]
"""``progress(what, done, total)``: ``done`` of ``total`` units of the stage ``what`` (bytes while reading)."""


def load_run(path: str | os.PathLike[str], progress: Progress | None = None) -> Run:
    p = Path(path)
    files = sorted(f for f in p.iterdir() if f.is_file() and is_process_file(f.name)) if p.is_dir() else []
    if progress is None or not files:
        return open_run(p)  # the reader's own checks and messages for what is not a run
    meta = _read_meta(p)
    sizes = [f.stat().st_size for f in files]
    total = max(sum(sizes), 1)
    done = 0
    logs: list[ProcessLog] = []
    for f, size in zip(files, sizes, strict=True):
        progress(f"reading {f.name}", done, total)
        logs.append(read_process_file(f, meta))
        done += size
    progress("read", total, total)
    logs.sort(key=lambda log: (log.rank, log.pid))
    agents = [log for log in logs if is_agent_file(log.path.name)]
    return Run(p, meta, [log for log in logs if not is_agent_file(log.path.name)], agents)


def _read_meta(path: Path) -> dict[str, Any]:
    """run.json as the store's reader reads it: an empty dict when it is missing or unreadable."""
    try:
        meta = untag_nonfinite(json.loads((path / RUN_META).read_text()))
    except (OSError, ValueError, KeyError):
        return {}
    return meta if isinstance(meta, dict) else {}
