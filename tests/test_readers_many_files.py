"""The readers' memory on runs of many small JSONL files (one per rank, BENCHMARKS.md "Many ranks, few iterations"):
``tail``'s catch-up sorts the findings' metric rows a group of ranks at a time, with the same state as polling every
file; an engine converts the JSONL under the readers' memory limit, and only then gets a user query's larger one."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("duckdb")

from conftest import logged_queries
from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis import tail_sql
from telemetrain.analysis.tail import TailState
from telemetrain.store import engine as engine_module
from telemetrain.store.engine import QUERY_MEMORY, READER_MEMORY, Engine, open_engine
from telemetrain.store.tails import TailLoader
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

RANKS = 6


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six ranks of 30 iterations each, a file per rank, every rank with the same pid (as in containers)."""
    root = tmp_path_factory.mktemp("store")
    for rank in range(RANKS):
        rng = random.Random(rank)
        t = Telemetry(identity_from_env({}, run_id="run", session_tag="many", rank=rank, world_size=RANKS),
                      store=root)
        r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=10),
                             telemetry=t)
        now = 1_000_000.0 + rank
        r.on_app_start(now)
        r.on_train_start(0, start_time_msec=now)
        for step in range(30):
            r.on_training_single_iteration_start(now)
            now += 100.0 * rng.gauss(1.0, 0.02)
            r.on_training_single_iteration_end(now)
            t.metric("loss", 1.0 / (step + 1) + rank, step=step)
            t.metric("grad_norm", float("nan") if step == 7 else 0.5, step=step)
            now += 1.0
        r.on_train_end(now)
        r.on_app_end(now + 1)
        assert t.close()
    return root / "many" / "run"


@pytest.mark.parametrize("at_once", [tail_sql.METRICS_AT_ONCE, 1], ids=["all-ranks", "rank-by-rank"])
def test_tail_catch_up_by_groups_of_ranks_is_polling(run_dir: Path, at_once: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tail_sql, "METRICS_AT_ONCE", at_once)
    queries = logged_queries(monkeypatch)
    polled = TailState(run_dir)
    polled.poll()
    caught = TailState(run_dir)
    with Engine([run_dir]) as engine:
        caught.catch_up(engine)
    assert caught.poll() == 0
    for name in ("ranks", "errors", "warnings", "spans_not_ok", "diagnostics", "records"):
        assert getattr(polled, name) == getattr(caught, name), name
    assert len(polled.ranks) == RANKS and polled.records > RANKS * 60
    assert repr(polled.findings()) == repr(caught.findings()) and "nan/inf" in repr(polled.findings())  # (NaN: by repr)
    assert polled.loss_summary() == caught.loss_summary() != "-"
    assert repr(polled.curves.curves()) == repr(caught.curves.curves())
    sorted_metrics = [q for q in queries if "FROM metrics" in q and "ORDER BY rank, pid, segment, line" in q]
    assert len(sorted_metrics) == (1 if at_once > 1 else RANKS)  # a query a group of ranks


def _limit(con: Any) -> str:
    return str(con.execute("SELECT current_setting('memory_limit')").fetchone()[0])


def test_the_jsonl_is_converted_under_the_readers_limit(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user query's engine (512 MB) converts the files under the readers' 128 MB, then queries under its own."""
    monkeypatch.delenv(engine_module.MEMORY_ENV, raising=False)
    seen: list[str] = []
    flush = TailLoader.flush

    def watched(self: TailLoader) -> None:
        seen.append(_limit(self.con))
        flush(self)

    monkeypatch.setattr(TailLoader, "flush", watched)
    with Engine([run_dir]) as reader:
        reader_limit = _limit(reader.con)
    with open_engine([run_dir]) as query:
        assert _limit(query.con) != reader_limit
        assert query.query("SELECT count(*) FROM metrics WHERE name = 'loss'").fetchall() == [(RANKS * 30,)]
    assert seen and set(seen) == {reader_limit}  # both engines' conversions under the readers' limit
    assert QUERY_MEMORY != READER_MEMORY


def test_smaller_memory_size() -> None:
    smaller = engine_module._smaller
    assert smaller("512MB", "128MB") == "128MB" and smaller("64MB", "128MB") == "64MB"
    assert smaller("1GiB", "128MB") == "128MB" and smaller("100000KB", "128MB") == "100000KB"
    assert smaller("not a size", "128MB") == "not a size"
