"""Events, one-logger's model (``nv_one_logger.core.event`` and ``nv_one_logger.training_telemetry.api.events``):
``Event`` (a named point in time with attributes), ``ErrorEvent`` (an application error), ``TelemetryDataError``
(a gap in the telemetry itself), and the standard event names.

Unlike one-logger, building an event does not change the ``Attributes`` passed in (one-logger adds
``timestamp_msec`` to the caller's object, so reusing it leaks the key into the next event).
"""

from __future__ import annotations

import enum
import traceback
from typing import Any, Union

from .attributes import Attribute, Attributes
from .names import EventName as StandardTrainingJobEventName
from .timestamps import TracingTimestamp

__all__ = [
    "ErrorEvent",
    "Event",
    "EventName",
    "StandardEventAttributeName",
    "StandardEventName",
    "StandardTrainingJobEventName",
    "TelemetryDataError",
]


class StandardEventName(str, enum.Enum):
    """The events every span may have, whatever the domain."""

    SPAN_START = "span_start"
    SPAN_STOP = "span_stop"
    ERROR = "error"
    TELEMETRY_DATA_ERROR = "telemetry_data_error"

    def __str__(self) -> str:
        return self.value


class StandardEventAttributeName(str, enum.Enum):
    TIMESTAMP_MSEC = "timestamp_msec"
    ERROR_MESSAGE = "error_message"
    EXCEPTION_TYPE = "exception_type"
    EXCEPTION_MESSAGE = "exception_message"
    EXCEPTION_TRACEBACK = "exception_traceback"
    TELEMETRY_DATA_ERROR_TYPE = "telemetry_data_error_type"

    def __str__(self) -> str:
        return self.value


EventName = Union[enum.Enum, str]  # noqa: UP007 - one-logger's alias: an Enum member or a str
_TIMESTAMP_MSEC = StandardEventAttributeName.TIMESTAMP_MSEC.value


def _name_str(name: EventName) -> str:
    return name.value if isinstance(name, enum.Enum) else name


class Event:
    """A named point in time of a span, with attributes (``timestamp_msec`` is added: ms since the epoch)."""

    __slots__ = ("_attributes", "_name", "_timestamp")

    def __init__(self, name: EventName, timestamp: TracingTimestamp, attributes: Attributes | None = None) -> None:
        if not isinstance(name, (str, enum.Enum)):
            raise TypeError(f"event name must be a str or an Enum member, got {type(name).__name__}")
        if not isinstance(timestamp, TracingTimestamp):
            raise TypeError(f"timestamp must be a TracingTimestamp, got {type(timestamp).__name__}")
        if attributes is None:
            own = Attributes()
        elif isinstance(attributes, Attributes):
            own = type(attributes).merge(attributes)  # a copy of the same class: the caller's object is left alone
        else:
            own = Attributes(attributes)
        stamp = Attribute.__new__(Attribute)  # (an int: no validation needed; every span start and stop makes one)
        stamp.name, stamp.value = _TIMESTAMP_MSEC, int(timestamp._seconds_since_epoch * 1000)
        own[_TIMESTAMP_MSEC] = stamp
        self._name = name
        self._timestamp = timestamp
        self._attributes = own

    @property
    def name(self) -> EventName:
        return self._name

    @property
    def timestamp(self) -> TracingTimestamp:
        return self._timestamp

    @property
    def attributes(self) -> Attributes:
        return self._attributes

    @property
    def name_str(self) -> str:
        return _name_str(self._name)

    @classmethod
    def create(cls, name: EventName, attributes: Attributes | None = None,
               timestamp: TracingTimestamp | None = None) -> Event:
        """An event now (or at ``timestamp``)."""
        return cls(name=name, timestamp=timestamp or TracingTimestamp.now(), attributes=attributes)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name_str, "timestamp": self._timestamp.to_json()}
        if self._attributes:
            out["attributes"] = self._attributes.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        if not isinstance(data, dict) or not data.get("name") or not data.get("timestamp"):
            raise TypeError(f"Event data must have a name and a timestamp: {data!r}")
        if data["name"] == StandardEventName.ERROR.value:
            return ErrorEvent.from_json(data)
        return cls(name=data["name"], timestamp=TracingTimestamp.from_json(data["timestamp"]),
                   attributes=Attributes.from_json(data.get("attributes")))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return False
        return (_name_str(self._name) == _name_str(other._name) and self._timestamp == other._timestamp
                and self._attributes == other._attributes)

    def __hash__(self) -> int:
        return hash((_name_str(self._name), self._timestamp))

    def __repr__(self) -> str:
        return f"Event(name={self.name_str!r}, attributes={self._attributes.to_json()!r})"


class ErrorEvent(Event):
    """An error of the application (it would happen without telemetry): a message, and the exception's type,
    message and traceback when there is one."""

    __slots__ = ("error_message", "exception_message", "exception_traceback", "exception_type")

    def __init__(self, timestamp: TracingTimestamp, error_message: str, exception_type: str | None = None,
                 exception_message: str | None = None, exception_traceback: str | None = None,
                 attributes: Attributes | None = None) -> None:
        if exception_type and exception_message is None:
            raise TypeError("exception_message must be given with exception_type")
        if exception_type is not None and exception_traceback is None:
            exception_traceback = traceback.format_exc()
        merged = Attributes()
        merged.add(StandardEventAttributeName.ERROR_MESSAGE.value, error_message)
        for key, value in ((StandardEventAttributeName.EXCEPTION_TYPE, exception_type),
                           (StandardEventAttributeName.EXCEPTION_MESSAGE, exception_message),
                           (StandardEventAttributeName.EXCEPTION_TRACEBACK, exception_traceback)):
            if value:
                merged.add(key.value, value)
        if attributes:
            merged.add_attributes(attributes)
        super().__init__(StandardEventName.ERROR, timestamp, merged)
        self.error_message = error_message
        self.exception_type = exception_type
        self.exception_message = exception_message
        self.exception_traceback = exception_traceback

    @classmethod
    def create(  # type: ignore[override]
        cls, error_message: str, exception: BaseException | None = None, exception_traceback: str | None = None
    ) -> ErrorEvent:
        if exception is not None and exception_traceback is None and exception.__traceback__ is not None:
            exception_traceback = "".join(traceback.format_exception(type(exception), exception,
                                                                     exception.__traceback__))
        return cls(timestamp=TracingTimestamp.now(), error_message=error_message,
                   exception_type=type(exception).__name__ if exception is not None else None,
                   exception_message=str(exception) if exception is not None else None,
                   exception_traceback=exception_traceback)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["error_message"] = self.error_message
        if self.exception_type is not None:
            out.update(exception_type=self.exception_type, exception_message=self.exception_message,
                       exception_traceback=self.exception_traceback)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ErrorEvent:
        return cls(timestamp=TracingTimestamp.from_json(data["timestamp"]), error_message=data["error_message"],
                   exception_type=data.get("exception_type"), exception_message=data.get("exception_message"),
                   exception_traceback=data.get("exception_traceback"),
                   attributes=Attributes.from_json(data.get("attributes")))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ErrorEvent) and super().__eq__(other)
                and (self.error_message, self.exception_type, self.exception_message, self.exception_traceback)
                == (other.error_message, other.exception_type, other.exception_message, other.exception_traceback))

    __hash__ = Event.__hash__


class TelemetryDataError(Event):
    """A gap or fault in the telemetry itself (not in the application): ``NO_TELEMETRY_DATA`` when nothing was
    exported, ``INCOMPLETE_TELEMETRY_DATA`` when some was."""

    __slots__ = ("error_message", "error_type")

    class ErrorType(str, enum.Enum):
        NO_TELEMETRY_DATA = "no_telemetry_data"
        INCOMPLETE_TELEMETRY_DATA = "incomplete_telemetry_data"

        def __str__(self) -> str:
            return self.value

    def __init__(self, timestamp: TracingTimestamp, error_type: TelemetryDataError.ErrorType, error_message: str,
                 attributes: Attributes | None = None) -> None:
        merged = Attributes()
        merged.add(StandardEventAttributeName.ERROR_MESSAGE.value, error_message)
        merged.add(StandardEventAttributeName.TELEMETRY_DATA_ERROR_TYPE.value, error_type.value)
        if attributes:
            merged.add_attributes(attributes)
        super().__init__(StandardEventName.TELEMETRY_DATA_ERROR, timestamp, merged)
        self.error_type = error_type
        self.error_message = error_message

    @classmethod
    def create(  # type: ignore[override]
        cls, error_type: TelemetryDataError.ErrorType, error_message: str, attributes: Attributes | None = None
    ) -> TelemetryDataError:
        return cls(timestamp=TracingTimestamp.now(), error_type=error_type, error_message=error_message,
                   attributes=attributes)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out.update(error_type=self.error_type.value, error_message=self.error_message)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TelemetryDataError:
        return cls(timestamp=TracingTimestamp.from_json(data["timestamp"]),
                   error_type=cls.ErrorType(data["error_type"]), error_message=data["error_message"],
                   attributes=Attributes.from_json(data.get("attributes")))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TelemetryDataError) and super().__eq__(other)
                and self.error_type == other.error_type and self.error_message == other.error_message)

    __hash__ = Event.__hash__
