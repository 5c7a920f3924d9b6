"""Hugging Face ``transformers.Trainer`` -> the training lifecycle: ``TelemetrainHFCallback``, a ``TrainerCallback``
that drives a ``TrainingRecorder`` (one-logger's spans, events and derived metrics) from the Trainer's hooks.

    cb = TelemetrainHFCallback()
    trainer = Trainer(model, args, train_dataset=train, eval_dataset=val, callbacks=[cb])
    with cb.guard():              # optional: an exception ends the open spans with status error
        trainer.train()

The mapping (read from ``Trainer._inner_training_loop``/``_run_epoch``/``_maybe_log_save_evaluate``, transformers 5):

- ``train()`` is a ``training_loop`` (``on_train_begin`` .. ``on_train_end``) inside an ``application``;
  ``train_iterations_start`` is ``state.global_step``, so a resumed run starts at its checkpoint's step.
- An iteration is an optimizer step: ``on_step_begin`` (first micro-batch; the step's batches are already fetched)
  .. ``on_step_end`` (after ``optimizer.step``, the scheduler and ``zero_grad``). Micro-batches (``on_substep_end``
  and the step's last one) are counted: ``micro_batches``, a metric at each training log and an attribute of the
  loop span. A step counts a global batch of samples, or, when its micro-batches took fewer (the short last batch or
  accumulation step of an epoch), what they took (a forward pre-hook adds up their sizes); its tokens are the
  Trainer's ``num_input_tokens_seen`` when it keeps that count.
  ``on_pre_optimizer_step`` .. ``on_optimizer_step`` is the ``optimizer_update`` sub-phase.
- Evaluation and prediction have no start hook, only ``on_prediction_step`` after each batch and ``on_evaluate`` /
  ``on_predict`` at the end, which alone say which it was. Their batch times are kept and written as a
  ``validation_loop`` (evaluate) or ``testing_loop`` (predict) with explicit times at that end. Inside ``train()``
  the loop starts at the last hook before it (the step's end or its log); a stand-alone ``trainer.evaluate()``
  starts at the end of its first batch, which is not timed as an iteration (no hook precedes it).
- A checkpoint save: ``_save_checkpoint`` runs right after the last hook before it (``on_step_end``/
  ``on_epoch_end``, the log, the evaluation) and ``on_save`` right after it has written the checkpoint: the
  ``checkpoint_save_sync`` span is written at ``on_save``, from that last hook to now, then the success (with the
  ``checkpoint-<step>`` folder and its size) and the end.
- Resume: ``train(resume_from_checkpoint=...)`` loads before ``on_train_begin``, with no hook around the load. A
  ``state.global_step > 0`` at ``on_train_begin`` is a resume: a ``checkpoint_load`` span is written from the last
  known start (the ``guard()`` entry, or the Trainer's ``on_init_end``) to ``on_train_begin``: an upper bound, as
  it includes ``train()``'s set-up (data loader, optimizer, ``accelerate.prepare``); attribute ``includes_setup``.
- ``on_log``: every numeric value of ``logs`` (loss, learning_rate, grad_norm, eval_*, train_*) is a metric of
  group ``metrics_group`` (``"hf"``) at step ``state.global_step - 1``: the zero-based index of the optimizer step
  the value was logged after, the step the derived training metrics and Lightning's ``self.log`` use, so a loss and
  the throughput of the same window share a step (HF's own TensorBoard callback writes ``global_step``, one more);
  NaN and inf are stored as they are.
- Hyperparameters (``log_hyperparams=True``): at the first ``on_train_begin``, the ``TrainingArguments``
  (``args.to_dict()``) and the model's config (``model.config``, under ``model.``), as HF's own MLflow and W&B
  callbacks log them: a ``hyperparameters`` event (``telemetrain.hparams``): MLflow params, TensorBoard HParams.

Exceptions: the Trainer has no exception hook. ``guard()`` (a context manager around ``train()``, ``evaluate()``...)
ends what is open with status ``error`` and the exception: the optimizer span, the iteration (not counted: its step
did not complete), a pending evaluation, a save under way (a save was due and no evaluation before it), the training
loop (its final metrics reported first), and the application the callback opened; then the exception goes on.
Without ``guard()``, the next ``on_train_begin`` ends the previous call's open spans the same way, at the time of
the last hook seen; a process that exits first has them ended as ``terminated`` by its Telemetry's close.
(``sys.excepthook`` and ``atexit`` are process-wide and see an exception only if nothing catches it: a job that
catches it and retries would leave its spans open.)

Config: a given ``TrainingTelemetryConfig`` is used as is; else it is derived at each ``on_train_begin``:
``global_batch_size`` = train batch per device x gradient accumulation x ``world_size``; ``micro_batch_size`` and
``seq_length`` from the first batch's main input (``input_ids``: the forward pre-hook on the model);
``log_every_n_train_iterations`` = ``state.logging_steps`` (with ``logging_strategy="epoch"``: the steps of an
epoch); ``train_iterations_target`` = ``state.max_steps``;
keyword arguments override any field (``flops_per_sample=...`` for TFLOP/s and MFU). Telemetry never breaks
training: a failure inside a hook is recorded as an ``error`` event (counted in ``failures``, warned once) and the
hook returns normally.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..extras import missing_extra

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:
    raise missing_extra("telemetrain.integrations.hf", "transformers", "hf", exc) from None

from ..dispatch import describe, warn_safely
from ..hparams import log_hyperparams
from ..span_lifecycle import describe_end
from ..spans import Span
from ..telemetry import Telemetry
from ..training.config import TrainingTelemetryConfig, config_overrides
from ..training.default import check_recorder_target, get_recorder
from ..training.names import S
from ..training.recorder import TrainingRecorder
from .hf_eval_checkpoints import CHECKPOINT_PREFIX as CHECKPOINT_PREFIX  # (still importable from here)
from .hf_eval_checkpoints import HFEvalCheckpointHooks

__all__ = ["TelemetrainHFCallback"]

_mono = time.monotonic_ns
GROUP = "training"


class TelemetrainHFCallback(HFEvalCheckpointHooks, TrainerCallback):  # (ours first: TrainerCallback's are no-ops)
    """A ``transformers.TrainerCallback`` recording the Trainer's lifecycle on a ``TrainingRecorder``.

    ``config``: the job's ``TrainingTelemetryConfig``, used as is; else it is derived from the Trainer's arguments
    and the first batch at each ``train()``, with ``overrides`` on top (config fields, with or without ``_or_fn``:
    ``flops_per_sample=6 * n_params * seq``, ``perf_tag="gpt2-small"``...). ``telemetry``/``recorder``: where to
    record (default: the recorder of the default ``Telemetry``, which ``training.application()`` and the other
    module-level context managers also use). ``metrics_group``: the group of the ``logs`` metrics.
    ``log_hyperparams``: record the Trainer's arguments and the model's config once, at the first ``train()``."""

    def __init__(
        self,
        config: TrainingTelemetryConfig | None = None,
        *,
        telemetry: Telemetry | None = None,
        recorder: TrainingRecorder | None = None,
        metrics_group: str = "hf",
        log_hyperparams: bool = True,
        **overrides: Any,
    ) -> None:
        self._overrides = config_overrides(config, overrides)
        check_recorder_target(recorder, telemetry)
        if not isinstance(metrics_group, str) or not metrics_group:
            raise TypeError(f"metrics_group must be a non-empty str, got {metrics_group!r}")
        self.recorder = recorder if recorder is not None else get_recorder(telemetry)
        self.telemetry = self.recorder.telemetry
        self.config = config
        self.metrics_group = metrics_group
        self._log_hyperparams = bool(log_hyperparams)
        self.failures = 0  # exceptions inside this callback's hooks (each also an error event; training goes on)
        self.micro_batches = 0  # micro-batches of the current (or last) train() call
        self.seq_length: int | None = None  # from the first batch's main input (input_ids)
        self.micro_batch_size: int | None = None
        self._app: Span | None = None  # the application span this callback opened
        self._loop: Span | None = None
        self._optimizer: Span | None = None
        self._guards = 0
        self._origin_ns = 0  # a known start of what precedes on_train_begin: the guard's entry, or on_init_end
        self._boundary_ns = 0  # the last hook inside train(): what runs next (evaluation, save) starts here; 0: none
        self._last_hook_ns = 0
        self._eval_start_ns = 0
        self._eval_ends: list[int] = []  # the end of each evaluation/prediction batch not yet written
        self._eval_untimed = 0
        self._hook: Any = None  # the model's forward pre-hook while train() runs: each micro-batch's size
        self._step_inputs = 0  # samples of this rank's micro-batches of the open step (-1: unknown)
        self._full_step = 0  # ... in a full step (the batch per device x accumulation)
        self._per_input = 1.0  # global samples per sample of this rank (the global batch / _full_step)
        self._tokens_seen: int | None = None  # state.num_input_tokens_seen at the last step's end (None: not kept)
        self._derived: TrainingTelemetryConfig | None = None  # the config derived at the last train()
        self._config_pending = False  # the derived config, with the first batch's shape, is to be set
        self._save_due = -1  # the global step of a save the Trainer is to make next (-1: none)
        self._eval_due = False  # an evaluation is to come before it

    # -- containment -----------------------------------------------------------------------------------------------

    def _failed(self, hook: str, exc: BaseException) -> None:
        self.failures += 1
        if self.failures == 1:
            warn_safely(f"telemetrain.integrations.hf: {hook} failed: {describe(exc)} (recorded as an error event; "
                        "later ones are not warned about)", stacklevel=3)
        try:
            self.telemetry.event("error", {"error_message": f"failed: {describe(exc)}", "callback": hook},
                                 severity="error", group=GROUP)
        except Exception:  # noqa: BLE001 - telemetry never breaks training
            pass

    def _ms(self, mono_ns: int) -> float | None:
        """A monotonic time as the recorder's ``*_time_msec`` (ms since the epoch); 0 (unknown): None, i.e. now."""
        return (mono_ns + self.telemetry.wall_offset_ns) / 1e6 if mono_ns else None

    # -- train() ---------------------------------------------------------------------------------------------------

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        if not self._origin_ns:
            self._origin_ns = _mono()

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        now = _mono()
        try:
            if self._loop is not None and not self._loop.ended:
                self._abort("the previous train() did not reach on_train_end (it raised?)", self._last_hook_ns)
            recorder = self.recorder
            config = self.config
            if config is None and (recorder.config is None or recorder.config is self._derived):
                # (a config the user set is left alone)
                config = self._derived = self._derive(args, state, kwargs.get("train_dataloader"))
            if config is not None:
                recorder.set_training_telemetry_config(config)
            self._start_app()
            if self._log_hyperparams:
                self._log_hyperparams = False
                self._record_hyperparameters(args, kwargs.get("model"))
            if state.global_step > 0:
                self._record_load(args, state, now)
            self._origin_ns = 0
            self.micro_batches = 0
            self._loop = recorder.on_train_start(state.global_step, None, state.max_steps or None)
            self._count_steps(args, state, kwargs.get("model"))
            self._boundary_ns = self._last_hook_ns = _mono()
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks training
            self._failed("on_train_begin", exc)

    def _record_hyperparameters(self, args: TrainingArguments, model: Any) -> None:
        to_dict_args: Any = args.to_dict  # (untyped in transformers)
        params: dict[str, Any] = dict(to_dict_args())
        config = getattr(model, "config", None)
        to_dict: Any = getattr(config, "to_dict", None)
        if callable(to_dict):
            params["model"] = to_dict()
        log_hyperparams(params, self.telemetry)

    def _start_app(self) -> None:
        """The application span, from the known origin, unless one is open (ours, or the user's own
        ``training.application()``)."""
        if self._app is not None and not self._app.ended:
            return
        self._app = None
        if self.recorder.open_span(S.APPLICATION) is None:
            self._app = self.recorder.on_app_start(self._ms(self._origin_ns))

    def _derive(self, args: TrainingArguments, state: TrainerState, loader: Any) -> TrainingTelemetryConfig:
        per_device = int(state.train_batch_size or args.train_batch_size)  # (x GPUs of a DataParallel)
        world = max(int(args.world_size), 1)
        accumulation = max(int(args.gradient_accumulation_steps), 1)
        fields: dict[str, Any] = {
            "global_batch_size_or_fn": per_device * accumulation * world,
            "micro_batch_size_or_fn": self.micro_batch_size,
            "seq_length_or_fn": self.seq_length,
            "train_iterations_target_or_fn": state.max_steps or None,
            "log_every_n_train_iterations": _log_every(args, state, loader, accumulation),
            "world_size_or_fn": world,
        }
        return TrainingTelemetryConfig(**{**fields, **self._overrides})

    def _set_batch_shape(self) -> None:
        """The derived config again, with the micro-batch size and sequence length of the first batch (one-logger's
        late config: a second ``update_training_telemetry_config``)."""
        derived = self._derived
        if derived is not None and self.recorder.config is derived:
            shape: dict[str, Any] = {"micro_batch_size_or_fn": self.micro_batch_size,
                                     "seq_length_or_fn": self.seq_length}
            for name in self._overrides:
                shape.pop(name, None)
            if shape:
                self._derived = dataclasses.replace(derived, **shape)
                self.recorder.set_training_telemetry_config(self._derived)

    def _count_steps(self, args: TrainingArguments, state: TrainerState, model: Any) -> None:
        """What each step's samples and tokens are counted from: the micro-batches' sizes, read by a forward
        pre-hook on the model, scaled as the global batch is to a full step (a short last batch or accumulation
        step of an epoch counts what it took, not a global batch); the tokens from the Trainer's own
        ``num_input_tokens_seen`` (all ranks), when it keeps it (``include_num_input_tokens_seen``)."""
        self._full_step = int(state.train_batch_size or args.train_batch_size) * max(
            int(args.gradient_accumulation_steps), 1)
        config = self.recorder.config
        given = config.global_batch_size_or_fn if config is not None else None
        self._per_input = given / self._full_step if type(given) is int and self._full_step else max(
            int(args.world_size), 1)
        self._step_inputs = 0
        kept = getattr(args, "include_num_input_tokens_seen", "no") not in ("no", False, None)
        self._tokens_seen = int(state.num_input_tokens_seen) if kept else None
        if self._hook is None and model is not None:
            self._hook = model.register_forward_pre_hook(self._read_batch, with_kwargs=True)

    def _read_batch(self, module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """The model's forward pre-hook while train() runs: the micro-batch's size (its main input's first
        dimension) is counted for the step; the first one's shape is also the micro-batch and the sequence length
        (padded). An evaluation batch (the model in eval mode: ``eval_on_start``) is passed over."""
        if not getattr(module, "training", True):
            return
        try:
            ids = kwargs.get(getattr(module, "main_input_name", None) or "input_ids")
            if ids is None and args:
                ids = args[0]
            shape = getattr(ids, "shape", None)
            if not shape or self._step_inputs < 0:
                self._step_inputs = -1  # (a batch without a size: the step counts a global batch)
                return
            self._step_inputs += int(shape[0])
            if self.seq_length is None and len(shape) >= 2:
                self.micro_batch_size, self.seq_length = int(shape[0]), int(shape[-1])
                self._config_pending = self._derived is not None  # set at this step's end, outside the forward
        except Exception as exc:  # noqa: BLE001 - inside the model's forward: telemetry never breaks training
            self._failed("forward pre-hook", exc)

    def _step_size(self, state: TrainerState) -> tuple[int | None, int | None]:
        """The samples and tokens of the step just ended, where they are not the defaults (a global batch, and
        samples x seq_length)."""
        inputs, self._step_inputs = self._step_inputs, 0
        samples = round(inputs * self._per_input) if 0 < inputs != self._full_step else None
        tokens = None
        if self._tokens_seen is not None:
            seen = int(state.num_input_tokens_seen)
            tokens, self._tokens_seen = max(seen - self._tokens_seen, 0), seen
        return samples, tokens

    def _remove_hook(self) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        try:
            self._remove_hook()
            self._flush_eval(S.VALIDATION_LOOP)  # (none: every evaluation ends with on_evaluate)
            if self._loop is not None and not self._loop.ended:
                self._loop.set_attribute("micro_batches", self.micro_batches)
                self.recorder.on_train_end()
            self._loop = None
            self._save_due, self._eval_due = -1, False
            if self._guards == 0:
                self._end_app()
            self._boundary_ns = 0
        except Exception as exc:  # noqa: BLE001
            self._failed("on_train_end", exc)

    def _end_app(self, status: str | None = None, error: str = "", finish_ns: int = 0) -> None:
        app, self._app = self._app, None
        if app is not None and not app.ended:
            if status is not None:
                app.set_status(status, error)
            self.recorder.on_app_end(self._ms(finish_ns))

    # -- steps: the hot path ---------------------------------------------------------------------------------------

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        try:
            self.recorder.on_training_single_iteration_start()
        except Exception as exc:  # noqa: BLE001
            self._failed("on_step_begin", exc)

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              **kwargs: Any) -> None:
        try:
            s = self._optimizer = self.recorder.optimizer_update()
            s.__enter__()
        except Exception as exc:  # noqa: BLE001
            self._optimizer = None
            self._failed("on_pre_optimizer_step", exc)

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          **kwargs: Any) -> None:
        s, self._optimizer = self._optimizer, None
        if s is not None:
            try:
                s.__exit__(None, None, None)
            except Exception as exc:  # noqa: BLE001
                self._failed("on_optimizer_step", exc)

    def on_substep_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self.micro_batches += 1

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self.micro_batches += 1
        try:
            samples, tokens = self._step_size(state)
            if (samples is None and tokens is None) or not isinstance(self.recorder, TrainingRecorder):
                self.recorder.on_training_single_iteration_end()  # (one-logger's callbacks take no sizes)
            else:
                self.recorder.on_training_single_iteration_end(samples=samples, tokens=tokens)
            if self._config_pending:
                self._config_pending = False
                self._set_batch_shape()
        except Exception as exc:  # noqa: BLE001
            self._failed("on_step_end", exc)
        self._due(state, control)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if self._loop is not None:
            self._due(state, control)

    def _due(self, state: TrainerState, control: TrainerControl) -> None:
        """After a step or an epoch the Trainer logs, evaluates and saves, as ``control`` says (the default flow
        callback, ahead of this one, has set it): what a failure before ``on_save`` leaves unsaved."""
        self._save_due = state.global_step if control.should_save else -1
        self._eval_due = control.should_evaluate
        self._boundary_ns = self._last_hook_ns = _mono()

    # -- logs ------------------------------------------------------------------------------------------------------

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        try:
            # the zero-based index of the step just taken: the derived metrics' (and Lightning's) step
            metric, group, step = self.telemetry.metric, self.metrics_group, max(state.global_step - 1, 0)
            for name, value in (logs or {}).items():
                if type(value) is float or (type(value) is int):
                    metric(name, value, group, step=step)
                elif not isinstance(value, bool) and isinstance(value, (int, float)):
                    metric(name, float(value), group, step=step)
            if logs and "loss" in logs and self._loop is not None:
                metric("micro_batches", self.micro_batches, group, step=step)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_log", exc)
        if self._loop is not None and not self._eval_ends:
            self._boundary_ns = self._last_hook_ns = _mono()

    # (evaluation, prediction, checkpoint saves and a resume's load: hf_eval_checkpoints.HFEvalCheckpointHooks)

    # -- exceptions ------------------------------------------------------------------------------------------------

    @contextmanager
    def guard(self) -> Iterator[TelemetrainHFCallback]:
        """Around ``trainer.train()`` (and ``evaluate()``...): an exception ends what is open with status error and
        goes on. The application starts at the entry (if none is open) and ends at the exit."""
        self._guards += 1
        if self._guards == 1:
            self._origin_ns = self._origin_ns or _mono()
            try:
                self._start_app()
            except Exception as exc:  # noqa: BLE001
                self._failed("guard", exc)
        try:
            yield self
        except BaseException as exc:
            try:
                self._abort(describe_end(exc), 0)
            except Exception as inner:  # noqa: BLE001
                self._failed("guard", inner)
            raise
        finally:
            self._guards -= 1
            if self._guards == 0:
                self._origin_ns = 0
                try:
                    self._end_app()
                except Exception as exc:  # noqa: BLE001
                    self._failed("guard", exc)

    def _abort(self, error: str, finish_ns: int) -> None:
        """End what is open with status error, at ``finish_ns`` (0: now): the optimizer span, the iteration (not
        counted), an evaluation under way, the training loop (its last metrics reported), the application."""
        self._remove_hook()
        opt, self._optimizer = self._optimizer, None
        if opt is not None and not opt.ended:
            opt.set_status("error", error)
            opt.__exit__(None, None, None, finish_ns or None)
        recorder = self.recorder
        recorder.abandon_iteration(error, end_ns=finish_ns or None)
        if self._eval_ends or self._eval_start_ns or self._eval_untimed:
            self._flush_eval(S.VALIDATION_LOOP, error=error, finish_ns=finish_ns)
        elif self._save_due >= 0 and not self._eval_due and self._boundary_ns:
            # the failure came after the last hook before a save, with no evaluation due: in the save
            s = recorder.on_save_checkpoint_start(self._save_due, self._ms(self._boundary_ns))
            if s is not None:
                s.set_status("error", error)
            recorder.on_save_checkpoint_end(self._ms(finish_ns))  # (no success: the recorder reports it failed)
        self._save_due, self._eval_due = -1, False
        loop, self._loop = self._loop, None
        if loop is not None and not loop.ended:
            loop.set_status("error", error)
            loop.set_attribute("micro_batches", self.micro_batches)
            recorder.on_train_end(self._ms(finish_ns))
        self._boundary_ns = 0
        self._end_app("error", error, finish_ns)


def _log_every(args: TrainingArguments, state: TrainerState, loader: Any, accumulation: int) -> int:
    """The Trainer's logging interval in optimizer steps: ``state.logging_steps`` (a ratio already made absolute),
    or with ``logging_strategy="epoch"`` the steps of an epoch, as the Trainer counts them (a short last step
    included), so the derived metrics are reported with the Trainer's logs."""
    if getattr(args.logging_strategy, "value", args.logging_strategy) == "epoch":
        try:
            batches = len(loader)
        except TypeError:  # (no loader, or one without a length: the interval below)
            batches = 0
        if batches > 0:
            return max(-(-batches // accumulation), 1)
    return max(int(state.logging_steps or 50), 1)
