"""Sinks: where records go. Each backend is one module; none imports another."""

from .base import Sink
from .console import ConsoleSink
from .jsonl import RunStoreSink
from .null import NullSink

__all__ = ["ConsoleSink", "NullSink", "RunStoreSink", "Sink"]
