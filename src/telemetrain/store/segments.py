"""Segment files: a process's JSONL log, cut into files of bounded size.

The writer starts a new segment when the current one passes a size or an age (``RunStoreSink``), so that each closed
segment can be compacted to the columnar copy on its own (``store.compact``) and no file grows without bound::

    rank-<R>.<pid>.jsonl          segment 0 (the only one of a small run: the name of format v1's single file)
    rank-<R>.<pid>.<S>.jsonl      segment S >= 1
    agent-<node>.<pid>[.<S>].jsonl

Every segment begins with its process header line, so each is readable on its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

__all__ = ["SegmentName", "parse_segment_name", "process_segments", "segment_file_name"]

_SEGMENT_RE = re.compile(r"^(rank|agent)-(\d{1,18})\.(\d{1,18})(?:\.(\d{1,9}))?\.jsonl$")


class SegmentName(NamedTuple):
    agent: bool
    rank: int  # the node's rank for an agent
    pid: int
    segment: int


def parse_segment_name(name: str) -> SegmentName | None:
    """``rank-3.1234.2.jsonl`` -> (False, 3, 1234, 2); None for any other name."""
    m = _SEGMENT_RE.match(name)
    if m is None:
        return None
    return SegmentName(m.group(1) == "agent", int(m.group(2)), int(m.group(3)), int(m.group(4) or 0))


def segment_file_name(base: str, segment: int) -> str:
    """The file name of segment ``segment`` of the process whose segment 0 is ``base`` (``rank-R.pid.jsonl``)."""
    if segment == 0:
        return base
    return f"{base.removesuffix('.jsonl')}.{segment}.jsonl"


def process_segments(files: Iterable[Path]) -> dict[tuple[bool, int, int], list[Path]]:
    """Segment files grouped by process, (agent, rank, pid) -> paths in segment order."""
    groups: dict[tuple[bool, int, int], list[tuple[int, Path]]] = {}
    for f in files:
        name = parse_segment_name(f.name)
        if name is not None:
            groups.setdefault((name.agent, name.rank, name.pid), []).append((name.segment, f))
    return {key: [f for _, f in sorted(items)] for key, items in groups.items()}
