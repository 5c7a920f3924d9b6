"""DuckDB over a run (or several): the columnar copy plus the JSONL tail not yet compacted, as SQL tables.

``open_engine([run_dir, ...])`` gives an ``Engine`` whose connection has one view per table of docs/format.md
(``metrics``, ``events``, ``span_starts``, ``span_ends``, ``stats``, ``diagnostics``, ``processes``), plus
``windows`` (the training reports, flattened) and ``damage`` (torn and corrupt lines per process). For each segment
the reader takes its Parquet copy when the copy is valid (``compact.manifest_is_valid``), else its JSONL, parsed by
DuckDB with the reader's own rules (``columnar.typed_rows_sql``) into temporary tables: each segment is counted
once, from one source. A copy that is present but not valid (a Parquet file truncated mid-write, a JSONL file that
grew since) is ignored with a ``ColumnarWarning`` naming it. Memory is DuckDB's to bound (``memory_limit``, spilling
to a temporary directory), not the run's size.

``Engine.query`` runs a user's SQL read-only: one SELECT statement (anything else is refused before it runs), on a
connection whose external access is off except to the runs' own columnar directories, with its configuration locked.

``engine_for`` returns None when DuckDB is not installed (or ``TELEMETRAIN_ENGINE=python``): the readers then use
the pure-Python path, which gives the same numbers.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..identity import Identity
from .columnar import COLUMNS, PARTITIONS, PROCESS_TABLE, SCHEMA_VERSION, TABLES
from .compact import COLUMNAR_DIR, connect, convert_segment, manifest_is_valid, manifest_path, read_manifest
from .reader import fallback_identity, list_processes, read_run_meta

__all__ = ["ColumnarWarning", "Engine", "EngineUnavailable", "ReadOnlyQueryError", "engine_for", "open_engine"]

ENGINE_ENV = "TELEMETRAIN_ENGINE"  # "python": never use DuckDB (the fallback path); "duckdb": require it
MEMORY_LIMIT = os.environ.get("TELEMETRAIN_DUCKDB_MEMORY", "512MB")
ALL_TABLES = (*TABLES.values(), PROCESS_TABLE)


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


def engine_for(paths: Sequence[str | os.PathLike[str]]) -> Engine | None:
    """An engine over these run directories, or None when the pure-Python path is to be used."""
    if not engine_available():
        if os.environ.get(ENGINE_ENV, "").lower() == "duckdb":
            raise EngineUnavailable('TELEMETRAIN_ENGINE=duckdb but duckdb is not installed: '
                                    'pip install "telemetrain[columnar]"')
        return None
    return Engine([Path(p) for p in paths])


def open_engine(paths: Sequence[str | os.PathLike[str]]) -> Engine:
    """An engine over these run directories; ``EngineUnavailable`` without DuckDB."""
    try:
        import duckdb  # noqa: F401
    except ImportError:
        raise EngineUnavailable('SQL over runs needs DuckDB: pip install "telemetrain[columnar]"') from None
    return Engine([Path(p) for p in paths])


@dataclass
class RunInfo:
    path: Path
    session: str
    run: str
    meta: dict[str, Any]


def _sql_list(items: Iterable[str]) -> str:
    return "[" + ", ".join("'" + s.replace("'", "''") + "'" for s in items) + "]"


WINDOW_FIELDS = (
    ("current_iteration", "BIGINT"), ("window_iterations", "BIGINT"), ("avg_iteration_time_sec", "DOUBLE"),
    ("p50_iteration_time_sec", "DOUBLE"), ("p90_iteration_time_sec", "DOUBLE"), ("p99_iteration_time_sec", "DOUBLE"),
    ("max_iteration_time_sec", "DOUBLE"), ("total_iteration_time_sec", "DOUBLE"), ("samples_per_second", "DOUBLE"),
    ("avg_dataloader_time_sec", "DOUBLE"), ("avg_forward_time_sec", "DOUBLE"), ("avg_backward_time_sec", "DOUBLE"),
    ("avg_optimizer_time_sec", "DOUBLE"), ("avg_zero_grad_time_sec", "DOUBLE"),
)


class Engine:
    """A DuckDB connection over runs; see the module's docstring."""

    def __init__(self, run_dirs: Sequence[Path], *, memory_limit: str = MEMORY_LIMIT, threads: int = 2) -> None:
        self.runs = [self._info(p) for p in run_dirs]
        self._tmp = tempfile.TemporaryDirectory(prefix="telemetrain-duckdb-")
        self.con = connect(memory_limit=memory_limit, threads=threads)
        self.con.execute(f"SET temp_directory = '{self._tmp.name}'")
        self.parquet: dict[str, list[str]] = {t: [] for t in ALL_TABLES}
        self.ignored: list[str] = []  # copies not trusted, with why
        self.tail_segments = 0
        self.tail_bytes = 0
        self._damage: list[tuple[Any, ...]] = []
        self._create_tail_tables()
        for info in self.runs:
            self._add_run(info)
        self._create_views()
        self._locked = False

    # -- building ------------------------------------------------------------------------------------------------

    @staticmethod
    def _info(path: Path) -> RunInfo:
        meta = read_run_meta(path)
        return RunInfo(path, str(meta.get("session_tag") or path.parent.name or "unknown"),
                       str(meta.get("run_id") or path.name), meta)

    def _create_tail_tables(self) -> None:
        for table in ALL_TABLES:
            cols = ", ".join(f'"{n}" {t}' for n, t in COLUMNS[table] + PARTITIONS)
            self.con.execute(f"CREATE TEMP TABLE tail_{table} ({cols})")

    def _add_run(self, info: RunInfo) -> None:
        prefix = info.path / COLUMNAR_DIR
        for (agent, rank, pid), paths in sorted(list_processes(info.path).items()):
            identity: Identity | None = None
            torn = corrupt = 0
            for path in paths:
                manifest = read_manifest(prefix / manifest_path(info.session, info.run, path.name))
                why = "" if manifest is None else manifest_is_valid(manifest, prefix, path)
                if manifest is not None and not why:
                    for f in manifest.files:
                        self.parquet.setdefault(str(f["table"]), []).append(str(prefix / str(f["path"])))
                    torn += int(manifest.torn)
                    corrupt += int(manifest.corrupt)
                    if isinstance(manifest.last_identity, dict):
                        try:
                            identity = Identity.from_dict(manifest.last_identity)
                        except (TypeError, ValueError):
                            pass
                    continue
                if manifest is not None:
                    self.ignored.append(f"{path}: {why}")
                    warnings.warn(f"ignoring the columnar copy of {path} ({why}); reading the JSONL instead",
                                  ColumnarWarning, stacklevel=3)
                try:
                    identity, t, c = self._add_tail(info, path, identity)
                except OSError:
                    continue  # the file went away meanwhile
                torn += t
                corrupt += c
            self._damage.append((info.session, info.run, rank, pid, agent, torn, corrupt, len(paths)))

    def _add_tail(self, info: RunInfo, path: Path, identity: Identity | None) -> tuple[Identity, int, int]:
        from .segments import parse_segment_name

        name = parse_segment_name(path.name)
        fallback = identity or fallback_identity(path, info.meta)
        scan, seg = convert_segment(self.con, path, fallback, info.session, info.run,
                                    name.segment if name is not None else 0)
        for kind, table in TABLES.items():
            cols = ", ".join(f'"{n}"' for n, _ in COLUMNS[table] + PARTITIONS)
            self.con.execute(f"INSERT INTO tail_{table} ({cols}) SELECT {cols} FROM {seg} WHERE kind = '{kind}'")
        corrupt = self.con.execute(f"SELECT count(*) FROM {seg} WHERE kind IS NULL").fetchone()[0]
        self.con.execute(f"DROP TABLE {seg}")
        if scan.headers:
            import json

            rows = []
            for line, header in scan.headers:
                ident = next(i for start, i in reversed(scan.identities) if start <= line)
                mono, wall = header.get("mono_ns"), header.get("wall_ns")
                rows.append((*(getattr(ident, n) for n, _ in COLUMNS[PROCESS_TABLE][:8]),
                             name.segment if name is not None else 0, line,
                             mono if _i64(mono) else None, wall if _i64(wall) else None,
                             json.dumps(header, separators=(",", ":"), default=repr),
                             ident.session_tag, ident.run_id, ident.rank))
            marks = ", ".join("?" for _ in COLUMNS[PROCESS_TABLE] + PARTITIONS)
            self.con.executemany(f"INSERT INTO tail_{PROCESS_TABLE} VALUES ({marks})", rows)
        self.tail_segments += 1
        self.tail_bytes += scan.size
        return scan.identities[-1][1], scan.torn, int(corrupt) + scan.bad_headers

    def _create_views(self) -> None:
        hive = "{" + ", ".join(f"'{n}': {t}" for n, t in PARTITIONS) + "}"
        for table in ALL_TABLES:
            cols = ", ".join(f'"{n}"' for n, _ in COLUMNS[table] + PARTITIONS)
            files = self.parquet.get(table, [])
            parts = [f"SELECT {cols} FROM tail_{table}"]
            if files:
                parts.insert(0, f"SELECT {cols} FROM read_parquet({_sql_list(files)}, hive_partitioning = true, "
                                f"hive_types = {hive}, union_by_name = true)")
            self.con.execute(f"CREATE VIEW {table} AS " + " UNION ALL ".join(parts))
        self.con.execute("CREATE TEMP TABLE damage (session VARCHAR, run VARCHAR, rank BIGINT, pid BIGINT, "
                         "agent BOOLEAN, torn BIGINT, corrupt BIGINT, segments BIGINT)")
        if self._damage:
            self.con.executemany("INSERT INTO damage VALUES (?, ?, ?, ?, ?, ?, ?, ?)", self._damage)
        fields = ",\n  ".join(
            f"(CASE WHEN json_type(json_extract(attributes, '$.{n}')) IN ('BIGINT', 'UBIGINT') THEN "
            f"TRY_CAST(json_extract(attributes, '$.{n}') AS BIGINT) END) AS {n}" if t == "BIGINT" else
            f"(CASE WHEN json_type(json_extract(attributes, '$.{n}')) IN ('BIGINT', 'UBIGINT', 'DOUBLE') THEN "
            f"json_extract(attributes, '$.{n}')::DOUBLE END) AS {n}"
            for n, t in WINDOW_FIELDS)
        self.con.execute(f"""CREATE VIEW windows AS SELECT session, run, rank, pid, host, segment, line, wall_ns,
  {fields}, attributes
FROM events WHERE group_name = 'training' AND name = 'training_metrics_update' AND role <> 'agent'""")

    # -- using ---------------------------------------------------------------------------------------------------

    def execute(self, query: str, params: Any = None) -> Any:
        """Run one of telemetrain's own queries (a cursor: ``fetchall``, ``fetchmany``)."""
        return self.con.execute(query, params) if params is not None else self.con.execute(query)

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

    def table(self, name: str) -> Any:
        if name not in (*ALL_TABLES, "windows", "damage"):
            raise ValueError(f"no table {name!r}; the tables are {', '.join((*ALL_TABLES, 'windows', 'damage'))}")
        return self.con.table(name)

    def lock(self) -> None:
        """No file outside the runs' columnar copies, no configuration change, from now on."""
        if self._locked:
            return
        allowed = [str(info.path / COLUMNAR_DIR) + os.sep for info in self.runs]
        self.con.execute(f"SET allowed_directories = {_sql_list(allowed)}")
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


def _i64(value: Any) -> bool:
    return type(value) is int and -(2**63) <= value < 2**63


SCHEMA = SCHEMA_VERSION
