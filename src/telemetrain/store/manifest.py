"""The manifest of a compacted segment (``_segments/.../<segment>.json``, written last): what the segment's copy holds,
and whether a reader can trust it (docs/format.md, "Columnar copy")."""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .columnar import SCHEMA_VERSION, ColumnarVersionError

__all__ = ["SEGMENTS_DIR", "SHARED_DIR", "Manifest", "hive_value", "manifest_is_valid", "manifest_path",
           "partition_dir", "private_tmp", "read_manifest", "shared_dir", "write_manifest"]

SEGMENTS_DIR = "_segments"
# A segment's manifest is a few kB (a handful of tables' files; a batch's, a list of ranks). One far larger was not
# written by compaction: it is not read into memory (a manifest listing a million files is 100 MB of JSON).
MAX_MANIFEST_BYTES = 16 << 20
# the files a batch of segments shares (schema version 4): ``_shared/<table>/session=S/run=R/<batch>.parquet``, apart
# from the Hive tree of one file a segment, whose partition columns they hold as columns instead (with ``source``)
SHARED_DIR = "_shared"
# A copy's file, as the compactor names it (partition_dir + "/<stem>.parquet", or a batch's shared file under
# shared_dir): a manifest naming anything else (an absolute path, "../", another shape) is not one we wrote, and the
# reader must not read what it points to.
_COPY_FILE = re.compile(r"(?:(?P<table>[a-z_]+)/session=[^/]+/run=[^/]+/rank=-?[0-9]+"
                        r"|_shared/(?P<shared>[a-z_]+)/session=[^/]+/run=[^/]+)/[^/]+\.parquet")


def hive_value(value: str | int) -> str:
    """A partition value as Hive writes it in a path (its escapePathName: ``%XX`` for ``/ = % : ? # ...``)."""
    return quote(str(value), safe=" !$&'()+,;@[]^_`{}~-.*")  # reserved as Hive escapes them; the rest kept


def partition_dir(table: str, session: str, run: str, rank: int) -> str:
    return f"{table}/session={hive_value(session)}/run={hive_value(run)}/rank={rank}"


def shared_dir(table: str, session: str, run: str) -> str:
    return f"{SHARED_DIR}/{table}/session={hive_value(session)}/run={hive_value(run)}"


def manifest_path(session: str, run: str, segment_name: str) -> str:
    return f"{SEGMENTS_DIR}/session={hive_value(session)}/run={hive_value(run)}/{segment_name}.json"


@dataclass
class Manifest:
    """What one compacted segment holds (the JSON file written last)."""

    schema_version: int
    segment: str  # the JSONL file name
    session: str
    run: str
    file_size: int  # bytes of the JSONL file when it was read (complete lines and a torn tail)
    covered_bytes: int  # ... of which the complete lines, converted (the rest: a torn line, or one being written)
    lines: int
    torn: int
    corrupt: int
    records: dict[str, int]  # table -> rows
    # {"table", "path" (relative to the prefix), "bytes", "rows"}; a file shared by a batch's segments also has
    # "source" (its rows' value of the column ``source``: this segment's file name), "segments" (how many segments'
    # rows the file holds) and "ranks" (the ranks of this segment's rows in it)
    files: list[dict[str, Any]]
    last_identity: dict[str, Any] | None  # the identity in force at the segment's end (for the next one)
    compacted_wall_ns: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_manifest(path: Path, oldest: int = SCHEMA_VERSION) -> Manifest | None:
    """A manifest file, or None when it is missing, unreadable, not a plain file (a FIFO would block the reader), over
    ``MAX_MANIFEST_BYTES`` or older than schema version ``oldest`` (the engine reads version 2 too:
    ``columnar.READABLE_SINCE``). Raises ``ColumnarVersionError`` for a manifest of a
    schema version from the future."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            return None
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    if type(data) is not dict:
        return None
    version = data.get("schema_version")
    if type(version) is int and version > SCHEMA_VERSION:
        raise ColumnarVersionError(version, str(path))
    try:
        manifest = Manifest(**{k: data[k] for k in Manifest.__dataclass_fields__ if k in data})
    except TypeError:
        return None
    if type(manifest.schema_version) is not int or not oldest <= manifest.schema_version <= SCHEMA_VERSION or \
            type(manifest.file_size) is not int or \
            type(manifest.covered_bytes) is not int or type(manifest.lines) is not int:
        return None
    if not isinstance(manifest.files, list) or not all(isinstance(f, dict) for f in manifest.files):
        return None
    return manifest


def private_tmp(target: Path) -> Path:
    """A temporary name beside ``target`` that nobody can guess, so nobody can plant a link there beforehand (a
    pid-based name could be, and the write would go through it)."""
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")


def write_manifest(target: Path, manifest: Manifest) -> None:
    """Write ``manifest`` to ``target`` atomically, through a new file (never an existing file or a link)."""
    tmp = private_tmp(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) |
                 getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(manifest.as_dict(), separators=(",", ":")))
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def manifest_is_valid(manifest: Manifest, prefix: Path, jsonl: Path, *, grown_ok: bool = False) -> str:
    """"" when the copy of ``jsonl`` under ``prefix`` can be trusted, else why not. With ``grown_ok``, a JSONL file
    that grew since (a run still being written) keeps its copy valid for the part it was made from: the reader takes
    the rest from the JSONL (``covered_bytes`` on)."""
    try:
        size = jsonl.stat().st_size
    except OSError as exc:
        return f"cannot read {jsonl.name}: {exc}"
    if size != manifest.file_size and not (grown_ok and size > manifest.file_size):
        return f"{jsonl.name} is {size} bytes now, its copy was made from {manifest.file_size}"
    root = os.path.realpath(prefix)
    for f in manifest.files:
        rel = str(f.get("path", ""))
        shape = _COPY_FILE.fullmatch(rel)
        if shape is None or (shape.group("table") or shape.group("shared")) != f.get("table") or "\0" in rel:
            return f"its manifest names {rel!r}, not a file of the copy"
        target = os.path.join(prefix, rel)  # text, not a Path: its parts are not interned
        if not os.path.realpath(target).startswith(root + os.sep):  # a link planted in the copy
            return f"{target} leads out of {prefix}"
        try:
            st = os.stat(target)
            if st.st_size != f.get("bytes"):
                return f"{target} is {st.st_size} bytes, its manifest says {f.get('bytes')} (truncated?)"
            with open(target, "rb") as fh:
                fh.seek(-4, os.SEEK_END)
                if fh.read(4) != b"PAR1":
                    return f"{target} does not end with the Parquet footer (truncated?)"
        except OSError as exc:
            return f"{target}: {exc}"
    return ""
