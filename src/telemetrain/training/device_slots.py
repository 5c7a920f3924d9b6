"""The marks of one iteration (a *slot*), what they resolve to, and the window that adds resolved iterations up: the
data side of device timing (``device_timing`` records the marks and decides when to read them).

A slot's marks are pooled events and the host clock read just after each was recorded; the spans closed in it are
(span, start mark, end mark) triples, so one mark can end a phase and start the next. ``read_slot`` reads a slot
once all its marks have completed, never before (it never waits).
"""

from __future__ import annotations

from typing import Any

from .device_clock import DeviceClock
from .names import PHASES

__all__ = ["FREE", "ITERATION", "MAX_MARKS", "OPEN", "PENDING", "SPAN", "STALL_NOISE_S", "UNTIMED", "DeviceWindow",
           "Slot", "SlotTimes", "read_slot"]

MAX_MARKS = 512  # marks in one slot (a device span per layer of a deep model fits); more are counted and dropped
STALL_NOISE_S = 20e-6  # a segment's host-over-device excess below this is event jitter

# slot states
FREE, OPEN, PENDING = 0, 1, 2
# slot kinds
ITERATION, SPAN = 0, 1


class Slot:
    """The marks of one iteration, or of one device span opened outside any iteration, and the spans closed in it."""

    __slots__ = ("ends", "events", "hosts", "k", "kind", "labels", "n", "opener", "starts", "state", "use", "warm")

    def __init__(self) -> None:
        self.events: list[Any] = []  # pooled: marks 0..n-1 are this use's
        self.hosts: list[int] = []  # the host clock at each mark
        self.n = 0
        self.labels: list[Any] = []  # spans 0..k-1 closed in this use: the span, its start and end mark
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.k = 0
        self.kind = ITERATION
        self.opener: Any = None  # the span that opened a SPAN slot
        self.state = FREE
        self.use = 0  # incremented at each reuse: a span's end finds its start only in the same use
        self.warm = False  # a warm-up iteration (left out of the iteration time, as the host figures do)


UNTIMED = Slot()  # on a thread's stack for an iteration that records no marks (graph capture, no slot free)


class DeviceWindow:
    """What the resolved iterations of one report window add up to."""

    __slots__ = ("captured", "iteration_max", "iteration_sum", "iterations", "marks_dropped", "phases", "stall_sum",
                 "steady", "unresolved")

    def __init__(self) -> None:
        self.iterations = 0  # iterations resolved (warm-up included)
        self.steady = 0  # ... of which after warm-up: their device times are in iteration_sum
        self.iteration_sum = 0.0
        self.iteration_max = 0.0
        self.phases: dict[str, float] = {}  # phase -> device seconds, over the resolved iterations
        self.stall_sum = 0.0
        self.unresolved = 0  # given up: the device lagged more than `capacity` iterations, or a read failed
        self.captured = 0  # iterations begun while the stream was capturing a CUDA graph (not timed)
        self.marks_dropped = 0

    def add(self, times: SlotTimes, warm: bool) -> None:
        """One resolved iteration (``warm``: a warm-up one, left out of the iteration time as the host's is)."""
        self.iterations += 1
        if not warm:
            self.steady += 1
            self.iteration_sum += times.seconds
            if times.seconds > self.iteration_max:
                self.iteration_max = times.seconds
        phases = self.phases
        for phase, seconds in times.phases.items():
            phases[phase] = phases.get(phase, 0.0) + seconds
        self.stall_sum += times.stall

    def attributes(self) -> dict[str, Any]:
        """The window's ``training_metrics_update`` attributes (docs/training.md, "Device time")."""
        out: dict[str, Any] = {"device_timed_iterations": self.iterations,
                               "device_unresolved_iterations": self.unresolved + self.captured}
        n = self.iterations
        if self.steady:
            out["avg_iteration_device_time_sec"] = self.iteration_sum / self.steady
            out["max_iteration_device_time_sec"] = self.iteration_max
        if n:
            for phase, seconds in self.phases.items():
                out[f"avg_{phase}_device_time_sec"] = seconds / n
            out["avg_stall_time_sec"] = self.stall_sum / n
        if self.marks_dropped:
            out["device_marks_dropped"] = self.marks_dropped
        return out


class SlotTimes:
    """A resolved slot: its device time (first mark to last), the phases' and other spans' device times, the stall."""

    __slots__ = ("phases", "seconds", "spans", "stall")

    def __init__(self, seconds: float, phases: dict[str, float], spans: list[tuple[Any, float]], stall: float) -> None:
        self.seconds = seconds
        self.phases = phases
        self.spans = spans
        self.stall = stall


def read_slot(slot: Slot, clock: DeviceClock) -> SlotTimes | None:
    """The device times of ``slot``, or None while one of its marks has not completed (nothing is waited for)."""
    n = slot.n
    events = slot.events
    if not clock.done(events[n - 1]):
        return None
    for i in range(n - 1):  # marks on another stream may complete out of order
        if not clock.done(events[i]):
            return None
    first = events[0]
    elapsed = clock.elapsed_s
    device = [0.0] * n
    for i in range(1, n):
        device[i] = elapsed(first, events[i])
    hosts = slot.hosts
    stall = 0.0
    for i in range(1, n):
        excess = (hosts[i] - hosts[i - 1]) / 1e9 - (device[i] - device[i - 1])
        if excess > STALL_NOISE_S:
            stall += excess
    labels, starts, ends = slot.labels, slot.starts, slot.ends
    phases: dict[str, float] = {}
    spans: list[tuple[Any, float]] = []
    iteration = slot.kind == ITERATION
    for j in range(slot.k):
        label = labels[j]
        seconds = device[ends[j]] - device[starts[j]]
        phase = PHASES.get(label.name) if iteration else None
        if phase is not None:
            phases[phase] = phases.get(phase, 0.0) + seconds
        else:
            spans.append((label, seconds))
    return SlotTimes(device[n - 1], phases, spans, stall)
