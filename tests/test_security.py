"""A run store written by someone else, read by you (docs/security.md): what it names must not make the readers read
outside it, and what it holds must reach the terminal as text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from telemetrain import Telemetry, identity_from_env
from telemetrain.cli import main as cli_main
from test_reader_damage import _write_run

duckdb = pytest.importorskip("duckdb")

from telemetrain.store.compact import COLUMNAR_DIR, compact, compact_segments  # noqa: E402
from telemetrain.store.engine import ColumnarWarning, Engine  # noqa: E402
from telemetrain.store.manifest import manifest_path  # noqa: E402

MARKER = "read-from-outside-the-store"


def _outside_copy(run: Path, outside: Path) -> tuple[Path, Path, dict[str, Any]]:
    """A Parquet file outside the store, in the copy's own layout, whose metric names are MARKER; with the run's
    manifest (path and data) naming the run's first metrics file."""
    manifest = next((run / COLUMNAR_DIR / "_segments").rglob("*.json"))
    data = json.loads(manifest.read_text())
    entry = next(f for f in data["files"] if f["table"] == "metrics")
    target = outside / entry["path"]
    target.parent.mkdir(parents=True)
    con = duckdb.connect()
    source = str(run / COLUMNAR_DIR / entry["path"]).replace("'", "''")
    con.execute(f"COPY (SELECT * REPLACE ('{MARKER}' AS name) FROM read_parquet('{source}')) "
                f"TO '{str(target).replace(chr(39), chr(39) * 2)}' (FORMAT parquet)")
    con.close()
    return manifest, target, data


@pytest.mark.parametrize("how", ["absolute", "dot-dot", "link"])
def test_a_manifest_naming_a_file_outside_the_store_is_not_read(tmp_path: Path, how: str) -> None:
    """The manifest is the store's: one that names an absolute path, climbs out with ``../`` or reaches a file
    through a link planted in the copy is ignored (the JSONL is read instead), whatever that file holds."""
    run = _write_run(tmp_path / "store", ranks=1, n=20)
    compact(run)
    manifest, target, data = _outside_copy(run, tmp_path / "outside")
    entry = next(f for f in data["files"] if f["table"] == "metrics")
    entry["bytes"] = target.stat().st_size
    if how == "absolute":
        entry["path"] = str(target)
    elif how == "dot-dot":
        entry["path"] = os.path.relpath(target, run / COLUMNAR_DIR)
    else:  # the copy's own file replaced by a link to the outside one
        own = run / COLUMNAR_DIR / entry["path"]
        own.unlink()
        own.symlink_to(target)
    manifest.write_text(json.dumps(data))
    with pytest.warns(ColumnarWarning, match="not a file of the copy|leads out of"), Engine([run]) as engine:
        names = {row[0] for row in engine.rows("SELECT DISTINCT name FROM metrics")}
        assert MARKER not in names and "loss" in names
        assert engine.scalar("SELECT count(*) FROM metrics WHERE name = 'loss'") == 20


@pytest.mark.parametrize("where", ["_columnar", "_columnar/metrics", "_columnar/_segments"])
def test_compaction_does_not_write_through_a_link_planted_in_the_store(tmp_path: Path, where: str) -> None:
    """Someone who can write the store links the run's copy (or a directory of it) to a directory of yours: the
    compactor, yours or the training job's, writes nothing there and says why; the readers read the JSONL."""
    run = _write_run(tmp_path / "store", ranks=1, n=20)
    victim = tmp_path / "victim"
    victim.mkdir()
    planted = run / where
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.symlink_to(victim, target_is_directory=True)
    for result in (compact(run), compact_segments(sorted(run.glob("rank-*.jsonl")), include_last=True)):
        assert list(victim.iterdir()) == []
        assert result.errors and "link" in " ".join(result.errors) and result.segments == 0
    with Engine([run]) as engine:
        assert engine.scalar("SELECT count(*) FROM metrics WHERE name = 'loss'") == 20


def test_a_link_planted_at_the_old_temporary_name_is_not_written_through(tmp_path: Path) -> None:
    """The manifest went through ``.<name>.<pid>.tmp``: a link planted there (the compactor's pid is easy to guess
    when it is the reader's own) had the manifest written into its target."""
    run = _write_run(tmp_path / "store", ranks=1, n=20)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    segment = next(run.glob("rank-*.jsonl"))
    manifest = run / COLUMNAR_DIR / manifest_path("s", "r1", segment.name)
    manifest.parent.mkdir(parents=True)
    manifest.with_name(f".{manifest.name}.{os.getpid()}.tmp").symlink_to(victim)
    assert compact(run).segments == 1
    assert victim.read_text() == "precious"
    assert json.loads(manifest.read_text())["segment"] == segment.name


DEEP = ('{"v":1,"kind":"event","mono_ns":5,"wall_ns":1,"group":"g","name":"deep","severity":"error","attributes":'
        + '{"a":' * 100_000 + "1" + "}" * 100_000 + ',"event_id":"","span_id":""}\n')


@pytest.mark.parametrize("command", [["report", "-o", "{out}/r.html"], ["show"]])
def test_json_nested_too_deep_for_python_does_not_crash_the_engine_readers(
        tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An event whose attributes nest 100,000 deep: DuckDB's JSON reader keeps the line (Python's counts it corrupt),
    and each reader then decoded its attributes in Python: a RecursionError traceback instead of a report."""
    run = _write_run(tmp_path / "store", ranks=1, n=20)
    with next(run.glob("rank-*.jsonl")).open("a") as fh:
        fh.write(DEEP)
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    argv = [command[0], str(run), *(a.format(out=tmp_path) for a in command[1:])]
    assert cli_main(argv) == 0


# -- terminal ----------------------------------------------------------------------------------------------------------

OSC52 = "\x1b]52;c;SGk=\x07"  # "set the clipboard", in a name that becomes a directory


def test_a_warning_quoting_a_hostile_path_reaches_the_terminal_escaped(tmp_path: Path) -> None:
    """A damaged copy is warned about with its path; the session's directory name carries an escape sequence, which
    the command prints as ``\\x1b`` (``telemetrain`` on stderr, as a user's terminal gets it)."""
    run = _write_run(tmp_path, ranks=1, n=20, session=f"s{OSC52}")
    compact(run)
    victim = next((run / COLUMNAR_DIR / "metrics").rglob("*.parquet"))
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    proc = subprocess.run([sys.executable, "-m", "telemetrain.cli", "query", str(run),
                           "SELECT count(*) AS n FROM metrics WHERE name = 'loss'"],
                          capture_output=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "default"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert b"ColumnarWarning: ignoring the columnar copy" in proc.stderr  # the warning was shown
    assert b"\x1b" not in proc.stderr and b"\x07" not in proc.stderr
    assert b"s\\x1b]52;c;SGk=\\x07" in proc.stderr
    assert b"20" in proc.stdout


def test_show_prints_line_separators_and_bidi_overrides_escaped(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """U+2028 breaks a line for ``str.splitlines`` and many viewers; U+202E shows what follows reversed (a name
    that reads as another). ``show`` writes them as ``\\u2028``/``\\u202e``, one line per metric."""
    t = Telemetry(identity_from_env({}, run_id="r", session_tag="s"), store=tmp_path)
    t.metric("loss\u2028fake line", 1.0, "train")
    t.metric("ssol\u202e\u2066x\u2069", 2.0, "train")
    assert t.close()
    assert cli_main(["show", str(tmp_path / "s" / "r")]) == 0
    out = capsys.readouterr().out
    assert not {"\u2028", "\u2029", "\u202e", "\u2066", "\u2069"} & set(out)
    [line] = [line for line in out.splitlines() if "fake line" in line]
    assert "loss\\u2028fake line" in line and "= 1" in line
    assert "ssol\\u202e\\u2066x\\u2069" in out
