"""Lightning: a ``Callback`` that maps a ``Trainer``'s run onto the training lifecycle (``training.TrainingRecorder``)
-- no class patched, nothing of Lightning's replaced.

    from telemetrain.integrations.lightning import TelemetrainCallback
    trainer = Trainer(callbacks=[TelemetrainCallback(seq_length=2048)])
    trainer.fit(model, datamodule=dm)

The mapping (docs/integrations.md has the details and the limits):
- each ``fit``/``validate``/``test``/``predict`` call is an ``application`` span (``setup`` to ``teardown``);
- ``training_loop`` is ``on_train_start`` to ``on_train_end``; ``validation_loop`` and ``testing_loop`` with their
  iterations are the validation and test batches (the sanity check is left out);
- a ``training_single_iteration`` is one optimizer step: it starts at the first micro-batch of a gradient
  accumulation group and ends at the end of the batch after which ``trainer.global_step`` has advanced; the
  micro-batches are counted (``micro_batches``, on exported iterations and on the loop);
- checkpoint saves start at ``on_save_checkpoint`` (the state is dumped, the file not yet written) and succeed
  once written: a synchronous save at the next hook this callback gets (``Trainer.save_checkpoint`` returned without
  raising), an ``AsyncCheckpointIO`` save when its background write has finished (a marker task queued behind it on
  the plugin's single writer thread; without that thread, at ``on_fit_end``, after Lightning waited for every
  write); loads are timed from the last hook before the restore to ``on_load_checkpoint``;
- ``phases=True``: forward, zero_grad and backward of each micro-batch and the optimizer update of each step as
  sub-phase spans (the derived metrics' phase split);
- ``on_exception`` ends what is open with status ``error`` (a pending save without success), and the next call on
  the same ``Trainer`` and callback starts afresh.
- under Lightning's own DDP launcher (no ``RANK``), the first ``setup`` gives every rank rank 0's run and the
  Trainer's ranks (``lightning_ranks``).
The configuration (``TrainingTelemetryConfig``) is derived from the ``Trainer`` at ``on_train_start``: the global batch
(the loader's batch size, else the first batch's, x ``accumulate_grad_batches`` x ``world_size``), the world size,
the iteration target (``max_steps``, else ``estimated_stepping_batches``), ``log_every_n_train_iterations``
(``log_every_n_steps``) and the checkpoint strategy; keyword arguments override any field, or ``config=`` replaces it.

``TelemetrainCallback`` subclasses ``lightning.pytorch.Callback`` (``pytorch_lightning.Callback`` when only the
older package is installed); ``callback_class("pytorch_lightning")`` gives the class for the other package.
"""

from __future__ import annotations

import importlib
import itertools
import time
from typing import Any

from ..dispatch import describe, warn_safely
from ..span_lifecycle import describe_end
from ..spans import Span
from ..telemetry import Telemetry, get_telemetry
from ..training.config import CheckpointStrategy, TrainingTelemetryConfig, config_overrides
from ..training.default import check_recorder_target
from ..training.names import S
from ..training.recorder import GROUP, TrainingRecorder
from .lightning_checkpoints import LightningCheckpointHooks, _is_async_io
from .lightning_eval_loops import LightningEvalLoopHooks
from .lightning_explicit import LightningExplicitCalls
from .lightning_ranks import adopt_trainer_ranks

__all__ = ["PACKAGES", "TelemetrainCallback", "callback_class"]

PACKAGES = ("lightning.pytorch", "pytorch_lightning")

TelemetrainCallback: type  # (declared only: made on first access by __getattr__, on the installed package)

def _wall_ms() -> float:
    return time.time() * 1000.0


class _LightningTelemetry(LightningCheckpointHooks, LightningEvalLoopHooks, LightningExplicitCalls):
    """The hooks (the Lightning-free half of the callback; ``callback_class`` puts a ``Callback`` base under it)."""

    def __init__(
        self,
        config: TrainingTelemetryConfig | None = None,
        *,
        recorder: TrainingRecorder | None = None,
        telemetry: Telemetry | None = None,
        application: bool = True,
        phases: bool = False,
        **overrides: Any,
    ) -> None:
        """``config``: the whole training config (else derived from the Trainer, with ``overrides`` -- config fields,
        with or without ``_or_fn`` -- on top). ``recorder``/``telemetry``: where the lifecycle goes (default: a
        recorder of its own on the default Telemetry, made at the first ``setup``). ``application=False``: the
        ``application`` span is the caller's (``training.application()`` around several Trainer calls).
        ``phases=True``: each micro-batch's forward, zero_grad and backward and each step's optimizer update as
        sub-phase spans (the derived metrics' phase split), ~2.5 us per span."""
        self._overrides = config_overrides(config, overrides)
        check_recorder_target(recorder, telemetry)
        self._config = config
        self._recorder = recorder
        self._telemetry = telemetry
        self._application = application
        self._phases = bool(phases)
        self.failures = 0  # exceptions inside this callback's hooks (contained: training goes on)
        self.micro_batches = 0  # training batches seen over this callback's life
        self.optimizer_steps = 0  # training iterations ended (= optimizer steps)
        # the batch facts of the last fit, read by the derived config's functions: kept across the resets, so a
        # validate/test/predict after fit (its application start sends the config again) keeps the training's
        self._micro_batch_size: int | None = None
        self._accumulate = 1
        self._world = 1
        self._ranks_adopted = False  # (lightning_ranks: at the first setup, on every rank alike)
        self._reset()

    def _reset(self) -> None:
        self._app: Span | None = None
        self._loop: Span | None = None
        self._iteration: Span | None = None  # open training iteration (an optimizer step in progress)
        self._phase: Span | None = None  # open sub-phase span of the iteration (phases=True)
        self._step_at_start = 0
        self._micro = 0  # micro-batches in the open iteration
        self._step_inputs = 0  # this rank's samples of those micro-batches (-1: one had no size)
        self._loop_micro = 0
        self._eval: dict[str, Span | None] = {}  # open validation/testing loop and iteration spans, by name
        self._reset_checkpoints()
        self._learn_from_batch = False  # no batch size known at the loop start: take the first batch's

    # -- plumbing --------------------------------------------------------------------------------------------------

    @property
    def recorder(self) -> TrainingRecorder:
        """The recorder this callback drives (made on first use)."""
        if self._recorder is None:
            self._recorder = TrainingRecorder(self._config, telemetry=self._telemetry)
        return self._recorder

    def _target_telemetry(self) -> Telemetry:
        """The Telemetry the recorder records into (without making the recorder)."""
        if self._recorder is not None:
            return self._recorder.telemetry
        return self._telemetry if self._telemetry is not None else get_telemetry()

    def _failed(self, hook: str, exc: BaseException) -> None:
        """A bug of ours or an unexpected Trainer: counted, warned about once, never raised into training."""
        self.failures += 1
        if self.failures == 1:
            warn_safely(f"telemetrain.integrations.lightning: {hook} failed: {describe(exc)} (training goes on; later "
                        "failures are counted in TelemetrainCallback.failures, not warned about)", stacklevel=3)

    # -- application -----------------------------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self._ranks_adopted:
            self._ranks_adopted = True
            try:  # before anything is recorded: the ranks of Lightning's own launcher, rank 0's run
                adopt_trainer_ranks(trainer, self._target_telemetry())
            except Exception as exc:  # noqa: BLE001
                self._failed("setup (ranks)", exc)
        try:
            self._reset()
            recorder = self.recorder
            if self._config is not None and recorder.config is not self._config:
                recorder.set_training_telemetry_config(self._config)
            if self._application:
                self._app = recorder.on_app_start()
                if self._app is not None:
                    self._app.set_attribute("lightning_stage", str(getattr(stage, "value", stage)))
            self._load_from_ms = _wall_ms()
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks training
            self._failed("setup", exc)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        try:
            self._settle_save(trainer)
            self._settle_async_waiting()
            if self._app is not None:
                self._app = None
                self.recorder.on_app_end()
        except Exception as exc:  # noqa: BLE001
            self._failed("teardown", exc)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            if getattr(trainer.strategy, "restore_checkpoint_after_setup", False):
                self._load_from_ms = _wall_ms()  # the restore is still to come (after this hook)
            else:
                self._check_load(trainer)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_fit_start", exc)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        try:
            self._settle_save(trainer)
            self._settle_async_waiting()  # Lightning's teardown waited for every async write, and none raised
        except Exception as exc:  # noqa: BLE001
            self._failed("on_fit_end", exc)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """End everything open with status error, innermost first (the recorder's end callbacks: their figures and
        events as usual); a save still waiting for its outcome failed. After a SIGTERM (Lightning's
        ``SIGTERMException``) the error says so: the run was preempted, not crashed."""
        error = describe_end(exception)
        recorder = self.recorder
        steps: list[tuple[str, Any]] = []
        save = self._save
        if save is not None:
            self._save = None
            steps.append(("save", lambda: self._end_failed_save(save, error)))
        phase, self._phase = self._phase, None
        if phase is not None:
            steps.append(("phase", lambda: phase.end("error", error)))
        if self._iteration is not None:
            steps.append(("iteration", lambda: self._end_span(self._iteration, error,
                                                              recorder.on_training_single_iteration_end)))
        for iteration, loop, end_iteration, end_loop in (
            ("validation_single_iteration", "validation_loop", recorder.on_validation_single_iteration_end,
             recorder.on_validation_end),
            ("testing_single_iteration", "testing_loop", recorder.on_testing_single_iteration_end,
             recorder.on_testing_end),
        ):
            if iteration in self._eval:
                steps.append((iteration, lambda n=iteration, f=end_iteration: self._end_span(self._eval[n], error, f)))
            if loop in self._eval:
                steps.append((loop, lambda n=loop, f=end_loop: self._end_span(self._eval[n], error, f)))
        if self._loop is not None:
            steps.append(("training_loop", lambda: self._end_loop(error)))
        if self._app is not None:
            steps.append(("application", lambda: self._end_span(self._app, error, recorder.on_app_end)))
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - the next one still ends
                self._failed(f"on_exception ({what})", exc)
        self._settle_async_waiting(success=False)
        self._reset()

    @staticmethod
    def _end_span(span: Span | None, error: str, end: Any) -> None:
        if span is not None:
            span.set_status("error", error)
        end()

    def _end_loop(self, error: str) -> None:
        loop = self._loop
        if loop is not None:
            loop.set_status("error", error)
            loop.set_attribute("micro_batches", self._loop_micro)
        self._loop = None
        self.recorder.on_train_end()

    # (the checkpoint hooks: lightning_checkpoints.LightningCheckpointHooks)

    # -- training --------------------------------------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            self._settle_save(trainer)
            self._check_load(trainer)
            recorder = self.recorder
            if self._config is None:
                recorder.set_training_telemetry_config(self._derive_config(trainer))
            self._loop_micro = 0
            self._loop = recorder.on_train_start(int(trainer.global_step))
        except Exception as exc:  # noqa: BLE001
            self._failed("on_train_start", exc)

    def _derive_config(self, trainer: Any) -> TrainingTelemetryConfig:
        fields: dict[str, Any] = {
            "global_batch_size_or_fn": self._global_batch_size,
            "micro_batch_size_or_fn": self._known_micro_batch_size,
            "log_every_n_train_iterations": max(int(getattr(trainer, "log_every_n_steps", 50) or 50), 1),
            "world_size_or_fn": max(int(trainer.world_size), 1),
            "save_checkpoint_strategy": (CheckpointStrategy.ASYNC if _is_async_io(trainer.strategy.checkpoint_io)
                                         else CheckpointStrategy.SYNC),
        }
        target = _iterations_target(trainer)
        if target is not None:
            fields["train_iterations_target_or_fn"] = target
        self._micro_batch_size = _loader_batch_size(trainer.train_dataloader)
        self._accumulate = max(int(getattr(trainer, "accumulate_grad_batches", 1) or 1), 1)
        self._world = fields["world_size_or_fn"]
        fields.update(self._overrides)
        self._learn_from_batch = "global_batch_size_or_fn" not in self._overrides and self._micro_batch_size is None
        return TrainingTelemetryConfig(**fields)

    def _known_micro_batch_size(self) -> int | None:
        return self._micro_batch_size

    def _global_batch_size(self) -> int:
        """Samples per optimizer step across ranks (0 until a batch size is known)."""
        mbs = self._micro_batch_size
        return mbs * self._accumulate * self._world if mbs else 0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        try:
            if self._save is not None:
                self._settle_save(trainer)
            self.micro_batches += 1
            self._loop_micro += 1
            if self._iteration is not None:  # another micro-batch of the optimizer step under way
                self._micro += 1
            else:
                if self._learn_from_batch:
                    self._learn_batch_size(batch)
                self._micro = 1
                self._step_inputs = 0
                self._step_at_start = trainer.global_step
                self._iteration = self.recorder.on_training_single_iteration_start()
            size = _batch_size(batch) if self._step_inputs >= 0 else None
            self._step_inputs = self._step_inputs + size if size else -1
            if self._phases:
                self._phase_to(S.MODEL_FORWARD)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_train_batch_start", exc)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        try:
            if self._phase is not None:
                self._phase_to(None)
            iteration = self._iteration
            if iteration is not None and trainer.global_step != self._step_at_start:  # the optimizer stepped
                self._iteration = None
                self.optimizer_steps += 1
                if iteration.exported:
                    iteration.set_attribute("micro_batches", self._micro)
                self._end_iteration(self.recorder)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_train_batch_end", exc)

    # the sub-phases (phases=True), in Lightning's order: training_step, zero_grad (in the closure, after the step
    # when not accumulating), backward; then, once per optimizer step, on_before_optimizer_step and the step

    def _phase_to(self, name: str | None) -> None:
        """End the open sub-phase span; start ``name`` (None: none) inside the open iteration."""
        phase = self._phase
        if phase is not None:
            self._phase = None
            phase.end()
        if name is not None and self._iteration is not None:
            self._phase = self.recorder.tracer.start(name, group=GROUP, device=self.recorder.device_timed)

    def on_before_zero_grad(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._phases:
            try:
                self._phase_to(S.ZERO_GRAD)
            except Exception as exc:  # noqa: BLE001
                self._failed("on_before_zero_grad", exc)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self._phases:
            try:
                self._phase_to(S.MODEL_BACKWARD)
            except Exception as exc:  # noqa: BLE001
                self._failed("on_before_backward", exc)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self._phases:
            try:
                self._phase_to(None)
            except Exception as exc:  # noqa: BLE001
                self._failed("on_after_backward", exc)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._phases:
            try:
                self._phase_to(S.OPTIMIZER_UPDATE)
            except Exception as exc:  # noqa: BLE001
                self._failed("on_before_optimizer_step", exc)

    def _end_iteration(self, recorder: Any) -> None:
        """End the training iteration with its samples when they are not a global batch (``_short_step``); a
        recorder without sizes (one-logger's callbacks, a provider's) is given none."""
        samples = self._short_step()
        if samples is None or not isinstance(recorder, TrainingRecorder):
            recorder.on_training_single_iteration_end()
        else:
            recorder.on_training_single_iteration_end(samples=samples)

    def _short_step(self) -> int | None:
        """The samples of the step just ended when its micro-batches took other than a full step's (the short last
        batch or accumulation group of an epoch), scaled as the global batch is to a full step; None: a global
        batch (a full step, or sizes unknown: an explicit config, a batch without a tensor)."""
        inputs, self._step_inputs = self._step_inputs, 0
        full = (self._micro_batch_size or 0) * self._accumulate
        if self._config is not None or not full or inputs <= 0 or inputs == full:
            return None
        config = self.recorder.config
        given = config.global_batch_size_or_fn if config is not None else None
        return round(inputs * (given / full if type(given) is int else self._world))

    def _learn_batch_size(self, batch: Any) -> None:
        """The first batch's size (no loader batch size was known): the config is sent again with it."""
        self._learn_from_batch = False
        size = _batch_size(batch)
        if size:
            self._micro_batch_size = size
            recorder = self.recorder
            if recorder.config is not None:
                recorder.set_training_telemetry_config(recorder.config)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        try:
            self._settle_save(trainer)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_train_epoch_end", exc)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        try:
            self._settle_save(trainer)
            recorder = self.recorder
            self._phase_to(None)
            iteration, self._iteration = self._iteration, None
            if iteration is not None:  # batches after the last optimizer step (manual optimization): ended, flagged
                iteration.set_attributes({"micro_batches": self._micro, "optimizer_step": False})
                self._end_iteration(recorder)
            loop, self._loop = self._loop, None
            if loop is not None:
                loop.set_attribute("micro_batches", self._loop_micro)
                recorder.on_train_end()
        except Exception as exc:  # noqa: BLE001
            self._failed("on_train_end", exc)

    # (the validation, test and predict hooks: lightning_eval_loops.LightningEvalLoopHooks)


# -- Trainer facts, each read defensively (a Trainer subclass or another version may lack one) -------------------------


def _iterations_target(trainer: Any) -> int | None:
    max_steps = getattr(trainer, "max_steps", -1)
    if isinstance(max_steps, int) and max_steps > 0:
        return max_steps
    try:
        estimated = trainer.estimated_stepping_batches
    except Exception:  # noqa: BLE001 - an infinite or unsized loader: no target
        return None
    return int(estimated) if isinstance(estimated, (int, float)) and 0 < estimated < float("inf") else None


def _loader_batch_size(loader: Any) -> int | None:
    size = getattr(loader, "batch_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _batch_size(batch: Any) -> int | None:
    """The first tensor's leading dimension in a batch (a tensor, a sequence or a mapping of them), looked for
    among the first few items of each level (read at every micro-batch: a batch that holds a long list of strings
    costs no walk through it)."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in itertools.islice(items, 8):
        size = _batch_size(item)
        if size:
            return size
    return None


# -- the Callback classes ----------------------------------------------------------------------------------------------

_CLASSES: dict[str, type] = {}


def callback_class(package: str = PACKAGES[0]) -> type:
    """``TelemetrainCallback`` on ``package``'s ``Callback`` (``"lightning.pytorch"`` or ``"pytorch_lightning"``):
    the Trainer of each package accepts only its own package's callbacks."""
    if package not in PACKAGES:
        raise ValueError(f"package must be one of {', '.join(PACKAGES)}, got {package!r}")
    cls = _CLASSES.get(package)
    if cls is None:
        base = importlib.import_module(package).Callback
        cls = _CLASSES[package] = type("TelemetrainCallback", (_LightningTelemetry, base), {
            "__module__": __name__,
            "__doc__": f"Training-lifecycle telemetry for a {package} Trainer (telemetrain.integrations.lightning).",
        })
    return cls


def _default_class() -> type:
    for package in PACKAGES:
        try:
            return callback_class(package)
        except ImportError:
            continue
    raise ImportError("TelemetrainCallback needs Lightning (lightning or pytorch_lightning, neither is installed): "
                      "pip install 'telemetrain[lightning]'")


def __getattr__(name: str) -> Any:
    if name == "TelemetrainCallback":
        return _default_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
