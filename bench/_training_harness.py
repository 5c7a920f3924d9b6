"""bench_training.py's harness: the in-process rows by the peers method (``_method.py``), the optional-peer guards
and the training telemetry config every section uses."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import _method
import _training_state as state
from _method import difference_row, measure, new_row
from _training_state import FLOPS_PER_SAMPLE, GLOBAL_BATCH, LOG_EVERY

if TYPE_CHECKING:
    from telemetrain.training import TrainingTelemetryConfig


# -- harness (the peers method: _method.py) --------------------------------------------------------------------------


_record = _method.record_with_peer


def _row(lib: str, op: str, samples: list[float], n: object, peer: dict[str, Any] | None = None) -> dict[str, Any]:
    return _record(new_row(lib, op, samples, n), peer)


def bench(
    lib: str,
    op: str,
    stmt: str,
    names: dict[str, Any] | None = None,
    *,
    peer: dict[str, Any] | None = None,
    between: Callable[[], None] | None = None,
    max_n: int | None = None,
) -> dict[str, Any]:
    """Measure ``stmt``; ``between()`` runs after calibration and after every repeat, outside the timed region."""
    samples, n = measure(stmt, names, between=between, max_n=max_n, collect=state.ARGS.collect)
    return _row(lib, op, samples, n, peer)


def derived(
    lib: str, op: str, a: dict[str, Any], b: dict[str, Any], *, peer: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Row ``a - b`` (median - median, best - best; repeats: the differences of the paired repeats)."""
    return _record(difference_row(lib, op, a, b), peer)


def _empty() -> None:
    pass


def _require(module: str, what: str) -> None:
    """ImportError (the section is skipped with a note) when ``module`` cannot be imported."""
    try:
        __import__(module)
    except ImportError as exc:
        raise ImportError(f"{what} not installed or not importable: {exc}") from exc


def _torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def _training_config(*, log_every: int = LOG_EVERY, device_name: str | None = None) -> TrainingTelemetryConfig:
    from telemetrain.training import TrainingTelemetryConfig

    return TrainingTelemetryConfig(
        global_batch_size_or_fn=GLOBAL_BATCH,
        perf_tag_or_fn="bench_training",
        log_every_n_train_iterations=log_every,
        flops_per_sample_or_fn=FLOPS_PER_SAMPLE,
        device_name=device_name,
    )
