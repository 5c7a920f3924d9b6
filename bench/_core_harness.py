"""bench_core.py's harness: the in-process rows by the peers method (``_method.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from _method import RESULTS, difference_row, measure, new_row, progress

# -- harness (the peers method: _method.py) --------------------------------------------------------------------------


def bench(
    lib: str,
    op: str,
    stmt: str,
    names: dict[str, Any] | None = None,
    *,
    between: Callable[[], None] | None = None,
    gc_off: bool = False,
    max_n: int | None = None,
) -> dict[str, Any]:
    """Measure ``stmt``; ``between()`` runs after calibration and after every repeat, outside the timed region."""
    samples, n = measure(stmt, names, between=between, gc_off=gc_off, max_n=max_n)
    row = new_row(lib, op, samples, n)
    RESULTS.append(row)
    progress(f"{lib:<18} {op:<72} {row['median_ns']:9.1f} ns  (n={n})")
    return row


def derived(lib: str, op: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Row ``a - b`` (median - median, best - best; repeats: the differences of the paired repeats)."""
    row = difference_row(lib, op, a, b)
    RESULTS.append(row)
    progress(f"{lib:<18} {op:<72} {row['median_ns']:9.1f} ns")
    return row


def _empty() -> None:
    pass
