"""The compactors' locks, ``flock``s the kernel releases when their holder dies (SIGKILL included): one per segment
(``segment_lock``: two compactors never convert one segment at once) and a few per host (``host_slot``: the writers'
background compactions of a node's ranks take turns)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .files import make_dirs_under

__all__ = ["JOBS_ENV", "LOCK_TIMEOUT_S", "host_jobs", "host_slot", "segment_lock"]

LOCK_TIMEOUT_S = 600.0  # a compactor that holds a segment longer than this is taken to be stuck


@contextlib.contextmanager
def segment_lock(manifest: Path, *, enabled: bool = True, timeout: float = LOCK_TIMEOUT_S,
                 prefix: Path | None = None) -> Iterator[None]:
    """An exclusive ``flock`` on ``<manifest>.lock`` for as long as the block runs. The kernel releases it when its
    holder dies (SIGKILL included), so a killed compactor never blocks the next. Raises ``TimeoutError`` after
    ``timeout`` seconds of waiting. With ``prefix``, the lock's directories are made below it only
    (``make_dirs_under``)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock (one compactor at a time is then the user's to ensure)
        enabled = False
    if not enabled:
        yield
        return
    lock_path = manifest.with_name(f".{manifest.name}.lock")
    if prefix is None:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
    else:
        make_dirs_under(prefix, lock_path.parent)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0),
                 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{lock_path} held by another compactor for over {timeout:.0f} s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


JOBS_ENV = "TELEMETRAIN_COMPACT_JOBS"


def host_jobs() -> int:
    """How many writer compactions may run at once on this host: ``$TELEMETRAIN_COMPACT_JOBS``, else one per 16
    CPUs (1 to 4)."""
    try:
        return max(1, int(os.environ[JOBS_ENV]))
    except (KeyError, ValueError):
        return max(1, min(4, (os.cpu_count() or 1) // 16))


@contextlib.contextmanager
def host_slot(jobs: int | None = None, wait_s: float = 3600.0) -> Iterator[None]:
    """One of ``jobs`` slots shared by this user's compactors on this host (``flock`` on files in the temporary
    directory; released by the kernel when the holder dies). Waits for a free one, at most ``wait_s`` seconds, then
    runs anyway (a stuck holder must not stop compaction for good)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    jobs = host_jobs() if jobs is None else jobs
    base = Path(tempfile.gettempdir())
    uid = os.getuid() if hasattr(os, "getuid") else 0
    fds = []
    try:
        for i in range(jobs):
            try:
                fds.append(os.open(base / f"telemetrain-compact-{uid}.{i}.lock",
                                   os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0),
                                   0o600))
            except OSError:
                continue
        deadline = time.monotonic() + wait_s
        while fds and time.monotonic() < deadline:
            for fd in fds:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue
                yield
                return
            time.sleep(0.2)
        yield
    finally:
        for fd in fds:
            os.close(fd)
