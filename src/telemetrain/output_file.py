"""Writing an output file (the HTML report, a comparison page, a trace) the way every command does it: atomically (a
reader never sees half a file; a failed write leaves any previous one), with the permissions a new file gets from the
umask (0644 under the usual 022), and an error that names the file asked for rather than the temporary one."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

__all__ = ["OutputFileError", "atomic_output", "check_output", "write_output"]


class OutputFileError(OSError):
    """The output file could not be written; the message names it and why."""


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def check_output(path: str | os.PathLike[str]) -> None:
    """Raise the OutputFileError writing ``path`` would end with, where it can be told now: a command checks its
    output path before it reads runs for minutes, not after."""
    target = Path(path)
    parent = target.parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise OutputFileError(f"cannot write {target}: the directory {parent} {why}")
    if target.is_dir():
        raise OutputFileError(f"cannot write {target}: Is a directory")


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[TextIO]:
    """A text stream whose content becomes ``path`` when the ``with`` block ends without an exception."""
    target = Path(path)
    parent = target.parent
    check_output(target)
    tmp = parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        # 0o666 and the umask, as open() gives a new file (mkstemp's 0600 would hide the page from a web server)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        raise OutputFileError(f"cannot write {target}: {_reason(exc)}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputFileError(f"cannot write {target}: {_reason(exc)}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_output(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` with ``atomic_output``; returns the path."""
    with atomic_output(path) as fh:
        fh.write(text)
    return Path(path)
