"""Distributed diagnosis (issue 19): communication time per step, the late rank and why, stalls with evidence, one
clock-aligned timeline.

The launch tests run the real launcher (``telemetrain launch``: a real elastic agent) with gloo ranks on CPU
(``tests/_dist_worker.py``); effects are planted large (tens of milliseconds, seconds) against a shared 2-core
machine's noise. The rest drives the pieces on controlled numbers, in process.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from conftest import run_dir_of
from telemetrain.analysis.findings.worker_exits import describe_exit, exit_finding_text, first_failures, worker_exits
from telemetrain.distributed.comm import CommMonitor, CommOp, comm_monitor, window_figures
from telemetrain.distributed.comm_timing import HOST
from telemetrain.distributed.late_rank import LateRankAttributor, compute_times
from telemetrain.distributed.stall_view import classify
from telemetrain.distributed.stragglers import StragglerDetector
from telemetrain.distributed.watchdog import StallWatchdog, WatchdogConfig, enable_watchdog, parse_config
from telemetrain.report.model import build_model
from telemetrain.spans import span
from telemetrain.store.reader import Run, find_runs, open_run
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

WORKER = str(Path(__file__).with_name("_dist_worker.py"))
LAUNCH_TIMEOUT_S = 240


def launch(tmp_path: Path, nproc: int, **env: Any) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_", "TORCH_FR"))}
    full_env.update({"TELEMETRAIN_DIR": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1"})
    full_env.update({k: str(v) for k, v in env.items()})
    cmd = [sys.executable, "-m", "telemetrain.cli", "launch", "--nproc-per-node", str(nproc), "--monitor-interval",
           "0.1", WORKER]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, check=False)


def only_run(tmp_path: Path) -> Run:
    (path,) = find_runs(tmp_path / "runs")
    return open_run(path)


def events(run: Run, group: str, name: str) -> list[Any]:
    return [r for r in run.records("event", agents=True) if r.group == group and r.name == name]


def reports(run: Run, rank: int) -> list[dict[str, Any]]:
    (proc,) = [p for p in run.processes if p.rank == rank]
    return [dict(r.attributes) for r in proc.records if r.kind == "event" and r.name == "training_metrics_update"
            and not r.attributes.get("final")]


def show(run: Run) -> str:
    out = subprocess.run([sys.executable, "-m", "telemetrain.cli", "show", str(run.path)], capture_output=True,
                         text=True, timeout=120, check=True)
    return out.stdout


def findings_everywhere(run: Run) -> dict[str, list[str]]:
    """The findings' titles as each reader gives them: the report, `show` (its lines, without and with DuckDB) and
    `tail` (polling the files, and caught up by SQL)."""
    from telemetrain.analysis.tail import TailState
    from telemetrain.show import summarize
    from telemetrain.store.engine import Engine

    def shown(lines: list[str]) -> list[str]:
        start = next(i for i, line in enumerate(lines) if line.startswith("findings"))
        return [line.split(None, 1)[1] for line in lines[start + 1:] if re.match(r"  (error|warning|info) ", line)]

    polled = TailState(run.path)
    polled.poll()
    caught = TailState(run.path)
    with Engine([run.path]) as engine:
        caught.catch_up(engine)
        by_sql = shown(summarize(open_run(run.path), engine))
    return {"report": [f.title for f in build_model(open_run(run.path)).findings],
            "show": shown(summarize(open_run(run.path))), "show by SQL": by_sql,
            "tail": [f.title for f in polled.findings().findings],
            "tail by SQL": [f.title for f in caught.findings().findings]}


# -- the launch tests ------------------------------------------------------------------------------------------------


def test_a_rank_slow_in_forward_is_the_late_rank_and_the_others_wait_its_extra_time(tmp_path: Path) -> None:
    slow_from = 60
    result = launch(tmp_path, 3, STEPS=140, COMM=1, SLOW_RANK=2, SLOW_PHASE="forward", SLOW_S=0.04,
                    SLOW_FROM=slow_from, TELEMETRAIN_CROSS_RANK=0, CROSS_TIMEOUT=60, CROSS_EVERY=10, MIN_SHARE=0.2)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tmp_path)
    # the late-rank event names rank 2 and forward, and no straggler event of any kind names another rank
    found = events(run, "cross_rank", "straggler")
    late = [e for e in found if e.attributes["kind"] == "late"]
    assert {(e.attributes["rank"], e.attributes["phase"]) for e in late} == {(2, "forward")}
    assert {e.attributes["rank"] for e in found} == {2}
    first = late[0].attributes
    assert first["host"] == run.processes[2].identity.host and first["step"] >= slow_from
    assert 0.02 < first["cost_per_iteration_sec"] < 0.08 and first["explained"] > 0.5
    # communication time per step on every rank: one bucket's all-reduce per iteration, its bytes, its time
    for rank in range(3):
        windows = reports(run, rank)
        assert windows and all(w["comm_all_reduce_count"] == w["window_iterations"] for w in windows)
        assert all(w["comm_bytes"] == w["window_iterations"] * 2632 * 4 for w in windows)  # the model's gradients
        assert all(w["avg_comm_time_sec"] > 0 and 0 <= w["comm_wait_fraction"] <= 1 for w in windows)
        assert all(w["comm_clock"] == "host" for w in windows)

    # the fast ranks' wait grows by the slow rank's extra time, within 30% (3 ranks on 2 shared cores: 20% failed
    # once under a neighbour's load, while the growth without the slow rank is ~0)
    def mean(rank: int, key: str, after: bool) -> float:
        ws = [w for w in reports(run, rank) if w["current_iteration"] >= 19]  # the first window holds the warm-up
        chosen = [w[key] for w in ws if (w["current_iteration"] - 9 >= slow_from) == after
                  and not w["current_iteration"] - 9 < slow_from <= w["current_iteration"]]
        return statistics.fmean(chosen)

    extra = mean(2, "avg_forward_time_sec", True) - mean(2, "avg_forward_time_sec", False)
    assert extra > 0.035
    for rank in (0, 1):
        growth = mean(rank, "avg_comm_wait_time_sec", True) - mean(rank, "avg_comm_wait_time_sec", False)
        assert abs(growth - extra) <= 0.3 * extra, (rank, growth, extra)
    # the report and `show` name it
    titles = [f.title for f in build_model(run).findings]
    assert "straggler: rank 2 (forward)" in titles
    text = show(run)
    assert "straggler   rank 2" in text and "arrives last, cause forward" in text and "comm        " in text


def test_a_rank_blocked_before_the_all_reduce_is_named_by_every_ranks_evidence(tmp_path: Path) -> None:
    result = launch(tmp_path, 3, STEPS=400, COMM=1, BLOCK_RANK=1, BLOCK_AT=40, PG_TIMEOUT=8,
                    TORCH_FR_BUFFER_SIZE=200, TELEMETRAIN_WATCHDOG="floor=2,k=3,startup=30,poll=0.2,heartbeat=1")
    assert result.returncode == 1  # the waiting ranks' all-reduce times out after 8 s, and the job ends
    run = only_run(tmp_path)
    stalls = {e.identity.rank: e for e in events(run, "watchdog", "stall_evidence")
              if e.attributes["reason"] == "stall"}
    assert sorted(stalls) == [0, 1, 2]  # every rank wrote its evidence, within the stall timeout
    for e in stalls.values():
        a = e.attributes
        assert a["threshold_s"] == 2.0 and a["step"] == 39
        assert a["threshold_s"] <= a["stalled_for_s"] < a["threshold_s"] + 3.0  # polled every 0.2 s; a loaded box
        assert "Thread MainThread (main)" in a["stacks"] and "_dist_worker.py" in a["stacks"]
        fr = json.loads(Path(a["flight_recorder"]).read_text())  # torch's Flight Recorder, dumped beside the run
        assert any(entry["profiling_name"] == "gloo:all_reduce" for entry in fr["entries"])
    blocked = stalls[1].attributes
    assert blocked["phase"] == "forward" and blocked["collective_state"] == "none"
    assert "time.sleep(3600)" in blocked["stacks"]
    assert any(s.startswith("model_forward (training) open for") for s in blocked["open_spans"])
    for rank in (0, 2):
        a = stalls[rank].attributes
        assert (a["phase"], a["collective"], a["collective_state"]) == ("backward", "all_reduce", "waiting")
        assert a["collective_seq"] == blocked["last_completed_seq"] + 1
    # the agent's one stall event names the blocked rank and its phase
    (stall,) = events(run, "launcher", "stall")
    a = stall.attributes
    assert (a["ranks"], a["rank"], a["phase"], a["waiting_ranks"]) == ([1], 1, "forward", [0, 2])
    assert a["waiting_in"].startswith("all_reduce #") and a["silent_ranks"] == [] and stall.severity == "error"
    for reader, titles in findings_everywhere(run).items():  # the report, show and a live tail all say it
        assert "stall: rank(s) 1 (forward)" in titles, reader
    text = show(run)
    assert "  error    stall: rank(s) 1 (forward)\n           stuck: rank 1 in forward while rank(s) 0, 2 wait in " \
           "all_reduce" in text
    # the job's exit is not held up: the blocked rank wrote its SIGTERM evidence and died of the SIGTERM (torchelastic
    # would SIGKILL it 30 s later), soon before the launcher ended
    (signalled,) = [e for e in events(run, "watchdog", "stall_evidence") if e.identity.rank == 1
                    and e.attributes["reason"] == "signal"]
    assert signalled.attributes["phase"] == "forward"
    failures = {e.attributes["rank"]: e.attributes["exitcode"] for e in events(run, "launcher", "worker_failed")}
    assert failures[1] == -15
    (end,) = events(run, "launcher", "launch_end")
    assert (end.wall_ns - signalled.wall_ns) / 1e9 < 10.0
    assert not (run.path / "fatal-stacks").exists()  # faulthandler's file, empty: removed


def test_a_rank_killed_mid_step_leaves_survivors_evidence_naming_their_collective(tmp_path: Path) -> None:
    result = launch(tmp_path, 2, STEPS=400, COMM=1, KILL_RANK=1, KILL_AT=30, KILL_PHASE="forward", KILL_ATTEMPT=-1,
                    TELEMETRAIN_WATCHDOG="floor=3,k=3,startup=30,poll=0.2")
    assert result.returncode == 1
    run = only_run(tmp_path)
    evidence = [e for e in events(run, "watchdog", "stall_evidence") if e.identity.rank == 0]
    assert evidence, result.stderr[-3000:]
    a = evidence[0].attributes
    assert (a["collective"], a["collective_phase"]) == ("all_reduce", "backward")
    assert a["collective_state"] in ("failed", "waiting") and a["step"] == 29
    assert a["reason"] in ("collective_failed", "stall", "signal", "exit")
    failures = {e.attributes["rank"]: e.attributes["exitcode"] for e in events(run, "launcher", "worker_failed")}
    assert failures[1] == -9
    # the cause comes first: the killed rank, torchelastic's first observed failure, and what a SIGKILL means
    firsts = [e.attributes["rank"] for e in events(run, "launcher", "worker_failed") if e.attributes["first_failure"]]
    assert firsts == [1]
    crash = build_model(run).findings[0]
    assert crash.title == "crash: rank 1 died of SIGKILL (exit code -9) first" and crash.evidence is not None
    assert crash.evidence.ranks == (1,) and "out-of-memory killer" in crash.detail
    for reader, titles in findings_everywhere(run).items():  # the cause first in the report, show and a live tail
        assert titles[0] == "crash: rank 1 died of SIGKILL (exit code -9) first", reader
    died = "rank 1 died of SIGKILL (exit code -9)"
    assert f"  error    crash: {died} first\n           {died} (pid " in show(run)


def test_clocks_off_by_seconds_are_realigned_in_the_trace_within_a_millisecond(tmp_path: Path) -> None:
    skew = 2_500_000_000
    result = launch(tmp_path, 2, STEPS=60, SKEW_RANK=1, SKEW_NS=skew, TELEMETRAIN_CROSS_RANK=20)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tmp_path)
    estimates = [e.attributes for e in events(run, "clock", "clock_offset") if e.identity.rank == 1]
    assert [e["at"] for e in estimates][:1] == ["start"] and len(estimates) >= 3  # at start, then every exchange
    # within 1 ms on a quiet machine; 2 ms allowed here: on a loaded 2-core machine every round trip can wait for a
    # core (1.18 ms was seen once) -- what must hold whatever the load is the stated error (below)
    for e in estimates:  # same host: the true offset is the injected one
        assert abs(e["offset_ns"] - skew) < 2_000_000
        assert abs(e["offset_ns"] - skew) <= e["error_ns"] + 100_000  # the stated error holds (clock reading jitter)
    out = tmp_path / "trace.json"
    subprocess.run([sys.executable, "-m", "telemetrain.cli", "trace", str(run.path), "-o", str(out)], check=True,
                   capture_output=True, timeout=120)
    trace = json.loads(out.read_text())
    clock = trace["otherData"]["telemetrain"]["clock"]
    assert clock["aligned"] and clock["max_error_ns"] <= 2_000_000
    (rank1,) = [v for k, v in clock["processes"].items() if k.startswith("rank 1 ")]
    assert abs(rank1["offset_ns"] - skew) < 2_000_000 and rank1["error_ns"] == max(e["error_ns"] for e in estimates)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    ends: dict[str, list[int]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e["name"] == "training_single_iteration":
            ends.setdefault(names[e["pid"]].split(" @ ")[0], []).append(e["ts"] + e["dur"])
    pairs = list(zip(ends["rank 0"], ends["rank 1"], strict=True))
    # the same iterations end together (the all-reduce) on one timeline, not 2.5 s apart
    assert statistics.median(abs(b - a) for a, b in pairs) < 5_000
    (line,) = [x for x in show(run).splitlines() if x.startswith("clock       rank 1: ")]
    assert abs(float(line.split()[3]) - skew / 1e9) < 2e-3 and "to rank 0 (+/- " in line


def test_fsdp2_all_gathers_and_reduce_scatters_are_timed(tmp_path: Path) -> None:
    result = launch(tmp_path, 2, STEPS=20, FSDP=1, COMM=1, TELEMETRAIN_CROSS_RANK=0)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tmp_path)
    for rank in (0, 1):
        (w, *_) = reports(run, rank)
        n = w["window_iterations"]
        # two FSDP modules: each all-gathers its parameters in forward and again in backward, and reduce-scatters
        # its gradients in backward (the root's all-gather in backward is skipped: its parameters are still there)
        assert w["comm_reduce_scatter_count"] == 2 * n and w["comm_all_gather_count"] >= 2 * n
        assert w["comm_bytes"] > 0 and w["avg_comm_time_sec"] > 0
        assert w.get("avg_forward_comm_wait_sec", 0) > 0  # the unshard waited in forward: FSDP's own wait


# -- communication figures on controlled intervals --------------------------------------------------------------------


def op(seq: int, kind: str, start: float, end: float | None, phase: str = "backward", nbytes: int = 100) -> CommOp:
    o = CommOp(seq, kind, nbytes, phase, HOST)
    o.start = int(start * 1e9)
    if end is not None:
        o.end, o.state = int(end * 1e9), "done"
    return o


def test_a_blocking_collective_is_all_wait_and_overlapping_buckets_wait_only_after_the_last_launch() -> None:
    ops = [op(1, "all_reduce", 0.0, 0.010, "forward"), op(2, "all_reduce", 0.100, 0.130), op(3, "all_reduce", 0.120,
                                                                                               0.150)]
    f = window_figures(ops, {"window_iterations": 2, "window_seconds": 0.5})
    assert f["comm_count"] == 3 and f["comm_bytes"] == 300 and f["comm_all_reduce_count"] == 3
    assert f["comm_time_sec"] == pytest.approx(0.010 + 0.050)  # the union: 0..10 ms and 100..150 ms
    assert f["comm_all_reduce_time_sec"] == pytest.approx(0.010 + 0.030 + 0.030)  # the durations' sum
    assert f["comm_wait_sec"] == pytest.approx(0.010 + 0.030)  # 150 ms - the last launch at 120 ms
    assert f["avg_forward_comm_wait_sec"] == pytest.approx(0.005) and f["avg_backward_comm_wait_sec"] == pytest.approx(
        0.015)
    assert f["comm_wait_fraction"] == pytest.approx(0.040 / 0.5) and f["avg_comm_time_sec"] == pytest.approx(0.030)
    # a 10 s checkpoint save in the window: the share of the time training ran, not of the save
    saved = window_figures(ops, {"window_iterations": 2, "window_seconds": 10.5, "window_paused_seconds": 10.0})
    assert saved["comm_wait_fraction"] == pytest.approx(0.040 / 0.5)


def test_failed_and_unfinished_collectives_are_counted_not_timed() -> None:
    failed = op(2, "broadcast", 0.0, None)
    failed.state = "failed"
    f = window_figures([op(1, "all_reduce", 0.0, 0.002), failed, op(3, "all_gather", 0.5, None)],
                       {"window_iterations": 1, "window_seconds": 1.0})
    assert (f["comm_failed"], f["comm_open"], f["comm_count"]) == (1, 1, 3)
    assert f["comm_broadcast_count"] == 1 and f["comm_broadcast_time_sec"] == 0.0
    assert f["comm_time_sec"] == pytest.approx(0.002)


def test_an_interrupt_inside_a_collective_is_not_a_failed_collective() -> None:
    t = telemetrain.Telemetry(store=False)
    watchdog = StallWatchdog(t, WatchdogConfig(heartbeat_s=0, on_signal=False, fatal_stacks=False))
    watchdog.start()
    monitor = comm_monitor(t)
    heard: list[CommOp] = []
    monitor.on_failure(heard.append)
    with pytest.raises(KeyboardInterrupt), monitor.timed("all_reduce", 64):
        raise KeyboardInterrupt  # Ctrl-C, delivered as the blocking call returns
    with pytest.raises(RuntimeError), monitor.timed("broadcast", 8):
        raise RuntimeError("Connection closed by peer")  # a dead peer: a failure
    assert [o.kind for o in heard] == ["broadcast"]
    assert [o.state for o in monitor._ops] == ["interrupted", "failed"]
    assert watchdog._failure is heard[0]  # the watchdog hears the failure only
    f = window_figures(monitor._ops, {"window_iterations": 1})
    assert (f["comm_failed"], f["comm_count"], f["comm_all_reduce_count"]) == (1, 2, 1) and "comm_open" not in f
    watchdog.stop()
    t.close()


def test_the_monitor_reports_per_window_with_the_recorders_phase(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=tmp_path)
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=2),
                           telemetry=t)
    monitor = comm_monitor(t)
    assert comm_monitor(t) is monitor and isinstance(monitor, CommMonitor)
    failures: list[CommOp] = []
    monitor.on_failure(failures.append)
    rec.on_app_start()
    rec.on_train_start(train_iterations_start=0)
    for i in range(4):
        rec.on_training_single_iteration_start()
        with rec.host_to_device():
            assert rec.progress()["phase"][0] == "host_to_device"
        with rec.forward():
            pass
        with rec.backward(), monitor.timed("all_reduce", 64):
            time.sleep(0.002)
        if i == 3:
            with pytest.raises(RuntimeError), monitor.timed("barrier"):
                raise RuntimeError("peer gone")
        rec.on_training_single_iteration_end()
    assert failures[0].kind == "barrier" and failures[0].error == "RuntimeError: peer gone"
    assert monitor.open_ops() == [] and monitor.last_failed is failures[0]
    rec.on_train_end()
    rec.on_app_end()
    t.close()
    updates = [r.attributes for r in open_run(run_dir_of(t)).records("event") if r.name == "training_metrics_update"]
    assert [u["comm_all_reduce_count"] for u in updates[:2]] == [2, 2]
    assert all(u["avg_h2d_time_sec"] > 0 for u in updates)  # the host-to-device phase of the iteration split
    assert all(u["avg_backward_comm_wait_sec"] >= 0.002 for u in updates[:2])
    assert "comm_failed" not in updates[0] and updates[1]["comm_failed"] == 1  # counted, not timed
    assert updates[1]["comm_barrier_count"] == 1 and updates[1]["comm_barrier_time_sec"] == 0.0
    with pytest.raises(ValueError, match="kind"), monitor.timed(""):
        pass


def test_without_a_recorder_the_monitor_keeps_only_the_newest_collectives(monkeypatch: pytest.MonkeyPatch) -> None:
    from telemetrain.distributed import comm

    monkeypatch.setattr(comm, "MAX_WINDOW_OPS", 10)
    t = telemetrain.Telemetry(store=False)
    monitor = CommMonitor(t)
    for _ in range(25):
        monitor.end(monitor.begin("all_reduce", 8))
    assert (monitor.unreported, len(monitor._ops), monitor.count) == (15, 10, 25)
    assert monitor._ops[-1].seq == 25
    t.close()


_EXPLICIT = """
import json, warnings, torch, torch.distributed as dist, telemetrain
from telemetrain.distributed import collectives
from telemetrain.distributed.comm import comm_monitor
warnings.simplefilter("ignore", FutureWarning)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
x = torch.ones(8)
t = telemetrain.Telemetry(store=False)  # torch's signatures, positional arguments
c = collectives.using(t)
c.all_reduce(x)
c.all_reduce(x, op=dist.ReduceOp.SUM, async_op=True).wait()
c.broadcast(x, 0)
c.all_gather_into_tensor(torch.empty(8), x)
c.barrier()
positional = [(o.kind, o.nbytes, o.state) for o in comm_monitor(t)._ops]
t = telemetrain.Telemetry(store=False)  # tensors passed by name
c = collectives.using(t)
c.all_reduce(tensor=x)
c.broadcast(tensor=x, src=0)
c.all_gather_into_tensor(output_tensor=torch.empty(8), input_tensor=x)
c.reduce_scatter_tensor(output=torch.empty(8), input=x)
c.all_gather(tensor_list=[torch.empty(8)], tensor=x)
by_name = [(o.kind, o.nbytes) for o in comm_monitor(t)._ops]
print(json.dumps({"positional": positional, "by_name": by_name}))
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def explicit_collectives() -> dict[str, list[list[Any]]]:
    """The ops ``collectives.using`` recorded in one gloo process of world size 1 (one interpreter, one torch import,
    for both tests): ``positional``, (kind, bytes, state); ``by_name``, (kind, bytes)."""
    out = subprocess.run([sys.executable, "-c", _EXPLICIT], capture_output=True, text=True, timeout=120, check=True)
    result: dict[str, list[list[Any]]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_explicit_collectives_are_timed_with_torchs_signatures(explicit_collectives: dict[str, Any]) -> None:
    kinds = explicit_collectives["positional"]
    assert [k[0] for k in kinds] == ["all_reduce", "all_reduce", "broadcast", "all_gather_into_tensor", "barrier"]
    assert [k[1] for k in kinds] == [32, 32, 32, 32, 0] and {k[2] for k in kinds} == {"done"}


def test_explicit_collectives_count_the_bytes_of_tensors_passed_by_name(explicit_collectives: dict[str, Any]) -> None:
    ops = explicit_collectives["by_name"]
    assert [k[0] for k in ops] == ["all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
                                   "all_gather"]
    assert [k[1] for k in ops] == [32] * 5


_P2P_WORKER = """
import json, sys, torch, torch.distributed as dist, torch.multiprocessing as mp, telemetrain
from telemetrain.distributed import collectives
from telemetrain.distributed.comm import comm_monitor

def main(rank, folder):
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    t = telemetrain.Telemetry(store=False)
    c = collectives.using(t)
    x = torch.ones(4)
    if rank == 0:
        c.send(x, 1)
        c.isend(tensor=x, dst=1).wait()
        sender = None
    else:
        sender = c.recv(torch.empty(4), 0)
        c.irecv(torch.empty(4), src=0).wait()
    c.gather(x, [torch.empty(4), torch.empty(4)] if rank == 0 else None, dst=0)
    c.scatter(torch.empty(4), [x, x] if rank == 0 else None, src=0)
    c.all_gather_single(torch.empty(8), x)
    c.reduce_scatter_single(torch.empty(2), x)
    sub = dist.new_group([0, 1])
    c.all_reduce(x, group=sub, async_op=True).wait()
    ops = [(o.kind, o.nbytes, o.state) for o in comm_monitor(t)._ops]
    with open(f"{folder}/rank{rank}.json", "w") as f:
        json.dump({"ops": ops, "sender": sender}, f)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(main, args=(sys.argv[1],), nprocs=2)
"""


def test_point_to_point_rooted_and_subgroup_collectives_are_timed_between_two_gloo_ranks(tmp_path: Path) -> None:
    script = tmp_path / "p2p.py"
    script.write_text(_P2P_WORKER)
    subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120,
                   check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert one["sender"] == 0  # recv still returns torch's value
    kinds = ["gather", "scatter", "all_gather_single", "reduce_scatter_single", "all_reduce"]
    assert [o[0] for o in zero["ops"]] == ["send", "isend", *kinds]
    assert [o[0] for o in one["ops"]] == ["recv", "irecv", *kinds]
    # payload bytes: the tensor sent or received; gather/scatter on the root count its list (2 x 16)
    assert [o[1] for o in zero["ops"]] == [16, 16, 32, 32, 32, 16, 16]
    assert [o[1] for o in one["ops"]] == [16, 16, 16, 16, 32, 16, 16]
    assert {o[2] for o in zero["ops"] + one["ops"]} == {"done"}


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="needs a CUDA device: collectives on GPU tensors (NCCL) are timed with CUDA events")
def test_cuda_tensors_are_device_timed_with_events() -> None:  # pragma: no cover - no GPU on the CI machines
    import torch

    monitor = CommMonitor(telemetrain.Telemetry(store=False))
    a = torch.randn(2048, 2048, device="cuda")
    o = monitor.begin("all_reduce", a.numel() * 4, cuda=True)
    a @ a
    monitor.end(o)
    f = window_figures([o], {"window_iterations": 1, "window_seconds": 1.0})
    assert f["comm_clock"] == "cuda" and f["comm_time_sec"] > 0


# -- late-rank attribution on controlled numbers ----------------------------------------------------------------------


def rank_window(wait: float, *, forward: float = 0.003, backward: float = 0.004, dataloader: float = 0.001,
                interval: float = 0.012, wait_backward: float | None = None) -> dict[str, float]:
    v = {"iteration": interval, "dataloader": dataloader, "forward": forward, "backward": backward + wait,
         "optimizer": 0.001, "samples_per_second": 16 / interval, "h2d": math.nan, "zero_grad": math.nan,
         "interval": interval, "comm_wait": wait, "comm_time": wait + 0.001, "wait_backward": wait}
    if wait_backward is not None:
        v["wait_backward"] = wait_backward
    return v


def test_the_rank_that_waits_least_is_late_and_its_slow_phase_is_the_cause() -> None:
    late = LateRankAttributor(patience=2)
    values = {r: rank_window(0.0105) for r in range(4)}
    values[2] = rank_window(0.0005, forward=0.013)
    changes, verdict = late.update(9, values, 10)
    assert changes == [] and verdict is not None and verdict.late == (2,) and verdict.causes == {2: "forward"}
    (found,) = late.update(19, values, 10)[0]
    assert (found.rank, found.phase, found.kind, found.ended) == (2, "forward", "late", False)
    assert found.evidence["cost_per_iteration_sec"] == pytest.approx(0.010)
    assert found.evidence["cost_sec"] == pytest.approx(0.1) and found.evidence["excess_forward_sec"] == pytest.approx(
        0.010)
    assert late.update(29, values, 10)[0] == []  # reported once
    even = {r: rank_window(0.0005) for r in range(4)}
    (ended,) = late.update(39, even, 10)[0]
    assert (ended.rank, ended.phase, ended.ended) == (2, "forward", True) and late.active == []


def test_balanced_ranks_and_missing_waits_name_nobody() -> None:
    late = LateRankAttributor(patience=1)
    balanced = {r: rank_window(0.0005 + 0.0001 * r) for r in range(4)}  # 0.3 ms apart on a 12 ms step: noise
    assert late.analyse(9, balanced) is None
    no_waits = {r: {**rank_window(0.001), "comm_wait": math.nan} for r in range(4)}
    assert late.analyse(9, no_waits) is None
    assert late.analyse(9, {0: rank_window(0.001)}) is None


def test_waits_in_subgroups_name_nobody_only_the_jobs_collectives_compare() -> None:
    # a pipeline: stage 0 waits least (nothing before it in forward), but no collective spans every rank
    values = {r: {**rank_window(0.002 + 0.003 * r), "world_wait": 0.0} for r in range(4)}
    late = LateRankAttributor(patience=1)
    assert late.analyse(9, {r: {k: x for k, x in v.items() if k != "world_wait"} for r, v in values.items()}) \
        is not None  # read as one synchronous job, stage 0 would be named
    assert late.analyse(9, values) is None and late.update(9, values, 10)[0] == []
    values[3]["world_wait"] = math.nan  # a rank without process group: unknown, not attributed on the rest
    assert late.analyse(9, values) is None


def test_a_rank_held_up_in_its_subgroup_is_not_late_with_the_rank_that_held_it_up() -> None:
    # pairs (0,1) and (2,3) with a barrier over all: rank 2 is slow, rank 3 waits for it in the pair (8 ms), then
    # both arrive last at the barrier, where ranks 0 and 1 wait 8 ms
    values = {r: {**rank_window(0.008), "world_wait": 0.008} for r in (0, 1)}
    values[2] = {**rank_window(0.0005, forward=0.011), "world_wait": 0.0005}
    values[3] = {**rank_window(0.0085), "world_wait": 0.0005}
    verdict = LateRankAttributor(patience=1).analyse(9, values)
    assert verdict is not None and verdict.late == (2,) and verdict.causes == {2: "forward"}
    assert verdict.evidence[2]["cost_per_iteration_sec"] == pytest.approx(0.0075)


def test_two_slow_ranks_are_named_together_and_time_outside_any_phase_is_a_cause() -> None:
    values = {r: rank_window(0.010) for r in range(5)}
    values[1] = rank_window(0.0005, dataloader=0.0105)
    values[3] = rank_window(0.0007, dataloader=0.001)  # late too, but its phases are like the others': outside
    verdict = LateRankAttributor().analyse(9, values)
    assert verdict is not None and verdict.late == (1, 3)
    assert verdict.causes == {1: "dataloader", 3: "outside"}


def test_waiting_in_forward_is_not_forward_compute() -> None:
    # FSDP: the unshard all-gather is waited in forward; the late rank's forward is short because it waited less
    v = rank_window(0.006, forward=0.008, wait_backward=0.0)
    v["wait_forward"] = 0.006
    assert compute_times(v)["forward"] == pytest.approx(0.002)


def test_the_detector_does_not_blame_ranks_that_waited() -> None:
    d = StragglerDetector(patience=1)
    for step in range(3):
        d.update(step, {r: {"iteration": 0.01, "forward": 0.003, "samples_per_second": 1600.0} for r in range(3)})
    slower = {r: {"iteration": 0.03, "forward": 0.003, "samples_per_second": 530.0} for r in range(3)}
    slower[2]["forward"] = 0.023
    found = d.update(3, slower, relative=False, waiting=frozenset({0, 1}))
    assert {f.rank for f in found} == {2} and {f.kind for f in found} == {"individual"}


# -- the agent's view of a stall ---------------------------------------------------------------------------------------


def evidence(phase: str, seq: int | None = None, state: str = "waiting", kind: str = "all_reduce") -> dict[str, Any]:
    e: dict[str, Any] = {"phase": phase, "step": 41, "stalled_for_s": 70.0, "host": "node"}
    if seq is not None:
        e.update(collective=kind, collective_seq=seq, collective_state=state, collective_phase="backward")
    return e


def test_the_rank_not_in_the_collective_the_others_wait_in_is_stuck() -> None:
    a = classify({0: evidence("backward", 84), 1: evidence("dataloader"), 2: evidence("backward", 84),
                  3: evidence("backward", 84)}, 4)
    assert (a["ranks"], a["rank"], a["phase"], a["waiting_ranks"]) == ([1], 1, "dataloader", [0, 2, 3])
    assert a["waiting_in"] == "all_reduce #84 (backward)" and a["silent_ranks"] == []
    assert a["message"] == "stuck: rank 1 in dataloader while rank(s) 0, 2..3 wait in all_reduce #84 (backward)"
    behind = classify({0: evidence("backward", 84), 1: evidence("backward", 83)}, 2)  # an earlier collective
    assert behind["ranks"] == [1]
    # a job of 1,024 ranks: one line however many wait (the ranks as ranges), the lists whole in the attributes
    many = classify({r: evidence("dataloader") if r == 700 else evidence("backward", 84) for r in range(1000)}, 1024)
    assert many["message"] == ("stuck: rank 700 in dataloader while rank(s) 0..699, 701..999 wait in all_reduce #84 "
                               "(backward); no evidence from rank(s) 1000..1023")
    assert len(many["waiting_ranks"]) == 999 and many["silent_ranks"] == list(range(1000, 1024))


def test_a_rank_that_skipped_a_collective_waits_in_another_one_at_the_same_number_and_is_named() -> None:
    def at(kind: str, nbytes: int) -> dict[str, Any]:
        return {**evidence("backward", 5, kind=kind), "collective_bytes": nbytes}

    # rank 1 skipped the all-reduce #5 the others wait in: its next collective is its #5 too (gloo waits it out)
    a = classify({0: at("all_reduce", 12), 1: at("broadcast", 400), 2: at("all_reduce", 12)}, 3)
    assert (a["ranks"], a["rank"], a["waiting_ranks"]) == ([1], 1, [0, 2])
    assert a["collective_mismatch"] == ["1:broadcast #5 (400 B)"]
    assert a["message"] == ("stuck: rank 1 in broadcast #5 (backward), another collective while rank(s) 0, 2 wait in "
                            "all_reduce #5 (backward)")
    # the same kind, another size (a DDP bucket for the skipped all-reduce)
    b = classify({r: at("all_reduce", 4096 if r == 3 else 12) for r in range(4)}, 4)
    assert (b["ranks"], b["waiting_ranks"]) == ([3], [0, 1, 2])
    # two ranks, two collectives: no majority says which one is off, so both are said, and nobody is named
    c = classify({0: at("all_reduce", 12), 1: at("broadcast", 400)}, 2)
    assert (c["ranks"], c["rank"]) == ([], -1)
    assert c["message"] == ("the ranks wait in collectives that differ at #5: rank 0 in all_reduce #5 (12 B); rank 1 "
                            "in broadcast #5 (400 B)")
    # alike collectives are not a mismatch
    assert classify({0: at("all_reduce", 12), 1: at("all_reduce", 12)}, 2)["collective_mismatch"] == []


def test_without_collectives_the_odd_phase_out_is_stuck_and_alike_ranks_name_nobody_or_the_silent() -> None:
    a = classify({0: evidence("backward"), 1: evidence("forward"), 2: evidence("backward")}, 3)
    assert (a["ranks"], a["phase"]) == ([1], "forward")
    same = classify({0: evidence("backward", 9), 1: evidence("backward", 9)}, 2)
    assert same["ranks"] == [] and same["rank"] == -1 and "same place: all_reduce #9" in same["message"]
    silent = classify({0: evidence("backward", 9)}, 2)  # rank 1 gave none: it is the one named
    assert (silent["ranks"], silent["phase"], silent["silent_ranks"]) == ([1], "no evidence", [1])


def test_the_agent_follows_the_ranks_files_and_writes_one_stall_event(tmp_path: Path) -> None:
    from telemetrain.distributed.stall_view import StallWatcher

    runs = tmp_path / "runs"

    def ident(rank: int, role: str = "") -> telemetrain.Identity:
        return telemetrain.identity_from_env({}, rank=rank, world_size=3, run_id="job.0", session_tag="job",
                                             role=role)

    ranks = [telemetrain.Telemetry(ident(r), store=runs) for r in range(3)]
    agent = telemetrain.Telemetry(ident(0, "agent"), store=runs)
    agent.event("launch_start", {}, group="launcher")
    agent.flush()
    watcher = StallWatcher(agent, 3, gather_s=60.0)
    where = {0: evidence("backward", 12), 1: evidence("dataloader"), 2: evidence("backward", 12)}
    for rank, t in enumerate(ranks):
        t.event("training_metrics_update", {"current_iteration": 9}, group="training")  # lines the agent skips
        t.event("stall_evidence", {"reason": "stall", **where[rank]}, group="watchdog", severity="error")
        t.flush()
        watcher.poll()
        watcher.decide()
        assert watcher.events == (1 if rank == 2 else 0)  # it waits for every rank (or gather_s)
    ranks[1].event("stall_evidence", {"reason": "signal", **evidence("dataloader")}, group="watchdog")
    ranks[1].flush()
    watcher.close()  # a last look: nothing new to say about this run
    for t in ranks:
        t.close()
    agent.close()
    (stall,) = [r for r in open_run(runs / "job" / "job.0").records("event", agents=True) if r.name == "stall"]
    assert (stall.attributes["ranks"], stall.attributes["phase"], stall.identity.role) == ([1], "dataloader", "agent")
    assert stall.attributes["run_id"] == "job.0" and stall.attributes["waiting_in"] == "all_reduce #12 (backward)"


def _agent_view(runs: Path, files: dict[int, tuple[str, int]], where: dict[int, dict[str, Any]],
                agent_host: str) -> list[Any]:
    """The agent (on ``agent_host``, launched with torchrun's default --node-rank 0: local ranks 0..1 of 2 nodes x 2)
    following the rank files ``files`` (rank -> host, world size) of one run store; its ``stall`` events."""
    from telemetrain.distributed.stall_view import StallWatcher

    def ident(rank: int, host: str, world: int, role: str = "") -> telemetrain.Identity:
        return telemetrain.identity_from_env({}, rank=rank, world_size=world, run_id="job.0", session_tag="job",
                                             role=role, host=host)

    ranks = {r: telemetrain.Telemetry(ident(r, host, world), store=runs) for r, (host, world) in files.items()}
    agent = telemetrain.Telemetry(ident(0, agent_host, 4, "agent"), store=runs)
    agent.event("launch_start", {}, group="launcher")
    agent.flush()
    watcher = StallWatcher(agent, 4, gather_s=60.0, local_ranks=frozenset({0, 1}))
    for rank, t in ranks.items():
        if rank in where:
            t.event("stall_evidence", {"reason": "stall", **where[rank]}, group="watchdog", severity="error")
        t.flush()
    watcher.close()  # its last look decides
    for t in ranks.values():
        t.close()
    agent.close()
    run = open_run(runs / "job" / "job.0")
    return [r for r in run.records("event", agents=True) if r.name == "stall" and r.identity.host == agent_host]


def test_a_node_agent_names_no_other_nodes_ranks_it_cannot_see_and_one_agent_speaks_for_a_shared_store(
        tmp_path: Path) -> None:
    waiting = {r: evidence("backward", 12) for r in range(4)}
    # a run store per node: node-b's agent sees ranks 2 and 3 only, both waiting; ranks 0..1 are not silent to it
    (own,) = _agent_view(tmp_path / "b", {2: ("node-b", 4), 3: ("node-b", 4)}, waiting, "node-b")
    assert own.attributes["silent_ranks"] == [] and own.attributes["ranks"] == [] and own.attributes["rank"] == -1
    assert own.attributes["message"] == ("every rank that reported (2..3) is stalled in the same place: "
                                         "all_reduce #12 (backward)")
    # a shared run store: node-b's agent (torchrun's node rank 0 too) leaves it to rank 0's node: one event a job
    files = {0: ("node-a", 4), 1: ("node-a", 4), 2: ("node-b", 4), 3: ("node-b", 4)}
    stuck = {**waiting, 1: evidence("dataloader")}
    assert _agent_view(tmp_path / "shared-b", files, stuck, "node-b") == []
    (speaker,) = _agent_view(tmp_path / "shared-a", files, stuck, "node-a")
    assert (speaker.attributes["ranks"], speaker.attributes["phase"]) == ([1], "dataloader")
    # an elastic job (--nnodes 1:2) that ran on one node: the ranks' world size, not the launcher's largest
    (alone,) = _agent_view(tmp_path / "one", {0: ("node-a", 2), 1: ("node-a", 2)}, waiting, "node-a")
    assert alone.attributes["silent_ranks"] == [] and alone.attributes["rank"] == -1


def test_the_agents_follower_holds_back_a_line_being_written(tmp_path: Path) -> None:
    from telemetrain.distributed.stall_view import _EvidenceFollower

    path = tmp_path / "rank-3.77.jsonl"
    line = json.dumps({"v": 1, "kind": "event", "group": "watchdog", "name": "stall_evidence",
                       "attributes": {"reason": "stall", "p99_s": {"$float": "NaN"}}}).encode()
    path.write_bytes(b'{"no header": true}\n' + line[:40])
    follower = _EvidenceFollower(path)
    assert follower.poll() == []
    with open(path, "ab") as fh:
        fh.write(line[40:] + b"\n")
    ((rank, attributes),) = follower.poll()
    assert rank == 3 and attributes["reason"] == "stall" and math.isnan(attributes["p99_s"])


# -- the watchdog, in process ------------------------------------------------------------------------------------------


def wait_for(predicate: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _training(t: telemetrain.Telemetry) -> TrainingRecorder:
    """A recorder of ``t`` with its application and training loop started (a report every 5 iterations)."""
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=5),
                           telemetry=t)
    rec.on_app_start()
    rec.on_train_start(train_iterations_start=0)
    return rec


def test_the_watchdog_writes_evidence_of_a_stall_and_notes_its_end(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=tmp_path)
    watchdog = enable_watchdog(t, floor_s=0.5, k=3.0, startup_s=0.5, poll_s=0.05, heartbeat_s=0.1, on_signal=False,
                               fatal_stacks=False)
    assert enable_watchdog(t) is watchdog  # one per Telemetry
    rec = _training(t)
    for _ in range(10):
        rec.on_training_single_iteration_start()
        with rec.forward():
            time.sleep(0.001)
        rec.on_training_single_iteration_end()
    t.flush()
    assert watchdog.base_s is not None and watchdog.threshold_s == 0.5  # k x p99 is far below the floor
    release = threading.Event()
    rec.on_training_single_iteration_start()
    with rec.backward():
        assert wait_for(lambda: watchdog.evidence_written == 1), "no evidence"
        release.set()
    rec.on_training_single_iteration_end()
    assert wait_for(lambda: not watchdog.stalled)
    rec.on_train_end()
    rec.on_app_end()
    t.close()
    records = open_run(run_dir_of(t)).records("event")
    (ev,) = [r.attributes for r in records if r.name == "stall_evidence"]
    assert (ev["reason"], ev["phase"], ev["step"], ev["collective_state"]) == ("stall", "backward", 9, "unknown")
    assert ev["stalled_for_s"] >= 0.5 and ev["phase_for_s"] > 0 and "test_distributed_diagnosis.py" in ev["stacks"]
    assert "wait_for" in ev["stacks"]
    assert [r.name for r in records if r.group == "watchdog"] == ["stall_evidence", "stall_end"]
    beats = [r.attributes for r in records if r.name == "training_progress"]
    assert beats and beats[0]["current_iteration"] >= 0 and beats[0]["cumulative_iteration_time_sec"] > 0
    assert watchdog.thread is not None and not watchdog.thread.is_alive()  # stopped at close


def test_no_evidence_while_training_advances_or_pauses_in_a_checkpoint(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=tmp_path)
    # a floor of 1 s: a shorter one is within the pauses a loaded or virtual machine gives a thread now and then
    watchdog = enable_watchdog(t, floor_s=1.0, k=2.0, startup_s=1.0, poll_s=0.05, heartbeat_s=0, on_signal=False,
                               fatal_stacks=False)
    rec = _training(t)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        rec.on_training_single_iteration_start()
        rec.on_training_single_iteration_end()
        time.sleep(0.01)
    rec.on_save_checkpoint_start(global_step=5)
    time.sleep(1.5)  # a save longer than the threshold: iterations stop advancing by design
    rec.on_save_checkpoint_success(global_step=5)
    rec.on_save_checkpoint_end()
    rec.on_train_end()
    rec.on_app_end()
    t.close()
    assert watchdog.evidence_written == 0 and watchdog.wakeups > 10
    assert not [r for r in open_run(run_dir_of(t)).records("event") if r.group == "watchdog"]


def test_a_checkpoint_save_in_the_window_does_not_raise_the_stall_threshold(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=tmp_path)
    watchdog = enable_watchdog(t, floor_s=0.01, k=1.0, poll_s=600, heartbeat_s=0, on_signal=False,
                               fatal_stacks=False)  # (its thread never looks here: only the reports' figures count)
    rec = _training(t)
    for i in range(5):  # one report: a save of 1 s among 5 iterations of microseconds
        rec.on_training_single_iteration_start()
        rec.on_training_single_iteration_end()
        if i == 2:
            rec.on_save_checkpoint_start(global_step=i)
            time.sleep(1.0)
            rec.on_save_checkpoint_success(global_step=i)
            rec.on_save_checkpoint_end()
    t.flush()
    base_s = watchdog.base_s
    rec.on_train_end()
    rec.on_app_end()
    t.close()
    (report,) = [r.attributes for r in open_run(run_dir_of(t)).records("event") if r.name == "training_metrics_update"
                 and r.attributes.get("window_iterations") == 5]
    paused_per_iteration = report["window_paused_seconds"] / 5
    assert paused_per_iteration >= 0.19
    # the step interval is the time training ran: the save's 0.2 s per iteration is not in it
    assert base_s is not None and base_s < paused_per_iteration / 2


def test_the_stall_clock_restarts_when_a_checkpoint_save_ends(tmp_path: Path) -> None:
    """A save longer than the threshold, looked at just after it ended and before the next iteration: no stall (the
    clock ran from the last iteration before the save, and flagged one; CI caught the watchdog's poll in that gap).
    No iteration for a threshold after the save: a stall. Each look made here, in order (the watchdog's own)."""
    t = telemetrain.Telemetry(store=tmp_path)
    watchdog = StallWatchdog(t, WatchdogConfig(floor_s=0.3, k=2.0, startup_s=0.3, heartbeat_s=0, on_signal=False,
                                               fatal_stacks=False))  # not started: no thread of its own looks
    rec = _training(t)
    for _ in range(3):
        rec.on_training_single_iteration_start()
        rec.on_training_single_iteration_end()
    watchdog._check()
    rec.on_save_checkpoint_start(global_step=3)
    watchdog._check()
    time.sleep(0.5)  # the save: longer than the threshold
    rec.on_save_checkpoint_success(global_step=3)
    rec.on_save_checkpoint_end()
    watchdog._check()
    assert watchdog.evidence_written == 0 and not watchdog.stalled
    time.sleep(0.5)  # then nothing: a stall, counted from the save's end
    watchdog._check()
    assert watchdog.evidence_written == 1 and watchdog.stalled
    rec.on_train_end()
    rec.on_app_end()
    t.close()


def test_watchdog_settings_are_checked_and_parsed() -> None:
    c = parse_config("floor=2,k=3,startup=30,poll=0.2,heartbeat=1,signal=0")
    assert (c.floor_s, c.k, c.startup_s, c.poll_s, c.heartbeat_s, c.on_signal) == (2.0, 3.0, 30.0, 0.2, 1.0, False)
    assert parse_config("1") == WatchdogConfig()
    with pytest.raises(ValueError, match="unknown watchdog setting"):
        parse_config("florr=2")
    assert parse_config("signal=off,fatal_stacks=yes").on_signal is False
    with pytest.raises(ValueError, match="signal must be 0/1"):
        parse_config("signal=enabled")  # not silently off
    for kwargs in ({"k": 0}, {"floor_s": -1}, {"poll_s": 0}, {"heartbeat_s": -1}, {"stacks_limit": 10}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            WatchdogConfig(**kwargs)  # type: ignore[arg-type]


# -- the trace on one clock, and goodput from a heartbeat --------------------------------------------------------------


def test_the_trace_moves_each_rank_onto_rank_zeros_clock_between_estimates(tmp_path: Path) -> None:
    from telemetrain.trace import build_trace

    runs = tmp_path / "runs"
    for rank, offsets in ((0, (0, 0)), (1, (3_000_000_000, 3_000_200_000))):
        ident = telemetrain.identity_from_env({}, rank=rank, world_size=2, run_id="job.0", session_tag="job")
        t = telemetrain.Telemetry(ident, store=runs)
        t.event("clock_offset", {"offset_ns": offsets[0], "error_ns": 40_000 * rank}, group="clock")
        with span("work", telemetry=t):
            time.sleep(0.01)
        time.sleep(0.05)
        t.event("clock_offset", {"offset_ns": offsets[1], "error_ns": 50_000 * rank}, group="clock")
        t.close()
    run = open_run(runs / "job" / "job.0")
    raw = {p.rank: next(r for r in p.records if r.kind == "span_end").wall_ns for p in run.processes}
    trace = build_trace([run])
    clock = trace["otherData"]["telemetrain"]["clock"]
    assert clock["aligned"] and clock["max_error_ns"] == 50_000
    (rank1,) = [v for k, v in clock["processes"].items() if k.startswith("rank 1 ")]
    assert (rank1["offset_ns"], rank1["error_ns"], rank1["estimates"]) == (3_000_200_000, 50_000, 2)
    origin = trace["otherData"]["telemetrain"]["origin_wall_ns"]
    rank_of = {e["pid"]: int(e["args"]["name"].split()[1]) for e in trace["traceEvents"] if e["name"] == "process_name"}
    end_of = {rank_of[e["pid"]]: (e["ts"] + e["dur"]) * 1000 + origin for e in trace["traceEvents"]
              if e.get("name") == "work"}
    assert abs(end_of[0] - raw[0]) <= 1_000  # rank 0 is the reference: as recorded (to the microsecond)
    # rank 1's span ended between its two estimates: moved back by an offset between them
    assert 3_000_000_000 - 1_000 <= raw[1] - end_of[1] <= 3_000_200_000 + 1_000


def test_a_heartbeat_bounds_the_progress_of_a_run_killed_between_reports(tmp_path: Path) -> None:
    from telemetrain.training.goodput import goodput

    t = telemetrain.Telemetry(store=tmp_path)
    rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=10),
                           telemetry=t)
    rec.on_app_start()
    rec.on_train_start(train_iterations_start=0)
    for _ in range(27):  # reports at 9 and 19; then it is "killed" at 27 without a final report
        rec.on_training_single_iteration_start()
        rec.on_training_single_iteration_end()
    watchdog = enable_watchdog(t, heartbeat_s=0.01, poll_s=0.02, on_signal=False, fatal_stacks=False)
    assert wait_for(lambda: watchdog.heartbeats >= 1)
    t.flush()
    run_dir = t.run_dir
    assert run_dir is not None
    report = goodput(run_dir.parent)
    (run,) = report.runs
    # (its process is this one, alive and writing: "running"; a killed one's progress is bounded the same way)
    assert run.status == "running" and run.last_iteration == 26
    assert any("heartbeat" in note for note in run.notes)
    t.close()


# -- why the workers ended (analysis.findings.worker_exits) ---------------------------------------------------------


def test_the_first_failure_is_the_cause_and_the_agents_sigterms_follow_it() -> None:
    events: list[dict[str, Any]] = [{"rank": 0, "exitcode": -15, "pid": 10, "first_failure": False},
              {"rank": 2, "exitcode": 1, "pid": 12, "message": "ValueError: bad batch", "first_failure": True},
              {"rank": 1, "exitcode": -15, "pid": 11, "first_failure": False},
              {"rank": "x", "exitcode": 1}]  # malformed: left out
    exits = worker_exits(events)
    assert [e.rank for e in exits] == [0, 1, 2] and [e.rank for e in first_failures(exits)] == [2]
    found = exit_finding_text(exits)
    assert found is not None
    title, text = found
    assert title == "crash: rank 2 exited with code 1 first"
    assert text.startswith("rank 2 exited with code 1 (pid 12): the program ended with an error: ValueError: bad batch")
    assert "Then rank(s) 0..1 were stopped by the agent (SIGTERM)" in text
    assert exit_finding_text([]) is None


def test_without_the_agents_word_the_exits_that_are_not_its_sigterm_come_first() -> None:
    # a run recorded before the launcher kept the first failure: a SIGSEGV among SIGTERMs is the cause
    exits = worker_exits([{"rank": 0, "exitcode": -15}, {"rank": 1, "exitcode": -11}])
    assert [e.rank for e in first_failures(exits)] == [1]
    assert describe_exit(exits[1]) == "died of SIGSEGV (exit code -11)"
    found = exit_finding_text(exits)
    assert found is not None and "native code" in found[1]
    # every worker got SIGTERM: the job itself was stopped (a scheduler), nobody is blamed over the others
    stopped = worker_exits([{"rank": 0, "exitcode": -15}, {"rank": 1, "exitcode": -15}])
    assert first_failures(stopped) == stopped
    found = exit_finding_text(stopped)
    assert found is not None and found[0] == "crash: rank 0..1 died of SIGTERM (exit code -15)"
    assert "scheduler" in found[1]
    assert describe_exit(worker_exits([{"rank": 0, "exitcode": -64}])[0]) == "died of signal 64 (exit code -64)"
    # two first failures of different kinds are each named as they ended, with their own meaning
    mixed = worker_exits([{"rank": 0, "exitcode": -15}, {"rank": 1, "exitcode": -11}, {"rank": 2, "exitcode": 1},
                          {"rank": 3, "exitcode": -11}])
    found = exit_finding_text(mixed)
    assert found is not None
    assert found[0] == "crash: rank 1, 3 died of SIGSEGV (exit code -11); rank 2 exited with code 1 first"
    assert "native code" in found[1] and "the program ended with an error" in found[1]
    assert found[1].endswith("Then rank(s) 0 were stopped by the agent (SIGTERM), as it stops every worker once one "
                             "fails.")


def late_events(run: Run) -> list[tuple[int, str]]:
    return sorted((e.attributes["rank"], e.attributes["phase"]) for e in events(run, "cross_rank", "straggler")
                  if e.attributes["kind"] == "late" and not e.attributes.get("ended"))


def test_a_clean_pipeline_of_send_recv_names_no_late_rank(tmp_path: Path) -> None:
    # each stage waits for the stages before it in forward and after it in backward: whoever waits least was not
    # holding up a job that never synchronises as a whole
    result = launch(tmp_path, 4, STEPS=80, COMM=1, TOPO="pipeline", TELEMETRAIN_CROSS_RANK=0, CROSS_TIMEOUT=60,
                    CROSS_EVERY=10)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tmp_path)
    windows = reports(run, 3)
    assert windows and all(w["avg_comm_wait_time_sec"] > 0 and w["avg_comm_world_wait_time_sec"] == 0
                           for w in windows)
    # no late rank, live or offline. (A live relative flag is one window's: 4 ranks on a 2-CPU machine have given one,
    # once, for a phase of 0.7 ms against 0.3 ms; the findings weigh such events over the run and name none.)
    assert [e.attributes for e in events(run, "cross_rank", "straggler") if e.attributes.get("kind") == "late"] == []
    assert not [t for t in build_model(run).findings if t.title.startswith("straggler")]


def test_a_rank_held_up_in_its_pair_is_not_named_with_the_rank_that_held_it_up(tmp_path: Path) -> None:
    # DDP within pairs, a global barrier per step: rank 2 is slow, rank 3 waits for it in their pair's all-reduce,
    # so both reach the barrier last; only rank 2 made anyone wait
    result = launch(tmp_path, 4, STEPS=80, COMM=1, PAIRS=1, SLOW_RANK=2, SLOW_PHASE="forward", SLOW_S=0.04,
                    TELEMETRAIN_CROSS_RANK=0, CROSS_TIMEOUT=60, CROSS_EVERY=10, MIN_SHARE=0.2)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tmp_path)
    assert late_events(run) == [(2, "forward")]
    assert all(w["avg_comm_world_wait_time_sec"] > 0.02 for w in reports(run, 0)[1:])


def test_show_names_a_relative_straggler_event_as_live() -> None:
    """A relative straggler event comes from one window: `show` says so and where, and leaves the verdict to the
    findings (a busy machine's descheduled rank raises such an event that the offline rule rightly discounts)."""
    from types import SimpleNamespace

    from telemetrain.distributed.summary import diagnosis_lines

    event = SimpleNamespace(kind="event", group="cross_rank", name="straggler", identity=SimpleNamespace(rank=0),
                            attributes={"kind": "relative", "rank": 1, "host": "h1", "phase": "forward",
                                        "score": 2.914, "step": 639})
    assert diagnosis_lines([event]) == [
        "straggler   rank 1 (h1) slow in forward, relative x2.91 at step 639 (live event; see findings)"]


def test_the_findings_name_the_rank_late_at_the_jobs_barrier_not_its_pair_partner(tmp_path: Path) -> None:
    # DDP within pairs, a barrier over every rank per step: rank 2 computes 20 ms more in backward (the phase holding
    # its pair's all-reduce), rank 3 waits for it there, ranks 0 and 1 at the barrier. Rank 3's backward is as long
    # as rank 2's (it is often the slowest there, by a hair); only the waits at the barrier say who held the job up
    result = launch(tmp_path, 4, STEPS=80, COMM=1, PAIRS=1, SLOW_RANK=2, SLOW_PHASE="backward", SLOW_S=0.02)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tmp_path)
    assert [f.title for f in build_model(run).findings if f.kind == "straggler"] == ["straggler: rank 2 (backward)"]
