"""one-logger's core API (``nv_one_logger.api.timed_span``): ``get_recorder()`` and ``timed_span``.

``get_recorder()`` is the configured provider's one-logger recorder (``recorder.start``/``stop``/``event``/``error``
for custom spans and events); before any provider is configured it is a recorder without exporters on the default
``Telemetry``, so custom spans and events still reach the run store (one-logger raises there). Note: the package's
``telemetrain.training.get_recorder()`` is telemetrain's own recorder; this one is one-logger's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .attributes import Attributes
from .default_recorder import DefaultRecorder
from .one_logger_config import OneLoggerConfig
from .one_logger_provider import OneLoggerProvider
from .singleton import SingletonMeta
from .spans import Span, SpanName
from .training_recorder import OneLoggerTrainingRecorder

__all__ = ["get_recorder", "timed_span"]

_lock = threading.Lock()
_unconfigured: dict[int, OneLoggerTrainingRecorder] = {}


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # held by another thread (building a recorder) at the fork: the child's timed_span hung


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def get_recorder() -> DefaultRecorder:
    """The configured one-logger recorder, or (none configured yet) one that records to the run store only."""
    provider = SingletonMeta._instances.get(OneLoggerProvider)
    if provider is not None and provider._recorder is not None:
        recorder: DefaultRecorder = provider._recorder
        return recorder
    from ..telemetry import get_telemetry

    telemetry = get_telemetry()
    with _lock:
        found = _unconfigured.get(id(telemetry))
        if found is None or found.telemetry is not telemetry or found.closed:
            identity = telemetry.identity
            config = OneLoggerConfig(application_name=identity.run_id, world_size_or_fn=identity.world_size,
                                     session_tag_or_fn=identity.session_tag)
            found = _unconfigured[id(telemetry)] = OneLoggerTrainingRecorder(config, [], telemetry=telemetry,
                                                                             drives_lifecycle=False)
        return found


@contextmanager
def timed_span(name: SpanName, span_attributes: Attributes | None = None,
               start_event_attributes: Attributes | None = None) -> Iterator[Span]:
    """A span around the block: an exception in it is recorded as an error event on the span (and re-raised);
    the span always stops."""
    recorder = get_recorder()
    span = recorder.start(span_name=name, span_attributes=span_attributes,
                          start_event_attributes=start_event_attributes)
    assert span is not None  # (DefaultRecorder.start always returns a span)
    try:
        yield span
    except Exception as exc:
        recorder.error(span, f"Error in {span.name_str}: ", exc)
        raise
    finally:
        recorder.stop(span)
