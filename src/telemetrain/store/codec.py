"""Records <-> JSON lines (format v2, specified in docs/format.md; v1 lines still decode).

The encoder runs in the writer thread and builds each line with string formatting (names are escaped once and
cached), which is several times faster than ``json.dumps`` of a dict per record.

Non-finite floats are data and are kept exactly, in valid JSON:
- in numeric fields (``value``, stat values, durations) as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``;
- inside attribute dicts as ``{"$float": "NaN"}`` (etc.), so a string attribute ``"NaN"`` stays a string.

Every line is valid JSON that the reader loads, whatever reaches the encoder: a string field that is not a ``str``
or an integer field (times, counts, steps, durations) that is not an ``int`` makes the encoder raise, and the
writer puts an ``unencodable`` diagnostic line in the record's place (the APIs refuse such values at the call;
this is the last line of defence).
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..identity import Identity
from ..records import (
    METRIC_PAIR,
    METRIC_PLAIN_LEN,
    SPAN_PAIR,
    Diagnostic,
    Event,
    MetricPoint,
    SpanEnd,
    SpanStart,
    StatWindow,
    pack,
    span_hex,
    split_attributes,
    split_pair,
    split_span_pair,
    trace_hex,
)

__all__ = ["decode_identity", "decode_line", "encode", "encode_header", "loads", "loads_column"]

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_str_cache: dict[str, str] = {}
_dumps = json.dumps


def _s(value: str) -> str:
    """A JSON string literal, cached (names and groups repeat). Anything but a str raises (checked on a cache miss
    only: a cached key is a str)."""
    out = _str_cache.get(value)
    if out is None:
        if not isinstance(value, str):
            raise TypeError(f"a string field holds {type(value).__name__}: {value!r:.80}")
        out = _dumps(value)
        if len(_str_cache) > 50_000:  # names made from unbounded data must not grow memory forever
            _str_cache.clear()
        _str_cache[value] = out
    return out


def _int(value: Any) -> str:
    """An integer field (a time, a count, a step, a duration): a 64-bit int, never a float, NaN or bool (the reader
    skips a line holding a larger one as corrupt)."""
    if type(value) is int:
        if -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
            return int.__repr__(value)
        raise ValueError(f"an integer field is out of the signed 64-bit range ({value.bit_length()}-bit magnitude)")
    if not isinstance(value, (bool, float)):
        try:
            index = operator.index(value)  # an int subclass, a numpy integer
        except TypeError:
            pass
        else:
            return _int(index)
    raise TypeError(f"an integer field holds {type(value).__name__}: {value!r:.80}")


def _num(value: Any) -> str:
    t = type(value)
    if t is int:
        return int.__repr__(value)
    if t is float:
        if value - value == 0.0:
            return float.__repr__(value)
        return '"NaN"' if value != value else ('"Infinity"' if value > 0 else '"-Infinity"')
    if t is bool:
        return "true" if value else "false"
    if value is None:
        return "null"
    return _num(float(value)) if isinstance(value, float) else _num(int(value))


def tag_nonfinite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return {"$float": "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")}
    if isinstance(obj, Mapping):
        return {str(k): tag_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [tag_nonfinite(v) for v in obj]
    return obj


def _attrs(attributes: Mapping[str, Any] | None) -> str:
    if not attributes:
        return "{}"
    try:
        return _dumps(attributes, allow_nan=False, default=repr, separators=(",", ":"))
    except ValueError:  # a non-finite float somewhere inside
        return _dumps(tag_nonfinite(attributes), allow_nan=False, default=repr, separators=(",", ":"))


# Encoders take a packed record (kind, mono_ns, identity token, group, name, *fields; trailing defaults may be
# missing, see records) and the wall offset of its producer: wall_ns = mono_ns + offset.

_TAILS: dict[str, tuple[Any, ...]] = {
    cls.kind: tuple(cls._field_defaults.get(f) for f in cls._fields[5:])
    for cls in (MetricPoint, Event, SpanStart, SpanEnd, StatWindow, Diagnostic)
}


def _full(p: Any) -> Any:
    """The packed record with its omitted trailing fields filled with their defaults."""
    tail = _TAILS[p[0]]
    missing = len(tail) + 5 - len(p)
    return p + tail[len(tail) - missing :] if missing else p


def _times(p: Any, off: int) -> tuple[Any, Any]:
    t = p[1]
    if type(t) is int:
        return t, t + off
    mono, wall = t  # (mono, wall) for a record that came with its own wall time
    return _int(mono), _int(wall)


FORMAT_VERSION = 2  # written on every line; v1 (no metric attributes, the older system names) is still read
READ_VERSIONS = frozenset({1, 2})


def _head(kind: str, p: Any, off: int) -> str:
    mono, wall = _times(p, off)
    return f'{{"v":2,"kind":"{kind}","mono_ns":{mono},"wall_ns":{wall},"group":{_s(p[3])},"name":{_s(p[4])}'


def _enc_metric(p: Any, off: int) -> str:
    # MetricPoint fields after the head: value[, unit[, step[, *attribute keys, *attribute values]]]
    tail = ""
    if len(p) > 6:
        if p[6]:
            tail = f',"unit":{_s(p[6])}'
        if len(p) > 7 and p[7] is not None:
            tail += f',"step":{_int(p[7])}'
        if len(p) > METRIC_PLAIN_LEN:
            tail += f',"attributes":{_attrs(split_attributes(p, 3)[1])}'
    mono, wall = _times(p, off)
    return (
        f'{{"v":2,"kind":"metric","mono_ns":{mono},"wall_ns":{wall},"group":{_s(p[3])},"name":{_s(p[4])},'
        f'"value":{_num(p[5])}{tail}}}\n'
    )


def _enc_event(p: Any, off: int) -> str:
    # Event, packed: severity, event_id, span_id, *attribute keys, *attribute values
    (severity, event_id, span_id), attributes = split_attributes(p, 3)
    return (
        f'{_head("event", p, off)},"severity":{_s(severity)},"attributes":{_attrs(attributes)},'
        f'"event_id":{_s(event_id)},"span_id":{_s(span_id)}}}\n'
    )


def _id(value: Any, trace: bool = False) -> str:
    """A span or trace id as a JSON string: the tracer's ints as hex (no escaping needed), anything else escaped."""
    if type(value) is int and value >= 0:
        if not value:
            return '""'
        return f'"{value:032x}"' if trace else f'"{value:016x}"'
    return _s(trace_hex(value) if trace else span_hex(value)) if type(value) is str else _s(str(value))


def _enc_span_start(p: Any, off: int) -> str:
    # SpanStart, packed: span_id, parent_id, trace_id, *attributes (ids: hex str, or ints from the tracer)
    (span_id, parent_id, trace_id), attributes = split_attributes(p, 3)
    return (
        f'{_head("span_start", p, off)},"span_id":{_id(span_id)},"parent_id":{_id(parent_id)},'
        f'"trace_id":{_id(trace_id, trace=True)},"attributes":{_attrs(attributes)}}}\n'
    )


def _enc_span_end(p: Any, off: int) -> str:
    # SpanEnd, packed: span_id, duration_ns, status, error, *attributes
    (span_id, duration_ns, status, error), attributes = split_attributes(p, 4)
    return (
        f'{_head("span_end", p, off)},"span_id":{_id(span_id)},"duration_ns":{_int(duration_ns)},'
        f'"status":{_s(status)},"attributes":{_attrs(attributes)},"error":{_s(error)}}}\n'
    )


def _histogram(histogram: Any) -> str:
    try:
        return _dumps(histogram, separators=(",", ":"), allow_nan=False)
    except ValueError:  # finite samples whose sum overflowed, say: tagged, as attributes are
        return _dumps(tag_nonfinite(histogram), separators=(",", ":"), allow_nan=False)


def _enc_stat(p: Any, off: int) -> str:
    # StatWindow: start_mono_ns, sample_count, values, unit, histogram
    p = _full(p)
    values = ",".join(f"{_s(k)}:{_num(v)}" for k, v in p[7].items())
    histogram = "" if p[9] is None else f',"histogram":{_histogram(p[9])}'
    return (
        f'{_head("stat", p, off)},"start_mono_ns":{_int(p[5])},"count":{_int(p[6])},"values":{{{values}}},'
        f'"unit":{_s(p[8])}{histogram}}}\n'
    )


def _enc_diagnostic(p: Any, off: int) -> str:
    # Diagnostic: sink, record_count, message
    p = _full(p)
    return f'{_head("diagnostic", p, off)},"sink":{_s(p[5])},"count":{_int(p[6])},"message":{_s(p[7])}}}\n'


def _enc_metric_pair(p: Any, off: int) -> str:
    first, second = split_pair(p)
    return _enc_metric(first, off) + _enc_metric(second, off)


def _enc_span_pair(p: Any, off: int) -> str:
    first, second = split_span_pair(p)
    return _enc_span_start(first, off) + _enc_span_end(second, off)


ENCODERS: dict[str, Callable[[Any, int], str]] = {
    METRIC_PAIR: _enc_metric_pair,
    SPAN_PAIR: _enc_span_pair,
    MetricPoint.kind: _enc_metric,
    Event.kind: _enc_event,
    SpanStart.kind: _enc_span_start,
    SpanEnd.kind: _enc_span_end,
    StatWindow.kind: _enc_stat,
    Diagnostic.kind: _enc_diagnostic,
}


def encode(record: Any) -> str:
    """One typed record as one JSON line, with the newline. The identity is not in the line: it is in the header of
    the file (``encode_header``)."""
    return ENCODERS[record.kind](pack(record, 0), 0)


def encode_header(identity: Identity, mono_ns: int, wall_ns: int, extra: Mapping[str, Any]) -> str:
    """The first line of every process file: who wrote the lines that follow."""
    obj = {"v": FORMAT_VERSION, "kind": "process", "mono_ns": mono_ns, "wall_ns": wall_ns,
           "identity": identity.as_dict(), **extra}
    return _dumps(tag_nonfinite(obj), separators=(",", ":"), default=repr, allow_nan=False) + "\n"


# -- decoding ----------------------------------------------------------------------------------------------------------
# Every field is type-checked here: a well-formed JSON line with a field of the wrong type is as corrupt as a broken
# line, and is skipped and counted by the readers rather than crashing an analysis later. The columnar conversion
# (store/columnar.py) applies the same rules in SQL; tests check the two agree line by line.

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _reject_constant(name: str) -> Any:
    raise ValueError(f"bare {name} is not JSON")  # the writer never writes NaN/Infinity literals


_loads = json.JSONDecoder(parse_constant=_reject_constant).decode


def _int64(value: Any) -> bool:
    return type(value) is int and INT64_MIN <= value <= INT64_MAX


def _f(value: Any) -> Any:
    """A numeric field back to its value: a number, a bool, or a non-finite tag string. An integer past the 64-bit
    range comes back as a float (as the columnar copy stores it)."""
    t = type(value)
    if t is float or t is bool:
        return value
    if t is int:
        if INT64_MIN <= value <= INT64_MAX:
            return value
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if t is str:
        try:
            return _NONFINITE[value]
        except KeyError:
            raise ValueError(f"not a number: {value!r}") from None
    raise ValueError(f"not a number: {value!r}")


def untag_nonfinite(obj: Any) -> Any:
    """Tags back to floats. Only the exact shape ``{"$float": "NaN" | "Infinity" | "-Infinity"}`` is a tag: any
    other dict, ``{"$float": None}`` say, is the caller's data and stays as it is."""
    if isinstance(obj, dict):
        if len(obj) == 1 and "$float" in obj:
            tagged = obj["$float"]
            if type(tagged) is str and tagged in _NONFINITE:
                return _NONFINITE[tagged]
        return {k: untag_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [untag_nonfinite(v) for v in obj]
    return obj


def _attrs_in(obj: Any) -> dict[str, Any] | None:
    if obj is None:
        return None
    if type(obj) is not dict:
        raise ValueError("attributes must be an object")
    return untag_nonfinite(obj) if obj else None


def _str(obj: dict[str, Any], key: str, default: str | None = None) -> str:
    value = obj.get(key, default) if default is not None else obj[key]
    if type(value) is not str:
        raise ValueError(f"{key} must be a string")
    return value


def _i64(obj: dict[str, Any], key: str) -> int:
    value = obj[key]
    if not _int64(value):
        raise ValueError(f"{key} must be a 64-bit integer")
    return value  # type: ignore[no-any-return]


def decode_identity(header: Any) -> Identity:
    """The identity of a ``process`` header line; ``ValueError`` if it is not a valid one."""
    if type(header) is not dict or type(header.get("identity")) is not dict:
        raise ValueError("a process header without an identity object")
    if type(header.get("v")) is not int or header["v"] not in READ_VERSIONS:
        raise ValueError("not a format-v1/v2 header")
    try:
        identity = Identity.from_dict(header["identity"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid identity: {exc}") from None
    for name in ("rank", "local_rank", "world_size", "pid", "group_rank", "restart_count"):
        if not _int64(getattr(identity, name)):
            raise ValueError(f"identity.{name} out of range")
    if type(identity.host) is not str or type(identity.role) is not str:
        raise ValueError("identity.host and identity.role must be strings")
    return identity


def loads(line: str | bytes) -> Any:
    """``json.loads`` as the readers use it: strict JSON (no NaN literals), ``ValueError`` for anything it cannot
    take. A value of the line's object nested deeper than Python decodes reads as an empty one of its type
    (``_emptied``), as the engine's readers show what DuckDB kept (``loads_column``): both readers keep the line."""
    text = line if isinstance(line, str) else line.decode("utf-8")
    try:
        return _loads(text)
    except RecursionError:
        pass
    try:
        return _loads(_emptied(text))
    except RecursionError:
        raise ValueError("nested too deeply") from None


# a JSON string (escapes included), or a bracket outside one
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _emptied(text: str) -> str:
    """``text`` with each value of its top-level object that Python cannot decode for its depth replaced by ``{}`` or
    ``[]``: a scan of brackets outside strings, linear in the line, run only for a line that failed so."""
    out: list[str] = []
    depth = start = done = 0
    for token in _TOKEN.finditer(text):
        char = token.group()
        if char in "{[":
            depth += 1
            start = token.start() if depth == 2 else start
        elif char in "}]":
            if depth == 2:
                try:
                    json.loads(text[start:token.end()])
                except RecursionError:
                    out += (text[done:start], "{}" if char == "}" else "[]")
                    done = token.end()
                except ValueError:
                    pass  # broken: the whole line's decoding says so
            depth -= 1
    return "".join(out) + text[done:]


def loads_column(text: str | None) -> Any:
    """A JSON column of the engine's rows (attributes, a report's values), non-finite floats untagged; None for NULL,
    and for JSON nested deeper than Python decodes: DuckDB keeps such a line where the Python reader counts it
    corrupt, and a hostile store must not crash the reader that meets it."""
    if text is None:
        return None
    try:
        return untag_nonfinite(json.loads(text))
    except (RecursionError, ValueError):
        return None


def decode_line(line: str | bytes, identity: Identity) -> Any:
    """One line back to its record (``identity`` comes from the file's header). Returns the header dict for a
    ``process`` line. Raises ``ValueError`` for a line that is not a valid v1 or v2 record (a field of the wrong
    type included); nothing else."""
    try:
        return _decode(loads(line), identity)
    except (KeyError, TypeError, AttributeError, IndexError, OverflowError) as exc:
        raise ValueError(f"not a v1/v2 record: {type(exc).__name__}: {exc}") from None


def _decode(obj: Any, identity: Identity) -> Any:
    if type(obj) is not dict or type(obj.get("v")) is not int or obj["v"] not in READ_VERSIONS:
        raise ValueError("not a format-v1/v2 record")
    kind = obj.get("kind")
    if kind == "process":
        decode_identity(obj)
        return obj
    mono, wall, group, name = _i64(obj, "mono_ns"), _i64(obj, "wall_ns"), _str(obj, "group"), _str(obj, "name")
    if kind == "metric":
        step = obj.get("step")
        if step is not None and not _int64(step):
            raise ValueError("metric step must be a 64-bit integer")
        return MetricPoint(mono, wall, identity, group, name, _f(obj["value"]), _str(obj, "unit", ""), step,
                           _attrs_in(obj.get("attributes")))
    if kind == "event":
        return Event(mono, wall, identity, group, name, _str(obj, "severity"), _attrs_in(obj["attributes"]),
                     _str(obj, "event_id"), _str(obj, "span_id"))
    if kind == "span_start":
        return SpanStart(mono, wall, identity, group, name, _str(obj, "span_id"), _str(obj, "parent_id"),
                         _str(obj, "trace_id"), _attrs_in(obj["attributes"]))
    if kind == "span_end":
        return SpanEnd(mono, wall, identity, group, name, _str(obj, "span_id"), _i64(obj, "duration_ns"),
                       _str(obj, "status"), _attrs_in(obj["attributes"]), _str(obj, "error"))
    if kind == "stat":
        values = obj["values"]
        if type(values) is not dict:
            raise ValueError("stat values must be an object")
        histogram = obj.get("histogram")
        if histogram is not None and type(histogram) is not dict:
            raise ValueError("histogram must be an object")
        return StatWindow(mono, wall, identity, group, name, _i64(obj, "start_mono_ns"), _i64(obj, "count"),
                          {k: _f(v) for k, v in values.items()}, _str(obj, "unit"), histogram)
    if kind == "diagnostic":
        return Diagnostic(mono, wall, identity, group, name, _str(obj, "sink"), _i64(obj, "count"),
                          _str(obj, "message"))
    raise ValueError(f"unknown record kind {kind!r}")
