"""Compaction of many small segments together (``store.compact_batch``): the copy holds the rows a segment at a
time writes, segment for segment and row for row, in one file a table for the batch (damaged lines, an identity
change inside a file, a restarted session of four ranks, reports, headers), and the number of statements does not
grow with the segments."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

duckdb = pytest.importorskip("duckdb")

from telemetrain.store import compact as compact_module  # noqa: E402
from telemetrain.store import compact_batch  # noqa: E402
from telemetrain.store.compact import COLUMNAR_DIR, compact  # noqa: E402
from telemetrain.store.manifest import SEGMENTS_DIR, SHARED_DIR  # noqa: E402
from test_reader_damage import DAMAGED, _write_run  # noqa: E402
from test_report import _write_session  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:telemetrain. sink 'broken' failed")


def _runs(root: Path) -> list[Path]:
    """A restarted session of four ranks, and a run of two ranks with damaged lines and a second identity in a file."""
    runs = list(_write_session(root / "a"))
    damaged = _write_run(root / "b", ranks=3, n=50)
    f = sorted(damaged.glob("rank-1.*.jsonl"))[0]
    header = json.loads(f.read_text().splitlines()[0])
    header["identity"]["rank"] = 7  # a header naming another rank mid-file: rows of two rank partitions
    f.write_text(f.read_text() + "\n".join(DAMAGED) + "\n" + json.dumps(header) + "\n" + "\n".join(DAMAGED[:7])
                 + "\n" + '{"v":2,"kind":"metric","mono_ns":9,"wall_ns":9,"group":"g","name":"n","value":2}\n'
                 + '{"v":2,"kind":"met')  # a torn last line
    return [*runs, damaged]


def _copy(run: Path) -> dict[str, Any]:
    """Every manifest (less when and how long, and where its files are) with each of its segment's rows and
    key-value metadata by table: a segment's own files (one a rank partition) and a batch's shared files (their rows
    of the segment's ``source``) give the same rows."""
    base = run / COLUMNAR_DIR
    out: dict[str, Any] = {}
    con = duckdb.connect()
    for f in sorted((base / SEGMENTS_DIR).rglob("*.json")):
        manifest = json.loads(f.read_text())
        for key in ("compacted_wall_ns", "seconds", "schema_version"):
            manifest.pop(key)
        rows: dict[str, list[Any]] = {}
        meta: dict[str, set[Any]] = {}
        entries = manifest.pop("files")
        for entry in entries:
            path = base / entry["path"]
            if "source" in entry:
                assert (entry["source"], path.parent.parent.parent.name) == (manifest["segment"], entry["table"])
                query = (f"SELECT * EXCLUDE (session, run, rank, source) FROM read_parquet('{path}', "
                         f"hive_partitioning = false) WHERE source = '{manifest['segment']}'")
            else:
                query = f"SELECT * FROM read_parquet('{path}', hive_partitioning = false)"
            found = con.execute(query).fetchall()
            assert len(found) == entry["rows"]
            rows.setdefault(entry["table"], []).extend(found)
            meta.setdefault(entry["table"], set()).update(
                con.execute(f"SELECT key, value FROM parquet_kv_metadata('{path}')").fetchall())
        # (by repr: a NaN is not equal to itself; in line order: a segment's own files are one a rank)
        manifest["rows"] = {t: repr(sorted(r, key=repr)) for t, r in rows.items()}
        manifest["meta"] = meta
        out[f.relative_to(base).as_posix()] = manifest
    con.close()
    return out


def test_a_batch_writes_the_rows_a_segment_at_a_time_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _runs(tmp_path)
    alone = {}
    for run in runs:
        with monkeypatch.context() as m:
            m.setattr(compact_batch, "SMALL_SEGMENT_BYTES", -1)  # no segment small enough: each process alone
            result = compact(run)
        assert not result.errors and result.segments
        assert not list((run / COLUMNAR_DIR).glob(f"{SHARED_DIR}/*"))
        alone[run] = (_copy(run), result.records, result.segments)
        shutil.rmtree(run / COLUMNAR_DIR)
    monkeypatch.setattr(compact_batch, "BATCH_SEGMENTS", 3)  # batches of three segments: several, and what is left
    for run in runs:
        result = compact(run)
        assert not result.errors
        copy, records, segments = alone[run]
        assert (result.records, result.segments) == (records, segments)
        assert _copy(run) == copy
        shared = list((run / COLUMNAR_DIR / SHARED_DIR).rglob("*.parquet"))
        assert shared and not [p for p in (run / COLUMNAR_DIR).rglob("*.parquet") if p not in shared]
        assert not [p for p in (run / COLUMNAR_DIR).rglob("*") if ".tmp" in p.name]  # nothing left behind
        again = compact(run)  # idempotent: every copy valid, nothing converted again
        assert again.segments == 0 and again.skipped == segments


class _Counted:
    """A DuckDB connection that counts the COPY statements run through it."""

    def __init__(self, con: Any, copies: list[str]) -> None:
        self._con, self._copies = con, copies

    def execute(self, query: str, *args: Any) -> Any:
        if query.lstrip().upper().startswith("COPY"):
            self._copies.append(query)
        return self._con.execute(query, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


@pytest.mark.parametrize("ranks", [8, 32])
def test_compacting_many_small_segments_writes_each_table_once_a_batch(tmp_path: Path, ranks: int,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of many ranks of one small segment each: a COPY per table for the whole batch, not per segment (seven
    files a segment, each by its own statement, made ~0.17 s a segment)."""
    run = _write_run(tmp_path, ranks=ranks, n=20)
    copies: list[str] = []
    connect = compact_module.connect
    monkeypatch.setattr(compact_module, "connect", lambda *a, **k: _Counted(connect(*a, **k), copies))
    result = compact(run)
    assert not result.errors and result.segments == ranks
    tables = {f["table"] for m in (run / COLUMNAR_DIR / SEGMENTS_DIR).rglob("*.json")
              for f in json.loads(m.read_text())["files"]}
    assert len(copies) == len(tables) and len(tables) >= 5
    # one file a table for the batch, not one a table for each segment (14,336 small files for 2,048 ranks made
    # every query over the copy list and open them all)
    assert len(list((run / COLUMNAR_DIR).rglob("*.parquet"))) == len(tables)
    # a tree for other engines (--to) keeps the Hive layout whole: a segment's own files, none shared
    tree = tmp_path / "tree"
    assert compact(run, str(tree)).segments == ranks
    assert len(list(tree.rglob("*.parquet"))) == ranks * len(tables) and not (tree / SHARED_DIR).exists()


def test_a_batch_that_fails_is_compacted_a_segment_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose conversion fails (a DuckDB error) leaves no segment behind: each is then converted alone, with
    its own error if it has one."""
    run = _write_run(tmp_path, ranks=4, n=20)

    def failing(*args: Any) -> Any:
        raise duckdb.InvalidInputError("planted")

    monkeypatch.setattr(compact_batch, "_compact_batch", failing)
    result = compact(run)
    assert not result.errors and result.segments == 4
    assert compact(run).skipped == 4


def test_a_killed_compactors_batch_folder_is_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    """A SIGKILL mid-batch leaves its working folder: the next compaction of the run removes it once it is old
    enough that no live compactor can still be writing it (a batch takes seconds), and leaves a recent one alone."""
    import os
    import time

    run = _write_run(tmp_path, ranks=2, n=10)
    base = run / COLUMNAR_DIR
    stale, recent = base / ".batch-4242.tmp", base / ".batch-4343-0a1b2c3d.tmp"
    for folder in (stale, recent):
        (folder / "metrics" / "pk=0").mkdir(parents=True)
        (folder / "metrics" / "pk=0" / "f.parquet").write_bytes(b"half a file")
    old = time.time() - compact_batch.STALE_BATCH_S - 60
    os.utime(stale, (old, old))
    result = compact(run)
    assert not result.errors and result.segments == 2
    assert not stale.exists() and recent.exists()
    assert not [p for p in base.glob(".batch-*.tmp") if p != recent]  # its own batch's folder went too
