"""The HTML report of a run: ``write_report(run_dir)`` or ``telemetrain report RUN_DIR``.

One self-contained HTML file with static inline SVG charts and no script (docs/report.md): it opens offline, and
there is nothing in it that could run.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

from ..output_file import OutputFileError, write_output
from ..store.files import foreign_link
from .load import Progress

__all__ = ["Progress", "write_report"]


def write_report(run_dir: str | os.PathLike[str], output: str | os.PathLike[str] | None = None, *,
                 progress: Progress | None = None) -> Path:
    """Write the report of the run in ``run_dir`` to ``output`` (default: ``<run_dir>/report.html``) and return its
    path; the default is refused (``OutputFileError``) where ``run_dir`` goes through another user's symbolic link
    (docs/security.md). The report also covers the run's session (goodput, restarts) when ``run_dir`` sits in one.

    ``progress(what, done, total)`` is told how far loading and rendering are. Raises ``FileNotFoundError`` for a
    missing directory and ``store.NotARunError`` (a ``ValueError``) for a directory that holds no run.
    """
    from ..store.engine import engine_for
    from .html import render
    from .load import load_run
    from .model import build_model

    target = Path(output) if output is not None else Path(run_dir) / "report.html"
    if output is None and (why := foreign_link(run_dir)) is not None:  # checked before minutes of reading
        raise OutputFileError(f"cannot write {target}: {why} (or pass output=)")
    engine = engine_for([run_dir], progress) if Path(run_dir).is_dir() else None
    # Hundreds of thousands of records, none in a reference cycle: the cyclic collector would only re-walk them over
    # and over while they load (a fifth of the CPU time on a big run). Paused here, restored as it was.
    collecting = gc.isenabled()
    gc.disable()
    try:
        # with DuckDB (the columnar extra) the run is not loaded into Python: SQL gives the model its figures
        run = load_run(run_dir, progress if engine is None else None)
        if progress is not None:
            progress("analysing", 0, 2)
        model = build_model(run, engine=engine)
    finally:
        if collecting:
            gc.enable()
        if engine is not None:
            engine.close()
    if progress is not None:
        progress("rendering", 1, 2)
    page = render(model)
    path = write_output(target, page)
    if progress is not None:
        progress("written", 2, 2)
    return path
