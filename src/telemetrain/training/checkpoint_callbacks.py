"""The checkpoint callbacks of ``TrainingRecorder``: save (sync or async, per the config's strategy) and load spans,
the productive work a save will hold (snapshotted at its start, reported at its success), a sync save that ends
without success counted as failed, save/load times and sizes."""

from __future__ import annotations

import os
from typing import Any

from ..spans import Span
from .checkpoint_stats import path_bytes
from .config import CheckpointStrategy
from .names import E, S
from .recorder_base import RecorderBase, _mono


class CheckpointCallbacks(RecorderBase):
    """``on_save_checkpoint_*`` and ``on_load_checkpoint_*`` (a part of ``TrainingRecorder``)."""

    def on_load_checkpoint_start(self, start_time_msec: float | None = None) -> Span | None:
        with self._lock:
            return self._start("on_load_checkpoint_start", S.CHECKPOINT_LOAD, start_time_msec,
                               parent=S.APPLICATION)

    def on_load_checkpoint_end(
        self, finish_time_msec: float | None = None, *, path: str | os.PathLike[str] | None = None
    ) -> None:
        """``path`` (ours): the checkpoint file or directory, for its size."""
        with self._lock:
            s = self._end("on_load_checkpoint_end", S.CHECKPOINT_LOAD, finish_time_msec)
            if s is not None:
                self._loads.add(s.duration_ns / 1e9, path_bytes(path))

    def _save_span_name(self) -> str:
        if self.config is not None and self.config.save_checkpoint_strategy == CheckpointStrategy.ASYNC:
            return S.CHECKPOINT_SAVE_ASYNC
        return S.CHECKPOINT_SAVE_SYNC

    def on_save_checkpoint_start(self, global_step: int, start_time_msec: float | None = None) -> Span | None:
        if isinstance(global_step, bool) or not isinstance(global_step, int):
            raise TypeError(f"global_step must be an int, got {type(global_step).__name__}")
        with self._lock:
            self._save_attempts += 1
            self._save_succeeded = False
            name = self._save_span_name()
            attributes = {
                "checkpoint_strategy": (name == S.CHECKPOINT_SAVE_ASYNC and "async") or "sync",
                "current_iteration": global_step,
                "save_checkpoint_attempt_count": self._save_attempts,
            }
            s = self._start("on_save_checkpoint_start", name, start_time_msec, attributes, parent=self._outer())
            # what this checkpoint will hold once it is saved: the productive work up to now, the samples as the
            # iterations counted them (TrainingRecorder.iteration_size: not steps x the batch size of this moment)
            config = self.config
            fps = self._guarded("flops_per_sample", lambda: config.flops_per_sample) if config is not None else None
            samples = self._samples_start + self._samples
            self._snapshots[global_step] = {
                "productive_train_iterations": self._iterations_start + self._iterations,
                "productive_train_samples": samples,
                "productive_train_iterations_sec": self._iteration_total_sec,
                "productive_validation_iterations_sec": self._validation_total_sec,
                **({"productive_train_tflops": samples * fps / 1e12} if fps and samples else {}),
            }
            return s

    def on_save_checkpoint_success(
        self, global_step: int, time_msec: float | None = None, *, path: str | os.PathLike[str] | None = None
    ) -> None:
        """``path`` (ours): the checkpoint file or directory saved, for its size and directory."""
        with self._lock:
            self._save_succeeded = True
            snapshot = self._snapshots.pop(global_step, None)
            if snapshot is None:
                self._misuse("on_save_checkpoint_success", "no on_save_checkpoint_start for this step: the productive "
                             "figures are not known and are left out", global_step=global_step)
                snapshot = {}
            for step in [s for s in self._snapshots if s < global_step]:  # older saves that never succeeded
                del self._snapshots[step]
            self._save_successes += 1
            now_wall = ((self._mono_of(time_msec) or _mono()) + self.telemetry.wall_offset_ns) / 1e9
            if self._first_success_wall is None:
                self._first_success_wall = now_wall
            self._latest_success_wall = now_wall
            attributes: dict[str, Any] = {
                "checkpoint_strategy": "async" if self._save_span_name() == S.CHECKPOINT_SAVE_ASYNC else "sync",
                "current_iteration": global_step,
                "first_successful_save_checkpoint_timestamp_sec": self._first_success_wall,
                "latest_successful_save_checkpoint_timestamp_sec": self._latest_success_wall,
                "save_checkpoint_success_count": self._save_successes,
                **snapshot,
            }
            if self._loop_start_ns:
                attributes["training_start_timestamp_sec"] = (self._loop_start_ns + self.telemetry.wall_offset_ns) / 1e9
            if path is not None:
                attributes["checkpoint_directory"] = os.fspath(path)
                size = path_bytes(path)
                if size is not None:
                    attributes["checkpoint_size"] = size
            on = self._save_span_name() if self._save_span_name() in self._spans else S.TRAINING_LOOP
            self._event(E.SAVE_CHECKPOINT_SUCCESS, attributes, on)

    def on_save_checkpoint_end(
        self, finish_time_msec: float | None = None, *, path: str | os.PathLike[str] | None = None
    ) -> None:
        """``path`` (ours): the checkpoint file or directory, for its size (also given to the success event)."""
        with self._lock:
            name = self._save_span_name()
            s = self._spans.get(name)
            size = path_bytes(path)
            if s is not None and name == S.CHECKPOINT_SAVE_SYNC and not self._save_succeeded:
                # a sync save that ends without success failed (async ones succeed later, when finalised)
                self._misuse("on_save_checkpoint_end", "the checkpoint save ended without on_save_checkpoint_success: "
                             "it failed, and what it would have held is not productive", span=name)
                if s.status == "ok":
                    s.set_status("error", "no on_save_checkpoint_success")
            if s is not None:
                end_ns = self._mono_of(finish_time_msec) or _mono()
                self._saves.add((end_ns - s.start_ns) / 1e9, size)
                attributes: dict[str, Any] = {
                    "save_checkpoint_sync_time_total_sec": self._saves.total,
                    "save_checkpoint_sync_time_min_sec": self._saves.min,
                    "save_checkpoint_sync_time_max_sec": self._saves.max,
                    **self._saves.as_attributes("save_checkpoint"),
                }
                if size is not None:
                    attributes["checkpoint_size"] = size
                self._event(E.SYNC_CHECKPOINT_METRICS_UPDATE, attributes, name)
            self._end("on_save_checkpoint_end", name, finish_time_msec)
