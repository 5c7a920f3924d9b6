"""Records <-> JSON lines (format v1, specified in docs/format.md).

The encoder runs in the writer thread and builds each line with string formatting (names are escaped once and
cached), which is several times faster than ``json.dumps`` of a dict per record.

Non-finite floats are data and are kept exactly, in valid JSON:
- in numeric fields (``value``, stat values, durations) as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``;
- inside attribute dicts as ``{"$float": "NaN"}`` (etc.), so a string attribute ``"NaN"`` stays a string.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..identity import Identity
from ..records import Diagnostic, Event, MetricPoint, SpanEnd, SpanStart, StatWindow, pack

__all__ = ["decode_line", "encode", "encode_header"]

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_str_cache: dict[str, str] = {}
_dumps = json.dumps


def _s(value: str) -> str:
    """A JSON string literal, cached (names and groups repeat)."""
    out = _str_cache.get(value)
    if out is None:
        out = _dumps(value)
        if len(_str_cache) > 50_000:  # names made from unbounded data must not grow memory forever
            _str_cache.clear()
        _str_cache[value] = out
    return out


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


def _tag_nonfinite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return {"$float": "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")}
    if isinstance(obj, Mapping):
        return {str(k): _tag_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_tag_nonfinite(v) for v in obj]
    return obj


def _attrs(attributes: Mapping[str, Any] | None) -> str:
    if not attributes:
        return "{}"
    try:
        return _dumps(attributes, allow_nan=False, default=repr, separators=(",", ":"))
    except ValueError:  # a non-finite float somewhere inside
        return _dumps(_tag_nonfinite(attributes), allow_nan=False, default=repr, separators=(",", ":"))


# Encoders take packed records: (kind, mono_ns, wall_ns, identity token, group, name, *kind fields).


def _head(kind: str, p: Any) -> str:
    return f'{{"v":1,"kind":"{kind}","mono_ns":{p[1]},"wall_ns":{p[2]},"group":{_s(p[4])},"name":{_s(p[5])}'


def _enc_metric(p: Any) -> str:
    # MetricPoint fields after the head: value, unit, step
    tail = f',"unit":{_s(p[7])}' if p[7] else ""
    if p[8] is not None:
        tail += f',"step":{p[8]}'
    return (
        f'{{"v":1,"kind":"metric","mono_ns":{p[1]},"wall_ns":{p[2]},"group":{_s(p[4])},"name":{_s(p[5])},'
        f'"value":{_num(p[6])}{tail}}}\n'
    )


def _enc_event(p: Any) -> str:
    # Event: severity, attributes, event_id, span_id
    return (
        f'{_head("event", p)},"severity":{_s(p[6])},"attributes":{_attrs(p[7])},'
        f'"event_id":{_s(p[8])},"span_id":{_s(p[9])}}}\n'
    )


def _enc_span_start(p: Any) -> str:
    # SpanStart: span_id, parent_id, trace_id, attributes
    return (
        f'{_head("span_start", p)},"span_id":{_s(p[6])},"parent_id":{_s(p[7])},'
        f'"trace_id":{_s(p[8])},"attributes":{_attrs(p[9])}}}\n'
    )


def _enc_span_end(p: Any) -> str:
    # SpanEnd: span_id, duration_ns, status, attributes, error
    return (
        f'{_head("span_end", p)},"span_id":{_s(p[6])},"duration_ns":{p[7]},"status":{_s(p[8])},'
        f'"attributes":{_attrs(p[9])},"error":{_s(p[10])}}}\n'
    )


def _enc_stat(p: Any) -> str:
    # StatWindow: start_mono_ns, count, values, unit
    values = ",".join(f"{_s(k)}:{_num(v)}" for k, v in p[8].items())
    return f'{_head("stat", p)},"start_mono_ns":{p[6]},"count":{p[7]},"values":{{{values}}},"unit":{_s(p[9])}}}\n'


def _enc_diagnostic(p: Any) -> str:
    # Diagnostic: sink, count, message
    return f'{_head("diagnostic", p)},"sink":{_s(p[6])},"count":{p[7]},"message":{_s(p[8])}}}\n'


ENCODERS: dict[str, Callable[[Any], str]] = {
    MetricPoint.kind: _enc_metric,
    Event.kind: _enc_event,
    SpanStart.kind: _enc_span_start,
    SpanEnd.kind: _enc_span_end,
    StatWindow.kind: _enc_stat,
    Diagnostic.kind: _enc_diagnostic,
}


def encode(record: Any) -> str:
    """One record (typed or packed) as one JSON line, with the newline. The identity is not in the line: it is in
    the header of the file (``encode_header``)."""
    packed = record if type(record[0]) is str else pack(record, 0)
    return ENCODERS[packed[0]](packed)


def encode_header(identity: Identity, mono_ns: int, wall_ns: int, extra: Mapping[str, Any]) -> str:
    """The first line of every process file: who wrote the lines that follow."""
    obj = {"v": 1, "kind": "process", "mono_ns": mono_ns, "wall_ns": wall_ns, "identity": identity.as_dict(), **extra}
    return _dumps(_tag_nonfinite(obj), separators=(",", ":"), default=repr, allow_nan=False) + "\n"


# -- decoding ----------------------------------------------------------------------------------------------------------


def _f(value: Any) -> Any:
    """A numeric field back to its value."""
    if type(value) is str:
        try:
            return _NONFINITE[value]
        except KeyError:
            raise ValueError(f"not a number: {value!r}") from None
    return value


def _untag(obj: Any) -> Any:
    if isinstance(obj, dict):
        if len(obj) == 1 and "$float" in obj:
            return _NONFINITE[obj["$float"]]
        return {k: _untag(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_untag(v) for v in obj]
    return obj


def _attrs_in(obj: Any) -> dict[str, Any] | None:
    return _untag(obj) if obj else None


def decode_line(line: str | bytes, identity: Identity) -> Any:
    """One line back to its record (``identity`` comes from the file's header). Returns the header dict for a
    ``process`` line. Raises ``ValueError`` for a line that is not a v1 record."""
    obj = json.loads(line)
    if not isinstance(obj, dict) or obj.get("v") != 1:
        raise ValueError("not a format-v1 record")
    kind = obj["kind"]
    if kind == "process":
        return obj
    head = (obj["mono_ns"], obj["wall_ns"], identity, obj["group"], obj["name"])
    if kind == "metric":
        return MetricPoint(*head, _f(obj["value"]), obj.get("unit", ""), obj.get("step"))
    if kind == "event":
        return Event(*head, obj["severity"], _attrs_in(obj["attributes"]), obj["event_id"], obj["span_id"])
    if kind == "span_start":
        return SpanStart(*head, obj["span_id"], obj["parent_id"], obj["trace_id"], _attrs_in(obj["attributes"]))
    if kind == "span_end":
        return SpanEnd(
            *head, obj["span_id"], obj["duration_ns"], obj["status"], _attrs_in(obj["attributes"]), obj["error"]
        )
    if kind == "stat":
        values = {k: _f(v) for k, v in obj["values"].items()}
        return StatWindow(*head, obj["start_mono_ns"], obj["count"], values, obj["unit"])
    if kind == "diagnostic":
        return Diagnostic(*head, obj["sink"], obj["count"], obj["message"])
    raise ValueError(f"unknown record kind {kind!r}")
