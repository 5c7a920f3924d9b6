"""Creating run-store files safely in a directory others may write to (a shared filesystem, a world-writable scratch).

The rule: **the store root is the user's choice and is followed if it is a symbolic link; nothing below it is.**
The session and run directories are opened with ``O_NOFOLLOW`` relative to their parent's descriptor, so a link
planted at either is refused (``SymlinkRefused``) rather than sending the run elsewhere, and a directory swapped for a
link after the check changes nothing (every later step works on the descriptor, not the path). Files are created
with ``O_NOFOLLOW`` and ``O_EXCL``: a link planted where a process file will be written is never followed, and a file
that exists but is not a plain file of this user with one link (a link, a FIFO, someone else's file, a hard link to
a file elsewhere) is never appended to: the writer takes the next free name instead. ``run.json`` is created by
writing an unpredictably named temporary file and linking it into place (never overwriting what is there, a link
included), and replaced, when it must be, by renaming one over it, which replaces a link rather than writing
through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import tempfile
from pathlib import Path

__all__ = ["RunDir", "SymlinkRefused", "foreign_link", "open_run_dir", "private_temp_dir"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
# Descriptor-relative calls (Linux, macOS, the BSDs). Elsewhere the same rules are applied to paths, with a window
# between check and use.
_AT = os.open in os.supports_dir_fd and os.mkdir in os.supports_dir_fd and bool(_DIRECTORY)
MAX_ALTERNATIVES = 16  # process file names tried after the usual one is refused


class SymlinkRefused(OSError):
    """A directory or file of the run store is a symbolic link (or not what it should be) and was not followed."""


def _refused(path: Path, what: str) -> SymlinkRefused:
    return SymlinkRefused(
        errno.ELOOP,
        f"refusing to write the run store through {path!s:.300}: not a real {what} (a symbolic link?). Only the "
        "store root may be a link (store=... or TELEMETRAIN_DIR names it); nothing below it is followed",
    )


def open_run_dir(root: str | os.PathLike[str], *names: str) -> RunDir:
    """``root/names[0]/names[1]...``, created where missing and opened. ``root`` (the user's) is followed if it is a
    link; each of ``names`` must be a real directory: a link there raises ``SymlinkRefused``."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    if not _AT:
        path = base
        for name in names:
            path = path / name
            path.mkdir(exist_ok=True)
            if path.is_symlink() or not path.is_dir():
                raise _refused(path, "directory")
        return RunDir(path, None)
    fd = os.open(base, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    path = base
    for name in names:
        path = path / name
        try:
            try:
                os.mkdir(name, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                child = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refused(path, "directory") from None
                raise
        finally:
            os.close(fd)
        fd = child
    return RunDir(path, fd)


class RunDir:
    """An opened run directory: files are created relative to its descriptor (or its path where the platform has
    no descriptor-relative calls). Close it when done; a context manager."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self.fd = fd

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _open(self, name: str, flags: int, mode: int = 0o644) -> int:
        if self.fd is not None:
            return os.open(name, flags, mode, dir_fd=self.fd)
        path = self.path / name
        if path.is_symlink():
            raise OSError(errno.ELOOP, "symbolic link", str(path))
        return os.open(path, flags, mode)

    def _unlink(self, name: str) -> None:
        try:
            if self.fd is not None:
                os.unlink(name, dir_fd=self.fd)
            else:
                os.unlink(self.path / name)
        except FileNotFoundError:
            pass

    def open_process_file(self, name: str) -> tuple[int, str]:
        """An ``O_APPEND`` descriptor for ``name`` here, and the name used: ``name`` if it is new or a plain file of
        this user's with one link (the same process re-opening its file), else the first free ``<stem>.<n>.jsonl``
        (a link, a FIFO or another user's file planted there is left alone)."""
        stem = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
        flags = os.O_WRONLY | os.O_APPEND | _CLOEXEC | _NOFOLLOW
        for attempt in range(MAX_ALTERNATIVES + 1):
            candidate = name if attempt == 0 else f"{stem}.{attempt}.jsonl"
            try:
                return self._open(candidate, flags | os.O_CREAT | os.O_EXCL), candidate
            except FileExistsError:
                pass
            try:  # O_NONBLOCK: opening a FIFO planted there must not wait for a reader
                fd = self._open(candidate, flags | _NONBLOCK)
            except OSError:  # a link (ELOOP), a FIFO without a reader (ENXIO), not ours to open (EACCES), gone
                continue
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid():
                os.set_blocking(fd, True)
                return fd, candidate
            os.close(fd)
        raise _refused(self.path / name, f"file (nor were {MAX_ALTERNATIVES} other names free)")

    def ends_mid_line(self, name: str, size: int) -> bool:
        """Whether ``name``, ``size`` bytes long, ends inside a line (a write a full disk cut). Read through a
        descriptor of its own: the writer's is write-only. Unreadable: taken as ending a line."""
        if size <= 0:
            return False
        try:
            fd = self._open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
        except OSError:
            return False
        try:
            return os.pread(fd, 1, size - 1) not in (b"\n", b"")
        except OSError:
            return False
        finally:
            os.close(fd)

    def _write_temp(self, stem: str, data: bytes) -> str:
        """``data`` in a new file with an unpredictable name (no one can plant a link there in advance): its name."""
        while True:
            tmp = f".{stem}.{secrets.token_hex(8)}.tmp"
            try:
                fd = self._open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC)
                break
            except FileExistsError:
                continue
        try:
            _write_all(fd, data)
        except BaseException:
            self._unlink(tmp)
            raise
        return tmp

    def create_once(self, name: str, data: bytes) -> bool:
        """Create ``name`` holding ``data``, whole or not at all, unless something (a link included) is already
        there: True if this call created it. Of processes racing to create it, exactly one wins."""
        tmp = self._write_temp(name, data)
        try:
            if self.fd is not None:
                os.link(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
            else:
                os.link(self.path / tmp, self.path / name, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        except OSError as exc:  # a filesystem without hard links: create it exclusively (not atomic, still safe)
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS):
                raise
            try:
                fd = self._open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC)
            except FileExistsError:
                return False
            _write_all(fd, data)
            return True
        finally:
            self._unlink(tmp)

    def replace_file(self, name: str, data: bytes) -> None:
        """Replace ``name`` with a file holding ``data``, atomically: a reader sees the old file or the new one. A
        link at ``name`` is replaced, never written through."""
        tmp = self._write_temp(name, data)
        try:
            if self.fd is not None:
                os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            else:
                os.replace(self.path / tmp, self.path / name)
        except BaseException:
            self._unlink(tmp)
            raise


def _write_all(fd: int, data: bytes) -> None:
    """Write and close ``fd``."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def private_temp_dir() -> str:
    """``<temp>/telemetrain-duckdb-<uid>``, a directory of this user's alone (0700), for DuckDB's spilled rows: under
    a shared ``/tmp`` a name others can guess may already be theirs, and a run's rows would be written into it for
    them to read. Made if missing; one that is a link, another user's or open to others gives a fresh ``mkdtemp``."""
    if not hasattr(os, "getuid"):  # not POSIX: no owner to check
        return tempfile.mkdtemp(prefix="telemetrain-duckdb-")
    uid = os.getuid()
    path = os.path.join(tempfile.gettempdir(), f"telemetrain-duckdb-{uid}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
        return path
    return tempfile.mkdtemp(prefix="telemetrain-duckdb-")


def foreign_link(path: str | os.PathLike[str]) -> str | None:
    """Why writing into ``path`` would follow a symbolic link someone else planted, else None: the first component
    of it that is a link owned by neither this user nor root (the rule of Linux's ``fs.protected_symlinks``). A link
    of one's own (runs moved to another disk) is followed; the readers follow any."""
    if not hasattr(os, "geteuid"):  # not POSIX: no owner to check
        return None
    uid = os.geteuid()
    current = Path(os.path.abspath(path))
    for depth in range(1, len(current.parts) + 1):
        part = Path(*current.parts[:depth])
        try:
            st = os.lstat(part)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (uid, 0):
            return (f"{part} is a symbolic link of another user's (uid {st.st_uid}), not followed to write there; "
                    "name the directory it points to if you trust it")
    return None


def make_dirs_under(prefix: Path, directory: Path) -> None:
    """``directory`` and its parents below ``prefix``, never ``prefix`` itself or above it: a run deleted while its
    compactor works stays deleted (the conversion fails with ``FileNotFoundError``) instead of coming back as a tree
    of empty directories."""
    current = prefix
    for part in directory.relative_to(prefix).parts:
        current = current / part
        with contextlib.suppress(FileExistsError):
            current.mkdir()
        if current.is_symlink():  # planted by someone who can write the store: what we write would land elsewhere
            raise OSError(errno.ELOOP, "a link in the columnar copy, not followed", str(current))
