"""Fault injection: failing and blocked sinks, signals, SIGKILL, fork, multiprocessing, concurrent writers, floods and
non-finite values. Real threads, processes, signals and files; no mocks.

Nothing here asserts a wall-clock duration: timeouts only turn a hang into a failure.
"""

from __future__ import annotations

import gc
import json
import math
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from conftest import ListSink, helper_env, run_dir_of
from telemetrain import FailurePolicy, Identity, StatWindow, Telemetry, TelemetryWarning, identity_from_env
from telemetrain.dispatch import BackgroundRunner
from telemetrain.sinks import RunStoreSink, Sink
from telemetrain.store import open_run, run_dir

HELPERS = Path(__file__).with_name("_proc_helpers.py")
GROUP = "faults"  # the group the helper scenarios emit to
SESSION = "faults"
HANG_S = 30.0  # a generous limit: only a hang gets near it
MB = 1024 * 1024
ACK_EVERY = 250  # the streaming helper prints how many records it emitted after every ACK_EVERY


# -- helpers -----------------------------------------------------------------------------------------------------------


def _identity(run_id: str | None = None, **changes: Any) -> Identity:
    return identity_from_env({}, run_id=run_id or f"t-{uuid.uuid4().hex[:8]}", session_tag=SESSION, **changes)


def _helper(*args: object) -> list[str]:
    return [sys.executable, str(HELPERS), *(str(a) for a in args)]


def _run_path(root: Path, run_id: str) -> Path:
    return root / SESSION / run_id


def _stats(t: Telemetry, name: str) -> dict[str, Any]:
    sinks: list[dict[str, Any]] = t.health()["sinks"]
    [stats] = [s for s in sinks if s["sink"] == name]
    return stats


def _values(records: Sequence[Any], name: str) -> list[Any]:
    return [r.value for r in records if r.kind == "metric" and r.name == name]


def _assert_gap_free(values: list[Any], what: str) -> None:
    """In file order, exactly 0, 1, 2, ...: nothing lost, nothing duplicated, nothing reordered."""
    expected = list(range(len(values)))
    if values != expected:
        first_bad = next(i for i, (a, b) in enumerate(zip(values, expected, strict=False)) if a != b) if values else 0
        pytest.fail(f"{what}: not a gap-free sequence; first mismatch at index {first_bad}: {values[first_bad:][:5]}")


def _wait_until(predicate: Any, timeout: float = HANG_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


def _wait_for_data(path: Path, min_bytes: int) -> None:
    _wait_until(lambda: path.exists() and path.stat().st_size >= min_bytes, what=f"{min_bytes} bytes in {path.name}")


def _start_stream(
    root: Path, run_id: str, err: Any, flush_interval: float, marker: Path | None = None
) -> subprocess.Popen[str]:
    """The ``stream`` helper (emits ``seq`` 0, 1, ... and acknowledges every ACK_EVERY on stdout) in a subprocess."""
    args = ("stream", root, ACK_EVERY, flush_interval) + ((marker,) if marker is not None else ())
    return subprocess.Popen(
        _helper(*args), stdout=subprocess.PIPE, stderr=err, text=True, env=helper_env(run_id, SESSION)
    )


def _kill(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


class _Acks:
    """Reads the integer acknowledgements a helper prints on stdout, in a thread, so no read can hang the test."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.last = 0
        self.eof = False
        assert proc.stdout is not None
        self._thread = threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _pump(self, stream: Any) -> None:
        try:
            for line in stream:
                self.lines.put(line)
        finally:
            self.lines.put(None)

    def _take(self, deadline: float) -> bool:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail("no output from the helper process in time")
        if line is None:
            self.eof = True
            return False
        if line.strip():
            self.last = max(self.last, int(line))
        return True

    def wait_for(self, at_least: int, timeout: float = HANG_S) -> int:
        deadline = time.monotonic() + timeout
        while self.last < at_least:
            if not self._take(deadline):
                pytest.fail(f"the helper exited after acknowledging {self.last} records (waited for {at_least})")
        return self.last

    def to_eof(self, timeout: float = HANG_S) -> int:
        deadline = time.monotonic() + timeout
        while not self.eof and self._take(deadline):
            pass
        return self.last


class FailingSink(Sink):
    """Raises on every record."""

    name = "failing"

    def __init__(self, *, background: bool) -> None:
        self.background = background
        self.calls = 0

    def write(self, records: Sequence[Any]) -> None:
        self.calls += 1
        raise RuntimeError("sink is broken")


class BlockingSink(Sink):
    """``write`` waits on ``gate`` (forever, until the test sets it). Counts what it was handed."""

    name = "blocked"

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate
        self.entered = threading.Event()
        self.received = 0
        self.metrics = 0

    def write(self, records: Sequence[Any]) -> None:
        self.received += len(records)
        self.metrics += sum(1 for r in records if r.kind == "metric")
        self.entered.set()
        self.gate.wait()


# -- 1. a sink that raises -------------------------------------------------------------------------------------------


ROUNDS, PER_ROUND, MAX_CONSECUTIVE = 5, 10, 3


def _emit_rounds(t: Telemetry, flush_timeout: float) -> list[bool]:
    flushed = []
    for r in range(ROUNDS):
        for i in range(PER_ROUND):
            t.metric("seq", r * PER_ROUND + i, "train")
        flushed.append(t.flush(flush_timeout))
    return flushed


@pytest.mark.parametrize("background", [True, False], ids=["background", "inline"])
def test_failing_sink_is_contained_counted_warned_once_and_suspended(tmp_path: Path, background: bool) -> None:
    policy = FailurePolicy(max_consecutive=MAX_CONSECUTIVE, backoff_s=60.0, backoff_max_s=60.0)
    # A long interval: background batches happen only on flush(), one batch per round.
    t = Telemetry(_identity(), store=tmp_path, failure_policy=policy, flush_interval=60.0)
    failing = FailingSink(background=background)
    collect = ListSink()
    try:
        t.add_sink(failing)
        t.add_sink(collect)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            flushed = _emit_rounds(t, HANG_S)  # must not raise
            idle = [t.flush(HANG_S) for _ in range(3)]  # nothing new: a suspended sink must stay quiet
            health = t.health()
            assert t.close(HANG_S)
    finally:
        t.close(HANG_S)

    emitted = ROUNDS * PER_ROUND
    assert flushed == [True] * ROUNDS and idle == [True] * 3

    # every other sink got every record
    assert _values(collect.records, "seq") == list(range(emitted))
    run = open_run(run_dir_of(t))
    assert _values(run.records(), "seq") == list(range(emitted))
    assert run.corrupt == 0 and run.torn == 0
    for other in ("jsonl", "collect"):
        s = next(s for s in health["sinks"] if s["sink"] == other)
        assert s["failed"] == 0 and s["dropped"] == 0

    # counted, then suspended: the sink is not called any more
    stats = next(s for s in health["sinks"] if s["sink"] == "failing")
    per_failure = PER_ROUND if background else 1  # a background batch is one round; inline, one record
    assert failing.calls == MAX_CONSECUTIVE
    assert stats["failures"] == MAX_CONSECUTIVE
    assert stats["failed"] == MAX_CONSECUTIVE * per_failure
    assert health["failed"] == MAX_CONSECUTIVE * per_failure
    assert stats["delivered"] == 0
    assert stats["suspended"] is True
    assert stats["last_error"] == "RuntimeError: sink is broken"

    # diagnostics in the run store (and in the healthy sinks)
    diags = [r for r in run.records("diagnostic") if r.sink == "failing"]
    errors = [d for d in diags if d.name == "sink_error"]
    assert len(errors) == MAX_CONSECUTIVE
    assert all(d.record_count == per_failure and "sink is broken" in d.message for d in errors)
    assert [d.name for d in diags if d.name == "sink_suspended"] == ["sink_suspended"]
    assert [d for d in collect.records if d.kind == "diagnostic" and d.name == "sink_error"]

    # warned exactly once, about the failure (a suspended sink dropping records is the same failure, not news)
    telemetry_warnings = [w for w in caught if issubclass(w.category, TelemetryWarning)]
    assert len(telemetry_warnings) == 1, [str(w.message) for w in telemetry_warnings]
    assert "'failing' failed" in str(telemetry_warnings[0].message)

    # what was offered while suspended is counted as dropped: the emitted records, nothing else, and idle
    # wake-ups add nothing (no diagnostics about the sink's own drop reports, fed back to it)
    assert stats["dropped"] == emitted - MAX_CONSECUTIVE * per_failure, diags
    if background:
        reported = [d.record_count for d in diags if d.name == "dropped"]
        assert sum(reported) == stats["dropped"], reported


@pytest.mark.parametrize("background", [True, False], ids=["background", "inline"])
def test_failing_sink_is_contained_when_warnings_are_errors(tmp_path: Path, background: bool) -> None:
    """``-W error`` (or ``filterwarnings = error`` in a test suite) turns the TelemetryWarning into an exception:
    it must not reach the caller nor kill the writer thread."""
    policy = FailurePolicy(max_consecutive=MAX_CONSECUTIVE, backoff_s=60.0, backoff_max_s=60.0)
    t = Telemetry(_identity(), store=tmp_path, failure_policy=policy, flush_interval=60.0)
    failing = FailingSink(background=background)
    attachment = t.add_sink(failing)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", TelemetryWarning)
            try:
                flushed = _emit_rounds(t, 3.0)  # short: a dead writer thread would make each flush wait it out
            except TelemetryWarning as exc:
                pytest.fail(f"a contained sink failure reached the caller: {exc!r}")
            stats = _stats(t, "failing")
            if background:
                runner = attachment.runner
                assert isinstance(runner, BackgroundRunner)
                assert runner.running, "the sink's writer thread died of the warning"
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TelemetryWarning)
            t.close(HANG_S)
    assert flushed == [True] * ROUNDS
    assert stats["failures"] == MAX_CONSECUTIVE and stats["suspended"] is True
    run = open_run(run_dir_of(t))
    assert _values(run.records(), "seq") == list(range(ROUNDS * PER_ROUND))
    assert len([r for r in run.records("diagnostic") if r.name == "sink_error"]) == MAX_CONSECUTIVE


# -- 2. a sink that blocks forever -------------------------------------------------------------------------------------


def test_blocked_sink_never_blocks_the_caller(tmp_path: Path) -> None:
    n, capacity, chunk = 50_000, 1_000, 500
    gate = threading.Event()
    t = Telemetry(_identity(), store=False, queue_capacity=capacity, flush_interval=0.01)
    store_attachment = t.add_sink(RunStoreSink(tmp_path))
    collect = ListSink("collect", background=False)
    t.add_sink(collect)
    blocked = BlockingSink(gate)
    blocked_attachment = t.add_sink(blocked)
    blocked_runner = blocked_attachment.runner
    assert isinstance(blocked_runner, BackgroundRunner)
    try:
        errors: list[BaseException] = []

        def emit() -> None:
            try:
                for start in range(0, n, chunk):
                    for i in range(start, start + chunk):
                        t.metric("seq", i, "train")
                    # keep the healthy store within its (small) queue; only the blocked sink may drop
                    assert store_attachment.runner.flush(HANG_S)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        # the drops are warned about once (from the trimmer thread, or from health(), which settles them)
        with pytest.warns(TelemetryWarning, match="'blocked' is not keeping up"):
            emitter = threading.Thread(target=emit, name="emitter", daemon=True)
            emitter.start()
            emitter.join(HANG_S)
            assert not emitter.is_alive(), "emitting blocked behind a stuck sink"
            assert not errors, errors
            assert blocked.entered.wait(HANG_S), "the blocked sink never got a batch"
            health = t.health()
        mine = _stats(t, "blocked")
        assert mine["dropped"] > 0
        # all that is not dropped is in the sink's hands or in its bounded queue
        assert mine["dropped"] >= n - capacity - blocked.received
        assert mine["delivered"] == 0
        assert health["dropped"] == mine["dropped"]
        store_stats = _stats(t, "jsonl")
        assert store_stats["dropped"] == 0 and store_stats["delivered"] == n
        assert _values(collect.records, "seq") == list(range(n))

        result: list[bool] = []
        closer = threading.Thread(target=lambda: result.append(t.close(timeout=0.5)), daemon=True)
        with pytest.warns(TelemetryWarning, match="abandoned"):  # the stuck sink is left behind, and says so
            closer.start()
            closer.join(HANG_S)
        assert not closer.is_alive(), "close() hung on a stuck sink"
        assert result == [False]
        # every record offered is accounted for: the batch the sink is stuck on is in flight, not lost from the counts
        mine = _stats(t, "blocked")
        assert mine["abandoned"] and mine["in_flight"] == blocked.received > 0
        assert mine["delivered"] + mine["dropped"] + mine["failed"] + mine["in_flight"] == n

        run = open_run(run_dir(tmp_path, t.identity))
        _assert_gap_free(_values(run.records(), "seq"), "run store")
        assert len(_values(run.records(), "seq")) == n
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TelemetryWarning)  # the released sink reports its drops now
            gate.set()
            t.close(HANG_S)
            _wait_until(lambda: not blocked_runner.running, what="the released writer thread to stop")


# -- 3. SIGTERM mid-stream -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_mid_stream_flushes_everything_and_dies_of_the_signal(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM: our handler flushes, restores the default action and re-raises. SIGINT: it flushes and chains to
    Python's own handler, whose KeyboardInterrupt ends the program (which then dies of SIGINT)."""
    run_id = f"sig-{uuid.uuid4().hex[:8]}"
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = _start_stream(tmp_path, run_id, err, 0.2)
        try:
            acks = _Acks(proc)
            acks.wait_for(20_000)
            _wait_for_data(_run_path(tmp_path, run_id) / f"rank-0.{proc.pid}.jsonl", 64 * 1024)  # written + queued
            proc.send_signal(sig)
            acknowledged = acks.to_eof()  # emitted before the signal was handled
            proc.wait(HANG_S)
        finally:
            _kill(proc)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == -sig, stderr
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in stderr  # Python's own handler ran after ours
    run = open_run(_run_path(tmp_path, run_id))
    [log] = run.processes
    assert log.pid == proc.pid
    values = _values(log.records, "seq")
    _assert_gap_free(values, "records on disk after SIGTERM")
    assert len(values) >= acknowledged
    assert run.corrupt == 0 and run.torn == 0


def test_sigterm_chains_to_the_programs_own_handler_after_flushing(tmp_path: Path) -> None:
    """The program installed a SIGTERM handler before telemetrain; it leaves with ``os._exit`` (no atexit), so the
    data can only be on disk if telemetrain flushed before chaining to it."""
    run_id = f"chain-{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "handler-ran"
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = _start_stream(tmp_path, run_id, err, 0.2, marker)
        try:
            acks = _Acks(proc)
            acks.wait_for(20_000)
            _wait_for_data(_run_path(tmp_path, run_id) / f"rank-0.{proc.pid}.jsonl", 64 * 1024)  # written + queued
            proc.send_signal(signal.SIGTERM)
            acks.to_eof()
            proc.wait(HANG_S)
        finally:
            _kill(proc)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 42, stderr  # the program's own handler ran (and chose the exit status)
    assert marker.exists(), "the program's own SIGTERM handler was not called"
    emitted = int(marker.read_text())  # what the handler saw emitted; +1 if the signal fell between emit and count
    values = _values(open_run(_run_path(tmp_path, run_id)).records(), "seq")
    _assert_gap_free(values, "records on disk after a chained SIGTERM")
    assert emitted <= len(values) <= emitted + 1


# -- 4. SIGKILL mid-stream -------------------------------------------------------------------------------------------


def test_sigkill_mid_stream_leaves_a_readable_prefix(tmp_path: Path) -> None:
    run_id = f"kill-{uuid.uuid4().hex[:8]}"
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = _start_stream(tmp_path, run_id, err, 0.01)
        try:
            acks = _Acks(proc)
            acks.wait_for(20_000)
            data_file = _run_path(tmp_path, run_id) / f"rank-0.{proc.pid}.jsonl"
            _wait_for_data(data_file, 256 * 1024)
            proc.send_signal(signal.SIGKILL)
            acknowledged = acks.to_eof()
            proc.wait(HANG_S)
        finally:
            _kill(proc)
    assert proc.returncode == -signal.SIGKILL

    run = open_run(_run_path(tmp_path, run_id))
    assert run.corrupt == 0
    values = _values(run.records(), "seq")
    assert len(values) > 0
    _assert_gap_free(values, "records on disk after SIGKILL")
    assert len(values) < acknowledged + ACK_EVERY  # never more than was emitted

    # a line cut short by the crash is skipped and counted, never an exception
    with open(data_file, "ab") as fh:
        fh.write(b'{"v":1,"kind":"metric","mono_ns":12345,"wall_ns":1,"group":"fau')
    torn = open_run(_run_path(tmp_path, run_id))
    assert torn.torn == 1
    assert torn.corrupt == 0
    assert _values(torn.records(), "seq") == values


# -- 5. fork while the writer thread runs ----------------------------------------------------------------------------


def test_fork_storm_while_writing(tmp_path: Path) -> None:
    n_children = 200
    run_id = f"fork-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(
        _helper("fork_storm", tmp_path, n_children),
        capture_output=True,
        text=True,
        env=helper_env(run_id, SESSION),
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    parent_pid, children = summary["parent_pid"], summary["children"]
    assert len(set(children)) == n_children
    assert all(code == 0 for code in summary["codes"].values()), (summary["codes"], proc.stderr[-2000:])
    assert summary["closed"] and not summary["emitter_alive"]
    assert summary["dropped"] == 0

    run = open_run(_run_path(tmp_path, run_id))
    assert run.corrupt == 0, "interleaved or corrupted lines"
    assert run.torn == 0
    by_pid = {p.pid: p for p in run.processes}
    assert set(by_pid) == {parent_pid, *children}

    parent = by_pid[parent_pid]
    assert parent.path.name == f"rank-0.{parent_pid}.jsonl"
    assert {r.name for r in parent.records} <= {"parent_start", "parent"}
    _assert_gap_free(_values(parent.records, "parent"), "the parent's stream")
    assert len(_values(parent.records, "parent")) == summary["parent_emitted"]

    for pid in children:
        log = by_pid[pid]
        assert log.path.name == f"rank-0.{pid}.jsonl"
        assert log.identity.pid == pid and log.header["identity"]["pid"] == pid
        assert all(r.identity.pid == pid for r in log.records)
        assert [(r.name, r.value) for r in log.records] == [("child", j) for j in range(5)], f"child {pid}"


# -- 6. multiprocessing workers that leave through os._exit ----------------------------------------------------------


@pytest.mark.parametrize("variant", ["parent_first", "child_first"])
def test_multiprocessing_fork_workers_records_reach_disk_without_flush(tmp_path: Path, variant: str) -> None:
    """Like DataLoader workers: fork-context ``Process`` children run the target and leave with ``os._exit``
    (atexit never runs). ``child_first``: the parent had not emitted anything before starting them."""
    n_workers = 3
    run_id = f"mp-{variant}-{uuid.uuid4().hex[:6]}"
    proc = subprocess.run(
        _helper("mp_workers", tmp_path, variant, n_workers),
        capture_output=True,
        text=True,
        env=helper_env(run_id, SESSION),
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["exitcodes"] == [0] * n_workers, proc.stderr
    path = _run_path(tmp_path, run_id)
    assert path.is_dir(), "no worker record reached the disk (the run directory was never created)"
    run = open_run(path)
    by_pid = {p.pid: p for p in run.processes}
    for k, pid in enumerate(summary["pids"]):
        assert pid in by_pid, (
            f"worker {k} (pid {pid}): no file of its own; files: {[p.path.name for p in run.processes]}"
        )
        log = by_pid[pid]
        assert all(r.identity.pid == pid for r in log.records)
        assert _values(log.records, "worker") == [k * 1000 + j for j in range(100)], f"worker {k}"
    for log in run.processes:
        if log.pid not in summary["pids"]:  # the parent: never a worker's record
            assert not _values(log.records, "worker"), f"worker records in {log.path.name}"


# -- 7. several processes, one run directory -------------------------------------------------------------------------


def test_concurrent_processes_share_one_run_directory(tmp_path: Path) -> None:
    n_procs, n = 4, 20_000
    run_id = f"multi-{uuid.uuid4().hex[:8]}"
    go = tmp_path / "go"
    procs = []
    try:
        for rank in range(n_procs):
            env = helper_env(run_id, SESSION, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n_procs))
            procs.append(
                subprocess.Popen(
                    _helper("writer", tmp_path, n, go),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
            )
        go.touch()
        outputs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            _kill(p)
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["closed"] and summary["dropped"] == 0

    path = _run_path(tmp_path, run_id)
    # (the columnar copy, `_columnar`, is derived by the background compactor when the extra is installed: not a
    # leftover, and there or not depending on when the compactor ran)
    names = sorted(f.name for f in path.iterdir() if f.name != "_columnar")
    expected_files = sorted(f"rank-{rank}.{p.pid}.jsonl" for rank, p in enumerate(procs))
    assert names == sorted(["run.json", *expected_files]), "exactly one run.json, one file per process, no leftovers"

    for name in expected_files:  # every line is valid JSON
        lines = (path / name).read_bytes().split(b"\n")
        assert lines[-1] == b""
        for line in lines[:-1]:
            json.loads(line)
        assert len(lines) - 1 == n + 1  # the header and one line per record

    run = open_run(path)
    assert run.corrupt == 0 and run.torn == 0
    assert run.meta["run_id"] == run_id and run.meta["world_size"] == n_procs
    assert sorted((p.rank, p.pid) for p in run.processes) == [(rank, p.pid) for rank, p in enumerate(procs)]
    for log in run.processes:
        _assert_gap_free(_values(log.records, "seq"), f"rank {log.rank}")
        assert len(_values(log.records, "seq")) == n
    assert len(run) == n_procs * n


# -- 8. flood into a stuck sink: memory stays flat --------------------------------------------------------------------


def test_flood_into_a_stuck_sink_keeps_memory_flat(tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil", reason="the process's RSS is read with psutil (the [system] extra)")
    n, capacity, warmup = 2_000_000, 10_000, 20_000
    gate = threading.Event()
    sink = BlockingSink(gate)
    t = Telemetry(_identity(), store=False, queue_capacity=capacity, flush_interval=0.01)
    attachment = t.add_sink(sink)
    me = psutil.Process()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TelemetryWarning)  # the drop warning, once the sink is released
            metric = t.metric
            for i in range(warmup):
                metric("seq", i, "train")
            assert sink.entered.wait(HANG_S)
            gc.collect()
            rss_before = me.memory_info().rss
            for i in range(warmup, n):
                metric("seq", i, "train")
            gc.collect()
            rss_after = me.memory_info().rss
            # health() settles the bound first (the trimmer enforces it every 20 ms), so its counts are exact now
            stats = next(s for s in t.health()["sinks"] if s["sink"] == sink.name)
            assert stats["dropped"] >= n - capacity - sink.received
            assert rss_after - rss_before < 50 * MB, f"RSS grew by {(rss_after - rss_before) / MB:.1f} MB"

            gate.set()
            assert t.close(HANG_S)
            stats = dict(vars(attachment.runner.stats))
    finally:
        gate.set()
        t.close(HANG_S)
    # everything emitted was either delivered or counted as dropped
    assert sink.metrics + stats["dropped"] == n
    assert t.health()["dropped"] == stats["dropped"]


# -- 9. non-finite values --------------------------------------------------------------------------------------------


def _refuse_constant(token: str) -> Any:
    raise AssertionError(f"bare {token} in the run store: not valid JSON")


def test_non_finite_values_round_trip_as_valid_json(tmp_path: Path) -> None:
    values = {
        "nan": math.nan,
        "inf": math.inf,
        "ninf": -math.inf,
        "negzero": -0.0,
        "huge": 1.7976931348623157e308,
        "tiny": 5e-324,
        "third": 1 / 3,
        "int": 2**62,
    }
    attributes = {"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "text": "NaN", "nested": {"xs": [math.nan, 1.5]}}
    with Telemetry(_identity(), store=tmp_path) as t:
        for name, value in values.items():
            t.metric(name, value, "train")
        t.event("nonfinite", attributes)
        mono, wall = t.now()
        stat_values = {"min": -math.inf, "max": math.inf, "mean": math.nan, "count": 3}
        t.emit(StatWindow(mono, wall, t.identity, "train", "window", mono - 1000, 3, stat_values, ""))
    path = t.run_dir
    assert path is not None

    [data_file] = list(path.glob("rank-*.jsonl"))
    lines = data_file.read_text().splitlines()
    assert len(lines) == 1 + len(values) + 2
    for line in lines:
        json.loads(line, parse_constant=_refuse_constant)

    run = open_run(path)
    assert run.corrupt == 0 and run.torn == 0
    metrics = {r.name: r.value for r in run.records("metric")}
    assert math.isnan(metrics["nan"])
    assert metrics["inf"] == math.inf and metrics["ninf"] == -math.inf
    assert metrics["negzero"] == 0.0 and math.copysign(1.0, metrics["negzero"]) == -1.0
    for name in ("huge", "tiny", "third", "int"):
        assert metrics[name] == values[name] and type(metrics[name]) is type(values[name]), name

    [event] = run.records("event")
    attrs = event.attributes
    assert math.isnan(attrs["nan"]) and attrs["inf"] == math.inf and attrs["ninf"] == -math.inf
    assert attrs["text"] == "NaN"  # a string stays a string
    assert math.isnan(attrs["nested"]["xs"][0]) and attrs["nested"]["xs"][1] == 1.5

    [stat] = run.records("stat")
    assert stat.values["min"] == -math.inf and stat.values["max"] == math.inf and math.isnan(stat.values["mean"])
    assert stat.values["count"] == 3


# -- 10. a full disk ------------------------------------------------------------------------------------------------


def test_full_disk_is_contained_and_the_file_stays_readable(tmp_path: Path) -> None:
    """Writes fail part-way through a batch (RLIMIT_FSIZE stands in for a full disk): the training loop never sees
    it, the failures are counted, the partial line stays one skipped line, and once space returns records are
    written again, intact."""
    run_id = f"full-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(
        _helper("disk_full", tmp_path),
        capture_output=True,
        text=True,
        env=helper_env(run_id, SESSION),
        timeout=HANG_S * 4,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["failed_while_full"] > 0
    assert summary["health"]["failed"] == summary["failed_while_full"]  # nothing failed after space came back
    run = open_run(_run_path(tmp_path, run_id))
    assert run.torn == 0 and run.corrupt <= 1  # the line cut by the limit, terminated before the next write
    values = _values(run.records(), "seq")
    written_while_full = [v for v in values if v < 200]
    assert written_while_full == list(range(len(written_while_full))) and len(written_while_full) >= 1
    assert len(written_while_full) < 200  # the limit did bite
    assert [v for v in values if v >= 200] == list(range(200, 300))  # all of it, once space was back


def test_drops_a_failing_sink_reports_while_closing_reach_the_run_store(tmp_path: Path) -> None:
    """The run store closes after the other sinks, so what a suspended sink loses at its close is in the store (its
    last write is tried whatever the backoff: here it fails again)."""
    from telemetrain.dispatch import FailurePolicy
    from telemetrain.sinks.base import Sink
    from telemetrain.store import open_run

    class Broken(Sink):
        name = "broken"

        def write(self, records: Any) -> None:
            raise OSError("backend down")

    t = Telemetry(store=tmp_path, failure_policy=FailurePolicy(max_consecutive=1, backoff_s=60.0, backoff_max_s=60.0))
    t.add_sink(Broken())
    t.metric("first", 1.0)
    with pytest.warns(Warning):
        t.flush()  # the broken sink fails once and is suspended
    for i in range(5):
        t.metric("later", float(i))  # queued for the suspended sink: its final drain tries them, and fails
    assert t.close()
    errors = [r for r in open_run(run_dir_of(t)).records("diagnostic") if r.name == "sink_error" and r.sink == "broken"]
    assert [r.record_count for r in errors] == [1, 5]
