"""bench_stats.py's harness: the in-process rows by the peers method (``_method.py``), the seeded input values and
the stats whose reported windows are counted."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from itertools import cycle
from typing import TYPE_CHECKING, Any

import _method
import _stats_state as state
from _method import difference_row, measure, new_row
from _stats_state import EMITTED, EMITTED_SAMPLES, P, StatT

if TYPE_CHECKING:
    from telemetrain.records import StatWindow
    from telemetrain.stats import Stat as AnyStat


# -- harness (the peers method: _method.py) --------------------------------------------------------------------------


_record = _method.record_with_peer


def _row(lib: str, op: str, samples: list[float], n: object, peer: dict[str, Any] | None) -> dict[str, Any]:
    return _record(new_row(lib, op, samples, n), peer)


def bench(
    lib: str,
    op: str,
    stmt: str,
    names: dict[str, Any] | None = None,
    *,
    peer: dict[str, Any] | None = None,
    between: Callable[[], None] | None = None,
    gc_off: bool = False,
    max_n: int | None = None,
    warm: int = 2000,
) -> dict[str, Any]:
    """Measure ``stmt``; ``between()`` runs after calibration and after every repeat, outside the timed region."""
    samples, n = measure(
        stmt, names, between=between, gc_off=gc_off, max_n=max_n, warm=warm, collect=state.ARGS.collect
    )
    return _row(lib, op, samples, n, peer)


def derived(
    lib: str, op: str, a: dict[str, Any], b: dict[str, Any], *, peer: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Row ``a - b`` (median - median, best - best; repeats: the differences of the paired repeats)."""
    return _record(difference_row(lib, op, a, b), peer)


# -- values -----------------------------------------------------------------------------------------------------------

_RNG = random.Random(20261121)
LOGN = [_RNG.lognormvariate(0.0, 1.0) for _ in range(1 << 16)]  # "realistic": latencies, step times, losses
LOGN_NARROW = [_RNG.lognormvariate(0.0, 0.25) for _ in range(1 << 16)]
# both signs, magnitudes 2**-32 .. 2**32: fills 2 x 4096 histogram buckets at scale 6 (the documented maximum)
WIDE = [_RNG.choice((-1.0, 1.0)) * 2.0 ** _RNG.uniform(-32.0, 32.0) for _ in range(1 << 16)]
INTS = [_RNG.randrange(10**6, 10**9) for _ in range(1 << 16)]  # e.g. durations in ns: one-digit ints


def _nx(values: Sequence[float]) -> Callable[[], float]:
    return cycle(values).__next__


def _empty() -> None:
    pass


def _stat(cls: Callable[P, StatT], *args: P.args, **kwargs: P.kwargs) -> StatT:
    """A stat whose reported windows are counted (by name) for the final check against the run store."""
    s = cls(*args, **kwargs)

    def count(stat: AnyStat, record: StatWindow) -> None:
        EMITTED[record.name] += 1
        EMITTED_SAMPLES[record.name] += record.sample_count

    s.add_listener(count)
    return s
