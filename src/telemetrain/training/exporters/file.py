"""``FileExporter``: one-logger's JSON-lines file (``nv_one_logger.exporter.file_exporter``), made safe to keep.

- Append-only: the file is opened for appending, never truncated (one-logger opens it with ``"w"``, so a restarted
  job erased its previous attempt's records). A restart adds its records after the earlier ones; ``pid`` and
  ``count`` tell the attempts apart.
- Per rank: in a job of several ranks (``WORLD_SIZE`` > 1), rank R writes ``<stem>.rank<R><suffix>`` unless the path
  holds ``{rank}``, which is replaced by the rank; so ranks never interleave lines in one file.
- A failed write raises ``ExportError``, which the recorder counts (one-logger logs it and counts the write as a
  success).
Each record is written and flushed on the exporter's own delivery thread, never on the training thread.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from ...identity import identity_from_env
from ..errors import ExportError
from .json_records import BaseJsonExporter

__all__ = ["FileExporter", "rank_path"]


def rank_path(file_path: str | os.PathLike[str]) -> Path:
    """The path this process writes for ``file_path``: ``{rank}`` replaced, or ``.rank<R>`` inserted before the
    suffix when the job has several ranks, or the path itself."""
    text = os.fspath(file_path)
    try:
        identity = identity_from_env()
        rank, world = identity.rank, identity.world_size
    except (TypeError, ValueError):
        rank, world = 0, 1
    if "{rank}" in text:
        return Path(text.replace("{rank}", str(rank)))
    path = Path(text)
    if world > 1:
        return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
    return path


class FileExporter(BaseJsonExporter):
    """Writes one-logger's JSON records, one per line, to ``file_path`` (see the module docstring)."""

    def __init__(self, file_path: str | os.PathLike[str]) -> None:
        if not isinstance(file_path, (str, os.PathLike)):
            raise TypeError(f"file_path must be a str or a path, got {type(file_path).__name__}")
        super().__init__()
        self._filepath = Path(file_path)
        self.path = rank_path(file_path)
        self._file: IO[str] | None = None

    def initialize(self) -> None:
        super().initialize()
        with self._lock:
            if self._file is None or self._file.closed:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")

    def close(self) -> None:
        super().close()
        with self._lock:
            file, self._file = self._file, None
            if file is not None and not file.closed:
                file.close()

    def _write(self, json_dict: dict[str, Any]) -> None:
        file = self._file
        if file is None or file.closed:
            raise ExportError(f"FileExporter({self.path}) is not initialized or already closed")
        line = json.dumps(json_dict, separators=(",", ":"), default=str) + "\n"
        try:
            file.write(line)
            file.flush()
        except (OSError, ValueError) as exc:
            raise ExportError(f"writing {self.path} failed: {exc}") from exc
