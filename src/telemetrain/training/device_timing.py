"""Device time of training iterations, their phases and ``span(..., device=True)``, without a host-device sync.

On CUDA the host only queues kernels: a host clock around ``forward()`` measures the launches, and whichever phase
holds a synchronising call (``loss.item()``, a ``.cpu()``) absorbs the device time of all the others. So, when the
job runs on CUDA, the recorder also records a *mark* -- an event on the current stream -- at each iteration boundary
and at the start and end of each device-timed span (the training phases among them), and reads the device's own
timestamps of those marks **later, without blocking**: ``query()`` tells whether the device has reached a mark,
``elapsed_time()`` is read only once both ends have completed. Nothing here waits for the device on the step.

Bookkeeping, all bounded and allocation-free in steady state:

- *Shared starts.* A span that starts within ``SHARE_NS`` of host time after the slot's last mark starts at that mark
  instead of recording one: back-to-back phases (zero_grad, forward, backward, optimizer) need one mark per
  boundary, not an end mark and a start mark, so a usual iteration with 5 phases records 7 marks, not 12
  (``cudaEventRecord`` is most of the host cost: bench/bench_gpu.py check C). In that much host time a program can
  queue at most one operation (a PyTorch op takes several microseconds to launch): the device time of such an
  operation counts in the span that starts after it instead of between the two. Ends always record their own mark:
  the work just before an end belongs to the span it ends.

- A *slot* holds the marks of one iteration (or of one device span opened outside any iteration): pooled events, the
  host clock at each mark, and the spans closed in it (their start and end marks). ``capacity`` slots exist (default
  64); a closed slot waits in a FIFO until the device has completed its last mark. When every slot is waiting --
  the device lags ``capacity`` iterations behind the host -- the oldest is given up and counted as *unresolved*:
  never waited for.
- Resolution runs in the collector thread (every ``TICK_NS`` while slots wait) and at each metrics report. A final
  report (training end, exit, SIGTERM) polls for at most ``FINAL_WAIT_S``: the only wait, off the step.
- Results per iteration: its device time (iteration start mark to end mark), each phase's device time, and the
  *stall*: over consecutive marks, the host time by which a segment outlasted the device's time for it (the device
  catching up on work queued before the segment: the host blocked in a sync, or CPU work that overlapped the
  device's backlog). Segments whose excess is under ``STALL_NOISE_S`` are clock jitter and not counted.
- Device spans that are not training phases, and phases outside an iteration, go to a windowed ``Stat``
  ``<span name>.device_time`` (group: the span's).

The device clock is an interface (``device_clock.DeviceClock``) so that the bookkeeping is testable without a GPU;
``CudaClock`` is the real one (``torch.cuda.Event(enable_timing=True)``, recorded on the current stream). The span
class that records marks, and which timer a Telemetry uses, are in ``device_spans``; a slot, its reading and the
window are in ``device_slots``. Streams other than the current one at each mark are out of scope: work a program
queues on a side stream is timed only as far as the current stream waits for it. Marks are not recorded while the
current stream is being captured into a CUDA graph (that iteration counts as unresolved; a device span begun outside
any iteration then is timed on the host only).

Failures never reach training: a clock call that raises is counted, warned about once, recorded as an ``error``
event (group ``training``) and turns device timing off for the rest of the process.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ..collector import collector
from ..dispatch import describe, warn_safely
from ..telemetry import Telemetry
from .device_clock import CudaClock, DeviceClock, resolve_clock
from .device_slots import (
    FREE,
    ITERATION,
    MAX_MARKS,
    OPEN,
    PENDING,
    SPAN,
    UNTIMED,
    DeviceWindow,
    Slot,
    read_slot,
)

__all__ = [
    "DEFAULT_CAPACITY",
    "DEVICE_TIMING_MODES",
    "CudaClock",
    "DeviceClock",
    "DeviceTimer",
    "DeviceWindow",
    "resolve_clock",
]

DEVICE_TIMING_MODES = ("auto", "cuda", "host")
DEFAULT_CAPACITY = 64  # iterations (or standalone device spans) waiting for the device
MAX_OPEN_SPANS = 4096  # device spans started and not ended, remembered at once
TICK_NS = 100_000_000  # while slots wait, the collector resolves them this often
FINAL_WAIT_S = 0.5  # a final report polls this long for the iterations the device has not finished
SHARE_NS = 10_000  # a span starting this soon (host ns) after the slot's last mark starts at that mark
STAT_WINDOW_S = 10.0  # the window of the <span>.device_time stats
EXTENSION = "device_timer"
MAX_READ_FAILURES = 3  # slots in a row whose marks cannot be read: device timing is then turned off
GROUP = "training"

_mono = time.monotonic_ns  # the host clock of the marks (the spans' clock)
_sleep = time.sleep
_thread_id = threading.get_ident

class DeviceTimer:
    """The device marks of one ``Telemetry`` (one per process in practice: ``timer_of``). The iteration and span
    methods run on the training thread and never block; ``resolve`` and ``take_window`` run anywhere."""

    def __init__(self, telemetry: Telemetry, clock: DeviceClock, *, capacity: int = DEFAULT_CAPACITY) -> None:
        if type(capacity) is not int or capacity < 2:
            raise ValueError(f"capacity must be an int >= 2, got {capacity!r}")
        self.telemetry = telemetry
        self.clock = clock
        self.capacity = capacity
        self.enabled = True
        self.failure = ""  # why device timing was turned off
        self.every = 1  # time one iteration in `every` (config.device_timing_every): the others record no marks
        self._skip = 0  # iterations to leave untimed before the next timed one
        self.sampled_out = False  # the iteration begun last is one of those: its phases need no device spans
        self._record = clock.record
        self._begin = clock.begin
        self._slots = 0  # slots created (up to capacity)
        self._free: list[Slot] = []
        self._pending: deque[Slot] = deque()  # closed, oldest first (append / popleft: atomic under the GIL)
        self._open: dict[int, list[Slot]] = {}  # thread -> its open slots, innermost last
        self._marks: dict[Any, tuple[Slot, int, int]] = {}  # open device span -> (slot, use, start mark)
        self._window = DeviceWindow()
        self._window_lock = threading.Lock()
        self._lost = 0  # given up by the training thread (ring full); moved into the window at resolution
        self._captured = 0
        self._marks_dropped = 0
        self._ticking = False
        self._read_failures = 0
        self._stats: dict[tuple[str, str], Any] = {}
        resolving = getattr(clock, "resolving", None)
        self._resolving: Callable[[], AbstractContextManager[Any]] = (
            resolving if callable(resolving) else contextlib.nullcontext)
        telemetry.add_producer(self)

    # -- slots (training thread) -----------------------------------------------------------------------------------

    def _take(self) -> Slot | None:
        try:
            slot = self._free.pop()
        except IndexError:
            if self._slots < self.capacity:
                self._slots += 1
                slot = Slot()
            else:
                try:
                    slot = self._pending.popleft()  # the device lags `capacity` slots behind: give the oldest up
                except IndexError:
                    return None  # every slot is open or being resolved this instant
                if slot.kind == ITERATION:
                    self._lost += 1
        slot.use += 1
        slot.n = 0
        slot.k = 0
        slot.state = OPEN
        return slot

    def _close(self, slot: Slot) -> None:
        slot.state = PENDING
        self._pending.append(slot)
        if not self._ticking:
            self._ticking = True
            collector.schedule(self, time.monotonic_ns() + TICK_NS)

    def _mark(self, slot: Slot) -> int:
        """A new mark (the pool grows to ``MAX_MARKS``); -1 when the slot is full. Each mark's host time is read
        after its record: the next start's ``SHARE_NS`` counts from there, the record's own cost left out."""
        i = slot.n
        events = slot.events
        if i == len(events):
            if i >= MAX_MARKS:
                self._marks_dropped += 1
                return -1
            events.append(self.clock.event())
            slot.hosts.append(0)
        self._record(events[i])
        slot.hosts[i] = _mono()
        slot.n = i + 1
        return i

    def _closed(self, slot: Slot, span: Any, start: int, end: int) -> None:
        """``span`` closed in ``slot``, from mark ``start`` to mark ``end``."""
        k = slot.k
        if k == len(slot.labels):
            if k >= MAX_MARKS:
                self._marks_dropped += 1
                return
            slot.labels.append(span)
            slot.starts.append(start)
            slot.ends.append(end)
        else:
            slot.labels[k] = span
            slot.starts[k] = start
            slot.ends[k] = end
        slot.k = k + 1

    def _fail(self, what: str, exc: BaseException) -> None:
        """A clock call raised: device timing is off from here on (counted, warned once, recorded)."""
        if not self.enabled:
            return
        self.enabled = False
        self._open = {}  # the hot paths find no open slot: each is then one dict lookup
        self._marks = {}
        self.failure = f"{what}: {describe(exc)}"
        warn_safely(f"telemetrain: device timing failed ({self.failure}); it is off for the rest of this process, "
                    "host times are unaffected")
        try:
            self.telemetry.event("error", {"callback": "device_timing", "error_message": self.failure},
                                 severity="error", group=GROUP)
        except Exception:  # noqa: BLE001
            pass

    # -- iterations (the recorder's callbacks) ---------------------------------------------------------------------
    # The hot path (bench/bench_gpu.py check C): the common case -- a pooled event free in the slot -- is inlined; a
    # thread's first call, a slot that must grow and every failure go through the slower helpers.

    def begin_iteration(self, warm: bool) -> None:
        stack = self._open.get(_thread_id())
        if stack is None:
            if not self.enabled:
                return
            stack = self._open[_thread_id()] = []
        elif stack and stack[-1].kind == ITERATION:  # the previous iteration was never ended: give it up
            self._release(stack.pop())
        if self._skip:  # sampled: not this one (no marks, neither timed nor unresolved)
            self._skip -= 1
            self.sampled_out = True
            stack.append(UNTIMED)
            return
        self._skip = self.every - 1
        self.sampled_out = False
        try:
            if not self._begin():  # capturing a CUDA graph: no marks in this iteration, nor in its spans
                self._captured += 1
                stack.append(UNTIMED)
                return
            slot = self._take()
            if slot is None:
                self._lost += 1
                stack.append(UNTIMED)
                return
            slot.kind = ITERATION
            slot.warm = warm
            if slot.events:
                self._record(slot.events[0])
                slot.hosts[0] = _mono()
                slot.n = 1
            else:
                self._mark(slot)
            stack.append(slot)
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks training
            self._fail("begin_iteration", exc)

    def end_iteration(self) -> None:
        self.sampled_out = False  # phases outside an iteration are device spans again
        stack = self._open.get(_thread_id())
        if not stack or stack[-1].kind != ITERATION:
            return
        slot = stack.pop()
        if slot is UNTIMED:
            return
        try:
            if self._mark(slot) < 0:
                self._release(slot)
                return
            self._close(slot)
        except Exception as exc:  # noqa: BLE001
            self._fail("end_iteration", exc)

    def abandon_iteration(self) -> None:
        """The open iteration failed: its marks are dropped, it is not an iteration."""
        stack = self._open.get(_thread_id())
        if stack and stack[-1].kind == ITERATION:
            self._release(stack.pop())

    def _release(self, slot: Slot) -> None:
        if slot is UNTIMED:
            return
        slot.state = FREE
        slot.opener = None
        self._free.append(slot)

    # -- device spans ------------------------------------------------------------------------------------------------

    def span_start(self, span: Any) -> None:
        """A device-timed span begins: a mark in this thread's innermost open slot (a new slot if none is open)."""
        stack = self._open.get(_thread_id())
        if stack:
            slot = stack[-1]
            i = slot.n
            now = _mono()
            if i and now - slot.hosts[i - 1] < SHARE_NS:  # the common cases, inlined: the last mark is shared...
                self._marks[span] = (slot, slot.use, i - 1)
                return
            if i < len(slot.events):  # ... or a pooled event is free
                try:
                    self._record(slot.events[i])
                    slot.hosts[i] = _mono()
                except Exception as exc:  # noqa: BLE001
                    self._fail("span start", exc)
                    return
                slot.n = i + 1
                self._marks[span] = (slot, slot.use, i)
                return
            if slot is UNTIMED:
                return
        self._span_start(span, stack)

    def _span_start(self, span: Any, stack: list[Slot] | None) -> None:
        if not self.enabled:
            return
        try:
            if stack:
                slot = stack[-1]
            else:
                if not self._begin():  # capturing a CUDA graph (a captured eval step): CUDA could not read a mark
                    return  # recorded now, and would refuse to for the rest of the slot
                taken = self._take()
                if taken is None:
                    return
                slot = taken
                slot.kind = SPAN
                slot.opener = span
                if stack is None:
                    stack = self._open[_thread_id()] = []
                stack.append(slot)
            i = slot.n - 1 if slot.n and _mono() - slot.hosts[slot.n - 1] < SHARE_NS else self._mark(slot)
            if i < 0:
                return
            marks = self._marks
            if len(marks) >= MAX_OPEN_SPANS:  # spans started and never ended (a leak in the program): forget them
                marks.clear()
            marks[span] = (slot, slot.use, i)
        except Exception as exc:  # noqa: BLE001
            self._fail("span start", exc)

    def span_end(self, span: Any) -> None:
        found = self._marks.pop(span, None)
        if found is None:
            return
        slot, use, start = found
        if slot.use != use or slot.state != OPEN:
            return  # its slot closed meanwhile (the iteration ended first): not timed
        try:
            i = slot.n
            if i < len(slot.events):  # inlined _mark: a pooled event is free
                self._record(slot.events[i])
                slot.hosts[i] = _mono()
                slot.n = i + 1
                end = i
            else:
                end = self._mark(slot)
            if end >= 0:
                k = slot.k
                if k < len(slot.labels):
                    slot.labels[k] = span
                    slot.starts[k] = start
                    slot.ends[k] = end
                    slot.k = k + 1
                else:
                    self._closed(slot, span, start, end)
            if slot.kind == SPAN and slot.opener is span:
                self._close_span_slot(slot)
        except Exception as exc:  # noqa: BLE001
            self._fail("span end", exc)

    def _close_span_slot(self, slot: Slot) -> None:
        stack = self._open.get(_thread_id())
        if stack and stack[-1] is slot:
            stack.pop()
        else:  # an iteration opened inside it is still open, or it ends in another thread than it began
            for other in list(self._open.values()):
                if slot in other:
                    other.remove(slot)
                    break
        self._close(slot)

    # -- resolution (collector thread, reports) ----------------------------------------------------------------------

    def resolve(self, wait_s: float = 0.0) -> int:
        """Read the device times of every waiting slot whose marks have all completed, oldest first, stopping at the
        first that has not; returns how many were read. ``wait_s`` > 0: poll (1 ms sleeps) up to that long for the
        rest (only the final report does). Never blocks on the device."""
        if not self.enabled:
            return 0
        deadline = _mono() + int(wait_s * 1e9)
        done = 0
        pending = self._pending
        with self._resolving():
            while True:
                try:
                    slot = pending.popleft()
                except IndexError:
                    break
                try:
                    ready = self._read(slot)
                except Exception as exc:  # noqa: BLE001 - this slot's marks cannot be read: it is unresolved
                    self._release(slot)
                    with self._window_lock:
                        self._window.unresolved += 1
                    self._read_failures += 1
                    if self._read_failures >= MAX_READ_FAILURES:  # not one odd slot (a mark recorded inside a
                        self._fail("resolve", exc)  # capture begun mid-iteration): something is broken
                        break
                    continue
                if ready:
                    self._read_failures = 0
                    self._release(slot)
                    done += 1
                    continue
                pending.appendleft(slot)
                if _mono() >= deadline:
                    break
                _sleep(0.001)
        return done

    def _read(self, slot: Slot) -> bool:
        times = read_slot(slot, self.clock)
        if times is None:
            return False
        if times.spans:
            self._to_stats(times.spans)
        if slot.kind == ITERATION:
            with self._window_lock:
                self._window.add(times, slot.warm)
        return True

    def _to_stats(self, spans: list[tuple[Any, float]]) -> None:
        for s, seconds in spans:
            name, group = s.name, s.group
            key = (group, name)
            stat = self._stats.get(key)
            if stat is None:
                from ..stats.stat import Stat

                stat = self._stats[key] = Stat(f"{name}.device_time", ("count", "mean", "max", "p50", "p99"),
                                               window=STAT_WINDOW_S, unit="s", group=group, telemetry=self.telemetry,
                                               help=f"device time of span {name} (CUDA events)")
            stat.add(seconds)

    def give_up_waiting(self) -> int:
        """Count every iteration still waiting as unresolved and free its slot (a final report, after its bounded
        wait: there is no later report to put it in); returns how many."""
        given = 0
        while True:
            try:
                slot = self._pending.popleft()
            except IndexError:
                break
            if slot.kind == ITERATION:
                given += 1
            self._release(slot)
        with self._window_lock:
            self._window.unresolved += given
        return given

    def take_window(self) -> DeviceWindow:
        """The iterations resolved since the last call (and what was given up meanwhile); a fresh window starts."""
        with self._window_lock:
            w, self._window = self._window, DeviceWindow()
        lost, self._lost = self._lost, 0
        captured, self._captured = self._captured, 0
        dropped, self._marks_dropped = self._marks_dropped, 0
        w.unresolved += lost
        w.captured += captured
        w.marks_dropped += dropped
        return w

    @property
    def waiting(self) -> int:
        """Slots closed and not yet resolved."""
        return len(self._pending)

    # -- the collector task and the Telemetry producer protocol --------------------------------------------------------

    def tick(self, now_ns: int) -> int | None:
        self.resolve()
        if self._pending and self.enabled:
            return now_ns + TICK_NS
        self._ticking = False
        if self._pending and self.enabled:  # closed between the resolve and the flag
            self._ticking = True
            return now_ns + TICK_NS
        return None

    def collect(self, final: bool) -> None:
        self.resolve(FINAL_WAIT_S if final else 0.0)
        if final:
            self._ticking = False
            collector.cancel(self)

    def after_fork_in_child(self) -> None:
        """The parent's CUDA context is not usable in a forked child: device timing is off there."""
        self.enabled = False
        self.failure = "forked child"
        self._pending = deque()
        self._open = {}
        self._marks = {}
        self._ticking = False
