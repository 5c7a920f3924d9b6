"""The validation and testing callbacks of ``TrainingRecorder``: their loop and iteration spans, and at each loop's
end its ``validation_metrics_update`` / ``testing_metrics_update`` event (iteration count, time statistics and
percentiles, the interval since the previous one). Under the recorder's lock, like every callback off the training
iteration's hot path."""

from __future__ import annotations

from typing import Any

from ..spans import Span
from ..stats.summary import Summary
from .names import E, S
from .recorder_base import GROUP, RecorderBase
from .reports import QUANTILES, TIME_AGGS


class EvalLoopCallbacks(RecorderBase):
    """``on_validation_*`` and ``on_testing_*`` (a part of ``TrainingRecorder``)."""

    def on_validation_start(self, start_time_msec: float | None = None) -> Span | None:
        with self._lock:
            s = self._start("on_validation_start", S.VALIDATION_LOOP, start_time_msec,
                            parent=self._outer())
            if s is not None:
                self._loop_summary[S.VALIDATION_LOOP] = Summary()
                self._loop_times[S.VALIDATION_LOOP] = []
            return s

    def on_validation_end(self, finish_time_msec: float | None = None) -> None:
        with self._lock:
            self._loop_end("on_validation_end", S.VALIDATION_LOOP, S.VALIDATION_SINGLE_ITERATION,
                           E.VALIDATION_METRICS_UPDATE, finish_time_msec)

    def on_validation_single_iteration_start(self, start_time_msec: float | None = None) -> Span | None:
        with self._lock:
            return self._loop_iteration_start("on_validation_single_iteration_start",
                                              S.VALIDATION_SINGLE_ITERATION, S.VALIDATION_LOOP,
                                              start_time_msec)

    def on_validation_single_iteration_end(self, finish_time_msec: float | None = None) -> None:
        with self._lock:
            self._loop_iteration_end("on_validation_single_iteration_end", S.VALIDATION_SINGLE_ITERATION,
                                     S.VALIDATION_LOOP, finish_time_msec)

    def on_testing_start(self, start_time_msec: float | None = None) -> Span | None:
        with self._lock:
            s = self._start("on_testing_start", S.TESTING_LOOP, start_time_msec, parent=self._outer())
            if s is not None:
                self._loop_summary[S.TESTING_LOOP] = Summary()
                self._loop_times[S.TESTING_LOOP] = []
            return s

    def on_testing_end(self, finish_time_msec: float | None = None) -> None:
        with self._lock:
            self._loop_end("on_testing_end", S.TESTING_LOOP, S.TESTING_SINGLE_ITERATION,
                           E.TESTING_METRICS_UPDATE, finish_time_msec)

    def on_testing_single_iteration_start(self, start_time_msec: float | None = None) -> Span | None:
        """Ours: one-logger has a testing-iteration span name but no callback for it."""
        with self._lock:
            return self._loop_iteration_start("on_testing_single_iteration_start", S.TESTING_SINGLE_ITERATION,
                                              S.TESTING_LOOP, start_time_msec)

    def on_testing_single_iteration_end(self, finish_time_msec: float | None = None) -> None:
        with self._lock:
            self._loop_iteration_end("on_testing_single_iteration_end", S.TESTING_SINGLE_ITERATION,
                                     S.TESTING_LOOP, finish_time_msec)

    def _loop_iteration_start(self, callback: str, name: str, loop: str,
                              time_msec: float | None) -> Span | None:
        stale = self._spans.get(name)
        if stale is not None and not stale.ended:
            self._misuse(callback, f"the previous {name} was not ended: ended here with status error")
            self._spans.pop(name, None)
            stale.end("error", f"no end callback for {name}")
        if loop not in self._spans:
            self._misuse(callback, f"no {loop} open")
        return self._start(callback, name, time_msec, parent=loop)

    def _loop_iteration_end(self, callback: str, name: str, loop: str, time_msec: float | None) -> None:
        s = self._end(callback, name, time_msec)
        if s is None:
            return
        times = self._loop_times.setdefault(loop, [])
        times.append(s.duration_ns / 1e9)
        if len(times) >= 2048:
            self._loop_summary.setdefault(loop, Summary()).fold(times)
            self._loop_times[loop] = []

    def _loop_end(self, callback: str, loop: str, iteration: str, event: str,
                  time_msec: float | None) -> None:
        if iteration in self._spans:
            self._misuse(callback, f"{iteration} still open at {loop} end: ended here")
            self._loop_iteration_end(callback, iteration, loop, time_msec)
        summary = self._loop_summary.pop(loop, Summary())
        times = self._loop_times.pop(loop, [])
        if times:
            summary.fold(times)
        ended = self._end(callback, loop, time_msec)
        if ended is None:
            return  # no loop to report on: the error event says so; no figures are invented
        current = self._iterations_start + self._iterations
        last = self._iterations_at_validation if loop == S.VALIDATION_LOOP else self._iterations_at_testing
        attributes: dict[str, Any] = {"current_iteration": current - 1 if current else 0, "interval": current - last}
        values = summary.values(TIME_AGGS)
        if values.get("count"):
            attributes.update({
                "num_iterations": values["count"], "avg_iteration_time_sec": values["mean"],
                "min_iteration_time_sec": values["min"], "max_iteration_time_sec": values["max"],
                "total_iteration_time_sec": values["sum"],
                **{f"{q}_iteration_time_sec": values[q] for q in QUANTILES if q in values},
            })
        attributes["loop_time_sec"] = ended.duration_ns / 1e9
        self.telemetry.event(event, attributes, group=GROUP, span_id=ended.span_id_hex)
        if loop == S.VALIDATION_LOOP:
            self._iterations_at_validation = current
            self._validation_total_sec += values.get("sum", 0.0)  # the validation iterations' time, as one-logger
        else:
            self._iterations_at_testing = current
