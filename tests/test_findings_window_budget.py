"""The findings engine's report windows, bounded (``findings.window_budget``): past the budget, consecutive windows
of a rank are merged pairwise, so the windows held do not grow with the run's length; the merge's arithmetic; what
is never merged; the same windows whatever the order the ranks are fed in; planted problems still found on merged
windows, synthetic and through a real run store on both readers."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from telemetrain.analysis.findings import FindingsInput, InputBuilder, WindowPoint, analyse, window_point
from telemetrain.analysis.findings import window_budget as wb
from telemetrain.analysis.findings.window_budget import WindowStore, merge_windows, mergeable

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

PHASES = {"dataloader": 0.01, "forward": 0.03, "backward": 0.05, "optimizer": 0.01}


def report(step: int, n: int, t: float, **extra: float) -> dict[str, float]:
    """A ``training_metrics_update``'s attributes (the recorder's names) for a window of ``n`` iterations of mean
    ``t`` ending at ``step``."""
    return {"current_iteration": step, "window_iterations": n, "train_iterations_start": 0,
            "avg_iteration_time_sec": t, **extra}


def point(rank: int, step: int, t: float, *, n: int = 10, warmup: bool = False, **kw: object) -> WindowPoint:
    return WindowPoint(rank=rank, step=step, iterations=n, iteration_time=t, warmup=warmup, **kw)  # type: ignore[arg-type]


def feed(store: WindowStore, windows: list[WindowPoint], pid: int = 1) -> None:
    for w in windows:
        store.add((w.rank, pid, 0), w.rank, int(w.time_s * 1e9), w)


def loop(rank: int, count: int, *, every: int = 10, t: float = 0.1) -> list[WindowPoint]:
    """``count`` consecutive windows of one loop (the first its warm-up), ``every`` iterations each."""
    return [point(rank, (k + 1) * every - 1, t, n=every, warmup=k == 0, time_s=float(k)) for k in range(count)]


# -- the arithmetic ------------------------------------------------------------------------------------------------


@pytest.fixture
def no_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """No windows kept per rank whatever the budget (``InputBuilder`` takes the budget only)."""
    monkeypatch.setattr(wb, "MIN_WINDOWS_PER_RANK", 1)


def test_a_merged_window_weighs_its_parts_by_iterations(no_floor: None) -> None:
    """Four reports of a real loop (their attributes as the recorder writes them) merged into one at level 2: every
    figure derived here from the four, by its own rule."""
    raw = [report(19, 10, 0.10, p50_iteration_time_sec=0.09, max_iteration_time_sec=0.20, window_seconds=1.1,
                  cpu_time_sec=0.9, cpu_wait_sec=0.05, train_thread_cpu_time_sec=0.45,
                  train_thread_cpu_wait_sec=0.025, avg_forward_time_sec=0.03, avg_backward_time_sec=0.05,
                  avg_comm_wait_time_sec=0.01, avg_backward_comm_wait_sec=0.008),
           report(39, 20, 0.13, p50_iteration_time_sec=0.12, max_iteration_time_sec=0.90, window_seconds=2.7,
                  cpu_time_sec=2.0, cpu_wait_sec=0.10, train_thread_cpu_time_sec=1.0,
                  train_thread_cpu_wait_sec=0.05, avg_forward_time_sec=0.04, avg_backward_time_sec=0.06,
                  avg_comm_wait_time_sec=0.02, avg_backward_comm_wait_sec=0.015),
           report(44, 5, 0.08, p50_iteration_time_sec=0.08, max_iteration_time_sec=0.09, window_seconds=0.45,
                  cpu_time_sec=0.35, cpu_wait_sec=0.0, train_thread_cpu_time_sec=0.175,
                  train_thread_cpu_wait_sec=0.0, avg_forward_time_sec=0.02, avg_backward_time_sec=0.04,
                  avg_comm_wait_time_sec=0.0, avg_backward_comm_wait_sec=0.0),
           report(59, 15, 0.11, p50_iteration_time_sec=0.10, max_iteration_time_sec=0.30, window_seconds=1.8,
                  cpu_time_sec=1.5, cpu_wait_sec=0.2, train_thread_cpu_time_sec=0.75,
                  train_thread_cpu_wait_sec=0.1, avg_forward_time_sec=0.03, avg_backward_time_sec=0.07,
                  avg_comm_wait_time_sec=0.03, avg_backward_comm_wait_sec=0.02)]
    ns = [a["window_iterations"] for a in raw]

    def weighted(key: str) -> float:
        return math.fsum(a[key] * n for a, n in zip(raw, ns, strict=True)) / sum(ns)

    b = InputBuilder(window_budget=1)  # every window past its loop's warm-up merged as far as the loop allows
    b.window(0, 7, 10**9, report(9, 10, 0.1))  # the warm-up window, alone
    for k, a in enumerate(raw):
        b.window(0, 7, (k + 2) * 10**9, a)
    warm, merged = b.build(start_ns=0).windows
    assert warm.warmup and warm.windows == 1 and warm.step == 9
    assert merged.windows == 4 and merged.iterations == 50 and merged.step == 59 and merged.first_step == 10
    assert merged.time_s == 5.0  # the last report's
    assert merged.iteration_time == pytest.approx(weighted("avg_iteration_time_sec"), rel=1e-12)
    assert merged.p50 == pytest.approx(weighted("p50_iteration_time_sec"), rel=1e-12)
    assert merged.comm_wait == pytest.approx(weighted("avg_comm_wait_time_sec"), rel=1e-12)
    assert merged.phases == pytest.approx({"forward": weighted("avg_forward_time_sec"),
                                           "backward": weighted("avg_backward_time_sec")}, rel=1e-12)
    assert merged.comm_wait_by_phase == pytest.approx({"backward": weighted("avg_backward_comm_wait_sec")}, rel=1e-12)
    assert merged.max_iteration_time == max(a["max_iteration_time_sec"] for a in raw)
    for field, key in (("wall_seconds", "window_seconds"), ("cpu_seconds", "cpu_time_sec"),
                       ("cpu_wait_seconds", "cpu_wait_sec"), ("thread_cpu_seconds", "train_thread_cpu_time_sec"),
                       ("thread_cpu_wait_seconds", "train_thread_cpu_wait_sec")):
        assert getattr(merged, field) == pytest.approx(math.fsum(a[key] for a in raw), rel=1e-12), field
    # the contention of the merged window is that of its summed CPU figures
    cpu, wait = math.fsum(a["cpu_time_sec"] for a in raw), math.fsum(a["cpu_wait_sec"] for a in raw)
    assert merged.wait_fraction == pytest.approx(wait / (cpu + wait), rel=1e-12)


def test_a_figure_one_part_lacks_is_unknown_and_the_device_clock_is_kept() -> None:
    a = window_point(0, report(19, 10, 0.1, avg_forward_device_time_sec=0.04, avg_iteration_device_time_sec=0.09,
                                cpu_time_sec=0.9, cpu_wait_sec=0.1, train_thread_cpu_time_sec=0.5,
                                train_thread_cpu_wait_sec=0.05), warmup=False)
    b = window_point(0, report(29, 10, 0.3, avg_forward_device_time_sec=0.08, avg_iteration_device_time_sec=0.2,
                                max_iteration_time_sec=0.5), warmup=False)
    assert a is not None and b is not None and mergeable(a, b)
    m = merge_windows(a, b)
    assert m.phase_clock == "device" and m.phases == pytest.approx({"forward": 0.06})
    assert m.phase_iteration_time == pytest.approx((0.09 + 0.2) / 2)
    assert m.cpu_seconds is None and m.cpu_wait_seconds is None and m.wait_fraction is None  # b has no CPU figures
    assert m.thread_cpu_seconds is None and m.thread_cpu_wait_seconds is None
    assert m.max_iteration_time == 0.5  # the slowest known iteration
    assert m.p50 is None


def test_never_merged_across_a_warm_up_a_restart_a_gap_or_a_change(no_floor: None) -> None:
    ok = point(0, 19, 0.1)
    assert mergeable(ok, point(0, 29, 0.1))
    assert not mergeable(point(0, 9, 0.1, warmup=True), point(0, 19, 0.1))  # the warm-up window
    assert not mergeable(ok, point(0, 39, 0.1))  # steps 20..29 are in no window: a gap
    assert not mergeable(ok, point(0, 29, 0.1, phases={"forward": 0.03}))  # other figures
    assert not mergeable(ok, point(1, 29, 0.1))  # another rank
    store = WindowStore(budget=1, min_per_rank=1)
    feed(store, loop(0, 9))  # one loop: its warm-up, then 8 windows merged into one
    feed(store, loop(0, 9), pid=2)  # a restart (another pid): its own warm-up and windows
    gap = loop(0, 9)
    gap[5] = point(0, gap[5].step + 1000, 0.1, time_s=5.0)  # steps jump: windows 1..4 | 5 | 6..8
    feed(store, gap, pid=3)
    held = [(w.step, w.windows, w.warmup) for _, w in store.windows()]
    assert held[:4] == [(9, 1, True), (89, 8, False), (9, 1, True), (89, 8, False)]
    assert held[4:] == [(9, 1, True), (49, 4, False), (1059, 1, False), (89, 3, False)]
    b = InputBuilder(window_budget=1)
    for k in range(9):  # a report without a usable mean parts its neighbours too
        b.window(0, 1, k, report(k * 10 + 9, 10, 0.0 if k == 4 else 0.1))
    assert [(w.step, w.windows) for w in b.build().windows] == [(9, 1), (39, 3), (89, 4)]


# -- the bound -------------------------------------------------------------------------------------------------------


def test_the_windows_held_stay_within_the_budget_however_long_the_run(no_floor: None) -> None:
    """Streaming 4 ranks' windows (interleaved, as a time-ordered reader would): the held count never passes the
    budget plus each loop's warm-up and partial block (a few windows), whether the run is 10 or 40 times the budget;
    the resolution halves instead."""
    budget = 400
    levels = {}
    for per_rank in (1_000, 4_000):
        b = InputBuilder(window_budget=budget)
        most = 0
        for k in range(per_rank):
            for rank in range(4):
                b.window(rank, rank, k, report(k * 10 + 9, 10, 0.1))
            if k % 50 == 0:
                most = max(most, b.windows_held())
        windows = b.build().windows
        slack = 4 * (1 + b._store.level)  # each loop's warm-up and its partial block's sub-blocks
        assert most <= budget + slack and len(windows) <= budget + 4 * 2
        assert len(windows) > budget / 4  # merged no further than needed
        assert sum(w.iterations for w in windows) == 4 * per_rank * 10  # every iteration still counted
        levels[per_rank] = b._store.level
    assert levels[4_000] == levels[1_000] + 2


def test_many_ranks_keep_a_floor_each_and_ordinary_runs_are_not_merged() -> None:
    """The default budget: 8 ranks x 8,000 windows (400,000 iterations at the recorder's 50 an window) held as
    written; past 1,024 ranks each rank keeps at least ``MIN_WINDOWS_PER_RANK``."""
    store = WindowStore()
    for rank in range(8):
        feed(store, loop(rank, 8_000, every=50))
    assert store.level == 0 and len(store) == 64_000
    store = WindowStore(budget=1_000, min_per_rank=16)
    ranks, per_rank = 256, 200
    for rank in range(ranks):
        feed(store, loop(rank, per_rank))
    held = len(store)
    # 199 windows after each warm-up: the first level whose complete blocks (and the loop) fit 16 per rank (far
    # above the budget: 1,000 over 256 ranks would be under 4 each)
    assert store.level == min(level for level in range(9) if ((per_rank - 1) >> level) + 1 <= 16) == 4
    assert 8 * ranks < held <= 16 * ranks + ranks * (1 + store.level)


def test_the_windows_held_do_not_depend_on_the_order_the_ranks_are_fed_in() -> None:
    """Rank by rank (the readers) or interleaved (a time-ordered feed), with gaps and a rank that stops early: the
    same level and the same windows, bit for bit."""
    rng = random.Random(7)
    per_rank = {r: loop(r, 300 if r != 2 else 170) for r in range(5)}
    for r, ws in per_rank.items():
        per_rank[r] = [point(r, w.step, 0.1 * rng.lognormvariate(0, 0.1), warmup=w.warmup, time_s=w.time_s,
                             p50=0.1, cpu_seconds=rng.random(), cpu_wait_seconds=0.01) for w in ws]
    per_rank[3][100] = point(3, per_rank[3][100].step + 5, 0.1, time_s=100.0)  # a gap on one rank
    by_rank, interleaved = WindowStore(budget=300), WindowStore(budget=300)
    for r in (4, 3, 2, 1, 0):
        feed(by_rank, per_rank[r])
    for k in range(300):
        for r in range(5):
            if k < len(per_rank[r]):
                feed(interleaved, [per_rank[r][k]])
    assert by_rank.level == interleaved.level == 3  # 37 complete blocks of 8 and the loop: under 64 a rank
    assert sorted(by_rank.windows(), key=lambda x: (x[1].rank, x[1].step)) == \
        sorted(interleaved.windows(), key=lambda x: (x[1].rank, x[1].step))


# -- planted problems on merged windows -----------------------------------------------------------------------------


def _job(ranks: int, count: int, *, slow_from: int, straggler: tuple[int, int, int]) -> list[WindowPoint]:
    """``count`` windows of 10 iterations per rank: every rank 1.6x slower from window ``slow_from``; rank
    ``straggler[0]`` 0.015 s slower in forward from window ``straggler[1]`` to ``straggler[2]`` (the others wait
    for it in backward)."""
    rng = random.Random(3)
    out = []
    for k in range(count):
        scale = 1.6 if k >= slow_from else 1.0
        late = straggler[1] <= k < straggler[2]
        for r in range(ranks):
            phases = {p: v * scale * rng.lognormvariate(0, 0.03) for p, v in PHASES.items()}
            if late:
                phases["forward" if r == straggler[0] else "backward"] += 0.015
            it = sum(phases.values())
            out.append(WindowPoint(rank=r, step=(k + 1) * 10 - 1, iterations=10, iteration_time=it, phases=phases,
                                   max_iteration_time=it * 1.2, p50=it, wall_seconds=10 * it, cpu_seconds=9 * it,
                                   cpu_wait_seconds=0.01, warmup=k == 0, time_s=float(k)))
    return out


def test_a_planted_slowdown_and_straggler_are_found_on_merged_windows() -> None:
    """4 ranks x 4,000 windows, a budget of 2,000: windows of 8 reports. The slowdown (from step 25,000) and the
    straggler (rank 2, steps 10,000..16,000) found as on the windows as written, at their steps to within a merged
    window."""
    windows = _job(4, 4_000, slow_from=2_500, straggler=(2, 1_000, 1_600))
    store = WindowStore(budget=2_000)
    for w in windows:
        store.add((w.rank, 1, 0), w.rank, int(w.time_s * 1e9), w)
    assert store.level == 3
    merged = [w for _, w in store.windows()]
    assert len(merged) <= 2_000 + 4 * 4
    for data in (windows, merged):
        found = {f.kind: f for f in analyse(FindingsInput(windows=data)).findings}
        assert set(found) == {"slowdown", "straggler"}, found
        slow, late = found["slowdown"], found["straggler"]
        assert slow.evidence is not None and slow.evidence.steps is not None
        assert abs(slow.evidence.steps[0] - 25_000) <= 80
        assert slow.evidence.effect == pytest.approx(1.6, rel=0.05)
        assert late.evidence is not None and late.evidence.ranks == (2,) and late.evidence.phase == "forward"
        assert late.evidence.steps is not None
        assert abs(late.evidence.steps[0] - 10_000) <= 80 and abs(late.evidence.steps[1] - 16_000) <= 80


# -- a real run store, both readers ---------------------------------------------------------------------------------


def _long_run(root: Path) -> Path:
    """3 ranks x 3,000 steps, a report every 10 (the recorder's attributes): every rank 1.6x slower from step
    1,800; rank 2 slower in forward at steps 600..1,199 (the others wait in backward); one 3 s iteration on rank 0
    in the window ending at step 2,509."""
    from telemetrain import Telemetry, identity_from_env

    for rank in range(3):
        t = Telemetry(identity_from_env({}, run_id="long", session_tag="s", perf_tag="p", rank=rank, world_size=3),
                      store=root)
        for step in range(9, 3000, 10):
            scale = 1.6 if step >= 1800 else 1.0
            jitter = 1 + 0.01 * ((step * 7 + rank) % 5)
            phases = {p: v * scale * jitter for p, v in PHASES.items()}
            if 600 <= step < 1200:
                phases["forward" if rank == 2 else "backward"] += 0.015
            it = sum(phases.values())
            t.event("training_metrics_update", {
                "current_iteration": step, "window_iterations": 10, "train_iterations_start": 0,
                "avg_iteration_time_sec": it, "p50_iteration_time_sec": it,
                "max_iteration_time_sec": 3.0 if (rank, step) == (0, 2509) else 1.2 * it,
                **{f"avg_{p}_time_sec": v for p, v in phases.items()}, "window_seconds": 10 * it,
                "cpu_time_sec": 9 * it, "cpu_wait_sec": 0.01}, group="training")
            t.metric("loss", 2.0 / (1 + step / 500), step=step)
        assert t.close(30)
    return root / "s" / "long"


def test_a_long_real_run_merged_past_the_budget_gives_the_same_findings_on_both_readers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real run store read by the pure-Python path and by SQL (its Parquet copy), with a budget it passes: both
    hold the same merged windows and give the same report, show and findings; the planted slowdown and straggler
    are among them."""
    pytest.importorskip("duckdb")
    from telemetrain.analysis.show_sql import findings_builder_sql
    from telemetrain.store import open_run
    from telemetrain.store.engine import Engine
    from test_engine_parity import _both_paths

    run_dir = _long_run(tmp_path)
    monkeypatch.setattr(wb, "WINDOW_BUDGET", 96)
    python = InputBuilder()
    for log in open_run(run_dir).processes:
        for record in log.records:
            python.add(record)
    with Engine([run_dir]) as engine:
        sql = findings_builder_sql(engine, open_run(run_dir))
    py_windows, sql_windows = python.build().windows, sql.build().windows
    # 299 reports after each rank's warm-up: blocks of 8 (38 held per rank, under MIN_WINDOWS_PER_RANK)
    assert python._store.level == sql._store.level == 3
    # both hold their complete blocks packed (window_budget._pack; the SQL path's given so by put_loop)
    assert all(type(p) is bytes for b in (python, sql) for loop in b._store._loops.values() for p in loop.done)
    assert py_windows == sql_windows and max(w.windows for w in py_windows) == 8
    model, show = _both_paths(run_dir, True, monkeypatch)
    found = {f.kind: f for f in model.findings}
    assert {"slowdown", "straggler"} <= set(found), found
    slow, late = found["slowdown"], found["straggler"]
    assert slow.evidence is not None and abs(slow.evidence.steps[0] - 1800) <= 80
    assert late.evidence is not None and late.evidence.ranks == (2,) and late.evidence.phase == "forward"
    assert any("slowdown" in line for line in show)
    # the slow iteration: found in a merged window, and the chart marks the report window that held it
    stall = found["slow iterations"]
    assert stall.evidence is not None and stall.evidence.value == 3.0 and stall.evidence.ranks == (0,)
    merged = next(w for w in py_windows if w.rank == 0 and w.first_step <= 2509 <= w.step)
    assert merged.windows == 8 and merged.step != 2509
    assert [(w.rank, w.iteration, w.max) for w in model.slow_windows] == [(0, 2509, 3.0)]


# -- what the SQL readers extract of a report -------------------------------------------------------------------------


class _Recording(dict):  # type: ignore[type-arg]
    """A report's attributes that note every key read."""

    read: set[str] = set()

    def get(self, key: str, default: object = None) -> object:
        _Recording.read.add(key)
        return super().get(key, default)


def test_the_sql_readers_extract_every_attribute_the_engine_reads() -> None:
    """``WINDOW_POINT_KEYS`` (what DuckDB extracts of a report for the SQL readers) holds every attribute that
    ``InputBuilder.window`` and ``window_point`` read, for reports with and without device times."""
    from telemetrain.analysis.findings.builder import WINDOW_POINT_KEYS

    _Recording.read = set()
    for extra in ({}, {"avg_forward_device_time_sec": 0.02, "avg_iteration_device_time_sec": 0.09}):
        b = InputBuilder()
        b.window(0, 1, 1, _Recording(report(9, 10, 0.1, **extra)))
    assert _Recording.read <= set(WINDOW_POINT_KEYS)
    assert {"current_iteration", "train_iterations_start", "avg_backward_comm_wait_sec", "avg_other_comm_wait_sec",
            "avg_h2d_device_time_sec", "avg_iteration_device_time_sec", "cpu_wait_sec",
            "train_thread_cpu_wait_sec", "train_thread_cpu_time_sec"} <= _Recording.read


def test_odd_report_attributes_make_the_same_windows_on_both_readers(tmp_path: Path) -> None:
    """Reports whose attributes are of the wrong type (a bool, a float step, a string, NaN, a list) make the same
    windows (or none) by SQL, where DuckDB types them, as by the pure-Python path."""
    pytest.importorskip("duckdb")
    from telemetrain import Telemetry, identity_from_env
    from telemetrain.analysis.show_sql import findings_builder_sql
    from telemetrain.store import open_run
    from telemetrain.store.compact import compact
    from telemetrain.store.engine import Engine

    odd: list[dict[str, object]] = [
        {"current_iteration": 9.0}, {"current_iteration": True}, {"window_iterations": 10.0},
        {"window_iterations": True}, {"window_iterations": -3}, {"train_iterations_start": True},
        {"train_iterations_start": "0"}, {"avg_iteration_time_sec": math.nan}, {"avg_iteration_time_sec": "0.1"},
        {"avg_iteration_time_sec": True}, {"avg_forward_time_sec": math.inf}, {"avg_forward_time_sec": [0.1]},
        {"cpu_time_sec": False}, {"p50_iteration_time_sec": None}, {"avg_other_comm_wait_sec": {"x": 1}},
        {"train_thread_cpu_wait_sec": "0.1"}, {"train_thread_cpu_time_sec": math.nan}]
    t = Telemetry(identity_from_env({}, run_id="odd", session_tag="s", perf_tag="p", rank=0, world_size=1),
                  store=tmp_path)
    for k in range(60):
        attributes: dict[str, object] = {**report(k * 10 + 9, 10, 0.1 + 0.001 * k), "avg_forward_time_sec": 0.03,
                                         "cpu_time_sec": 0.9, "cpu_wait_sec": 0.01,
                                         "train_thread_cpu_time_sec": 0.7, "train_thread_cpu_wait_sec": 0.004}
        attributes.update(odd[k % len(odd)] if k % 2 else {})
        t.event("training_metrics_update", attributes, group="training")
    assert t.close(30)
    run_dir = tmp_path / "s" / "odd"
    python = InputBuilder()
    for log in open_run(run_dir).processes:
        for record in log.records:
            python.add(record)
    for compacted in (False, True):
        if compacted:
            assert not compact(run_dir).errors
        with Engine([run_dir]) as engine:
            sql = findings_builder_sql(engine, open_run(run_dir)).build().windows
        assert sql == python.build().windows, compacted
    assert 30 < len(sql) < 60  # some reports made no window, most did


def test_a_sql_readers_typed_values_make_the_window_the_attributes_make() -> None:
    """``window_point_of_values`` (a SQL reader's row: the report typed by ``store.report_rows`` as compaction and
    the engine type it, then ``findings_sql.window_fields_sql`` and ``window_values_sql``, no mapping per report)
    makes the window ``window_point`` makes of the same attributes: device or host phases, communication waits,
    missing, non-finite and mistyped figures."""
    duckdb = pytest.importorskip("duckdb")
    import json

    from telemetrain.analysis.findings.builder import WINDOW_POINT_KEYS, window_point_of_values
    from telemetrain.analysis.findings_sql import window_fields_sql, window_values_sql
    from telemetrain.store.codec import untag_nonfinite
    from telemetrain.store.columnar import COLUMNS
    from telemetrain.store.report_rows import report_rows_sql

    rng = random.Random(3)
    odd: list[object] = [None, True, "0.1", [1], math.nan, math.inf, 0, -1, 2.5, 2**40]
    texts = []
    for k in range(400):
        a: dict[str, object] = dict(report(k * 10 + 9, 10, 0.1 + 0.001 * k))
        for key in rng.sample(WINDOW_POINT_KEYS, rng.randrange(0, 12)):
            a[key] = rng.choice(odd) if rng.random() < 0.4 else rng.random() * 0.1
        if rng.random() < 0.2:
            del a["avg_iteration_time_sec"]
        texts.append(json.dumps({k: ({"$float": repr(v).replace("nan", "NaN").replace("inf", "Infinity")}
                                     if isinstance(v, float) and not math.isfinite(v) else v)
                                 for k, v in a.items()}))
    con = duckdb.connect()
    con.execute("CREATE TABLE r (" + ", ".join(f'"{n}" {t}' for n, t in COLUMNS["events"]) + ")")
    con.executemany("INSERT INTO r (line, group_name, name, attributes) VALUES (?, 'training', "
                    "'training_metrics_update', ?)", list(enumerate(texts)))
    rows = con.execute(f"SELECT line, {window_values_sql()} FROM (SELECT line, {window_fields_sql()} FROM "
                       f"({report_rows_sql('r')})) ORDER BY line").fetchall()
    made = 0
    for (i, *values), text in zip(rows, texts, strict=True):
        expected = window_point(3, untag_nonfinite(json.loads(text)), warmup=i % 5 == 0, time_s=i / 7)
        assert window_point_of_values(3, values, warmup=i % 5 == 0, time_s=i / 7) == expected, text
        made += expected is not None and expected.phase_clock == "device"
    assert made > 20  # device-clocked windows among them


def test_the_level_of_regular_loops_follows_from_their_counts() -> None:
    """``WindowStore.regular_level`` (the level from each loop's report count, for loops whose reports all join) is
    the level the store reaches when fed those reports one by one, in that order."""
    rng = random.Random(5)
    for trial in range(60):
        budget, floor = rng.choice([(8, 1), (20, 2), (50, 4), (100, 3)])
        counts = [0, 1, 2, 7, 30, 64, 65, 200, 333]
        loops = [(rng.randrange(0, 5), rng.choice(counts)) for _ in range(rng.randrange(1, 9))]
        loops.sort(key=lambda x: x[0])  # rank by rank, as the readers feed them
        store = WindowStore(budget, floor)
        for pid, (rank, n) in enumerate(loops):
            feed(store, loop(rank, n + 1), pid=pid)
        assert WindowStore(budget, floor).regular_level(loops) == store.level, (trial, budget, floor, loops)


def _sql_reports(loops: list[tuple[int, int, int, list[list[object]]]]) -> DuckDBPyConnection:
    """A DuckDB table ``reps`` of reports (the engine's ``reports`` rows: events typed by ``store.report_rows``):
    loops as (rank, pid, start, values), values in ``WINDOW_POINT_KEYS``' order (None: no such attribute)."""
    duckdb = pytest.importorskip("duckdb")
    import json

    from telemetrain.analysis.findings.builder import WINDOW_POINT_KEYS
    from telemetrain.store.columnar import COLUMNS, PARTITIONS
    from telemetrain.store.report_rows import report_rows_sql

    con: DuckDBPyConnection = duckdb.connect()
    con.execute("CREATE TABLE raw (" + ", ".join(f'"{n}" {t}' for n, t in COLUMNS["events"] + PARTITIONS) + ")")
    rows: list[tuple[int, int, int, int, int, str, str]] = []
    for rank, pid, _, reports in loops:
        for k, v in enumerate(reports):
            text = json.dumps({key: x for key, x in zip(WINDOW_POINT_KEYS, v, strict=True) if x is not None})
            rows.append((rank, pid, k // 7, len(rows), 10**9 * (rank + 1) + 10**6 * len(rows), f"h{rank}", text))
    con.executemany("INSERT INTO raw (rank, pid, segment, line, wall_ns, host, attributes, group_name, name) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, 'training', 'training_metrics_update')", rows)
    con.execute(f"CREATE TABLE reps AS {report_rows_sql('raw', partitions=True)}")
    return con


def test_windows_merged_by_sql_are_the_stores_to_the_last_bit() -> None:
    """``findings_windows_sql.feed_windows_sql`` (DuckDB merges a regular run's windows, pairwise per level) holds
    the windows the store holds when fed the same reports one by one: iteration-weighted means, unknown figures,
    device and host clocks, restarts, partial last blocks, a lone last report; and declines an irregular run."""
    pytest.importorskip("duckdb")
    import json

    from telemetrain.analysis.findings.builder import WINDOW_POINT_KEYS
    from telemetrain.analysis.findings_sql import rank_groups
    from telemetrain.analysis.findings_windows_sql import feed_windows_sql
    from test_findings_spikes import Connection

    nkeys = len(WINDOW_POINT_KEYS)
    rng = random.Random(11)

    def loop_reports(count: int, device: bool, start: int) -> list[list[object]]:
        out, step = [], start - 1
        for _ in range(count):
            n = rng.randrange(1, 60)
            step += n
            v: list[object] = [None] * nkeys
            v[0], v[1], v[2], v[3] = step, n, start, rng.uniform(0.05, 0.2)
            v[4] = rng.uniform(0.2, 0.5)
            v[5] = None if rng.random() < 0.05 else rng.uniform(0.05, 0.2)
            v[6], v[7], v[8] = n * 0.1 + rng.random(), rng.random() / 10, None if rng.random() < 0.02 else rng.random()
            v[9] = rng.uniform(0, 0.01)
            if device:
                v[10] = None if rng.random() < 0.1 else rng.uniform(0.05, 0.2)
                for i in (11, 13, 14):
                    v[i] = rng.uniform(0.001, 0.05)
            for i in (17, 19, 20, 21):
                v[i] = rng.uniform(0.001, 0.05)
            v[23] = v[29] = rng.uniform(0, 0.003)
            # the training thread's CPU wait and time (the last two keys)
            v[nkeys - 2], v[nkeys - 1] = rng.random() / 20, None if rng.random() < 0.02 else rng.random() / 2
            out.append(v)
        return out

    for trial in range(6):
        loops = []
        for rank in range(3):
            for pid in range(rng.choice([1, 1, 2])):
                loops.append((rank, 100 + pid, 0, loop_reports(rng.randrange(150, 420), rng.random() < 0.4, 1)))
        if trial == 5:  # a gap: declined, fed report by report
            loops[0][3][50][0] = int(loops[0][3][50][0]) + 5  # type: ignore[call-overload]
            for v in loops[0][3][51:]:
                v[0] = int(v[0]) + 5  # type: ignore[call-overload]
        con = _sql_reports(loops)
        budget = rng.choice([100, 200, 500])
        # the time origin: the reader's (report), the earliest record seen before (show), or the earliest report
        # (the SQL path takes it before the groups are read and places each group's windows from it)
        python = InputBuilder(window_budget=budget)
        sql = InputBuilder(window_budget=budget)
        for builder in (python, sql):
            if trial % 3 == 0:
                builder.origin(0)
            elif trial % 3 == 1:
                builder.seen(10**9 - 12_345)
        ordered = con.execute(
            "SELECT rank, pid, wall_ns, attributes FROM raw ORDER BY rank, pid, segment, line")
        for rank, pid, wall, text in ordered.fetchall():
            python.window(rank, pid, wall, json.loads(text))  # the pure-Python reader's path
        counts = con.execute("SELECT rank, count(*) FROM reps GROUP BY rank ORDER BY rank").fetchall()
        took = feed_windows_sql(sql, Connection(con), "reps", "true", counts, rank_groups(counts, 400))
        assert took == (trial != 5)
        if not took:
            continue
        assert python._store.level >= 1 and sql._store.level == python._store.level
        assert sql.steady_ns() == python.steady_ns()  # (windows_held counts a partial block by its sub-blocks)
        assert sql.origin_ns() == python.origin_ns()
        held = list(sql._store.windows())  # their times as placed while fed, before build re-bases any
        assert repr(held) == repr(list(python._store.windows())) and held
        mine, theirs = sql.build(start_ns=0).windows, python.build(start_ns=0).windows
        assert mine == theirs
        assert repr(mine) == repr(theirs)  # (floats to the last bit, -0.0 and key order included)
