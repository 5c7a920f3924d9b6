"""A ``Work`` whose completion is seen when it is waited: for works without a future to be told by.

gloo's point-to-point works (``isend``/``irecv``, and so ``batch_isend_irecv`` on gloo) raise
``Work::getFuture not implemented``, and their ``is_completed`` stays false until someone waits: nothing says when
they complete but the caller's own ``wait()``. The work returned in their place is a ``torch.distributed.Work``
(a subclass: ``isinstance`` holds) that passes every call to torch's work, and ends the timing when ``wait()``
returns (or raises) or ``is_completed()`` says so. Waiting it from two threads at once is waiting torch's twice,
as it would be without us.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["waited_work"]

_CLASS: list[type] = []  # (made at first use: importing this module does not import torch)


def waited_work(inner: Any, done: Callable[[BaseException | None], None]) -> Any:
    """``inner`` as a ``Work`` that calls ``done(None)`` when it has completed, ``done(exc)`` when waiting it
    raised ``exc``."""
    if not _CLASS:
        _CLASS.append(_make())
    return _CLASS[0](inner, done)


def _make() -> type:
    import torch.distributed as dist

    class TimedWork(dist.Work):
        """torch's work, its completion reported when it is waited."""

        def __init__(self, inner: Any, done: Callable[[BaseException | None], None]) -> None:
            super().__init__()
            self._inner = inner
            self._callback: Callable[[BaseException | None], None] | None = done

        def _done(self, error: BaseException | None) -> None:
            callback, self._callback = self._callback, None  # once: a work is waited again, or polled then waited
            if callback is not None:
                callback(error)

        def wait(self, *args: Any, **kwargs: Any) -> Any:
            try:
                result = self._inner.wait(*args, **kwargs)
            except BaseException as exc:
                self._done(exc)
                raise
            self._done(None)
            return result

        def is_completed(self) -> bool:
            completed = bool(self._inner.is_completed())
            if completed:
                self._done(None)
            return completed

        def is_success(self) -> Any:
            return self._inner.is_success()

        def exception(self) -> Any:
            return self._inner.exception()

        def source_rank(self) -> Any:
            return self._inner.source_rank()

        def _source_rank(self) -> Any:
            return self._inner._source_rank()

        def result(self) -> Any:
            return self._inner.result()

        def synchronize(self) -> Any:
            return self._inner.synchronize()

        def get_future(self) -> Any:
            return self._inner.get_future()

        def get_future_result(self) -> Any:
            return self._inner.get_future_result()

        def block_current_stream(self) -> Any:
            return self._inner.block_current_stream()

        def _get_op_type(self) -> Any:
            return self._inner._get_op_type()

        def _get_duration(self) -> Any:
            return self._inner._get_duration()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    return TimedWork
