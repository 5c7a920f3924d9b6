"""bench_gpu.py's check C: the training-thread CPU time device timing adds to an iteration, and ``--bookkeeping``
(the same rows with a clock whose marks cost nothing: our own bookkeeping only, no GPU needed)."""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _gpu_results import check

# -- C: host cost ------------------------------------------------------------------------------------------------------


def empty_iterations(r: Any, n: int) -> float:
    t0 = time.thread_time_ns()
    for _ in range(n):
        r.on_training_single_iteration_start()
        with r.data_loading():
            pass
        with r.forward():
            pass
        with r.backward():
            pass
        with r.optimizer_update():
            pass
        with r.zero_grad():
            pass
        r.on_training_single_iteration_end()
    return (time.thread_time_ns() - t0) / n / 1e3


def interleaved_blocks(rows: dict[str, Any], blocks: int, n: int) -> dict[str, list[float]]:
    """Each recorder's CPU us per empty iteration, ``blocks`` blocks of ``n`` each, after a warm-up of 500:
    interleaved, the order rotated from block to block."""
    for r in rows.values():
        empty_iterations(r, 500)
    times: dict[str, list[float]] = {k: [] for k in rows}
    order = list(rows)
    for i in range(blocks):
        for k in order[i % len(order):] + order[:i % len(order)]:
            times[k].append(empty_iterations(rows[k], n))
    return times


def per_call_us(fn: Any, args: tuple[Any, ...], n: int = 10_000) -> float:
    """Training-thread CPU microseconds of one ``fn(*args)``, the loop's own cost taken off."""
    def loop(f: Any) -> float:
        t0 = time.thread_time_ns()
        for _ in range(n):
            f(*args)
        return (time.thread_time_ns() - t0) / n / 1e3
    return max(loop(fn) - loop(lambda *a: None), 0.0)


def check_c(torch: Any, make_recorder: Any, blocks: int, n: int) -> None:
    from telemetrain.training.device_clock import CudaClock

    raw = CudaClock(torch)
    rows = {"raw": make_recorder(raw, "cost-raw"), "torch": make_recorder(CudaClock(torch, raw=False), "cost-torch"),
            "off": make_recorder("host", "cost-off"), "raw_every_4": make_recorder(CudaClock(torch), "cost-every4", 4),
            "auto": make_recorder(CudaClock(torch), "cost-auto", "auto")}  # the default: 1 in 8 at this interval
    times = interleaved_blocks(rows, blocks, n)
    med = {k: statistics.median(v) for k, v in times.items()}
    diffs = [a - b for a, b in zip(times["raw" if raw.raw else "torch"], times["off"], strict=True)]
    cost = statistics.median(diffs)
    torch_cost = statistics.median(a - b for a, b in zip(times["torch"], times["off"], strict=True))
    every4_cost = statistics.median(a - b for a, b in zip(times["raw_every_4"], times["off"], strict=True))
    auto_cost = statistics.median(a - b for a, b in zip(times["auto"], times["off"], strict=True))
    # what one mark costs, and its parts
    clock_torch = CudaClock(torch, raw=False)
    events = [clock_torch.event() for _ in range(64)]
    ev = events[0]
    parts = {"mark, torch's Event.record path": per_call_us(clock_torch.record, (ev,)),
             "torch.cuda.current_stream()": per_call_us(torch.cuda.current_stream, ()),
             "torch._C._cuda_getCurrentRawStream": per_call_us(torch._C._cuda_getCurrentRawStream, (0,)),
             "torch._C._cuda_isCurrentStreamCapturing": per_call_us(torch._C._cuda_isCurrentStreamCapturing, ()),
             "time.monotonic_ns": per_call_us(time.monotonic_ns, ()),
             "begin (capture check), torch": per_call_us(clock_torch.begin, ())}
    if raw.raw:
        parts["mark, raw path (cuEventRecord)"] = per_call_us(raw.record, (ev,))
        parts["begin (capture check), raw"] = per_call_us(raw.begin, ())
        stream = torch._C._cuda_getCurrentRawStream(0)
        parts["cuEventRecord alone (ctypes)"] = per_call_us(raw._cu_record, (ev.cuda_event, stream))
        import ctypes

        from telemetrain.training.device_clock import _driver_function

        capturing = _driver_function("cuStreamIsCapturing", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)])
        if capturing is not None:
            status = ctypes.c_int()
            parts["cuStreamIsCapturing (ctypes)"] = per_call_us(capturing, (stream, ctypes.byref(status)))
    torch.cuda.synchronize()
    marks = empty_marks(torch, rows["raw"])
    # judged at the default (device_timing_every="auto": one iteration in 8 here); every iteration timed is reported
    check("C_host_cost", auto_cost <= 10.0,
          f"device timing adds {auto_cost:.2f} us per iteration at the default (auto: 1 in 8); timing every "
          f"iteration {cost:.2f} us ({'raw' if raw.raw else 'torch'} marks; torch's "
          f"Event.record path {torch_cost:.2f} us; device_timing_every=4 {every4_cost:.2f} us; "
          f"5 phases, {marks} marks a timed iteration; training-thread CPU time, "
          f"median of {blocks} interleaved blocks of {n}: " + ", ".join(f"{k} {v:.2f} us" for k, v in med.items())
          + "); per call: " + "; ".join(f"{k} {v:.2f} us" for k, v in parts.items()) + "; goal <= 10 us",
          cost_us=auto_cost, every1_cost_us=cost, torch_path_cost_us=torch_cost, every4_cost_us=every4_cost,
          blocks_us=times,
          per_call_us=parts, marks=marks, raw=raw.raw)


class FreeClock:
    """A ``DeviceClock`` whose marks cost nothing and complete at once: what is left is our bookkeeping."""

    name = "free"

    def event(self) -> object:
        return object()

    def record(self, event: Any) -> None:
        pass

    def done(self, event: Any) -> bool:
        return True

    def elapsed_s(self, start: Any, end: Any) -> float:
        return 0.001

    def begin(self) -> bool:
        return True


def bookkeeping_cost(blocks: int, n: int) -> int:
    """Check C's comparison on the CPU with ``FreeClock``: training-thread CPU us per 5-phase iteration over
    ``device_timing="host"``, median of ``blocks`` interleaved blocks of ``n``."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import telemetrain
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    store = tempfile.mkdtemp(prefix="bench_gpu-")

    def make(mode: Any, every: int | str) -> Any:
        t = telemetrain.Telemetry(store=store)
        config = TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=1000,
                                         device_timing=mode, device_timing_every=every, gpu_energy=False)
        r = TrainingRecorder(config, telemetry=t)
        r.on_app_start()
        r.on_train_start(0)
        return r

    rows = {"off": make("host", 1), "every 1": make(FreeClock(), 1), "auto (1 in 8)": make(FreeClock(), "auto"),
            "untimed (1 in 10^9)": make(FreeClock(), 10**9)}
    try:
        times = interleaved_blocks(rows, blocks, n)
    finally:
        for r in rows.values():
            r.telemetry.close()
        shutil.rmtree(store, ignore_errors=True)
    for k, v in times.items():
        added = statistics.median(a - b for a, b in zip(v, times["off"], strict=True))
        print(f"{k:20s} {statistics.median(v):7.2f} us an iteration, +{added:.2f} us")
    return 0


def empty_marks(torch: Any, r: Any) -> int:
    """Marks an empty 5-phase iteration records: the median over the timer's slots (one slot whose iteration was
    preempted between two phases records one more)."""
    from telemetrain.training.device_spans import timer_of

    timer = timer_of(r.telemetry)[0] if hasattr(r, "telemetry") else None
    if timer is None:
        return -1
    empty_iterations(r, 1)
    torch.cuda.synchronize()
    timer.resolve()
    slots = [s for s in list(timer._free) + list(timer._pending) if s.n]
    return int(statistics.median(s.n for s in slots)) if slots else -1
