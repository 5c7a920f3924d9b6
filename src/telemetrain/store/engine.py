"""DuckDB over a run (or several): the columnar copy plus the JSONL tail not yet compacted, as SQL tables.

``open_engine([run_dir, ...])`` gives an ``Engine`` whose connection has one view per table of docs/format.md
(``metrics``, ``events``, ``span_starts``, ``span_ends``, ``stats``, ``diagnostics``, ``processes``, and the
derived ``reports``: the training reports' figures typed, ``report_rows``), plus ``windows`` (the reports of the
training processes) and ``damage`` (torn and corrupt lines per process). For each segment
the reader takes its Parquet copy when the copy is valid (``compact.manifest_is_valid``), else its JSONL, parsed by
DuckDB with the reader's own rules (``columnar.typed_rows_sql``) into temporary tables: each segment is counted
once, from one source. A copy that is present but not valid (a Parquet file truncated mid-write, a JSONL file that
grew since) is ignored with a ``ColumnarWarning`` naming it. Memory is DuckDB's to bound (``memory_limit``, spilling
to a temporary directory), not the run's size.

``Engine.query`` runs a user's SQL read-only: one SELECT statement (anything else is refused before it runs), on a
connection whose external access is off except to the runs' own columnar directories, with its configuration locked.

``engine_for`` returns None when DuckDB is not installed, ``TELEMETRAIN_ENGINE=python``, or the runs are small
(``SMALL_RUN_BYTES``; ``TELEMETRAIN_ENGINE=duckdb`` uses DuckDB whatever their size): the readers then use the
pure-Python path, which gives the same numbers.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..identity import Identity
from ..semconv import series_key
from .allocator import flush_freed_in_queries, purge_freed, trim_freed
from .codec import loads_column
from .columnar import PROCESS_TABLE, READABLE_SINCE, REPORTS_SINCE, TABLES
from .compact import COLUMNAR_DIR, connect
from .fetch import fetch as fetch_rows
from .manifest import manifest_is_valid, manifest_path, read_manifest
from .reader import fallback_identity, list_processes, read_run_meta
from .report_rows import REPORT_FIELDS_SINCE, REPORTS_TABLE
from .segments import parse_segment_name
from .tails import ProcessCounts, TailLoader
from .views import ALL_TABLES, Shared, create_tail_tables, create_views, insert_rows, sql_list, sql_str

__all__ = ["ColumnarWarning", "Engine", "EngineUnavailable", "ReadOnlyQueryError", "engine_for", "open_engine"]

ENGINE_ENV = "TELEMETRAIN_ENGINE"  # "python": never use DuckDB (the fallback path); "duckdb": require it
MEMORY_ENV = "TELEMETRAIN_DUCKDB_MEMORY"
# DuckDB's memory limit (it spills to a temporary directory past it). The readers' queries are streaming aggregates
# with small state, or run a group of ranks at a time: 128 MB bounds them whatever the run's size (a small run uses
# less of it, so a large run's peak RSS is still ~1.2x a small one's: docs/scale.md); a user's own queries
# (query, Run.sql) may sort or join whole tables, and get more.
READER_MEMORY = "128MB"
QUERY_MEMORY = "512MB"


def memory_limit(default: str) -> str:
    return os.environ.get(MEMORY_ENV) or default


class ColumnarWarning(UserWarning):
    """A columnar copy that cannot be trusted was ignored (its JSONL was read instead)."""


class EngineUnavailable(ImportError):
    """DuckDB is not installed (the ``columnar`` extra)."""


class ReadOnlyQueryError(ValueError):
    """A query that is not one read-only SELECT."""


def engine_available() -> bool:
    if os.environ.get(ENGINE_ENV, "").lower() == "python":
        return False
    try:
        import duckdb  # noqa: F401
    except ImportError:
        return False
    return True


# Runs this small are read by the pure-Python path even with DuckDB installed: it reads them before DuckDB has
# started, converted their files and planned its statements, in less memory (BENCHMARKS.md, "Small runs"): show of
# the demo's run (1 MiB) 0.35 s and 33 MiB against 1.1 s and 115 MiB; of 1,024 ranks of 2 KiB each 0.6 s against
# 1.2 s; of 2 ranks x 25,000 iterations (17 MiB, compacted) 2.4 s against 1.4 s, past the crossover. Up to
# SMALL_RUN_BYTES, or 1 MiB a file up to SMALL_FILES_BYTES (many small files, which the writer does not compact:
# DuckDB converts them itself, at about the Python reader's speed; the Python path's peak is ~3x the JSONL).
SMALL_RUN_BYTES = 8 << 20
SMALL_FILES_BYTES = 64 << 20
_PER_FILE_BYTES = 1 << 20
_RANK_PARTITION = re.compile(r"[/\\]rank=(\d+)[/\\]")  # a Parquet file's rank partition


def _small(paths: Sequence[str | os.PathLike[str]]) -> bool:
    """Whether the runs' process files are few and small enough for the Python path (see ``SMALL_RUN_BYTES``)."""
    total = files = 0
    for path in paths:
        try:
            groups = list_processes(Path(path))
        except OSError:
            return False  # (let the engine say what is wrong with it)
        for segments in groups.values():
            for f in segments:
                files += 1
                total += _size(f)
                if total > SMALL_FILES_BYTES:
                    return False
    return total <= max(SMALL_RUN_BYTES, min(SMALL_FILES_BYTES, files * _PER_FILE_BYTES))


def engine_for(paths: Sequence[str | os.PathLike[str]], progress: Any = None) -> Engine | None:
    """An engine over these run directories, or None when the pure-Python path is to be used: DuckDB is not installed,
    ``TELEMETRAIN_ENGINE=python``, or the runs are small (``SMALL_RUN_BYTES``) and ``TELEMETRAIN_ENGINE`` is not
    ``duckdb``. ``progress(what, done, total)`` is told how far reading the runs is (bytes)."""
    forced = os.environ.get(ENGINE_ENV, "").lower() == "duckdb"
    if not forced and _small(paths):  # (before DuckDB is imported: loading it alone costs ~16 MiB)
        return None
    if not engine_available():
        if forced:
            raise EngineUnavailable('TELEMETRAIN_ENGINE=duckdb but duckdb is not installed: '
                                    'pip install "telemetrain[columnar]"')
        return None
    return Engine([Path(p) for p in paths], progress=progress)


def open_engine(paths: Sequence[str | os.PathLike[str]]) -> Engine:
    """An engine over these run directories; ``EngineUnavailable`` without DuckDB."""
    try:
        import duckdb  # noqa: F401
    except ImportError:
        raise EngineUnavailable('SQL over runs needs DuckDB: pip install "telemetrain[columnar]"') from None
    return Engine([Path(p) for p in paths], memory=memory_limit(QUERY_MEMORY))


@dataclass
class RunInfo:
    path: Path
    session: str
    run: str
    meta: dict[str, Any]


def _no_file_cache(con: Any) -> None:
    """Turn off DuckDB's external file cache (1.3 and later). For local files it caches no data
    (``cache_local_files`` is off) but keeps an entry per file read, in the C heap, for the connection's life: ~1 KiB
    per Parquet file, so a reader of a 64-rank run's 2,700 files per run held ~0.5 MiB more for each table it scanned,
    growing with the run (docs/scale.md)."""
    import duckdb

    try:
        con.execute("SET enable_external_file_cache = false")
    except duckdb.Error:  # a DuckDB before the cache: nothing to turn off
        pass


class Engine:
    """A DuckDB connection over runs; see the module's docstring."""

    def __init__(self, run_dirs: Sequence[Path], *, memory: str | None = None, threads: int = 2,
                 progress: Any = None) -> None:
        self.runs: list[RunInfo] = []
        self._progress = progress
        self._tmp = tempfile.TemporaryDirectory(prefix="telemetrain-duckdb-")
        self.threads = threads
        limit = memory or memory_limit(READER_MEMORY)
        # the JSONL is converted under the readers' limit whatever the queries get afterwards (a user's query: 512
        # MB): converting thousands of small files under 512 MB held ~100 MiB more at the peak, no faster
        building = _smaller(limit, memory_limit(READER_MEMORY))
        self.con = connect(memory_limit=building, threads=threads)
        self.con.execute(f"SET temp_directory = '{self._tmp.name}'")
        flush_freed_in_queries(self.con)
        _no_file_cache(self.con)
        self.parquet: dict[str, list[str]] = {t: [] for t in ALL_TABLES}
        # table -> the files shared by a batch's segments (schema version 4; ``views.Shared``)
        self.shared: dict[str, Shared] = {}
        # the events files of version-2 copies, which have no reports table: their reports are typed at read time
        self.untyped_reports: list[str] = []
        # the reports files of copies older than a column of theirs (``report_rows.REPORT_FIELDS_SINCE``)
        self.older_reports: set[str] = set()
        self.ignored: list[str] = []  # copies not trusted, with why
        self._tails = TailLoader(self.con)
        # (run directory, agent, rank, pid) of the file names -> records, torn, corrupt, first header
        self.process_counts: dict[tuple[Path, bool, int, int], ProcessCounts] = {}
        # segment file -> (the offset up to which it was read, the identity in force there): where to follow it from
        self.read_to: dict[Path, tuple[int, Identity | None]] = {}
        # (table, session, run, pid, segment number) -> the Parquet files of the segments with that pid and number
        # (``fetch``; two ranks of one process share a pid: the rank filter tells their rows apart)
        self.segment_files: dict[tuple[str, str, str, int | None, int], list[str]] = {}  # pid None: any
        # the same by the rank of the file's partition too: ranks in containers (or on different hosts) often share
        # a pid, and a lookup by pid alone read every such rank's file for each row (2,048 ranks of one pid: 2,048
        # queries of 2,048 files each, minutes for the report's last values)
        self.rank_segment_files: dict[tuple[str, str, str, int, int, int], list[str]] = {}
        self._damage: list[tuple[Any, ...]] = []  # (session, run, rank, pid, agent, ProcessCounts, segments)
        self._locked = False
        create_tail_tables(self.con)
        self.add_runs(run_dirs)
        if building != limit:
            self.con.execute(f"SET memory_limit = '{limit}'")
        self._progress = None  # runs added later (a session's, for goodput) are not part of the bar

    # -- building ------------------------------------------------------------------------------------------------

    def add_runs(self, run_dirs: Sequence[Path]) -> None:
        """Bring more runs into the tables (a session's other runs, for goodput); runs already in are skipped."""
        if self._locked:
            raise RuntimeError("the engine is locked (a user query ran): open another to add runs")
        known = {info.path.resolve() for info in self.runs}
        added = False
        for path in run_dirs:
            if Path(path).resolve() in known:
                continue
            info = self._info(Path(path))
            self.runs.append(info)
            known.add(Path(path).resolve())
            self._add_run(info)
            added = True
        if added or not run_dirs:
            create_views(self.con, self.parquet, self.untyped_reports, self.shared, self.older_reports)

    def has_run(self, path: Path) -> bool:
        return any(info.path.resolve() == Path(path).resolve() for info in self.runs)

    @staticmethod
    def _info(path: Path) -> RunInfo:
        meta = read_run_meta(path)
        return RunInfo(path, str(meta.get("session_tag") or path.parent.name or "unknown"),
                       str(meta.get("run_id") or path.name), meta)

    def _add_run(self, info: RunInfo) -> None:
        prefix = info.path / COLUMNAR_DIR
        base = str(prefix)
        # in file-name order, as a listing shows them (for the progress callback)
        processes = sorted(list_processes(info.path).items(), key=lambda kv: kv[1][0].name)
        sizes = [sum(_size(f) for f in paths) for _, paths in processes]
        total, done = max(sum(sizes), 1), 0
        for ((agent, rank, pid), paths), size in zip(processes, sizes, strict=True):
            if self._progress is not None:
                self._progress(f"reading {paths[0].name}", done, total)
            done += size
            identity: Identity | None = None
            counts = ProcessCounts()
            for n, path in enumerate(paths):
                manifest = read_manifest(prefix / manifest_path(info.session, info.run, path.name),
                                         oldest=READABLE_SINCE)
                why = "" if manifest is None else manifest_is_valid(manifest, prefix, path, grown_ok=True)
                start = first_line = 0
                if manifest is not None and not why:
                    number = parse_segment_name(path.name)
                    for f in manifest.files:
                        # one string per file, shared by the lists below, joined as text: a Path per file would
                        # intern each of its parts (a 64-rank run has ~2,700 files; 1,024 ranks, ~43,000)
                        table, file = str(f["table"]), os.path.join(base, str(f["path"]))
                        source = f.get("source")
                        if isinstance(source, str):  # a file the segments of a batch share
                            entry = self.shared.setdefault(table, {}).setdefault(file, [int(f.get("segments", 0)), []])
                            entry[1].append((manifest.session, manifest.run, source))
                        else:
                            self.parquet.setdefault(table, []).append(file)
                        if manifest.schema_version < REPORTS_SINCE and table == TABLES["event"]:
                            self.untyped_reports.append(file)
                        if table == REPORTS_TABLE and manifest.schema_version < max(REPORT_FIELDS_SINCE.values()):
                            self.older_reports.add(file)
                        if number is not None:
                            self.segment_files.setdefault((table, info.session, info.run, pid, number.segment),
                                                          []).append(file)
                            self.segment_files.setdefault((table, info.session, info.run, None, number.segment),
                                                          []).append(file)
                            part = _RANK_PARTITION.search(file)
                            ranks = [int(part.group(1))] if part is not None and not isinstance(source, str) \
                                else [int(r) for r in f.get("ranks", ())] if isinstance(source, str) else []
                            for r in ranks:
                                self.rank_segment_files.setdefault(
                                    (table, info.session, info.run, r, pid, number.segment), []).append(file)
                    counts.records += sum(int(v) for t, v in manifest.records.items() if t != PROCESS_TABLE)
                    counts.corrupt += int(manifest.corrupt)
                    if isinstance(manifest.last_identity, dict):
                        try:
                            identity = Identity.from_dict(manifest.last_identity)
                        except (TypeError, ValueError):
                            pass
                    if n == 0 and counts.header is None:
                        counts.header = self._first_header(prefix, manifest)
                    try:
                        grown = path.stat().st_size > manifest.file_size
                    except OSError:
                        grown = False
                    if not grown:
                        counts.torn += int(manifest.torn)
                        self.read_to[path] = (int(manifest.covered_bytes), identity)
                        continue
                    start, first_line = int(manifest.covered_bytes), int(manifest.lines)  # read only what is new
                elif manifest is not None:
                    self.ignored.append(f"{path}: {why}")
                    warnings.warn(f"ignoring the columnar copy of {path} ({why}); reading the JSONL instead",
                                  ColumnarWarning, stacklevel=4)
                try:
                    scan = self._tails.add(path, identity or fallback_identity(path, info.meta), info.session,
                                           info.run, counts, start=start, first_line=first_line)
                except OSError:
                    continue  # the file went away meanwhile
                identity = scan.identities[-1][1]
                counts.torn += scan.torn
                self.read_to[path] = (scan.size, identity)
                if n == 0 and counts.header is None and scan.first_header:
                    counts.header = scan.first_header
            self.process_counts[(info.path.resolve(), agent, rank, pid)] = counts
            self._damage.append((info.session, info.run, rank, pid, agent, counts, len(paths)))
        self._tails.flush()  # (the counts are complete from here)
        if self._progress is not None:
            self._progress("read", total, total)
        insert_rows(self.con, "damage", [(*key, c.torn, c.corrupt, segments) for *key, c, segments in self._damage])
        self._damage = []

    def _first_header(self, prefix: Path, manifest: Any) -> dict[str, Any] | None:
        files = [f for f in manifest.files if f.get("table") == PROCESS_TABLE]
        if not files:
            return None
        source = files[0].get("source")
        where = f"WHERE source = {sql_str(source)}" if isinstance(source, str) else ""  # (a shared file)
        row = self.con.execute(f"SELECT header FROM read_parquet({sql_list([str(prefix / str(files[0]['path']))])}, "
                               f"hive_partitioning = false) {where} ORDER BY line LIMIT 1").fetchone()
        try:
            header = json.loads(row[0]) if row else None
        except ValueError:
            return None
        return header if isinstance(header, dict) else None

    def attach(self, run: Any) -> None:
        """Give the ``ProcessLog``s of ``run`` (a ``store.Run`` this engine reads) their record, torn and corrupt
        counts and header, so that asking for them does not read the files in Python."""
        base = Path(run.path).resolve()
        for log in run.processes + run.agents:
            counts = self.process_counts.get((base, log.agent, log.rank, log.pid))
            if counts is not None:
                log.set_counts(counts.records, counts.torn, counts.corrupt, counts.header or {})

    # -- using ---------------------------------------------------------------------------------------------------

    def series_keys(self, table: str, where: str) -> None:
        """The temporary table ``table`` (name, attributes, skey): ``semconv.series_key`` of every (name, attributes)
        of the metrics rows ``where`` selects (a few hundred pairs at most), so that SQL groups metrics by series as
        the Python readers do (a v2 record's attributes make its own series; v1 and v2 records of one series meet).
        The Python readers key by ``series_key`` only when a record has attributes; so does this."""
        pairs = self.rows(f"SELECT DISTINCT name, attributes FROM metrics WHERE {where}")
        self.execute(f"CREATE OR REPLACE TEMP TABLE {table} (name VARCHAR, attributes VARCHAR, skey VARCHAR)")
        keyed = []
        for name, text in pairs:
            attributes = loads_column(text)
            keyed.append((name, text, series_key(name, attributes) if isinstance(attributes, dict) and attributes
                          else name))
        insert_rows(self.con, table, keyed)

    @property
    def tail_segments(self) -> int:
        """How many segments (or grown parts of one) were read from their JSONL rather than a columnar copy."""
        return self._tails.segments

    @property
    def scratch(self) -> str:
        """A private directory of this engine's (removed at ``close``): where a reader may write files it reads back
        in the same session (a narrow table kept on disk rather than in DuckDB's memory)."""
        return self._tmp.name

    def temp_table(self, name: str, select: str) -> None:
        """(Re)create the temp table ``name`` as ``select``, the old one dropped first: a loop's ``CREATE OR
        REPLACE`` held the last group's table while the next was written (~14 MB of the findings' reports at
        64 ranks x 1M iterations)."""
        self.execute(f"DROP TABLE IF EXISTS {name}")
        self.execute(f"CREATE TEMP TABLE {name} AS {select}")

    @contextmanager
    def one_thread(self) -> Iterator[None]:
        """The queries within on one DuckDB thread: for a group of ranks' small queries (a few ten thousand rows),
        where each thread's own hash tables and scan buffers, not the rows, made the peak (64 ranks x 1M
        iterations: ``compare`` -7 MiB, ``show`` -8 MiB with every query on one thread, for +50% time; these queries
        are a few percent of it). Switching costs ~1 ms."""
        if self.threads == 1:
            yield
            return
        self.con.execute("SET threads = 1")
        try:
            yield
        finally:
            self.con.execute(f"SET threads = {int(self.threads)}")

    def execute(self, query: str, params: Any = None) -> Any:
        """Run one of telemetrain's own queries (a cursor: ``fetchall``, ``fetchmany``). What the queries before it
        freed is handed back to the system first, past a few MiB (``allocator.purge_freed`` for DuckDB's jemalloc,
        ``allocator.trim_freed`` for the C heap): its peak does not stand on theirs."""
        purge_freed()
        trim_freed()
        return self.con.execute(query, params) if params is not None else self.con.execute(query)

    def release_freed(self) -> None:
        """Hand back to the system all that the queries so far freed, whatever its size: for a reader whose queries
        are done for a while, before work in Python (the findings engine's windows). ``execute`` keeps up to
        ``allocator.PURGE_PAST`` freed between queries, for the next query to reuse; held through the Python work,
        it stood under that work's peak (the report on 64 ranks x 1M iterations: 0-12 MiB, run to run)."""
        purge_freed(0)
        trim_freed(0)

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        return list(self.execute(query, params).fetchall())

    def scalar(self, query: str, params: Any = None) -> Any:
        row = self.execute(query, params).fetchone()
        return None if row is None else row[0]

    def stream(self, query: str, params: Any = None, size: int = 10_000) -> Any:
        """Rows of ``query`` in batches (bounded memory); yields (column names, rows)."""
        cur = self.execute(query, params)
        names = [d[0] for d in cur.description]
        while True:
            batch = cur.fetchmany(size)
            if not batch:
                return
            yield names, batch

    def fetch(self, table: str, keys: Iterable[tuple[str, str, int, int, int, int]]) -> tuple[list[str], list[Any]]:
        """The rows of ``table`` at these positions, (session, run, rank, pid, segment, line): each from the Parquet
        file of its segment (or the JSONL tail), a small query per segment up to ``fetch.FETCH_APART`` segments (so
        that finding a few rows costs reading a few row groups, not the table), one query for all past that.
        Returns (column names, rows), partitions included."""
        return fetch_rows(self, table, keys)

    def table(self, name: str) -> Any:
        if name not in (*ALL_TABLES, "windows", "damage"):
            raise ValueError(f"no table {name!r}; the tables are {', '.join((*ALL_TABLES, 'windows', 'damage'))}")
        return self.con.table(name)

    def lock(self) -> None:
        """No file outside the runs' columnar copies, no configuration change, from now on."""
        if self._locked:
            return
        allowed = [str(info.path / COLUMNAR_DIR) + os.sep for info in self.runs]
        self.con.execute(f"SET allowed_directories = {sql_list(allowed)}")
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")
        self._locked = True

    def query(self, sql: str, params: Any = None) -> Any:
        """A user's query, read-only: exactly one SELECT; returns a DuckDB relation (``fetchall``, ``arrow``,
        ``df``)."""
        import duckdb

        try:
            statements = duckdb.extract_statements(sql)
        except duckdb.Error as exc:
            raise ReadOnlyQueryError(f"cannot parse the query: {exc}") from None
        if len(statements) != 1:
            raise ReadOnlyQueryError(f"expected one SELECT statement, got {len(statements)}")
        kind = statements[0].type
        if kind != duckdb.StatementType.SELECT:
            raise ReadOnlyQueryError(f"only SELECT queries are allowed (this is {kind.name}): the run is read-only")
        self.lock()
        return self.con.sql(sql, params=params) if params is not None else self.con.sql(sql)

    sql = query

    def close(self) -> None:
        try:
            self.con.close()
        finally:
            self._tmp.cleanup()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*", re.IGNORECASE)


def _smaller(a: str, b: str) -> str:
    """The smaller of two DuckDB memory sizes ("512MB", "1GiB"); ``a`` when either is not such a size."""
    sizes = []
    for text in (a, b):
        m = _SIZE.fullmatch(text)
        if m is None:
            return a
        base = 1024 if m.group(3) else 1000
        sizes.append(float(m.group(1)) * base ** " KMGT".index(m.group(2).upper()) if m.group(2) else float(m.group(1)))
    return b if sizes[1] < sizes[0] else a


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0

