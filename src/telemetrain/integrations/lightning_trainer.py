"""Lightning, one-logger style: a ``Trainer`` subclass that adds ``TelemetrainCallback`` to its callbacks (one-logger's
``OneLoggerPTLTrainer``; nothing is monkey-patched, so Lightning's own ``Trainer`` stays untouched).

    from telemetrain.integrations.lightning_trainer import OneLoggerPTLTrainer
    trainer = OneLoggerPTLTrainer(trainer_config={"max_epochs": 3}, training_telemetry_provider=provider)
    trainer.fit(model, datamodule=dm)
    on_app_end()  # as with one-logger: the application span ends when the program says so

With a configured ``TrainingTelemetryProvider`` (given, or the process-wide one), the callback drives its
one-logger recorder: the exporters receive one-logger's spans and events, and telemetrain's recorder records the run
(as one-logger, the application span starts when the trainer is built and ends at ``on_app_end``). Without one,
the callback drives telemetrain's own recorder (an application span per ``fit``/``validate``/``test`` call).

What the callback does beyond one-logger's hook (docs/integrations.md): an iteration is an optimizer step (gradient
accumulation counted once), the sanity check is not a validation loop, checkpoint saves are timed from Lightning's
own hooks (synchronous and ``AsyncCheckpointIO``; a failed save never blocks the next one), ``on_exception`` ends
what is open with status error. ``save_checkpoint`` is therefore not wrapped (one-logger wraps it, without
try/finally, and retries a save that raised ``TypeError``).
"""

from __future__ import annotations

import importlib
from typing import Any

from ..training.one_logger_provider import OneLoggerProvider
from ..training.singleton import SingletonMeta
from ..training.training_telemetry_provider import TrainingTelemetryProvider
from .lightning import PACKAGES, callback_class

__all__ = ["OneLoggerPTLTrainer", "TelemetrainTrainer", "hook_trainer_cls", "trainer_class"]

TelemetrainTrainer: type  # (declared only: made on first access by __getattr__, on the installed package)
OneLoggerPTLTrainer: type


class _TelemetryTrainerMixin:
    """The constructor and the callback property (``trainer_class`` puts a ``Trainer`` under it)."""

    _telemetry_package = PACKAGES[0]

    def __init__(self, trainer_config: dict[str, Any] | None = None,
                 training_telemetry_provider: TrainingTelemetryProvider | None = None, *,
                 telemetry_callback: Any = None, **trainer_kwargs: Any) -> None:
        """``trainer_config``: the ``Trainer``'s keyword arguments (one-logger's form; ``**trainer_kwargs`` are
        merged in). ``training_telemetry_provider``: whose recorder the callback drives (default: the process-wide
        provider when it is configured, else telemetrain's own recorder). ``telemetry_callback``: a
        ``TelemetrainCallback`` of your own (for its options: ``phases=True``, config overrides)."""
        if trainer_config is not None and not isinstance(trainer_config, dict):
            raise TypeError(f"trainer_config must be a dict of Trainer arguments, got {type(trainer_config).__name__}")
        if training_telemetry_provider is not None and not isinstance(training_telemetry_provider,
                                                                          TrainingTelemetryProvider):
            raise TypeError("training_telemetry_provider must be a TrainingTelemetryProvider, got "
                            f"{type(training_telemetry_provider).__name__}")
        config = {**(trainer_config or {}), **trainer_kwargs}
        callbacks = config.pop("callbacks", None)
        if callbacks is None:
            callbacks = []
        elif not isinstance(callbacks, (list, tuple)):
            callbacks = [callbacks]  # Lightning accepts a single callback too
        cls = callback_class(self._telemetry_package)
        if telemetry_callback is None:
            telemetry_callback = _make_callback(self._telemetry_package, training_telemetry_provider)
        elif not isinstance(telemetry_callback, cls):
            raise TypeError(f"telemetry_callback must be a TelemetrainCallback for {self._telemetry_package}, got "
                            f"{type(telemetry_callback).__name__}")
        self._telemetry_callback = telemetry_callback
        super().__init__(callbacks=[telemetry_callback, *callbacks], **config)  # type: ignore[call-arg]

    @property
    def telemetry_callback(self) -> Any:
        """The ``TelemetrainCallback`` this trainer added (first in its callbacks)."""
        return self._telemetry_callback

    @property
    def nv_one_logger_callback(self) -> Any:
        """one-logger's name for ``telemetry_callback``."""
        return self._telemetry_callback


def _make_callback(package: str, provider: TrainingTelemetryProvider | None) -> Any:
    """The callback a trainer adds: driving the provider's one-logger callbacks (the application started now, as
    one-logger's ``TimeEventCallback(call_on_app_start=True)``), else telemetrain's own recorder."""
    cls = callback_class(package)
    target = _one_logger_target(provider)
    if target is None:
        return cls()
    if target.recorder._get_active_span("application") is None:
        target.on_app_start()
    return cls(recorder=target, application=False)


def hook_trainer_cls(cls: type, training_telemetry_provider: TrainingTelemetryProvider | None = None,
                     telemetry_callback: Any = None) -> tuple[type, Any]:
    """one-logger's ``hook_trainer_cls(Trainer, provider)``, without patching ``cls``: a subclass of it whose
    instances (built with the ``Trainer``'s keyword arguments) have ``telemetry_callback`` first in their callbacks
    and as ``nv_one_logger_callback``, and that callback (made here when not given, one for every instance, as in
    one-logger). Checkpoint saves are timed from Lightning's hooks, so ``save_checkpoint`` is not wrapped."""
    package = next((p for p in PACKAGES if _is_trainer_class(cls, p)), None)
    if package is None:
        raise TypeError(f"cls must be a Lightning Trainer class ({' or '.join(PACKAGES)}), got {cls!r}")
    if training_telemetry_provider is not None and not isinstance(training_telemetry_provider,
                                                                      TrainingTelemetryProvider):
        raise TypeError("training_telemetry_provider must be a TrainingTelemetryProvider, got "
                        f"{type(training_telemetry_provider).__name__}")
    callback = telemetry_callback if telemetry_callback is not None \
        else _make_callback(package, training_telemetry_provider)

    def __init__(self: Any, **trainer_kwargs: Any) -> None:
        _TelemetryTrainerMixin.__init__(self, telemetry_callback=callback, **trainer_kwargs)

    hooked = type(cls.__name__, (_TelemetryTrainerMixin, cls), {
        "__module__": __name__, "__qualname__": cls.__qualname__, "__init__": __init__,
        "_telemetry_package": package,
        "__doc__": f"{cls.__qualname__} with telemetrain's callback first in its callbacks (hook_trainer_cls).",
    })
    return hooked, callback


def _is_trainer_class(cls: Any, package: str) -> bool:
    try:
        trainer = importlib.import_module(package).Trainer
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, trainer)


def _one_logger_target(provider: TrainingTelemetryProvider | None) -> Any:
    """The one-logger callbacks to drive: the given provider's, or the configured process-wide one's, or None."""
    if provider is not None:
        return provider.callbacks
    process_wide = SingletonMeta._instances.get(OneLoggerProvider)
    return process_wide._callbacks if process_wide is not None else None


_CLASSES: dict[str, type] = {}


def trainer_class(package: str = PACKAGES[0]) -> type:
    """``TelemetrainTrainer`` on ``package``'s ``Trainer`` (``"lightning.pytorch"`` or ``"pytorch_lightning"``)."""
    if package not in PACKAGES:
        raise ValueError(f"package must be one of {', '.join(PACKAGES)}, got {package!r}")
    cls = _CLASSES.get(package)
    if cls is None:
        base = importlib.import_module(package).Trainer
        cls = _CLASSES[package] = type("TelemetrainTrainer", (_TelemetryTrainerMixin, base), {
            "__module__": __name__,
            "_telemetry_package": package,
            "__doc__": f"A {package} Trainer with TelemetrainCallback first in its callbacks "
                       "(telemetrain.integrations.lightning_trainer).",
        })
    return cls


def _default_class() -> type:
    for package in PACKAGES:
        try:
            return trainer_class(package)
        except ImportError:
            continue
    raise ImportError("TelemetrainTrainer needs Lightning: pip install lightning (or pytorch_lightning)")


def __getattr__(name: str) -> Any:
    if name in ("TelemetrainTrainer", "OneLoggerPTLTrainer"):
        return _default_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
