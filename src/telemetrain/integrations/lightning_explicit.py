"""The callback's explicit calls: one-logger's Lightning callback (``trainer.nv_one_logger_callback``) has methods
for what Lightning's hooks do not see -- the application's end, model, data loader and optimizer initialisation,
checkpoint loads and testing -- and its README calls them (``on_optimizer_init_start()`` inside
``configure_optimizers``, ``on_app_end()`` at the end). Each forwards to the recorder the callback drives, contained
as the hooks are (telemetry never breaks training)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..spans import Span

__all__ = ["LightningExplicitCalls"]


def _forward(name: str) -> Callable[..., Any]:
    def call(self: Any) -> Any:
        try:
            return getattr(self.recorder, name)()
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks training
            self._failed(name, exc)
            return None

    call.__name__ = name
    call.__doc__ = f"one-logger's ``{name}()``: the recorder's, now."
    return call


class LightningExplicitCalls:
    """one-logger's explicit callback methods on ``TelemetrainCallback`` (a part of it)."""

    _application: bool
    _app: Span | None

    if TYPE_CHECKING:  # (the callback's)
        @property
        def recorder(self) -> Any: ...

        def _failed(self, hook: str, exc: BaseException) -> None: ...

    on_model_init_start = _forward("on_model_init_start")
    on_model_init_end = _forward("on_model_init_end")
    on_dataloader_init_start = _forward("on_dataloader_init_start")
    on_dataloader_init_end = _forward("on_dataloader_init_end")
    on_optimizer_init_start = _forward("on_optimizer_init_start")
    on_optimizer_init_end = _forward("on_optimizer_init_end")
    on_load_checkpoint_start = _forward("on_load_checkpoint_start")
    on_load_checkpoint_end = _forward("on_load_checkpoint_end")
    on_testing_start = _forward("on_testing_start")
    on_testing_end = _forward("on_testing_end")

    def on_app_end(self) -> None:
        """End the application. Where this callback starts and ends an application span per Trainer call itself (no
        one-logger provider), it ends the open one, if any: after ``fit`` there is none, and nothing is recorded."""
        try:
            if self._application:
                if self._app is None:
                    return
                self._app = None
            self.recorder.on_app_end()
        except Exception as exc:  # noqa: BLE001
            self._failed("on_app_end", exc)
