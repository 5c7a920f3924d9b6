"""Ranks that share a pid (one process per container: every rank's pid is the same small number) are told apart by
their rank when the engine fetches rows from their segments' Parquet files."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from telemetrain import Telemetry, identity_from_env
from telemetrain.store.compact import COLUMNAR_DIR, compact
from telemetrain.store.engine import Engine

RANKS = 3


def _write(root: Path) -> Path:
    for rank in range(RANKS):  # one process writes every rank: each rank's files carry the same pid
        identity = identity_from_env({}, run_id="run", session_tag="s", rank=rank, world_size=RANKS)
        t = Telemetry(identity, store=root)
        t.event("marker", {"who": rank}, group="training")
        assert t.close(timeout=30)
    return root / "s" / "run"


def test_fetch_reads_only_the_files_of_the_rows_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEMETRAIN_COMPACT", "0")
    run = _write(tmp_path)
    assert not compact(run).errors
    with Engine([run]) as engine:
        keys = engine.rows("SELECT session, run, rank, pid, segment, line FROM events WHERE name = 'marker' "
                           "ORDER BY rank")
        assert [k[2] for k in keys] == list(range(RANKS)) and len({k[3] for k in keys}) == 1  # one pid
        # the other ranks' event files gone after the listing: a fetch of rank 0's row must not open them
        for rank in range(1, RANKS):
            for f in (run / COLUMNAR_DIR / "events").rglob(f"rank={rank}/*.parquet"):
                f.unlink()
        names, rows = engine.fetch("events", [keys[0]])
    got = [dict(zip(names, row, strict=True)) for row in rows]
    assert [(r["rank"], r["name"]) for r in got] == [(0, "marker")]


@pytest.mark.parametrize("apart", [0, 64], ids=["one-query", "a-query-a-segment"])
def test_fetch_of_many_segments_in_one_query_gives_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  apart: int) -> None:
    """Past FETCH_APART segments the rows come from one query over their files (the positions joined): the same
    rows, each rank's own, as a query per segment gives."""
    monkeypatch.setenv("TELEMETRAIN_COMPACT", "0")
    run = _write(tmp_path)
    assert not compact(run).errors
    monkeypatch.setattr("telemetrain.store.fetch.FETCH_APART", apart)
    with Engine([run]) as engine:
        keys = engine.rows("SELECT session, run, rank, pid, segment, line FROM events WHERE name = 'marker' "
                           "ORDER BY rank")
        names, rows = engine.fetch("events", [keys[2], keys[0]])
    got = [dict(zip(names, row, strict=True)) for row in rows]
    assert [(r["rank"], r["name"], r["line"]) for r in got] == [(0, "marker", keys[0][5]), (2, "marker", keys[2][5])]
    assert [r["attributes"] for r in got] == ['{"who":0}', '{"who":2}']
