"""bench_gpu.py's checks A and B: each phase's device time against torch.profiler's kernels, and no added sync."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from _gpu_results import check
from _gpu_training import PHASES, SPAN_OF, Job

# -- A: device phases against the profiler -----------------------------------------------------------------------------


def kernel_times_by_phase(trace: dict[str, Any]) -> dict[str, float]:
    """Seconds of device work per phase: each kernel/memcpy/memset is attributed to the phase (a CPU user annotation)
    during which it was launched (its runtime call, matched by correlation id)."""
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    launches: dict[int, float] = {}
    phases: list[tuple[float, float, str]] = []
    device: list[tuple[int, float]] = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        args = e.get("args") or {}
        if cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches[int(args["correlation"])] = float(e["ts"])
        elif cat == "user_annotation" and e.get("name") in SPAN_OF.values():
            phases.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"]))
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" in args:
            device.append((int(args["correlation"]), float(e.get("dur", 0))))
    out = {p: 0.0 for p in PHASES}
    phase_of = {v: k for k, v in SPAN_OF.items()}
    phases.sort()
    for corr, dur in device:
        ts = launches.get(corr)
        if ts is None:
            continue
        for start, end, name in phases:
            if start <= ts <= end:
                out[phase_of[name]] += dur / 1e6
                break
    return out


def check_a(torch: Any, job: Job, timer: Any, steps: int, out_dir: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    # the same number of steps without the profiler first: the profiler slows the host's launches, and where the host
    # then falls behind the device, the device idles inside a phase -- time our events rightly count and the kernels'
    # sum does not (the batch is sized so that the device stays ahead: --batch)
    torch.cuda.synchronize()
    timer.resolve(0.5)
    timer.take_window()
    for _ in range(steps):
        job.step()
    torch.cuda.synchronize()
    timer.resolve(1.0)
    plain = timer.take_window()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            job.step(annotate=True)
        torch.cuda.synchronize()
    timer.resolve(1.0)
    window = timer.take_window()
    path = out_dir / "profile.json"
    prof.export_chrome_trace(str(path))
    kernels = kernel_times_by_phase(json.loads(path.read_text()))
    ours = {p: window.phases.get(p, 0.0) for p in PHASES}
    iteration = window.iteration_sum / max(window.steady, 1) * steps if window.steady else sum(ours.values())
    rows = {}
    ok = window.iterations == steps
    for p in PHASES:
        a, b = ours[p], kernels[p]
        judged = b >= 0.02 * iteration
        ratio = a / b if b > 0 else math.nan
        rows[p] = {"device_events_s": a, "profiler_kernels_s": b, "ratio": ratio, "judged": judged,
                   "device_events_unprofiled_s": plain.phases.get(p, 0.0)}
        if judged and not abs(ratio - 1) <= 0.10:
            ok = False
    detail = "; ".join(f"{p} {r['device_events_s'] * 1e3 / steps:.3f} ms vs {r['profiler_kernels_s'] * 1e3 / steps:.3f}"
                       f" ms ({r['ratio']:.3f}{'' if r['judged'] else ', not judged'}; unprofiled "
                       f"{r['device_events_unprofiled_s'] * 1e3 / max(plain.iterations, 1):.3f} ms)"
                       for p, r in rows.items())
    check("A_phases_vs_profiler", ok, f"{steps} steps, {window.iterations} timed: {detail}", phases=rows,
          timed=window.iterations, steps=steps)


# -- B: no added sync --------------------------------------------------------------------------------------------------


def check_b(torch: Any, job: Job, timer: Any) -> None:
    armed = False
    torch.cuda.set_sync_debug_mode("error")
    try:
        try:
            job.loss(job.batches[0]).item()  # the control: a sync must raise
        except RuntimeError:
            armed = True
        error = ""
        try:
            for _ in range(20):
                job.step()
                with job.recorder.tracer.span("device_span_check", device=True):
                    job.batches[0].float().sum()
        except RuntimeError as exc:
            error = str(exc)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    # the mode is process-wide: a sync in the collector thread's resolution would raise there, contained, and turn
    # device timing off
    check("B1_no_sync_debug_mode", armed and not error and timer.enabled,
          "20 instrumented steps under set_sync_debug_mode('error'): " + (f"raised {error!r}" if error else "no sync")
          + ("" if armed else "; the control .item() did NOT raise: the mode is not armed")
          + ("" if timer.enabled else f"; device timing turned OFF: {timer.failure}"), armed=armed)
    # an instrumented step captured into a CUDA graph: the capture fails on a sync, and the timer records nothing
    x = torch.randn(1024, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            x @ w
    torch.cuda.current_stream().wait_stream(stream)
    before = timer.take_window()
    graph = torch.cuda.CUDAGraph()
    error = ""
    try:
        with torch.cuda.graph(graph):
            job.recorder.on_training_single_iteration_start()
            with job.recorder.forward():
                y = x @ w
            job.recorder.on_training_single_iteration_end()
        graph.replay()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the check's failure
        error = f"{type(exc).__name__}: {exc}"
    after = timer.take_window()
    check("B2_graph_capture", not error and after.captured >= 1 and bool(torch.isfinite(y).all()),
          f"instrumented step captured and replayed: {error or 'ok'}; iterations begun while capturing "
          f"{after.captured} (not timed, counted)", captured=after.captured, unresolved_before=before.unresolved)
    # a global-mode capture (torch.cuda.graph's default) while another thread resolves pending marks, as the
    # collector thread may: the reads run in relaxed capture mode, so the capture must survive them
    import threading

    for _ in range(5):
        job.step()  # marks pending (no sync)
    stop = threading.Event()
    passes = [0]

    def resolve() -> None:
        while not stop.is_set():
            timer.resolve()
            passes[0] += 1

    worker = threading.Thread(target=resolve)
    graph2 = torch.cuda.CUDAGraph()
    error = ""
    worker.start()
    try:
        with torch.cuda.graph(graph2):
            z = x
            for _ in range(300):
                z = (z @ w).clamp_(-1, 1)
    except Exception as exc:  # noqa: BLE001 - the check's failure
        error = f"{type(exc).__name__}: {exc}"
    finally:
        stop.set()
        worker.join()
    if not error:
        graph2.replay()
        torch.cuda.synchronize()
    check("B3_capture_with_concurrent_resolution", not error and timer.enabled and passes[0] > 0,
          f"global-mode capture of 300 matmuls while another thread ran {passes[0]} resolution passes: "
          f"{error or 'capture ok'}; device timing {'on' if timer.enabled else 'OFF: ' + timer.failure}",
          passes=passes[0])
