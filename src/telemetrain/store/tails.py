"""The JSONL an engine reads itself (the segments not compacted, and what grew past a copy) into its ``tail_*`` tables.

Each tail is parsed by DuckDB with the reader's rules (``convert``). Converting one and inserting its rows costs ~65 ms
of statement planning whatever its size, so small tails (up to ``BATCH_FILE_BYTES``) wait and are converted together,
``BATCH_BYTES`` at a time (``convert.convert_batch``): a run of 1,024 small files paid that 1,024 times (BENCHMARKS.md,
"Small runs"). A larger tail is converted alone, ``convert.CHUNK_BYTES`` at a time. Either way each record lands in
the same rows, with its own identity, segment and line.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..identity import Identity
from .columnar import PARTITIONS, PROCESS_TABLE, TABLES, Prescan, prescan
from .convert import CHUNK_BYTES, convert_batch, convert_segment, header_rows
from .report_rows import ALL_COLUMNS, REPORTS_TABLE, report_rows_sql
from .segments import parse_segment_name
from .views import insert_rows

__all__ = ["BATCH_BYTES", "BATCH_FILE_BYTES", "ProcessCounts", "TailLoader"]

BATCH_FILE_BYTES = 1 << 20  # a tail this small is converted with others
BATCH_BYTES = CHUNK_BYTES  # the text of one batch (held in memory while it is converted, as a chunk's is)


@dataclass
class ProcessCounts:
    """A process's records, torn and corrupt lines, and first header, over its segments."""

    records: int = 0
    torn: int = 0
    corrupt: int = 0
    header: dict[str, Any] | None = None


class TailLoader:
    """Fills the ``tail_*`` tables of ``con`` (``views.create_tail_tables``). ``add`` reads a tail's lines and headers
    at once (the next segment's identity follows from them) and converts it now or with its batch; ``flush`` converts
    the batch waiting. Each tail's records and corrupt lines are added to the ``ProcessCounts`` given with it when it
    is converted: the counts are complete after ``flush``."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.segments = 0  # tails read (segments, or the grown part of one)
        self._batch: list[tuple[Prescan, str, str, int, ProcessCounts]] = []
        self._batch_bytes = 0

    def add(self, path: Path, fallback: Identity, session: str, run: str, counts: ProcessCounts, *, start: int = 0,
            first_line: int = 0) -> Prescan:
        """Read ``path`` from offset ``start`` (line ``first_line``); ``fallback``: the identity before its first
        valid header. Returns its prescan (``torn``, ``size``, the identities, the first header). OSError: the file
        went away."""
        name = parse_segment_name(path.name)
        segment = name.segment if name is not None else 0
        if os.stat(path).st_size - start > BATCH_FILE_BYTES:
            scan, seg = convert_segment(self.con, path, fallback, session, run, segment, start=start,
                                        first_line=first_line)
            [(records, corrupt)] = self._insert(seg, [scan], [segment], batched=False)
            counts.records += records
            counts.corrupt += corrupt
        else:
            scan = prescan(path, fallback, start=start, first_line=first_line, keep=True)
            self._batch.append((scan, session, run, segment, counts))
            self._batch_bytes += len(scan.body)
            if self._batch_bytes >= BATCH_BYTES:
                self.flush()
        counts.corrupt += scan.bad_headers
        self.segments += 1
        return scan

    def flush(self) -> None:
        """Convert the tails waiting, and add their counts."""
        if not self._batch:
            return
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        # pyarrow splits the lines where it is loaded already (``convert._lines_source``)
        seg = convert_batch(self.con, [(scan, session, run, segment) for scan, session, run, segment, _ in batch],
                            arrow="pyarrow" in sys.modules)
        found = self._insert(seg, [scan for scan, *_ in batch], [segment for _, _, _, segment, _ in batch],
                             batched=True)
        for (*_, counts), (records, corrupt) in zip(batch, found, strict=True):
            counts.records += records
            counts.corrupt += corrupt

    def _insert(self, seg: str, scans: list[Prescan], segments: list[int], *, batched: bool) -> list[tuple[int, int]]:
        """``seg``'s rows into the tail tables, and the header rows of ``scans``; drops ``seg``. Returns each
        scan's (records, corrupt lines); ``seg`` holds one scan, or (``batched``) has their index in ``batch_file``."""
        for kind, table in TABLES.items():
            cols = ", ".join(f'"{n}"' for n, _ in ALL_COLUMNS[table] + PARTITIONS)
            self.con.execute(f"INSERT INTO tail_{table} ({cols}) SELECT {cols} FROM {seg} WHERE kind = '{kind}'")
        cols = ", ".join(f'"{n}"' for n, _ in ALL_COLUMNS[REPORTS_TABLE] + PARTITIONS)
        typed = report_rows_sql(seg, "kind = 'event'", partitions=True)
        self.con.execute(f"INSERT INTO tail_{REPORTS_TABLE} ({cols}) {typed}")
        found = [(0, 0)] * len(scans)
        index = "batch_file" if batched else "0"
        for k, records, corrupt in self.con.execute(
                f"SELECT {index} AS k, count(kind), count(*) - count(kind) FROM {seg} GROUP BY k").fetchall():
            found[int(k)] = (int(records), int(corrupt))
        self.con.execute(f"DROP TABLE {seg}")
        headers = [(*row, *part) for scan, segment in zip(scans, segments, strict=True)
                   for part, row in header_rows(scan, segment)]
        insert_rows(self.con, f"tail_{PROCESS_TABLE}", headers)
        return found
