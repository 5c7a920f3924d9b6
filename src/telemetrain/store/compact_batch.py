"""Compaction of many small segments together (``telemetrain compact`` of a run of thousands of ranks, one or a few
small segments each): the rows ``segment_copy.compact_segment`` writes one segment at a time, in a few statements per
batch rather than ~10 per segment, and in a few files.

A segment converted alone cost ~0.17 s whatever its size (BENCHMARKS.md, "Many ranks, few iterations"): DuckDB
planning its conversion (~60 ms), a ``COPY`` per Parquet file (~8 ms each, seven files) and the typed reports' query
(~45 ms of planning). Here the segments of a batch are converted by one statement (``convert.convert_batch``, as the
engine converts JSONL tails), and each table is written by one ``COPY ... PARTITION_BY``, to a temporary directory
under the prefix. In a run's own copy (``share``) its partitions are the batch's runs: one file per table and run,
shared by the segments (schema version 4, ``_shared/``), their rows told apart by the column ``source``: 2,048 ranks
of one segment each made 14,336 small files, which every query listed and opened (3-4x slower than reading the
JSONL). Otherwise (a ``--to`` tree, read by other engines as Hive) its partitions are the (segment, rank partition)
pairs, each file renamed to the name ``compact_segment`` gives it. Either way each segment's manifest is written
last, naming its files: a crash leaves files no manifest names (a later compaction replaces the segments' copies and
sweeps such shared files once old), and a reader trusts a segment's rows of a shared file only through its manifest
(``views.parquet_sql``). Each segment of a batch is locked (``compact_locks.segment_lock``) and its manifest checked
again once the lock is held, as ``compact_process`` does.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..identity import Identity
from .columnar import COLUMNS, KEPT_SINCE, PROCESS_TABLE, SCHEMA_VERSION, TABLES, ColumnarVersionError, Prescan, prescan
from .convert import convert_batch, header_rows
from .manifest import (
    SEGMENTS_DIR,
    SHARED_DIR,
    Manifest,
    manifest_is_valid,
    manifest_path,
    partition_dir,
    read_manifest,
    shared_dir,
    write_manifest,
)
from .report_rows import REPORT, REPORTS_TABLE, report_rows_sql
from .views import insert_rows, sql_str

__all__ = ["BATCH_BYTES", "BATCH_SEGMENTS", "SMALL_SEGMENT_BYTES", "BatchPool"]

SMALL_SEGMENT_BYTES = 4 << 20  # a process whose segments to convert are all this small goes to a batch
# JSONL converted by one statement (the lines are held in memory meanwhile): 256 segments of 70 KiB compacted in 5.3 s
# of CPU and 150 MiB at the peak by 4 MiB, 5.2 s and 181 MiB by 8, 4.2 s and 283 MiB all at once (105 MiB a segment
# at a time, in 39 s)
BATCH_BYTES = 4 << 20
BATCH_SEGMENTS = 512  # segments a batch (its locks held together; its files written by one COPY a table)
STALE_BATCH_S = 3600.0  # a batch folder this old belongs to a compactor that was killed


@dataclass
class _Pending:
    path: Path
    manifest: Path  # its manifest's path
    session: str
    run: str
    segment: int
    file_size: int
    scan: Prescan


class BatchPool:
    """Segments of small processes gathered (``take``) and compacted a batch at a time (``flush``) under ``prefix``."""

    def __init__(self, con: Any, prefix: Path, result: Any, *, force: bool = False, lock: bool = True,
                 prefix_parents: bool = True, share: bool = True) -> None:
        self.con, self.prefix, self.result, self.share = con, prefix, result, share
        self.force, self.lock, self.prefix_parents = force, lock, prefix_parents
        self.pending: list[_Pending] = []
        self.bytes = 0
        _sweep_stale_batches(prefix)
        _sweep_unreferenced(prefix)

    def take(self, run_dir: Path, paths: Sequence[Path], meta: dict[str, Any], *, include_last: bool) -> bool:
        """Add the segments of one process that have no valid copy, when each is small; False (nothing added, nothing
        counted) when one is not: ``compact_process`` converts that process alone."""
        from .compact import _identity_from, _session_run
        from .reader import fallback_identity
        from .segments import parse_segment_name

        session, run = _session_run(run_dir, meta)
        plan: list[tuple[int, Path, Path, Manifest | None, int]] = []
        for i, path in enumerate(paths):
            mpath = self.prefix / manifest_path(session, run, path.name)
            existing = read_manifest(mpath, KEPT_SINCE)
            if existing is not None and not self.force and not manifest_is_valid(existing, self.prefix, path):
                plan.append((i, path, mpath, existing, 0))
                continue
            if i == len(paths) - 1 and not include_last:
                break
            try:
                size = path.stat().st_size
            except OSError:
                return False  # (compact_process says what is wrong with it)
            if size > SMALL_SEGMENT_BYTES:
                return False
            plan.append((i, path, mpath, None, size))
        identity: Identity | None = None
        for i, path, mpath, existing, size in plan:
            if existing is not None:
                self.result.skipped += 1
                identity = _identity_from(existing.last_identity) or identity
                continue
            parsed = parse_segment_name(path.name)
            try:
                scan = prescan(path, identity or fallback_identity(path, meta), size, keep=True)
            except OSError as exc:
                self.result.errors.append(f"{path}: {exc}")
                continue
            identity = scan.identities[-1][1]
            self.pending.append(_Pending(path, mpath, session, run, parsed.segment if parsed is not None else i,
                                         size, scan))
            self.bytes += len(scan.body)
            if self.bytes >= BATCH_BYTES or len(self.pending) >= BATCH_SEGMENTS:
                self.flush()
        return True

    def flush(self) -> None:
        """Compact the segments gathered."""
        batch, self.pending, self.bytes = self.pending, [], 0
        if not batch:
            return
        with contextlib.ExitStack() as locks:
            todo = []
            try:
                self.prefix.mkdir(parents=self.prefix_parents, exist_ok=True)
            except OSError as exc:
                self.result.errors += [f"{p.path}: {exc}" for p in batch]
                return
            for p in batch:
                from .compact_locks import segment_lock

                try:
                    locks.enter_context(segment_lock(p.manifest, enabled=self.lock, prefix=self.prefix))
                except (OSError, TimeoutError) as exc:
                    self.result.errors.append(f"{p.path}: {exc}")
                    continue
                existing = read_manifest(p.manifest, KEPT_SINCE)  # another compactor may have done it while we gathered
                if existing is not None and not self.force and not manifest_is_valid(existing, self.prefix, p.path):
                    self.result.skipped += 1
                    continue
                todo.append(p)
            if not todo:
                return
            try:
                manifests = _compact_batch(self.con, todo, self.prefix, self.share)
            except Exception:  # noqa: BLE001 - one bad segment must not stop the others: each alone, as before
                manifests = self._one_at_a_time(todo)
        for manifest in manifests:
            self.result.segments += 1
            self.result.records += sum(n for t, n in manifest.records.items() if t != PROCESS_TABLE)
            self.result.bytes_in += manifest.file_size
            self.result.bytes_out += sum(int(f["bytes"]) for f in manifest.files)


    def _one_at_a_time(self, todo: list[_Pending]) -> list[Manifest]:
        """The segments of a batch that failed, each converted alone (``compact_segment``; their locks are held): the
        errors are each segment's own."""
        from .segment_copy import compact_segment

        manifests = []
        for p in todo:
            fallback = p.scan.identities[0][1]  # (what it was prescanned with)
            try:
                manifests.append(compact_segment(self.con, p.path, self.prefix, fallback, p.session, p.run, p.segment))
            except (OSError, ValueError) as exc:
                self.result.errors.append(f"{p.path}: {exc}")
            except Exception as exc:  # noqa: BLE001 - DuckDB's errors: that segment's
                self.result.errors.append(f"{p.path}: {type(exc).__name__}: {exc}")
        return manifests


def _sweep_stale_batches(prefix: Path) -> None:
    """Remove the working folders of batches a killed compactor left (SIGKILL, power loss): readers go by manifests
    and never see them, but they hold disk. Only old ones: a batch of another live compactor takes seconds."""
    try:
        leftovers = list(prefix.glob(".batch-*.tmp"))
    except OSError:
        return
    for folder in leftovers:
        with contextlib.suppress(OSError):
            if time.time() - folder.stat().st_mtime > STALE_BATCH_S:
                shutil.rmtree(folder, ignore_errors=True)


def _sweep_unreferenced(prefix: Path) -> None:
    """Remove the shared files no manifest names any more: a batch killed before its manifests, or whose segments
    were all compacted again since (their JSONL grew, ``--force``). Only old ones: a live compactor renames a batch's
    files into place seconds before writing its manifests, and a reader that read the manifests before they were
    replaced may still be reading the files they named."""
    try:
        old = [f for f in (prefix / SHARED_DIR).rglob("*.parquet")
               if time.time() - f.stat().st_mtime > STALE_BATCH_S]
    except OSError:
        return
    if not old:
        return
    referenced: set[str] = set()
    try:
        for path in (prefix / SEGMENTS_DIR).rglob("*.json"):
            manifest = read_manifest(path, 0)
            if manifest is not None:
                referenced.update(os.path.normpath(prefix / str(f.get("path", ""))) for f in manifest.files)
    except (OSError, ColumnarVersionError):
        return  # a manifest unreadable or of a newer version: keep every file rather than guess
    for f in old:
        if os.path.normpath(f) not in referenced:
            with contextlib.suppress(OSError):
                f.unlink()


def _columns(table: str) -> str:
    return ", ".join(f'"{name}"' for name, _ in COLUMNS[table])


_TABLES_ALL = (*TABLES.values(), REPORTS_TABLE, PROCESS_TABLE)


def _place_own(prefix: Path, tmp: Path, todo: list[_Pending], parts: dict[tuple[int, str, str, int], int],
               rows: dict[tuple[str, int], int], files: list[list[dict[str, Any]]],
               records: list[dict[str, int]]) -> None:
    """Each (segment, rank partition)'s file of each table to the place ``compact_segment`` gives it."""
    from .files import make_dirs_under

    for (k, session, run, rank), pk in parts.items():
        stem = todo[k].path.name.removesuffix(".jsonl")
        for table in _TABLES_ALL:
            n = rows.get((table, pk))
            if not n:
                continue
            written = list((tmp / table / f"pk={pk}").iterdir())
            if len(written) != 1:
                raise ValueError(f"expected one Parquet file of {table} in partition {pk}, found {len(written)}")
            rel = f"{partition_dir(table, session, run, rank)}/{stem}.parquet"
            make_dirs_under(prefix, (prefix / rel).parent)
            os.replace(written[0], prefix / rel)
            files[k].append({"table": table, "path": rel, "bytes": (prefix / rel).stat().st_size, "rows": n})
            if table != REPORTS_TABLE:
                records[k][table] = records[k].get(table, 0) + n


def _place_shared(prefix: Path, tmp: Path, todo: list[_Pending], parts: dict[tuple[int, str, str, int], int],
                  rows: dict[tuple[str, int], int], groups: dict[tuple[str, str], int],
                  files: list[list[dict[str, Any]]], records: list[dict[str, int]]) -> None:
    """Each (table, session and run)'s shared file to its place, named by the batch; each segment's entry for it."""
    from .files import make_dirs_under

    per_file: dict[tuple[str, int], dict[int, tuple[int, set[int]]]] = {}  # -> segment -> (rows, ranks)
    for (k, _, _, rank), pk in parts.items():
        for table in _TABLES_ALL:
            n = rows.get((table, pk))
            if n:
                seen = per_file.setdefault((table, groups[(todo[k].session, todo[k].run)]), {})
                total, ranks = seen.get(k, (0, set()))
                seen[k] = (total + n, ranks | {int(rank)})
    names = {g: key for key, g in groups.items()}
    batch = tmp.name.removesuffix(".tmp").removeprefix(".")
    for (table, g), segments in sorted(per_file.items()):
        written = list((tmp / table / f"g={g}").iterdir())
        if len(written) != 1:
            raise ValueError(f"expected one Parquet file of {table} in group {g}, found {len(written)}")
        rel = f"{shared_dir(table, *names[g])}/{batch}.parquet"
        make_dirs_under(prefix, (prefix / rel).parent)
        os.replace(written[0], prefix / rel)
        size = (prefix / rel).stat().st_size
        for k, (n, ranks) in segments.items():
            files[k].append({"table": table, "path": rel, "bytes": size, "rows": n, "source": todo[k].path.name,
                             "segments": len(segments), "ranks": sorted(ranks)})
            if table != REPORTS_TABLE:
                records[k][table] = records[k].get(table, 0) + n


def _compact_batch(con: Any, todo: list[_Pending], prefix: Path, share: bool = True) -> list[Manifest]:
    from .files import make_dirs_under
    from .segment_copy import ROW_GROUP_ROWS, ROW_GROUP_ROWS_DEFAULT, ZSTD_LEVEL

    t0 = time.perf_counter()
    corrupt = [p.scan.bad_headers for p in todo]
    lines_scanned = [(p.scan.size, p.scan.lines, p.scan.torn, p.scan.identities[-1][1]) for p in todo]
    headers = [header_rows(p.scan, p.segment) for p in todo]  # (before convert_batch takes the scans' lines)
    seg = convert_batch(con, [(p.scan, p.session, p.run, p.segment) for p in todo], arrow=False)
    # (a token besides the pid: two hosts compacting runs of one shared filesystem can have the same pid)
    tmp = prefix / f".batch-{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        counts = con.execute(f"SELECT batch_file, kind, session, run, rank, count(*), "
                             f"count(*) FILTER (WHERE kind = 'event' AND group_name = '{REPORT[0]}' AND "
                             f"name = '{REPORT[1]}') FROM {seg} GROUP BY ALL ORDER BY ALL").fetchall()
        parts: dict[tuple[int, str, str, int], int] = {}  # (segment in the batch, session, run, rank) -> partition
        for k, kind, session, run, rank, _, _ in counts:
            if kind is not None:
                parts.setdefault((int(k), session, run, int(rank)), len(parts))
        for k, found in enumerate(headers):
            for (session, run, rank), _ in found:
                parts.setdefault((k, session, run, int(rank)), len(parts))
        # shared: one file a table for each (session, run) of the batch, its segments told apart by ``source``;
        # else one file a table for each (segment, rank partition), named as ``compact_segment`` names it
        groups: dict[tuple[str, str], int] = {}
        for p in todo:
            groups.setdefault((p.session, p.run), len(groups))
        con.execute("CREATE OR REPLACE TEMP TABLE batch_parts (batch_file INTEGER, session VARCHAR, run VARCHAR, "
                    "rank BIGINT, pk INTEGER, source VARCHAR, g INTEGER)")
        insert_rows(con, "batch_parts", [(k, s, r, rank, pk, todo[k].path.name, groups[(todo[k].session, todo[k].run)])
                                         for (k, s, r, rank), pk in parts.items()])
        joined = (f"(SELECT s.*, p.pk, p.source, p.g FROM {seg} s "
                  "JOIN batch_parts p USING (batch_file, session, run, rank))")
        rows: dict[tuple[str, int], int] = {}  # (table, partition) -> rows
        for k, kind, session, run, rank, n, reports in counts:
            if kind is None:
                corrupt[int(k)] += int(n)
                continue
            pk = parts[(int(k), session, run, int(rank))]
            rows[(TABLES[kind], pk)] = int(n)
            if reports:
                rows[(REPORTS_TABLE, pk)] = int(reports)
        # (a shared file holds the Hive partitions of a segment's own files as columns)
        extra, key, order = (", session, run, rank, source", "g", "g, batch_file, line") if share else \
            ("", "pk", "pk, line")
        queries = {table: f"SELECT {_columns(table)}{extra}, {key} FROM {joined} WHERE kind = '{kind}' "
                          f"ORDER BY {order}" for kind, table in TABLES.items()}
        queries[REPORTS_TABLE] = (f"SELECT * EXCLUDE (batch_file) FROM ("
                                  f"{report_rows_sql(joined, extra=f'{extra}, {key}, batch_file')} ORDER BY {order})")
        if any(headers):
            con.execute("CREATE OR REPLACE TEMP TABLE batch_hdr (" + ", ".join(
                f"{n} {t}" for n, t in COLUMNS[PROCESS_TABLE]) + ", session VARCHAR, run VARCHAR, rank BIGINT, "
                "source VARCHAR, g INTEGER, batch_file INTEGER, pk INTEGER)")
            insert_rows(con, "batch_hdr", [(*row, s, r, int(rank), todo[k].path.name,
                                            groups[(todo[k].session, todo[k].run)], k, parts[(k, s, r, int(rank))])
                                           for k, found in enumerate(headers) for (s, r, rank), row in found])
            queries[PROCESS_TABLE] = f"SELECT {_columns(PROCESS_TABLE)}{extra}, {key} FROM batch_hdr ORDER BY {order}"
            for (k, s, r, rank), pk in parts.items():
                n = sum(1 for part, _ in headers[k] if part == (s, r, rank))
                if n:
                    rows[(PROCESS_TABLE, pk)] = n
        tables = {table for table, _ in rows}
        for table, query in queries.items():
            if table not in tables:
                continue
            meta = f"{{telemetrain_schema_version: '{SCHEMA_VERSION}', telemetrain_table: '{table}'}}"
            out = tmp / table
            make_dirs_under(prefix, out)
            con.execute(f"COPY ({query}) TO {sql_str(str(out))} (FORMAT parquet, "
                        f"COMPRESSION zstd, COMPRESSION_LEVEL {ZSTD_LEVEL}, PARQUET_VERSION v2, "
                        f"ROW_GROUP_SIZE {ROW_GROUP_ROWS.get(table, ROW_GROUP_ROWS_DEFAULT)}, KV_METADATA {meta}, "
                        f"PARTITION_BY ({key}), FILENAME_PATTERN 'f', OVERWRITE_OR_IGNORE)")
        files: list[list[dict[str, Any]]] = [[] for _ in todo]
        records: list[dict[str, int]] = [{} for _ in todo]
        if share:
            _place_shared(prefix, tmp, todo, parts, rows, groups, files, records)
        else:
            _place_own(prefix, tmp, todo, parts, rows, files, records)
    finally:
        for name in ("batch_parts", "batch_hdr", seg):
            con.execute(f"DROP TABLE IF EXISTS {name}")
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = (time.perf_counter() - t0) / len(todo)
    manifests = []
    for k, p in enumerate(todo):  # each segment's manifest last
        size, lines, torn, last = lines_scanned[k]
        manifest = Manifest(schema_version=SCHEMA_VERSION, segment=p.path.name, session=p.session, run=p.run,
                            file_size=p.file_size, covered_bytes=size, lines=lines, torn=torn, corrupt=corrupt[k],
                            records=records[k], files=files[k], last_identity=last.as_dict(),
                            compacted_wall_ns=time.time_ns(), seconds=seconds)
        target = prefix / manifest_path(p.session, p.run, p.path.name)
        make_dirs_under(prefix, target.parent)
        write_manifest(target, manifest)
        manifests.append(manifest)
    return manifests
