"""The user's metric curves (``curves.CurveBuilder``) by SQL: DuckDB groups each series' points into buckets of a
power-of-two width and the builder merges the buckets, so Python handles a few hundred rows per series whatever the
run's length (the report, ``compare`` and ``tail`` on the engine path).

The width is the largest power of two at most ``span / (2 x capacity)`` (1 below that), where ``span`` is the series'
extent in steps, or in milliseconds for a series without steps: the builder's first widening takes its own width past
it, after which its buckets are the ones it would have built from the points one by one. Below ``2 x capacity`` steps
the buckets are single steps and the curves are those of the record-by-record pass exactly; above, a drawn point may
cover twice the steps it covers there (the same series, at the next resolution). A point without a step in a series
whose first point had one is left out (the record pass puts it at the last step seen).

Rollbacks (``curves``: a step lower than the one before it, same rank and series) are found per group of ranks in the
order the points were written -- the processes by their first point's wall time, then pid, segment file and line --
with one window (``lag``) over the group's stepped points; a series that went back more than ``MAX_ROLLBACKS`` times
has none. A point is abandoned when a later rollback of its series went back to its step or below; the abandoned
points are bucketed apart (exactly: a bucket that straddles the step gone back to is split here, as the record pass
splits it when it lies within the last steps it holds one by one, ``curve_detail``).
"""

from __future__ import annotations

from typing import Any

from ..store.rank_groups import rank_groups
from .curves import _SYSTEM_GROUPS, MAX_ROLLBACKS, WALL_WIDTH_NS, CurveBuilder

__all__ = ["feed_curves"]

# (rank, series) pairs bucketed by one query: DuckDB's aggregate holds each pair's buckets (up to ~2 x the builder's
# capacity) with their states, per thread: every pair of 64 ranks at once was +56 MiB of RSS at 64 x 100k against +17
# at 8 ranks, so the buckets are made a group of ranks at a time, in rank order (docs/scale.md); and at most
# POINTS_AT_ONCE steps of step-indexed series a group: 8 ranks of two 1M-step series took +25 MiB, 2 ranks +14
SERIES_AT_ONCE = 16
POINTS_AT_ONCE = 1 << 22


def _user_groups(column: str) -> str:
    names = ", ".join(f"'{g}'" for g in sorted(_SYSTEM_GROUPS))
    return f"({column} NOT IN ({names}) AND NOT starts_with({column}, 'system.'))"


def curve_extent_sql() -> str:
    """SQL aggregates of a series' extent over metric rows (one group per rank and series: ``feed_curves``'s
    ``extents``): by_step (whether its first point has a step), its first and last step and wall time."""
    numeric = f"value_bool IS NULL AND value IS NOT NULL AND {_user_groups('group_name')}"
    return (f"arg_min(step IS NOT NULL, wall_ns) FILTER (WHERE {numeric}) AS c_by_step, min(step) FILTER (WHERE "
            f"{numeric}) AS c_s0, max(step) FILTER (WHERE {numeric}) AS c_s1, min(wall_ns) FILTER (WHERE {numeric}) "
            f"AS c_w0, max(wall_ns) FILTER (WHERE {numeric}) AS c_w1")


def feed_curves(engine: Any, builder: CurveBuilder, metrics: str, extents: str | None = None) -> None:
    """Feed ``builder`` the user metrics of ``metrics``: a table or subquery of the engine's ``metrics`` rows with
    their series key ``skey`` (``Engine.series_keys``), already restricted to the ranks wanted. ``extents``: a table
    of the same rows' ``curve_extent_sql`` by (group_name, skey, rank), when a pass has made it.

    Two passes: each series' extent and width (a small table; none when ``extents`` is given), then the buckets,
    each point's non-finite test done once (``v``: the value when finite). Of equal maxima the first x is kept, as
    ``CurveBuilder.add`` keeps it."""
    cap = 2 * builder.capacity
    width = f"CAST(CASE WHEN span > {cap} THEN pow(2, floor(log2(span / {cap}))) ELSE 1 END AS BIGINT)"
    numeric = f"value_bool IS NULL AND value IS NOT NULL AND {_user_groups('group_name')}"
    if extents is None:
        extents = (f"(SELECT group_name, skey, rank, {curve_extent_sql()} FROM {metrics} "
                   "GROUP BY group_name, skey, rank)")
    engine.execute(f"""CREATE OR REPLACE TEMP TABLE curves_widths AS
WITH s AS (
  SELECT rank, group_name AS g, skey AS name, c_by_step AS by_step,
         CASE WHEN c_by_step THEN c_s1 - c_s0 + 1 ELSE (c_w1 - c_w0) // {WALL_WIDTH_NS} + 1 END AS span
  FROM {extents} WHERE c_by_step IS NOT NULL)
SELECT rank, g, name, by_step, CASE WHEN by_step THEN {width} ELSE {width} * {WALL_WIDTH_NS} END AS w,
       CASE WHEN by_step THEN span ELSE 0 END AS steps, row_number() OVER () AS sid FROM s""")
    add = builder.add_bucket
    for ranks in rank_groups(engine.rows("SELECT rank, count(*), sum(steps) FROM curves_widths GROUP BY rank "
                                         "ORDER BY rank"), SERIES_AT_ONCE, POINTS_AT_ONCE):
        src = f"(SELECT * FROM {metrics} WHERE {numeric} AND rank IN {ranks})"
        # each process's place among the rank's processes, by its start: a restart's points come after
        starts = (f"(SELECT rank, pid, row_number() OVER (PARTITION BY rank ORDER BY min(wall_ns), pid) AS ix "
                  f"FROM {src} GROUP BY rank, pid)")
        went_back = _rollbacks(engine, src, starts)
        for rank, group, name, from_step, to_step in went_back:
            builder.note_rollback(int(rank), group, name, int(from_step), int(to_step))
        gone = "FALSE"
        if went_back:
            later = ("q.ix > p.ix OR (q.ix = p.ix AND (q.segment > m.segment OR (q.segment = m.segment AND "
                     "q.line > m.line)))")
            gone = (f"s.by_step AND EXISTS (SELECT 1 FROM curves_rollbacks q WHERE q.sid = s.sid AND "
                    f"q.to_step <= m.step AND ({later}))")
        query = f"""
WITH x AS (
  SELECT m.rank, s.g, s.name, s.by_step, s.w, m.wall_ns, m.unit,
         CASE WHEN isfinite(m.value) THEN m.value END AS v,
         CASE WHEN s.by_step THEN m.step ELSE m.wall_ns END AS x, {gone} AS gone
  FROM {src} m
  JOIN curves_widths s ON m.rank = s.rank AND m.group_name = s.g AND m.skey = s.name
  {f"JOIN {starts} p ON p.rank = m.rank AND p.pid = m.pid" if went_back else ""}
  WHERE NOT s.by_step OR m.step IS NOT NULL)
SELECT rank, g, name, by_step, (x // w) * w AS x0,
       count(v), coalesce(fsum(v), 0.0), min(v), max(v), arg_max(x, CASE WHEN v IS NOT NULL THEN (v, -x) END),
       count(*) - count(v), min(x) FILTER (WHERE v IS NULL),
       max(wall_ns), fsum(x::DOUBLE), count(*), min(wall_ns), max(unit), gone
FROM x GROUP BY rank, g, name, by_step, x0, gone ORDER BY rank, g, name, x0, gone"""
        fed: set[int] = set()
        for _, batch in engine.stream(query):
            for rank, group, name, by_step, x0, n, total, lo, hi, hi_x, bad, bad_x, wall, xsum, xn, first, unit, \
                    abandoned in batch:
                add(int(rank), group, name, bool(by_step), int(x0),
                    [n, float(total), lo if n else 0.0, hi if n else 0.0, hi_x if n else 0, bad, bad_x if bad else 0,
                     wall, float(xsum), xn], int(first), unit or "", abandoned=bool(abandoned))
                fed.add(int(rank))
        # these ranks' buckets are complete (a rank is in one group): packed, 81 bytes each instead of ~430 as
        # lists of numbers, while the next groups are read and until the report is drawn (curve_buckets)
        builder.pack(fed)
    engine.execute("DROP TABLE curves_widths")
    engine.execute("DROP TABLE IF EXISTS curves_rollbacks")


def _rollbacks(engine: Any, src: str, starts: str) -> list[tuple[Any, ...]]:
    """The rollbacks of the stepped series of these points (``src``), kept in ``curves_rollbacks`` with where each
    was written: (rank, group, series, from step, to step) each, in order. Past ``MAX_ROLLBACKS`` in a series:
    none (its step is not training progress)."""
    # (the window sorts every stepped point of the group: only a series number and the order's integers travel
    # with it, not the names -- docs/scale.md)
    engine.execute(f"""CREATE OR REPLACE TEMP TABLE curves_rollbacks AS
WITH o AS (
  SELECT s.sid, m.step, p.ix, m.segment, m.line,
         lag(m.step) OVER (PARTITION BY s.sid ORDER BY p.ix, m.segment, m.line) AS prev
  FROM {src} m
  JOIN curves_widths s ON m.rank = s.rank AND m.group_name = s.g AND m.skey = s.name AND s.by_step
  JOIN {starts} p ON p.rank = m.rank AND p.pid = m.pid
  WHERE m.step IS NOT NULL)
SELECT sid, prev AS from_step, step AS to_step, ix, segment, line FROM o WHERE step < prev
QUALIFY count(*) OVER (PARTITION BY sid) <= {MAX_ROLLBACKS}""")
    return list(engine.rows("SELECT s.rank, s.g, s.name, q.from_step, q.to_step FROM curves_rollbacks q "
                            "JOIN curves_widths s ON q.sid = s.sid ORDER BY s.rank, s.g, s.name, q.ix, q.segment, "
                            "q.line"))
