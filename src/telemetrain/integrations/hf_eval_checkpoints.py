"""The evaluation, prediction and checkpoint hooks of ``hf``'s ``TelemetrainHFCallback`` (a private part of that
module; it imports no integration): what the Trainer gives no start hook for, written when it ends with explicit
times -- an evaluation or prediction as a loop with an iteration per batch, from the batch ends kept; a checkpoint
save from the last hook before it to ``on_save``; a resumed ``train()``'s load up to ``on_train_begin``."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..spans import Span
from ..telemetry import Telemetry
from ..training.names import S
from ..training.recorder import TrainingRecorder

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

_mono = time.monotonic_ns
CHECKPOINT_PREFIX = "checkpoint"  # transformers' PREFIX_CHECKPOINT_DIR: <output_dir>/checkpoint-<global_step>


class HFEvalCheckpointHooks:
    """``on_prediction_step``, ``on_evaluate``, ``on_predict``, ``on_save`` and a resume's load (a part of the
    callback, which sets these fields in ``__init__`` and calls ``_flush_eval`` and ``_record_load``)."""

    recorder: TrainingRecorder
    telemetry: Telemetry
    metrics_group: str
    _loop: Span | None
    _origin_ns: int
    _boundary_ns: int
    _last_hook_ns: int
    _eval_start_ns: int
    _eval_ends: list[int]
    _eval_untimed: int
    _save_due: int
    _eval_due: bool

    if TYPE_CHECKING:  # (the callback's)
        def _failed(self, hook: str, exc: BaseException) -> None: ...

        def _ms(self, mono_ns: int) -> float | None: ...

    # -- evaluation and prediction ---------------------------------------------------------------------------------

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           **kwargs: Any) -> None:
        now = _mono()
        if not self._eval_ends and not self._eval_start_ns:
            if self._boundary_ns:
                self._eval_start_ns = self._boundary_ns
            else:  # a stand-alone evaluate(): no hook before its first batch
                self._eval_start_ns = now
                self._eval_untimed += 1
                return
        self._eval_ends.append(now)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    metrics: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self._eval_due = False
        try:
            self._flush_eval(S.VALIDATION_LOOP, force=True)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_evaluate", exc)
        if self._loop is not None:
            self._boundary_ns = self._last_hook_ns = _mono()

    def on_predict(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                   metrics: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        try:
            self._flush_eval(S.TESTING_LOOP, force=True)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_predict", exc)
        if self._loop is not None:
            self._boundary_ns = self._last_hook_ns = _mono()

    def _flush_eval(self, loop: str, *, force: bool = False, error: str = "", finish_ns: int = 0) -> None:
        """Write the evaluation (or prediction) whose batches were kept: the loop, each batch an iteration."""
        ends, self._eval_ends = self._eval_ends, []
        start, self._eval_start_ns = self._eval_start_ns or self._boundary_ns, 0
        untimed, self._eval_untimed = self._eval_untimed, 0
        if not (ends or untimed or force):
            return
        r = self.recorder
        validation = loop == S.VALIDATION_LOOP
        s = (r.on_validation_start if validation else r.on_testing_start)(self._ms(start))
        if s is not None and untimed:
            s.set_attribute("untimed_iterations", untimed)
        begin, end = ((r.on_validation_single_iteration_start, r.on_validation_single_iteration_end) if validation
                      else (r.on_testing_single_iteration_start, r.on_testing_single_iteration_end))
        previous = start
        for t in ends:
            begin(self._ms(previous))
            end(self._ms(t))
            previous = t
        if s is not None and error:
            s.set_status("error", error)
        (r.on_validation_end if validation else r.on_testing_end)(self._ms(finish_ns))

    # -- checkpoints -----------------------------------------------------------------------------------------------

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        now = _mono()
        self._save_due = -1
        try:
            step = state.global_step
            found = _checkpoint_dir(args, step)
            r = self.recorder
            r.on_save_checkpoint_start(step, self._ms(self._boundary_ns or now))
            r.on_save_checkpoint_success(step, self._ms(now), path=found)
            r.on_save_checkpoint_end(self._ms(now), path=found)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_save", exc)
        if self._loop is not None:
            self._boundary_ns = self._last_hook_ns = _mono()

    def _record_load(self, args: TrainingArguments, state: TrainerState, now: int) -> None:
        """A resumed train(): a checkpoint_load span up to now, when its start is known (``hf``'s module doc)."""
        found = _checkpoint_dir(args, state.global_step)
        if not self._origin_ns:
            self.telemetry.event("checkpoint_resumed", {"global_step": state.global_step,
                                                         "checkpoint_directory": found or ""}, group=self.metrics_group)
            return
        s = self.recorder.on_load_checkpoint_start(self._ms(self._origin_ns))
        if s is not None:
            s.set_attribute("includes_setup", True)
            s.set_attribute("global_step", state.global_step)
        self.recorder.on_load_checkpoint_end(self._ms(now), path=found)


def _checkpoint_dir(args: TrainingArguments, global_step: int) -> str | None:
    """The Trainer's checkpoint folder for ``global_step``, if it is there (a hyperparameter search's trials save
    under a run folder of their own: not found, so no path and no size)."""
    if not args.output_dir:
        return None
    path = os.path.join(args.output_dir, f"{CHECKPOINT_PREFIX}-{global_step}")
    return path if os.path.isdir(path) else None
