"""One segment's columnar copy: its rows (``convert.convert_segment``) written as one Parquet file per record table
under its Hive partition (and one of the reports among the events, typed: ``report_rows``), each to a temporary name
first and renamed when complete; then its manifest, last (a reader trusts a copy only when its manifest is there:
docs/format.md). ``compact`` decides which segments to convert; ``compact_batch`` writes many small ones at once."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..identity import Identity
from .columnar import COLUMNS, PROCESS_TABLE, SCHEMA_VERSION, TABLES
from .convert import convert_segment, drop_converted, header_rows
from .files import make_dirs_under
from .manifest import Manifest, manifest_path, partition_dir, private_tmp, write_manifest
from .report_rows import REPORT, REPORTS_TABLE, report_rows_sql
from .views import insert_rows, sql_str

__all__ = ["ROW_GROUP_ROWS", "ROW_GROUP_ROWS_DEFAULT", "ZSTD_LEVEL", "compact_segment"]

# Rows per Parquet row group: a reader decompresses a row group's column at a time, so the tables whose rows carry
# JSON text (events' attributes are about 1 KiB) get small groups, which bounds a query's memory, not the run's size.
ROW_GROUP_ROWS = {"metrics": 122_880, "diagnostics": 16_384}
ROW_GROUP_ROWS_DEFAULT = 8_192


# zstd level 1 rather than DuckDB's default 3: 12% less time writing, files ~6% larger (still ~4% of the JSONL)
ZSTD_LEVEL = 1


def _write_parquet(con: Any, query: str, prefix: Path, rel: str, table: str) -> int:
    target = prefix / rel
    make_dirs_under(prefix, target.parent)
    tmp = private_tmp(target)
    meta = f"{{telemetrain_schema_version: '{SCHEMA_VERSION}', telemetrain_table: '{table}'}}"
    rows = ROW_GROUP_ROWS.get(table, ROW_GROUP_ROWS_DEFAULT)
    con.execute(f"COPY ({query}) TO {sql_str(str(tmp))} (FORMAT parquet, COMPRESSION zstd, "
                f"COMPRESSION_LEVEL {ZSTD_LEVEL}, PARQUET_VERSION v2, "
                f"ROW_GROUP_SIZE {rows}, KV_METADATA {meta})")
    os.replace(tmp, target)
    return target.stat().st_size


def compact_segment(con: Any, path: Path, prefix: Path, fallback: Identity, session: str, run: str,
                    segment: int) -> Manifest:
    """Write the columnar copy of one segment under ``prefix`` (a local directory) and its manifest, last."""
    try:
        return _compact_segment(con, path, prefix, fallback, session, run, segment)
    finally:  # the converted rows are dropped whether the copy was written or not
        drop_converted(con)


def _compact_segment(con: Any, path: Path, prefix: Path, fallback: Identity, session: str, run: str,
                     segment: int) -> Manifest:
    t0 = time.perf_counter()
    file_size = path.stat().st_size
    scan, seg = convert_segment(con, path, fallback, session, run, segment, file_size, chunk_tables=True)
    stem = path.name.removesuffix(".jsonl")
    records: dict[str, int] = {}
    files: list[dict[str, Any]] = []
    parts = con.execute(f"SELECT kind, session, run, rank, count(*) FROM {seg} WHERE kind IS NOT NULL "
                        "GROUP BY ALL ORDER BY ALL").fetchall()
    corrupt = con.execute(f"SELECT count(*) FROM {seg} WHERE kind IS NULL").fetchone()[0] + scan.bad_headers
    for kind, p_session, p_run, p_rank, rows in parts:
        table = TABLES[kind]
        columns = ", ".join(f'"{name}"' for name, _ in COLUMNS[table])
        rel = f"{partition_dir(table, p_session, p_run, p_rank)}/{stem}.parquet"
        # file order; the metric rows of the fast steps are in it already (a sort: ~20% of writing them)
        order = "" if kind == "metric" and scan.metrics_in_order else "ORDER BY line"
        size = _write_parquet(
            con, f"SELECT {columns} FROM {seg} WHERE kind = '{kind}' AND session = $s AND run = $r AND rank = $k "
                 f"{order}".replace("$s", sql_str(p_session)).replace("$r", sql_str(p_run))
                 .replace("$k", str(int(p_rank))),
            prefix, rel, table)
        files.append({"table": table, "path": rel, "bytes": size, "rows": rows})
        records[table] = records.get(table, 0) + rows
        if kind == "event":  # the reports among the events, typed (report_rows; derived rows, not records)
            where = (f"kind = 'event' AND session = {sql_str(p_session)} AND run = {sql_str(p_run)} AND "
                     f"rank = {int(p_rank)}")
            reports = con.execute(f"SELECT count(*) FROM {seg} WHERE {where} AND group_name = '{REPORT[0]}' AND "
                                  f"name = '{REPORT[1]}'").fetchone()[0]
            if reports:
                rel = f"{partition_dir(REPORTS_TABLE, p_session, p_run, p_rank)}/{stem}.parquet"
                size = _write_parquet(con, f"{report_rows_sql(seg, where)} ORDER BY line", prefix, rel,
                                      REPORTS_TABLE)
                files.append({"table": REPORTS_TABLE, "path": rel, "bytes": size, "rows": int(reports)})
    if scan.headers:
        rows_by_part: dict[tuple[str, str, int], list[tuple[Any, ...]]] = {}
        for part, row in header_rows(scan, segment):
            rows_by_part.setdefault(part, []).append(row)
        con.execute("CREATE OR REPLACE TEMP TABLE hdr (" + ", ".join(f"{n} {t}" for n, t in COLUMNS[PROCESS_TABLE])
                    + ")")
        for (p_session, p_run, p_rank), rows in rows_by_part.items():
            con.execute("DELETE FROM hdr")
            insert_rows(con, "hdr", rows)
            rel = f"{partition_dir(PROCESS_TABLE, p_session, p_run, p_rank)}/{stem}.parquet"
            size = _write_parquet(con, "SELECT * FROM hdr ORDER BY line", prefix, rel, PROCESS_TABLE)
            files.append({"table": PROCESS_TABLE, "path": rel, "bytes": size, "rows": len(rows)})
            records[PROCESS_TABLE] = records.get(PROCESS_TABLE, 0) + len(rows)
    last = scan.identities[-1][1]
    manifest = Manifest(schema_version=SCHEMA_VERSION, segment=path.name, session=session, run=run,
                        file_size=file_size, covered_bytes=scan.size, lines=scan.lines, torn=scan.torn,
                        corrupt=int(corrupt),
                        records=records, files=files, last_identity=last.as_dict(),
                        compacted_wall_ns=time.time_ns(), seconds=time.perf_counter() - t0)
    target = prefix / manifest_path(session, run, path.name)
    make_dirs_under(prefix, target.parent)
    write_manifest(target, manifest)
    return manifest
