"""``analysis.quantiles_sql.kth_smallest``: exact order statistics by narrowing ranges, against a sort."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

duckdb = pytest.importorskip("duckdb")

from telemetrain.analysis import quantiles_sql  # noqa: E402
from telemetrain.analysis.quantiles_sql import kth_smallest  # noqa: E402
from telemetrain.analysis.samples import _quantile, interpolate, quantile_positions  # noqa: E402
from telemetrain.store.engine import Engine  # noqa: E402


@pytest.fixture
def sql() -> Iterator[Engine]:
    e = Engine([])
    yield e
    e.close()


def _table(sql: Engine, values: list[int | None]) -> str:
    sql.execute("CREATE OR REPLACE TEMP TABLE q (d BIGINT, keep BOOLEAN)")
    sql.con.executemany("INSERT INTO q VALUES (?, ?)", [(v, i % 7 != 3) for i, v in enumerate(values)])
    return "FROM q WHERE keep"


@pytest.mark.parametrize("seed", range(6))
def test_every_rank_asked_for_is_the_sorted_value(sql: Engine, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantiles_sql, "FETCH_AT_MOST", 50)  # several narrowing passes on small tables
    monkeypatch.setattr(quantiles_sql, "BUCKETS", 8)
    rng = random.Random(seed)
    shapes: list[Callable[[], int]] = [
        lambda: rng.randint(0, 10 ** 10),  # spread
        lambda: rng.choice([5, 5, 5, 7, 10 ** 12]),  # heavy ties and an outlier
        lambda: rng.randint(-2 ** 63, 2 ** 63 - 1),  # the whole BIGINT range
        lambda: 100_000_000 + rng.randint(-1000, 1000) if rng.random() < 0.98 else rng.randint(0, 10 ** 11),
    ]
    shape = shapes[seed % len(shapes)]
    values: list[int | None] = [shape() if rng.random() > 0.05 else None for _ in range(rng.randint(1, 3000))]
    source = _table(sql, values)
    kept = sorted(v for i, v in enumerate(values) if v is not None and i % 7 != 3)
    if not kept:
        return
    ks = sorted({0, len(kept) - 1, len(kept) // 2, *(rng.randrange(len(kept)) for _ in range(5))})
    assert kth_smallest(sql, "d", source, ks) == {k: kept[k] for k in ks}


def test_one_value_repeated_is_found_without_reading_the_rows(sql: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantiles_sql, "FETCH_AT_MOST", 10)
    source = _table(sql, [42] * 5000)
    calls: list[str] = []
    rows = sql.rows

    def logged_rows(q: str, p: Any = None) -> list[tuple[Any, ...]]:
        calls.append(q)
        return rows(q, p)

    monkeypatch.setattr(sql, "rows", logged_rows)
    n = 5000 - len(range(3, 5000, 7))
    assert kth_smallest(sql, "d", source, [0, n // 2, n - 1]) == {0: 42, n // 2: 42, n - 1: 42}
    assert calls == []  # min = max: no histogram, no rows fetched


def test_ranks_outside_the_values_are_refused(sql: Engine) -> None:
    source = _table(sql, [1, 2, 3])
    with pytest.raises(ValueError, match="ks must be ranks"):
        kth_smallest(sql, "d", source, [3])
    with pytest.raises(ValueError, match="ks must be ranks"):
        kth_smallest(sql, "d", source, [-1])


def test_the_percentiles_are_the_python_paths_formula_on_the_same_values() -> None:
    rng = random.Random(7)
    for n in (1, 2, 3, 100, 1001):
        ordered = sorted(rng.randint(0, 10 ** 10) / 1e9 for _ in range(n))
        for q in (0.5, 0.99):
            low, high, weight = quantile_positions(n, q)
            assert interpolate(ordered[low], ordered[high], weight) == _quantile(ordered, q)


@pytest.mark.parametrize("seed", range(8))
def test_the_median_of_doubles_is_duckdbs_to_the_bit(sql: Engine, seed: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantiles_sql, "FETCH_AT_MOST", 40)
    monkeypatch.setattr(quantiles_sql, "BUCKETS", 16)
    rng = random.Random(100 + seed)
    shapes = [
        lambda: rng.lognormvariate(-2, 0.3),  # iteration times
        lambda: rng.choice([0.1, 0.1, 0.1, 0.30000000000000004, 7e-300]),  # ties, a tiny value
        lambda: rng.uniform(-1e6, 1e6),
        lambda: rng.choice([-1e308, 1e308, 0.0, 1.0]),  # a range too wide for a bucket width: read in order
    ]
    values = [shapes[seed % len(shapes)]() for _ in range(rng.randint(1, 2500))]
    sql.execute("CREATE OR REPLACE TEMP TABLE m (avg DOUBLE)")
    sql.con.executemany("INSERT INTO m VALUES (?)", [(v,) for v in values])
    expected = sql.scalar("SELECT median(avg) FROM m")
    got = quantiles_sql.median(sql, "avg", "FROM m")
    assert got == expected and type(got) is float, (got, expected)
    ordered = sorted(values)
    ks = sorted({0, len(values) - 1, rng.randrange(len(values))})
    assert kth_smallest(sql, "avg", "FROM m", ks) == {k: ordered[k] for k in ks}


def test_the_median_of_no_row_is_none(sql: Engine) -> None:
    sql.execute("CREATE OR REPLACE TEMP TABLE m (avg DOUBLE)")
    assert quantiles_sql.median(sql, "avg", "FROM m") is None
