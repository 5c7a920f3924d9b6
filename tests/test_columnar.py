"""The columnar copy and the DuckDB readers: the same numbers as the pure-Python reader, damaged input, read-only
queries, the writer's segments and compaction, an S3-compatible server (moto), and the reader crashes of issue 15
(items 9 and 13)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from telemetrain import Telemetry, identity_from_env
from telemetrain.store import open_run
from telemetrain.store.codec import decode_line

duckdb = pytest.importorskip("duckdb")

from telemetrain.store.columnar import COLUMNS, TABLES, ColumnarVersionError  # noqa: E402
from telemetrain.store.compact import COLUMNAR_DIR, compact  # noqa: E402
from telemetrain.store.engine import ColumnarWarning, Engine, ReadOnlyQueryError  # noqa: E402
from telemetrain.store.row_records import record_from_row  # noqa: E402

PY = sys.executable

from test_reader_damage import DAMAGED, _write_run  # noqa: E402  (the core's run and damaged lines)


def _records_python(run: Path) -> list[Any]:
    return sorted((tuple(r) for p in open_run(run).processes for r in p.records), key=repr)


def _records_sql(run: Path) -> list[Any]:
    out = []
    with Engine([run]) as engine:
        for kind, table in TABLES.items():
            cur = engine.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cur.description]
            for row in cur.fetchall():
                r = dict(zip(names, row, strict=True))
                ident = open_run(run).processes[0].identity.replace(rank=r["rank"], pid=r["pid"])
                out.append(tuple(record_from_row(kind, ident, row, names)))
    return sorted(out, key=repr)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b) and type(a) is type(b)


@pytest.mark.parametrize("chunk", [8 << 20, 700], ids=["one-chunk", "many-chunks"])
def test_sql_and_python_readers_keep_and_skip_the_same_lines(tmp_path: Path, chunk: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import telemetrain.store.convert as convert_module
    import telemetrain.store.tails as tails_module

    monkeypatch.setattr(convert_module, "CHUNK_BYTES", chunk)  # a segment converted in pieces: the same rows
    if chunk < 1000:  # (by the engine too: a tail converted alone, not with others)
        monkeypatch.setattr(tails_module, "BATCH_FILE_BYTES", 0)
    run = _write_run(tmp_path, ranks=1, n=20)
    f = next(run.glob("rank-*.jsonl"))
    with open(f, "a") as fh:
        fh.write("\n".join(DAMAGED) + "\n" + f.read_text().splitlines()[0] + "\n"  # a header again, mid-file
                 + '{"v":1,"kind":"metric","mono_ns":5,"wall_ns":1,"group":"g","name":"after","value":1}\n'
                 + '{"v":1,"kind":"metr')  # and a torn last line
    log = open_run(run).processes[0]
    python = _records_python(run)
    assert all(type(decode_line(json.dumps(line), log.identity)) is dict for line in ({"v": 1, "kind": "process",
               "identity": log.identity.as_dict()},))
    with Engine([run]) as engine:  # from the JSONL (nothing compacted yet)
        torn, corrupt = engine.execute("SELECT sum(torn), sum(corrupt) FROM damage").fetchone()
    assert (torn, corrupt) == (log.torn, log.corrupt) == (1, 16)
    sql = _records_sql(run)
    assert len(sql) == len(python) and all(_same(a, b) for a, b in zip(python, sql, strict=True))
    result = compact(run)  # and from the Parquet copy: the same again
    assert result.segments == 1 and not result.errors
    with Engine([run]) as engine:
        assert engine.tail_segments == 0
        assert engine.execute("SELECT sum(torn), sum(corrupt) FROM damage").fetchone() == (1, 16)
    assert all(_same(a, b) for a, b in zip(python, _records_sql(run), strict=True))


@pytest.mark.parametrize("batch_bytes", [8 << 20, 1], ids=["one-batch", "a-batch-per-tail"])
def test_small_tails_read_together_keep_each_files_identity_lines_and_damage(
        tmp_path: Path, batch_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine converts small tails together (``store.tails``): each record keeps its own process, identity,
    segment and line, and each process its own counts, whatever shares its batch: damage and a second header in one
    file, a line that is not UTF-8 in another, a file that grew after its copy (its tail starts mid-file), and a
    file too large to wait (converted alone, between the batched ones)."""
    import telemetrain.store.tails as tails_module

    monkeypatch.setattr(tails_module, "BATCH_BYTES", batch_bytes)
    monkeypatch.setattr(tails_module, "BATCH_FILE_BYTES", 64 << 10)
    run = _write_run(tmp_path, ranks=5, n=20)
    files = sorted(run.glob("rank-*.jsonl"))
    compact(run)
    for copy in (run / COLUMNAR_DIR).rglob("rank-[1-4].*"):  # rank 0's copy only
        copy.unlink()
    with open(files[0], "a") as fh:  # grown after its copy: only the new lines are read from the JSONL
        fh.write('{"v":1,"kind":"metric","mono_ns":9,"wall_ns":1,"group":"g","name":"grown","value":2}\n')
    header = files[1].read_text().splitlines()[0]
    moved = header.replace('"host":"', '"host":"moved-')
    assert moved != header
    with open(files[1], "a") as fh:  # damage, then the process's identity changes mid-file
        fh.write("\n".join(DAMAGED) + "\n" + moved + "\n"
                 + '{"v":1,"kind":"metric","mono_ns":5,"wall_ns":1,"group":"g","name":"after","value":1}\n')
    with open(files[2], "ab") as fh:  # a line that is not UTF-8, and a torn last line
        fh.write(b'{"v":1,"kind":"metric","mono_ns":5,"wall_ns":1,"group":"g","name":"\xff","value":1}\n{"v":1,')
    with open(files[3], "a") as fh:  # larger than a tail that waits
        for i in range(2000):
            fh.write(f'{{"v":1,"kind":"metric","mono_ns":{i},"wall_ns":1,"group":"g","name":"big","value":{i}}}\n')
    python = open_run(run)
    with Engine([run]) as engine:
        assert engine.tail_segments == 5
        damage = {rank: (torn, corrupt) for rank, torn, corrupt in engine.rows(
            "SELECT rank, torn, corrupt FROM damage")}
        assert damage == {log.rank: (log.torn, log.corrupt) for log in python.processes}
        assert damage[1][1] == 16 and damage[2] == (1, 1)
        hosts = dict(engine.rows("SELECT name, host FROM metrics WHERE name IN ('after', 'loss') AND rank = 1"))
        assert hosts["after"].startswith("moved-") and not hosts["loss"].startswith("moved-")
        lines = {f: f.read_bytes().split(b"\n") for f in files}
        positions = engine.rows("SELECT rank, pid, segment, line, name FROM metrics")
        assert len(positions) == sum(1 for log in python.processes for r in log.records if r.kind == "metric")
        for rank, pid, segment, line, name in positions:
            f = next(f for f in files if f.name.startswith(f"rank-{rank}."))
            assert segment == 0 and str(pid) in f.name
            assert json.loads(lines[f][line])["name"] == name  # the line it came from, in its own file
    # (identities apart: _records_sql gives every row one process's, less its rank and pid; the hosts were compared)
    python_records, sql_records = (sorted((r[:2] + r[3:] for r in rs), key=repr)
                                   for rs in (_records_python(run), _records_sql(run)))
    assert len(sql_records) == len(python_records) > 2000
    assert all(_same(a, b) for a, b in zip(python_records, sql_records, strict=True))


def test_truncated_parquet_is_ignored_with_a_warning_and_nothing_double_counted(tmp_path: Path) -> None:
    run = _write_run(tmp_path, ranks=2, n=100)
    compact(run)
    manifest = json.loads(next((run / COLUMNAR_DIR / "_segments").rglob("rank-0*.json")).read_text())
    victim = run / COLUMNAR_DIR / next(f["path"] for f in manifest["files"] if f["table"] == "metrics")
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.warns(ColumnarWarning, match="truncated"), Engine([run]) as engine:
        # (the two small segments were compacted together: their file of metrics is one, shared)
        assert engine.tail_segments == 2
        assert engine.scalar("SELECT count(*) FROM metrics WHERE name = 'loss'") == 200
        assert engine.scalar("SELECT count(*) FROM events") == 2
    compact(run)  # the damaged copy is rebuilt
    with Engine([run]) as engine:
        assert engine.tail_segments == 0 and engine.scalar("SELECT count(*) FROM metrics WHERE name='loss'") == 200


def test_a_schema_version_from_the_future_is_a_clear_error(tmp_path: Path) -> None:
    run = _write_run(tmp_path, ranks=1, n=5)
    compact(run)
    manifest = next((run / COLUMNAR_DIR / "_segments").rglob("*.json"))
    data = json.loads(manifest.read_text())
    data["schema_version"] = 7
    manifest.write_text(json.dumps(data))
    with pytest.raises(ColumnarVersionError, match="schema version 7"):
        Engine([run])
    err = subprocess.run([PY, "-m", "telemetrain.cli", "query", str(run), "SELECT 1"], capture_output=True,
                         text=True, timeout=60)
    assert err.returncode == 2 and "version 7" in err.stderr and "Traceback" not in err.stderr


@pytest.mark.parametrize("sql", [
    "CREATE TABLE x AS SELECT 1", "INSERT INTO metrics SELECT * FROM metrics", "COPY metrics TO '/tmp/out.csv'",
    "ATTACH '/tmp/x.duckdb'", "SET enable_external_access = true", "SELECT 1; SELECT 2", "INSTALL httpfs",
    "SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM read_parquet('../../**/*.parquet')",
])
def test_query_refuses_writes_and_files_outside_the_run(tmp_path: Path, sql: str) -> None:
    run = _write_run(tmp_path, ranks=1, n=5)
    compact(run)
    with Engine([run]) as engine:
        with pytest.raises((ReadOnlyQueryError, duckdb.Error)):
            engine.query(sql).fetchall()
        assert engine.query("SELECT count(*) FROM metrics").fetchall()[0][0] == 8  # still usable
    proc = subprocess.run([PY, "-m", "telemetrain.cli", "query", str(run), sql], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "telemetrain: error: query" in proc.stderr
    assert not Path("/tmp/out.csv").exists() or sql != "COPY metrics TO '/tmp/out.csv'"


def test_query_command_and_python_api(tmp_path: Path) -> None:
    run = _write_run(tmp_path, ranks=2, n=50)
    proc = subprocess.run([PY, "-m", "telemetrain.cli", "query", str(run),
                           "SELECT rank, count(*) AS n FROM metrics WHERE name = 'loss' GROUP BY rank ORDER BY rank",
                           "--format", "csv"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["rank,n", "0,50", "1,50"]
    r = open_run(run)
    assert r.sql("SELECT max(value) FROM metrics WHERE name = 'loss'").fetchall()[0][0] == 1.0
    table = r.to_arrow("events")
    assert table.num_rows == 2 and set(COLUMNS["events"][0]) <= set(table.column_names) | {"BIGINT"}
    pytest.importorskip("pandas")
    assert len(r.to_pandas("metrics")) == 2 * 53


def test_compact_recovers_a_run_killed_mid_write(tmp_path: Path) -> None:
    """A writer killed with SIGKILL: compaction keeps every complete line, the torn one is counted."""
    code = f"""
import os, signal
from telemetrain import Telemetry, identity_from_env
ident = identity_from_env({{}}, run_id="k", session_tag="s", perf_tag="p", rank=0, world_size=1)
t = Telemetry(ident, store={str(tmp_path)!r})
for i in range(5000):
    t.metric("loss", float(i), step=i)
assert t.flush(30)
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([PY, "-c", code], timeout=120)
    assert proc.returncode == -9
    run = tmp_path / "s" / "k"
    f = next(run.glob("rank-*.jsonl"))
    with open(f, "a") as fh:
        fh.write('{"v":1,"kind":"metric","mono_ns":1,"wall_')  # the line the kill cut short
    result = compact(run)
    assert result.segments == 1 and result.records == 5000
    with Engine([run]) as engine:
        assert engine.tail_segments == 0
        assert engine.scalar("SELECT count(*) FROM metrics") == 5000
        assert engine.execute("SELECT torn, corrupt FROM damage").fetchone() == (1, 0)


def test_writer_rolls_segments_and_compacts_them_off_the_training_process(tmp_path: Path) -> None:
    """Segments roll by size (at batch boundaries); each closed one, and the last at close, is compacted by a
    separate process."""
    code = f"""
from telemetrain import Telemetry, identity_from_env
ident = identity_from_env({{}}, run_id="seg", session_tag="s", perf_tag="p", rank=0, world_size=1)
t = Telemetry(ident, store={str(tmp_path)!r})
for i in range(20000):
    t.metric("loss", float(i), step=i)
    if i % 1000 == 999:
        assert t.flush(30)
assert t.close(30)
"""
    env = {**os.environ, "TELEMETRAIN_SEGMENT_BYTES": "200000", "TELEMETRAIN_COMPACT_MIN_BYTES": "0"}
    subprocess.run([PY, "-c", code], timeout=120, check=True, env=env)
    run = tmp_path / "s" / "seg"
    segments = sorted(run.glob("rank-*.jsonl"))
    assert len(segments) >= 5
    deadline = time.monotonic() + 60  # the compaction processes run on their own
    manifests: list[Path] = []
    while time.monotonic() < deadline:
        manifests = list((run / COLUMNAR_DIR).rglob("*.jsonl.json")) if (run / COLUMNAR_DIR).exists() else []
        if len(manifests) == len(segments):
            break
        time.sleep(0.2)
    assert len(manifests) == len(segments)
    python = open_run(run)
    assert len(python) == 20000 and python.torn == python.corrupt == 0
    with Engine([run]) as engine:
        assert engine.tail_segments == 0
        assert engine.scalar("SELECT count(*) FROM metrics") == 20000
        # file order survives the segments: steps in (segment, line) order are 0..19999
        steps = [s for (s,) in engine.rows("SELECT step FROM metrics ORDER BY segment, line")]
        assert steps == list(range(20000))


def test_ranks_written_on_different_nodes_are_one_run(tmp_path: Path) -> None:
    """Node-local disks gathered later (each node wrote and compacted its own ranks): one run to every reader."""
    node_a = _write_run(tmp_path / "node-a", ranks=2, n=10, host="a")
    node_b = _write_run(tmp_path / "node-b", ranks=4, n=10, host="b")
    for f in node_b.glob("rank-[01].*"):
        f.unlink()
    compact(node_a)
    gathered = tmp_path / "gathered" / "s" / "r1"
    shutil.copytree(node_a, gathered)
    shutil.copytree(node_b, gathered, dirs_exist_ok=True)
    run = open_run(gathered)
    assert run.ranks == [0, 1, 2, 3]
    with Engine([gathered]) as engine:  # ranks 0-1 from Parquet, 2-3 from their JSONL
        assert engine.tail_segments == 2
        assert engine.rows("SELECT rank, host FROM metrics GROUP BY ALL ORDER BY rank") == [
            (0, "a-0"), (1, "a-1"), (2, "b-2"), (3, "b-3")]


@pytest.fixture(scope="module")
def s3_server() -> Any:
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([PY, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.2)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_compact_to_an_s3_compatible_server(tmp_path: Path, s3_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real S3 API (moto's server, on loopback): the Hive tree lands in the bucket, DuckDB reads it back."""
    import fsspec  # type: ignore[import-untyped]

    for key, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL": s3_server, "AWS_ENDPOINT_URL_S3": s3_server}.items():
        monkeypatch.setenv(key, value)
    fs = fsspec.filesystem("s3", client_kwargs={"endpoint_url": s3_server}, skip_instance_cache=True)
    fs.mkdir("runs-bucket")
    for run_id in ("r1", "r2"):
        run = _write_run(tmp_path / "store", ranks=2, n=30, run_id=run_id)
    result = compact(tmp_path / "store" / "s", "s3://runs-bucket/telemetry")
    assert result.segments == 4 and not result.errors
    files = fs.find("runs-bucket/telemetry/metrics")
    assert len(files) == 4 and all("/session=s/run=r" in f and "/rank=" in f for f in files)
    con = duckdb.connect()
    con.register_filesystem(fs)
    rows = con.execute("SELECT run, rank, count(*) FROM read_parquet('s3://runs-bucket/telemetry/metrics/**/*.parquet',"
                       " hive_partitioning = true) WHERE name = 'loss' GROUP BY ALL ORDER BY ALL").fetchall()
    assert rows == [("r1", 0, 30), ("r1", 1, 30), ("r2", 0, 30), ("r2", 1, 30)]
    assert run.exists()


# -- the writer's compaction: off when asked, one converter per segment, reaped, independent of training's fate ----

SEGMENTED = """
import os, signal, sys
from telemetrain import Telemetry, identity_from_env
from telemetrain.sinks.jsonl import RunStoreSink
ident = identity_from_env({{}}, run_id="{run}", session_tag="s", perf_tag="p", rank=0, world_size=1)
t = Telemetry(ident, store={store!r})
for i in range(20000):
    t.metric("loss", float(i), step=i)
    if i % 1000 == 999:
        assert t.flush(30)
{end}
"""


def _segmented(tmp_path: Path, run: str, end: str = "assert t.close(30)",
               **env: str) -> subprocess.CompletedProcess[bytes]:
    code = SEGMENTED.format(run=run, store=str(tmp_path), end=end)
    full_env = {**os.environ, "TELEMETRAIN_SEGMENT_BYTES": "200000", "TELEMETRAIN_COMPACT_MIN_BYTES": "0", **env}
    return subprocess.run([PY, "-c", code], timeout=180, env=full_env)


def _wait_for_manifests(run: Path, count: int, timeout: float = 90.0) -> list[Path]:
    deadline = time.monotonic() + timeout
    manifests: list[Path] = []
    while time.monotonic() < deadline:
        manifests = list((run / COLUMNAR_DIR).rglob("*.jsonl.json")) if (run / COLUMNAR_DIR).exists() else []
        if len(manifests) >= count:
            break
        time.sleep(0.2)
    return manifests


def test_the_writers_compaction_can_be_switched_off(tmp_path: Path) -> None:
    assert _segmented(tmp_path, "env", TELEMETRAIN_COMPACT="0").returncode == 0
    time.sleep(1.0)
    assert len(list((tmp_path / "s" / "env").glob("rank-*.jsonl"))) >= 5
    assert not (tmp_path / "s" / "env" / COLUMNAR_DIR).exists()
    from telemetrain.sinks.jsonl import RunStoreSink

    sink = RunStoreSink(tmp_path, compact=False)
    assert not sink.compactor.enabled and RunStoreSink(tmp_path, compact=True).compactor.enabled


def test_the_compactors_outlive_a_killed_or_terminated_training_process(tmp_path: Path) -> None:
    """SIGKILL right after the last flush: the compactors started at each roll run in their own session and finish
    on their own; SIGTERM: the close path compacts the last segment too. Training never waits for them."""
    killed = _segmented(tmp_path, "killed", end="os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == -signal.SIGKILL
    run = tmp_path / "s" / "killed"
    segments = sorted(run.glob("rank-*.jsonl"))
    closed = len(segments) - 1  # the last one was still open
    # the compactor running at the kill converts what was closed before it (the last closed one may have rolled
    # just as it finished: `telemetrain compact` takes it, and the open one)
    assert closed >= 4 and len(_wait_for_manifests(run, closed - 1)) >= closed - 1
    deadline = time.monotonic() + 60
    while _compactors_of(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _compactors_of(run)  # none left behind
    result = compact(run)
    assert result.segments <= 2 and not result.errors
    terminated = _segmented(tmp_path, "term", end="os.kill(os.getpid(), signal.SIGTERM); import time; time.sleep(30)")
    assert terminated.returncode != 0
    run = tmp_path / "s" / "term"
    assert len(_wait_for_manifests(run, len(list(run.glob("rank-*.jsonl"))))) == len(list(run.glob("rank-*.jsonl")))
    with Engine([run]) as engine:
        assert engine.tail_segments == 0 and engine.scalar("SELECT count(*) FROM metrics") == 20000


def test_one_segment_is_never_converted_by_two_compactors_at_once(tmp_path: Path) -> None:
    """A second compactor (the writer's close, a user's `telemetrain compact`) waits on the segment's lock, then
    finds the copy made and leaves it."""
    from telemetrain.store.compact import manifest_path, segment_lock

    run = _write_run(tmp_path, ranks=1, n=2000)
    segment = next(run.glob("rank-*.jsonl"))
    manifest = run / COLUMNAR_DIR / manifest_path("s", "r1", segment.name)
    argv = [PY, "-m", "telemetrain.store.compact", "--segments", str(segment), "--include-last"]
    with segment_lock(manifest):
        proc = subprocess.Popen(argv)
        time.sleep(2.0)
        assert proc.poll() is None and not manifest.exists()  # waiting for the lock held here
    assert proc.wait(timeout=120) == 0 and manifest.exists()
    made = json.loads(manifest.read_text())["compacted_wall_ns"]
    assert subprocess.run(argv, timeout=120).returncode == 0
    assert json.loads(manifest.read_text())["compacted_wall_ns"] == made  # valid already: left as it was


def test_a_run_deleted_under_its_compactor_stays_deleted(tmp_path: Path) -> None:
    """A job that removes its store at exit (a temporary directory) while the writer's compactor starts or runs: the
    compactor makes no directory above the run's ``_columnar`` (it made the run's whole tree again, with its lock
    files), and a vanished run is not an error."""
    from telemetrain.store.compact import make_dirs_under

    run = _write_run(tmp_path / "store", ranks=1, n=200)
    segment = next(run.glob("rank-*.jsonl"))
    shutil.rmtree(tmp_path / "store")
    argv = [PY, "-m", "telemetrain.store.compact", "--segments", str(segment), "--include-last"]
    done = subprocess.run(argv, timeout=120, capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == ""
    assert not (tmp_path / "store").exists()
    # mid-conversion: the directories of each Parquet file, manifest and lock are made below the prefix only
    prefix = tmp_path / "prefix"
    with pytest.raises(FileNotFoundError):
        make_dirs_under(prefix, prefix / "metrics" / "session=s")
    assert not prefix.exists()
    prefix.mkdir()
    make_dirs_under(prefix, prefix / "metrics" / "session=s")
    make_dirs_under(prefix, prefix / "metrics" / "session=s")  # already there: fine
    assert (prefix / "metrics" / "session=s").is_dir()


def _compactors_of(run: Path) -> list[int]:
    """Processes running `python -m telemetrain.store.compact` on this run's files."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "telemetrain.store.compact" in text and str(run) in text:
            found.append(int(cmdline.parent.name))
    return found


def _zombie_children() -> list[int]:
    zombies = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            zombies.append(int(stat.parent.name))
    return zombies


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_compactors_are_reaped_and_a_forked_child_forgets_them(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import telemetrain.sinks.jsonl as jsonl

    monkeypatch.setattr(jsonl, "SEGMENT_BYTES", 100_000)
    ident = identity_from_env({}, run_id="reap", session_tag="s", perf_tag="p", rank=0, world_size=1)
    t = Telemetry(ident, store=tmp_path)
    for i in range(6000):
        t.metric("loss", float(i), step=i)
        if i % 500 == 499:
            assert t.flush(30)
    sink = t.store
    assert sink is not None and sink.compactor.started >= 1
    pid = os.fork()
    if pid == 0:  # the child: the parent's compactors are not its children
        os._exit(0 if sink.compactor.running == 0 else 1)
    assert os.waitpid(pid, 0)[1] == 0
    deadline = time.monotonic() + 90
    while sink.compactor.running and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sink.compactor.running == 0 and sink.compactor.failures == 0
    assert not _zombie_children()
    assert t.close(30)


def test_a_forked_child_compacts_only_what_it_wrote_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The close compacts the last segment when the process wrote COMPACT_MIN_BYTES: a forked child counted its
    parent's bytes, so every DataLoader worker that wrote a line started a compaction process at its close."""
    import telemetrain.sinks.jsonl as jsonl

    monkeypatch.setattr(jsonl, "COMPACT_MIN_BYTES", 20_000)
    t = Telemetry(identity_from_env({}, run_id="forked", session_tag="s"), store=tmp_path)
    for i in range(1000):
        t.metric("loss", float(i), step=i)
    assert t.flush(30)
    sink = t.store
    assert sink is not None and sink.bytes_written >= 20_000 and sink.compactor.enabled
    pid = os.fork()
    if pid == 0:  # the child writes one line: far from the threshold
        code = 1
        try:
            before = sink.compactor.started
            t.metric("child", 1.0)
            if t.close(10):
                code = 2 if sink.compactor.started > before else 0
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "the child compacted its one-line file"
    assert t.close(30)
