"""The spike rule's input by SQL (``store.engine``): instead of every point of every loss and gradient-norm series
(one per step and rank: 64 M points on 64 ranks x 1M steps), DuckDB selects the spike candidates and their
neighbours (``findings.values.spike_selection_sql``, exact), and Python evaluates only those
(``findings.values.selected_spikes``). A series whose selection does not settle it (many spikes in a row) is read
whole. Shared by ``report`` (``report.model_sql``) and ``show`` (``show_sql``).
"""

from __future__ import annotations

from typing import Any

from .findings.builder import InputBuilder
from .findings.inputs import SpikeSelection, ValueSeries
from .findings.thresholds import DEFAULT_THRESHOLDS, Thresholds
from .findings.values import selected_spikes, spike_selection_sql, value_kind

__all__ = ["feed_value_series_sql"]


def feed_value_series_sql(builder: InputBuilder, engine: Any, relation: str, key: str,
                          thresholds: Thresholds | None = None) -> int:
    """Give ``builder`` the value series of ``relation`` (columns ``key``, rank, step, value, pid, segment, line;
    the numeric points, non-finite included, of the series ``InputBuilder.metric`` keeps as values): each as the
    points that settle its spikes for ``thresholds``, or whole where those do not. Returns the points given."""
    th = thresholds if thresholds is not None else DEFAULT_THRESHOLDS
    given = 0
    current: tuple[str, int] | None = None
    points: list[tuple[int, float]] = []
    index: list[int] = []
    candidate: list[bool] = []
    finite = 0
    unsettled: list[tuple[str, int]] = []  # read whole after the stream (one query at a time on the connection)

    def flush() -> int:
        if current is None or not points:
            return 0
        name, rank = current
        kind = value_kind(name)
        assert kind is not None
        selection = SpikeSelection(index=list(index), candidate=list(candidate), finite=finite,
                                   history=th.spike_history, min_history=th.spike_min_history, ratio=th.spike_ratio)
        series = ValueSeries(name, kind, rank, list(points), selection)
        if selected_spikes(series, th) is None:
            unsettled.append(current)
            return 0
        builder.value_series(series)
        return len(series.points)

    for _, batch in engine.stream(spike_selection_sql(relation, key, th)):
        for name, rank, step, value, fi, cand, nf in batch:
            if (name, rank) != current:
                given += flush()
                current = (name, rank)
                points, index, candidate, finite = [], [], [], int(nf)
            points.append((int(step), float(value)))
            index.append(int(fi))
            candidate.append(bool(cand))
    given += flush()
    for name, rank in unsettled:
        whole = ValueSeries(name, value_kind(name) or "loss", rank, _whole(engine, relation, key, name, rank))
        builder.value_series(whole)
        given += len(whole.points)
    return given


def _whole(engine: Any, relation: str, key: str, name: str, rank: int) -> list[tuple[int, float]]:
    """Every point of one series, in the order ``InputBuilder.metric`` meets them."""
    out: list[tuple[int, float]] = []
    for _, batch in engine.stream(
            f"SELECT coalesce(step, row_number() OVER (ORDER BY pid, segment, line) - 1), value FROM {relation} "
            f"WHERE {key} = $name AND rank = $rank ORDER BY pid, segment, line", {"name": name, "rank": rank}):
        out.extend((int(step), float(value)) for step, value in batch)
    return out
