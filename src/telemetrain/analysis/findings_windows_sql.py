"""The findings engine's report windows merged by SQL (``store.engine``), for ``report`` and ``show``: what
``findings.window_budget.WindowStore`` holds once every report is fed, without a Python call per report.

A long run's reports (64 ranks x 1M iterations: 1.28 M) pass the window budget and are merged pairwise, in blocks
of ``2 ** level`` reports of each training loop (``window_budget``'s docstring). Here DuckDB does the merging when the
run is *regular*: in every loop, each report after the warm-up has a usable mean and joins the one before (steps
that follow on, the same phases on the same clock, the same communication waits: ``window_budget.mergeable``), and
each loop's reports are consecutive in the feeding order. Then a complete block is one piece, the level follows from
the loops' report counts (``WindowStore.regular_level`` replays the store's checks), and each block is the store's
tree of pairwise merges: at each level DuckDB joins the blocks whose position ``p >> (level - 1)`` is even to the next
one (``p >> level`` the same), up to the level, each figure the sum of at most two parts (the same IEEE addition as
the store's: addition commutes), a figure unknown in one part unknown in the sum, the slowest iteration the larger.
(Joins, not ``GROUP BY p >> level``: a group of two rows held ~1 KB of aggregate states per block, 20,000 blocks at
the first level of two ranks of a 1M-iteration run, +25-45 MiB and twice the time; the joins hold half of each level
as rows, +13-19 MiB.) The store's ``_Sums`` then makes each
window from those sums (``window_budget.hold_sums``: held packed as sums, the window made when read), a loop's
warm-up window and a lone last report as ``window_point`` makes them. Anything
else (a run within the budget, a report without a usable mean after the warm-up, a gap, a change of phases,
interleaved loops) is fed report by report as before: the same windows either way, to the last bit
(``tests/test_findings_window_budget.py`` compares both).
"""

from __future__ import annotations

from typing import Any

from ..phase_times import DEVICE, HOST
from .findings.builder import PHASES, WINDOW_POINT_KEYS, InputBuilder, window_point_of_values
from .findings.window_budget import hold, hold_sums

__all__ = ["feed_windows_sql"]

_DEV = [WINDOW_POINT_KEYS.index(f"avg_{p}_device_time_sec") for p in PHASES]
_HOST = [WINDOW_POINT_KEYS.index(f"avg_{p}_time_sec") for p in PHASES]
_WAITS = [WINDOW_POINT_KEYS.index(f"avg_{p}_comm_wait_sec") for p in (*PHASES, "other")]
_WAIT_NAMES = (*PHASES, "other")
_THREAD = (WINDOW_POINT_KEYS.index("train_thread_cpu_wait_sec"), WINDOW_POINT_KEYS.index("train_thread_cpu_time_sec"))
_WORLD = WINDOW_POINT_KEYS.index("avg_comm_world_wait_time_sec")
_SUMMED = ["t", *(f"ph{i}" for i in range(len(PHASES))), "p50", "wall", "cwait", "cpu", "comm",
           *(f"w{i}" for i in range(len(_WAIT_NAMES))), "pit", "tcwait", "tcpu", "world"]


def _mask(indices: list[int]) -> str:
    return " + ".join(f"(CASE WHEN v{i} IS NOT NULL THEN {1 << k} ELSE 0 END)" for k, i in enumerate(indices))


def feed_windows_sql(builder: InputBuilder, engine: Any, source: str, where: str, counts: list[tuple[Any, Any]],
                     groups: list[str]) -> bool:
    """Give ``builder`` the windows of the reports of ``source`` that ``where`` selects (rows with rank, pid, segment,
    line, wall_ns, host and the typed report columns: the engine's ``reports`` or ``windows``) merged by SQL, when
    the run is regular and past the budget; ``groups``: SQL lists of ranks read together
    (``findings_sql.rank_groups`` of ``counts``, the reports per rank). False (nothing given) otherwise: the caller
    feeds the reports one by one.

    The loops' report counts first (the level, were the run regular), then each group of ranks once: its reports
    typed into a small table, checked, merged; the builder is given the windows only when every loop was regular."""
    if builder.limit is not None or builder.windows_held() or not counts:
        return False
    store = builder._store
    if sum(int(n) for _, n in counts) <= store.budget:
        return False  # within the budget: nothing is merged
    from .findings_sql import loop_start_sql, reports_relation

    reports = reports_relation(source, where)
    order = engine.rows(f"SELECT rank, pid, coalesce({loop_start_sql()}, -1) AS start, count(*) - 1, "
                        f"min((pid, segment, line)) AS o, min(wall_ns) FROM {source} WHERE {where} GROUP BY ALL "
                        "ORDER BY rank, o")
    level = store.regular_level([(int(rank), int(n)) for rank, _, _, n, _, _ in order])
    if level == 0:
        return False
    # the time origin the windows are placed from: the builder's, else the earliest report's (``builder.seen``), known
    # before the groups are read, so that each group's sums become windows at once (40,000 rows of ~27 numbers held
    # to the end were ~30 MiB at 64 ranks x 1M iterations, over the last groups' queries)
    # (the earliest report is seen now: were the run to change meanwhile, the fallback feeds that report anyway)
    first = min(int(row[5]) for row in order)
    builder.seen(first)
    origin = builder.origin_ns()
    assert origin is not None
    loops: list[tuple[Any, ...]] = []
    merged: list[tuple[Any, ...]] = []  # each loop's windows, given to the builder once every loop was regular
    try:
        for ranks in groups:
            with engine.one_thread():  # (a group's few ten thousand rows)
                engine.execute("DROP TABLE IF EXISTS findings_positions")  # (the last group's)
                engine.temp_table("findings_reports", f"SELECT *, coalesce(v2, -1) AS start, {N_EFF} AS n "
                                                      f"FROM {reports} WHERE rank IN {ranks}")
                mine = _loops(engine)
                if not all(row[5] for row in mine):
                    return False
                loops += mine
                blocks: dict[tuple[int, int, int], list[tuple[Any, ...]]] = {}
                raw: dict[tuple[int, int, int, int], tuple[Any, list[Any]]] = {}
                _merge(engine, level, blocks, raw)
                merged += [_loop_windows(row, blocks, raw, origin) for row in mine]
                del blocks, raw
    finally:
        engine.execute("DROP TABLE IF EXISTS findings_reports")
        engine.execute("DROP TABLE IF EXISTS findings_positions")
    if [(int(r), int(p), int(s), int(n)) for r, p, s, n, *_ in loops] != \
            [(int(r), int(p), int(s), int(n)) for r, p, s, n, _, _ in order] \
            or min(int(row[6]) for row in loops) != first:
        return False  # (the run changed between the queries: a run being written)
    store.level = level
    for key, rank, host, warmup, windows, n, steady in merged:
        builder.host(rank, host)
        builder.put_loop(key, rank, warmup, windows, n, steady)
    return True


def _loop_windows(loop: tuple[Any, ...], blocks: dict[tuple[int, int, int], list[tuple[Any, ...]]],
                  raw: dict[tuple[int, int, int, int], tuple[Any, list[Any]]], origin: int) -> tuple[Any, ...]:
    """A loop's (``_loops`` row) windows from its blocks' sums (``_merge``), their times from ``origin``: what
    ``InputBuilder.host`` and ``put_loop`` are given."""
    rank, pid, start, n, _, _, _, steady, host = loop
    rank, pid, start, n = int(rank), int(pid), int(start), int(n)
    wall0, v0 = raw[(rank, pid, start, -1)]
    w0 = window_point_of_values(rank, v0, warmup=True, time_s=(wall0 - origin) / 1e9)
    windows = []
    for _, _, _, pos, count, merged, step, wall, mx, *summed in blocks.get((rank, pid, start), []):
        time_s = (wall - origin) / 1e9
        if merged == 1:
            _, v1 = raw[(rank, pid, start, int(pos))]
            w1 = window_point_of_values(rank, v1, warmup=False, time_s=time_s)
            assert w1 is not None
            windows.append(hold(int(wall), w1))
            continue
        by = dict(zip(_SUMMED, summed, strict=True))
        on_device = by["pit"] is not None
        last = window_point_of_values(rank, [step, 1, start, 1.0] + [None] * (len(WINDOW_POINT_KEYS) - 4),
                                      warmup=False, time_s=time_s)
        assert last is not None
        figures = {
            "iterations": int(count), "windows": int(merged), "time": by["t"], "max": mx, "p50": by["p50"],
            "wall": by["wall"], "cpu_wait": by["cwait"], "cpu": by["cpu"], "comm": by["comm"],
            "thread_cpu_wait": by["tcwait"], "thread_cpu": by["tcpu"],
            "phases": {p: by[f"ph{i}"] for i, p in enumerate(PHASES) if by[f"ph{i}"] is not None},
            "comm_wait_by_phase": {p: by[f"w{i}"] for i, p in enumerate(_WAIT_NAMES) if by[f"w{i}"] is not None},
            "phase_iteration_time": by["pit"], "phase_clock": DEVICE if on_device else HOST, "world": by["world"]}
        windows.append(hold_sums(int(wall), last, figures))  # (packed: the loops are all given at the end)
    return ((rank, pid, start), rank, host, None if w0 is None else (int(wall0), w0), windows, n,
            None if steady is None else int(steady))


N_EFF = "(CASE WHEN v1 > 0 THEN v1 ELSE 1 END)"  # a window's iterations as window_point counts them


def _loops(engine: Any) -> list[tuple[Any, ...]]:
    """The loops of ``findings_reports`` in feeding order: rank, pid, start, reports after the warm-up, the first's
    place, whether regular, the earliest wall time, the steady state's (``InputBuilder.steady_ns``), the host."""
    usable = "coalesce(v3 > 0 AND v0 IS NOT NULL, false)"
    dev, host, waits = _mask(_DEV), _mask(_HOST), _mask(_WAITS)
    return list(engine.rows(f"""
        WITH r AS (SELECT rank, pid, start, wall_ns, host, {usable} AS ok, v0, v0 - n + 1 AS first_step,
                          {dev} AS dm, CASE WHEN ({dev}) > 0 THEN -1 ELSE {host} END AS keys, {waits} AS wm,
                          row_number() OVER (PARTITION BY rank ORDER BY pid, segment, line) AS ord
                   FROM findings_reports),
        s AS (SELECT *, row_number() OVER l - 1 AS seq, lag(v0) OVER l AS prev, lag(dm > 0) OVER l AS prev_dev,
                     lag(keys) OVER l AS prev_keys, lag(wm) OVER l AS prev_wm, lag(dm) OVER l AS prev_dm
              FROM r WINDOW l AS (PARTITION BY rank, pid, start ORDER BY ord))
        SELECT rank, pid, start, count(*) - 1 AS positions, min(ord) AS first_at,
               bool_and(seq = 0 OR ok) AND bool_and(seq <= 1 OR (first_step = prev + 1 AND (dm > 0) = prev_dev
                 AND keys = prev_keys AND (keys <> -1 OR dm = prev_dm) AND wm = prev_wm))
                 AND max(ord) - min(ord) + 1 = count(*) AS regular,
               min(wall_ns) AS first_wall, min(wall_ns) FILTER (WHERE seq > 0 AND ok) AS steady,
               arg_min(host, ord) AS host
        FROM s GROUP BY rank, pid, start ORDER BY rank, first_at"""))


def _merge(engine: Any, level: int, blocks: dict[tuple[int, int, int], list[tuple[Any, ...]]],
           raw: dict[tuple[int, int, int, int], tuple[Any, list[Any]]]) -> None:
    """The blocks of ``findings_reports`` at ``level`` (their sums) into ``blocks``, by loop; each loop's warm-up
    report and a lone report of a last block into ``raw`` (position -1: the warm-up).

    Each report's position in its loop comes from a window over the keys alone (``findings_positions``: a window
    over the wide rows held all of them again, +25-30 MiB), joined back on the row id; each level is a materialized
    CTE, the level below held only while its blocks are joined."""
    dev = _mask(_DEV)
    phase = ", ".join(f"CASE WHEN dm > 0 THEN v{d} ELSE v{h} END * n AS ph{i}"
                      for i, (d, h) in enumerate(zip(_DEV, _HOST, strict=True)))
    wsum = ", ".join(f"v{i} * n AS w{k}" for k, i in enumerate(_WAITS))
    engine.temp_table("findings_positions", "SELECT rowid AS rid, row_number() OVER (PARTITION BY rank, pid, start "
                      "ORDER BY segment, line) - 2 AS pos, count(*) OVER (PARTITION BY rank, pid, start) - 1 AS "
                      "positions FROM findings_reports")
    # (joined back on the table's row id: one row each, whatever NULLs a file's name left in pid or segment)
    numbered = ("(SELECT r.*, p.pos, p.positions FROM findings_reports r JOIN findings_positions p "
                "ON r.rowid = p.rid)")
    levels = [f"""l0 AS NOT MATERIALIZED (
        SELECT rank, pid, start, pos, n, 1 AS windows, v0 AS step, wall_ns, v4 AS mx, v3 * n AS t, {phase},
               v5 * n AS p50, v6 AS wall, v7 AS cwait, v8 AS cpu, v9 * n AS comm, {wsum},
               CASE WHEN dm > 0 THEN coalesce(v10, v3) * n END AS pit,
               v{_THREAD[0]} AS tcwait, v{_THREAD[1]} AS tcpu, v{_WORLD} * n AS world
        FROM (SELECT *, {dev} AS dm FROM {numbered} WHERE pos >= 0))"""]
    for lv in range(1, level + 1):
        below = f"l{lv - 1}"
        # a block and the next (``o``), when there is one: the lone last block of a loop stays as it is
        sums = ", ".join(f"CASE WHEN o.pos IS NULL THEN e.{c} ELSE e.{c} + o.{c} END AS {c}" for c in _SUMMED)
        levels.append(f"""l{lv} AS {'MATERIALIZED' if lv < level else 'NOT MATERIALIZED'} (
            SELECT e.rank, e.pid, e.start, e.pos, e.n + coalesce(o.n, 0) AS n,
                   e.windows + coalesce(o.windows, 0) AS windows,
                   CASE WHEN o.pos IS NULL THEN e.step ELSE o.step END AS step,
                   CASE WHEN o.pos IS NULL THEN e.wall_ns ELSE o.wall_ns END AS wall_ns,
                   CASE WHEN o.mx IS NULL OR e.mx >= o.mx THEN coalesce(e.mx, o.mx) ELSE o.mx END AS mx, {sums}
            FROM (SELECT * FROM {below} WHERE (pos >> {lv - 1}) & 1 = 0) e
            LEFT JOIN (SELECT * FROM {below} WHERE (pos >> {lv - 1}) & 1 = 1) o
              ON e.rank = o.rank AND e.pid IS NOT DISTINCT FROM o.pid AND e.start = o.start
                 AND e.pos >> {lv} = o.pos >> {lv})""")
    for row in engine.rows(f"WITH {', '.join(levels)} SELECT * FROM l{level} ORDER BY rank, pid, start, pos"):
        blocks.setdefault((int(row[0]), int(row[1]), int(row[2])), []).append(row)
    values = ", ".join(f"v{i}" for i in range(len(WINDOW_POINT_KEYS)))
    for rank, pid, start, pos, wall, *v in engine.rows(
            f"SELECT rank, pid, start, pos, wall_ns, {values} FROM {numbered} WHERE pos = -1 OR "
            f"(positions - (positions >> {level} << {level}) = 1 AND pos = positions - 1)"):
        raw[(int(rank), int(pid), int(start), int(pos))] = (wall, v)
