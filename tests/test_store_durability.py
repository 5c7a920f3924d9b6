"""The run store under hostile conditions a training job meets: a wall clock stepped back mid-run, and more (issue:
the store's durability audit). Real writer, real files."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from telemetrain import Telemetry, identity_from_env
from telemetrain.cli import main as cli_main
from telemetrain.clock import CLOCK_SKEW_ENV
from telemetrain.store import open_run
from telemetrain.store.reader import FormatVersionError, NotARunError


def test_wall_clock_stepped_back_keeps_a_process_in_monotonic_order(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """NTP stepping the wall clock back 10 s between two metrics: the reader must still give them in the order they
    were recorded (the monotonic clock's), not the stepped wall clock's."""
    ident = identity_from_env({}, run_id="r", session_tag="s", perf_tag="p", rank=0, world_size=1)
    t = Telemetry(ident, store=tmp_path, default=False)
    t.metric("loss", 1.0, step=1)
    t.flush()
    monkeypatch.setenv(CLOCK_SKEW_ENV, str(-10 * 10**9))  # the test hook that offsets this process's wall clock
    t.refresh_clock()
    t.metric("loss", 2.0, step=2)
    assert t.close(timeout=30)
    recs = open_run(tmp_path / "s" / "r").records("metric")
    assert [r.step for r in recs] == [1, 2]
    assert recs[1].wall_ns < recs[0].wall_ns  # the step really is in the file: the order came from mono_ns


def test_run_dir_deleted_mid_run_is_started_again_not_written_into_the_void(tmp_path: Path) -> None:
    """A cleanup removing the run directory while training runs: the writer's descriptor still accepted writes into
    the deleted file, so every later record was lost while counted as delivered."""
    ident = identity_from_env({}, run_id="r", session_tag="s", perf_tag="p", rank=0, world_size=1)
    t = Telemetry(ident, store=tmp_path, default=False)
    t.metric("loss", 1.0, step=1)
    assert t.flush()
    shutil.rmtree(tmp_path / "s")
    t.metric("loss", 2.0, step=2)
    assert t.flush()
    t.metric("loss", 3.0, step=3)
    assert t.close(timeout=30)
    run = open_run(tmp_path / "s" / "r")
    assert [r.step for r in run.records("metric")] == [2, 3]
    assert run.meta["run_id"] == "r"  # run.json written again
    [diag] = run.records("diagnostic")
    assert diag.name == "file_deleted" and "deleted" in diag.message
    assert run.torn == run.corrupt == 0


def _newer_format_run(root: Path, *, meta_v: int, line_v: int) -> Path:
    """A real run, its versions then set as a newer telemetrain would write them."""
    ident = identity_from_env({}, run_id="r", session_tag="s", perf_tag="p", rank=0, world_size=1)
    t = Telemetry(ident, store=root, default=False)
    t.metric("loss", 1.0, step=1)
    assert t.close(timeout=30)
    run = root / "s" / "r"
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "v": meta_v}))
    for f in run.glob("rank-*.jsonl"):
        f.write_text("".join(json.dumps({**json.loads(line), "v": line_v}) + "\n"
                             for line in f.read_text().splitlines()))
    return run


@pytest.mark.parametrize("which", ["run.json", "lines"])
def test_a_run_of_a_newer_format_is_refused_with_a_clear_message(tmp_path: Path, which: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A run written by a newer telemetrain read as "0 records, N corrupt" (show, report, tail, query), and
    `telemetrain compact` made an empty copy of it that a later reader would trust."""
    run = _newer_format_run(tmp_path, meta_v=99 if which == "run.json" else 1, line_v=99 if which == "lines" else 2)
    with pytest.raises(FormatVersionError, match=r"newer telemetrain.*version 99.*upgrade"):
        open_run(run)
    with pytest.raises(NotARunError):  # what the commands catch
        open_run(run)
    commands = [["show", str(run)], ["report", str(run)], ["tail", "--once", str(run)]]
    if importlib.util.find_spec("duckdb") is not None:
        commands += [["query", str(run), "SELECT count(*) FROM metrics"], ["compact", str(run)]]
    for argv in commands:
        assert cli_main(argv) != 0, argv
        assert "newer telemetrain" in capsys.readouterr().err, argv
    assert not (run / "_columnar").exists()  # nothing compacted
