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
``(kind, mono_ns, identity_token, group, name, *the kind's other fields)``, where trailing fields that have their
default value may be left out. Reasons, all measured (BENCHMARKS.md): CPython builds a plain tuple several times
faster than any class instance (~20 ns against ~150 ns for a tuple subclass); a plain tuple holding only strings and
numbers is *untracked* by the cyclic garbage collector after its first collection, whereas records holding a class,
an ``Identity`` object, a dict or a nested tuple stay tracked and make collections re-walk the whole queue (2-3x the
cost of the call with GC on); and every element less is less to allocate (a 6-tuple costs ~70 ns less than a
9-tuple with a second big int). So the identity travels as an int token, attributes flattened into the record (see
``ATTRIBUTE_LAYOUT``), and the
wall time is added by the consumer (``mono_ns + wall offset``, see ``Telemetry.refresh_clock``) -- except for a
record built elsewhere with its own wall time (``Telemetry.emit``): its time slot holds the pair ``(mono, wall)``.
The dispatcher thread unpacks (``unpack``) before a sink sees the typed record; the run-store writer reads packed
tuples directly.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple, Protocol

from .arguments import INT64_MAX, INT64_MIN
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
    "check_attribute_keys",
    "check_record",
    "pack",
    "unpack",
]

Number = int | float
Attributes = dict[str, Any]

SEVERITIES = ("debug", "info", "warning", "error", "critical")


class _MetricPointFields(NamedTuple):
    mono_ns: int
    wall_ns: int
    identity: Identity
    group: str
    name: str
    value: Number
    unit: str = ""
    step: int | None = None
    attributes: Attributes | None = None  # dimension labels (str keys; str, int, float or bool values)


class MetricPoint(_MetricPointFields):
    """One value of a named metric (torchelastic ``put_metric``, a derived training metric, a system sample).
    ``attributes``: a small dict of dimension labels (OpenTelemetry's data-point attributes, Prometheus' labels:
    ``{"disk.io.direction": "read"}``); one series per distinct set."""

    __slots__ = ()
    kind: ClassVar[str] = "metric"


class _EventFields(NamedTuple):
    mono_ns: int
    wall_ns: int
    identity: Identity
    group: str
    name: str
    severity: str = "info"
    attributes: Attributes | None = None
    event_id: str = ""
    span_id: str = ""


class Event(_EventFields):
    """Something that happened, with attributes. ``span_id`` links it to the span that was current."""

    __slots__ = ()
    kind: ClassVar[str] = "event"


class _SpanStartFields(NamedTuple):  # ids: hex strings (16 digits; trace 32), "" for none
    mono_ns: int
    wall_ns: int
    identity: Identity
    group: str
    name: str
    span_id: str
    parent_id: str = ""
    trace_id: str = ""
    attributes: Attributes | None = None


class SpanStart(_SpanStartFields):
    """A span was opened. Written at once, so a span still open at a crash is visible."""

    __slots__ = ()
    kind: ClassVar[str] = "span_start"


class _SpanEndFields(NamedTuple):
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


class SpanEnd(_SpanEndFields):
    """A span was closed. ``status`` is ``ok``, ``error`` or ``terminated``."""

    __slots__ = ()
    kind: ClassVar[str] = "span_end"


class _StatWindowFields(NamedTuple):
    mono_ns: int
    wall_ns: int
    identity: Identity
    group: str
    name: str
    start_mono_ns: int
    sample_count: int
    values: dict[str, Number]
    unit: str = ""
    histogram: dict[str, Any] | None = None


class StatWindow(_StatWindowFields):
    """A closed window of a stat: ``start_mono_ns`` to ``mono_ns``, its sample count, one value per aggregation,
    and (when the stat asks for it) the exponential histogram in OpenTelemetry's shape (see ``stats.histogram``)."""

    __slots__ = ()
    kind: ClassVar[str] = "stat"


class _DiagnosticFields(NamedTuple):
    mono_ns: int
    wall_ns: int
    identity: Identity
    group: str
    name: str  # what happened: "sink_error", "dropped", "sink_suspended", "sink_resumed"
    sink: str = ""
    record_count: int = 0
    message: str = ""


class Diagnostic(_DiagnosticFields):
    """telemetrain about itself: a sink failure, dropped records, a suspended sink."""

    __slots__ = ()
    kind: ClassVar[str] = "diagnostic"


class PackedSource(Protocol):
    """What turns packed records back into typed ones: the ``Telemetry`` that packed them."""

    def identity_of(self, token: int) -> Identity: ...

    @property
    def wall_offset_ns(self) -> int: ...


# Kinds with an attributes dict. Packed, their attributes are flattened to the end of the tuple, keys then values:
# ``(kind, time, token, group, name, *the other fields, *keys, *values)``. A nested tuple or dict would keep the
# record tracked by the GC for several collections (measured); one flat tuple of atomics is untracked at the first.
# Value: (index of the attributes field among the fields after ``name``, number of the other fields).
# A metric carries attributes only in its long form, ``(..., value, unit, step, *keys, *values)``: a packed metric of
# at most 8 elements has none (``metric_attributes``), so the short forms stay as they were.
ATTRIBUTE_LAYOUT: dict[str, tuple[int, int]] = {
    "event": (1, 3), "span_start": (3, 3), "span_end": (3, 4), "metric": (3, 3)
}
METRIC_PLAIN_LEN = 8  # ("metric", time, token, group, name, value, unit, step): the longest without attributes


def split_attributes(packed: tuple[Any, ...], n_other: int) -> tuple[tuple[Any, ...], dict[str, Any] | None]:
    """(the other fields, the attributes) of a packed record of a kind with attributes."""
    end = 5 + n_other
    tail = packed[end:]
    n = len(tail) // 2
    return packed[5:end], (dict(zip(tail[:n], tail[n:], strict=True)) if n else None)


def span_hex(value: Any) -> str:
    """A span id as 16 hex digits ("" for none). The tracer packs ints; records built elsewhere carry str."""
    if type(value) is str:
        return value
    return f"{value:016x}" if value else ""


def trace_hex(value: Any) -> str:
    if type(value) is str:
        return value
    return f"{value:032x}" if value else ""


def unpack(packed: tuple[Any, ...], identity: Identity, wall_offset_ns: int) -> Any:
    """A packed record -> its typed record."""
    kind = packed[0]
    mono = packed[1]
    if type(mono) is tuple:  # (mono, wall) of a record that came with its own wall time
        mono, wall = mono
        wall_offset_ns = wall - mono
    layout = ATTRIBUTE_LAYOUT.get(kind)
    if layout is None or (kind == "metric" and len(packed) <= METRIC_PLAIN_LEN):
        fields = packed[3:]
    else:
        at, n_other = layout
        other, attributes = split_attributes(packed, n_other)
        if kind == "span_start":  # ids in flight may be ints (see spans)
            other = (span_hex(other[0]), span_hex(other[1]), trace_hex(other[2]))
        elif kind == "span_end":
            other = (span_hex(other[0]), *other[1:])
        fields = (packed[3], packed[4], *other[:at], attributes, *other[at:])
    return KINDS[kind](mono, mono + wall_offset_ns, identity, *fields)


# Two metrics of one group at one instant, packed as one tuple: ``(METRIC_PAIR, mono, token, group, name, value,
# name2, value2)``. ``@prof`` emits two metrics per call; one packed tuple instead of two saves a tuple and an
# append on every profiled call. It exists only in flight: unpacking yields two ``MetricPoint`` records.
METRIC_PAIR = "metric_pair"


# A whole span, start and end, packed as one tuple at its end: ``(SPAN_PAIR, start_mono, token, group, name,
# span_id, parent_id, trace_id, duration_ns[, status, error[, n_start, *start keys, *start values, *end keys,
# *end values]])`` (status "ok" and error "" are left out when there are no attributes). A short span (one that
# ends before the tracer's next tick, see ``spans``) travels this way: one tuple and one append instead of two. It
# exists only in flight: it unpacks to a ``SpanStart`` and a ``SpanEnd`` and the run store writes it as those two
# lines.
SPAN_PAIR = "span_pair"
PAIRS = frozenset((METRIC_PAIR, SPAN_PAIR))  # in-flight kinds that stand for two records


def unpack_all(packed: tuple[Any, ...], identity: Identity, wall_offset_ns: int) -> list[Any]:
    """A packed record -> the typed records it stands for (two for a pair, else one)."""
    kind = packed[0]
    if kind in PAIRS:
        first, second = split_pair(packed) if kind == METRIC_PAIR else split_span_pair(packed)
        return [unpack(first, identity, wall_offset_ns), unpack(second, identity, wall_offset_ns)]
    return [unpack(packed, identity, wall_offset_ns)]


def split_pair(packed: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    _, time, token, group, name, value, name2, value2 = packed
    return ("metric", time, token, group, name, value), ("metric", time, token, group, name2, value2)


def split_span_pair(packed: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A ``SPAN_PAIR`` -> its packed ``span_start`` and ``span_end``."""
    if len(packed) == 9:
        _, start, token, group, name, span_id, parent_id, trace_id, duration = packed
        status, error = "ok", ""
    else:
        _, start, token, group, name, span_id, parent_id, trace_id, duration, status, error = packed[:11]
    begin = ("span_start", start, token, group, name, span_id, parent_id, trace_id)
    end = ("span_end", start + duration, token, group, name, span_id, duration, status, error)
    if len(packed) <= 11:
        return begin, end
    n_start = packed[11]
    tail = packed[12:]
    n_end = (len(tail) - 2 * n_start) // 2
    return begin + tail[: 2 * n_start], end + tail[2 * n_start : 2 * n_start + 2 * n_end]


def unpack_batch(packed: Any, source: PackedSource) -> list[Any]:
    offset = source.wall_offset_ns
    identity_of = source.identity_of
    out: list[Any] = []
    for p in packed:
        if p[0] in PAIRS:
            out.extend(unpack_all(p, identity_of(p[2]), offset))
        else:
            out.append(unpack(p, identity_of(p[2]), offset))
    return out


def pack(record: Any, token: int) -> tuple[Any, ...]:
    """A typed record -> its packed form, with ``token`` standing for its identity."""
    head = (record.kind, (record[0], record[1]), token, record[3], record[4])
    layout = ATTRIBUTE_LAYOUT.get(record.kind)
    if layout is None:
        return (*head, *record[5:])
    at, _ = layout
    fields = record[5:]
    attributes = fields[at] or {}
    if not attributes and record.kind == "metric":
        return (*head, *fields[:at])
    return (*head, *fields[:at], *fields[at + 1 :], *attributes, *attributes.values())


Record = MetricPoint | Event | SpanStart | SpanEnd | StatWindow | Diagnostic

KINDS: dict[str, type] = {cls.kind: cls for cls in (MetricPoint, Event, SpanStart, SpanEnd, StatWindow, Diagnostic)}


# -- validation of typed records built elsewhere (``Telemetry.emit``) ------------------------------------------------
# Each field's type, as the run store writes it: a value of another type would make a line that is not valid JSON
# ("duration_ns":nan) or that the reader drops. "int": an integer (bool refused), "int?" or None; "real": a real
# number, NaN/inf kept (they are data); "str"/"name": a str (non-empty); "attrs": None or a mapping with str keys;
# "values": a mapping of str to real numbers; "map?": None or a mapping.
_SPEC: dict[str, tuple[tuple[str, str], ...]] = {
    "metric": (("value", "real"), ("unit", "str"), ("step", "int?")),
    "event": (("severity", "severity"), ("attributes", "attrs"), ("event_id", "str"), ("span_id", "str")),
    "span_start": (("span_id", "str"), ("parent_id", "str"), ("trace_id", "str"), ("attributes", "attrs")),
    "span_end": (("span_id", "str"), ("duration_ns", "int"), ("status", "str"), ("attributes", "attrs"),
                 ("error", "str")),
    "stat": (("start_mono_ns", "int"), ("sample_count", "int"), ("values", "values"), ("unit", "str"),
             ("histogram", "map?")),
    "diagnostic": (("sink", "str"), ("record_count", "int"), ("message", "str")),
}


def _kind_error(field: str, want: str, value: Any) -> TypeError:
    return TypeError(f"record.{field} must be {want}, got {type(value).__name__}: {_short(value)}")


def _short(value: Any) -> str:
    try:
        return f"{value!r:.80}"
    except Exception:  # noqa: BLE001 - only for the message
        return "<unprintable>"


def check_attribute_keys(attributes: Any, arg: str) -> None:
    """Attribute keys are str (a str subclass, a str Enum member, is one): a tuple, a frozenset or an object would
    be stored under a made-up text, or not at all. ``TypeError`` naming ``arg`` and the key."""
    try:
        "".join(attributes)
    except TypeError:
        bad = next((k for k in attributes if not isinstance(k, str)), None)
        raise TypeError(f"{arg} keys must be str, got {type(bad).__name__}: {_short(bad)}") from None


_COMMON = (("mono_ns", "int"), ("wall_ns", "int"), ("group", "name"), ("name", "name"))
# per kind: (index in the record, field, want), and the exact types that pass without a closer look
_CHECKS = {
    cls.kind: tuple((cls._fields.index(field), field, want) for field, want in (*_COMMON, *_SPEC[cls.kind]))
    for cls in (MetricPoint, Event, SpanStart, SpanEnd, StatWindow, Diagnostic)
}
_NONE = type(None)
_FAST_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "int?": (int, _NONE), "real": (int, float), "str": (str,), "name": (str,), "severity": (str,),
    "attrs": (dict, _NONE), "map?": (dict, _NONE), "values": (dict,),
}


def check_record(record: Any) -> None:
    """Refuse a typed record that would not be stored as a valid line: ``TypeError`` (or ``ValueError`` for a value
    out of range) naming the field. NaN and infinities in a metric or stat *value* are data and pass. (A few
    hundred ns for a usual record: exact types pass at once, anything else gets the closer look.)"""
    for index, field, want in _CHECKS[record.kind]:
        value = record[index]
        if type(value) in _FAST_TYPES[want]:
            if want == "name":
                if value:
                    continue
            elif want == "severity":
                if value in SEVERITIES:
                    continue
            elif want == "int" or want == "int?":
                if value is None or INT64_MIN <= value <= INT64_MAX:
                    continue
            elif want == "attrs" or want == "values":
                if not value or (want == "attrs" and _str_keys(value)) or (
                        want == "values" and _str_keys(value) and all(type(v) in (int, float) for v in value.values())):
                    continue
            else:
                continue
        _check_field(field, want, value)


def _str_keys(mapping: Any) -> bool:
    try:
        "".join(mapping)
    except TypeError:
        return False
    return True


def _check_field(field: str, want: str, value: Any) -> None:
    """The closer look: accept what the store can write (an int subclass, a numpy number, a non-dict mapping),
    raise naming the field for the rest."""
    if want in ("int", "int?"):
        if value is None and want == "int?":
            return
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise _kind_error(field, "an int", value)
        if not INT64_MIN <= int(value) <= INT64_MAX:
            bits = int(value).bit_length()
            raise ValueError(f"record.{field} is out of the signed 64-bit range ({bits}-bit magnitude)")
    elif want == "real":
        if not isinstance(value, numbers.Real):
            raise _kind_error(field, "an int or float", value)
    elif want in ("str", "name"):
        if not isinstance(value, str):
            raise _kind_error(field, "a str", value)
        if want == "name" and not value:
            raise ValueError(f"record.{field} must be a non-empty str")
    elif want == "severity":
        if value not in SEVERITIES:
            raise ValueError(f"record.severity must be one of {', '.join(SEVERITIES)}, got {_short(value)}")
    elif want in ("attrs", "map?", "values"):
        if value is None and want != "values":
            return
        if not isinstance(value, Mapping):
            raise _kind_error(field, "a mapping" if want == "values" else "a mapping or None", value)
        if want != "map?":
            check_attribute_keys(value, f"record.{field}")
        if want == "values":
            for key, number in value.items():
                if not isinstance(number, numbers.Real):
                    raise _kind_error(f"{field}[{key!r}]", "an int or float", number)
