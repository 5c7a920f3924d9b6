"""``TrainingRecorder``: one-logger's training lifecycle (its spans, events, callbacks, derived metrics) at a fraction
of its cost, with the metrics it declared but never filled, and without ever raising into the training job.

Every callback is O(1): an iteration adds its duration to a list; every ``log_every_n_train_iterations``
iterations (aligned to the global step) and once more at the end of training (one-logger never reports the last
partial window) the window is captured and handed to the ``reports.Reporter``, which folds it into window and
cumulative ``Summary``s (exact percentiles up to 2048 samples a window, 0.54% beyond) and emits the report in the
collector thread. The iteration callbacks take no lock and time a sampled-out iteration on a reusable quiet span.
Misuse -- an end without a start, a callback twice, a save that fails, a span left open -- becomes an ``error``
event with the callback's name and the state it found, counted in ``errors``; the call returns normally.

The callbacks are grouped by what they do, one module each, combined here: ``recorder_base`` (shared state, the
span and misuse helpers), ``application_callbacks`` (the config, the application and its initialisation phases,
``on_exception``), ``checkpoint_callbacks``, ``eval_loops`` (validation and testing), ``report_capture`` (when and what
a report captures; the derived metrics it yields), ``phase_spans`` (the phase context managers and the loop's device
timing). This class keeps construction, the training loop, the per-iteration hot path and ``progress()``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from numbers import Integral
from typing import Any

from ..spans import Span, _current_get, _current_set, current_span, tracer
from ..stats.summary import Summary
from ..telemetry import Telemetry, get_telemetry
from .application_callbacks import ApplicationCallbacks
from .checkpoint_callbacks import CheckpointCallbacks
from .checkpoint_stats import Durations
from .config import TrainingTelemetryConfig
from .eval_loops import EvalLoopCallbacks
from .names import PHASES, S
from .phase_spans import PhaseSpans
from .recorder_base import CURRENT as CURRENT  # (re-exported: integrations import it from here)
from .recorder_base import GROUP as GROUP
from .recorder_base import _mono
from .report_capture import ReportCapture
from .reports import FOLD_EVERY, Reporter, Window
from .workload import publish_workload

__all__ = ["TrainingRecorder"]

_NO_SIZE: tuple[int | None, int | None] = (None, None)  # no count given for the open iteration (compared by identity)
# open spans during which iterations legitimately stop advancing (a watchdog does not call that a stall)
_PAUSES = (S.CHECKPOINT_SAVE_SYNC, S.CHECKPOINT_LOAD, S.VALIDATION_LOOP, S.TESTING_LOOP)


class TrainingRecorder(ApplicationCallbacks, CheckpointCallbacks, EvalLoopCallbacks, ReportCapture, PhaseSpans):
    """One training job's lifecycle telemetry (an instance per job; ``training.callbacks`` drive a default one)."""

    def __init__(self, config: TrainingTelemetryConfig | None = None, *, telemetry: Telemetry | None = None) -> None:
        if config is not None and not isinstance(config, TrainingTelemetryConfig):
            raise TypeError(f"config must be a TrainingTelemetryConfig, got {type(config).__name__}")
        if telemetry is not None and not isinstance(telemetry, Telemetry):
            raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
        self.telemetry = telemetry if telemetry is not None else get_telemetry()
        self.tracer = tracer(self.telemetry)
        self.config: TrainingTelemetryConfig | None = None
        self.errors = 0
        self.warn_misuse = True  # False when a one-logger recorder drives this one (it warns the caller itself)
        # a one-logger recorder driving this one: its application config's session tag, world size, baseline flag and
        # custom metadata (``*_or_fn``), for one_logger_initialization when no training config gives them
        self.app_defaults: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._spans: dict[str, Span] = {}
        # the hot path's state, apart from _spans: the open loop and iteration, and the config values it reads
        self._loop: Span | None = None
        self._loop_hex = ""
        self._iteration: Span | None = None
        self._every = 50
        self._warmup = 0
        self._fixed: tuple[int, int | None, float | None] | None = None
        self._batch: int | None = 0  # samples an iteration counts by default: the fixed global batch (None: lazy)
        self._world = 0  # the config's world size, when given as a value (0: none; _world_lazy: a function)
        self._world_lazy = False
        self._export_every = 50
        self._quiet: Span | None = None  # the loop's reusable span for sampled-out iterations (Tracer.quiet)
        self._iterations_begun = 0
        self._app_start_ns = 0
        self._reporter = Reporter(self._emit_report, self._report_failed)
        self._reset_training_state()
        self._saves = Durations()
        self._loads = Durations()
        self._save_attempts = 0
        self._save_successes = 0
        self._first_success_wall: float | None = None
        self._latest_success_wall: float | None = None
        self._snapshots: dict[int, dict[str, Any]] = {}
        self._save_succeeded = False
        self._validation_total_sec = 0.0
        self._iterations_at_validation = 0
        self._iterations_at_testing = 0
        self._loop_summary: dict[str, Summary] = {}
        self._loop_times: dict[str, list[float]] = {}
        self._peak: Any = None
        self._peak_resolved = False
        self._device: Any = None  # device_timing.DeviceTimer while device timing is on (gpu_report)
        self._gpu: Any = None  # gpu_report.GpuReport: device times and energy of the loop's reports
        self.phase: tuple[str, int] | None = None  # the sub-phase span open now and its monotonic start (progress())
        for phase_name in PHASES:
            self.tracer.on_end(phase_name, self._on_phase_end)
        if config is not None:
            self.set_training_telemetry_config(config)
        self.telemetry.add_producer(self)
        self.telemetry.extensions[CURRENT] = self

    # -- the Telemetry producer protocol: exit and SIGTERM -----------------------------------------------------------

    def collect(self, final: bool) -> None:
        """When the Telemetry closes (exit, SIGTERM) with training under way: report the iterations since the last
        update (so the progress of an interrupted run is known to the iteration), then leave the open spans to the
        tracer, which ends them as ``terminated``."""
        if not final:
            self._reporter.drain()  # a flush: the reports computed so far are in the store after it
            return
        with self._lock:
            loop = self._spans.get(S.TRAINING_LOOP)
            if loop is not None and not loop.ended and self._iterations > self._window_begin:
                self._report(final=True)
            self._reporter.close()

    def after_fork_in_child(self) -> None:
        self._lock = threading.RLock()
        self._spans = {}  # the parent's: a forked DataLoader worker is not the training loop
        self._loop = self._iteration = None
        self._reporter.after_fork_in_child()

    def _reset_training_state(self) -> None:
        self._quiet = None
        self._iterations_begun = 0
        self._loop_start_ns = 0
        self._iterations_start = 0
        self._samples_start = 0
        self._iterations = 0  # completed this job
        self._iteration_total_sec = 0.0  # all iterations this job (for productive time)
        # what the iterations processed (report_capture._counts): each counts the samples and tokens given for it
        # (iteration_size, or on_training_single_iteration_end's), else the global batch size at its end and
        # samples x seq_length at the report
        self._size: tuple[int | None, int | None] = _NO_SIZE  # given for the open iteration
        self._samples = 0  # samples counted this job
        self._uncounted = 0  # iterations with no sample count (no global batch size)
        self._tokens = 0  # tokens given explicitly this job
        self._untokened = 0  # samples of the iterations without a token count (x seq_length at the report)
        self._tokens_lost = 0  # iterations with neither count
        self._steady_samples = 0  # samples counted by the end of warm-up
        self._window_counts = (0, 0, 0, 0, 0)  # those five when the window began
        self._steady_paused_ns = 0  # the pauses since the end of warm-up (report_capture._paused)
        self._report_tokens: int | None = 0  # samples x seq_length of the reports so far (None: some were unknown)
        self._reporter.new_loop()
        self._window = Window()
        self._window_begin = 0  # self._iterations when the window began
        self._next_report = 0  # report when self._iterations reaches this (0: not before the config is known)
        self._steady_start_ns = 0  # end of the last warm-up iteration
        self._first_iteration_end_ns = 0
        self._last_iteration_end_ns = 0
        self._time_to_first_iteration: float | None = None
        self._iterations_target: int | None = None
        self._samples_target: int | None = None

    # -- for the integrations: the open spans, an iteration that failed --------------------------------------------

    def open_span(self, name: str) -> Span | None:
        """The recorder's open span of that name (``application``, ``training_loop``, ...), or None: for
        integrations that must not open a second one."""
        with self._lock:
            s = self._spans.get(name)
            return s if s is not None and not s.ended else None

    def abandon_iteration(self, error: str, *, end_ns: int | None = None) -> None:
        """End the open training iteration with status error, without counting it (a framework's step that failed
        before it completed: the global step did not advance). ``end_ns``: monotonic ns, default now."""
        with self._lock:
            it = self._iteration
            if it is None or it.ended:
                return
            self._iteration = None
            if self._device is not None:
                self._device.abandon_iteration()
            _deactivate(it)
            it.end("error", error, end_ns=end_ns)

    def iteration_size(self, samples: int | None = None, tokens: int | None = None) -> None:
        """What the open training iteration processes, for the derived metrics: ``samples``, the global samples of
        this step (all ranks, as ``global_batch_size``: a short last batch, a batch size that changes), ``tokens``
        its tokens (sequence packing, variable lengths). Either may be left out: the default is the global batch
        size, and samples x ``seq_length``. Also ``on_training_single_iteration_end(samples=, tokens=)``."""
        self._size = (_count("samples", samples), _count("tokens", tokens))

    # -- training loop and iterations ------------------------------------------------------------------------------

    def on_train_start(
        self,
        train_iterations_start: int,
        train_samples_start: int | None = None,
        train_iterations_target_or_fn: int | Callable[[], int] | None = None,
        train_samples_target_or_fn: int | Callable[[], int] | None = None,
        start_time_msec: float | None = None,
    ) -> Span | None:
        if isinstance(train_iterations_start, bool) or not isinstance(train_iterations_start, int) \
                or train_iterations_start < 0:
            raise ValueError(f"train_iterations_start must be an int >= 0, got {train_iterations_start!r}")
        with self._lock:
            if self.config is None:
                self._misuse("on_train_start", "no training config set (set_training_telemetry_config): throughput and "
                             "samples are not computed")
            existing = self._spans.get(S.TRAINING_LOOP)
            if existing is not None and not existing.ended:
                self._misuse("on_train_start", "training_loop is already open: this start is ignored")
                return None
            self._reset_training_state()
            gbs = self._gbs()
            self._iterations_start = train_iterations_start
            self._samples_start = (train_samples_start if train_samples_start is not None
                                   else train_iterations_start * (gbs or 0))
            config = self.config
            self._iterations_target = self._guarded("on_train_start", lambda: _value(
                train_iterations_target_or_fn, config.train_iterations_target if config else None))
            self._samples_target = self._guarded("on_train_start", lambda: _value(
                train_samples_target_or_fn, config.train_samples_target if config else None))
            attributes: dict[str, Any] = {
                "train_iterations_start": train_iterations_start,
                "train_samples_start": self._samples_start,
            }
            if self._iterations_target is not None:
                attributes["train_iterations_target"] = self._iterations_target
            if self._samples_target is not None:
                attributes["train_samples_target"] = self._samples_target
                seq = self._guarded("on_train_start", lambda: config.seq_length if config else None)
                if seq:
                    attributes["train_tokens_target"] = seq * self._samples_target
            self.peak()  # resolved now, not inside an iteration's report
            if config is not None:  # run.json's workload, with the lazy sizes as training uses them
                self._guarded("on_train_start", lambda: publish_workload(self.telemetry, config))
            self._guarded("on_train_start", self._start_gpu_report)
            s = self._start("on_train_start", S.TRAINING_LOOP, start_time_msec, attributes,
                            parent=S.APPLICATION)
            if s is not None:
                self._loop = s
                self._loop_hex = s.span_id_hex
                self._loop_start_ns = s.start_ns
                self._window.start_ns = s.start_ns
            self._schedule_report()
            return s

    def on_train_end(self, finish_time_msec: float | None = None) -> None:
        """End the training loop, reporting the iterations since the last update (one-logger drops them)."""
        with self._lock:
            if self._iteration is not None:
                if self._iteration.status != "error":  # after on_exception it is no misuse
                    self._misuse("on_train_end", "an iteration is still open at training end: ended here")
                self.on_training_single_iteration_end(finish_time_msec)
            if self._iterations > self._window_begin:
                self._report(final=True)
            self._reporter.drain()
            if self._gpu is not None and self._iterations == self._window_begin:
                self._guarded("on_train_end", self._device_tail)
            self._loop = None
            self._end("on_train_end", S.TRAINING_LOOP, finish_time_msec)

    # The iteration callbacks are the hot path (bench/bench_training.py): with the loop open and no explicit time,
    # they take no lock (a job calls them from its one training thread) and a sampled-out iteration is only timed.

    def on_training_single_iteration_start(self, start_time_msec: float | None = None) -> Span | None:
        loop = self._loop
        if start_time_msec is None and self._iteration is None and loop is not None and not loop.end_ns:
            k = self._iterations_begun
            self._iterations_begun = k + 1
            self._size = _NO_SIZE  # (a count given outside an iteration is not this one's)
            if k % self._export_every:  # sampled out: only timed, on the loop's reusable quiet span
                q = self._quiet
                if q is None or q.end_ns or q.parent is not loop:
                    q = self._quiet = self.tracer.quiet(S.TRAINING_SINGLE_ITERATION, GROUP, loop)
                elif q.attributes is not None:
                    q.attributes = None  # set during an earlier iteration
                current = _current_get()
                q._restore = current
                if current is not None:
                    current._active = q  # current wherever `current` is, in this thread (Tracer.quiet)
                else:
                    _current_set(q)
                q.start_ns = _mono()
                self._iteration = q
                if self._device is not None:  # last: the first phase then starts within SHARE_NS of its mark
                    self._device.begin_iteration(k < self._warmup)
                return q
            s = self._iteration = self.tracer.child(S.TRAINING_SINGLE_ITERATION, GROUP, loop)
            if self._device is not None:
                self._device.begin_iteration(k < self._warmup)
            return s
        with self._lock:
            stale = self._iteration
            if stale is not None:
                self._misuse("on_training_single_iteration_start", "the previous iteration was not ended: ended here "
                             "with status error, and not counted", iteration=self._iterations_start + self._iterations)
                self._iteration = None
                _deactivate(stale)
                stale.end("error", "no on_training_single_iteration_end")
            loop = self._spans.get(S.TRAINING_LOOP)
            if loop is None or loop.ended:
                self._misuse("on_training_single_iteration_start", "no training loop (on_train_start) open")
                loop = None
            start_ns = self._mono_of(start_time_msec)
            k = self._iterations_begun
            self._iterations_begun = k + 1
            self._size = _NO_SIZE
            if self._device is not None:
                self._device.begin_iteration(k < self._warmup)
            if k % self._export_every and loop is not None:  # sampled out, as on the fast path (a fresh span)
                s = self.tracer.quiet(S.TRAINING_SINGLE_ITERATION, GROUP, loop)
                if start_ns is not None:
                    s.start_ns = start_ns
                s._restore = _current_get()
                _current_set(s)
            else:
                s = self.tracer.start(S.TRAINING_SINGLE_ITERATION, group=GROUP, parent=loop, start_ns=start_ns)
            self._iteration = s
            return s

    def on_training_single_iteration_end(self, finish_time_msec: float | None = None, *, samples: int | None = None,
                                         tokens: int | None = None) -> None:
        if samples is not None or tokens is not None:  # (see iteration_size)
            given = self._size
            self._size = (given[0] if samples is None else _count("samples", samples),
                          given[1] if tokens is None else _count("tokens", tokens))
        if self._device is not None:
            self._device.end_iteration()
        s = self._iteration
        if s is None or s.end_ns or finish_time_msec is not None:
            with self._lock:
                s = self._iteration
                self._iteration = None
                if s is None or s.ended:
                    self._misuse("on_training_single_iteration_end", f"{S.TRAINING_SINGLE_ITERATION} was not started "
                                 "(or already ended): nothing to end", span=S.TRAINING_SINGLE_ITERATION)
                    return
                _deactivate(s)
                s.end(end_ns=self._mono_of(finish_time_msec))
                end_ns = s.end_ns
        elif s is self._quiet and s._route is False and s.status == "ok":
            end_ns = _mono()
            self._iteration = None
            restore = s._restore  # _deactivate(s), inline: this is the per-iteration path
            if restore is not None:
                if restore._active is s:
                    restore._active = None
            elif _current_get() is s:
                _current_set(None)
            listeners = self.tracer._listeners.get(S.TRAINING_SINGLE_ITERATION)
            if listeners:  # (end_ns set while they run: they see an ended span)
                s.end_ns = end_ns
                self.tracer._notify(s, listeners)
                s.end_ns = 0
        else:  # exported; or the quiet span, exported or failed meanwhile: ended (and retired) as any span
            self._iteration = None
            _deactivate(s)
            s.end()
            end_ns = s.end_ns
        given = self._size
        if given is not _NO_SIZE:
            self._size = _NO_SIZE
        if s.status == "error":  # it failed (an exception inside it): ended, but not a completed iteration
            return
        count = self._batch
        if given is _NO_SIZE and count:  # the usual iteration: the fixed global batch, tokens from seq_length
            self._samples += count
            self._untokened += count
        else:
            count, tokens = given
            if count is None:
                count = self._batch if self._batch is not None else self._gbs() or 0
                if not count:
                    self._uncounted += 1
            self._samples += count
            if tokens is not None:
                self._tokens += tokens
            elif count or given[0] is not None:
                self._untokened += count
            else:
                self._tokens_lost += 1
        seconds = (end_ns - s.start_ns) / 1e9
        self._iterations = n = self._iterations + 1
        self._iteration_total_sec += seconds
        if n > self._warmup:
            times = self._window.times
            times.append(seconds)
            if len(times) >= FOLD_EVERY:  # the reporter folds them (bounded memory whatever the interval)
                window = self._window
                window.chunks.append(times)
                window.times = []
                self._reporter.submit(window)
        else:
            self._window.warmup_times.append(seconds)
            if n == self._warmup:
                self._steady_start_ns = end_ns
                self._steady_samples = self._samples
        if n == 1:
            self._first_iteration_end_ns = end_ns
            origin = self._app_start_ns or self._loop_start_ns
            if origin:
                self._time_to_first_iteration = (end_ns - origin) / 1e9
        self._last_iteration_end_ns = end_ns
        if n == self._next_report:
            self._report(final=False)

    def progress(self) -> dict[str, Any]:
        """Where training is now, read from any thread without a lock (a stall watchdog, a heartbeat):
        ``completed`` (global iterations completed), ``iterations`` (this loop), ``iteration_total_sec``,
        ``last_end_ns`` (monotonic end of the last iteration, 0 before one), ``iteration_start_ns`` (of the open
        iteration, 0 outside one), ``loop_open``, ``phase`` (the open sub-phase span and its monotonic start, or
        None), ``paused_in`` (an open checkpoint save/load or validation/testing loop: iterations stop advancing
        there by design; "" otherwise)."""
        iteration = self._iteration
        spans = self._spans
        paused = next((name for name in _PAUSES if (s := spans.get(name)) is not None and not s.end_ns), "")
        return {
            "completed": self._iterations_start + self._iterations,
            "iterations": self._iterations,
            "iteration_total_sec": self._iteration_total_sec,
            "last_end_ns": self._last_iteration_end_ns,
            "iteration_start_ns": iteration.start_ns if iteration is not None and not iteration.end_ns else 0,
            "loop_open": self._loop is not None,
            "phase": self.phase,
            "paused_in": paused,
        }

    @property
    def current_span(self) -> Span | None:
        return current_span()


def _deactivate(s: Span) -> None:
    """A quiet span ``s`` is no longer current (``Tracer.quiet``): the span that was current at its start is again
    (or, when none was, nothing is)."""
    restore = s._restore
    if restore is not None:
        if restore._active is s:
            restore._active = None
    elif _current_get() is s:
        _current_set(None)


def _count(name: str, value: Any) -> int | None:
    """A sample or token count given by the caller: None, or an int >= 0 (a tensor is refused: reading it would
    wait for the device)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int >= 0 or None, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}")
    return int(value)


def _value(value_or_fn: Any, default: Any) -> Any:
    if value_or_fn is None:
        return default
    return value_or_fn() if callable(value_or_fn) else value_or_fn
