"""``Engine.fetch``: rows of a table at known positions (session, run, rank, pid, segment, line), from the Parquet
files of their segments and the JSONL tails, in a few queries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .columnar import PARTITIONS
from .report_rows import ALL_COLUMNS
from .views import insert_rows, parquet_sql

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["FETCH_APART", "fetch"]

FETCH_APART = 64  # segments ``fetch`` reads a query each; past this, one query for all


def fetch(engine: Engine, table: str,
          keys: Iterable[tuple[str, str, int, int, int, int]]) -> tuple[list[str], list[Any]]:
    """See ``Engine.fetch``."""
    by_segment: dict[tuple[str, str, int, int, int], list[int]] = {}
    for session, run, rank, pid, segment, line in keys:
        by_segment.setdefault((session, run, int(rank), int(pid), int(segment)), []).append(int(line))
    columns = [n for n, _ in ALL_COLUMNS[table] + PARTITIONS]
    cols = ", ".join(f'"{n}"' for n in columns)
    # the JSONL tail's rows by one query for every segment (a query per segment cost ~1 ms each: 2 s for a
    # 1,024-rank run's last values)
    tail: dict[tuple[str, str, int, int, int], list[Any]] = {}
    if engine.tail_segments and by_segment:
        tail = _joined(engine, columns, f"SELECT {cols} FROM tail_{table}",
                       [(*key, line) for key, lines in by_segment.items() for line in sorted(set(lines))],
                       "session, run, rank, pid, segment, line")
    found: dict[tuple[str, str, int, int, int], tuple[list[str], list[int]]] = {}
    for key, lines in sorted(by_segment.items()):
        session, run, rank, pid, segment = key
        # by the file's name; a row whose header names another pid than its file (a renamed file): any file of
        # that segment number in the run (the query keeps the row's own rank, pid and line)
        files = engine.rank_segment_files.get((table, session, run, rank, pid, segment)) or \
            engine.segment_files.get((table, session, run, pid, segment)) or \
            engine.segment_files.get((table, session, run, None, segment))
        if files:
            found[key] = (files, sorted(set(lines)))
    parquet: dict[tuple[str, str, int, int, int], list[Any]] = {}
    if len(found) > FETCH_APART:
        # many segments (a row of each of thousands of ranks): one query over their files, the positions joined;
        # a query per segment cost ~3-10 ms each, whatever it read (20 s of `show` at 2,048 ranks)
        files = sorted({f for fs, _ in found.values() for f in fs})
        parquet = _joined(engine, columns, f"SELECT {cols} FROM ({_source(engine, table, files)})",
                          [(*key, line) for key, (_, lines) in found.items() for line in lines], "line")
    else:
        for key, (files, lines) in found.items():
            session, run, rank, pid, segment = key
            where = (f"rank = {rank} AND pid = {pid} AND segment = {segment} AND "
                     f"line IN ({', '.join(map(str, lines))})")
            parquet[key] = engine.con.execute(
                f"SELECT {cols} FROM ({_source(engine, table, files)}) WHERE {where}").fetchall()
    rows: list[Any] = []
    for key in sorted(by_segment):
        rows += parquet.get(key, []) + tail.get(key, [])
    return columns, rows


def _source(engine: Engine, table: str, files: list[str]) -> str:
    """SQL of the rows of ``table`` in ``files``: a segment's own files, or files shared by a batch's segments (of
    which only the trusted segments' rows)."""
    shared = engine.shared.get(table, {})
    return " UNION ALL ".join(parquet_sql(engine.con, table, [f for f in files if f not in shared],
                                          {f: shared[f] for f in files if f in shared}, older=engine.older_reports))


def _joined(engine: Engine, columns: list[str], source: str, positions: list[tuple[Any, ...]],
            order: str) -> dict[tuple[str, str, int, int, int], list[Any]]:
    """The rows of ``source`` (a SELECT of ``columns``) at ``positions`` (session, run, rank, pid, segment, line),
    by one query joined to a temporary table of them, grouped by their segment."""
    engine.execute("CREATE OR REPLACE TEMP TABLE fetch_keys (session VARCHAR, run VARCHAR, rank BIGINT, "
                   "pid BIGINT, segment INTEGER, line INTEGER)")
    insert_rows(engine.con, "fetch_keys", positions)
    at = [columns.index(n) for n in ("session", "run", "rank", "pid", "segment")]
    out: dict[tuple[str, str, int, int, int], list[Any]] = {}
    for row in engine.con.execute(
            f"{source} WHERE (session, run, rank, pid, segment, line) IN "
            f"(SELECT (session, run, rank, pid, segment, line) FROM fetch_keys) ORDER BY {order}").fetchall():
        session, run, rank, pid, segment = (row[i] for i in at)
        out.setdefault((session, run, int(rank), int(pid), int(segment)), []).append(row)
    engine.execute("DROP TABLE fetch_keys")
    return out
