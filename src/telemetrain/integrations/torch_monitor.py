"""torch.monitor -> telemetrain: keep ``import torch.monitor`` and its ``Stat``/``log_event`` calls; ``install()``
registers one event handler with torch.monitor that forwards what it is given into the pipeline.

    from telemetrain.integrations import torch_monitor
    with torch_monitor.install():          # or: bridge = torch_monitor.install(); ...; bridge.remove()
        torch.monitor.log_event(torch.monitor.Event("epoch", datetime.now(), {"loss": 0.3}))

- an event becomes an event record (group ``torch.monitor``): the event's name, its data as attributes, its
  timestamp as the record's time (and as ``torch.monitor.timestamp``, seconds since the epoch, as
  ``telemetrain.monitor`` writes it);
- a window of a torch ``Stat`` (torch delivers it as a ``"torch.monitor.Stat"`` event with ``"<stat>.<aggregation>"``
  float data) becomes one metric record per aggregation, named as torch names it (``"loss.mean"``), at the window's
  close; the window's start, length and sample count are not in torch's event, so no stat record is made up.
Values are stored as torch gives them (torch turns a ``bool`` into 1.0; NaN stays NaN).

The handler is a ``deque.append``: C code, which cannot give up the GIL. torch.monitor calls its handlers holding its
own lock and waits for that lock without releasing the GIL, so a Python handler that loses the GIL (any Python code
can, at the interpreter's switch interval) while another thread logs deadlocks the process (reproduced with torch
2.13 and a plain Python handler; ``telemetrain.monitor`` does not have this bug). The events are turned into records
by the collector thread every 100 ms, at ``Telemetry.flush()`` and at close; at most ``MAX_PENDING`` wait (the oldest
are dropped beyond that).

``install()`` is idempotent per ``Telemetry`` (it returns the bridge already installed); the bridge unregisters
itself when its Telemetry closes. A failure in converting an event is counted (``failures``) and warned about once;
nothing ever reaches the code that logged.

This is the other direction from ``telemetrain.monitor``, the drop-in replacement module (which fixes torch.monitor's
bugs and records every window as a stat record).
"""

from __future__ import annotations

import collections
import math
import os
import threading
import time
from typing import Any

from ..collector import collector
from ..dispatch import describe, warn_safely
from ..records import Event, MetricPoint
from ..telemetry import Telemetry, check_name, get_telemetry

__all__ = ["DRAIN_EVERY_NS", "GROUP", "MAX_PENDING", "STAT_EVENT", "TorchMonitorBridge", "install"]

GROUP = "torch.monitor"
STAT_EVENT = "torch.monitor.Stat"
DRAIN_EVERY_NS = 100_000_000
MAX_PENDING = 65_536
_KEY = "integrations.torch_monitor"


class TorchMonitorBridge:
    """One registered torch.monitor event handler writing into one ``Telemetry``. ``remove()`` (or leaving its
    ``with`` block) unregisters it and records what it still holds; a second ``remove()`` does nothing."""

    def __init__(self, telemetry: Telemetry, group: str, slot: _Slot) -> None:
        import torch.monitor

        self.telemetry = telemetry
        self.group = group
        self.events = 0  # torch.monitor events recorded
        self.stat_windows = 0  # Stat windows recorded (each as a metric per aggregation)
        self.failures = 0
        self._slot = slot
        self._monitor = torch.monitor
        self._pending: collections.deque[Any] = collections.deque(maxlen=MAX_PENDING)
        self._drain_lock = threading.Lock()
        self._pid = os.getpid()
        self._handle: Any = torch.monitor.register_event_handler(self._pending.append)
        collector.schedule(self, time.monotonic_ns() + DRAIN_EVERY_NS)

    @property
    def active(self) -> bool:
        return self._handle is not None

    def remove(self) -> None:
        with self._slot.lock:
            handle, self._handle = self._handle, None
            if self._slot.bridge is self:
                self._slot.bridge = None
        if handle is None:
            return
        try:
            self._monitor.unregister_event_handler(handle)
        except Exception as exc:  # noqa: BLE001 - removing is cleanup: never raises
            self._failed(exc)
        collector.cancel(self)
        self.drain()

    def __enter__(self) -> TorchMonitorBridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def tick(self, now_ns: int) -> int | None:
        """The collector's call: record what came in; again in 100 ms while installed."""
        self.drain()
        return now_ns + DRAIN_EVERY_NS if self._handle is not None else None

    def drain(self) -> None:
        """Turn the events received so far into records, in order."""
        pending = self._pending
        if self._pid != os.getpid():
            # A forked child (a DataLoader worker): the parent's collector thread may have held the lock at the fork,
            # and what was pending is the parent's to record.
            self._pid = os.getpid()
            self._drain_lock = threading.Lock()
            pending.clear()
        with self._drain_lock:
            while pending:
                try:
                    self._record(pending.popleft())
                except IndexError:
                    return
                except Exception as exc:  # noqa: BLE001 - one bad event must not stop the others
                    self._failed(exc)

    def _record(self, event: Any) -> None:
        telemetry = self.telemetry
        name = event.name
        data = event.data
        try:
            timestamp = event.timestamp.timestamp()  # (torch's naive datetime is local time, as this assumes)
        except (OverflowError, OSError, ValueError):
            timestamp = math.nan
        if math.isfinite(timestamp):
            wall_ns = round(timestamp * 1e9)
            mono_ns = wall_ns - telemetry.wall_offset_ns
        else:
            mono_ns, wall_ns = telemetry.now()
        identity = telemetry.identity
        if name == STAT_EVENT:
            for key, value in data.items():
                telemetry.emit(MetricPoint(mono_ns, wall_ns, identity, self.group, key, value))
            self.stat_windows += 1
            return
        attributes = {**data, "torch.monitor.timestamp": timestamp}
        telemetry.emit(Event(mono_ns, wall_ns, identity, self.group, name or "unnamed", "info", attributes))
        self.events += 1

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        if self.failures == 1:
            warn_safely(f"telemetrain.integrations.torch_monitor: an event could not be recorded: {describe(exc)} "
                        "(later failures are counted in TorchMonitorBridge.failures, not warned about)")

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return (f"TorchMonitorBridge({state}, group={self.group!r}, events={self.events}, "
                f"stat_windows={self.stat_windows})")


class _Slot:
    """Per ``Telemetry``: its installed bridge, if any; a producer of the Telemetry, to remove it at the close."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bridge: TorchMonitorBridge | None = None

    def collect(self, final: bool) -> None:
        """The producer protocol: at a flush, record what the bridge holds; at the close, remove it."""
        bridge = self.bridge
        if bridge is not None:
            if final:
                bridge.remove()
            else:
                bridge.drain()


def _new_slot(telemetry: Telemetry) -> _Slot:
    slot = _Slot()
    telemetry.add_producer(slot)
    return slot


def install(telemetry: Telemetry | None = None, *, group: str = GROUP) -> TorchMonitorBridge:
    """Forward torch.monitor's events and Stat windows into ``telemetry`` (default: the default instance), under
    ``group``. Installing again for the same Telemetry returns the installed bridge (a different ``group`` is a
    ``ValueError``: remove the bridge first)."""
    if telemetry is not None and not isinstance(telemetry, Telemetry):
        raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
    group = check_name(group, "group")
    t = telemetry if telemetry is not None else get_telemetry()
    slot: _Slot = t.extension(_KEY, _new_slot)
    with slot.lock:
        bridge = slot.bridge
        if bridge is not None:
            if bridge.group != group:
                raise ValueError(f"a torch.monitor bridge with group {bridge.group!r} is installed on this Telemetry: "
                                 f"remove() it before installing one with group {group!r}")
            return bridge
        bridge = slot.bridge = TorchMonitorBridge(t, group, slot)
    return bridge
