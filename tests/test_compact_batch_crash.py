"""A batch's shared files under a real SIGKILL: a compactor killed at any point of a batch (before its files are in
place, between them, between its segments' manifests) leaves a run every reader reads as its JSONL, whether the run
had no copy or an older one (``--force``); the next compaction finishes the copy, and the files no manifest names
any more are swept once old. And a run still being written: a segment that grew moves to a new file, the others stay."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from telemetrain.store import compact_batch
from telemetrain.store.compact import COLUMNAR_DIR, compact
from telemetrain.store.engine import Engine
from telemetrain.store.manifest import SEGMENTS_DIR, SHARED_DIR
from telemetrain.store.views import ALL_TABLES
from test_reader_damage import _write_run

# os.replace's n-th call kills the compactor before it renames: the batch's shared files are renamed into place
# first (one a table: 5 for this run), then each segment's manifest (4)
KILLER = """
import os, signal, sys
from telemetrain.store.compact import compact
calls, real = [0], os.replace
def replace(*args, **kwargs):
    calls[0] += 1
    if calls[0] == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
os.replace = replace
compact(sys.argv[1], force=sys.argv[3] == "1")
"""


def _tables(run: Path) -> dict[str, str]:
    """Every table's rows, as every reader's SQL sees them."""
    with Engine([run]) as engine:
        assert not engine.ignored
        return {t: repr(engine.rows(f"SELECT * FROM {t} ORDER BY ALL")) for t in ALL_TABLES}


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    run = _write_run(tmp_path_factory.mktemp("crash"), ranks=4, n=30)
    return run, _tables(run)


@pytest.mark.parametrize("force", [False, True], ids=["no-copy", "over-a-copy"])
@pytest.mark.parametrize("at", [1, 3, 6, 8])
def test_a_compactor_killed_mid_batch_leaves_a_run_read_as_its_jsonl(tmp_path: Path, at: int, force: bool,
                                                                     jsonl: tuple[Path, dict[str, str]]) -> None:
    source, expected = jsonl
    run = tmp_path / "s" / "r1"
    shutil.copytree(source, run)
    if force:
        assert compact(run).segments == 4
        before = {p: p.read_bytes() for p in (run / COLUMNAR_DIR / SEGMENTS_DIR).rglob("*.json")}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    killed = subprocess.run([sys.executable, "-c", KILLER, str(run), str(at), "1" if force else "0"], env=env,
                            timeout=120)
    assert killed.returncode == -signal.SIGKILL
    manifests = {p: p.read_bytes() for p in (run / COLUMNAR_DIR / SEGMENTS_DIR).rglob("*.json")}
    new = [p for p, data in manifests.items() if not force or before.get(p) != data]
    assert len(new) == max(0, at - 6)  # the manifests written before the kill
    assert _tables(run) == expected  # each segment from its copy (old or new) or its JSONL, once
    result = compact(run)
    assert not result.errors and result.segments == (0 if force else 4 - len(new))  # (an old copy is still valid)
    assert _tables(run) == expected
    with Engine([run]) as engine:
        assert engine.tail_segments == 0
    # files no manifest names (the killed batch's, the copy replaced): swept by a later compaction once old
    named = {os.path.normpath(run / COLUMNAR_DIR / f["path"])
             for m in (run / COLUMNAR_DIR / SEGMENTS_DIR).rglob("*.json") for f in json.loads(m.read_text())["files"]}
    shared = list((run / COLUMNAR_DIR / SHARED_DIR).rglob("*.parquet"))
    orphans = [p for p in shared if os.path.normpath(p) not in named]
    assert bool(orphans) == (1 < at <= 6), orphans  # (renamed into place, named by no manifest)
    old = time.time() - compact_batch.STALE_BATCH_S - 60
    for p in shared:
        os.utime(p, (old, old))
    assert compact(run).skipped == 4
    assert sorted(os.path.normpath(p) for p in (run / COLUMNAR_DIR / SHARED_DIR).rglob("*.parquet")) == sorted(named)
    assert _tables(run) == expected


def test_a_segment_that_grew_is_read_once_from_its_shared_file_and_then_from_its_own(tmp_path: Path) -> None:
    """A run still being written: a segment of a batch grows after compaction. Its shared file still serves the lines
    it covered (the rest from the JSONL); compacted again, the segment moves to a new batch's file while the others
    keep the old one, which is then read for their rows only."""
    run = _write_run(tmp_path, ranks=4, n=30)
    assert compact(run).segments == 4
    grown = sorted(run.glob("rank-1.*.jsonl"))[0]
    with open(grown, "a") as fh:
        fh.write('{"v":2,"kind":"metric","mono_ns":9,"wall_ns":9,"group":"g","name":"late","value":2}\n')
    jsonl = tmp_path / "jsonl"
    shutil.copytree(run, jsonl / "s" / "r1", ignore=shutil.ignore_patterns(COLUMNAR_DIR))
    expected = _tables(jsonl / "s" / "r1")
    assert _tables(run) == expected  # the copy's rows and the new line, once each
    assert compact(run).segments == 1
    with Engine([run]) as engine:
        assert engine.tail_segments == 0
        partial = [f for f, (total, keys) in engine.shared["metrics"].items() if len(set(keys)) < total]
        assert len(partial) == 1 and len(engine.shared["metrics"]) == 2
        assert engine.scalar("SELECT count(*) FROM metrics WHERE name = 'late'") == 1
    assert _tables(run) == expected
