"""How each way a run can end reads back (``goodput``, ``show --list``, the findings), from real subprocesses: a
SIGKILL, a Ctrl-C (SIGINT: Python's KeyboardInterrupt), an exception, a finished run, ``os._exit``. The readers must
agree: a Ctrl-C is ``interrupted``, not a crash; a process gone without a word is ``killed``, not running."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import helper_env
from telemetrain import cli
from telemetrain.report.model import build_model
from telemetrain.store.reader import open_run

_TRAIN = textwrap.dedent(
    """
    import os, signal, sys
    from telemetrain import Telemetry
    from telemetrain.training import TrainingContexts, TrainingRecorder, TrainingTelemetryConfig

    store, how, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t = Telemetry(store=store)
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=2),
                           telemetry=t)
    ctx = TrainingContexts(lambda: rec)
    with ctx.application(), ctx.training_loop(start):
        for step in range(start, start + 6):
            with ctx.training_iteration():
                pass
            if step == start + 1:
                with ctx.checkpoint_save(step + 1):
                    pass
            if step == start + 3:
                if how == "sigkill":
                    assert t.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
                if how == "os_exit":
                    assert t.flush()
                    os._exit(3)
                if how == "sigint":
                    os.kill(os.getpid(), signal.SIGINT)
                if how == "raise":
                    raise RuntimeError("boom")
    """
)
_ENDINGS = {"sigkill": -9, "sigint": -2, "raise": 1, "finish": 0, "os_exit": 3}


def _run(root: Path, session: str, run_id: str, how: str, start: int) -> None:
    proc = subprocess.run([sys.executable, "-c", _TRAIN, str(root), how, str(start)], capture_output=True, text=True,
                          env=helper_env(run_id, session), timeout=60)
    assert proc.returncode == _ENDINGS[how], proc.stderr[-2000:]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.fixture(scope="module")
def ended(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Session ``s``: four attempts, one per ending, each resuming where the previous one checkpointed."""
    root = tmp_path_factory.mktemp("ended")
    for i, how in enumerate(("sigkill", "sigint", "raise", "finish")):
        _run(root, "s", f"r{i}", how, 2 * i)
    return root


@pytest.mark.parametrize("engine", ["python", "duckdb"])
def test_goodput_and_show_list_say_how_each_run_ended(ended: Path, engine: str, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The Ctrl-C'd run was "interrupted" as any other (an exception: the findings' "crash") and ``show --list``
    said "interrupted" of the crash too."""
    monkeypatch.setenv("TELEMETRAIN_ENGINE", engine)
    expected = ["killed", "interrupted", "crash", "finished"]
    report = json.loads(_cli(capsys, "goodput", str(ended / "s"), "--json"))
    assert [r["status"] for r in report["runs"]] == expected
    # the interrupted and the crashed runs lose their work after their checkpoint alike (badput lost_progress)
    assert [r["lost_iterations"] for r in report["runs"][1:3]] == [2, 2]
    text = _cli(capsys, "goodput", str(ended / "s"))
    rows = [m.groups() for m in re.finditer(r"^  \d+  (r\d)  +(\w+)", text, re.MULTILINE)]
    assert rows == [(f"r{i}", status) for i, status in enumerate(expected)]
    listed = json.loads(_cli(capsys, "show", "--list", str(ended), "--json"))
    assert [r["status"] for r in sorted(listed, key=lambda r: r["run"])] == expected


def test_goodput_prints_each_note_once(ended: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each run's notes were printed twice: once from the session's notes ("run r0: ..."), again from the run's."""
    notes = [line for line in _cli(capsys, "goodput", str(ended / "s")).splitlines() if line.startswith("note: ")]
    killed = [n for n in notes if "r0" in n and "never ended" in n]
    assert len(killed) == 1, notes
    assert len(notes) == len(set(notes)) == len(json.loads(_cli(capsys, "goodput", str(ended / "s"),
                                                                   "--json"))["notes"])


def test_the_findings_call_a_ctrl_c_interrupted_and_the_others_crashes(ended: Path) -> None:
    """An earlier Ctrl-C'd run was an error "crash: run r1 interrupted"."""
    found = {f.title: f.severity for f in build_model(open_run(ended / "s" / "r3")).findings
             if f.kind in ("crash", "interrupted")}
    assert found == {"crash: run r0 killed": "error", "interrupted: run r1 interrupted": "warning",
                     "crash: run r2 crashed": "error"}


def test_a_process_gone_by_os_exit_is_killed_not_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``os._exit`` skips every flush: the loop never ends in the store, and the process is gone at once; the readers
    must not call the session's last run running for the next minute."""
    _run(tmp_path, "x", "only", "os_exit", 0)
    listed = json.loads(_cli(capsys, "show", "--list", str(tmp_path), "--json"))
    assert [r["status"] for r in listed] == ["killed"]
    report = json.loads(_cli(capsys, "goodput", str(tmp_path / "x"), "--json"))
    assert [r["status"] for r in report["runs"]] == ["killed"]
    assert os.path.isdir(tmp_path / "x" / "only")
