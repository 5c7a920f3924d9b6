"""bench_training.py's pieces section: where the time of one telemetrain iteration goes."""

from __future__ import annotations

import gc
import os
import sys
from collections import deque
from contextvars import ContextVar
from time import monotonic_ns, thread_time_ns
from typing import Any

import _training_state as state
from _method import NOTES
from _training_children import _pair_timer
from _training_harness import _row, _training_config, bench, derived
from _training_spans import _STORES
from _training_state import EXTRA, LOG_EVERY

# -- pieces: where the time goes ------------------------------------------------------------------------------------


class _ItPieces:
    def __init__(self, tmpdir: str, log_every: int) -> None:
        import telemetrain
        from telemetrain.training import TrainingRecorder

        self.t = telemetrain.Telemetry(store=os.path.join(tmpdir, f"pieces_{log_every}"))
        device = None if "torch" in sys.modules else "cpu"
        self.r = TrainingRecorder(_training_config(log_every=log_every, device_name=device), telemetry=self.t)
        self.r.on_app_start()
        self.r.on_train_start(0)
        s, e = self.r.on_training_single_iteration_start, self.r.on_training_single_iteration_end
        for _ in range(3000):  # past the first reports: steady state
            s()
            e()

    def close(self) -> None:
        self.r.on_train_end()
        self.r.on_app_end()
        self.t.close(60)


def section_pieces(tmpdir: str) -> None:
    import cProfile
    import pstats

    from telemetrain.spans import tracer

    lib = "pieces"
    # -- the iteration (the training thread's CPU time, as the iteration rows)
    with_reports = _ItPieces(tmpdir, LOG_EVERY)
    without = _ItPieces(tmpdir, 10**9)
    try:
        def cpu_row(op: str, r: Any) -> dict[str, Any]:
            timer = _pair_timer(r.on_training_single_iteration_start, r.on_training_single_iteration_end)
            n = 50_000
            timer(2000)
            samples = []
            for _ in range(state.ARGS.repeats):
                gc.collect()
                samples.append(timer(n)[0] / n)
            return _row(lib, op, samples, n)

        full = cpu_row(f"recorder iteration, steady state (after 3k iterations), N={LOG_EVERY}, training thread CPU",
                       with_reports.r)
        bare = cpu_row("recorder iteration, log_every_n_train_iterations=10**9 (no metrics report), training thread "
                       "CPU", without.r)
        capture = derived(lib, f"report capture amortised per iteration (N={LOG_EVERY} - no report)", full, bare)
        # the report computed (in the collector thread normally): here in this thread, on captured snapshots
        reporter = with_reports.r._reporter  # internals: the recorder's Reporter
        reporter.drain()
        queued: list[Any] = []
        submit = reporter.submit
        # capture only, compute below (assignment: list.append's parameter is positional-only, submit's is not)
        reporter.submit = queued.append  # type: ignore[method-assign, assignment]
        try:
            s, e = with_reports.r.on_training_single_iteration_start, with_reports.r.on_training_single_iteration_end
            for _ in range(LOG_EVERY * 200):
                s()
                e()
        finally:
            reporter.submit = submit  # type: ignore[method-assign]
        reports = [q for q in queued if not hasattr(q, "chunks")]
        reporter._pending.extend(queued)
        t0 = thread_time_ns()
        reporter.drain()
        per_report = (thread_time_ns() - t0) / max(len(reports), 1)
        _row(lib, f"one metrics report computed and emitted (the collector thread's work, every {LOG_EVERY} "
             "iterations)", [per_report], len(reports))
        # calls per iteration (cProfile), no report
        s, e = without.r.on_training_single_iteration_start, without.r.on_training_single_iteration_end
        prof = cProfile.Profile()
        n = 2000
        prof.enable()
        for _ in range(n):
            s()
            e()
        prof.disable()
        st = pstats.Stats(prof)
        calls = st.total_calls / n  # type: ignore[attr-defined]
        NOTES.append(
            f"pieces, iteration: {calls:.0f} Python-level calls per no-report iteration (cProfile); the training "
            f"thread's share of a metrics report (the capture) ~{capture['median_ns'] * LOG_EVERY / 1e3:.0f} us, "
            f"the collector thread's ~{per_report / 1e3:.0f} us (every {LOG_EVERY} iterations)."
        )
        EXTRA["pieces"] = {
            "calls_per_iteration": calls,
            "capture_us": capture["median_ns"] * LOG_EVERY / 1e3,
            "report_us": per_report / 1e3,
        }
    finally:
        with_reports.close()
        without.close()

    # -- the span
    stores = _STORES[0] if _STORES else None
    if stores is None:
        return
    t = stores.caller
    tr = tracer(t)
    flush = stores.flush
    with_tracer = bench(
        lib,
        '`with tr.span("it"): pass` (tracer looked up once, outside the loop)',
        'with tr.span("it"): pass',
        {"tr": tr},
        between=flush,
    )
    bench(
        lib,
        "`tracer(None)` (the lookup span() does per span: get_telemetry() + extensions.get)",
        "tracer(None)",
        {"tracer": tracer},
    )
    build = bench(lib, '`tr.span("it")` (builds the Span, not entered)', 'tr.span("it")', {"tr": tr})
    derived(lib, "enter + exit of a built span = with tr.span - build", with_tracer, build)
    bench(lib, "`clock()` (time.monotonic_ns, read twice per span)", "clock()", {"clock": monotonic_ns})
    cv: ContextVar[object] = ContextVar("bench_cv", default=None)
    bench(
        lib,
        "`cv.reset(cv.set(x))` (ContextVar set + reset, once per span)",
        "reset(set_(x))",
        {"reset": cv.reset, "set_": cv.set, "x": 1},
    )
    q: deque[tuple[Any, ...]] = deque()
    bench(
        lib,
        "`q.append((kind, t, tok, group, name, sid, pid, tid))` (one packed record; a short span writes one)",
        "q.append((k, a, b, g, nm, c, d, e))",
        {"q": q, "k": "span_start", "a": 1, "b": 2, "g": "spans", "nm": "it", "c": 3, "d": 0, "e": 4},
        between=q.clear,
    )
