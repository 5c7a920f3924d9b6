"""How ``TrainingRecorder`` hands a window of iterations to the ``reports.Reporter``: when (each
``log_every_n_train_iterations`` of the global step, and once at the end), what it captures (a ``Snapshot``: the
window's times, counts, sizes, peak FLOP/s, checkpoint figures), and what the reporter's result becomes (a
``training_metrics_update`` event and a metric record per value). The training thread's share of a report is the
capture; the arithmetic runs in the collector thread (``reports``).

Derived metrics (``training_metrics_update``; docs/training.md defines each):
- per window (the iterations since the previous update) and cumulative (this job, warm-up iterations excluded from
  the time statistics): iteration time count/mean/min/max/p50/p90/p99 (seconds);
- samples and tokens as the iterations counted them; samples/s and tokens/s over the window's wall time (end of the
  previous window's last iteration to this window's last; so time between iterations -- data loading outside the
  iteration, logging -- counts) less the checkpoint saves/loads, validation and testing loops in it (``_paused``);
- TFLOP/s per GPU = FLOPs per sample x samples / that time / world size / 1e12, and MFU against an explicit peak or
  the device's peak from ``flops.PEAK_TFLOPS`` (an unknown device gives no MFU; the peak used is reported);
- the split of iteration time between data loading, forward, backward, optimizer and zero_grad when those sub-spans
  are used; checkpoint save and load times (count/total/min/max/mean) and sizes; time to the first iteration.
Each value is also a metric record (group ``training``, step = the global iteration), for dashboards.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ..dispatch import describe
from . import cpu_wait
from .names import E, S
from .recorder_base import GROUP, RecorderBase, _mono
from .reports import REPORT_SOURCES, Snapshot, Window, capture, emit_derived


class ReportCapture(RecorderBase):
    """The report schedule, the snapshot and the peak FLOP/s (a part of ``TrainingRecorder``)."""

    def peak(self) -> Any:
        """The peak TFLOP/s per GPU used for MFU (a ``flops.PeakFlops``), or None when unknown (no MFU)."""
        if not self._peak_resolved:
            self._peak_resolved = True
            self._peak = None
            self._peak = self._guarded("peak", self._find_peak)
        return self._peak

    def _find_peak(self) -> Any:
        from .flops import explicit_peak, peak_tflops

        config = self.config
        if config is not None and config.peak_tflops_per_gpu:
            return explicit_peak(config.peak_tflops_per_gpu, config.device_name or "explicit")
        device = config.device_name if config else None
        if device is None:
            torch = sys.modules.get("torch")
            if torch is None:
                return None  # no torch loaded, so no CUDA device to look up: no MFU (importing torch here would stall)
            if not torch.cuda.is_initialized():
                # the program runs on no GPU (a CPU job on a GPU machine): no MFU against a GPU it does not use, and
                # no CUDA context made here (get_device_name initialises CUDA: device memory, and a fork hazard).
                # Asked again at the next report: a model moved to the GPU after on_train_start initialises it then.
                self._peak_resolved = False
                return None
        return peak_tflops(device, config.dtype if config else "bfloat16")

    def _schedule_report(self) -> None:
        """The next report: when the global iteration reaches a multiple of log_every_n_train_iterations."""
        every = self._every
        self._next_report = self._iterations + every - (self._iterations_start + self._iterations) % every

    def _report(self, final: bool) -> None:
        """Capture the window and hand it to the reporter (the training thread's whole share of a report); a final
        report is computed here and now."""
        try:
            self._reporter.submit(self._snapshot(final))
            if final:
                self._reporter.drain()
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks training
            self._report_failed(exc)
        self._schedule_report()

    def _snapshot(self, final: bool) -> Snapshot:
        window = self._window
        end_ns = self._last_iteration_end_ns or _mono()
        self._window = Window(end_ns)
        config = self.config
        steady_start = self._steady_start_ns or (
            self._loop_start_ns if config is not None and config.warmup_iterations == 0 else 0)
        if window.pauses:
            paused, steady_paused = self._paused(window, end_ns, steady_start)
        else:  # (the usual window: no save or evaluation in it)
            paused, steady_paused = 0, self._steady_paused_ns
        iterations = self._iterations
        begin, self._window_begin = self._window_begin, iterations
        loop = self._spans.get(S.TRAINING_LOOP)
        gbs, seq, fps = self._fixed or self._sizes()
        samples, window_samples, tokens, window_tokens = self._counts(seq)
        sources = self.telemetry.extensions.get(REPORT_SOURCES)
        # positional, in Snapshot's field order: a 36-field dataclass built by keyword costs ~3x (the names matched
        # one by one); tests/test_report_capture_order.py checks each field against the state it comes from
        return Snapshot(
            final,  # final
            window,  # window
            iterations - begin,  # window_iterations
            end_ns,  # end_ns
            iterations,  # iterations
            self._iterations_start,  # iterations_start
            self._samples_start,  # samples_start
            self._iteration_total_sec,  # iteration_total_sec
            steady_start,  # steady_start_ns
            max(iterations - self._warmup, 0),  # steady_iterations
            self._first_iteration_end_ns,  # first_iteration_end_ns
            self._last_iteration_end_ns,  # last_iteration_end_ns
            self._time_to_first_iteration,  # time_to_first_iteration
            config.log_every_n_train_iterations if config else iterations - begin,  # interval
            gbs,  # gbs
            seq,  # seq
            fps,  # fps
            samples,  # samples
            window_samples,  # window_samples
            tokens,  # tokens
            window_tokens,  # window_tokens
            None if samples is None else samples - self._steady_samples,  # steady_samples
            paused,  # paused_ns
            steady_paused,  # steady_paused_ns
            self._world_size(),  # world
            self._peak if self._peak_resolved else self.peak(),  # peak
            self._saves.as_attributes("save_checkpoint"),  # saves
            self._loads.as_attributes("load_checkpoint"),  # loads
            self.telemetry.wall_offset_ns,  # wall_offset_ns
            self._loop_hex if loop is self._loop else (loop.span_id_hex if loop is not None else ""),  # span_id
            self._gpu,  # extras
            capture(sources) if sources else (),  # extra
            cpu_wait.clocks(),  # clocks
        )

    def _paused(self, window: Window, end_ns: int, steady_start: int) -> tuple[int, int]:
        """The ns of ``window`` (ending at ``end_ns``) and of the time since the end of warm-up that training paused
        in a checkpoint save or load, a validation or testing loop between iterations (overlaps merged). A pause
        that ends after the window (a save after its last iteration) is the next window's."""
        later = [p for p in window.pauses if p[1] > end_ns]
        self._window.pauses.extend(later)
        paused = steady = 0
        last = window.start_ns
        for start, end in sorted(p for p in window.pauses if p[1] <= end_ns):
            start = max(start, last)
            if end > start:
                paused += end - start
                if steady_start:
                    steady += end - max(start, steady_start) if end > steady_start else 0
                last = end
        self._steady_paused_ns += steady
        return paused, self._steady_paused_ns

    def _counts(self, seq: int | None) -> tuple[int | None, int | None, int | None, int | None]:
        """The samples and tokens this job and in the window (None where an iteration's count is unknown: no global
        batch size, no seq_length), from what each iteration counted (``TrainingRecorder.iteration_size``); the
        samples of iterations given no token count are x ``seq_length`` as it is at this report."""
        begin = self._window_counts
        now = self._window_counts = (self._samples, self._uncounted, self._tokens, self._untokened, self._tokens_lost)
        untokened = now[3] - begin[3]
        lost = now[4] > begin[4] or (untokened > 0 and not seq)
        from_seq = 0 if lost else untokened * (seq or 0)
        done = self._report_tokens = None if lost or self._report_tokens is None else self._report_tokens + from_seq
        return (None if now[1] else now[0], None if now[1] > begin[1] else now[0] - begin[0],
                None if done is None else done + now[2], None if lost else now[2] - begin[2] + from_seq)

    def _emit_report(self, snap: Snapshot, attributes: Mapping[str, Any]) -> None:
        """The reporter's output: the event (linked to the loop), then each metric as a record."""
        telemetry = self.telemetry
        telemetry.event(E.TRAINING_METRICS_UPDATE, attributes, group=GROUP, span_id=snap.span_id)
        emit_derived(telemetry, GROUP, snap, attributes)

    def _report_failed(self, exc: BaseException) -> None:
        self._misuse("training_metrics_update", f"failed: {describe(exc)}")
