"""The checkpoint hooks of ``lightning``'s ``TelemetrainCallback`` (a private part of that module; it imports no
integration): a save from ``on_save_checkpoint`` to its outcome -- a synchronous save succeeds at the next hook the
callback gets, an ``AsyncCheckpointIO`` save once its background write has finished (a marker task queued behind it
on the plugin's writer thread; without one, at ``on_fit_end``) -- and a load timed from the last hook before the
restore to ``on_load_checkpoint``."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from ..spans import Span
from ..training.recorder import TrainingRecorder


class _PendingSave:
    """A checkpoint save between ``on_save_checkpoint`` and its outcome."""

    __slots__ = ("async_io", "span", "start_wall", "step")

    def __init__(self, step: int, span: Span | None, async_io: Any) -> None:
        self.step = step
        self.span = span
        self.async_io = async_io  # the AsyncCheckpointIO writing it, None for a synchronous save
        self.start_wall = time.time()


class LightningCheckpointHooks:
    """``on_save_checkpoint``, ``on_load_checkpoint`` and the settling of saves (a part of the callback, whose other
    hooks call ``_settle_save``, ``_settle_async_waiting`` and ``_check_load``)."""

    _save: _PendingSave | None  # a save waiting for its outcome
    _async_waiting: list[_PendingSave]  # handed to an AsyncCheckpointIO without a writer thread
    _load_from_ms: float | None  # the last hook before a checkpoint restore (wall ms)
    _load_done: bool

    if TYPE_CHECKING:  # (the callback's)
        @property
        def recorder(self) -> TrainingRecorder: ...

        def _failed(self, hook: str, exc: BaseException) -> None: ...

    def _reset_checkpoints(self) -> None:
        self._save = None
        self._async_waiting = []
        self._load_from_ms = None
        self._load_done = False


    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        try:
            self._settle_save(trainer)  # a previous save returned: this is the next one
            io = getattr(trainer.strategy, "checkpoint_io", None)
            async_io = io if _is_async_io(io) else None
            step = int(trainer.global_step)
            span = self.recorder.on_save_checkpoint_start(step)
            self._save = _PendingSave(step, span, async_io)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_save_checkpoint", exc)

    def _settle_save(self, trainer: Any) -> None:
        """A hook after ``on_save_checkpoint``: ``Trainer.save_checkpoint`` has returned. A synchronous save has
        succeeded; an async one has been handed to its writer thread (its span ends, its success comes later)."""
        save = self._save
        if save is None:
            return
        self._save = None
        path = _saved_path(trainer, save)
        recorder = self.recorder
        if save.async_io is None:
            recorder.on_save_checkpoint_success(save.step, path=path)
            recorder.on_save_checkpoint_end(path=path)
            return
        recorder.on_save_checkpoint_end()
        submit = getattr(getattr(save.async_io, "_executor", None), "submit", None)
        if callable(submit):  # one writer thread, first in first out: this runs once the save is written
            submit(self._async_written, save, path)
        else:
            self._async_waiting.append(save)

    def _async_written(self, save: _PendingSave, path: str | None) -> None:
        """In the AsyncCheckpointIO's writer thread, after the save: a success unless the write failed."""
        try:
            if getattr(save.async_io, "_error", None) is None:
                written = path if path is not None and os.path.exists(path) else None
                self.recorder.on_save_checkpoint_success(save.step, path=written)
        except Exception as exc:  # noqa: BLE001
            self._failed("async checkpoint success", exc)

    def _settle_async_waiting(self, success: bool = True) -> None:
        waiting, self._async_waiting = self._async_waiting, []
        if success:
            for save in waiting:
                self.recorder.on_save_checkpoint_success(save.step)

    def _end_failed_save(self, save: _PendingSave, error: str) -> None:
        if save.span is not None and not save.span.ended:
            save.span.set_status("error", error)
            self.recorder.on_save_checkpoint_end()

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        try:
            self._check_load(trainer)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_load_checkpoint", exc)

    def _check_load(self, trainer: Any) -> None:
        """After a restore (``trainer.ckpt_path`` is the checkpoint this call loaded): its span, once."""
        if self._load_done or self._load_from_ms is None:
            return
        path = trainer.ckpt_path
        if path is None:
            return
        self._load_done = True
        recorder = self.recorder
        recorder.on_load_checkpoint_start(self._load_from_ms)
        local = os.fspath(path) if isinstance(path, (str, os.PathLike)) and os.path.exists(path) else None
        recorder.on_load_checkpoint_end(path=local)


# -- Trainer facts ---------------------------------------------------------------------------------------------------


def _is_async_io(io: Any) -> bool:
    """An ``AsyncCheckpointIO`` (by class name: it is the same class under both package names)."""
    return any(cls.__name__ == "AsyncCheckpointIO" for cls in type(io).__mro__)


def _saved_path(trainer: Any, save: _PendingSave) -> str | None:
    """The file a ``ModelCheckpoint`` has just written, for the success event's size and directory (best effort: its
    last saved path and step, read after ``Trainer.save_checkpoint`` returned; a synchronous save's file must also
    have been modified since the save began). None when no checkpoint callback saved at that step (a manual
    ``trainer.save_checkpoint``)."""
    newest: tuple[float, str] | None = None
    for cb in getattr(trainer, "checkpoint_callbacks", None) or ():
        path = getattr(cb, "_last_checkpoint_saved", None)
        if not isinstance(path, str) or not path or getattr(cb, "_last_global_step_saved", None) != save.step:
            continue
        if save.async_io is not None:
            return path  # still being written: checked when it is
        try:
            mtime = os.path.getmtime(path)
        except OSError:
            continue
        if mtime >= save.start_wall - 1.0 and (newest is None or mtime > newest[0]):  # (1 s: coarse file clocks)
            newest = (mtime, path)
    return newest[1] if newest else None
