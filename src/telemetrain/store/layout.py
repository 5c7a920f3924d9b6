"""Where a run lives on disk (format v1, see docs/format.md)::

<root>/<session_tag>/<run_id>/run.json
<root>/<session_tag>/<run_id>/rank-<R>.<pid>.jsonl
<root>/<session_tag>/<run_id>/agent-<node>.<pid>.jsonl     the launcher's elastic agent (``telemetrain launch``)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from ..identity import Identity

FORMAT_VERSION = 1
RUN_META = "run.json"
DEFAULT_ROOT = "telemetrain-runs"
# The longest line a segment may hold, in bytes, its newline not counted (docs/format.md). Readers skip a longer one
# as a corrupt line without holding it (``skip_rest_of_line``): one line of gigabytes would otherwise be read whole.
# The writer never writes one (``sinks.jsonl``). 4 MiB: DuckDB parses a line in ~10x its size, and the SQL readers'
# memory limit is 128 MB (a line of 8 MiB ran it out).
MAX_LINE_BYTES = 4 << 20


NAME_MAX = 255  # bytes in one path component on the common file systems


def skip_rest_of_line(fh: BinaryIO, limit: int | None = None) -> int | None:
    """Read ``fh`` past the end of the line it is in, a block at a time (never the whole line), up to the file offset
    ``limit`` when given. Returns the offset after the newline, or None when the file (or ``limit``) ends first: the
    line is the torn last one."""
    pos = fh.tell()
    while limit is None or pos < limit:
        block = fh.read(1 << 20 if limit is None else min(1 << 20, limit - pos))
        if not block:
            return None
        at = block.find(b"\n")
        if at >= 0:
            fh.seek(pos + at + 1)
            return pos + at + 1
        pos += len(block)
    return None


def check_root(value: str | os.PathLike[str], arg: str) -> Path:
    """A store root given in code: a path without NUL whose every component fits a file system (``ValueError``
    naming ``arg``), so the mistake shows at the call, not later in the writer thread."""
    try:
        path = Path(value)
    except TypeError:
        raise TypeError(f"{arg} must be a path (str or os.PathLike), got {type(value).__name__}") from None
    text = str(path)
    if "\0" in text:
        raise ValueError(f"{arg} must not contain NUL, got {text!r:.200}")
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise ValueError(f"{arg} has a component of {len(os.fsencode(part))} bytes (at most {NAME_MAX}): "
                             f"{part[:40]!r}...")
    return path


def default_root() -> Path:
    """``$TELEMETRAIN_DIR``, else ``./telemetrain-runs``."""
    return Path(os.environ.get("TELEMETRAIN_DIR") or DEFAULT_ROOT)


def run_dir(root: str | os.PathLike[str], identity: Identity) -> Path:
    return Path(root) / identity.session_tag / identity.run_id


AGENT_ROLE = "agent"  # the identity role of the launcher's agent process; its rank is its node's rank


def process_file_name(identity: Identity) -> str:
    if identity.role == AGENT_ROLE:
        return f"agent-{identity.group_rank}.{identity.pid}.jsonl"
    return f"rank-{identity.rank}.{identity.pid}.jsonl"


def is_process_file(name: str) -> bool:
    """A worker's file or an agent's."""
    return name.endswith(".jsonl") and (name.startswith("rank-") or name.startswith("agent-"))


def is_agent_file(name: str) -> bool:
    return name.startswith("agent-") and name.endswith(".jsonl")
