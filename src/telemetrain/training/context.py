"""one-logger's context managers (and decorators) over a ``TrainingRecorder`` (the module-level ones: over the
configured one-logger provider when there is one, see ``callbacks``): each calls the start callback, then the end
callback even when the body raises (one-logger's do too, but never record the exception: ours end telemetrain's span
with status ``error``, the exception's type and message; the one-logger exporters see what one-logger's would)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ContextDecorator, contextmanager
from typing import Any, Protocol

from ..dispatch import describe
from ..span_lifecycle import describe_end
from ..spans import Span
from .checkpoint import CheckPointStrategy
from .default import get_target
from .names import S
from .recorder import TrainingRecorder

__all__ = ["TrainingContexts"]


class _Phases(Protocol):
    """What the phase context managers need of a recorder (ours, or one a one-logger recorder drives)."""

    def data_loading(self) -> AbstractContextManager[Any]: ...
    def forward(self) -> AbstractContextManager[Any]: ...
    def backward(self) -> AbstractContextManager[Any]: ...
    def optimizer_update(self) -> AbstractContextManager[Any]: ...
    def zero_grad(self) -> AbstractContextManager[Any]: ...


class TrainingContexts:
    """The context managers of one recorder (``training.application()`` etc. use the default one)."""

    def __init__(self, recorder: Callable[[], Any]) -> None:
        self._recorder = recorder
        self._phases: Callable[[], _Phases] = recorder  # the same, as the phases' typed view of it

    def _pair(self, start: str, end: str, name: str, *args: Any, **end_kwargs: Any) -> _Pair:
        return _Pair(self._recorder, start, end, name, args, end_kwargs)

    def application(self) -> _Pair:
        return self._pair("on_app_start", "on_app_end", S.APPLICATION)

    def distributed_init(self) -> _Pair:
        return self._pair("on_distributed_init_start", "on_distributed_init_end", S.DIST_INIT)

    def model_init(self) -> _Pair:
        return self._pair("on_model_init_start", "on_model_init_end", S.MODEL_INIT)

    def dataloader_init(self) -> _Pair:
        return self._pair("on_dataloader_init_start", "on_dataloader_init_end", S.DATA_LOADER_INIT)

    def optimizer_init(self) -> _Pair:
        return self._pair("on_optimizer_init_start", "on_optimizer_init_end", S.OPTIMIZER_INIT)

    def checkpoint_load(self, path: str | os.PathLike[str] | None = None) -> _Pair:
        return self._pair("on_load_checkpoint_start", "on_load_checkpoint_end", S.CHECKPOINT_LOAD, path=path)

    def training_loop(
        self,
        train_iterations_start: int,
        train_samples_start: int | None = None,
        train_iterations_target_or_fn: Any = None,
        train_samples_target_or_fn: Any = None,
    ) -> _Pair:
        return self._pair("on_train_start", "on_train_end", S.TRAINING_LOOP, train_iterations_start,
                          train_samples_start, train_iterations_target_or_fn, train_samples_target_or_fn)

    def training_iteration(self) -> _Iteration:
        return _Iteration(self._recorder)

    def iteration_size(self, samples: int | None = None, tokens: int | None = None) -> None:
        """What the open training iteration processes (``TrainingRecorder.iteration_size``): a short last batch, a
        batch size that changes, packed sequences; call it inside ``training_iteration()``."""
        _telemetrain_recorder(self._recorder()).iteration_size(samples, tokens)

    def validation_loop(self) -> _Pair:
        return self._pair("on_validation_start", "on_validation_end", S.VALIDATION_LOOP)

    def validation_iteration(self) -> _Pair:
        return self._pair("on_validation_single_iteration_start", "on_validation_single_iteration_end",
                          S.VALIDATION_SINGLE_ITERATION)

    def testing_loop(self) -> _Pair:
        return self._pair("on_testing_start", "on_testing_end", S.TESTING_LOOP)

    def testing_iteration(self) -> _Pair:
        return self._pair("on_testing_single_iteration_start", "on_testing_single_iteration_end",
                          S.TESTING_SINGLE_ITERATION)

    @contextmanager
    def checkpoint_save(self, global_step: int, path: str | os.PathLike[str] | None = None) -> Iterator[Span | None]:
        """A save: success is reported when the body returns (sync strategy; for async, call
        ``on_save_checkpoint_success`` when the save is finalised), the end always. A body that raises is a failed
        save: its span ends with status error and no success is reported."""
        target = self._recorder()
        s = target.on_save_checkpoint_start(global_step)
        ours = _telemetrain_recorder(target)
        try:
            yield s
        except BaseException as exc:
            _fail(target, ours._save_span_name(), exc)
            ours._misuse("checkpoint_save", f"the checkpoint save failed: {describe(exc)}", global_step=global_step)
            ours._save_succeeded = True  # reported just above: not again as "ended without success"
            target.on_save_checkpoint_end(path=path)
            raise
        if ours is target:
            sync = ours._save_span_name() == S.CHECKPOINT_SAVE_SYNC
        else:  # one-logger's rule: its config's strategy
            config = target.recorder._config.telemetry_config
            sync = config is not None and CheckPointStrategy(config.save_checkpoint_strategy) is CheckPointStrategy.SYNC
        if sync:
            target.on_save_checkpoint_success(global_step, path=path)
        target.on_save_checkpoint_end(path=path)

    def data_loading(self) -> AbstractContextManager[Any]:
        return self._phases().data_loading()

    def forward(self) -> AbstractContextManager[Any]:
        return self._phases().forward()

    def backward(self) -> AbstractContextManager[Any]:
        return self._phases().backward()

    def optimizer_update(self) -> AbstractContextManager[Any]:
        return self._phases().optimizer_update()

    def zero_grad(self) -> AbstractContextManager[Any]:
        return self._phases().zero_grad()


class _Pair(ContextDecorator):
    """A start callback at enter, the end callback at exit (a class: a third of a generator-based context manager's
    cost, which the training loop pays per iteration). Also a decorator, as contextlib's are."""

    __slots__ = ("_args", "_end", "_end_kwargs", "_get_recorder", "_name", "_recorder", "_start")

    def __init__(self, get_recorder: Callable[[], Any], start: str, end: str, name: str,
                 args: tuple[Any, ...], end_kwargs: dict[str, Any]) -> None:
        self._get_recorder = get_recorder
        self._start, self._end, self._name, self._args, self._end_kwargs = start, end, name, args, end_kwargs
        self._recorder: Any = None

    def _recreate_cm(self) -> _Pair:  # each decorated call is a new pair
        return _Pair(self._get_recorder, self._start, self._end, self._name, self._args, self._end_kwargs)

    def __enter__(self) -> Any:
        recorder = self._recorder = self._get_recorder()
        return getattr(recorder, self._start)(*self._args)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        recorder = self._recorder
        assert recorder is not None
        if exc is not None:
            _fail(recorder, self._name, exc)
        getattr(recorder, self._end)(**self._end_kwargs)


class _Iteration(ContextDecorator):
    """``training_iteration()``: what ``_Pair`` does, for the one context manager entered every step, without its
    generic dispatch (callbacks looked up by name, packed arguments): about half the cost."""

    __slots__ = ("_get_recorder", "_recorder")

    def __init__(self, get_recorder: Callable[[], Any]) -> None:
        self._get_recorder = get_recorder
        self._recorder: Any = None

    def _recreate_cm(self) -> _Iteration:  # each decorated call is a new pair
        return _Iteration(self._get_recorder)

    def __enter__(self) -> Any:
        recorder = self._recorder = self._get_recorder()
        return recorder.on_training_single_iteration_start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        recorder = self._recorder
        assert recorder is not None
        if exc is not None:
            _fail(recorder, S.TRAINING_SINGLE_ITERATION, exc)
        recorder.on_training_single_iteration_end()


def _telemetrain_recorder(target: Any) -> TrainingRecorder:
    """telemetrain's recorder behind a target: the target itself, or the one a one-logger recorder drives."""
    if isinstance(target, TrainingRecorder):
        return target
    ours: TrainingRecorder = target.recorder.training
    return ours


def _fail(target: Any, name: str, exc: BaseException) -> None:
    recorder = _telemetrain_recorder(target)
    s = recorder._iteration if name == S.TRAINING_SINGLE_ITERATION else recorder._spans.get(name)
    if s is not None and not s.ended:
        s.set_status("error", describe_end(exc))


_default = TrainingContexts(get_target)  # the configured one-logger provider, else the default recorder
application = _default.application
distributed_init = _default.distributed_init
model_init = _default.model_init
dataloader_init = _default.dataloader_init
optimizer_init = _default.optimizer_init
checkpoint_load = _default.checkpoint_load
checkpoint_save = _default.checkpoint_save
training_loop = _default.training_loop
training_iteration = _default.training_iteration
iteration_size = _default.iteration_size
validation_loop = _default.validation_loop
validation_iteration = _default.validation_iteration


def testing_loop() -> _Pair:
    """(A function, not a bound method as the others: pytest collects a ``test*`` name a test module imports.)"""
    return _default.testing_loop()


def testing_iteration() -> _Pair:
    return _default.testing_iteration()



data_loading = _default.data_loading
forward = _default.forward
backward = _default.backward
optimizer_update = _default.optimizer_update
zero_grad = _default.zero_grad
