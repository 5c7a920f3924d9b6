"""A deterministic simulation of one CUDA stream, behind ``training.device_timing.DeviceClock``.

It tests OUR bookkeeping (pooled marks, the bounded ring, non-blocking resolution, the phase split, the stall), not
CUDA: the real clock (``CudaClock`` over ``torch.cuda.Event``) is tested in tests/test_gpu.py on a GPU.

The model: the host has a virtual clock (``host_ns``, patched in as the marks' clock); ``launch(work)`` queues
``work`` ns of device work after everything queued so far and costs the host ``launch_ns``; ``host(ns)`` is CPU work;
``sync()`` is a synchronising call (``loss.item()``): the host waits until the device has finished. An event
recorded now completes when the device has executed what was queued before it; ``done`` says whether that moment
has passed on the host clock; as on CUDA, an event never recorded is done, and ``elapsed_s`` on it raises. Nothing in
the simulation advances the host clock on its own, and ``elapsed_s`` on an event not yet reached raises: a timer that
read a result it would have had to wait for fails the test.
"""

from __future__ import annotations

import sys


def skip_if_cuda_in_use() -> None:
    """Skip a test of a process that uses no GPU when this test process does (an earlier test on a GPU machine
    initialised CUDA): what it checks then does not hold, by design."""
    import pytest

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised in this test process (an earlier test used the GPU): this test is of a "
                    "process without a GPU in use; run it alone to check it on this machine")


class SimEvent:
    __slots__ = ("captured", "records", "t")

    def __init__(self) -> None:
        self.t = -1  # device time (on the host clock) at which the device reaches it; -1: never recorded
        self.records = 0
        self.captured = False  # last recorded while the stream was capturing: CUDA refuses to query or time it


class SimClock:
    name = "sim"

    def __init__(self, launch_ns: int = 5_000, latency_ns: int = 0) -> None:
        self.host_ns = 1_000_000_000
        self.device_free_ns = 0  # when the device will have finished everything queued
        self.launch_ns = launch_ns
        self.latency_ns = latency_ns
        self.capturing = False
        self.events_created = 0
        self.records = 0
        self.fail_record: BaseException | None = None
        self.fail_reads = 0  # the next reads of device times that raise (a mark that cannot be read)

    # -- the program's side --------------------------------------------------------------------------------------

    def launch(self, work_ns: int) -> None:
        start = max(self.host_ns, self.device_free_ns)
        self.device_free_ns = start + work_ns
        self.host_ns += self.launch_ns

    def host(self, ns: int) -> None:
        self.host_ns += ns

    def sync(self) -> None:
        self.host_ns = max(self.host_ns, self.device_free_ns)

    # -- the DeviceClock interface -----------------------------------------------------------------------------------

    def now(self) -> int:
        return self.host_ns

    def sleep(self, seconds: float) -> None:  # the timer's only wait (the final report's poll): time passes
        self.host_ns += int(seconds * 1e9)

    def event(self) -> SimEvent:
        self.events_created += 1
        return SimEvent()

    def begin(self) -> bool:
        return not self.capturing

    def record(self, event: SimEvent) -> None:
        if self.fail_record is not None:
            raise self.fail_record
        self.records += 1
        event.records += 1
        event.captured = self.capturing
        event.t = max(self.host_ns, self.device_free_ns) + self.latency_ns
        self.device_free_ns = event.t

    def done(self, event: SimEvent) -> bool:
        if event.captured:  # cudaErrorCapturedEvent, which torch's Event.query raises
            raise RuntimeError("operation not permitted on an event last recorded in a capturing stream")
        # as cudaEventQuery (and torch's Event.query): an event never recorded has no work to wait for, so it is done
        return event.t <= self.host_ns

    def elapsed_s(self, start: SimEvent, end: SimEvent) -> float:
        if self.fail_reads:
            self.fail_reads -= 1
            raise RuntimeError("operation not permitted on an event last recorded in a capturing stream")
        if start.captured or end.captured:
            raise RuntimeError("operation not permitted on an event last recorded in a capturing stream")
        if start.t < 0 or end.t < 0:  # torch's Event.elapsed_time raises so (ValueError)
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if not (self.done(start) and self.done(end)):
            raise RuntimeError("elapsed_s on an event not completed: the timer would have had to wait")
        return (end.t - start.t) / 1e9
