"""Both readers on the features main added after the columnar store was written: format v2 metric attributes
(``Telemetry.log``, system series with semantic-convention attributes, energy), training reports with device times
and communication figures, a run with planted findings (a real job: a leak, a loss spike, a NaN), and the v1 fixture
store. Each run is read by the pure-Python path and by SQL (from the JSONL, and from the Parquet copy): the report's
model and page, ``show``'s lines, tail's first frame and findings, and the trace must be the same."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from _planted import PlantedRuns

pytest.importorskip("duckdb")

from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis.tail import TailState
from telemetrain.store import compact_batch, open_run
from telemetrain.store.compact import COLUMNAR_DIR, compact
from telemetrain.store.engine import Engine
from telemetrain.store.manifest import SEGMENTS_DIR, SHARED_DIR
from telemetrain.trace import build_trace, load_runs
from test_engine_readers import _page, _python_and_sql, differences

V1_STORE = Path(__file__).parent / "data" / "v1_store"
STEPS = 300


def _v2_session(root: Path) -> Path:
    """Two ranks writing v2 records: metrics with attributes (one name, two series), system series with the
    conventions' attributes, energy per GPU, reports with device times and communication, a straggler, a clock
    offset; rank 1 has a loss spike at step 100 and a NaN at 200, and its process memory grows."""
    for rank in (0, 1):
        t = Telemetry(identity_from_env({}, run_id="v2", session_tag="s", perf_tag="p", rank=rank, world_size=2),
                      store=root)
        for step in range(STEPS):
            loss = 2.0 / (1 + step / 50) + 0.01 * ((step * 7 + rank) % 5)
            if rank == 1 and step == 100:
                loss *= 40
            if rank == 1 and step == 200:
                loss = math.nan
            t.log({"train.loss": loss, "train.grad_norm": 1.0 + 0.1 * (step % 3)}, step=step)
            t.metric("tokens", 512 + step, "default", {"split": "train"}, step=step)
            if step % 10 == 0:
                t.metric("tokens", 64, "default", {"split": "val"}, step=step)
                t.metric("system.disk.io", 1000.0 * step, "system", {"disk.io.direction": "read"})
                t.metric("system.disk.io", 10.0 * step, "system", {"disk.io.direction": "write"})
                t.metric("system.memory.usage", 4e9 + step, "system", {"system.memory.state": "used"})
                t.metric("system.memory.usage", 1e9, "system", {"system.memory.state": "free"})  # another series
                t.metric("system.memory.limit", 16e9, "system")
                t.metric("process.memory.usage", 1e9 + (5e6 * step if rank == 1 else 0.0), "system")
                t.metric("hw.energy", 10.0 * step + rank, f"system.gpu.{rank}", {"hw.id": str(rank)}, unit="J")
                t.metric("hw.power", 250.0 + rank, f"system.gpu.{rank}", {"hw.id": str(rank)}, unit="W")
                t.metric("hw.gpu.utilization", 0.9, f"system.gpu.{rank}", {"hw.id": str(rank)})
                t.metric("hw.gpu.memory.limit", 80e9, f"system.gpu.{rank}", {"hw.id": str(rank)})
                t.metric("torch.cuda.memory.allocated", 2e9 + step * 1e6, f"system.cuda.{rank}",
                         {"torch.cuda.device": rank})
            if step % 10 == 9:
                slow = 1.5 if rank == 1 and 150 <= step < 180 else 1.0
                t.event("training_metrics_update", {
                    "current_iteration": step, "window_iterations": 10, "train_iterations_start": 0,
                    "avg_iteration_time_sec": 0.1 * slow, "p50_iteration_time_sec": 0.1 * slow,
                    "max_iteration_time_sec": 0.12 * slow, "samples_per_second": 640 / slow,
                    "avg_forward_time_sec": 0.01, "avg_backward_time_sec": 0.02,
                    "avg_forward_device_time_sec": 0.03 * slow, "avg_backward_device_time_sec": 0.05,
                    "avg_iteration_device_time_sec": 0.095 * slow,
                    "avg_comm_time_sec": 0.02, "avg_comm_wait_time_sec": 0.005 * (1 + rank),
                    "comm_wait_fraction": 0.05 * (1 + rank), "comm_bytes": 10 * 4_000_000, "comm_clock": "device",
                    "avg_backward_comm_wait_sec": 0.004, "window_seconds": 1.0 * slow, "cpu_time_sec": 0.9,
                    "cpu_wait_sec": 0.01}, group="training")
        if rank == 1:
            t.event("clock_offset", {"offset_ns": 1_500_000, "error_ns": 20_000}, group="clock")
            t.event("straggler", {"kind": "late", "rank": 1, "host": "h", "phase": "forward", "step": 150,
                                  "cost_per_iteration_sec": 0.02}, group="cross_rank")
        assert t.close(30)
    return root / "s" / "v2"


def _as_schema_2(run_dir: Path) -> int:
    """Make the run's columnar copy what telemetrain wrote before schema version 3: no ``reports`` files, manifests
    of version 2. Returns the reports files removed."""
    import json

    removed = 0
    for manifest in (run_dir / COLUMNAR_DIR / "_segments").rglob("*.json"):
        data = json.loads(manifest.read_text())
        for f in data["files"]:
            if f["table"] == "reports":
                (run_dir / COLUMNAR_DIR / f["path"]).unlink()
                removed += 1
        data["files"] = [f for f in data["files"] if f["table"] != "reports"]
        manifest.write_text(json.dumps({**data, "schema_version": 2}))
    return removed


def _both_paths(run_dir: Path, compacted: bool | str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Everything compared on one run; returns the Python model (for the callers' own checks). ``compacted``:
    False (read from the JSONL), True (from the copy), "v2" (from a copy of schema version 2)."""
    if compacted:
        with monkeypatch.context() as m:
            if compacted in ("v2", "v3", "v4"):  # (v4: one file a table for each segment, here)
                m.setattr(compact_batch, "SMALL_SEGMENT_BYTES", -1)
            assert not compact(run_dir, force=True).errors
        named = {f["path"] for m in (run_dir / COLUMNAR_DIR / SEGMENTS_DIR).rglob("*.json")
                 for f in json.loads(m.read_text())["files"]}
        if compacted is not True:
            assert not [p for p in named if p.startswith(SHARED_DIR)]
        if compacted == "v2":
            assert _as_schema_2(run_dir)
            with Engine([run_dir]) as engine:
                assert engine.tail_segments == 0 and engine.untyped_reports  # read from that copy
        if compacted == "v3":  # what schema version 3 wrote: the same files, manifests of version 3
            for manifest in (run_dir / COLUMNAR_DIR / SEGMENTS_DIR).rglob("*.json"):
                manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "schema_version": 3}))
            again = compact(run_dir)  # kept as it is, not rewritten
            assert again.segments == 0 and again.skipped and not again.errors
            with Engine([run_dir]) as engine:
                assert engine.tail_segments == 0 and not engine.untyped_reports and not engine.ignored
        if compacted == "v4":  # what schema version 4 wrote: reports without the wait over every rank
            import duckdb

            for manifest in (run_dir / COLUMNAR_DIR / SEGMENTS_DIR).rglob("*.json"):
                data = json.loads(manifest.read_text())
                for f in data["files"]:
                    if f["table"] == "reports":
                        path = run_dir / COLUMNAR_DIR / f["path"]
                        con = duckdb.connect()
                        con.execute(f"CREATE TABLE old AS SELECT * EXCLUDE (avg_comm_world_wait_time_sec) FROM "
                                    f"read_parquet('{path}')")
                        con.execute(f"COPY old TO '{path}' (FORMAT parquet)")
                        con.close()
                        f["bytes"] = path.stat().st_size
                manifest.write_text(json.dumps({**data, "schema_version": 4}))
            with Engine([run_dir]) as engine:
                assert engine.tail_segments == 0 and engine.older_reports and not engine.ignored
    else:
        shutil.rmtree(run_dir / COLUMNAR_DIR, ignore_errors=True)
    (py_model, py_show), (sql_model, sql_show), read = _python_and_sql(run_dir, monkeypatch)
    assert not read, f"the SQL path read {read} into Python"
    assert sql_show == py_show
    processes = py_model.processes
    for m in (py_model, sql_model):
        m.processes = m.agents = []
    assert not differences(py_model, sql_model)
    assert _page(py_model) == _page(sql_model)
    py_model.processes = processes
    polled = TailState(run_dir)
    polled.poll()
    caught = TailState(run_dir)
    with Engine([run_dir]) as engine:
        caught.catch_up(engine)
    for name in ("ranks", "errors", "warnings", "spans_not_ok", "diagnostics", "records"):
        assert getattr(polled, name) == getattr(caught, name), name
    assert not differences(polled.findings(), caught.findings())
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    python_trace = build_trace(load_runs(run_dir))
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    runs = load_runs(run_dir)
    with Engine([r.path for r in runs]) as engine:
        assert build_trace(runs, engine=engine) == python_trace
    return py_model, py_show


@pytest.fixture(scope="module")
def v2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _v2_session(tmp_path_factory.mktemp("v2"))


@pytest.mark.parametrize("compacted", [False, True, "v2", "v3", "v4"],
                         ids=["from-jsonl", "from-parquet", "from-parquet-v2", "from-parquet-v3", "from-parquet-v4"])
def test_v2_attributes_device_times_and_comm_are_the_same_by_sql(v2_run: Path, compacted: bool | str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    model, show = _both_paths(v2_run, compacted, monkeypatch)
    # what was compared holds the features: two series of one name, system series by their v1 keys, device clock
    text = "\n".join(show)
    assert "tokens/train" in text and "tokens/val" in text
    assert "disk read" in text and "energy" in text and "comm        communication per iteration" in text
    assert "clock       rank 1" in text and "straggler   rank 1" in text
    assert model.phase_source == {0: "device", 1: "device"}
    kinds = {f.kind for f in model.findings}
    assert {"spike", "nan/inf"} <= kinds, kinds


@pytest.fixture(scope="module")
def planted_run(planted_runs: PlantedRuns, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the leak-spike-nan job's session (the tests compact it; the planted suite reads the original)."""
    run = planted_runs["leak-spike-nan"][-1]
    copy = tmp_path_factory.mktemp("planted-copy") / run.parent.name
    shutil.copytree(run.parent, copy)
    return copy / run.name


@pytest.mark.parametrize("compacted", [False, True, "v2", "v3", "v4"],
                         ids=["from-jsonl", "from-parquet", "from-parquet-v2", "from-parquet-v3", "from-parquet-v4"])
def test_planted_findings_are_the_same_by_sql(planted_run: Path, compacted: bool | str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A real job (a leak, a loss and gradient spike at step 200, a NaN at 400): report, show and tail find the
    same on both paths, and find what was planted."""
    model, show = _both_paths(planted_run, compacted, monkeypatch)
    kinds = {f.kind for f in model.findings}
    assert {"spike", "nan/inf"} <= kinds, kinds  # (the leak's RSS growth is not always seen on a loaded machine)
    text = "\n".join(show)
    assert "findings" in text and "train.loss" in text


@pytest.mark.parametrize("compacted", [False, True], ids=["from-jsonl", "from-parquet"])
def test_the_v1_fixture_store_is_the_same_by_sql(tmp_path: Path, compacted: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A run written by telemetrain 0.1 (format v1, the fixture): copied (compaction writes beside it), then read."""
    shutil.copytree(V1_STORE, tmp_path / "store")
    run = tmp_path / "store" / "v1-session" / "v1-run"
    model, show = _both_paths(run, compacted, monkeypatch)
    assert open_run(run).processes and model.run_id == "v1-run" and any(line.startswith("metrics") for line in show)


def test_goodput_energy_of_a_restarted_gpu_job_is_the_same_by_sql(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks, each with its GPU; attempt 1 checkpoints at 10 and dies at 20, attempt 2 resumes to 30: the energy
    account (every rank's loops, the lost work's joules) and every rank's goodput, both paths."""
    from telemetrain.training.goodput import goodput_by_rank
    from test_gpu_reports import SESSION, SharedGpu, _rank, _train

    for run_id, start, n, save in (("a1", 0, 20, 10), ("a2", 10, 20, None)):
        gpus = [SharedGpu(100.0, sharers=1), SharedGpu(100.0, sharers=1)]
        pairs = [_rank(tmp_path, run_id, rank, gpus[rank]) for rank in (0, 1)]
        for rank, (t, r) in enumerate(pairs):
            _train([(t, r)], gpus[rank], start, n, save_at=save)
            if run_id == "a2":
                r.on_train_end()
                r.on_app_end()
            assert t.close()
    session = tmp_path / SESSION
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    python = goodput_by_rank(session)
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    sql = goodput_by_rank(session)
    assert sorted(python) == sorted(sql) == [0, 1]
    for rank in python:
        assert not differences(python[rank].as_dict(), sql[rank].as_dict()), rank
    energy = sql[0].energy
    assert energy is not None and energy.energy_J == pytest.approx(8000.0) and energy.wasted_J == pytest.approx(2000.0)


def test_a_copy_of_schema_version_1_counts_as_no_copy(tmp_path: Path) -> None:
    """A segment compacted by a telemetrain before metric attributes (manifest schema_version 1): read from its JSONL
    (no warning, nothing twice), and `compact` rewrites it in the current version."""
    import json
    import warnings

    from telemetrain.store.columnar import SCHEMA_VERSION

    t = Telemetry(identity_from_env({}, run_id="old", session_tag="s", perf_tag="p", rank=0, world_size=1),
                  store=tmp_path)
    for i in range(50):
        t.metric("system.disk.io", float(i), "system", {"disk.io.direction": "read"}, step=i)
    assert t.close(30)
    run = tmp_path / "s" / "old"
    assert compact(run).segments == 1
    manifest = next((run / COLUMNAR_DIR / "_segments").rglob("*.json"))
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "schema_version": 1}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Engine([run]) as engine:
            assert engine.tail_segments == 1
            assert engine.scalar("SELECT count(*) FROM metrics WHERE attributes IS NOT NULL") == 50
    assert compact(run).segments == 1
    assert json.loads(manifest.read_text())["schema_version"] == SCHEMA_VERSION
    with Engine([run]) as engine:
        assert engine.tail_segments == 0 and engine.scalar("SELECT count(*) FROM metrics") == 50


def test_a_copy_of_schema_version_2_is_read_and_compact_rewrites_it(v2_run: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy written before the typed reports (schema version 2) is still read from its Parquet files, its reports
    typed at read time into the same ``reports`` rows the current copy holds (and the JSONL gives); ``compact``
    rewrites it in the current version, ``reports`` files included."""
    import json

    from telemetrain.store.columnar import SCHEMA_VERSION

    run = tmp_path / "s" / "v2"
    shutil.copytree(v2_run, run)
    shutil.rmtree(run / COLUMNAR_DIR, ignore_errors=True)
    query = "SELECT * FROM reports ORDER BY rank, pid, segment, line"
    with Engine([run]) as engine:
        from_jsonl = engine.rows(query)
    assert len(from_jsonl) == 2 * STEPS // 10 and any(r is not None for r in from_jsonl[0])
    with monkeypatch.context() as m:
        m.setattr(compact_batch, "SMALL_SEGMENT_BYTES", -1)  # a version-2 copy had one file a table a segment
        assert compact(run).segments == 2
    with Engine([run]) as engine:
        assert engine.tail_segments == 0 and not engine.untyped_reports and engine.rows(query) == from_jsonl
    assert _as_schema_2(run) == 2
    with Engine([run]) as engine:
        assert engine.tail_segments == 0 and len(engine.untyped_reports) == 2
        assert engine.rows(query) == from_jsonl
    assert compact(run).segments == 2  # the old copy does not count as done
    for manifest in (run / COLUMNAR_DIR / "_segments").rglob("*.json"):
        data = json.loads(manifest.read_text())
        assert data["schema_version"] == SCHEMA_VERSION and "reports" in {f["table"] for f in data["files"]}
    with Engine([run]) as engine:
        assert not engine.untyped_reports and engine.rows(query) == from_jsonl


@pytest.mark.parametrize("records_at_once", [None, 1], ids=["ranks-together", "rank-by-rank"])
def test_spikes_by_the_sql_selection_are_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  records_at_once: int | None) -> None:
    """The loss series reach the SQL path's rules as their spike candidates and neighbours (findings_sql): isolated
    spikes, a jump that stays (that series read whole), a loss named alike in two groups (a series each, named by its
    group), a loss logged without steps, a gradient norm crossing zero, NaN; report, show and tail agree
    with the pure-Python path, the blocks of the spike pre-filter made for both ranks at once or rank by rank."""
    if records_at_once is not None:
        from telemetrain.analysis import findings_sql

        monkeypatch.setattr(findings_sql, "BLOCK_RECORDS_AT_ONCE", records_at_once)
    for rank in (0, 1):
        t = Telemetry(identity_from_env({}, run_id="sp", session_tag="s", perf_tag="p", rank=rank, world_size=2),
                      store=tmp_path)
        for step in range(400):
            loss = 2.0 / (1 + step / 80) + 0.01 * ((step * 7 + rank) % 5)
            if step in (90, 250):
                loss *= 30 * (1 + step % 7)
            if rank == 1 and 300 <= step < 380:
                loss = 20.0 + 0.1 * (step % 3)  # a jump that stays: spikes that are no candidates after a while
            t.log({"train.loss": math.nan if step == 333 else loss,
                   "train.grad_norm": 0.5 * math.sin(step / 9) + (9.0 if step == 120 else 0.0)}, step=step)
            if step % 4 == 0:
                t.metric("loss", loss * (5.0 if step == 200 else 1.0), "eval", step=step)
                t.metric("loss", loss, "val")  # the same name, another group, no step
            if step % 10 == 9:
                t.event("training_metrics_update", {"current_iteration": step, "window_iterations": 10,
                                                    "avg_iteration_time_sec": 0.1}, group="training")
        assert t.close(30)
    run_dir = tmp_path / "s" / "sp"
    assert not compact(run_dir).errors
    # (the findings and show's lines: the whole model differs in the curve of the step-less series, drawn by time)
    (model, py_show), (sql_model, sql_show), read = _python_and_sql(run_dir, monkeypatch)
    assert not read and sql_show == py_show
    assert not differences(model.findings, sql_model.findings)
    spikes = [f for f in model.findings if f.kind == "spike"]
    assert {f.title.split(": ")[1].split(" at ")[0] for f in spikes} == {"train.loss", "train.grad_norm", "eval/loss",
                                                                         "val/loss"}
    from telemetrain.analysis.show_sql import findings_builder_sql

    with Engine([run_dir]) as engine:
        values = findings_builder_sql(engine, open_run(run_dir)).build().values
    whole = {(s.name, s.rank) for s in values if s.selection is None}
    assert ("train.loss", 1) in whole and ("train.loss", 0) not in whole  # the burst's series only
    loss0 = next(s for s in values if (s.name, s.rank) == ("train.loss", 0))
    assert len(loss0.points) < 200  # the two spikes and their neighbours (the gradient norm, crossing 0: all)


def test_memory_gauges_thinned_by_sql_are_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory gauges longer than the memory rule reads (``memory.MAX_POINTS`` from the steady state on) reach the
    SQL path's rule as those points only (findings_sql); a gauge with a NaN, or a short one, whole. A leak on rank
    1's RSS and rank 0's CUDA memory, flat memory elsewhere: both paths find the same."""
    from telemetrain import telemetry as telemetry_module

    # the records' clock advances 1 ms per record: the rule reads memory against wall time, and a loop paused by a
    # loaded machine late in the run made the leak look levelled off (its last half's slope under a quarter)
    ticks = itertools.count(time.monotonic_ns(), 1_000_000)
    monkeypatch.setattr(telemetry_module, "_monotonic_ns", lambda: next(ticks))
    for rank in (0, 1):
        t = Telemetry(identity_from_env({}, run_id="mem", session_tag="s", perf_tag="p", rank=rank, world_size=2),
                      store=tmp_path)
        for step in range(900):
            t.metric("process.memory.usage", 2e9 + (3e6 * step if rank == 1 else 1e3 * (step % 5)), "system")
            cuda = 1e9 + (4e6 * step if rank == 0 else 0.0)
            t.metric("torch.cuda.memory.allocated", math.nan if rank == 1 and step == 500 else cuda,
                     f"system.cuda.{rank}")
            if step % 300 == 0:
                t.metric("torch.cuda.memory.allocated", 5e8, f"system.cuda.{rank + 2}")  # short: 3 points
            if step % 10 == 9:
                t.event("training_metrics_update", {"current_iteration": step, "window_iterations": 10,
                                                    "train_iterations_start": 0, "avg_iteration_time_sec": 0.1},
                        group="training")
        t.metric("hw.gpu.memory.limit", 80e9, f"system.gpu.{rank}")
        assert t.close(30)
    run_dir = tmp_path / "s" / "mem"
    model, _ = _both_paths(run_dir, True, monkeypatch)
    growth = [f for f in model.findings if f.kind == "memory growth"]
    assert {f.title.split(" of ")[0] for f in growth} == {"memory growth: resident memory (RSS)",
                                                          "memory growth: CUDA allocated memory"}, growth
    from telemetrain.analysis.show_sql import findings_builder_sql

    with Engine([run_dir]) as engine:
        memory = {(s.kind, s.rank, s.device): s for s in findings_builder_sql(engine, open_run(run_dir)).build().memory}
    assert memory[("rss", 0, "")].thinned is not None and len(memory[("rss", 0, "")].points) == 200
    assert memory[("cuda", 0, "cuda:0")].thinned is not None
    assert memory[("cuda", 1, "cuda:1")].thinned is None and len(memory[("cuda", 1, "cuda:1")].points) == 900
    assert memory[("cuda", 0, "cuda:2")].thinned is None and len(memory[("cuda", 0, "cuda:2")].points) == 3
