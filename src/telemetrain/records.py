"""The record types every stage shares: instrumentation builds them, the router routes them, sinks consume them and
the run-store reader gives them back.

Records are immutable, slotted tuples (``typing.NamedTuple``): cheap to build on the training thread, safe to share
between sinks and threads. Every record starts with the same five fields::

    mono_ns   monotonic clock (CLOCK_MONOTONIC), ns: durations and ordering within a process
    wall_ns   wall clock (Unix epoch), ns: lining processes and hosts up
    identity  the Identity of the process that produced it (shared by reference)
    group     routing key (the torchelastic metric group, an event domain, ...)
    name      dotted lowercase name

Attribute dicts are owned by the record once it is built: callers hand over a fresh dict (the APIs copy).

On the training thread a record travels *packed*: a plain tuple ``(RecordClass, field0, field1, ...)``. CPython
builds a plain tuple several times faster than any class instance (~20 ns against ~150 ns for a tuple subclass), so
the hot paths pack and the dispatcher thread unpacks (``unpack``) before a sink sees the typed record. Sinks that
set ``accepts_packed`` (the run-store writer) read packed tuples directly.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .identity import Identity

__all__ = [
    "KINDS",
    "SEVERITIES",
    "Diagnostic",
    "Event",
    "MetricPoint",
    "Record",
    "SpanEnd",
    "SpanStart",
    "StatWindow",
    "pack",
    "unpack",
]

Number = int | float
Attributes = dict[str, Any]

SEVERITIES = ("debug", "info", "warning", "error", "critical")


class MetricPoint(NamedTuple):
    """One value of a named metric (torchelastic ``put_metric``, a derived training metric, a system sample)."""

    mono_ns: int
    wall_ns: int
    identity: Identity
    group: str
    name: str
    value: Number
    unit: str = ""
    step: int | None = None

    kind = "metric"


class Event(NamedTuple):
    """Something that happened, with attributes. ``span_id`` links it to the span that was current."""

    mono_ns: int
    wall_ns: int
    identity: Identity
    group: str
    name: str
    severity: str = "info"
    attributes: Attributes | None = None
    event_id: str = ""
    span_id: str = ""

    kind = "event"


class SpanStart(NamedTuple):
    """A span was opened. Written at once, so a span still open at a crash is visible."""

    mono_ns: int
    wall_ns: int
    identity: Identity
    group: str
    name: str
    span_id: str
    parent_id: str = ""
    trace_id: str = ""
    attributes: Attributes | None = None

    kind = "span_start"


class SpanEnd(NamedTuple):
    """A span was closed. ``status`` is ``ok``, ``error`` or ``terminated``."""

    mono_ns: int
    wall_ns: int
    identity: Identity
    group: str
    name: str
    span_id: str
    duration_ns: int
    status: str = "ok"
    attributes: Attributes | None = None
    error: str = ""

    kind = "span_end"


class StatWindow(NamedTuple):
    """A closed window of a stat: its bounds, its sample count and one value per aggregation."""

    mono_ns: int
    wall_ns: int
    identity: Identity
    group: str
    name: str
    start_mono_ns: int
    count: int
    values: dict[str, Number]
    unit: str = ""

    kind = "stat"


class Diagnostic(NamedTuple):
    """telemetrain about itself: a sink failure, dropped records, a suspended sink."""

    mono_ns: int
    wall_ns: int
    identity: Identity
    group: str
    name: str  # what happened: "sink_error", "dropped", "sink_suspended", "sink_resumed"
    sink: str = ""
    count: int = 0
    message: str = ""

    kind = "diagnostic"


_new = tuple.__new__


def unpack(packed: tuple[Any, ...]) -> Any:
    """``(RecordClass, *fields)`` -> ``RecordClass(*fields)``."""
    return _new(packed[0], packed[1:])


def pack(record: Any) -> tuple[Any, ...]:
    """A typed record -> ``(RecordClass, *fields)``."""
    return (type(record), *record)


Record = MetricPoint | Event | SpanStart | SpanEnd | StatWindow | Diagnostic

KINDS: dict[str, type] = {
    cls.kind: cls for cls in (MetricPoint, Event, SpanStart, SpanEnd, StatWindow, Diagnostic)
}
