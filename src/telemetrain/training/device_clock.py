"""The device clock behind ``device_timing``: the ``DeviceClock`` interface, ``CudaClock`` (CUDA events on the
current stream) and the choice of a clock from the ``device_timing`` setting.

The interface exists so that the timer's bookkeeping is testable without a GPU (tests/_device_sim.py simulates a
stream); ``CudaClock`` is what runs on CUDA. Nothing here imports torch or initialises CUDA: a clock is built only
for a program that has imported torch (and, for ``"auto"``, initialised CUDA).
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ..dispatch import describe

__all__ = ["CudaClock", "DeviceClock", "resolve_clock"]

_CAPTURE_MODE_RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED (cuda.h)


class DeviceClock(Protocol):
    """Where device timestamps come from. ``CudaClock`` is the real one; tests use a deterministic simulation."""

    name: str

    def event(self) -> Any:
        """A new event (the timer pools them: called only while the pool grows)."""
        ...

    def record(self, event: Any) -> None:
        """Record ``event`` on the current stream, after the work queued so far. Never blocks."""
        ...

    def done(self, event: Any) -> bool:
        """Whether the device has reached ``event`` (``cudaEventQuery``). Never blocks."""
        ...

    def elapsed_s(self, start: Any, end: Any) -> float:
        """Device seconds from ``start`` to ``end``, both done."""
        ...

    def begin(self) -> bool:
        """Called at each iteration start: refresh what may change between iterations (the current device);
        False while the current stream is capturing a CUDA graph (no marks then)."""
        ...

    # optional: ``resolving() -> context manager``, held around the reads of a resolution pass (CudaClock's)


class CudaClock:
    """``torch.cuda.Event(enable_timing=True)`` recorded on the current stream of the current device.

    Two ways to record, the first that works (``raw``: None picks, True/False insists):

    - *raw*: the driver's ``cuEventRecord`` through ctypes, on the raw handle of the current stream
      (``torch._C._cuda_getCurrentRawStream``). torch's ``Event.record`` costs more per mark (a Python ``Stream``
      object, the GIL released and taken back, device guards: 57 against 43 us per 5-phase iteration on an H100
      host); check C of bench/bench_gpu.py measures both. The events stay torch's (created by one
      ``Event.record``, read by ``query``/``elapsed_time``).
    - *torch*: ``Event.record`` on the current stream, built from ``torch._C._cuda_getCurrentStream``'s id only when
      that changes; ``Event.record()`` itself where those internals are missing.
    """

    name = "cuda"

    def __init__(self, torch: Any = None, *, raw: bool | None = None) -> None:
        torch = torch if torch is not None else sys.modules.get("torch")
        if torch is None:
            raise RuntimeError("torch is not imported")
        cuda = torch.cuda
        self._Event = cuda.Event
        c = torch._C
        self._get_device: Callable[[], int] = getattr(c, "_cuda_getDevice", cuda.current_device)
        self._capturing: Callable[[], bool] = getattr(c, "_cuda_isCurrentStreamCapturing",
                                                      cuda.is_current_stream_capturing)
        get_stream = getattr(c, "_cuda_getCurrentStream", None)
        base = getattr(getattr(c, "_CudaEventBase", None), "record", None)
        self._fast: tuple[Callable[[int], Any], Callable[[Any, Any], None], Any] | None = (
            (get_stream, base, cuda.Stream) if get_stream is not None and base is not None else None)
        self._device = int(self._get_device())
        self._key: Any = None
        self._stream: Any = None
        self._raw_stream: Callable[[int], int] | None = getattr(c, "_cuda_getCurrentRawStream", None)
        self._cu_record: Any = _driver_function("cuEventRecord", [ctypes.c_void_p, ctypes.c_void_p]) \
            if raw is not False and self._raw_stream is not None else None
        if raw and self._cu_record is None:
            raise RuntimeError("the driver's cuEventRecord or torch._C._cuda_getCurrentRawStream is not available")
        self._raw_checked = False
        self.record = self._record_raw if self._cu_record is not None else self._record_torch  # type: ignore[method-assign]

    @property
    def raw(self) -> bool:
        """Whether marks are recorded through the driver directly."""
        return self.record == self._record_raw

    def event(self) -> Any:
        event = self._Event(enable_timing=True)
        self._record_torch(event)  # torch creates its events at their first record
        if self._cu_record is not None and not self._raw_checked:
            self._raw_checked = True
            if self._cu_record(event.cuda_event, self._raw_stream(self._device)) != 0:  # type: ignore[misc]
                self._cu_record = None  # not usable here: torch's record from now on
                self.record = self._record_torch  # type: ignore[method-assign]
        return event

    def begin(self) -> bool:
        self._device = self._get_device()
        # (torch's check, not the driver's cuStreamIsCapturing through ctypes: measured on an H100 host, 2.75 us
        # against 3.22 us for the whole call, the ctypes status argument included)
        return not self._capturing()

    def record(self, event: Any) -> None:
        """Record ``event`` on the current stream (``_record_raw`` or ``_record_torch``, chosen at construction)."""
        self._record_torch(event)

    def _record_raw(self, event: Any) -> None:
        status = self._cu_record(event.cuda_event, self._raw_stream(self._device))  # type: ignore[misc]
        if status != 0:
            raise RuntimeError(f"cuEventRecord returned CUDA error {status}")

    def _record_torch(self, event: Any) -> None:
        fast = self._fast
        if fast is None:
            event.record()
            return
        key = fast[0](self._device)
        if key != self._key:
            self._stream = fast[2](stream_id=key[0], device_index=key[1], device_type=key[2])
            self._key = key
        fast[1](event, self._stream)

    def done(self, event: Any) -> bool:
        return bool(event.query())

    def elapsed_s(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1e3

    def resolving(self) -> AbstractContextManager[Any]:
        """The reads in ``relaxed`` stream-capture mode for this thread: while another thread captures a CUDA graph in
        ``global`` mode (``torch.cuda.graph``'s default), CUDA prohibits "potentially unsafe" calls such as
        ``cudaEventQuery`` in every thread, and one made anyway can invalidate that capture. Our events are never
        recorded inside a capture, so querying them is safe; relaxed mode says so to the driver
        (``cuThreadExchangeStreamCaptureMode``; the thread's previous mode is restored after)."""
        return _relaxed_capture_mode()


def _driver_function(name: str, argtypes: list[Any]) -> Any:
    """A function of the CUDA driver (``libcuda.so.1``, the one library torch's runtime talks to), or None where it
    cannot be loaded."""
    if sys.platform != "linux":
        return None
    try:
        fn = getattr(ctypes.CDLL("libcuda.so.1"), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


_exchange: list[Any] = []  # loaded on first use


@contextlib.contextmanager
def _relaxed_capture_mode() -> Iterator[None]:
    if not _exchange:
        _exchange.append(_driver_function("cuThreadExchangeStreamCaptureMode", [ctypes.POINTER(ctypes.c_int)]))
    fn = _exchange[0]
    mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
    if fn is None or fn(ctypes.byref(mode)) != 0:
        yield
        return
    try:
        yield
    finally:
        fn(ctypes.byref(mode))  # back to the mode the thread had


def resolve_clock(setting: Any) -> tuple[DeviceClock | None, str]:
    """The clock for a ``device_timing`` setting (``"auto"``, ``"cuda"``, ``"host"`` or a ``DeviceClock``), and why
    there is none. Never initialises CUDA and never imports torch: ``"auto"`` times on the device only when the
    program has imported torch and initialised CUDA (its model is on a GPU)."""
    if setting == "host":
        return None, "device_timing='host'"
    if not isinstance(setting, str):
        return setting, ""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, "torch is not imported: no CUDA device in use"
    try:
        if not torch.cuda.is_available():
            return None, "torch.cuda.is_available() is False: no CUDA device"
        if setting == "auto" and not torch.cuda.is_initialized():
            return None, "CUDA is not initialised in this process (the model is not on a GPU)"
        return CudaClock(torch), ""
    except Exception as exc:  # noqa: BLE001 - an unusual torch build: host timing
        return None, f"CUDA events are not usable here ({describe(exc)})"
