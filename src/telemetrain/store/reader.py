"""Read a run directory back: every rank and process, in time order, tolerating a crash.

A line cut short by a crash (no final newline) is skipped and counted as ``torn``; a complete line that does not
decode is skipped and counted as ``corrupt``; everything else is loaded. Nothing here executes or unpickles data.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..identity import Identity
from .codec import decode_line, untag_nonfinite
from .layout import RUN_META, is_agent_file, is_process_file

__all__ = ["NotARunError", "ProcessLog", "Run", "find_runs", "open_run"]

_FILE_RE = re.compile(r"^(?:rank|agent)-(\d+)\.(\d+)\.jsonl$")


class NotARunError(ValueError):
    """The directory exists but holds no telemetrain run."""


@dataclasses.dataclass
class ProcessLog:
    """One process file and what reading it found."""

    path: Path
    identity: Identity
    header: dict[str, Any]
    records: list[Any]
    torn: int = 0  # a last line cut short (crash while writing)
    corrupt: int = 0  # complete lines that did not decode

    @property
    def rank(self) -> int:
        return self.identity.rank

    @property
    def pid(self) -> int:
        return self.identity.pid


def _fallback_identity(path: Path, meta: dict[str, Any]) -> Identity:
    """For a file whose header line is missing or torn: what the file name and run.json tell."""
    m = _FILE_RE.match(path.name)
    rank, pid = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    world = max(int(meta.get("world_size", 1) or 1), rank + 1)
    return Identity(
        run_id=str(meta.get("run_id") or path.parent.name),
        session_tag=str(meta.get("session_tag") or path.parent.parent.name or "unknown"),
        perf_tag=str(meta.get("perf_tag") or "unknown"),
        rank=rank,
        local_rank=0,
        world_size=world,
        host="unknown",
        pid=pid,
    )


def read_process_file(path: Path, meta: dict[str, Any] | None = None) -> ProcessLog:
    meta = meta or {}
    identity: Identity | None = None
    header: dict[str, Any] = {}
    records: list[Any] = []
    torn = corrupt = 0
    with open(path, "rb") as fh:
        data = fh.read()
    lines = data.split(b"\n")
    last = lines.pop()  # b"" when the file ends with a newline, else a torn line
    if last.strip():
        torn = 1
    for raw in lines:
        if not raw.strip():
            continue
        if identity is None:
            try:
                obj = json.loads(raw)
                if isinstance(obj, dict) and obj.get("kind") == "process":
                    identity = Identity.from_dict(obj["identity"])
                    header = obj
                    continue
            except (ValueError, KeyError, TypeError):
                pass
            identity = _fallback_identity(path, meta)
        try:
            rec = decode_line(raw, identity)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            corrupt += 1
            continue
        if isinstance(rec, dict):  # a later process header (identity changed within the file)
            try:
                identity = Identity.from_dict(rec["identity"])
            except (KeyError, TypeError, ValueError):
                corrupt += 1
            continue
        records.append(rec)
    if identity is None:
        identity = _fallback_identity(path, meta)
    return ProcessLog(path=path, identity=identity, header=header, records=records, torn=torn, corrupt=corrupt)


class Run:
    """A run directory: ``run.json`` plus one file per process.

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

    def records(self, kinds: Iterable[str] | str | None = None, *, agents: bool = False) -> list[Any]:
        """All records of all processes (and of the agents, with ``agents=True``), ordered by wall time (ties: rank,
        then pid, then file order)."""
        return list(self.iter_records(kinds, agents=agents))

    def iter_records(self, kinds: Iterable[str] | str | None = None, *, agents: bool = False) -> Iterator[Any]:
        wanted = None if kinds is None else ({kinds} if isinstance(kinds, str) else set(kinds))
        streams = []
        for i, p in enumerate(self.processes + self.agents if agents else self.processes):
            recs = p.records if wanted is None else [r for r in p.records if r.kind in wanted]
            # Within a process, threads may enqueue a hair out of order, and a record emitted with its own wall time
            # may come late: sort each file by wall time (monotonic time breaking ties), then merge.
            recs = sorted(recs, key=lambda r: (r[1], r[0]))
            streams.append(((r[1], p.rank, p.pid, i, n, r) for n, r in enumerate(recs)))
        for item in heapq.merge(*streams):
            yield item[-1]

    def __len__(self) -> int:
        return sum(len(p.records) for p in self.processes)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, processes={len(self.processes)}, records={len(self)})"


def _read_meta(path: Path) -> dict[str, Any]:
    meta_path = path / RUN_META
    if not meta_path.exists():
        return {}
    try:
        meta = untag_nonfinite(json.loads(meta_path.read_text()))
    except (OSError, ValueError, KeyError):
        return {}
    return meta if isinstance(meta, dict) else {}


def open_run(path: str | os.PathLike[str]) -> Run:
    """Load a run directory. Raises ``FileNotFoundError`` for a missing path and ``NotARunError`` for a directory
    that holds no run (the message names what was expected)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such run directory: {p}")
    if not p.is_dir():
        raise NotARunError(f"{p} is a file; a run is a directory holding run.json and rank-<R>.<pid>.jsonl files")
    files = sorted(f for f in p.iterdir() if f.is_file() and is_process_file(f.name))
    meta = _read_meta(p)
    if not files and not meta:
        hint = ""
        nested = find_runs(p)
        if nested:
            hint = f"; it contains {len(nested)} run(s), e.g. {nested[-1]}"
        raise NotARunError(f"{p} is not a telemetrain run directory (no run.json, no rank-*.jsonl){hint}")
    logs = [read_process_file(f, meta) for f in files]
    logs.sort(key=lambda pl: (pl.rank, pl.pid))
    agents = [log for log in logs if is_agent_file(log.path.name)]
    return Run(p, meta, [log for log in logs if not is_agent_file(log.path.name)], agents)


def find_runs(root: str | os.PathLike[str]) -> list[Path]:
    """Run directories under ``root`` (a store root, a session directory or a run), oldest first."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = []
    for dirpath, _dirnames, filenames in os.walk(base):
        if RUN_META in filenames or any(is_process_file(f) for f in filenames):
            found.append(Path(dirpath))
    return sorted(found, key=lambda d: (_read_meta(d).get("created_wall_ns", 0), str(d)))
