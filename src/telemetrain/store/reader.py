"""Read a run directory back: every rank and process, in time order, tolerating a crash and damage.

A line cut short by a crash (no final newline) is skipped and counted as ``torn``; a complete line that does not
decode -- broken JSON, a field of the wrong type, or longer than ``layout.MAX_LINE_BYTES`` (streamed past, never
held whole) -- is skipped and counted as ``corrupt``; everything else is loaded. A damaged ``run.json`` is read for
what is usable in it (``read_run_meta``). Nothing here executes or unpickles data.

A process's records may span several segment files (``store.segments``); a ``ProcessLog`` is one process, its
segments read in order. Records are read when first asked for, so ``open_run`` itself only lists the files.
With the ``columnar`` extra, ``Run.sql`` / ``Run.to_arrow`` / ``Run.to_pandas`` query the run with DuckDB
(``store.engine``) without loading it into Python.
"""

from __future__ import annotations

import heapq
import json
import os
import stat
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from .._version import __version__
from ..identity import Identity
from .codec import INT64_MAX, READ_VERSIONS, decode_identity, decode_line, untag_nonfinite
from .layout import FORMAT_VERSION, MAX_LINE_BYTES, RUN_META, is_agent_file, skip_rest_of_line
from .segments import SegmentName, parse_segment_name, process_segments

__all__ = ["FormatVersionError", "NotARunError", "ProcessLog", "Run", "check_run_format", "find_runs", "in_start_order",
           "open_run", "read_run_meta"]


class NotARunError(ValueError):
    """The directory exists but holds no telemetrain run."""


class FormatVersionError(NotARunError):
    """The run was written by a newer telemetrain, in a format version this one does not read."""


def check_run_format(path: Path) -> None:
    """``check_format_version`` for the run directory ``path`` (for readers that do not go through ``open_run``)."""
    groups = list_processes(path) if path.is_dir() else {}
    check_format_version(path, read_run_meta(path), min((paths[0] for paths in groups.values()), default=None))


def check_format_version(path: Path, meta: dict[str, Any], first_file: Path | None) -> None:
    """Raise ``FormatVersionError`` when ``run.json`` (``meta``) or the header of ``first_file`` says a format version
    newer than this telemetrain reads: else every line would read as "corrupt", and the run as empty."""
    found: list[tuple[str, int, int]] = []
    version = meta.get("v")
    if type(version) is int and version > FORMAT_VERSION:
        found.append((RUN_META, version, FORMAT_VERSION))
    if first_file is not None:
        try:
            with open(first_file, "rb") as fh:
                header = json.loads(fh.readline(1 << 20))
        except (OSError, ValueError, RecursionError):
            header = None
        line_version = header.get("v") if type(header) is dict and header.get("kind") == "process" else None
        if type(line_version) is int and line_version > max(READ_VERSIONS):
            found.append((first_file.name, line_version, max(READ_VERSIONS)))
    if found:
        name, version, newest = found[0]
        raise FormatVersionError(f"{path} was written by a newer telemetrain: {name} has format version {version}, "
                                 f"this telemetrain ({__version__}) reads up to {newest}; upgrade telemetrain to read "
                                 "it")


class ProcessLog:
    """One process of a run: its segment files (in order) and what reading them found. ``records``, ``header``,
    ``torn`` and ``corrupt`` are read on first use."""

    def __init__(self, paths: list[Path], meta: dict[str, Any] | None = None, *,
                 records: list[Any] | None = None) -> None:
        self.paths = paths
        self.path = paths[0]
        self._meta = meta or {}
        self._name: SegmentName | None = parse_segment_name(self.path.name)
        self._records = records
        self._identity: Identity | None = None
        self._header: dict[str, Any] = {}
        self._torn = self._corrupt = 0
        self._count: int | None = None  # records, when known without reading them (set_counts)
        self._start: int | None = None  # the first header's wall time (start_wall_ns)
        self._process_start: Any = None  # the first header's process_start (liveness.same_process)

    @property
    def agent(self) -> bool:
        return is_agent_file(self.path.name)

    @property
    def identity(self) -> Identity:
        if self._identity is None:
            self._identity = self._first_identity()
        return self._identity

    @property
    def header(self) -> dict[str, Any]:
        if self._count is None:
            self._load()
        return self._header

    @property
    def records(self) -> list[Any]:
        return self._load()

    @property
    def record_count(self) -> int:
        """How many records the process wrote (without reading them when the SQL engine counted them)."""
        if self._records is None and self._count is not None:
            return self._count
        return len(self._load())

    @property
    def torn(self) -> int:
        if self._count is None:
            self._load()
        return self._torn

    @property
    def corrupt(self) -> int:
        if self._count is None:
            self._load()
        return self._corrupt

    def set_counts(self, records: int, torn: int, corrupt: int, header: dict[str, Any]) -> None:
        """What the SQL engine counted (``store.engine.Engine.attach``): the readers that go through it then never
        read this process's files in Python."""
        if self._records is None:
            self._count, self._torn, self._corrupt, self._header = records, torn, corrupt, header

    @property
    def rank(self) -> int:
        return self._name.rank if self._name is not None else self.identity.rank

    @property
    def pid(self) -> int:
        return self._name.pid if self._name is not None else self.identity.pid

    @property
    def start_wall_ns(self) -> int:
        """The wall time of the process's first header (its start), read from the first line only; 0 when unknown.
        Readers that follow a series' steps across the processes of a run (a restart that rolls back: the report's
        curves) take them in this order: the file names' order is the pids', which a restart need not raise."""
        if self._start is None:
            self._first_identity()
        return self._start or 0

    @property
    def process_start(self) -> Any:
        """The first header's ``process_start`` (the writer's start, ``liveness.process_start``), read from the first
        line only; None when it has none (written before it was recorded, or not known where it ran)."""
        if self._start is None:
            self._first_identity()
        return self._process_start

    def _first_identity(self) -> Identity:
        """The identity of the first header, read without loading the file (the first line only)."""
        self._start = 0
        try:
            with open(self.path, "rb") as fh:
                first = fh.readline(1 << 20)
            if first.endswith(b"\n"):
                header = json.loads(first)
                wall = header.get("wall_ns") if isinstance(header, dict) else None
                self._start = wall if type(wall) is int else 0
                self._process_start = header.get("process_start") if isinstance(header, dict) else None
                return decode_identity(header)
        except (OSError, ValueError, RecursionError):
            pass
        return fallback_identity(self.path, self._meta)

    def _load(self) -> list[Any]:
        if self._records is None:
            self._torn = self._corrupt = 0
            self._count = None
            records: list[Any] = []
            identity: Identity | None = None
            for n, path in enumerate(self.paths):
                identity, torn, corrupt, header = read_segment(path, self._meta, records, identity)
                if n == 0 and header:
                    self._header = header
                self._torn += torn
                self._corrupt += corrupt
            self._records = records
            if identity is not None and self._identity is None:
                self._identity = identity
        return self._records


def fallback_identity(path: Path, meta: dict[str, Any]) -> Identity:
    """For a file whose header line is missing or damaged: what the file name and run.json tell."""
    name = parse_segment_name(path.name)
    rank, pid = (name.rank, name.pid) if name is not None else (0, 0)
    world = meta.get("world_size")
    world = max(world if type(world) is int else 1, rank + 1)
    return Identity(
        run_id=str(meta.get("run_id") or path.parent.name or "unknown"),
        session_tag=str(meta.get("session_tag") or path.parent.parent.name or "unknown"),
        perf_tag=str(meta.get("perf_tag") or "unknown"),
        rank=min(rank, INT64_MAX - 1),
        local_rank=0,
        world_size=min(world, INT64_MAX),
        host="unknown",
        pid=min(pid, INT64_MAX),
        role="agent" if name is not None and name.agent else "",
    )


def read_segment(path: Path, meta: dict[str, Any], into: list[Any],
                 identity: Identity | None = None) -> tuple[Identity | None, int, int, dict[str, Any]]:
    """Append the records of one segment file to ``into``; returns (the identity in force at its end, torn, corrupt,
    its first header). ``identity``: the one in force before it (the previous segment's), for a lost header."""
    scan = SegmentScan(path, meta, identity)
    into.extend(scan)
    return scan.identity, scan.torn, scan.corrupt, scan.header


class SegmentScan:
    """The records of one segment file, streamed line by line; with ``wanted``, only the lines for which
    ``wanted(raw_line)`` is true are decoded (a cheap byte test that lets a reader skip the bulk of a file).
    ``torn``, ``corrupt`` (of the decoded lines), ``header`` and ``identity`` are known once iterated."""

    def __init__(self, path: Path, meta: dict[str, Any], identity: Identity | None = None,
                 wanted: Any = None) -> None:
        self.path = path
        self.meta = meta
        self.identity = identity
        self.wanted = wanted
        self.header: dict[str, Any] = {}
        self.torn = self.corrupt = 0

    def __iter__(self) -> Iterator[Any]:
        for _, rec in self.numbered():
            yield rec

    def numbered(self) -> Iterator[tuple[int, Any]]:
        """(line number, record): line numbers count every complete line from 0, as the columnar copy's do."""
        wanted = self.wanted
        first = True
        with open(self.path, "rb") as fh:
            # at most MAX_LINE_BYTES and its newline at a time: a longer line is never held whole
            for n, raw in enumerate(iter(partial(fh.readline, MAX_LINE_BYTES + 1), b"")):
                if raw[-1:] != b"\n":  # the last line, cut short by a crash (or still being written), or too long
                    if len(raw) > MAX_LINE_BYTES and skip_rest_of_line(fh) is not None:
                        first, self.corrupt = False, self.corrupt + 1
                        continue
                    if raw.strip():
                        self.torn = 1
                    break
                if first or b'"process"' in raw:
                    if not raw.strip():
                        continue
                    is_first, first = first, False
                    try:
                        obj = json.loads(raw)
                    except (ValueError, RecursionError):
                        obj = None
                    if type(obj) is dict and obj.get("kind") == "process":
                        try:
                            self.identity = decode_identity(obj)
                        except ValueError:
                            self.corrupt += 1
                        else:
                            if is_first:
                                self.header = obj
                        continue
                if wanted is not None and not wanted(raw):
                    continue
                if not raw.strip():
                    continue
                if self.identity is None:
                    self.identity = fallback_identity(self.path, self.meta)
                try:
                    rec = decode_line(raw, self.identity)
                except ValueError:
                    self.corrupt += 1
                    continue
                if type(rec) is dict:  # a header that only decoding revealed (escaped characters): not trusted
                    self.corrupt += 1
                    continue
                yield n, rec


def scan_process(paths: list[Path], meta: dict[str, Any], wanted: Any = None) -> Iterator[Any]:
    """The records of one process (its segments in order); see ``SegmentScan`` for ``wanted``."""
    identity: Identity | None = None
    for path in paths:
        scan = SegmentScan(path, meta, identity, wanted)
        try:
            yield from scan
        except OSError:  # the file went away meanwhile (a run being cleaned up): what was read stands
            pass
        identity = scan.identity


def read_process_file(path: Path, meta: dict[str, Any] | None = None) -> ProcessLog:
    """One segment file read alone, as a ``ProcessLog``."""
    log = ProcessLog([path], meta)
    log._load()
    return log


class Run:
    """A run directory: ``run.json`` plus one file (or several segments) per process.

    ``processes`` are the training processes (ranks and their forked children); ``agents`` the elastic agents of
    ``telemetrain launch`` (one per node and attempt), kept apart so that per-rank analyses never mistake an agent for
    a rank. ``records(..., agents=True)`` merges both.
    """

    def __init__(
        self, path: Path, meta: dict[str, Any], processes: list[ProcessLog], agents: list[ProcessLog] | None = None
    ) -> None:
        self.path = path
        self.meta = meta
        self.processes = processes
        self.agents = agents or []
        self._engine: Any = None

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id") or self.path.name)

    @property
    def session_tag(self) -> str:
        return str(self.meta.get("session_tag") or self.path.parent.name)

    @property
    def perf_tag(self) -> str:
        return str(self.meta.get("perf_tag") or (self.processes[0].identity.perf_tag if self.processes else ""))

    @property
    def ranks(self) -> list[int]:
        return sorted({p.rank for p in self.processes})

    @property
    def torn(self) -> int:
        return sum(p.torn for p in self.processes + self.agents)

    @property
    def corrupt(self) -> int:
        return sum(p.corrupt for p in self.processes + self.agents)

    @property
    def files(self) -> list[Path]:
        """Every segment file of the run, agents' included."""
        return [f for p in self.processes + self.agents for f in p.paths]

    def records(self, kinds: Iterable[str] | str | None = None, *, agents: bool = False) -> list[Any]:
        """All records of all processes (and of the agents, with ``agents=True``): each process in monotonic-time
        order, the processes merged by wall time (ties: rank, then pid, then file order)."""
        return list(self.iter_records(kinds, agents=agents))

    def iter_records(self, kinds: Iterable[str] | str | None = None, *, agents: bool = False) -> Iterator[Any]:
        wanted = None if kinds is None else ({kinds} if isinstance(kinds, str) else set(kinds))
        lists: list[list[Any]] = []
        streams = []
        for i, p in enumerate(self.processes + self.agents if agents else self.processes):
            recs = p.records if wanted is None else [r for r in p.records if r.kind in wanted]
            # Within a process, threads may enqueue a hair out of order, and a record emitted with its own time may
            # come late: sort each process by monotonic time (stable), not wall time, which a clock step moves back.
            # Its monotonic clock is one per host and boot: a file that another host (or a later attempt) appended to
            # under the same rank and pid keeps their records in the order they first appear. Then merge. The merge
            # key (wall, rank, pid, stream, position) is total, so two records are never compared themselves.
            recs = _in_process_order(recs)
            lists.append(recs)
            streams.append(_keys(recs, p.rank, p.pid, i))
        for key in heapq.merge(*streams):
            yield lists[key[3]][key[4]]

    def engine(self) -> Any:
        """The DuckDB engine over this run (``store.engine.Engine``; needs the ``columnar`` extra), made once."""
        if getattr(self, "_engine", None) is None:
            from .engine import open_engine

            self._engine = open_engine([self.path])
        return self._engine

    def sql(self, query: str, params: Any = None) -> Any:
        """Run one read-only SELECT over this run's tables with DuckDB (the ``columnar`` extra); returns a DuckDB
        relation (``.fetchall()``, ``.arrow()``, ``.df()``). docs/format.md lists the tables; anything but a SELECT,
        and any file outside the run, is refused."""
        return self.engine().query(query, params)

    def to_arrow(self, table: str = "metrics") -> Any:
        """One table of the run as a ``pyarrow.Table`` (needs the ``columnar`` extra)."""
        result = self.engine().table(table).arrow()
        return result.read_all() if hasattr(result, "read_all") else result

    def to_pandas(self, table: str = "metrics") -> Any:
        """One table of the run as a ``pandas.DataFrame`` (needs the ``columnar`` extra and pandas)."""
        return self.engine().table(table).df()

    def __len__(self) -> int:
        return sum(p.record_count for p in self.processes)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, processes={len(self.processes)})"


def _in_process_order(recs: list[Any]) -> list[Any]:
    """One process's records in monotonic-time order, each (host, attempt) kept together in file order."""
    epochs: dict[tuple[str, int], int] = {}
    return sorted(recs, key=lambda r: (epochs.setdefault((r.identity.host, r.identity.restart_count), len(epochs)),
                                       r[0]))


def _keys(recs: list[Any], rank: int, pid: int, i: int) -> Iterator[tuple[int, int, int, int, int]]:
    return ((r[1], rank, pid, i, n) for n, r in enumerate(recs))


_META_STR = ("run_id", "session_tag", "perf_tag", "format")
_META_INT = ("world_size", "restart_count", "created_wall_ns", "v")


def read_run_meta(path: Path) -> dict[str, Any]:
    """``run.json`` of a run directory, keeping only what is usable: a name that is not a non-empty string without
    ``/``, a count that is not a 64-bit integer (``world_size`` >= 1), a ``config`` that is not an object are dropped;
    an unreadable file (missing, not JSON, nested too deeply) reads as ``{}``."""
    try:  # non-blocking, a plain file only: a FIFO planted as run.json would hold every reader for ever
        with os.fdopen(os.open(path / RUN_META, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as fh:
            data = fh.read(16 << 20) if stat.S_ISREG(os.fstat(fh.fileno()).st_mode) else b""
        meta = untag_nonfinite(json.loads(data))
    except (OSError, ValueError, RecursionError):
        return {}
    if type(meta) is not dict:
        return {}
    for key in _META_STR:
        value = meta.get(key)
        if key in meta and (type(value) is not str or not value or "/" in value or value in (".", "..")):
            del meta[key]
    for key in _META_INT:
        value = meta.get(key)
        if key in meta and (type(value) is not int or not 0 <= value <= INT64_MAX or
                            (key == "world_size" and value < 1)):
            del meta[key]
    for key in ("config", "created_by", "versions", "hardware"):
        if key in meta and type(meta[key]) is not dict:
            del meta[key]
    return meta


def in_start_order(logs: Iterable[ProcessLog]) -> list[ProcessLog]:
    """``logs`` by rank (as listed), then each rank's by their start (``ProcessLog.start_wall_ns``) and pid: the
    order each rank's records were written in."""
    return sorted(logs, key=lambda log: (log.rank, log.start_wall_ns, log.pid))


def list_processes(p: Path) -> dict[tuple[bool, int, int], list[Path]]:
    """The run directory's process files: (agent, rank, pid) -> its segment files in order."""
    return process_segments(f for f in p.iterdir() if f.is_file())


def open_run(path: str | os.PathLike[str]) -> Run:
    """Open a run directory (its records are read when first asked for). Raises ``FileNotFoundError`` for a missing
    path and ``NotARunError`` for a directory that holds no run (the message names what was expected), or
    ``FormatVersionError`` (a ``NotARunError``) for one written by a newer telemetrain."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such run directory: {p}")
    if not p.is_dir():
        raise NotARunError(f"{p} is a file; a run is a directory holding run.json and rank-<R>.<pid>.jsonl files")
    groups = list_processes(p)
    meta = read_run_meta(p)
    if not groups and not meta and not (p / RUN_META).exists():
        hint = ""
        nested = find_runs(p)
        if nested:
            hint = f"; it contains {len(nested)} run(s), e.g. {nested[-1]}"
        raise NotARunError(f"{p} is not a telemetrain run directory (no run.json, no rank-*.jsonl){hint}")
    check_format_version(p, meta, min((paths[0] for paths in groups.values()), default=None))
    logs = [ProcessLog(paths, meta) for _, paths in sorted(groups.items())]
    return Run(p, meta, [log for log in logs if not log.agent], [log for log in logs if log.agent])


def find_runs(root: str | os.PathLike[str]) -> list[Path]:
    """Run directories under ``root`` (a store root, a session directory or a run), oldest first."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]  # the columnar copy, temp files
        if RUN_META in filenames or any(parse_segment_name(f) is not None for f in filenames):
            found.append(Path(dirpath))

    def created(d: Path) -> int:
        value = read_run_meta(d).get("created_wall_ns", 0)
        return value if type(value) is int else 0

    return sorted(found, key=lambda d: (created(d), str(d)))
