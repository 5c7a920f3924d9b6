"""The validation, test and predict hooks of ``lightning``'s ``TelemetrainCallback`` (a private part of that module;
it imports no integration): ``validation_loop`` and ``testing_loop`` with an iteration per batch (the sanity check left
out), a pending save settled and a checkpoint load checked as each loop starts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..spans import Span
from ..training.recorder import TrainingRecorder


class LightningEvalLoopHooks:
    """The validation, test and predict hooks (a part of the callback, which resets ``_eval`` and ends the spans it
    holds on an exception)."""

    _eval: dict[str, Span | None]  # open validation/testing loop and iteration spans, by name

    if TYPE_CHECKING:  # (the callback's and its checkpoint hooks')
        @property
        def recorder(self) -> TrainingRecorder: ...

        def _failed(self, hook: str, exc: BaseException) -> None: ...

        def _settle_save(self, trainer: Any) -> None: ...

        def _check_load(self, trainer: Any) -> None: ...

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            self._check_load(trainer)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_sanity_check_start", exc)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            if trainer.sanity_checking:
                return
            self._settle_save(trainer)
            self._check_load(trainer)
            self._eval["validation_loop"] = self.recorder.on_validation_start()
        except Exception as exc:  # noqa: BLE001
            self._failed("on_validation_start", exc)

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        try:
            if trainer.sanity_checking:
                return
            self._eval["validation_single_iteration"] = self.recorder.on_validation_single_iteration_start()
        except Exception as exc:  # noqa: BLE001
            self._failed("on_validation_batch_start", exc)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        try:
            if trainer.sanity_checking:
                return
            if self._eval.pop("validation_single_iteration", False) is not False:
                self.recorder.on_validation_single_iteration_end()
        except Exception as exc:  # noqa: BLE001
            self._failed("on_validation_batch_end", exc)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        try:
            if trainer.sanity_checking:
                return
            self._settle_save(trainer)
            if self._eval.pop("validation_loop", False) is not False:
                self.recorder.on_validation_end()
        except Exception as exc:  # noqa: BLE001
            self._failed("on_validation_end", exc)

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            self._check_load(trainer)
            self._eval["testing_loop"] = self.recorder.on_testing_start()
        except Exception as exc:  # noqa: BLE001
            self._failed("on_test_start", exc)

    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        try:
            self._eval["testing_single_iteration"] = self.recorder.on_testing_single_iteration_start()
        except Exception as exc:  # noqa: BLE001
            self._failed("on_test_batch_start", exc)

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        try:
            if self._eval.pop("testing_single_iteration", False) is not False:
                self.recorder.on_testing_single_iteration_end()
        except Exception as exc:  # noqa: BLE001
            self._failed("on_test_batch_end", exc)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        try:
            if self._eval.pop("testing_loop", False) is not False:
                self.recorder.on_testing_end()
        except Exception as exc:  # noqa: BLE001
            self._failed("on_test_end", exc)

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            self._check_load(trainer)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_predict_start", exc)
