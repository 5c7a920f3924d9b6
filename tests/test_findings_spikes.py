"""The spike rule (findings/values.py) as the engine runs it: the sorted running reference gives the textbook
rule's answers, and the DuckDB selection of candidates (``spike_points_sql``, ``findings_sql``) gives the
same spikes as every point, or says it cannot (then ``findings_sql`` reads the series whole)."""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest

from telemetrain.analysis.findings.builder import InputBuilder
from telemetrain.analysis.findings.inputs import SpikeSelection, ValueSeries
from telemetrain.analysis.findings.stats import MAD_TO_SD, mad, median
from telemetrain.analysis.findings.thresholds import Thresholds
from telemetrain.analysis.findings.values import _series_spikes, selected_spikes, spike_points_sql

THRESHOLDS = [Thresholds(), Thresholds(spike_history=5, spike_min_history=12, spike_ratio=1.5, spike_z=4.0),
              Thresholds(spike_history=8, spike_min_history=3, spike_z=6.0)]


def textbook(points: list[tuple[int, float]], th: Thresholds) -> list[tuple[int, float, float, float]]:
    """The rule as values.py's docstring states it, written the obvious way (the oracle)."""
    history: list[float] = []
    out = []
    for step, value in points:
        if not math.isfinite(value):
            continue
        if len(history) >= th.spike_min_history:
            recent = history[-th.spike_history:]
            center, top = median(recent), max(recent)
            floor = 0.01 * abs(center) if center != 0 else 0.01 * max(abs(v) for v in recent)
            scale = max(MAD_TO_SD * mad(recent, center), floor)
            z = (value - center) / scale if scale > 0 else -math.inf
            ratio_ok = value >= th.spike_ratio * center if center > 0 else top <= 0 or value >= th.spike_ratio * top
            if z >= th.spike_z and ratio_ok:
                out.append((step, value, z, center))
                continue
        history.append(value)
    return out


def series(seed: int, n: int = 400) -> list[tuple[int, float]]:
    """A falling loss with noise, and (by seed) isolated spikes, bursts of spikes, NaN/inf, zeros and negative
    stretches, plateaus of equal values."""
    rng = random.Random(seed)
    out = []
    burst = rng.randrange(0, n)
    length = rng.choice([1, 3, 10, 40])
    for step in range(n):
        value = 2.0 / (1 + step / 100) + rng.gauss(0, 0.02)
        if seed % 5 == 1 and step % 50 < 10:
            value = 1.0  # plateau: a MAD of 0
        if seed % 5 == 2 and 200 <= step < 260:
            value -= 3.0  # negative: every point a candidate
        if seed % 5 == 3 and step % 97 == 5:
            value = 0.0
        if rng.random() < 0.01:
            value *= rng.choice([4.0, 20.0, 1000.0])
        if burst <= step < burst + length:
            value *= 50.0 * (1 + step - burst)  # growing: each a spike against the reference
        if rng.random() < 0.005:
            value = rng.choice([math.nan, math.inf, -math.inf])
        out.append((step, value))
    return out


@pytest.mark.parametrize("th", THRESHOLDS, ids=["default", "short-history", "low-min-history"])
def test_the_sorted_reference_gives_the_textbook_answers(th: Thresholds) -> None:
    found = 0
    for seed in range(30):
        points = series(seed)
        expected = textbook(points, th)
        assert _series_spikes(ValueSeries("loss", "loss", 0, points), th) == expected, seed
        found += len(expected)
    assert found > 30  # the series do hold spikes


class Connection:
    """``store.engine.Engine``'s query methods over a DuckDB connection holding one table."""

    def __init__(self, con: Any) -> None:
        self.con = con

    def execute(self, query: str, params: Any = None) -> Any:
        return self.con.execute(query, params) if params is not None else self.con.execute(query)

    def rows(self, query: str, params: Any = None) -> list[Any]:
        return list(self.execute(query, params).fetchall())

    def temp_table(self, name: str, select: str) -> None:
        self.con.execute(f"DROP TABLE IF EXISTS {name}")
        self.con.execute(f"CREATE TEMP TABLE {name} AS {select}")

    @contextlib.contextmanager
    def one_thread(self) -> Iterator[None]:
        threads = self.con.execute("SELECT current_setting('threads')").fetchone()[0]
        self.con.execute("SET threads = 1")
        try:
            yield
        finally:
            self.con.execute(f"SET threads = {int(threads)}")

    def stream(self, query: str, params: Any = None) -> Any:
        cur = self.execute(query, params)
        names = [d[0] for d in cur.description]
        while batch := cur.fetchmany(1000):
            yield names, batch


def table(all_series: list[list[tuple[int, float]]]) -> Any:
    """DuckDB table ``pts`` (name, rank, step, value, pid, segment, line): series i is rank i, its points spread
    over two processes and segments in file order; every 7th point without a step."""
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    con.execute("CREATE TABLE pts (name VARCHAR, rank BIGINT, step BIGINT, value DOUBLE, pid BIGINT, "
                "segment INTEGER, line INTEGER)")
    rows = []
    for rank, points in enumerate(all_series):
        for i, (step, value) in enumerate(points):
            pid, segment = (1, i // 100) if i < len(points) // 2 else (2, i // 100)
            rows.append(("train.loss", rank, None if i % 7 == 3 else step, value, pid, segment, i))
    random.Random(0).shuffle(rows)  # the order comes from (pid, segment, line), not from the table
    values = ", ".join(f"('{n}', {r}, {'NULL' if s is None else s}, '{v!r}'::DOUBLE, {p}, {g}, {i})"
                       for n, r, s, v, p, g, i in rows)  # (text: the float exactly)
    con.execute(f"INSERT INTO pts VALUES {values}")
    return con


def with_positions(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """``InputBuilder.metric``'s series: a point without a step takes its position."""
    return [(i if i % 7 == 3 else step, value) for i, (step, value) in enumerate(points)]


@pytest.mark.parametrize("th", THRESHOLDS, ids=["default", "short-history", "low-min-history"])
def test_the_sql_selection_settles_the_spikes_or_says_it_cannot(th: Thresholds) -> None:
    from telemetrain.analysis.findings_sql import feed_value_series_sql

    all_series = [series(seed) for seed in range(24)]
    con = table(all_series)
    # every finite point by spike_points_sql (its index and steps as the builder's): a selection of all settles
    rows = con.execute(f"SELECT rank, step, value, fi, cand, nf FROM {spike_points_sql('pts', 'name', th)} "
                       "ORDER BY rank, fi").fetchall()
    for rank, points in enumerate(all_series):
        mine = [r for r in rows if r[0] == rank]
        sel = SpikeSelection(index=[r[3] for r in mine], candidate=[r[4] for r in mine], finite=mine[0][5],
                             history=th.spike_history, min_history=th.spike_min_history, ratio=th.spike_ratio)
        assert sel.index == list(range(len(mine))) and sel.finite == len(mine)
        found = selected_spikes(ValueSeries("train.loss", "loss", rank, [(r[1], r[2]) for r in mine], sel), th)
        assert found == textbook(with_positions(points), th), rank
    # the feeder: the candidates and their neighbours where they settle the series, the whole series where not
    builder = InputBuilder()
    given_points = feed_value_series_sql(builder, Connection(con), "pts", "name", th)
    given = {s.rank: s for s in builder.build().values}
    assert len(given) == len(given.values())
    selected = sum(s.selection is not None for s in given.values())
    assert selected > 6 and given_points < 0.8 * sum(len(p) for p in all_series)  # (1% of the points spike)
    for rank, points in enumerate(all_series):
        expected = textbook(with_positions(points), th)
        assert (_series_spikes(given[rank], th) if rank in given else []) == expected, rank
        if rank in given and given[rank].selection is None:
            assert repr(list(given[rank].points)) == repr(with_positions(points))  # whole, in file order (NaN too)


def test_a_jump_that_stays_needs_the_whole_series_and_gets_it() -> None:
    from telemetrain.analysis.findings_sql import feed_value_series_sql

    th = Thresholds()
    points = [(i, 1.0 + 0.01 * (i % 3) if not 100 <= i < 160 else 100.0 * (i - 99)) for i in range(400)]
    con = table([points, [(i, 1.0 + 0.01 * (i % 3)) for i in range(400)]])  # rank 1: no candidate at all
    builder = InputBuilder()
    assert feed_value_series_sql(builder, Connection(con), "pts", "name", th) == 400
    (whole,) = builder.build().values
    assert whole.rank == 0 and whole.selection is None
    assert _series_spikes(whole, th) == textbook(with_positions(points), th) != []


def test_a_selection_for_other_thresholds_is_refused() -> None:
    sel = SpikeSelection(index=[0], candidate=[True], finite=1, history=20, min_history=20, ratio=3.0)
    s = ValueSeries("loss", "loss", 0, [(0, 1.0)], sel)
    with pytest.raises(ValueError, match="spike_history=20"):
        _series_spikes(s, Thresholds(spike_history=10))


@pytest.mark.parametrize("th", THRESHOLDS, ids=["default", "short-history", "low-min-history"])
@pytest.mark.parametrize("block_lines", [1, 7, 64, 2048])
@pytest.mark.parametrize("groups", [None, ["(0, 1, 2, 3, 4)", "(5, 6, 7, 8, 9, 10, 11)", "(12, 13)"]],
                         ids=["all-ranks", "rank-groups"])
def test_the_block_prefilter_finds_exactly_the_candidates_of_every_point(th: Thresholds, block_lines: int,
                                                                         groups: list[str] | None) -> None:
    """``findings_sql.candidates_sql`` (blocks bounded by their minima, only the flagged ones sorted) gives the
    candidates that ``spike_points_sql`` gives over every point, on series with spikes, NaN/inf, zeros, negative
    stretches and plateaus, and on smooth ones (whose blocks it proves free of candidates); all ranks' blocks at
    once or a group of ranks at a time."""
    from telemetrain.analysis.findings_sql import candidates_sql

    smooth = [[(i, 1.0 / (i + 1) + 0.001 * (i % 5)) for i in range(400)], [(i, 5.0 - i / 100) for i in range(400)]]
    con = table([series(seed) for seed in range(12)] + smooth)
    every = con.execute(f"SELECT k, rank, fi FROM {spike_points_sql('pts', 'name', th)} WHERE cand "
                        "ORDER BY k, rank, fi").fetchall()
    found = [row for query in candidates_sql(Connection(con), "pts", "name", th, block_lines, groups)
             for row in con.execute(query).fetchall()]
    assert sorted(found) == every and len(every) > 50  # (each query ordered; the series holding NaN last)
    flagged, blocks = con.execute("SELECT count(*) FILTER (WHERE flagged), count(*) FROM findings_blocks "
                                  "WHERE rank >= 12").fetchone()
    if block_lines >= 64:
        assert flagged < blocks  # some of the smooth series' blocks are proven free of candidates


def test_a_loss_at_exactly_zero_is_no_spike_for_its_float_dust_but_a_jump_off_it_is() -> None:
    """A loss that reaches exactly 0 (a memorised batch, a satisfied margin): the median of its reference is 0, so
    every positive value was infinitely many times it and a robust z of 1e-7 / 1e-12. Its float dust is no spike; a
    jump far above everything in the reference still is; against a reference of exact zeros there is no scale."""
    from telemetrain.analysis.findings_sql import feed_value_series_sql

    th = Thresholds()
    dust = [(i, max(0.0, 1.0 - i / 100) if i < 150 or i % 37 else 1e-7) for i in range(400)]
    jump = [(i, 5.0 if i == 300 else v) for i, v in dust]
    zeros = [(i, 0.0 if i != 300 else 5.0) for i in range(400)]
    expected = {0: [], 1: [(300, 5.0)], 2: []}
    for rank, points in enumerate((dust, jump, zeros)):
        assert [(s, v) for s, v, _, _ in _series_spikes(ValueSeries("train.loss", "loss", rank, points), th)] \
            == expected[rank], rank
    builder = InputBuilder()  # the SQL reader's selection gives the same
    feed_value_series_sql(builder, Connection(table([dust, jump, zeros])), "pts", "name", th)
    given = {s.rank: [(step, v) for step, v, _, _ in _series_spikes(s, th)] for s in builder.build().values}
    assert {r: given.get(r, []) for r in expected} == expected
