"""A run store written by someone else, read by you (docs/security.md): what it names must not make the readers read
outside it, and what it holds must reach the terminal as text."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from telemetrain import Telemetry, identity_from_env
from telemetrain.cli import main as cli_main
from telemetrain.spans import Tracer
from telemetrain.text import printable
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
from test_reader_damage import _write_run

duckdb = pytest.importorskip("duckdb")

from telemetrain.store.compact import COLUMNAR_DIR, compact, compact_segments  # noqa: E402
from telemetrain.store.engine import ColumnarWarning, Engine  # noqa: E402
from telemetrain.store.manifest import SEGMENTS_DIR, manifest_path  # noqa: E402

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


@pytest.mark.parametrize("where", ["_columnar", "_columnar/metrics", "_columnar/_shared", "_columnar/_segments"])
def test_compaction_does_not_write_through_a_link_planted_in_the_store(tmp_path: Path, where: str) -> None:
    """Someone who can write the store links the run's copy (or a directory of it) to a directory of yours: the
    compactor, yours or the training job's, writes nothing there and says why; the readers read the JSONL. (Your
    ``compact`` of a small run writes its batch's shared files under ``_shared``, the writer's compactor a segment's
    own under its table's folder: each refuses the link it would write through, or, the batch at a link in place of
    ``_shared``, falls back to a segment's own files.)"""
    run = _write_run(tmp_path / "store", ranks=1, n=20)
    victim = tmp_path / "victim"
    victim.mkdir()
    planted = run / where
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.symlink_to(victim, target_is_directory=True)
    writes_under = {"batch": ("_columnar", "_columnar/_segments"),
                    "writer": ("_columnar", "_columnar/metrics", "_columnar/_segments")}
    for who in ("batch", "writer"):
        result = compact(run) if who == "batch" else \
            compact_segments(sorted(run.glob("rank-*.jsonl")), include_last=True)
        assert list(victim.iterdir()) == [], who
        if where in writes_under[who]:
            assert result.errors and "link" in " ".join(result.errors) and result.segments == 0, who
        else:
            assert not result.errors and result.segments == 1, who
            shutil.rmtree(run / COLUMNAR_DIR / SEGMENTS_DIR)  # (the next compactor does it again)
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


@pytest.mark.parametrize("compacted", [False, True])
def test_both_readers_keep_a_line_nested_too_deep_for_python_with_empty_attributes(
        tmp_path: Path, compacted: bool) -> None:
    """DuckDB kept the deeply nested event (its attributes then shown empty) where the Python reader counted the line
    corrupt: ``show`` of one run gave two answers. Both now keep it, its attributes empty, nothing corrupt; a line
    nested as deep in a field that must be a string is corrupt to both."""
    from telemetrain.store.reader import open_run

    run = _write_run(tmp_path / "store", ranks=1, n=20)
    with next(run.glob("rank-*.jsonl")).open("a") as fh:
        fh.write(DEEP)
        fh.write(DEEP.replace('"name":"deep"', '"name":' + "[" * 100_000 + "]" * 100_000))
    python = open_run(run)
    assert [(e.name, e.attributes or {}) for e in python.records("event") if e.name == "deep"] == [("deep", {})]
    assert python.corrupt == 1
    if compacted:
        assert compact(run).segments == 1
    with Engine([run]) as engine:
        assert engine.rows("SELECT name FROM events WHERE name = 'deep'") == [("deep",)]
        assert engine.scalar("SELECT sum(corrupt) FROM damage") == 1


# -- terminal ----------------------------------------------------------------------------------------------------------

OSC52 = "\x1b]52;c;SGk=\x07"  # "set the clipboard", in a name that becomes a directory


def test_a_warning_quoting_a_hostile_path_reaches_the_terminal_escaped(tmp_path: Path) -> None:
    """A damaged copy is warned about with its path; the session's directory name carries an escape sequence, which
    the command prints as ``\\x1b`` (``telemetrain`` on stderr, as a user's terminal gets it)."""
    run = _write_run(tmp_path, ranks=1, n=20, session=f"s{OSC52}")
    compact(run)
    victim = next((run / COLUMNAR_DIR).rglob("metrics/**/*.parquet"))  # its own tree, or a batch's _shared one
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


# -- HTML --------------------------------------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PAYLOAD = ('<script>console.error("xss-ran")</script>"><img src=x onerror=console.error("xss-img")>\u2028'
           "</script><a href=javascript:console.error('xss-href')>x</a>\x1b[2J\u202e")
PATH_PAYLOAD = '"><img src=x onerror=console.error("xss-path")>\x1b[31m'  # no "/": it becomes a directory name


def _shown(text: str) -> str:
    """``text`` as a page shows it: markup escaped, control characters as the terminal shows them."""
    return html.escape(printable(text))


def _hostile_run(root: Path, run_id: str) -> Path:
    """A run whose every string a page shows carries PAYLOAD (PATH_PAYLOAD for the names that become paths)."""
    ident = identity_from_env({}, run_id=run_id, session_tag=f"s{PATH_PAYLOAD}", perf_tag=f"p{PATH_PAYLOAD}",
                              host=f"h{PAYLOAD}")
    t = Telemetry(ident, store=root, config={f"k{PAYLOAD}": f"v{PAYLOAD}", "lr": 0.1})
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=1),
                         telemetry=t)
    now = int(time.time() * 1000) - 20_000
    r.on_app_start(now)
    r.on_train_start(0, start_time_msec=now)
    for i in range(20):
        r.on_training_single_iteration_start(now + i * 100)
        r.on_training_single_iteration_end(now + i * 100 + 90)
        t.metric(f"loss{PAYLOAD}", 1.0 / (i + 1), f"train{PAYLOAD}", {f"tag{PAYLOAD}": f"val{PAYLOAD}"},
                 unit=f"u{PAYLOAD}", step=i)
        t.metric("loss", 1.0 / (i + 1), "train", step=i)
    t.event(f"ev{PAYLOAD}", {f"key{PAYLOAD}": f"val{PAYLOAD}"}, severity="error")
    with Tracer(t).span(f"sp{PAYLOAD}", group=f"user{PAYLOAD}"):
        pass
    with contextlib.suppress(RuntimeError), Tracer(t).span("boom", group="user"):
        raise RuntimeError(f"exc{PAYLOAD}")
    r.on_train_end(now + 3000)
    r.on_app_end(now + 3100)
    assert t.close()
    return root / f"s{PATH_PAYLOAD}" / run_id


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_hostile_strings_in_the_report_and_comparison_pages_show_as_text_and_run_nothing(tmp_path: Path) -> None:
    """Names, tags, values, host, config and exception text carrying script, an ``onerror`` attribute, a
    ``javascript:`` link, U+2028, an ESC sequence and a bidi override: in headless Chromium nothing runs -- also with
    the page's Content-Security-Policy taken out, so that the escaping is what is tested -- and the text is there as
    written, its control characters shown as escapes (they were in the page raw: invisible, or reversing the text)."""
    assert CHROMIUM is not None
    base, cand = _hostile_run(tmp_path / "store", f"b{PATH_PAYLOAD}"), _hostile_run(tmp_path / "store", "c")
    pages = [tmp_path / "report.html", tmp_path / "compare.html"]
    assert cli_main(["report", str(base), "-o", str(pages[0])]) == 0
    assert cli_main(["compare", str(cand), "--baseline", str(base), "--resamples", "200", "--html",
                     str(pages[1])]) == 0
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert _shown(f"loss{PAYLOAD}") in text or _shown(f"b{PATH_PAYLOAD}") in text
        bare = page.with_name(f"bare-{page.name}")
        bare.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", text), encoding="utf-8")
        assert "Content-Security-Policy" not in bare.read_text(encoding="utf-8")
        for shown in (page, bare):
            proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                                   "--v=0", "--no-first-run", "--disable-extensions", "--dump-dom", shown.as_uri()],
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr[-2000:]
            assert [line for line in proc.stderr.splitlines() if ":CONSOLE" in line] == []
            dom = proc.stdout
            assert not re.search(r"<(script|img)\b|<a\s[^>]*href=\"?javascript", dom, re.IGNORECASE), page.name
            assert html.escape(printable(f"b{PATH_PAYLOAD}"), quote=False) in dom  # the run id, as written
            assert not re.search("[\x00-\x08\x0b-\x1f\x7f\u2028\u202e]", dom), page.name
    report = pages[0].read_text(encoding="utf-8")
    for written in (f"loss{PAYLOAD}", f"ev{PAYLOAD}", f"sp{PAYLOAD}", f"exc{PAYLOAD}", f"k{PAYLOAD}", f"h{PAYLOAD}"):
        assert _shown(written) in report, written


def test_query_csv_is_escaped_on_a_terminal_and_verbatim_to_a_pipe(tmp_path: Path) -> None:
    """``query --format csv`` is data: to a pipe, each value exactly as stored; on a terminal, its escape sequences
    would act, so they are shown escaped there, as ``ls`` does."""
    t = Telemetry(identity_from_env({}, run_id="r", session_tag="s"), store=tmp_path)
    t.metric(f"loss{OSC52}\x1b[2J", 1.0, "train")
    assert t.close()
    argv = [sys.executable, "-m", "telemetrain.cli", "query", str(tmp_path / "s" / "r"),
            "SELECT name FROM metrics WHERE group_name = 'train'", "--format", "csv"]
    piped = subprocess.run(argv, capture_output=True, timeout=300, check=True).stdout
    assert piped == f"name\r\nloss{OSC52}\x1b[2J\r\n".encode()
    main_fd, child_fd = os.openpty()
    with subprocess.Popen(argv, stdout=child_fd, stderr=subprocess.PIPE) as proc:
        os.close(child_fd)
        shown = b""
        with contextlib.suppress(OSError):  # EIO once the child has closed its end
            while chunk := os.read(main_fd, 4096):
                shown += chunk
        assert proc.wait(timeout=300) == 0
    os.close(main_fd)
    assert b"\x1b" not in shown and b"\x07" not in shown
    assert b"loss\\x1b]52;c;SGk=\\x07\\x1b[2J" in shown


@pytest.mark.parametrize("planted", ["open directory", "link"])
def test_compaction_spills_into_a_directory_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      planted: str) -> None:
    """DuckDB spilled the rows it compacts into ``<temp>/telemetrain-duckdb-<pid>``: under a shared ``/tmp``,
    someone else could make that directory first (open to all, or a link to theirs) and read the rows."""
    from telemetrain.store.compact import connect

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    for name in (f"telemetrain-duckdb-{os.getpid()}", f"telemetrain-duckdb-{os.getuid()}"):
        if planted == "link":
            (tmp_path / name).symlink_to(theirs)
        else:
            (tmp_path / name).mkdir()
            (tmp_path / name).chmod(0o777)
    con = connect()
    try:
        spill = Path(con.execute("SELECT current_setting('temp_directory')").fetchone()[0])
    finally:
        con.close()
    owner = spill.parent
    assert owner.parent == tmp_path and not owner.is_symlink() and owner.stat().st_mode & 0o777 == 0o700
    assert theirs not in (spill, owner) and (tmp_path / f"telemetrain-duckdb-{os.getpid()}") not in (spill, owner)


# -- SQL ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT * FROM glob('/etc/*')", "SELECT * FROM read_blob('/etc/hostname')",
    "SELECT * FROM sniff_csv('/etc/passwd')", "SELECT * FROM read_json_auto('{run}/run.json')",
    "SELECT * FROM query('COPY (SELECT 1) TO ''{out}''')",
    "LOAD httpfs", "EXPORT DATABASE '{out}'", "PRAGMA enable_profiling", "CREATE TEMP TABLE t AS SELECT 1",
    "SELECT * FROM duckdb_secrets()", "RESET lock_configuration",
])
def test_run_sql_refuses_files_outside_the_copy_and_every_write(tmp_path: Path, sql: str) -> None:
    """``Run.sql``, the Python entry point: the run's own JSONL and run.json are outside what a query may open, as
    is any other file; a ``query()`` table function cannot smuggle another statement in."""
    from telemetrain.store import open_run

    run = _write_run(tmp_path / "store", ranks=1, n=5)
    out = tmp_path / "out"
    with pytest.raises(Exception, match=r"(?i)permission|only SELECT|expected a single SELECT|not allowed|disabled"):
        open_run(run).sql(sql.format(run=run, out=out)).fetchall()
    assert not out.exists()


# -- links planted at a run or session directory -----------------------------------------------------------------------


@pytest.mark.parametrize("level", ["run", "session"])
def test_the_writers_compactor_does_not_write_through_a_run_directory_swapped_for_a_link(
        tmp_path: Path, level: str) -> None:
    """The writer refused a link at its session and run directories; one swapped in after it made them (by someone
    who can write the session) had the background compactor write the copy into the link's target."""
    run = _write_run(tmp_path / "store", ranks=1, n=20)
    victim = tmp_path / "victim"
    moved = run if level == "run" else run.parent
    moved.rename(victim)
    moved.symlink_to(victim, target_is_directory=True)
    result = compact_segments(sorted(run.glob("rank-*.jsonl")), include_last=True)
    assert result.segments == 0 and "link" in " ".join(result.errors)
    assert not list(victim.rglob(COLUMNAR_DIR))


def test_compact_of_a_store_does_not_follow_a_session_or_run_link_planted_in_it(tmp_path: Path) -> None:
    """``compact`` of a store (or a session) walks no link below the directory it is given: a run elsewhere linked
    in gets no copy written into it; the store's own run is compacted."""
    store = tmp_path / "store"
    own = _write_run(store, ranks=1, n=20)
    elsewhere = _write_run(tmp_path / "elsewhere", ranks=1, n=20)
    (store / "planted").symlink_to(elsewhere.parent, target_is_directory=True)
    (own.parent / "planted").symlink_to(elsewhere, target_is_directory=True)
    for path in (store, own.parent):
        assert compact(path).errors == []
    assert (own / COLUMNAR_DIR).is_dir() and not (elsewhere / COLUMNAR_DIR).exists()


def test_the_compaction_process_prints_its_errors_escaped(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m telemetrain.store.compact``, run by hand, printed the paths of its errors as they are: an escape
    sequence in a session name reached the terminal."""
    from telemetrain.store.compact import main as compact_main

    run = _write_run(tmp_path / "store", ranks=1, n=20)
    hostile = run.parent.with_name(f"s{OSC52}")
    run.parent.rename(hostile)
    (hostile / "r1" / COLUMNAR_DIR).symlink_to(tmp_path, target_is_directory=True)
    assert compact_main(["--segments", *map(str, sorted((hostile / "r1").glob("rank-*.jsonl")))]) == 1
    err = capsys.readouterr().err
    assert "link" in err and "\x1b" not in err and "\\x1b]52" in err


def _planted_link(link: Path, target: Path) -> None:
    """A link at ``link`` owned by another user (the nobody account), as one planted in a shared store is."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("making a link of another user's takes root")
    link.symlink_to(target, target_is_directory=True)
    os.lchown(link, 65534, 65534)


@pytest.mark.parametrize("level", ["run", "session"])
def test_writers_refuse_a_run_path_through_another_users_link(tmp_path: Path, level: str) -> None:
    """A run (or session) folder planted in the store as a link to a run-shaped folder of yours: ``compact`` of it
    and ``write_report``'s default output wrote into the link's target. Both refuse, naming the link; the readers
    still read through it, and a link of your own (runs moved to another disk) is followed by all."""
    from telemetrain.output_file import OutputFileError
    from telemetrain.report import write_report

    victim = _write_run(tmp_path / "victim", ranks=1, n=20)
    store = tmp_path / "store"
    (store / "s").mkdir(parents=True)
    named = store / "s" / "r1" if level == "run" else store / "planted" / "r1"
    _planted_link(named if level == "run" else named.parent, victim if level == "run" else victim.parent)
    result = compact(named)
    assert result.segments == 0 and "another user's" in " ".join(result.errors)
    with pytest.raises(OutputFileError, match="another user's"):
        write_report(named)
    assert sorted(p.name for p in victim.iterdir() if not p.name.startswith("rank-")) == ["run.json"]
    with Engine([named]) as engine:
        assert engine.scalar("SELECT count(*) FROM metrics WHERE name = 'loss'") == 20
    assert write_report(named, tmp_path / "r.html").is_file()
    own = tmp_path / "own"
    own.symlink_to(victim, target_is_directory=True)
    assert compact(own).segments == 1 and write_report(own).parent == own



@pytest.mark.parametrize("planted", ["huge", "fifo"])
def test_a_manifest_too_large_or_not_a_file_is_not_read(tmp_path: Path, planted: str) -> None:
    """A manifest padded to a million files' worth was read whole into memory, and a FIFO planted as one blocked the
    reader for ever: both are taken as no manifest (the JSONL is read), without reading them."""
    import threading

    from telemetrain.store.manifest import MAX_MANIFEST_BYTES, read_manifest

    run = _write_run(tmp_path / "store", ranks=1, n=20)
    compact(run)
    manifest = next((run / COLUMNAR_DIR / "_segments").rglob("*.json"))
    assert read_manifest(manifest) is not None
    if planted == "huge":
        text = manifest.read_text()
        manifest.write_text(text[:-1] + " " * MAX_MANIFEST_BYTES + "}")
    else:
        manifest.unlink()
        os.mkfifo(manifest)
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(read_manifest(manifest)), daemon=True)
    reader.start()
    reader.join(60)
    if reader.is_alive():  # unblock it, so the test ends
        with open(manifest, "w"):
            pass
    assert got == [None]
    with Engine([run]) as engine:
        assert engine.scalar("SELECT count(*) FROM metrics WHERE name = 'loss'") == 20



def test_a_fifo_planted_as_run_json_does_not_hold_the_readers(tmp_path: Path) -> None:
    """``run.json`` was opened blocking: a FIFO planted in its place held ``show``, ``report`` and every reader for
    ever. It reads as an unreadable run.json (``{}``), as a damaged one does."""
    import threading

    from telemetrain.store.reader import open_run

    run = _write_run(tmp_path / "store", ranks=1, n=20)
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.append(len(open_run(run).records("metric"))), daemon=True)
    reader.start()
    reader.join(60)
    blocked = reader.is_alive()
    if blocked:  # unblock it, so the test ends
        with open(run / "run.json", "w"):
            pass
    assert not blocked and got == [23]



def test_a_fifo_swapped_in_for_run_json_does_not_hold_the_writer(tmp_path: Path) -> None:
    """The writer re-reads its run.json to update it (``set_run_meta``, on the training thread): a FIFO swapped in
    for it held the caller for ever. It is left alone, as an unreadable run.json is."""
    import threading

    from telemetrain.sinks.jsonl import update_run_meta
    from telemetrain.store.files import open_run_dir

    run = _write_run(tmp_path / "store", ranks=1, n=5)
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    ident = identity_from_env({}, run_id="r1", session_tag="s", perf_tag="p", rank=0, world_size=1)
    with open_run_dir(tmp_path / "store", "s", "r1") as directory:
        writer = threading.Thread(target=update_run_meta, args=(directory, ident, {"k": 1}), daemon=True)
        writer.start()
        writer.join(60)
        blocked = writer.is_alive()
        if blocked:  # unblock it, so the test ends
            with open(run / "run.json", "w"):
                pass
            writer.join(60)
    assert not blocked and stat.S_ISFIFO((run / "run.json").lstat().st_mode)
