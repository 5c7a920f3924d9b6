"""The application callbacks of ``TrainingRecorder`` (a part of it): the training config set or replaced and its
``update_training_telemetry_config`` event, the application span (``on_app_start``, its ``one_logger_initialization``
event, ``on_app_end``, which ends whatever is still open), the initialisation phases under it (distributed, model,
data loader, optimizer) and ``on_exception``, which marks every open span failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..span_lifecycle import describe_end
from ..spans import Span
from .config import TrainingTelemetryConfig, evaluate
from .names import E, S
from .recorder_base import RecorderBase
from .workload import apply_perf_tag, publish_workload

__all__ = ["ApplicationCallbacks"]


def _simple_pair(name: str, what: str) -> tuple[Callable[..., Span | None], Callable[..., None]]:
    """The start and end callbacks of an initialisation phase (a span under the application)."""

    def start(self: RecorderBase, start_time_msec: float | None = None) -> Span | None:
        with self._lock:
            return self._start(f"on_{what}_start", name, start_time_msec, parent=S.APPLICATION)

    def end(self: RecorderBase, finish_time_msec: float | None = None) -> None:
        with self._lock:
            self._end(f"on_{what}_end", name, finish_time_msec)

    start.__name__, end.__name__ = f"on_{what}_start", f"on_{what}_end"
    return start, end


class ApplicationCallbacks(RecorderBase):
    """The config, the application and its initialisation phases, and ``on_exception`` of ``TrainingRecorder``."""

    if TYPE_CHECKING:  # (the recorder's other parts)
        def _schedule_report(self) -> None: ...

        def on_train_end(self, finish_time_msec: float | None = None) -> None: ...

        def on_training_single_iteration_end(self, finish_time_msec: float | None = None) -> None: ...

    # -- configuration ---------------------------------------------------------------------------------------------

    def set_training_telemetry_config(self, config: TrainingTelemetryConfig) -> None:
        """Set (or replace) the config; emits ``update_training_telemetry_config`` (on the application span)."""
        if not isinstance(config, TrainingTelemetryConfig):
            raise TypeError(f"config must be a TrainingTelemetryConfig, got {type(config).__name__}")
        with self._lock:
            self.config = config
            self._every = config.log_every_n_train_iterations
            self._warmup = config.warmup_iterations
            lazy = (config.global_batch_size_or_fn, config.seq_length_or_fn, config.flops_per_sample_or_fn)
            self._fixed = None if any(callable(v) for v in lazy) else self._sizes()  # else evaluated per report
            # an iteration's default sample count: a lazy global batch size is read at each iteration's end
            self._batch = None if callable(config.global_batch_size_or_fn) else self._gbs() or 0
            # the world size each report divides by: a value cannot change, a function is called at each report
            self._world_lazy = callable(config.world_size_or_fn)
            self._world = 0 if self._world_lazy else config.world_size or 0
            self._schedule_report()
            self._peak_resolved = False
            every = config.export_iteration_spans_every or config.log_every_n_train_iterations
            self._export_every = every  # training iterations: sampled here (the hot path), the others by the tracer
            self.tracer.sample(S.VALIDATION_SINGLE_ITERATION, every)
            self.tracer.sample(S.TESTING_SINGLE_ITERATION, every)
            if not callable(config.perf_tag_or_fn):  # the run's perf tag from now on (a lazy one: at app start)
                self._guarded("set_training_telemetry_config", lambda: apply_perf_tag(self.telemetry, config))
            if self._app_start_ns:  # else on_app_start emits it (one-logger's order)
                self._guarded("set_training_telemetry_config", self._emit_config)

    def _emit_config(self) -> None:
        assert self.config is not None
        config = self.config
        self._guarded("perf_tag", lambda: apply_perf_tag(self.telemetry, config))
        attributes = config.as_attributes()
        if not attributes.get("perf_tag"):  # none in the config: the run's (environment or script name)
            attributes["perf_tag"] = self.telemetry.identity.perf_tag
        self._event(E.UPDATE_TRAINING_TELEMETRY_CONFIG, attributes, S.APPLICATION)
        self._guarded("workload", lambda: publish_workload(self.telemetry, config))

    # -- application and initialisation ----------------------------------------------------------------------------

    def on_app_start(self, start_time_msec: float | None = None) -> Span | None:
        with self._lock:
            config = self.config
            if config is not None:  # the config's perf tag before the first record of the application
                self._guarded("on_app_start", lambda: apply_perf_tag(self.telemetry, config))
            s = self._start("on_app_start", S.APPLICATION, start_time_msec)
            if s is None:
                return None
            self._app_start_ns = s.start_ns
            self._guarded("on_app_start", self._emit_initialization)
            if self.config is not None:
                self._guarded("on_app_start", self._emit_config)
            return s

    def _emit_initialization(self) -> None:
        identity = self.telemetry.identity
        config = self.config
        app = self.app_defaults  # where no training config is set yet (one-logger's README sets it after app start)
        metadata = (config.custom_metadata if config else None) or app.get("custom_metadata")
        attributes: dict[str, Any] = {
            "world_size": (config.world_size if config else None) or evaluate(app.get("world_size_or_fn"))
            or identity.world_size,
            "one_logger_training_telemetry_version": f"telemetrain {__version__}",
            "enable_for_current_rank": True,
            "session_tag": (config.session_tag if config else None) or evaluate(app.get("session_tag_or_fn"))
            or identity.session_tag,
            "is_baseline_run": config.is_baseline_run if config else bool(evaluate(app.get("is_baseline_run_or_fn"))),
            "summary_data_schema_version": "1.0.0",
            "node_name": identity.host,
            "rank": identity.rank,
        }
        if metadata:
            attributes["custom_metadata"] = [f"{k}:{v}" for k, v in metadata.items()]
        self._event(E.ONE_LOGGER_INITIALIZATION, attributes, S.APPLICATION)

    def on_app_end(self, finish_time_msec: float | None = None) -> None:
        """End the application; spans still open are ended as ``terminated`` (each an error event), the training
        loop's last metrics are reported first."""
        with self._lock:
            loop = self._spans.get(S.TRAINING_LOOP)
            if loop is not None:
                if loop.status != "error":  # after on_exception it is no misuse: the training failed
                    self._misuse("on_app_end", "training_loop still open at application end: ended here")
                self.on_train_end(finish_time_msec)
            elif self._iteration is not None:
                self._misuse("on_app_end", "an iteration is still open at application end: ended here")
                self.on_training_single_iteration_end(finish_time_msec)
            for key, s in list(self._spans.items()):
                if key != S.APPLICATION and not s.ended:
                    self._misuse("on_app_end", f"{key} still open at application end: terminated", span=key)
                    self._spans.pop(key, None)
                    s.end("terminated", "still open at application end", end_ns=self._mono_of(finish_time_msec))
            self._end("on_app_end", S.APPLICATION, finish_time_msec)
        self.telemetry.flush()

    def on_exception(self, exc: BaseException) -> None:
        """An exception is leaving the training code: every open span of this recorder (the iteration, the loops, a
        save, the application) is marked ``error`` with it, so whatever ends them next (``on_app_end``, the
        integrations' end hooks) ends them as failed, and goodput counts the run as a crash (interrupted, for a
        KeyboardInterrupt)."""
        if not isinstance(exc, BaseException):
            raise TypeError(f"exc must be an exception, got {type(exc).__name__}")
        text = describe_end(exc)
        with self._lock:
            iteration = self._iteration
            if iteration is not None and not iteration.ended:
                iteration.set_status("error", text)
            for s in self._spans.values():
                if not s.ended:
                    s.set_status("error", text)

    on_distributed_init_start, on_distributed_init_end = _simple_pair(S.DIST_INIT, "distributed_init")
    on_model_init_start, on_model_init_end = _simple_pair(S.MODEL_INIT, "model_init")
    on_dataloader_init_start, on_dataloader_init_end = _simple_pair(S.DATA_LOADER_INIT, "dataloader_init")
    on_optimizer_init_start, on_optimizer_init_end = _simple_pair(S.OPTIMIZER_INIT, "optimizer_init")
