"""``RecorderBase``: the state every group of ``TrainingRecorder``'s callbacks shares (declared here, set in
``TrainingRecorder.__init__``) and the helpers they all use: opening and ending the recorder's named spans, turning a
misuse into an ``error`` event instead of an exception, the config's sizes evaluated without raising. The callback
groups (``application_callbacks``, ``checkpoint_callbacks``, ``eval_loops``, ``report_capture``, ``phase_spans``)
subclass it; ``TrainingRecorder`` combines them and keeps the per-iteration hot path in its own class body."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..dispatch import describe, warn_safely
from ..spans import Span, Tracer
from ..stats.summary import Summary
from ..telemetry import Telemetry
from .checkpoint_stats import Durations
from .config import TrainingTelemetryConfig
from .names import E, S
from .reports import Reporter, Window

_mono = time.monotonic_ns
GROUP = "training"
# spans during which training pauses between iterations: their time is left out of the throughput's denominator
PAUSES = frozenset({S.CHECKPOINT_SAVE_SYNC, S.CHECKPOINT_SAVE_ASYNC, S.CHECKPOINT_LOAD, S.VALIDATION_LOOP,
                    S.TESTING_LOOP})
CURRENT = "training.current"  # Telemetry.extensions key: the recorder built last on it (watchdogs read progress())


class RecorderBase:
    """The recorder's shared state and span/misuse helpers (see the module docstring); not used alone."""

    telemetry: Telemetry
    tracer: Tracer
    config: TrainingTelemetryConfig | None
    errors: int
    warn_misuse: bool
    app_defaults: dict[str, Any]
    phase: tuple[str, int] | None
    _lock: threading.RLock
    _spans: dict[str, Span]
    _loop: Span | None
    _loop_hex: str
    _iteration: Span | None
    _every: int
    _warmup: int
    _fixed: tuple[int, int | None, float | None] | None
    _batch: int | None
    _world: int
    _world_lazy: bool
    _samples: int
    _uncounted: int
    _tokens: int
    _untokened: int
    _tokens_lost: int
    _steady_samples: int
    _window_counts: tuple[int, int, int, int, int]
    _report_tokens: int | None
    _steady_paused_ns: int
    _reporter: Reporter
    _window: Window
    _window_begin: int
    _next_report: int
    _iterations: int
    _iterations_start: int
    _samples_start: int
    _iteration_total_sec: float
    _loop_start_ns: int
    _steady_start_ns: int
    _first_iteration_end_ns: int
    _last_iteration_end_ns: int
    _time_to_first_iteration: float | None
    _saves: Durations
    _loads: Durations
    _save_attempts: int
    _save_successes: int
    _first_success_wall: float | None
    _latest_success_wall: float | None
    _snapshots: dict[int, dict[str, Any]]
    _save_succeeded: bool
    _validation_total_sec: float
    _iterations_at_validation: int
    _iterations_at_testing: int
    _loop_summary: dict[str, Summary]
    _loop_times: dict[str, list[float]]
    _peak: Any
    _peak_resolved: bool
    _gpu: Any
    _device: Any  # device_timing.DeviceTimer while device timing is on (gpu_report)

    def _mono_of(self, time_msec: float | None) -> int | None:
        """A ``*_time_msec`` (ms since the epoch; falsy: now) on the monotonic clock, by the current offset."""
        if not time_msec:
            return None
        if isinstance(time_msec, bool) or not isinstance(time_msec, (int, float)):
            raise TypeError(f"time_msec must be milliseconds since the epoch, got {type(time_msec).__name__}")
        # whole ms and the fraction apart: ``time_msec * 1e6`` near 1.8e18 is a float 256 ns apart from its
        # neighbours, so a 250 ms iteration given as two epoch times came out 249.999872 ms
        whole = math.floor(time_msec)
        return whole * 1_000_000 + round((time_msec - whole) * 1e6) - self.telemetry.wall_offset_ns

    def _misuse(self, callback: str, message: str, **context: Any) -> None:
        self.errors += 1
        if self.errors == 1 and self.warn_misuse:
            warn_safely(f"telemetrain.training: {callback}: {message} (recorded as an error event; later ones are not "
                        "warned about)", stacklevel=4)
        attributes = {"error_message": message, "callback": callback, **context}
        try:
            self.telemetry.event(E.ERROR, attributes, severity="error", group=GROUP)
        except Exception:  # noqa: BLE001
            pass

    def _guarded(self, callback: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn``; an exception (a bug of ours, a config function that raises) is recorded, never raised."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks training
            self._misuse(callback, f"failed: {describe(exc)}")
            return None

    def _event(self, name: str, attributes: Mapping[str, Any], on: str | None = None) -> None:
        span = self._spans.get(on) if on is not None else None
        span_id = span.span_id_hex if span is not None else ""
        self.telemetry.event(name, attributes, group=GROUP, span_id=span_id)

    def _start(
        self,
        callback: str,
        name: str,
        time_msec: float | None,
        attributes: Mapping[str, Any] | None = None,
        parent: str | None = None,
    ) -> Span | None:
        key = name
        existing = self._spans.get(key)
        if existing is not None and not existing.ended:
            self._misuse(callback, f"{key} is already open: this start is ignored", span=key)
            return None
        start_ns = self._mono_of(time_msec)
        parent_span = self._spans.get(parent) if parent is not None else None
        if parent_span is not None and parent_span.ended:
            parent_span = None
        s = self.tracer.start(key, group=GROUP, parent=parent_span, start_ns=start_ns, attributes=attributes)
        self._spans[key] = s
        return s

    def _outer(self) -> str:
        """The parent of a validation or testing loop or a checkpoint save: the training loop while one is open (as
        in one-logger), else the application."""
        loop = self._spans.get(S.TRAINING_LOOP)
        return S.TRAINING_LOOP if loop is not None and not loop.ended else S.APPLICATION

    def _end(self, callback: str, name: str, time_msec: float | None, status: str | None = None,
             error: str = "") -> Span | None:
        s = self._spans.pop(name, None)
        if s is None or s.ended:
            self._misuse(callback, f"{name} was not started (or already ended): nothing to end", span=name)
            return None
        end_ns = self._mono_of(time_msec)
        if status is not None:
            s.set_status(status, error)
        s.end(end_ns=end_ns)
        if name in PAUSES and self._loop is not None and self._iteration is None:
            # training paused between iterations: left out of the window's throughput (report_capture.paused)
            self._window.pauses.append((s.start_ns, s.end_ns))
        return s

    # -- the config's sizes, evaluated guarded (a ``*_or_fn`` that raises is a misuse, not an exception) ----------

    def _sizes(self) -> tuple[int, int | None, float | None]:
        """Global batch, sequence length, FLOPs per sample (``*_or_fn`` evaluated now, as one-logger does)."""
        config = self.config
        if config is None:
            return 0, None, None
        return (self._gbs() or 0, self._guarded("seq_length", lambda: config.seq_length),
                self._guarded("flops_per_sample", lambda: config.flops_per_sample))

    def _gbs(self) -> int | None:
        config = self.config
        return self._guarded("global_batch_size", lambda: config.global_batch_size) if config is not None else None

    def _world_size(self) -> int:
        """The config's world size (a value: read once when the config is set; a function: called now), else the
        run identity's (which ``set_identity`` may change: read now)."""
        ws: int | None = self._world
        if self._world_lazy:
            config = self.config
            ws = self._guarded("world_size", lambda: config.world_size) if config is not None else None
        return int(ws or self.telemetry.identity.world_size or 1)
