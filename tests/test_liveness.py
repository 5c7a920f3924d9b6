"""A run whose training loop never ended: running or killed. A process alive on this host whose start matches the
one its header recorded is running however long it is silent (it was called killed after 60 s without a record: a
long checkpoint save); the same after SIGKILL is killed at once; a pid reused by another process is not the writer.
Real subprocesses."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from telemetrain.liveness import process_start, same_process
from telemetrain.show_list import list_runs, liveness
from telemetrain.store import open_run

_WRITER = textwrap.dedent(
    """
    import sys, time
    from telemetrain import Telemetry
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
    t = Telemetry(store=sys.argv[1])
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=2),
                           telemetry=t)
    rec.on_app_start()
    rec.on_train_start(train_iterations_start=0)
    for _ in range(4):
        rec.on_training_single_iteration_start()
        rec.on_training_single_iteration_end()
    assert t.flush()
    print("ready", flush=True)
    time.sleep(600)  # a long checkpoint save: silent, alive
    """
)
MINUTES = 10 * 60 * 10**9


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path / "store")], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "TELEMETRAIN_RUN_ID": "live"})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        (run_dir,) = {p.parent for p in (tmp_path / "store").rglob("run.json")}
        yield proc, run_dir
    finally:
        proc.kill()
        proc.wait()


def _last_ns(run_dir: Path) -> int:
    return int(max(r.wall_ns for log in open_run(run_dir).processes for r in log.records if hasattr(r, "wall_ns")))


def _header(run_dir: Path) -> tuple[Path, list[str], dict[str, object]]:
    (path,) = run_dir.glob("rank-*.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    return path, lines, json.loads(lines[0])


def test_the_header_records_the_writer_start(writer: tuple[subprocess.Popen[str], Path]) -> None:
    proc, run_dir = writer
    recorded = _header(run_dir)[2]["process_start"]
    assert recorded == process_start(proc.pid) and same_process(recorded) is True


def test_a_silent_live_writer_is_running_and_killed_once_gone(writer: tuple[subprocess.Popen[str], Path]) -> None:
    proc, run_dir = writer
    last = _last_ns(run_dir)
    assert liveness(open_run(run_dir), last, last + MINUTES) == (True, True)  # ten silent minutes: still running
    proc.send_signal(signal.SIGSTOP)  # a hang the watchdog is about to report: alive too
    try:
        assert liveness(open_run(run_dir), last, last + MINUTES) == (True, True)
    finally:
        proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait()
    assert liveness(open_run(run_dir), last, last + 10**9) == (False, True)  # gone: killed, though it just wrote


def test_a_reused_pid_is_not_the_writer(writer: tuple[subprocess.Popen[str], Path]) -> None:
    """A header naming a live pid of another start time (the writer's pid taken by a later process) is gone."""
    _proc, run_dir = writer
    path, lines, header = _header(run_dir)
    started = dict(header["process_start"])  # type: ignore[call-overload]
    started["start_ticks"] -= 1
    header["process_start"] = started
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    last = _last_ns(run_dir)
    assert same_process(started) is False
    assert liveness(open_run(run_dir), last, last + 10**9) == (False, True)  # (the old rule said running)


def test_an_older_run_or_another_host_keeps_the_silence_rule(writer: tuple[subprocess.Popen[str], Path]) -> None:
    _proc, run_dir = writer
    path, lines, header = _header(run_dir)
    del header["process_start"]  # written before the start was recorded
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    last = _last_ns(run_dir)
    assert liveness(open_run(run_dir), last, last + 10**9) == (True, False)
    assert liveness(open_run(run_dir), last, last + MINUTES) == (False, False)
    header["identity"]["host"] = socket.gethostname() + "-elsewhere"  # type: ignore[index]
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    out = io.StringIO()
    list_runs(str(run_dir.parent.parent), out)  # silent for more than a minute, on a host we cannot look at
    assert "running (no news for " in out.getvalue(), out.getvalue()  # (it wrote seconds ago)
    out = io.StringIO()
    list_runs(str(run_dir.parent.parent), out, as_json=True)
    (listed,) = json.loads(out.getvalue())
    assert listed["status"] == "running" and listed["no_news_s"] >= 0
