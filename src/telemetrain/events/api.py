"""``torch.distributed.elastic.events.api``'s module path: the event types, as torchelastic's (re-exported by
``telemetrain.events``), accepting torchelastic's own objects where ours are expected."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Union

__all__ = ["Event", "EventMetadataValue", "EventSource", "NodeState", "RdzvEvent"]

EventMetadataValue = Union[str, int, float, bool, None]  # noqa: UP007 - torchelastic's alias, kept as written


class EventSource(str, Enum):
    """Known identifiers of the event producers."""

    AGENT = "AGENT"
    WORKER = "WORKER"


class NodeState(str, Enum):
    """The states that a node can be in rendezvous."""

    INIT = "INIT"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclass
class Event:
    """torchelastic's event, plus ``id`` (unique per process) and ``mono_ns`` (monotonic time, set at record time).

    ``timestamp`` is milliseconds since the epoch; ``record`` sets it when the caller left it 0.
    """

    name: str
    source: EventSource
    timestamp: int = 0
    metadata: dict[str, EventMetadataValue] = field(default_factory=dict)
    id: str = field(default="", compare=False)
    mono_ns: int = field(default=0, compare=False)

    def __str__(self) -> str:
        return self.serialize()

    @staticmethod
    def deserialize(data: Any) -> Event:  # a str, ours, or torchelastic's Event
        if isinstance(data, Event):
            return data
        if not isinstance(data, str) and _looks_like(data, _EVENT_FIELDS):
            source = EventSource(getattr(data.source, "_value_", data.source))
            return Event(data.name, source, data.timestamp, dict(data.metadata or {}))
        if not isinstance(data, str):
            raise TypeError(f"data must be a str or an Event, got {type(data).__name__}")
        data_dict = json.loads(data)
        data_dict["source"] = EventSource[data_dict["source"]]
        return Event(**data_dict)

    def serialize(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class RdzvEvent:
    """A rendezvous event, as torchelastic's."""

    name: str
    run_id: str
    message: str
    hostname: str
    pid: int
    node_state: NodeState
    master_endpoint: str = ""
    rank: int | None = None
    local_id: int | None = None
    error_trace: str = ""

    def __str__(self) -> str:
        return self.serialize()

    @staticmethod
    def deserialize(data: Any) -> RdzvEvent:  # a str, ours, or torchelastic's RdzvEvent
        if isinstance(data, RdzvEvent):
            return data
        if not isinstance(data, str) and _looks_like(data, _RDZV_FIELDS):
            fields = {f.name: getattr(data, f.name) for f in dataclasses.fields(RdzvEvent)}
            fields["node_state"] = NodeState(getattr(data.node_state, "_value_", data.node_state))
            return RdzvEvent(**fields)
        if not isinstance(data, str):
            raise TypeError(f"data must be a str or an RdzvEvent, got {type(data).__name__}")
        data_dict = json.loads(data)
        data_dict["node_state"] = NodeState[data_dict["node_state"]]
        return RdzvEvent(**data_dict)

    def serialize(self) -> str:
        return json.dumps(asdict(self))


def _looks_like(obj: Any, fields: tuple[str, ...]) -> bool:
    """A torchelastic event object (same fields, another class) is accepted where ours is."""
    return all(hasattr(obj, f) for f in fields)


_EVENT_FIELDS = ("name", "source", "timestamp", "metadata")
_RDZV_FIELDS = ("name", "run_id", "message", "hostname", "pid", "node_state")
