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
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._version import __version__
from ..identity import Identity
from ..records import PackedSource
from ..store.codec import ENCODERS, encode, encode_header, tag_nonfinite
from ..store.layout import AGENT_ROLE, RUN_META, default_root, process_file_name, run_dir
from .base import Sink


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "telemetrain": __version__}
    torch = sys.modules.get("torch")  # never import torch ourselves: it is heavy and may not be installed
    if torch is not None and hasattr(torch, "__version__"):
        versions["torch"] = str(torch.__version__)
    return versions


def write_run_meta(directory: Path, identity: Identity, config: Mapping[str, Any] | None,
                   facts: Mapping[str, Any] | None = None) -> bool:
    """Create ``run.json`` once per run; the first process to get there wins, atomically. True if we created it.
    ``facts``: fields known by now besides the identity's (the workload: ``RunStoreSink.set_run_meta``)."""
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
        **(facts or {}),
    }
    tmp = _write_temp(directory, meta)
    try:
        os.link(tmp, target)  # fails if another process already created it: never overwrite
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _write_temp(directory: Path, meta: Mapping[str, Any]) -> Path:
    tmp = directory / f".run.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(tag_nonfinite(dict(meta)), indent=1, default=repr, allow_nan=False) + "\n")
    return tmp


def update_run_meta(directory: Path, identity: Identity, facts: Mapping[str, Any]) -> None:
    """Bring the ``run.json`` this process created up to date: the identity's perf tag (set from the training config
    after the run began) and ``facts``; replaced atomically, so a reader sees the old or the new one. A run.json
    that cannot be read or written is left as it is: the records matter more than their summary."""
    target = directory / RUN_META
    try:
        meta = json.loads(target.read_text())
        if not isinstance(meta, dict):
            return
        updated = {**meta, "perf_tag": identity.perf_tag, **facts}
        if updated != meta:
            os.replace(_write_temp(directory, updated), target)
    except (OSError, ValueError):
        pass


class RunStoreSink(Sink):
    """Writes every record it receives into ``<root>/<session_tag>/<run_id>/rank-<R>.<pid>.jsonl``."""

    name = "jsonl"
    background = True

    def __init__(self, root: str | os.PathLike[str] | None = None, *, config: Mapping[str, Any] | None = None) -> None:
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
        self._meta_lock = threading.Lock()  # run.json: the writer thread creates it, set_run_meta may update it
        self._meta_facts: dict[str, Any] = {}
        self._meta_dir: Path | None = None  # the run directory whose run.json this process created

    def set_run_meta(self, **facts: Any) -> None:
        """Fields for ``run.json`` known after the sink was made (the workload): in it when this process creates it,
        written into it now if this process already did. (Another process's run.json is its own to update.)"""
        with self._meta_lock:
            self._meta_facts.update(facts)
            if self._meta_dir is not None and self._identity is not None:
                update_run_meta(self._meta_dir, self._identity, self._meta_facts)

    def run_dir_for(self, identity: Identity) -> Path:
        return run_dir(self.root, identity)

    def _open(self, identity: Identity) -> None:
        self._close_fd()
        directory = self.run_dir_for(identity)
        directory.mkdir(parents=True, exist_ok=True)
        if identity.role != AGENT_ROLE:  # the launcher's agent gets there first; run.json is the training's to write
            with self._meta_lock:
                if write_run_meta(directory, identity, self.config, self._meta_facts):
                    self._meta_dir = directory
                elif directory == self._meta_dir:  # a new identity in our run (the config's perf tag)
                    update_run_meta(directory, identity, self._meta_facts)
        path = directory / process_file_name(identity)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._identity = identity
        self.path = path
        extra = {"versions": _versions(), "argv": list(sys.argv)}
        self._write_all(encode_header(identity, time.monotonic_ns(), time.time_ns(), extra).encode())

    def _write_all(self, data: bytes) -> None:
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
        self._meta_lock = threading.Lock()
        self._meta_dir = None  # the parent's run.json stays the parent's
