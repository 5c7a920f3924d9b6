"""The run store writer: one append-only JSONL file per process.

Runs in its own background thread (see ``dispatch``). Each batch is encoded into one string and handed to the
kernel with ``os.write`` on an ``O_APPEND`` descriptor: there is no user-space buffer, so a batch is on its way to
disk when ``write`` returns, a SIGKILL loses at most what is still queued, and a forked child has nothing of the
parent's to flush twice. The file is chosen from the identity of the records it receives, so a forked child (new
pid) writes its own file, and a file is never truncated.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._version import __version__
from ..identity import Identity
from ..records import PackedSource
from ..store.codec import ENCODERS, encode, encode_header, tag_nonfinite
from ..store.compactor import BackgroundCompactor
from ..store.layout import AGENT_ROLE, RUN_META, default_root, process_file_name, run_dir
from ..store.segments import parse_segment_name, segment_file_name
from .base import Sink

# A process's log is cut into segments (store/segments.py) so that each closed one can be compacted to the columnar
# copy on its own; the environment overrides are for tests and benchmarks.
SEGMENT_BYTES = int(os.environ.get("TELEMETRAIN_SEGMENT_BYTES") or 64 << 20)
SEGMENT_SECONDS = float(os.environ.get("TELEMETRAIN_SEGMENT_SECONDS") or 3600.0)
# At close, the last segment is compacted only if the process wrote at least this much: a smaller tail reads as fast
# from its JSONL. "0" compacts every close; TELEMETRAIN_COMPACT=0 (or RunStoreSink(compact=False)) turns the writer's
# compaction off (store/compactor.py says how it stays out of training's way).
COMPACT_MIN_BYTES = int(os.environ.get("TELEMETRAIN_COMPACT_MIN_BYTES") or 1 << 20)


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "telemetrain": __version__}
    torch = sys.modules.get("torch")  # never import torch ourselves: it is heavy and may not be installed
    if torch is not None and hasattr(torch, "__version__"):
        versions["torch"] = str(torch.__version__)
    return versions


def write_run_meta(directory: Path, identity: Identity, config: Mapping[str, Any] | None) -> bool:
    """Create ``run.json`` once per run; the first process to get there wins, atomically. True if we created it."""
    target = directory / RUN_META
    if target.exists():
        return False
    meta = {
        "format": "telemetrain-run",
        "v": 1,
        "run_id": identity.run_id,
        "session_tag": identity.session_tag,
        "perf_tag": identity.perf_tag,
        "world_size": identity.world_size,
        "restart_count": identity.restart_count,
        "created_wall_ns": time.time_ns(),
        "created_by": identity.as_dict(),
        "versions": _versions(),
        "hardware": {
            "host": socket.gethostname(),
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "platform": platform.platform(),
        },
        "config": dict(config or {}),
    }
    tmp = directory / f".run.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(tag_nonfinite(meta), indent=1, default=repr, allow_nan=False) + "\n")
    try:
        os.link(tmp, target)  # fails if another process already created it: never overwrite
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


class RunStoreSink(Sink):
    """Writes every record it receives into ``<root>/<session_tag>/<run_id>/rank-<R>.<pid>.jsonl``."""

    name = "jsonl"
    background = True

    def __init__(self, root: str | os.PathLike[str] | None = None, *, config: Mapping[str, Any] | None = None,
                 compact: bool | None = None) -> None:
        # absolute now: a later chdir of the program must not move (or split) its run
        self.root = (Path(root) if root is not None else default_root()).absolute()
        self.config = dict(config or {})
        self._fd = -1
        self._token = -1
        self._identity: Identity | None = None
        self.path: Path | None = None
        self.bytes_written = 0
        self.unencodable = 0  # records replaced by an "unencodable" diagnostic line
        self._torn_tail = False  # the last write stopped inside a line
        self._segment = 0
        self._segment_bytes = 0
        self._segment_started = 0.0
        self.compactor = BackgroundCompactor(compact)  # closed segments -> the columnar copy, in another process

    def run_dir_for(self, identity: Identity) -> Path:
        return run_dir(self.root, identity)

    def _open(self, identity: Identity) -> None:
        self._close_fd()
        directory = self.run_dir_for(identity)
        directory.mkdir(parents=True, exist_ok=True)
        if identity.role != AGENT_ROLE:  # the launcher's agent gets there first; run.json is the training's to write
            write_run_meta(directory, identity, self.config)
        base = process_file_name(identity)
        # continue the latest segment of this process if it has several already (the same pid writing again)
        segments = [parse_segment_name(f.name) for f in directory.glob(base.removesuffix(".jsonl") + ".*jsonl")]
        self._segment = max((n.segment for n in segments if n is not None), default=0)
        self._open_segment(directory / segment_file_name(base, self._segment), identity)

    def _open_segment(self, path: Path, identity: Identity) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._identity = identity
        self.path = path
        self._segment_bytes = os.fstat(self._fd).st_size
        self._segment_started = time.monotonic()
        extra = {"versions": _versions(), "argv": list(sys.argv)}
        self._write_all(encode_header(identity, time.monotonic_ns(), time.time_ns(), extra).encode(), roll=False)

    def _write_all(self, data: bytes, *, roll: bool = True) -> None:
        if self._torn_tail:
            # A write failed part-way (a full disk): end that partial line first, so it stays one undecodable line
            # and the records after it are intact.
            os.write(self._fd, b"\n")
            self._torn_tail = False
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except OSError:
                self._torn_tail = len(view) < len(data)
                raise
            view = view[n:]
            self.bytes_written += n
            self._segment_bytes += n
        if roll and (self._segment_bytes >= SEGMENT_BYTES
                     or time.monotonic() - self._segment_started >= SEGMENT_SECONDS):
            self._roll()

    def _roll(self) -> None:
        """Close this segment, start the next (with its own header), and compact the closed ones in the background."""
        identity, path = self._identity, self.path
        if identity is None or path is None or self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        self._segment += 1
        self._open_segment(path.with_name(segment_file_name(process_file_name(identity), self._segment)), identity)
        self._compact(include_last=False)

    def _compact(self, *, include_last: bool) -> None:
        """This process's segments to the columnar copy, in another process (``store.compactor``): the closed ones,
        and the last one too at close."""
        if self.path is None or self._identity is None or not self.compactor.enabled:
            return
        if not include_last and self.compactor.running:
            return  # still busy with earlier segments: the next roll, or the close, covers what it leaves
        stem = process_file_name(self._identity).removesuffix(".jsonl")
        segments = sorted((n.segment, f) for f in self.path.parent.glob(stem + ".*jsonl")
                          if (n := parse_segment_name(f.name)) is not None and f.name.startswith(stem + "."))
        self.compactor.start([f for _, f in segments], include_last=include_last)

    def write(self, records: Sequence[Any]) -> None:
        """Typed records (the packed path below is the usual one)."""
        for record in records:
            self._switch_to(record.identity, -1)
            self._write_all(encode(record).encode())

    def write_packed(self, packed: Sequence[tuple[Any, ...]], source: PackedSource) -> None:
        encoders = ENCODERS
        offset = source.wall_offset_ns
        lines: list[str] = []
        token = self._token
        for p in packed:
            if p[2] != token:
                try:
                    identity = source.identity_of(p[2])
                except Exception as exc:  # noqa: BLE001 - a token this source never issued: lose that record only
                    if self._fd >= 0:
                        lines.append(self._unencodable(p, offset, exc))
                    else:
                        self.unencodable += 1
                    continue
                if lines:  # records of another identity (a fork, a re-identified run) may go to another file
                    self._write_all("".join(lines).encode())
                    lines = []
                token = p[2]
                self._switch_to(identity, token)
            try:
                lines.append(encoders[p[0]](p, offset))
            except Exception as exc:  # noqa: BLE001 - one record that cannot be written must not cost the batch
                lines.append(self._unencodable(p, offset, exc))
        if lines:
            self._write_all("".join(lines).encode())

    def _unencodable(self, p: tuple[Any, ...], offset: int, exc: Exception) -> str:
        """A diagnostic line in place of a record that could not be encoded (e.g. an int past Python's 4300-digit
        str limit), naming it."""
        self.unencodable += 1
        what = f"{p[0]} {p[3]!r:.100}/{p[4]!r:.100}: {type(exc).__name__}: {exc}"
        mono = p[1] if type(p[1]) is int else p[1][0]
        return ENCODERS["diagnostic"](
            ("diagnostic", mono, p[2], "telemetrain", "unencodable", self.name, 1, what), offset
        )

    def _switch_to(self, identity: Identity, token: int) -> None:
        if identity != self._identity:
            self._open(identity)
        self._token = token

    def flush(self) -> None:
        pass  # every write goes straight to the kernel; fsync would cost far more than it protects here

    def close(self) -> None:
        if self.path is not None and self._fd >= 0 and self.bytes_written >= COMPACT_MIN_BYTES:
            self._compact(include_last=True)
        self._close_fd()

    def _close_fd(self) -> None:
        self._torn_tail = False
        if self._fd >= 0:
            try:
                os.close(self._fd)
            finally:
                self._fd = -1

    def after_fork_in_child(self) -> None:
        # The descriptor is the parent's file: close our copy (the parent's stays open) and start our own on demand.
        self._close_fd()
        self._identity = None
        self._token = -1
        self.path = None
        self.compactor.after_fork_in_child()
