"""Spans, one-logger's model (``nv_one_logger.core.span`` and ``nv_one_logger.training_telemetry.api.spans``).

A ``Span`` is what one-logger's callbacks return and its exporters receive: ``id``, ``name``, ``parent_span``,
``attributes`` (the initial ones merged with those added later), ``updated_attributes``, ``events`` (the first is
``span_start``; ``stop()`` appends ``span_stop`` and sets ``duration_msec``), ``start_event``, ``stop_event``,
``active``. Differences from one-logger, each on purpose:

- ``parent_span`` is the nearest ancestor that is exported: when export customization filters out a span (by default
  the iterations), its children hang from the filtered span's own exported ancestor instead of a parent no exporter
  ever saw (one-logger leaves them dangling, which OTel rejects). ``direct_parent_span`` is the span that was current
  when this one started.
- ``active`` is O(1) (one-logger formats the span's whole event list into an assertion message on every call, so a
  training loop's span cost grew with each metrics event).
- the id (a ``uuid4``) is drawn on first use: a span no exporter sees costs no random bytes.
- ``add_attributes`` also takes a plain ``{name: value}`` mapping.

``StandardTrainingJobSpanName`` is ``telemetrain.training.SpanName`` (one-logger's values; its testing iteration is
the upper-case ``"TESTING_SINGLE_ITERATION"``, written here in the lower case of the others).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from typing import Any, Union

from .attributes import Attribute, Attributes, AttributeValue
from .errors import OneLoggerError
from .events import Event, StandardEventName
from .names import SpanName as StandardTrainingJobSpanName
from .timestamps import TracingTimestamp

__all__ = [
    "NVTXColor",
    "Span",
    "SpanName",
    "StandardSpanAttributeName",
    "StandardSpanName",
    "StandardTrainingJobSpanName",
]

SpanName = Union[enum.Enum, str]  # noqa: UP007 - one-logger's alias: an Enum member or a str


class StandardSpanName(str, enum.Enum):
    APPLICATION = "application"

    def __str__(self) -> str:
        return self.value


class StandardSpanAttributeName(str, enum.Enum):
    DURATION_MSEC = "duration_msec"
    NVTX_COLOR = "nvtx_color"

    def __str__(self) -> str:
        return self.value


class NVTXColor(str, enum.Enum):
    """NVTX marker colours (declared by one-logger, which emits no NVTX range; nor do we)."""

    UNSET = "unset"
    GREEN = "green"
    BLUE = "blue"
    YELLOW = "yellow"
    PURPLE = "purple"
    RAPIDS = "rapids"
    CYAN = "cyan"
    RED = "red"
    WHITE = "white"
    DARK_GREEN = "darkgreen"
    ORANGE = "orange"

    def __str__(self) -> str:
        return self.value


_DURATION = StandardSpanAttributeName.DURATION_MSEC.value
_START, _STOP = StandardEventName.SPAN_START, StandardEventName.SPAN_STOP


def span_name_str(name: SpanName) -> str:
    return name._value_ if isinstance(name, enum.Enum) else name


class Span:
    """A unit of work with a start, an end, events and attributes (see the module docstring)."""

    __slots__ = (
        "__weakref__",
        "_active",
        "_events",
        "_export_parent",
        "_id",
        "_initial_attributes",
        "_name",
        "_name_str",
        "_ours",
        "_parent_span",
        "_shown",
        "_updated_attributes",
        "status",
    )

    def __init__(self, id: uuid.UUID | None, name: SpanName, start_event: Event, parent_span: Span | None = None,
                 span_attributes: Attributes | None = None) -> None:
        if not isinstance(start_event, Event):
            raise TypeError(f"start_event must be an Event, got {type(start_event).__name__}")
        if not isinstance(name, (str, enum.Enum)):
            raise TypeError(f"span name must be a str or an Enum member, got {type(name).__name__}")
        self._id = id
        self._name = name
        self._name_str: str = name._value_ if isinstance(name, enum.Enum) else name
        self._shown = True  # exported to the exporters (the recorder decides at the start)
        self._parent_span = parent_span
        self._export_parent = parent_span  # the recorder re-points it past filtered spans
        self._events: list[Event] = [start_event]
        if span_attributes is None:  # (an empty subclass instance keeps its class)
            span_attributes = Attributes()
        elif not isinstance(span_attributes, Attributes):
            span_attributes = Attributes(span_attributes)
        self._initial_attributes = span_attributes
        self._updated_attributes = type(span_attributes)()
        self._active = True
        self._ours: Any = None  # telemetrain's own span for this one (the run store's), when there is one
        self.status = "ok"

    @property
    def id(self) -> uuid.UUID:
        if self._id is None:
            self._id = uuid.uuid4()
        return self._id

    @property
    def name(self) -> SpanName:
        return self._name

    @property
    def name_str(self) -> str:
        return self._name_str

    @property
    def parent_span(self) -> Span | None:
        """The nearest exported ancestor (see the module docstring); the direct parent when nothing is filtered."""
        return self._export_parent

    @property
    def direct_parent_span(self) -> Span | None:
        return self._parent_span

    @property
    def events(self) -> list[Event]:
        return self._events

    @property
    def attributes(self) -> Attributes:
        """The initial attributes with those added later (a new object each call, of the initial set's class)."""
        return type(self._initial_attributes).merge(self._initial_attributes, self._updated_attributes)

    @property
    def updated_attributes(self) -> Attributes:
        return self._updated_attributes

    @property
    def initial_attributes(self) -> Attributes:
        return self._initial_attributes

    @property
    def start_event(self) -> Event:
        return self._events[0]

    @property
    def stop_event(self) -> Event | None:
        if self._active:
            return None
        return self._events[-1]

    @property
    def active(self) -> bool:
        return self._active

    @property
    def ended(self) -> bool:
        return not self._active

    @property
    def exported(self) -> bool:
        """Whether telemetrain's run store has this span (its own sampling); integrations written for telemetrain's
        spans skip work on the rest. True when there is no telemetrain span behind it."""
        ours = self._ours
        return True if ours is None else bool(ours.exported)

    @classmethod
    def create(cls, name: SpanName, parent_span: Span | None = None, span_attributes: Attributes | None = None,
               start_event_attributes: Attributes | None = None,
               start_time: TracingTimestamp | None = None) -> Span:
        start = Event(_START, start_time or TracingTimestamp.now(), start_event_attributes)
        return cls(None, name, start, parent_span=parent_span, span_attributes=span_attributes)

    def stop(self, stop_event_attributes: Attributes | None = None, stop_time: TracingTimestamp | None = None) -> None:
        """End the span (a second call does nothing): adds ``span_stop`` and ``duration_msec`` (whole
        milliseconds, truncated, from the perf counter: one-logger's definition)."""
        if not self._active:
            return
        stop = Event(_STOP, stop_time or TracingTimestamp.now(), stop_event_attributes)
        self._events.append(stop)
        self._active = False
        seconds = stop.timestamp.perf_counter_seconds - self._events[0].timestamp.perf_counter_seconds
        # whole ms, truncated, after rounding to the microsecond: times given in ms since the epoch, as seconds, carry
        # ~0.2 us of float error, and 50 ms apart must not truncate to 49
        self._updated_attributes[_DURATION] = Attribute(_DURATION, int(round(seconds * 1000, 3)))

    def add_event(self, event: Event) -> Event:
        if not isinstance(event, Event):
            raise TypeError(f"event must be an Event, got {type(event).__name__}")
        if not self._active:
            raise OneLoggerError(f"Cannot add an event to span {self.name_str}: it has ended.")
        self._events.append(event)
        return event

    def add_attribute(self, name: str, value: AttributeValue) -> Attribute:
        attribute = Attribute(name=name, value=value)
        self._updated_attributes[name] = attribute
        ours = self._ours
        if ours is not None:
            ours.set_attribute(name, value)
        return attribute

    def set_attribute(self, name: str, value: AttributeValue) -> None:
        """telemetrain's name for ``add_attribute`` (so code written for telemetrain spans works on these)."""
        self.add_attribute(name, value)

    def set_status(self, status: str, error: str = "") -> None:
        """Mark the span ``ok``/``error``/... in telemetrain's run store (one-logger's model has no status: its
        exporters are not told)."""
        self.status = status
        ours = self._ours
        if ours is not None:
            ours.set_status(status, error)

    def add_attributes(self, attributes: Mapping[str, Any]) -> None:
        if not isinstance(attributes, Mapping):
            raise TypeError(f"attributes must be Attributes or a mapping, got {type(attributes).__name__}")
        for name, attribute in attributes.items():
            self.add_attribute(name, attribute.value if isinstance(attribute, Attribute) else attribute)

    def duration_msec(self) -> int:
        """The duration, once the span has ended."""
        attribute = self._updated_attributes.get(_DURATION)
        if self._active or attribute is None:
            raise OneLoggerError(f"Span {self.name_str} has not ended: no duration yet.")
        value: int = attribute.value  # type: ignore[assignment]
        return value

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name_str, "id": str(self.id),
                               "events": [event.to_json() for event in self._events]}
        attributes = self.attributes
        if attributes:
            out["attributes"] = attributes.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Span:
        if not isinstance(data, dict) or not data.get("name") or not data.get("id") or not data.get("events"):
            raise TypeError(f"Span data must have a name, an id and a start event: {data!r}")
        events = [Event.from_json(event) for event in data["events"]]
        span = cls(uuid.UUID(str(data["id"])), data["name"], events[0],
                   span_attributes=Attributes.from_json(data.get("attributes")))
        for event in events[1:]:
            if event.name_str == _STOP.value:
                span._events.append(event)
                span._active = False
            else:
                span.add_event(event)
        return span

    def __repr__(self) -> str:
        return f"Span(name={self.name_str!r}, active={self._active})"
