"""Every reader through DuckDB gives what the pure-Python reader gives, on the same runs: the report's model and page,
``show``, goodput of a restarted session (each rank), compare's series. From the JSONL (nothing compacted yet), from
the Parquet copy, and with damaged lines; the SQL path must not read the records into Python. Also: a run queried
while it is being written, and the lone-surrogate rule."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

duckdb = pytest.importorskip("duckdb")

from conftest import logged_queries  # noqa: E402
from telemetrain import Telemetry, identity_from_env  # noqa: E402
from telemetrain.analysis.samples import read_samples  # noqa: E402
from telemetrain.analysis.summary import summarize_run, summarize_sql  # noqa: E402
from telemetrain.cli import summarize  # noqa: E402
from telemetrain.report import curves_sql  # noqa: E402
from telemetrain.report.html import render  # noqa: E402
from telemetrain.report.model import build_model  # noqa: E402
from telemetrain.store import open_run  # noqa: E402
from telemetrain.store.compact import COLUMNAR_DIR, compact  # noqa: E402
from telemetrain.store.engine import ColumnarWarning, Engine  # noqa: E402
from telemetrain.training import goodput_sql  # noqa: E402
from telemetrain.training.goodput import goodput_by_rank  # noqa: E402
from test_report import _write_session  # noqa: E402  (the report's session, with its planted problems)

pytestmark = pytest.mark.filterwarnings("ignore:telemetrain. sink 'broken' failed")

PY = sys.executable


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    runs = _write_session(tmp_path_factory.mktemp("store"))
    for run in runs:  # damage both runs the same way: lines each reader must skip and count
        f = sorted(run.glob("rank-1.*.jsonl"))[0]
        with open(f, "a") as fh:
            fh.write('{"v":1,"kind":"metric","mono_ns":"5","wall_ns":1,"group":"g","name":"n","value":1}\n'
                     '{"v":1,"kind":"event","mono_ns":5,"wall_ns":1,"group":"g","name":"n","severity":"info",'
                     '"attributes":[1],"event_id":"","span_id":""}\nnot json\n')
    return runs


@pytest.fixture
def python_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    yield
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two values differ: floats compared to 1e-9 (SQL sums in another order), NaN equal to NaN."""
    if isinstance(a, bool) or isinstance(b, bool):
        return [] if a == b and type(a) is type(b) else [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            if (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
                return []
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(map(repr, set(a) ^ set(b)))[:5]}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}[{k!r}]")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b) and type(a) is type(b):
        return [d for f in dataclasses.fields(a) for d in differences(getattr(a, f.name), getattr(b, f.name),
                                                                      f"{path}.{f.name}")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _page(model: Any) -> str:
    return re.sub(r"generated [^&<]*", "", render(model))


def _python_and_sql(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, Any]:
    """(model, show lines) by both paths, and whether the SQL path read any record in Python."""
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    run = open_run(run_dir)
    python = (build_model(run), summarize(open_run(run_dir)))
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    run = open_run(run_dir)
    with Engine([run_dir]) as engine:
        sql = (build_model(run, engine=engine), summarize(run, engine))
    read = [log.path.name for log in run.processes if log._records is not None]  # (agents are read on both paths)
    return python, sql, read


@pytest.mark.parametrize("compacted", [False, True], ids=["from-jsonl", "from-parquet"])
def test_report_and_show_are_the_same_by_sql(session: tuple[Path, Path], compacted: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for run_dir in session:
        if compacted:
            assert not compact(run_dir).errors
        else:
            for copy in run_dir.glob(COLUMNAR_DIR):
                import shutil

                shutil.rmtree(copy)
        (py_model, py_show), (sql_model, sql_show), read = _python_and_sql(run_dir, monkeypatch)
        assert not read, f"the SQL path read {read} into Python"
        assert sql_show == py_show
        for m in (py_model, sql_model):
            m.processes = m.agents = []  # ProcessLogs: compared through the page below
        assert not differences(py_model, sql_model)
        assert _page(py_model) == _page(sql_model)
        with Engine([run_dir]) as engine:  # show's data, beyond what its lines print (per rank, for a listing)
            by_sql = summarize_sql(engine, open_run(run_dir))
        monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
        by_python = summarize_run(open_run(run_dir))
        monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
        assert not [d for d in differences(by_python, by_sql) if not d.startswith((".metrics", ".stats",
                                                                                   ".sampler_starts"))]
        assert {k: {r: tuple(rec) for r, rec in v.last_by_rank.items()} for k, v in by_python.metrics.items()} == \
            {k: {r: tuple(rec) for r, rec in v.last_by_rank.items()} for k, v in by_sql.metrics.items()}
        assert py_model.findings and py_model.windows and py_model.heatmap is not None  # something was compared
        # each checkpoint saved by the 4 ranks, its step read from the spans' starts (compared above, both paths)
        assert by_python.saves_by_step and {c.spans for c in by_python.saves_by_step.values()} == {4}


@pytest.mark.parametrize("spans_at_once", [None, goodput_sql.SPANS_AT_ONCE, 1],
                         ids=["bounds", "exact-all-ranks", "exact-rank-by-rank"])
def test_goodput_of_every_rank_is_the_same_by_sql(session: tuple[Path, Path], spans_at_once: int | None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The restarted session: two runs, a crash and a restart, checkpoints on another rank. Each process's first and
    last timestamps from its bounds (no span grouped but its latest ends'), and by the exact query (every process
    made unsettled): its lifecycle spans grouped for all ranks in one query, and a rank at a time (as a long run's
    are). The ranks' lifecycle rows in one query (short ranks), or a rank at a time in batches that split its
    processes' rows too, each segment read in ranges of its lines of ~5 rows."""
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    python = goodput_by_rank(session[0].parent)
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    if spans_at_once is not None:
        monkeypatch.setattr(goodput_sql, "_settled", lambda *a: False)
        monkeypatch.setattr(goodput_sql, "SPANS_AT_ONCE", spans_at_once)
    if spans_at_once == 1:
        monkeypatch.setattr(goodput_sql, "ROWS_AT_ONCE", 3)
        monkeypatch.setattr(goodput_sql, "SEGMENT_ROWS_AT_ONCE", 5)
        monkeypatch.setattr(goodput_sql, "BATCH_ROWS", 5)  # a rank at a time, its segments apart
    queries = logged_queries(monkeypatch)
    sql = goodput_by_rank(session[0].parent)
    assert sorted(python) == sorted(sql) == [0, 1, 2, 3]
    for rank in python:
        assert not differences(python[rank].as_dict(), sql[rank].as_dict()), rank
    grouped = [q for q in queries if "arg_min(wall_ns" in q]
    # the session read once: its bounds only, or one exact query, or one per rank
    assert len(grouped) == {None: 0, 1: 4}.get(spans_at_once, 1)
    assert sum("arg_max(span_id" in q for q in queries) == 1
    ranges = sum("line >= $first" in q for q in queries)
    batched = sum("ORDER BY rank, session, run, pid, segment, line" in q for q in queries)
    if spans_at_once == 1:  # a rank at a time: each segment in ranges of 5 rows
        assert ranges >= 4 * 10 and batched == 0
    else:  # the ranks' few rows together: one query for all, not two per rank
        assert ranges == 0 and batched == 1
    assert len(python[0].runs) == 2 and python[0].lost_iterations > 0


def _lifecycle_lines(rank: int, pid: int, spans: list[tuple[str, str, int | None, int | None]]) -> list[str]:
    """A process file's lines (of a run of 3 ranks): its header, then each span (name, id, start wall, end wall) as
    a start and an end line in the order of their walls (an end before its start when its wall is earlier: the
    tracer's late start); None: that line is not written."""
    rows: list[tuple[int, int, dict[str, Any], str, str]] = []
    for name, span_id, start, end in spans:
        if start is not None:
            rows.append((start, 0, {"kind": "span_start", "parent_id": "", "trace_id": "", "attributes": {}},
                         name, span_id))
        if end is not None:
            rows.append((end, 1, {"kind": "span_end", "duration_ns": 0, "status": "ok", "attributes": {}, "error": ""},
                         name, span_id))
    lines = [_process_line(rank, pid, 2, world_size=3)]
    for mono, (wall, _, fields, name, span_id) in enumerate(sorted(rows, key=lambda r: (r[0], r[1]))):
        lines.append(json.dumps({"v": 2, **fields, "mono_ns": mono + 2, "wall_ns": wall, "group": "training",
                                 "name": name, "span_id": span_id}))
    return lines


@pytest.mark.parametrize("latest", [1, goodput_sql.LATEST_ENDS])
def test_goodput_bounds_are_the_exact_stamps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, latest: int) -> None:
    """Each process's first and last timestamps from its bounds are the exact query's, and a process the bounds do
    not settle is read by it: rank 0 was cut off in its data loading (a start later than every stamp); rank 1's
    latest end has no start (settled only when its earlier ends are read too); rank 2 ended cleanly."""
    s = 10**18
    second = 10**9
    iterations = [("training_single_iteration", f"it{i}", s + (10 + i) * second, s + (11 + i) * second)
                  for i in range(10)]
    spans: dict[int, list[tuple[str, str, int | None, int | None]]] = {
        0: [("application", "app", s, None), ("training_loop", "loop", s + 5 * second, None), *iterations,
            ("data_loading", "dl", s + 25 * second, None)],
        1: [("application", "app", s, s + 30 * second), *iterations, ("data_loading", "orphan", None, s + 40 * second)],
        2: [("application", "app", s + second, s + 30 * second), ("training_loop", "loop", s + 2 * second,
                                                                    s + 29 * second), *iterations],
    }
    run = _two_ranks(tmp_path)
    for rank, rows in spans.items():
        (run / f"rank-{rank}.{400 + rank}.jsonl").write_text("\n".join(_lifecycle_lines(rank, 400 + rank, rows)) + "\n")
    monkeypatch.setattr(goodput_sql, "LATEST_ENDS", latest)
    with Engine([run]) as engine:
        where = goodput_sql._run_filter([open_run(run)])
        exact = {(s_, r, rank, pid): (lo, hi) for s_, r, rank, pid, lo, hi in
                 engine.rows(goodput_sql._exact_stamps_sql(where))}
        queries: list[str] = []
        execute = Engine.execute

        def logged_execute(self: Engine, q: str, p: Any = None) -> Any:
            queries.append(q)
            return execute(self, q, p)

        monkeypatch.setattr(Engine, "execute", logged_execute)
        bounds = goodput_sql._process_bounds(engine, where)
    assert bounds == exact
    assert exact[("s", "c", 1, 401)] == (s, s + 30 * second)  # (the orphan end is no stamp)
    assert exact[("s", "c", 0, 400)] == (s, s + 20 * second)  # its last iteration's end
    read_exactly = [q for q in queries if "arg_min(wall_ns" in q]
    assert len(read_exactly) == 1
    assert "rank IN (0)" in read_exactly[0] if latest > 1 else "rank IN (0, 1)" in read_exactly[0]


def test_compare_series_are_the_same_by_sql(session: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    python = read_samples(session[1])
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    sql = read_samples(session[1])
    assert sql.precomputed is not None and python.precomputed is None
    assert python.ranks == sql.ranks and python.window_count == sql.window_count
    assert python.skipped_windows == sql.skipped_windows
    for metric in ("iteration_time", "samples_per_second", "dataloader", "backward"):
        assert not differences(python.series(metric), sql.series(metric)), metric
    assert not differences(python.series("iteration_time", 2), sql.series("iteration_time", 2))
    assert not differences(python.iteration_percentiles(), sql.iteration_percentiles())
    assert not differences(python.series("other"), sql.series("other"))  # the rest of the step


def test_the_cli_readers_agree_on_both_paths(session: tuple[Path, Path], tmp_path: Path) -> None:
    """As users run them: the same output from `show`, `goodput --json` and `compare --json`."""
    outputs: dict[str, list[str]] = {}
    for engine in ("python", "duckdb"):
        env = {**os.environ, "TELEMETRAIN_ENGINE": engine}
        outs = []
        for argv in (["show", str(session[1])], ["goodput", str(session[1].parent), "--json"],
                     ["compare", str(session[1]), "--baseline", str(session[0]), "--json"]):
            proc = subprocess.run([PY, "-m", "telemetrain.cli", *argv], capture_output=True, text=True, env=env,
                                  timeout=300)
            assert proc.returncode in (0, 1), (engine, argv, proc.stderr)
            assert "Traceback" not in proc.stderr
            outs.append(proc.stdout)
        outputs[engine] = outs
    show_py, goodput_py, compare_py = outputs["python"]
    show_sql, goodput_sql, compare_sql = outputs["duckdb"]
    assert show_py == show_sql
    assert not differences(json.loads(goodput_py), json.loads(goodput_sql))
    assert not differences(json.loads(compare_py), json.loads(compare_sql))


WRITER = """
import os, sys, time
from telemetrain import Telemetry, identity_from_env
t = Telemetry(identity_from_env({}, run_id="live", session_tag="s", perf_tag="p", rank=0, world_size=1),
              store=sys.argv[1])
total = int(sys.argv[2])
for i in range(total):
    t.metric("loss", float(i), step=i)
    if i % 500 == 499:
        assert t.flush(30)
        time.sleep(0.05)
    for k in (1, 2):  # pause twice (flushed) until the test has queried: it sees the run mid-write on a slow machine
        if i == total * k // 3:
            assert t.flush(30)
            open(os.path.join(sys.argv[1], f"paused-{k}"), "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(sys.argv[1], f"go-{k}")) and time.monotonic() < deadline:
                time.sleep(0.05)
assert t.close(30)
"""


def test_a_run_being_written_is_queried_as_it_stands(tmp_path: Path) -> None:
    """A writer keeps appending (and rolling segments) while the run is queried and compacted: every query sees a
    prefix of what is written, the grown part of a compacted segment is read from its JSONL (no warning, nothing
    twice), and the end is exact."""
    total = 30_000
    env = {**os.environ, "TELEMETRAIN_SEGMENT_BYTES": "400000", "TELEMETRAIN_COMPACT": "0"}
    proc = subprocess.Popen([PY, "-c", WRITER, str(tmp_path), str(total)], env=env)
    run = tmp_path / "s" / "live"
    seen: list[int] = []
    compactions = 0
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            if not run.exists():
                time.sleep(0.1)
                continue
            with warnings_as_errors(), Engine([run]) as engine:
                n = engine.scalar("SELECT count(*) FROM metrics")
                steps = [s for (s,) in engine.rows("SELECT step FROM metrics ORDER BY segment, line")]
            assert steps == list(range(n))  # a prefix, in order, nothing counted twice
            seen.append(n)
            if len(seen) % 3 == 1:
                compact(run)  # the live segment too: its copy covers what it held then
                compactions += 1
            assert subprocess.run([PY, "-m", "telemetrain.cli", "show", str(run)], capture_output=True,
                                  timeout=120).returncode == 0
            for k in (1, 2):  # queried while the writer waited: let it go on
                if (tmp_path / f"paused-{k}").exists():
                    (tmp_path / f"go-{k}").touch()
    finally:
        proc.wait(timeout=120)
    assert proc.returncode == 0
    assert seen == sorted(seen) and len(seen) >= 2 and compactions >= 1
    with warnings_as_errors(), Engine([run]) as engine:
        assert engine.scalar("SELECT count(*) FROM metrics") == total
        assert engine.scalar("SELECT count(DISTINCT step) FROM metrics") == total
    compact(run)
    with Engine([run]) as engine:
        assert engine.tail_segments == 0 and engine.scalar("SELECT count(*) FROM metrics") == total


class warnings_as_errors:
    """A ColumnarWarning here would mean a copy was distrusted: it must not happen to a run that only grew."""

    def __enter__(self) -> None:
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error", ColumnarWarning)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._catch.__exit__(exc_type, exc, tb)


def test_a_segments_line_ranges_cover_its_lines_once() -> None:
    for lo, hi, n, most in [(81, 421_789, 11_673, 4096), (1, 217_849, 6036, 4096), (5, 5, 1, 4096), (0, 3, 9000, 4096),
                            (0, 10, 4096, 4096), (7, 1000, 50, 5), (0, 2**40, 10**6, 3)]:
        ranges = goodput_sql._line_ranges(lo, hi, n, most)
        assert ranges[0][0] == lo and ranges[-1][1] == hi + 1
        assert all(a < b for a, b in ranges) and all(b == c for (_, b), (c, _) in itertools.pairwise(ranges))
        parts = -(-n // most)  # (rows spread evenly: ~most each)
        assert len(ranges) == 1 or (len(ranges) <= parts and max(b - a for a, b in ranges) == (hi - lo) // parts + 1)


def test_lone_surrogates_keep_their_record_on_both_paths(tmp_path: Path) -> None:
    """The writer escapes a lone surrogate ("\\ud800"), which Python reads back and DuckDB refuses: the columnar
    copy keeps the record with U+FFFD in its place (docs/format.md), so both paths count the same records."""
    t = Telemetry(identity_from_env({}, run_id="u", session_tag="s", perf_tag="p", rank=0, world_size=1),
                  store=tmp_path)
    t.event("odd", {"path": "a\ud800b", "pair": "\U0001f600"})
    t.metric("lone\udc80", 1.0)
    t.metric("plain", 2.0)
    assert t.close(30)
    run = tmp_path / "s" / "u"
    python = open_run(run)
    names = sorted(r.name for r in python.records() if r.kind == "metric")
    assert names == ["lone\udc80", "plain"] and python.corrupt == 0
    for copy in (False, True):
        if copy:
            compact(run)
        with Engine([run]) as engine:
            assert sorted(n for (n,) in engine.rows("SELECT name FROM metrics")) == ["lone\ufffd", "plain"]
            attributes = json.loads(engine.scalar("SELECT attributes FROM events WHERE name = 'odd'"))
            assert attributes == {"path": "a\ufffdb", "pair": "\U0001f600"}
            assert engine.scalar("SELECT sum(corrupt) FROM damage") == 0


def test_trace_and_tail_are_the_same_by_sql(session: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The Perfetto trace (a run, and the session's two runs) and tail's first frame, both ways, the SQL path reading
    each group of processes only when its first is drawn (the run's processes together, and one at a time)."""
    import telemetrain.store.trace_sql as trace_sql
    from telemetrain.analysis.tail import TailState
    from telemetrain.trace import build_trace, load_runs

    for source, group_rows in itertools.product((session[0], session[0].parent), (trace_sql.GROUP_ROWS, 1)):
        monkeypatch.setattr(trace_sql, "GROUP_ROWS", group_rows)
        python = build_trace(load_runs(source))
        runs = load_runs(source)
        with Engine([r.path for r in runs]) as engine:
            sql = build_trace(runs, engine=engine)
        assert not [log for r in runs for log in r.processes + r.agents if log._records is not None]
        assert json.dumps(python, sort_keys=True) == json.dumps(sql, sort_keys=True)
    for run in session:
        polled = TailState(run)
        polled.poll()
        caught = TailState(run)
        with Engine([run]) as engine:
            caught.catch_up(engine)
        assert caught.poll() == 0  # the followers start where SQL stopped: nothing new, nothing twice
        for name in ("run_id", "perf_tag", "ranks", "errors", "warnings", "spans_not_ok", "diagnostics", "records"):
            assert getattr(polled, name) == getattr(caught, name), name
        assert list(polled.recent) == list(caught.recent) and polled.ranks
        if run == session[0]:  # the crashed run: each of its 4 ranks' loop and application span ended terminated
            assert polled.spans_not_ok == 8 and sum(e[3] == "span training/training_loop" for e in polled.recent) == 4
        assert not differences(polled.findings(), caught.findings())
        assert polled.loss_summary() == caught.loss_summary() and polled.eta() == caught.eta()  # sparkline, ETA


def test_the_scale_docs_query_runs_on_the_copied_tree(session: tuple[Path, Path], tmp_path: Path) -> None:
    """docs/scale.md's DuckDB query over a `telemetrain compact --to` tree gives what `telemetrain query` gives over
    the run's `windows` view."""
    doc = (Path(__file__).parent.parent / "docs" / "scale.md").read_text()
    tree_sql = doc.split("or straight over the object store tree")[1].split("```sql")[1].split("```")[0]
    query_sql = doc.split("telemetrain query telemetrain-runs/job-42/job-42.0 \"")[1].split('"\n```')[0]
    run = session[1]
    assert not compact(run, str(tmp_path / "tree")).errors
    tree_sql = (tree_sql.replace("s3://bucket/telemetry", str(tmp_path / "tree"))
                .replace("'job-42'", f"'{run.parent.name}'").replace("'job-42.0'", f"'{run.name}'"))
    on_tree = duckdb.connect().execute(tree_sql).fetchall()
    proc = subprocess.run([PY, "-m", "telemetrain.cli", "query", str(run), query_sql, "--format", "json",
                           "--max-rows", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    by_query = [(r["current_iteration"], r["slowest_rank"], r["x_median"]) for r in json.loads(proc.stdout)]
    assert on_tree == by_query and len(on_tree) >= 10


@pytest.mark.parametrize("at_once", [65_536, 1_500], ids=["all-ranks-at-once", "rank-by-rank"])
def test_windows_merged_at_scale_are_the_same_by_sql(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     at_once: int) -> None:
    """Ranks with more windows than they keep: the lowest rank merged to the chart's 1,000 points, the others to their
    share of the budget; NaN means, missing percentiles and phases in some windows. Both paths merge alike, the SQL
    path's windows typed all ranks at once or a rank at a time (``windows_sql.WINDOWS_AT_ONCE``). Rank 3's reports
    hold no iteration: it has no windows, so the others' share is 300 / 3, not 300 / 4."""
    import random

    import telemetrain.report.windows as windows_module
    import telemetrain.report.windows_sql as windows_sql

    monkeypatch.setattr(windows_module, "WINDOW_BUDGET", 300)  # 3 ranks: 100 windows each besides the lowest
    monkeypatch.setattr(windows_sql, "WINDOWS_AT_ONCE", at_once)
    run = tmp_path / "s" / "w"
    run.mkdir(parents=True)
    rng = random.Random(7)
    for rank in range(4):
        ident = identity_from_env({}, run_id="w", session_tag="s", perf_tag="p", rank=rank, world_size=4)
        lines = [json.dumps({"v": 1, "kind": "process", "mono_ns": 1, "wall_ns": 1,
                             "identity": ident.replace(pid=100 + rank).as_dict()})]
        for i in range(2500 if rank == 0 else 1200 if rank < 3 else 10):
            a: dict[str, Any] = {"current_iteration": 50 * (i + 1) - 1, "window_iterations": 50,
                                 "avg_iteration_time_sec": rng.uniform(0.09, 0.11) * (1.5 if 600 < i < 650 else 1),
                                 "max_iteration_time_sec": rng.uniform(0.1, 0.5 if i % 97 else 2.0),
                                 "p90_iteration_time_sec": rng.uniform(0.1, 0.2),
                                 "samples_per_second": rng.uniform(280, 300)}
            if i % 5:
                a["p50_iteration_time_sec"] = rng.uniform(0.09, 0.11)
                a["avg_forward_time_sec"] = rng.uniform(0.02, 0.03) * (4 if i in (300, 301) else 1)
            if i % 211 == 0:
                a["avg_iteration_time_sec"] = {"$float": "NaN"}
            if rank == 3:
                del a["current_iteration"]
            lines.append(json.dumps({"v": 1, "kind": "event", "mono_ns": 10 + i, "wall_ns": 10**18 + i * 10**9,
                                     "group": "training", "name": "training_metrics_update", "severity": "info",
                                     "attributes": a, "event_id": "", "span_id": ""}, separators=(",", ":")))
        (run / f"rank-{rank}.{100 + rank}.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    python = build_model(open_run(run))
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    with Engine([run]) as engine:
        sql = build_model(open_run(run), engine=engine)
        # the heatmap's rows went through a Parquet file per group in the engine's own directory, removed after
        assert not [f for f in os.listdir(engine.scratch) if f.startswith("report_heat")]
        assert not engine.rows("SELECT table_name FROM duckdb_tables() WHERE table_name LIKE 'report_%'")
    assert sql.heatmap is not None and python.heatmap is not None
    assert sql.heatmap.cells == python.heatmap.cells  # (python's: from every window)
    assert [len(python.windows[r]) for r in range(3)] == [834, 100, 100]  # ceil(2500 / 1000) = 3 per point
    assert python.window_counts == {0: 2500, 1: 1200, 2: 1200}
    python.processes = python.agents = sql.processes = sql.agents = []
    assert not differences(python, sql)
    assert _page(python) == _page(sql)
    assert "slow iterations" in {f.kind for f in python.findings} and python.slow_windows  # something was compared


@pytest.mark.parametrize("series_at_once", [curves_sql.SERIES_AT_ONCE, 1], ids=["all-ranks", "rank-by-rank"])
def test_the_model_metric_curves_are_the_same_by_sql(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     series_at_once: int) -> None:
    """The user's metrics charted by the report, compared by compare and sparked by tail: DuckDB's buckets merged by
    the builder give the record pass's curves exactly below 2 x capacity steps (a loss with a NaN, equal and differing
    ranks, a metric with attributes, one without steps), and the same series at most one resolution apart above;
    the buckets made for all ranks in one query, and a rank at a time (as a run of many ranks has them)."""
    from telemetrain.analysis.tail import TailState

    monkeypatch.setattr(curves_sql, "SERIES_AT_ONCE", series_at_once)

    for rank in (0, 1):
        t = Telemetry(identity_from_env({}, run_id="curves", session_tag="curves", rank=rank, world_size=2),
                      store=tmp_path)
        for step in range(200):
            t.log({"loss": float("nan") if step == 50 else 3.0 / (1 + step)}, step=step, group="train")
            t.metric("grad_norm", 1.0 + rank + step % 7, "train", step=step)  # the ranks differ
        for step in range(0, 200, 40):
            t.metric("accuracy", step / 200, "val", step=step)
        for i in range(12):
            t.metric("lr_by_part", 0.1 * i, "train", step=i, attributes={"part": "head"})
            t.metric("samples", 100.0 + i, "train")  # no step: by wall time
        if rank == 0:
            for step in range(3000):  # longer than 2 x 256 buckets: DuckDB buckets 2 steps wide
                t.metric("long", 50.0 if step == 1234 else float(step % 10), "train", step=step)
        assert t.close()
    run_dir = next(p for p in (tmp_path / "curves").iterdir() if p.is_dir())
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    py_model, py_samples = build_model(open_run(run_dir)), read_samples(run_dir)
    polled = TailState(run_dir)
    polled.poll()
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    with Engine([run_dir]) as engine:
        sql_model = build_model(open_run(run_dir), engine=engine)
    sql_samples = read_samples(run_dir)
    caught = TailState(run_dir)
    with Engine([run_dir]) as engine:
        caught.catch_up(engine)
    assert polled.loss_summary() == caught.loss_summary() != "-"

    def by_title(curves: Any) -> dict[str, Any]:
        return {c.title: c for c in curves}

    for python, sql in ((py_model.curves, sql_model.curves), (py_samples.curves.curves(py_samples.created_wall_ns),
                                                              sql_samples.curves.curves(sql_samples.created_wall_ns))):
        py, by_sql = by_title(python), by_title(sql)
        assert sorted(py) == sorted(by_sql) == ["train/grad_norm", "train/long", "train/loss",
                                               "train/lr_by_part/head", "train/samples", "val/accuracy"]
        for title in py:
            if title == "train/samples":  # x: a mean of wall times in ns, summed as floats (~0.3 us apart)
                a_points, b_points = py[title].lines[0].points, by_sql[title].lines[0].points
                assert len(a_points) == len(b_points) >= 1
                assert all(abs(p.x - q.x) < 1e-6 for p, q in zip(a_points, b_points, strict=True))
                assert not differences([dataclasses.replace(p, x=0.0) for p in a_points],
                                       [dataclasses.replace(q, x=0.0) for q in b_points])
            elif title != "train/long":
                assert not differences(py[title], by_sql[title]), title
        a, b = py["train/long"], by_sql["train/long"]
        assert (a.points, a.nonfinite, a.ranks, a.by_step) == (b.points, b.nonfinite, b.ranks, b.by_step) == \
            (3000, 0, 1, True)
        assert a.bucket_width in (b.bucket_width, b.bucket_width * 2, b.bucket_width / 2)
        for line in (a.lines[0], b.lines[0]):  # the spike kept in its bucket's max, at its step
            top = max(line.points, key=lambda p: p.hi)
            assert (top.hi, top.hi_x) == (50.0, 1234)
    assert py_model.curves[0].lines and by_title(py_model.curves)["train/loss"].nonfinite == 2


def test_tail_eta_is_the_same_by_sql(tmp_path: Path) -> None:
    """tail's way to the target (the pace of the leading rank's last reports, the config's target) from the SQL
    catch-up as from polling, on a run whose reports carry a target."""
    from telemetrain.analysis.tail import TailState
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    t = Telemetry(identity_from_env({}, run_id="eta", session_tag="eta", rank=0, world_size=1), store=tmp_path)
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=10,
                                                 train_iterations_target_or_fn=1000), telemetry=t)
    now = 1_000_000.0
    r.on_app_start(now)
    r.on_train_start(0, start_time_msec=now)
    for step in range(150):
        r.on_training_single_iteration_start(now)
        now += 20.0 + step % 3
        r.on_training_single_iteration_end(now)
        t.log({"loss": 2.0 / (1 + step)}, step=step, group="train")
    assert t.close()
    run_dir = next(p for p in (tmp_path / "eta").iterdir() if p.is_dir())
    polled = TailState(run_dir)
    polled.poll()
    caught = TailState(run_dir)
    with Engine([run_dir]) as engine:
        caught.catch_up(engine)
    assert polled.target == caught.target == 1000
    assert polled.eta() == caught.eta() and "1,000" in polled.eta()
    assert polled.loss_summary() == caught.loss_summary() != "-"


def test_goodput_rank_by_rank_keeps_a_rank_without_lifecycle_spans(session: tuple[Path, Path], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank whose log lost its span starts still has its reports' and checkpoints' timestamps, read in a group of
    its own when the spans are read a group of ranks at a time."""
    import shutil

    copy = tmp_path / session[0].parent.name
    shutil.copytree(session[0].parent, copy)
    for columnar in copy.rglob(COLUMNAR_DIR):
        shutil.rmtree(columnar)
    for f in copy.rglob("rank-1.*.jsonl"):
        lines = f.read_text().splitlines(keepends=True)
        f.write_text("".join(line for line in lines if '"kind":"span_start"' not in line))
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    python = goodput_by_rank(copy)
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    monkeypatch.setattr(goodput_sql, "SPANS_AT_ONCE", 1)
    sql = goodput_by_rank(copy)
    assert sorted(python) == sorted(sql) and python
    for rank in python:
        assert not differences(python[rank].as_dict(), sql[rank].as_dict()), rank


def test_goodput_positions_order_as_segment_then_line() -> None:
    """The spans' aggregate keys a row's (segment, line) as one BIGINT: the same order, INTEGER extremes included."""
    import duckdb

    edges = [-2**31, -1, 0, 1, 2**31 - 1]
    pairs = [(s, li) for s in edges for li in edges]
    con = duckdb.connect()
    con.execute("CREATE TABLE t (segment INTEGER, line INTEGER)")
    con.executemany("INSERT INTO t VALUES (?, ?)", pairs)
    got = con.execute(f"SELECT segment, line FROM t ORDER BY {goodput_sql._position_sql()}").fetchall()
    assert got == sorted(pairs)
    assert con.execute(f"SELECT count(DISTINCT {goodput_sql._position_sql()}) FROM t").fetchone() == (len(pairs),)


@pytest.mark.parametrize("by_sql", [False, True], ids=["python", "sql"])
def test_show_computes_the_session_goodput_once(session: tuple[Path, Path], by_sql: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``show``'s goodput line and its findings' restarts read one goodput report of the session (computed twice
    before, each time reading the session's lifecycle): the same lines as with a report computed for each."""
    import importlib

    import telemetrain.show as show_module

    goodput_module = importlib.import_module("telemetrain.training.goodput")  # (the package names a function so)
    calls: list[tuple[Path, int]] = []
    real = goodput_module.goodput

    def counted(session_dir: Any, **kw: Any) -> Any:
        calls.append((Path(session_dir), kw.get("rank", 0)))
        return real(session_dir, **kw)

    monkeypatch.setattr(goodput_module, "goodput", counted)
    if not by_sql:
        monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")

    def lines() -> list[str]:
        run = open_run(session[1])  # the restarted run: a goodput line, the crash and the restart in the findings
        if not by_sql:
            return summarize(run)
        with Engine([session[1]]) as engine:
            return summarize(run, engine)

    once = lines()
    assert len(calls) == 1 and calls[0][1] == 0
    calls.clear()

    def every_time(run: Any, engine: Any = None) -> Any:  # as before: each reader computes its own
        return lambda session_dir, rank: counted(session_dir, rank=rank, opened=(run,), engine=engine)

    monkeypatch.setattr(show_module, "goodput_once", every_time)
    assert lines() == once
    assert len(calls) == 2  # (the goodput line's and the findings')
    assert any(line.startswith("goodput ") for line in once)
    assert any("restart" in line for line in once if line.startswith("  ")), "the findings' restarts were not read"


def test_show_last_records_are_the_same_by_sql(session: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank's last record of each series (each process's last in monotonic time) is the Python path's."""
    for run_dir in session:
        with Engine([run_dir]) as engine:
            by_sql = summarize_sql(engine, open_run(run_dir))
        monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
        by_python = summarize_run(open_run(run_dir))
        monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
        for kind in ("metrics", "stats"):
            python, sql = getattr(by_python, kind), getattr(by_sql, kind)
            assert {k: {r: tuple(rec) for r, rec in v.last_by_rank.items()} for k, v in python.items()} == \
                {k: {r: tuple(rec) for r, rec in v.last_by_rank.items()} for k, v in sql.items()}
            assert {k: (v.count, v.samples) for k, v in python.items()} == \
                {k: (v.count, v.samples) for k, v in sql.items()}
        assert sum(len(v.last_by_rank) for v in by_python.metrics.values()) > len(by_python.metrics)  # several ranks


def _two_ranks(tmp_path: Path) -> Path:
    """The directory of run ``c`` of session ``s`` (two ranks), made."""
    run = tmp_path / "s" / "c"
    run.mkdir(parents=True)
    return run


def _process_line(rank: int, pid: int, version: int, world_size: int = 2) -> str:
    """A process file's first line (format ``version``): the identity of ``rank`` of run ``c``."""
    ident = identity_from_env({}, run_id="c", session_tag="s", perf_tag="p", rank=rank, world_size=world_size)
    return json.dumps({"v": version, "kind": "process", "mono_ns": 1, "wall_ns": 1,
                       "identity": ident.replace(pid=pid).as_dict()})


def test_the_earliest_checkpoint_successes_are_the_same_by_sql(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with more save_checkpoint_success events than the report lists (``MAX_CHECKPOINT_ROWS``): both paths keep
    the earliest, ties in time in the collection order (rank, pid, file order), as the stable sort of every event did;
    the SQL path reads no more than those from DuckDB."""
    from telemetrain.report.model_pass import MAX_CHECKPOINT_ROWS

    run = _two_ranks(tmp_path)
    for rank in (1, 0):
        lines = [_process_line(rank, 200 + rank, 1)]
        for i in range(400):
            # every third event at the same time on both ranks (a tie), and a later event written before an earlier
            wall = 10**18 + (i // 3 * 3 if i % 3 == 0 else i) * 10**9 + (5 * 10**9 if i % 50 == 7 else 0)
            lines.append(json.dumps({"v": 1, "kind": "event", "mono_ns": 10 + i, "wall_ns": wall,
                                     "group": "training", "name": "save_checkpoint_success", "severity": "info",
                                     "attributes": {"save_checkpoint_success_count": i, "rank": rank},
                                     "event_id": "", "span_id": ""}))
        (run / f"rank-{rank}.{200 + rank}.jsonl").write_text("\n".join(lines) + "\n")
    (python, _), (sql, _), _ = _python_and_sql(run, monkeypatch)
    rows = [(e.wall_ns, e.source, e.attributes) for e in python.checkpoint_successes]
    assert len(rows) == MAX_CHECKPOINT_ROWS < 800
    assert rows == [(e.wall_ns, e.source, e.attributes) for e in sql.checkpoint_successes]
    assert rows[0][1] == "rank 0" and rows[1][1] == "rank 1"  # a tie: the collection order
    assert rows == sorted(rows, key=lambda r: r[0])


def test_the_earliest_checkpoint_spans_keep_their_attributes_by_both_paths(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """More checkpoint spans than the report shows (``MAX_CHECKPOINT_SPANS``, 5 here): both paths keep every span
    (the lifecycle table counts and times them all) and the attributes of the earliest 5 by (start, rank) alone. The
    5th and 6th tie (one rank, one start): the SQL path reads both, then the 6th's are left out as the Python path's
    stable sort leaves them (file order); no later span's attributes are read, but every span's step is."""
    from telemetrain.report import model, model_sql

    for module in (model, model_sql):
        monkeypatch.setattr(module, "MAX_CHECKPOINT_SPANS", 5)
    run = _two_ranks(tmp_path)
    for rank in (1, 0):
        lines = [_process_line(rank, 300 + rank, 2)]
        for i in range(10):
            start = 10**18 + (i // 2 * 2) * 10**9 + (rank if i % 2 else 0)  # even i: both ranks start together
            span = f"{rank:02x}{i:014x}"
            lines.append(json.dumps({"v": 2, "kind": "span_start", "mono_ns": 2 * i, "wall_ns": start,
                                     "group": "training", "name": "checkpoint_save_sync", "span_id": span,
                                     "parent_id": "", "trace_id": "", "attributes": {"current_iteration": 100 * i}}))
            if i == 9 and rank == 1:
                continue  # never ended: its start is the span's row
            lines.append(json.dumps({"v": 2, "kind": "span_end", "mono_ns": 2 * i + 1, "wall_ns": start + 5 * 10**8,
                                     "group": "training", "name": "checkpoint_save_sync", "span_id": span,
                                     "duration_ns": 5 * 10**8, "status": "ok" if i != 3 else "error",
                                     "attributes": {"rank_saved": rank}, "error": ""}))
        (run / f"rank-{rank}.{300 + rank}.jsonl").write_text("\n".join(lines) + "\n")
    decoded: list[str] = []
    decode = model_sql._attrs

    def logged_decode(text: str) -> dict[str, Any]:
        decoded.append(text)
        return decode(text)

    monkeypatch.setattr(model_sql, "_attrs", logged_decode)
    (python, _), (sql, _), read = _python_and_sql(run, monkeypatch)
    assert not read
    assert sum("current_iteration" in text for text in decoded if text) == 6  # the first 5 and the tie
    for m in (python, sql):
        assert len(m.checkpoints) == 20 and len(m.lifecycle) == 20
        shown, rest = m.checkpoints[:5], m.checkpoints[5:]
        assert all(s.attributes and "current_iteration" in s.attributes for s in shown)
        assert all(s.attributes == {} for s in rest)
        assert [(s.start_ns, s.rank) for s in m.checkpoints] == sorted((s.start_ns, s.rank) for s in m.checkpoints)
        assert (shown[4].start_ns, shown[4].rank) == (rest[0].start_ns, rest[0].rank)  # the tie
        assert sum(s.duration_s is None for s in m.checkpoints) == 1 and sum(s.status == "error" for s in rest) == 2
        assert sorted(s.step for s in m.checkpoints if s.step is not None) == sorted(100 * (i % 10) for i in range(20))
    assert not differences(python.lifecycle, sql.lifecycle)
    assert not differences(python.checkpoints, sql.checkpoints)
    assert _page(python) == _page(sql)
    assert "rank_saved" in _page(sql) and _page(sql).count("current_iteration") == 5  # the table: the earliest 5


def test_small_runs_take_the_python_path_unless_duckdb_is_asked_for(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``engine_for`` without TELEMETRAIN_ENGINE: the Python path for a run of few small files or of many tiny ones
    (DuckDB's cost is per file), DuckDB past that; TELEMETRAIN_ENGINE=duckdb takes DuckDB whatever the size."""
    from telemetrain.store import engine as engine_module
    from telemetrain.store.engine import engine_for

    def write(run_id: str, ranks: int, values: int) -> Path:
        for rank in range(ranks):
            t = Telemetry(identity_from_env({}, run_id=run_id, session_tag=run_id, rank=rank, world_size=ranks),
                          store=tmp_path)
            for step in range(values):
                t.metric("loss", 1.0 / (step + 1), "train", step=step)
            assert t.close()
        return next(p for p in (tmp_path / run_id).iterdir() if p.is_dir())

    few, many = write("few", 2, 400), write("many", 40, 20)  # ~60 KiB in 2 files; ~150 KiB in 40 files
    monkeypatch.delenv("TELEMETRAIN_ENGINE")
    assert engine_for([few]) is None and engine_for([many]) is None
    monkeypatch.setattr(engine_module, "SMALL_RUN_BYTES", 16 << 10)  # as if both were larger than "small"
    monkeypatch.setattr(engine_module, "_PER_FILE_BYTES", 8 << 10)
    for run, python in ((few, False), (many, True)):  # many files of 4 KiB: still under 8 KiB a file
        engine = engine_for([run])
        assert (engine is None) == python, run
        if engine is not None:
            engine.close()
    monkeypatch.setattr(engine_module, "SMALL_FILES_BYTES", 64 << 10)  # but not past the cap
    engine = engine_for([many])
    assert engine is not None
    engine.close()
    monkeypatch.setattr(engine_module, "SMALL_RUN_BYTES", 16 << 20)
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    engine = engine_for([few])
    assert isinstance(engine, Engine)
    engine.close()
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    monkeypatch.setattr(engine_module, "SMALL_RUN_BYTES", 0)
    assert engine_for([few]) is None


@pytest.mark.parametrize("compacted", [False, True], ids=["from-jsonl", "from-parquet"])
def test_show_last_values_follow_each_process_clock_after_a_wall_clock_step(tmp_path: Path, compacted: bool,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """An NTP step sets rank 0's wall clock back an hour mid-run: its last loss, its last stat window and its
    process's last CPU sample are the ones written last (monotonic time, as ``Run.records()`` orders a process),
    not those of the latest wall time. Both ranks' and the run's last value are the same by SQL, from the JSONL or
    the Parquet copy."""
    run = _two_ranks(tmp_path)
    s, hour = 10**18, 3600 * 10**9
    for rank in (0, 1):
        lines = [_process_line(rank, 300 + rank, 2)]
        for i in range(20):
            stepped = rank == 0 and i >= 10  # rank 0's clock stepped back before its 11th step
            wall = s + i * 10**9 - (hour if stepped else 0) + rank
            lines.append(json.dumps({"v": 2, "kind": "metric", "mono_ns": 100 + i, "wall_ns": wall,
                                     "group": "train", "name": "loss", "value": float(100 * rank + i), "step": i}))
            lines.append(json.dumps({"v": 2, "kind": "stat", "mono_ns": 100 + i, "wall_ns": wall, "group": "train",
                                     "name": "lat", "start_mono_ns": 99 + i, "count": 1,
                                     "values": {"mean": float(100 * rank + i)}, "unit": "s"}))
            lines.append(json.dumps({"v": 2, "kind": "metric", "mono_ns": 100 + i, "wall_ns": wall,  # a process's
                                     "group": "system", "name": "process.cpu.utilization", "value": i / 100}))
        (run / f"rank-{rank}.{300 + rank}.jsonl").write_text("\n".join(lines) + "\n")
    if compacted:
        assert not compact(run).errors
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    by_python = summarize_run(open_run(run))
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    with Engine([run]) as engine:
        by_sql = summarize_sql(engine, open_run(run))
    for summary in (by_python, by_sql):
        loss, lat = summary.metrics[("train", "loss")], summary.stats[("train", "lat")]
        assert {r: rec.value for r, rec in loss.last_by_rank.items()} == {0: 19.0, 1: 119.0}
        assert {r: rec.values["mean"] for r, rec in lat.last_by_rank.items()} == {0: 19.0, 1: 119.0}
        assert loss.last.value == 119.0 and lat.last.values["mean"] == 119.0  # rank 1's is the latest in wall time
        assert summary.system[("rank 0 pid 300", "system")]["process.cpu.utilization"].last == 0.19
    for key in (("train", "loss"),):
        assert tuple(by_python.metrics[key].last) == tuple(by_sql.metrics[key].last)
