"""One JSONL segment -> typed rows in a DuckDB table (``seg``), the way the reader decodes it: the Python side finds
the headers (``columnar.prescan``), the SQL side parses and type-checks every line (``columnar.typed_rows_sql``),
8 MiB of whole lines at a time. Used by compaction (``compact``) and by the engine for the JSONL not yet compacted.
Compaction converts in two steps (``_fast_step``, ``_general_step``): the writer's plain metric lines into narrow
tables, then its plain spans and the general path over the lines they left, once per segment: the same rows."""

from __future__ import annotations

import json
import os
import re
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..identity import Identity
from .columnar import IDENTITY_COLUMNS, Prescan, fast_metric_rows_sql, fast_span_rows_sql, prescan, typed_rows_sql
from .layout import MAX_LINE_BYTES, skip_rest_of_line
from .views import insert_rows, sql_str

__all__ = ["CHUNK_BYTES", "convert_batch", "convert_segment", "drop_converted", "header_rows",
           "replace_lone_surrogates", "split_lines"]


def _identity_rows(scan: Prescan, session: str, run: str) -> list[tuple[Any, ...]]:
    rows = []
    for i, (start, ident) in enumerate(scan.identities):
        end = scan.identities[i + 1][0] if i + 1 < len(scan.identities) else 2**31 - 1
        if end <= start:
            continue  # replaced at once (the fallback by the first line's header): no line of its own
        rows.append((start, end, ident.session_tag or session, ident.run_id or run, ident.rank,
                     *(getattr(ident, name) for name, _ in IDENTITY_COLUMNS)))
    return rows


# The longest line of a chunk converted with the metric fast path (``columnar.typed_rows_sql``): a longer line among
# fast ones costs DuckDB a copy of it per row of its vector (1 s for a line of a megabyte), so such a chunk goes the
# general way (as fast as before).
FAST_PATH_MAX_LINE = 4096
CHUNK_BYTES = 8 << 20  # a segment is converted this much at a time: memory does not follow the segment's size
# Lines are split by pyarrow (``split_lines``, ~0.1 us a line) rather than by DuckDB (~0.65 us) where that pays for
# importing pyarrow (~0.35 s of CPU, once per process: as much as DuckDB's split of ~100 MB): when it is imported
# already, or for a segment of at least ARROW_SPLIT_MIN_BYTES once the process has converted ARROW_SPLIT_AFTER_BYTES
# (a reader of many segments' JSONL; the writer's compactor, one or two 64 MiB segments a process, never imports it).
ARROW_SPLIT_AFTER_BYTES = 128 << 20
ARROW_SPLIT_MIN_BYTES = 16 << 20
_converted = [0]  # bytes of text this process converted so far


def convert_segment(con: Any, path: Path, fallback: Identity, session: str, run: str, segment: int,
                    size: int | None = None, *, start: int = 0, first_line: int = 0,
                    chunk_bytes: int | None = None, chunk_tables: bool = False) -> tuple[Prescan, str]:
    """Parse one segment into the temporary table ``seg`` (typed rows with identity and position) of ``con``;
    returns its prescan and the name of the table (``seg``). Lines past ``size`` bytes are not read; with ``start``,
    reading begins at that offset, which is line ``first_line``. The file is read ``chunk_bytes`` of whole lines at a
    time (DuckDB keeps the rows, spilling past its memory limit).

    With ``chunk_tables``, each chunk's rows go to a table of their own (``seg_0``, ``seg_1``, ...) and ``seg`` is a
    view of them all, in order (``drop_converted`` drops them): appending to one table costs DuckDB a pass over every
    row group it completes (122,880 rows), about a third of the conversion's time; tables of one chunk never complete
    one. Compaction reads the rows once; the engine keeps a table."""
    limit = size if size is not None else os.stat(path).st_size
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    total = Prescan(path=path, size=start, lines=0, torn=0, start=start, first_line=first_line)
    total.identities.append((0, fallback))
    pos, line, identity, created = start, first_line, fallback, False
    branches: list[str] = []  # with chunk_tables: the view's query of each chunk's table
    rest: dict[str, list[str]] = {}  # with chunk_tables: lines left for the general path (_fast_step)
    arrow = "pyarrow" in sys.modules or (_converted[0] >= ARROW_SPLIT_AFTER_BYTES
                                         and limit - start >= ARROW_SPLIT_MIN_BYTES)
    _converted[0] += max(limit - start, 0)
    while True:
        end = min(pos + chunk_bytes, limit)
        scan = prescan(path, identity, end, start=pos, first_line=line, keep=True)
        if scan.lines == 0 and end < limit:  # one line longer than a chunk: read further, up to the longest line
            if chunk_bytes <= MAX_LINE_BYTES:
                chunk_bytes = min(chunk_bytes * 2, MAX_LINE_BYTES + 1)
                continue
            scan = _overlong(path, identity, pos, line, limit)
        if chunk_tables:
            branches.append(_convert_chunk(con, path, scan, session, run, segment, create=True,
                                           table=f"seg_{len(branches)}", rest=rest, arrow=arrow))
        else:
            _convert_chunk(con, path, scan, session, run, segment, create=not created, arrow=arrow)
        created = True
        offset = line - first_line  # the chunk's lines, relative to the whole read
        total.header_lines += [n + offset for n in scan.header_lines]
        total.identities += [(n + offset, i) for n, i in scan.identities[1:]]
        total.headers += [(n + offset, h) for n, h in scan.headers]
        total.bad_headers += scan.bad_headers
        if not total.first_header:
            total.first_header = scan.first_header
        total.lines += scan.lines
        total.size = scan.size
        pos, line, identity = scan.size, line + scan.lines, scan.identities[-1][1]
        if end >= limit or scan.lines == 0:
            total.torn = scan.torn
            if chunk_tables:
                general = _general_step(con, rest)
                # every metric row in a fast step's table, chunk after chunk: they need no sort to be in file order
                total.metrics_in_order = len(rest) == 1 and len(branches) == sum(map(len, rest.values())) and not \
                    con.execute("SELECT count(*) FROM seg_g0 WHERE kind = 'metric'").fetchone()[0]
                branches += general
                con.execute("CREATE OR REPLACE TEMP VIEW seg AS "
                            + " UNION ALL BY NAME ".join(f"({b})" for b in branches))
            return total, "seg"


def _overlong(path: Path, identity: Identity, pos: int, line: int, limit: int) -> Prescan:
    """The line at ``pos``, longer than ``MAX_LINE_BYTES``, streamed past (never read whole): a chunk of one line that
    the SQL side counts corrupt, as the reader counts it; or, when no newline ends it before ``limit``, nothing but
    the torn last line."""
    with open(path, "rb") as fh:
        fh.seek(pos)
        after = skip_rest_of_line(fh, limit)
    if after is None:
        scan = Prescan(path=path, size=pos, lines=0, torn=1, start=pos, first_line=line)
    else:
        scan = Prescan(path=path, size=after, lines=1, torn=0, start=pos, first_line=line, body=b"\x01\n")
    scan.identities.append((0, identity))
    return scan


def drop_converted(con: Any) -> None:
    """Drop what ``convert_segment(..., chunk_tables=True)`` made."""
    tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary AND "
                                        "regexp_full_match(table_name, 'seg_[gs]?[0-9]+')").fetchall()]
    con.execute("DROP VIEW IF EXISTS seg")
    for table in tables:
        con.execute(f"DROP TABLE {table}")


def _convert_chunk(con: Any, path: Path, scan: Prescan, session: str, run: str, segment: int, *,
                   create: bool, table: str = "seg", rest: dict[str, list[str]] | None = None,
                   arrow: bool = False) -> str:
    """The lines a prescan covered, typed, into ``table`` (created, or appended to). Returns a query of the rows with
    their identity and segment: where one identity holds for the whole chunk (the usual case), ``table`` leaves them
    out and the query adds them as constants (cheaper to store, and to write to Parquet, than columns of one value).
    With ``rest`` (compaction), a chunk of one identity takes the two steps (``_fast_step``); with ``arrow``, its lines
    are split by pyarrow (``split_lines``)."""
    data, scan.body = scan.body, b""  # the prescan's lines (read once; not kept past the chunk)
    data = replace_lone_surrogates(data)
    ids = _identity_rows(scan, session, run)
    text = _decoded(data)
    first_line = scan.first_line
    identity = ("session", "run", "rank", *(n for n, _ in IDENTITY_COLUMNS))
    rows = f"(t.n + {int(first_line)})::INTEGER AS line, t.* EXCLUDE (n)"
    if len(ids) == 1:  # one identity for the whole chunk: constants, no join
        constants = (", ".join(f"{_sql_value(v)} AS {name}" for v, name in zip(ids[0][2:], identity, strict=True))
                     + f", {int(segment)}::INTEGER AS segment")
        if table == "seg":  # the engine's table: every column stored
            select = f"SELECT {constants}, {rows} FROM typed t"
            branch = f"SELECT * FROM {table}"
        else:
            select = f"SELECT {rows} FROM typed t"
            branch = f"SELECT {constants}, * FROM {table}"
    else:
        con.execute("CREATE OR REPLACE TEMP TABLE ids (lo INTEGER, hi INTEGER, session VARCHAR, run VARCHAR, "
                    "rank BIGINT, " + ", ".join(f"{name} {typ}" for name, typ in IDENTITY_COLUMNS) + ")")
        insert_rows(con, "ids", ids)
        select = ("SELECT " + ", ".join(f"ids.{name}" for name in identity)
                  + f", {int(segment)}::INTEGER AS segment, {rows} FROM typed t "
                  "JOIN ids ON t.n >= ids.lo AND t.n < ids.hi")
        branch = f"SELECT * FROM {table}"
    into = f"CREATE OR REPLACE TEMP TABLE {table} AS" if create else f"INSERT INTO {table}"
    params: dict[str, Any] = {"headers": scan.header_lines, "lines": scan.lines}
    two_steps = len(ids) == 1 and rest is not None
    source, lines, short = _lines_source(con, data, text, arrow, params)
    try:
        if two_steps and rest is not None:  # (a long line costs the two steps nothing more: no list is copied)
            return _fast_step(con, table, constants, int(first_line), params, rest, source, lines)
        con.execute(f"{into} WITH typed AS ({typed_rows_sql(source, fast=short, lines=lines)}) {select}", params)
    finally:
        if source == _ARROW_LINES:
            con.unregister(_ARROW_LINES)
    return branch


_ARROW_LINES = "chunk_lines"


def _lines_source(con: Any, data: bytes, text: str | None, arrow: bool,
                  params: dict[str, Any]) -> tuple[str, bool, bool]:
    """``data`` (``text``: it decoded, "" when ASCII and not decoded yet; None when not UTF-8) made a source of
    ``typed_rows_sql``: returns the source, whether it is split in lines already, and whether every line is short
    enough for the metric fast path (``FAST_PATH_MAX_LINE``). With ``arrow``, the lines are split by pyarrow and
    registered as ``_ARROW_LINES`` (the caller unregisters it); else the text goes in ``params``, or, when it is not
    UTF-8, into the table ``seg_text`` line by line, so that only the bad lines are lost."""
    data, blanked = _blank_overlong(data)
    if blanked:
        text = _decoded(data)
    split = split_lines(data) if text is not None and arrow else None
    if split is not None:
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        short = (pc.max(pc.binary_length(split.column("line"))).as_py() or 0) <= FAST_PATH_MAX_LINE
        # register() refuses a connection holding a result not fetched to its end (DuckDB 2: the engine's may); the
        # next execute() closes such a result anyway, so one is run first
        con.execute("SELECT 1").fetchall()
        con.register(_ARROW_LINES, split)
        return _ARROW_LINES, True, short
    short = max(map(len, data.split(b"\n"))) <= FAST_PATH_MAX_LINE
    if text is not None:
        params["content"] = text or data.decode("ascii")
        return "(SELECT $content AS content)", False, short
    con.execute("CREATE OR REPLACE TEMP TABLE seg_text (content VARCHAR)")
    good = "\n".join(_utf8_or_blank(line) for line in data.split(b"\n"))
    con.execute("INSERT INTO seg_text VALUES ($c)", {"c": good})
    return "seg_text", False, short


def _blank_overlong(data: bytes) -> tuple[bytes, bool]:
    """``data`` with each line longer than ``MAX_LINE_BYTES`` replaced by one the SQL side counts corrupt, as the
    reader skips it (DuckDB needs ~10x a line's size to parse it: a line of 8 MiB ran the reader's 128 MB out); and
    whether any was. Such a line holds a whole aligned block of half the cap without a newline, which a few
    ``bytes.find`` rule out without splitting ``data``."""
    half = MAX_LINE_BYTES // 2
    if all(data.find(b"\n", i, i + half) >= 0 for i in range(0, len(data) - half + 1, half)):
        return data, False
    lines = data.split(b"\n")
    if max(map(len, lines)) <= MAX_LINE_BYTES:
        return data, False
    return b"\n".join(line if len(line) <= MAX_LINE_BYTES else b"\x01" for line in lines), True


def _decoded(data: bytes) -> str | None:
    """``data`` as text: "" when it is ASCII (decoded only if needed: Arrow takes the bytes), None when not UTF-8."""
    if data.isascii():
        return ""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def convert_batch(con: Any, scans: Sequence[tuple[Prescan, str, str, int]], *, arrow: bool = False) -> str:
    """Several segments' lines (each a ``prescan(..., keep=True)`` of a whole segment or of its tail, with its session,
    run and segment number) typed into the temporary table ``seg`` by one statement, with the column ``batch_file``
    (the segment's index in ``scans``); returns ``seg``. Converting a segment costs DuckDB ~15 ms of planning, and
    inserting its rows as much again, whatever its size: a run of 1,024 small files paid it 1,024 times."""
    ids: list[tuple[Any, ...]] = []
    headers: list[int] = []
    parts: list[bytes] = []
    base = 0  # the line number, in the batch, of the segment's first line
    for k, (scan, session, run, segment) in enumerate(scans):
        parts.append(scan.body)
        scan.body = b""
        for lo, hi, *who in _identity_rows(scan, session, run):
            hi = min(hi, scan.lines)
            if hi > lo:
                ids.append((lo + base, hi + base, *who, segment, base - scan.first_line, k))
        headers += [n + base for n in scan.header_lines]
        base += scan.lines
    data = b"".join(parts)
    del parts
    data = replace_lone_surrogates(data)
    con.execute("CREATE OR REPLACE TEMP TABLE ids (lo INTEGER, hi INTEGER, session VARCHAR, run VARCHAR, rank BIGINT, "
                + ", ".join(f"{name} {typ}" for name, typ in IDENTITY_COLUMNS)
                + ", segment INTEGER, shift BIGINT, batch_file INTEGER)")
    insert_rows(con, "ids", ids)
    params: dict[str, Any] = {"headers": headers, "lines": base}
    source, lines, short = _lines_source(con, data, _decoded(data), arrow, params)
    del data
    identity = ", ".join(f"ids.{name}" for name in ("session", "run", "rank", *(n for n, _ in IDENTITY_COLUMNS)))
    typed = typed_rows_sql(source, fast=short, lines=lines)
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE seg AS WITH typed AS ({typed}) "
                    f"SELECT {identity}, ids.segment, (t.n - ids.shift)::INTEGER AS line, ids.batch_file, "
                    "t.* EXCLUDE (n) FROM typed t JOIN ids ON t.n >= ids.lo AND t.n < ids.hi ORDER BY t.n", params)
    finally:
        if source == _ARROW_LINES:
            con.unregister(_ARROW_LINES)
        con.execute("DROP TABLE ids")
    return "seg"


def _fast_step(con: Any, table: str, constants: str, first_line: int, params: dict[str, Any],
               rest: dict[str, list[str]], source: str, lines: bool) -> str:
    """Step one of a chunk (``source``, as ``typed_rows_sql`` takes it) of one identity, for compaction: its plain
    metric lines into ``table`` (``columnar.fast_metric_rows_sql``: their columns only, the other lines' text in
    ``rest``). Returns the query of its metric rows with the identity ``constants``; the table is added to
    ``rest[constants]``, whose other lines ``_general_step`` converts once per segment (the general query takes ~9 ms
    to plan: per chunk, more than its few lines cost)."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT (t.n + {first_line})::INTEGER AS line, "
                f"t.* EXCLUDE (n) FROM ({fast_metric_rows_sql(source, lines=lines)}) t", params)
    rest.setdefault(constants, []).append(table)
    return f"SELECT {constants}, 'metric' AS kind, * EXCLUDE (rest) FROM {table} WHERE rest IS NULL"


def _general_step(con: Any, rest: dict[str, list[str]]) -> list[str]:
    """Step two: the lines step one left (``rest``), of every chunk of one identity at once: spans of the plain shape
    into ``seg_s<k>`` (``columnar.fast_span_rows_sql``), the rest through the general path into ``seg_g<k>``; returns
    their queries. (Step one already applied the line filters: the general query's own pass every line.)"""
    branches = []
    for k, (constants, tables) in enumerate(rest.items()):
        source = " UNION ALL ".join(f"SELECT line::BIGINT AS n, rest AS line FROM {t} WHERE rest IS NOT NULL"
                                    for t in tables)
        con.execute(f"CREATE OR REPLACE TEMP TABLE seg_s{k} AS SELECT t.n::INTEGER AS line, t.* EXCLUDE (n) "
                    f"FROM ({fast_span_rows_sql(f'({source})')}) t")
        general = typed_rows_sql(f"(SELECT line::BIGINT AS n, rest AS line FROM seg_s{k} WHERE rest IS NOT NULL)",
                                 fast=False, lines=True)
        con.execute(f"CREATE OR REPLACE TEMP TABLE seg_g{k} AS WITH typed AS ({general}) "
                    "SELECT t.n::INTEGER AS line, t.* EXCLUDE (n) FROM typed t", {"headers": [], "lines": 2**31})
        branches.append(f"SELECT {constants}, * EXCLUDE (rest) FROM seg_s{k} WHERE rest IS NULL")
        branches.append(f"SELECT {constants}, * FROM seg_g{k}")
    return branches


def split_lines(data: bytes) -> Any:
    """``data`` (UTF-8) split at every newline, as DuckDB's ``string_split`` splits it (an empty string after the last
    newline included): an Arrow table of ``line`` and ``n`` (its number from 0), the text shared, not copied line by
    line. None without pyarrow (the ``columnar`` extra has it; DuckDB alone then splits the text itself)."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
    except ImportError:
        return None
    whole = pa.Array.from_buffers(pa.large_binary(), 1, [None, pa.py_buffer(struct.pack("<2q", 0, len(data))),
                                                         pa.py_buffer(data)])
    # split as bytes (no UTF-8 handling), then seen as text: the caller checked that ``data`` is UTF-8
    lines = pc.split_pattern(whole, b"\n").flatten().view(pa.large_string())
    # 0, 1, ...: the positions of the lines, every one valid (int64, as generate_subscripts; not pa.repeat, which
    # imports numpy: 0.3 s)
    numbers = pc.indices_nonzero(pc.is_valid(lines)).cast(pa.int64())
    return pa.table({"line": lines, "n": numbers})


def header_rows(scan: Prescan, segment: int) -> list[tuple[tuple[str, str, int], tuple[Any, ...]]]:
    """The ``processes`` rows of a prescan's valid headers: (partition, row) with the identity in force at each."""
    rows = []
    for line, header in scan.headers:
        ident = next(i for start, i in reversed(scan.identities) if start <= line)
        mono, wall = header.get("mono_ns"), header.get("wall_ns")
        rows.append(((ident.session_tag, ident.run_id, ident.rank),
                     (*(getattr(ident, name) for name, _ in IDENTITY_COLUMNS), segment, line + scan.first_line,
                      mono if _i64(mono) else None, wall if _i64(wall) else None,
                      json.dumps(header, separators=(",", ":"), default=repr))))
    return rows


# A JSON string may escape a lone UTF-16 surrogate ("\ud800": the writer does, for a Python str that holds one, e.g. a
# file name decoded with surrogateescape). Python reads it back exactly; DuckDB refuses the line, and its text type
# (UTF-8) cannot hold one. So the columnar copy gets U+FFFD in its place: the record is kept (both readers count the
# same records), that character differs (docs/format.md). Escape for escape, the length is the same.
_LONE_SURROGATE = re.compile(
    rb"(?<!\\)((?:\\\\)*)(\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})")


def replace_lone_surrogates(data: bytes) -> bytes:
    """``data`` with every escaped lone surrogate replaced by the escaped replacement character."""
    if b"\\" not in data or (b"\\ud" not in data and b"\\uD" not in data):  # (one-byte search first: memchr)
        return data
    return _LONE_SURROGATE.sub(lambda m: m.group(1) + b"\\ufffd", data)


def _utf8_or_blank(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return "\x01"  # a line that is not UTF-8 is corrupt, as the Python reader finds it


def _sql_value(value: Any) -> str:
    """A constant of an identity column, typed as its column is."""
    if isinstance(value, str):
        return f"{sql_str(value)}::VARCHAR"
    return f"{int(value)}::BIGINT"


def _i64(value: Any) -> bool:
    return type(value) is int and -(2**63) <= value < 2**63
