"""The run store writer: one append-only JSONL file per process.

Runs in its own background thread (see ``dispatch``). Each batch is encoded into one string and handed to the
kernel with ``os.write`` on an ``O_APPEND`` descriptor: there is no user-space buffer, so a batch is on its way to
disk when ``write`` returns, a SIGKILL loses at most what is still queued, and a forked child has nothing of the
parent's to flush twice. The file is chosen from the identity of the records it receives, so a forked child (new
pid) writes its own file, and a file is never truncated.

Files are created without following symbolic links (``store.files``): a link planted in a shared store is never
written through. A write that stops part-way (a full disk) raises ``PartialWriteError`` with the number of records
that reached the file whole, so the runner counts exactly the rest as failed.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import stat
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._version import __version__
from ..containment import PartialWriteError, describe, is_interrupt
from ..identity import Identity
from ..liveness import process_start
from ..records import PAIRS, PackedSource
from ..store.codec import ENCODERS, encode, encode_header, tag_nonfinite
from ..store.compactor import BackgroundCompactor
from ..store.files import RunDir, open_run_dir
from ..store.layout import AGENT_ROLE, MAX_LINE_BYTES, RUN_META, check_root, default_root, process_file_name, run_dir
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


_hardware_facts: dict[str, Any] | None = None


def _hardware() -> dict[str, Any]:
    """The host's facts for ``run.json``, read once per process. ``RunStoreSink()`` reads them in the caller's
    thread: ``platform.platform()`` runs ``uname -p`` under a lock (``functools.cached_property``'s, before Python
    3.12), and a fork while the writer thread held it (a DataLoader worker started as the first records are written)
    left the child's writer blocked on it for good."""
    global _hardware_facts
    if _hardware_facts is None:
        _hardware_facts = {
            "host": socket.gethostname(),
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "platform": platform.platform(),
        }
    return _hardware_facts


def write_run_meta(directory: RunDir, identity: Identity, config: Mapping[str, Any] | None,
                   facts: Mapping[str, Any] | None = None) -> bool:
    """Create ``run.json`` once per run; the first process to get there wins, atomically, and nothing already there
    (a link planted in its place included) is overwritten or followed. True if we created it. ``facts``: fields
    known by now besides the identity's (the workload: ``RunStoreSink.set_run_meta``)."""
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
        "hardware": dict(_hardware()),
        "config": dict(config or {}),
        **(facts or {}),
    }
    try:
        os.stat(RUN_META, dir_fd=directory.fd, follow_symlinks=False) if directory.fd is not None else (
            (directory.path / RUN_META).lstat())
        return False  # there already (or something is in its place): never overwritten
    except FileNotFoundError:
        pass
    text = json.dumps(tag_nonfinite(meta), indent=1, default=repr, allow_nan=False) + "\n"
    return directory.create_once(RUN_META, text.encode())


def _check_length(text: str) -> None:
    """ValueError when a line of ``text`` (one record's encoding: a pair's is two lines) is longer than the format
    allows: readers would skip it as corrupt, so the record is replaced by its ``unencodable`` diagnostic instead.
    (The encoding is ASCII: characters are bytes.)"""
    longest = max(map(len, text.split("\n")))
    if longest > MAX_LINE_BYTES:
        raise ValueError(f"its line would be {longest} bytes, over the format's {MAX_LINE_BYTES} "
                         "(`telemetrain docs format line length`)")


def _safe_repr(value: Any) -> str:
    try:
        return f"{value!r:.100}"
    except BaseException:  # noqa: BLE001 - the record is being given up because its values misbehave
        return f"<unprintable {type(value).__name__}>"


def update_run_meta(directory: RunDir, identity: Identity, facts: Mapping[str, Any]) -> None:
    """Bring the ``run.json`` this process created up to date: the identity's perf tag (set from the training config
    after the run began) and ``facts``; replaced atomically (``RunDir.replace_file``: a link in its place is
    replaced, never written through), so a reader sees the old or the new one. A run.json that cannot be read or
    written is left as it is: the records matter more than their summary."""
    try:
        # non-blocking, a plain file only: a FIFO swapped in would hold the caller (set_run_meta: the training thread)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(RUN_META, flags | getattr(os, "O_NOFOLLOW", 0), dir_fd=directory.fd) \
            if directory.fd is not None else os.open(directory.path / RUN_META, flags)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            meta = json.loads(f.read())
        if not isinstance(meta, dict):
            return
        updated = {**meta, "perf_tag": identity.perf_tag, **facts}
        if updated != meta:
            text = json.dumps(tag_nonfinite(updated), indent=1, default=repr, allow_nan=False) + "\n"
            directory.replace_file(RUN_META, text.encode())
    except (OSError, ValueError):
        pass


class RunStoreSink(Sink):
    """Writes every record it receives into ``<root>/<session_tag>/<run_id>/rank-<R>.<pid>.jsonl``."""

    name = "jsonl"
    background = True

    def __init__(self, root: str | os.PathLike[str] | None = None, *, config: Mapping[str, Any] | None = None,
                 compact: bool | None = None) -> None:
        # absolute now: a later chdir of the program must not move (or split) its run
        self.root = (check_root(root, "root") if root is not None else default_root()).absolute()
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
        self._meta_identity: Identity | None = None  # the identity it last wrote there (under _meta_lock)
        self._lines_written = 0  # complete record lines written by the current write_packed call
        self._odd: dict[int, int] = {}  # index in the batch -> lines written for it, where not one per record
        self._segment = 0
        self._segment_bytes = 0
        self._segment_started = 0.0
        self.compactor = BackgroundCompactor(compact)  # closed segments -> the columnar copy, in another process
        _hardware()  # here, not first in the writer thread (see _hardware)

    def set_run_meta(self, **facts: Any) -> None:
        """Fields for ``run.json`` known after the sink was made (the workload): in it when this process creates it,
        written into it now if this process already did. (Another process's run.json is its own to update.)"""
        with self._meta_lock:
            self._meta_facts.update(facts)
            # not self._identity: the writer thread's _open clears it, outside this lock, while it opens a file
            identity = self._meta_identity
            if self._meta_dir is not None and identity is not None:
                try:
                    with open_run_dir(self.root, identity.session_tag, identity.run_id) as directory:
                        update_run_meta(directory, identity, self._meta_facts)
                except OSError:
                    pass  # a run directory swapped for a link since: run.json stays as it was

    def run_dir_for(self, identity: Identity) -> Path:
        return run_dir(self.root, identity)

    def _open(self, identity: Identity) -> None:
        self._close_fd()
        self._identity = None  # until this open succeeds: a failed one is tried again with the next batch
        self._token = -1
        # the session and run directories must be real ones (the root may be a link: the user named it)
        with open_run_dir(self.root, identity.session_tag, identity.run_id) as directory:
            if identity.role != AGENT_ROLE:  # the launcher's agent comes first; run.json is the training's to write
                with self._meta_lock:
                    if write_run_meta(directory, identity, self.config, self._meta_facts):
                        self._meta_dir = directory.path
                        self._meta_identity = identity
                    elif directory.path == self._meta_dir:  # a new identity in our run (the config's perf tag)
                        update_run_meta(directory, identity, self._meta_facts)
                        self._meta_identity = identity
            base = process_file_name(identity)
            # continue the latest segment of this process if it has several already (the same pid writing again)
            segments = [parse_segment_name(f.name)
                        for f in directory.path.glob(base.removesuffix(".jsonl") + ".*jsonl")]
            self._open_segment(directory, identity,
                               max((n.segment for n in segments if n is not None), default=0))

    def _open_segment(self, directory: RunDir, identity: Identity, segment: int) -> None:
        """Open segment ``segment`` of this process (safely: ``RunDir.open_process_file``). A refused name (a link
        or someone else's file planted there) makes the writer take a later free one, ``<stem>.<n>.jsonl``: the
        segment numbering goes on from the name it got, so the segments still read in the order they were written."""
        self._fd, name = directory.open_process_file(segment_file_name(process_file_name(identity), segment))
        parsed = parse_segment_name(name)
        self._segment = parsed.segment if parsed is not None else segment
        self._identity = identity
        self.path = directory.path / name
        self._segment_bytes = os.fstat(self._fd).st_size
        # A file this process reopens (a new identity in the same file, the perf tag's) may end in a line a full
        # disk cut: end it first, or the header would be glued to it and lost with it.
        self._torn_tail = directory.ends_mid_line(name, self._segment_bytes)
        self._segment_started = time.monotonic()
        extra: dict[str, Any] = {"versions": _versions(), "argv": list(sys.argv)}
        started = process_start(os.getpid())  # (a reader tells this process, alive, from a later one of its pid)
        if started is not None:
            extra["process_start"] = started
        start = self._segment_bytes
        try:
            self._write_all(encode_header(identity, time.monotonic_ns(), time.time_ns(), extra).encode(), lines=False)
        except OSError:
            # A full disk: no record may follow in a file without its header (readers took them for host "unknown",
            # without versions or argv). The part of the header written is taken back (only this process writes
            # this file, and readers take its first line for the header) and the file closed: the next batch opens
            # it again and writes the header first.
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass  # then the cut line is ended on reopening, and skipped by readers
            self._close_fd()
            self._identity = None
            self._token = -1
            raise

    def _write_all(self, data: bytes, *, lines: bool = True) -> None:
        """Write ``data`` (whole lines) to the file. With ``lines`` (record lines, not a header), count the record
        lines that reached it (``_lines_written``), also when a write fails part-way: then the bytes written up to the
        failure tell how many lines are whole; and roll the segment once it is big or old enough."""
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
                done = len(data) - len(view)
                self._torn_tail = done > 0 and data[done - 1] != 0x0A
                if lines:  # encoded records hold no raw newline: each one ends a record line
                    self._lines_written += data.count(b"\n", 0, done)
                raise
            view = view[n:]
            self.bytes_written += n
            self._segment_bytes += n
        if lines:
            self._lines_written += data.count(b"\n")
            if self._segment_bytes >= SEGMENT_BYTES or time.monotonic() - self._segment_started >= SEGMENT_SECONDS:
                self._roll()

    def _roll(self) -> None:
        """Close this segment, start the next (with its own header), and compact the closed ones in the background."""
        identity, path = self._identity, self.path
        if identity is None or path is None or self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        self._identity = None  # until the next segment is open: a failed open is tried again with the next batch
        self._token = -1
        with open_run_dir(self.root, identity.session_tag, identity.run_id) as directory:
            self._open_segment(directory, identity, self._segment + 1)
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
            text = encode(record)
            try:
                _check_length(text)
            except ValueError as exc:
                offset = getattr(record, "wall_ns", record.mono_ns) - record.mono_ns
                text = self._unencodable((record.kind, record.mono_ns, -1, record.group, record.name), offset, exc)
            self._write_all(text.encode())

    def write_packed(self, packed: Sequence[tuple[Any, ...]], source: PackedSource) -> None:
        self._lines_written = 0
        self._odd = {}
        try:
            self._reopen_if_deleted(source.wall_offset_ns)
            self._write_packed(packed, source)
        except OSError as exc:
            if self._lines_written:  # part of the batch is in the file, whole: say how much (see dispatch)
                raise PartialWriteError(self._records_in(packed, self._lines_written), exc) from exc
            raise

    def _reopen_if_deleted(self, offset: int) -> None:
        """A file deleted under the writer (the run directory removed by a cleanup mid-run) still takes writes, into
        an inode no one can read: every record after that was lost, counted as delivered. One ``fstat`` per batch
        sees it; the writer then starts the file again (the run directory, run.json and a header included) with a
        diagnostic line saying so. What the deleted file held is gone."""
        identity = self._identity
        if self._fd < 0 or identity is None:
            return
        try:
            if os.fstat(self._fd).st_nlink > 0:
                return
        except OSError:
            return
        lost = self.path
        self._open(identity)
        what = f"{lost.name if lost is not None else 'the file'} was deleted while written; started again"
        record = ("diagnostic", time.monotonic_ns(), self._token, "telemetrain", "file_deleted", self.name, 0, what)
        self._write_all(ENCODERS["diagnostic"](record, offset).encode(), lines=False)

    def _records_in(self, packed: Sequence[tuple[Any, ...]], lines: int) -> int:
        """Records of this batch that its first ``lines`` lines stand for, whole: one line per record, a pair's two
        lines for two, an unencodable record's diagnostic line (or none) for it (``_odd``)."""
        records = 0
        odd = self._odd
        for i, p in enumerate(packed):
            n = 2 if p[0] in PAIRS else 1
            needed = odd.get(i, n)
            if lines < needed or (needed == 0 and lines == 0):
                break
            lines -= needed
            records += n
        return records

    def _write_packed(self, packed: Sequence[tuple[Any, ...]], source: PackedSource) -> None:
        encoders = ENCODERS
        offset = source.wall_offset_ns
        lines: list[str] = []
        token = self._token
        for i, p in enumerate(packed):
            if p[2] != token:
                try:
                    identity = source.identity_of(p[2])
                except BaseException as exc:  # a token this source never issued: lose that record only
                    if is_interrupt(exc):
                        raise
                    if self._fd >= 0:
                        lines.append(self._unencodable(p, offset, exc))
                        self._odd[i] = 1
                    else:
                        self.unencodable += 1
                        self._odd[i] = 0
                    continue
                if lines:  # records of another identity (a fork, a re-identified run) may go to another file
                    self._write_all("".join(lines).encode())
                    lines = []
                token = p[2]
                self._switch_to(identity, token)
            try:
                line = encoders[p[0]](p, offset)
                if len(line) > MAX_LINE_BYTES:
                    _check_length(line)
                lines.append(line)
            except BaseException as exc:  # one record that cannot be written costs that record only
                if is_interrupt(exc):  # whatever its values raise (a __repr__ raising SystemExit, say)
                    raise
                lines.append(self._unencodable(p, offset, exc))
                self._odd[i] = 1
        if lines:
            self._write_all("".join(lines).encode())

    def _unencodable(self, p: tuple[Any, ...], offset: int, exc: BaseException) -> str:
        """A diagnostic line in place of a record that could not be encoded (e.g. an int past Python's 4300-digit
        str limit, a value whose ``__repr__`` raises), naming it. A pair's two records get one line: the count says
        two."""
        self.unencodable += 1
        what = f"{p[0]} {_safe_repr(p[3])}/{_safe_repr(p[4])}: {describe(exc)}"
        mono = p[1] if type(p[1]) is int else p[1][0] if type(p[1]) is tuple else None
        if type(mono) is not int:
            mono = time.monotonic_ns()
        count = 2 if p[0] in PAIRS else 1
        record = ("diagnostic", mono, p[2], "telemetrain", "unencodable", self.name, count, what)
        return ENCODERS["diagnostic"](record, offset)

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
        # this process's own counts: the parent's bytes made every forked child (a DataLoader worker) that wrote a
        # line compact its small file at close, a DuckDB process each
        self.bytes_written = 0
        self.unencodable = 0
        self._meta_lock = threading.Lock()
        self._meta_dir = None  # the parent's run.json stays the parent's
        self._meta_identity = None
        self.compactor.after_fork_in_child()
