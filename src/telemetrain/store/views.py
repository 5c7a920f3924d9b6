"""The tables a reader's SQL sees over the runs an ``engine.Engine`` holds: one view per table of docs/format.md, each
the union of the segments' Parquet copies and of the JSONL tail the engine parsed into a temporary ``tail_<table>``
(``engine``'s docstring: each segment counted once, from one source), plus ``windows`` (the training processes'
reports) and the ``damage`` table (torn and corrupt lines per process)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from .columnar import PARTITIONS, PROCESS_TABLE, TABLES
from .report_rows import ALL_COLUMNS, REPORT_FIELDS, REPORT_FIELDS_SINCE, REPORTS_TABLE, report_rows_sql

__all__ = ["ALL_TABLES", "Shared", "create_shared_keep", "create_tail_tables", "create_views", "first_int_sql",
           "insert_rows", "parquet_sql", "sql_list", "sql_str"]

ALL_TABLES = (*TABLES.values(), PROCESS_TABLE, REPORTS_TABLE)


def sql_str(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def sql_list(items: Iterable[str]) -> str:
    """``items`` as an SQL list of string literals."""
    return "[" + ", ".join(map(sql_str, items)) + "]"


def first_int_sql(attributes: str, keys: Sequence[str]) -> str:
    """SQL of the first of ``keys`` whose value in the JSON object ``attributes`` is an integer (not a bool, not a
    float, not a string of digits), else NULL: what a Python reader's ``isinstance(value, int)`` takes."""
    return "coalesce(" + ", ".join(
        f"CASE WHEN json_type({attributes}, '$.{key}') IN ('BIGINT', 'UBIGINT') THEN "
        f"TRY_CAST(json_extract_string({attributes}, '$.{key}') AS BIGINT) END" for key in keys) + ")"


def insert_rows(con: Any, table: str, rows: Sequence[Sequence[Any]]) -> None:
    """``rows`` (each with ``table``'s columns, in order) into ``table`` in one statement, a list per column: DuckDB's
    ``executemany`` runs one INSERT per row, ~0.6 ms each (0.6 s for the damage rows of a 1,024-rank run; this takes
    ~7 ms for 1,000 rows)."""
    if not rows:
        return
    columns = [list(column) for column in zip(*rows, strict=True)]
    con.execute(f"INSERT INTO {table} SELECT " + ", ".join("unnest(?)" for _ in columns), columns)


def create_tail_tables(con: Any) -> None:
    """The empty temporary tables the JSONL tail is parsed into, and ``damage``."""
    for table in ALL_TABLES:
        cols = ", ".join(f'"{n}" {t}' for n, t in ALL_COLUMNS[table] + PARTITIONS)
        con.execute(f"CREATE TEMP TABLE tail_{table} ({cols})")
    con.execute("CREATE TEMP TABLE damage (session VARCHAR, run VARCHAR, rank BIGINT, pid BIGINT, "
                "agent BOOLEAN, torn BIGINT, corrupt BIGINT, segments BIGINT)")


def _files(con: Any, name: str, files: list[str]) -> str:
    """An SQL expression of the list ``files``. The list is held once, in a DuckDB variable its views read: a list
    written into a view's text costs ~1.2 KiB per file in every view and bound query (3.5 MiB more for a 64-rank
    run's 2,700 files, docs/scale.md); a glob would not do, it would take files compacted after the engine read
    their JSONL."""
    import duckdb

    try:
        con.execute(f"SET VARIABLE {name} = $files", {"files": files})
    except duckdb.Error:  # a DuckDB without variables (before 1.1): the list in the view's text
        return sql_list(files)
    return f"getvariable('{name}')"


# A file shared by a batch's segments (schema version 4) -> [how many segments' rows it holds, the (session, run,
# source) of those the engine trusts]: a file whose every segment is trusted is read whole, the others through
# ``shared_keep`` (a kill between a batch's manifests, a segment whose JSONL changed since: read from its JSONL).
Shared = dict[str, list[Any]]


def create_shared_keep(con: Any, shared: dict[str, Shared]) -> None:
    """The temporary table ``shared_keep`` (tbl, filename, session, run, source): the trusted segments of each
    shared file not trusted whole."""
    con.execute("CREATE OR REPLACE TEMP TABLE shared_keep (tbl VARCHAR, filename VARCHAR, session VARCHAR, "
                "run VARCHAR, source VARCHAR)")
    insert_rows(con, "shared_keep", [(table, file, *key) for table, files in shared.items()
                                     for file, (total, keys) in files.items() if len(set(keys)) < total
                                     for key in set(keys)])


def parquet_sql(con: Any, table: str, plain: list[str], shared: Shared, variable: str | None = None,
                older: Collection[str] = ()) -> list[str]:
    """SELECTs of ``table``'s columns, partitions included, from ``plain`` files (one a segment, the partitions in
    their Hive paths) and from ``shared`` ones (the partitions as columns); the lists held in DuckDB variables
    named after ``variable`` when given (``_files``), else written into the text. ``older``: files of ``reports``
    written before some of its columns (``REPORT_FIELDS_SINCE``), which read as NULL there."""
    if table == REPORTS_TABLE and older:
        old = set(older)
        split = [([f for f in plain if f not in old], {f: v for f, v in shared.items() if f not in old}, ""),
                 ([f for f in plain if f in old], {f: v for f, v in shared.items() if f in old}, "_older")]
        return [q for p, s, suffix in split for q in _parquet_sql(con, table, p, s, variable and variable + suffix,
                                                                  bool(suffix))]
    return _parquet_sql(con, table, plain, shared, variable, False)


def _parquet_sql(con: Any, table: str, plain: list[str], shared: Shared, variable: str | None,
                 older: bool) -> list[str]:
    hive = "{" + ", ".join(f"'{n}': {t}" for n, t in PARTITIONS) + "}"
    cols = ", ".join(f'NULL::{t} AS "{n}"' if older and n in REPORT_FIELDS_SINCE else f'"{n}"'
                     for n, t in ALL_COLUMNS[table] + PARTITIONS)

    def listed(suffix: str, files: list[str]) -> str:
        return _files(con, f"{variable}{suffix}", files) if variable else sql_list(files)

    out = []
    if plain:
        out.append(f"SELECT {cols} FROM read_parquet({listed('', plain)}, hive_partitioning = true, "
                   f"hive_types = {hive})")
    whole = [f for f, (total, keys) in shared.items() if len(set(keys)) >= total]
    part = [f for f, (total, keys) in shared.items() if len(set(keys)) < total]
    if whole:
        out.append(f"SELECT {cols} FROM read_parquet({listed('_shared', whole)}, hive_partitioning = false)")
    if part:
        # by file too: two files of one run may each hold some rows of a segment (a kill between the manifests of
        # a batch that replaced an older one: some segments trust the old file, the others the new one)
        out.append(f"SELECT {cols} FROM read_parquet({listed('_part', part)}, hive_partitioning = false, "
                   f"filename = true) WHERE (filename, session, run, source) IN (SELECT (filename, session, run, "
                   f"source) FROM shared_keep WHERE tbl = {sql_str(table)})")
    return out


def create_views(con: Any, parquet: dict[str, list[str]], untyped_reports: list[str],
                 shared: dict[str, Shared] | None = None, older_reports: Collection[str] = ()) -> None:
    """(Re)create the views: each table's Parquet files (``parquet``: table -> files; ``shared``: table -> the files
    a batch's segments share) and its tail; the reports of version-2 copies (``untyped_reports``: their events
    files, which have no reports table) typed at read time."""
    hive = "{" + ", ".join(f"'{n}': {t}" for n, t in PARTITIONS) + "}"
    shared = shared or {}
    create_shared_keep(con, shared)
    for table in ALL_TABLES:
        cols = ", ".join(f'"{n}"' for n, _ in ALL_COLUMNS[table] + PARTITIONS)
        parts = [*parquet_sql(con, table, parquet.get(table, []), shared.get(table, {}), f"files_{table}",
                              older_reports),
                 f"SELECT {cols} FROM tail_{table}"]
        if table == REPORTS_TABLE and untyped_reports:
            untyped = _files(con, "files_untyped_reports", untyped_reports)
            parts.insert(0, report_rows_sql(f"read_parquet({untyped}, hive_partitioning = true, "
                                            f"hive_types = {hive})", partitions=True))
        con.execute(f"CREATE OR REPLACE VIEW {table} AS " + " UNION ALL ".join(parts))
    fields = ", ".join(n for n, _ in REPORT_FIELDS)
    con.execute(f"CREATE OR REPLACE VIEW windows AS SELECT session, run, rank, pid, host, role, segment, line, "
                f"wall_ns, {fields} FROM {REPORTS_TABLE} WHERE role <> 'agent'")
