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

On the training thread a record travels *packed*: a plain tuple of atomic values
``(kind, mono_ns, wall_ns, identity_token, group, name, *the kind's other fields)``. Two reasons, both measured
(BENCHMARKS.md): CPython builds a plain tuple several times faster than any class instance (~20 ns against ~150 ns
for a tuple subclass), and a plain tuple holding only strings and numbers is *untracked* by the cyclic garbage
collector after its first collection, whereas records holding a class or an ``Identity`` object stay tracked and
make every collection re-walk the whole queue (2-3x the cost of the call with GC on). The identity travels as an int
token that the owning ``Telemetry`` maps back. The dispatcher thread unpacks (``unpack``) before a sink sees the
typed record; the run-store writer reads packed tuples directly.
"""

from __future__ import annotations

from collections.abc import Callable
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
IdentityOf = Callable[[int], Identity]


def unpack(packed: tuple[Any, ...], identity_of: IdentityOf) -> Any:
    """A packed record -> its typed record, the identity token resolved by ``identity_of``."""
    return _new(KINDS[packed[0]], (packed[1], packed[2], identity_of(packed[3]), *packed[4:]))


def pack(record: Any, token: int) -> tuple[Any, ...]:
    """A typed record -> its packed form, with ``token`` standing for its identity."""
    return (record.kind, record[0], record[1], token, *record[3:])


Record = MetricPoint | Event | SpanStart | SpanEnd | StatWindow | Diagnostic

KINDS: dict[str, type] = {cls.kind: cls for cls in (MetricPoint, Event, SpanStart, SpanEnd, StatWindow, Diagnostic)}
