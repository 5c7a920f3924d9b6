"""Rows of the columnar tables (``columnar``) back to the readers' objects: a record (``records.MetricPoint`` ...) and
the identity a row carries, for the few rows a SQL reader hands to Python code written for records."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from ..identity import Identity
from .codec import _f as number_of
from .codec import untag_nonfinite

__all__ = ["identity_of_row", "record_from_row"]


def _json(text: Any) -> Any:
    try:
        return None if text is None else json.loads(text)
    except RecursionError:  # nested deeper than Python decodes (codec.loads_column): kept by DuckDB, not here
        return None


def record_from_row(kind: str, identity: Identity, row: Sequence[Any], names: Sequence[str]) -> Any:
    """A record (``records.MetricPoint`` etc.) from a row of its table; ``names``: the row's column names."""
    from ..records import Diagnostic, Event, MetricPoint, SpanEnd, SpanStart, StatWindow

    r = dict(zip(names, row, strict=True))
    head = (r["mono_ns"], r["wall_ns"], identity, r["group_name"], r["name"])
    if kind == "metric":
        value: Any = r["value"]
        if r["value_bool"] is not None:
            value = bool(r["value_bool"])
        elif r["value_int"] is not None:
            value = int(r["value_int"])
    attributes = untag_nonfinite(_json(r.get("attributes"))) or None
    if kind == "metric":
        return MetricPoint(*head, value, r["unit"], r["step"], attributes)
    if kind == "event":
        return Event(*head, r["severity"], attributes, r["event_id"], r["span_id"])
    if kind == "span_start":
        return SpanStart(*head, r["span_id"], r["parent_id"], r["trace_id"], attributes)
    if kind == "span_end":
        return SpanEnd(*head, r["span_id"], r["duration_ns"], r["status"], attributes, r["error"])
    if kind == "stat":
        values = {k: number_of(v) for k, v in (_json(r["values"]) or {}).items()}
        return StatWindow(*head, r["start_mono_ns"], r["sample_count"], values, r["unit"], _json(r["histogram"]))
    if kind == "diagnostic":
        return Diagnostic(*head, r["sink"], r["record_count"], r["message"])
    raise ValueError(f"unknown record kind {kind!r}")


def identity_of_row(r: dict[str, Any], session: str, run: str) -> Identity:
    """The identity a row carries (its partition values plus its identity columns). The rows of a process share
    one: an ``Identity`` checks its names when made (~20 us), once per process rather than once per row."""
    return _identity(run, session, r["perf_tag"], r["rank"], r["local_rank"], r["world_size"], r["host"], r["pid"],
                     r["group_rank"], r["restart_count"], r["role"])


@functools.lru_cache(maxsize=4096)
def _identity(run: str, session: str, perf_tag: str, rank: int, local_rank: int, world_size: int, host: str, pid: int,
              group_rank: int, restart_count: int, role: str) -> Identity:
    return Identity(run_id=run, session_tag=session, perf_tag=perf_tag, rank=rank, local_rank=local_rank,
                    world_size=world_size, host=host, pid=pid, group_rank=group_rank, restart_count=restart_count,
                    role=role)
