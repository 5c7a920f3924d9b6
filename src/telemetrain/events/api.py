"""``torch.distributed.elastic.events.api``'s module path: the event types (re-exported from ``telemetrain.events``)."""

from __future__ import annotations

from . import Event, EventMetadataValue, EventSource, NodeState, RdzvEvent

__all__ = ["Event", "EventMetadataValue", "EventSource", "NodeState", "RdzvEvent"]
