"""Multi-rank jobs: ``telemetrain launch`` (a real elastic agent and gloo ranks on CPU), cross-rank aggregation,
straggler detection, restarts and dead ranks; plus the detector's rules on controlled numbers."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import telemetrain
import telemetrain.distributed
from conftest import ListSink, run_dir_of
from telemetrain import cli
from telemetrain.distributed.stragglers import StragglerDetector, phases_of
from telemetrain.report.model import build_model
from telemetrain.sinks.console import ConsoleSink
from telemetrain.span_lifecycle import end_status
from telemetrain.store.reader import Run, find_runs, open_run
from telemetrain.training.goodput import goodput

WORKER = str(Path(__file__).with_name("_dist_worker.py"))
LAUNCH_TIMEOUT_S = 240  # a hang fails the test instead of the suite


def launch_command(tmp_path: Path, nproc: int, *extra: str, **env: Any) -> tuple[list[str], dict[str, str]]:
    """``telemetrain launch`` of the test worker on ``nproc`` ranks, and its environment (``env`` added)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_"))}
    full_env.update({"TELEMETRAIN_DIR": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1"})
    full_env.update({k: str(v) for k, v in env.items()})
    return [sys.executable, "-m", "telemetrain.cli", "launch", "--nproc-per-node", str(nproc), "--monitor-interval",
            "0.1", *extra, WORKER], full_env


def launch(tmp_path: Path, nproc: int, *extra: str, **env: Any) -> subprocess.CompletedProcess[str]:
    cmd, full_env = launch_command(tmp_path, nproc, *extra, **env)
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, check=False)


def runs_of(tmp_path: Path) -> list[Run]:
    return [open_run(p) for p in find_runs(tmp_path / "runs")]


def events(run: Run, group: str, name: str | None = None, agents: bool = True) -> list[Any]:
    return [r for r in run.records("event", agents=agents) if r.group == group and (name is None or r.name == name)]


# -- the launcher: one run folder with the agent's and the workers' telemetry ------------------------------------------


def test_two_ranks_one_run_folder_with_agent_and_worker_telemetry(tmp_path: Path) -> None:
    result = launch(tmp_path, 2, STEPS=120)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = runs_of(tmp_path)
    job = run.session_tag
    assert run.run_id == f"{job}.0" and job[:8].isdigit()  # the sortable job id the launcher chose
    assert sorted(p.rank for p in run.processes) == [0, 1]
    for p in run.processes:
        ident = p.identity
        assert (ident.world_size, ident.local_rank, ident.restart_count) == (2, p.rank, 0)
        # the perf tag: the training config's, over the launcher's default (the script's name)
        assert (ident.session_tag, ident.run_id, ident.perf_tag) == (job, f"{job}.0", "dist-test")
    assert run.perf_tag == "dist-test" and run.meta["perf_tag"] == "dist-test"
    (agent,) = run.agents
    assert agent.path.name.startswith("agent-0.") and agent.identity.role == "agent"
    assert run.meta["created_by"]["role"] != "agent"  # run.json (and its config) is the training's
    assert (agent.identity.session_tag, agent.identity.run_id) == (job, f"{job}.0")
    metric_names = {r.name for r in agent.records if r.kind == "metric" and r.group == "torchelastic"}
    assert {"SimpleElasticAgent._rendezvous.duration.ms", "workers.default.run_success_no_retries",
            "workers.default.flakiness", "workers.default.healthy",
            "workers.default.remaining_restarts"} <= metric_names
    statuses = events(run, "torchelastic")
    succeeded = [e for e in statuses if e.name == "torchelastic.worker.status.SUCCEEDED"]
    assert sorted(e.attributes["global_rank"] for e in succeeded if e.attributes["source"] == "WORKER") == [0, 1]
    assert any(e.attributes["source"] == "AGENT" for e in succeeded)
    assert all(e.attributes["worker.role_world_size"] == 2 for e in succeeded if e.attributes["source"] == "WORKER")
    assert events(run, "torchelastic.rendezvous")  # the rendezvous events, normally dropped by torch
    (end,) = events(run, "launcher", "launch_end")
    assert (end.attributes["outcome"], end.attributes["exitcode"], end.attributes["attempts"]) == ("succeeded", 0, 1)
    # the monitor loop's 10 Hz metrics are kept on change and heartbeat, not every 0.1 s
    healthy = [r for r in agent.records if r.kind == "metric" and r.name == "workers.default.healthy"]
    assert 1 <= len(healthy) <= 4
    # cross-rank aggregation ran (the launcher turns it on) and rank 0 recorded the spread; nobody was slow
    spread = [r for r in run.processes[0].records if r.kind == "metric" and r.group == "cross_rank"]
    assert {r.step for r in spread} == {49, 99}
    assert not [r for r in run.processes[1].records if r.kind == "metric" and r.group == "cross_rank"]
    assert not events(run, "cross_rank", "straggler")
    assert not events(run, "cross_rank", "cross_rank_stopped")


def test_four_ranks_a_planted_straggler_is_named_with_its_phase(tmp_path: Path) -> None:
    result = launch(tmp_path, 4, STEPS=150, SLOW_RANK=2, SLOW_PHASE="dataloader", SLOW_S=0.02,
                    TELEMETRAIN_CROSS_RANK=25)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = runs_of(tmp_path)
    assert sorted(p.rank for p in run.processes) == [0, 1, 2, 3]
    assert {p.identity.world_size for p in run.processes} == {4}
    found = events(run, "cross_rank", "straggler")
    assert found, "no straggler event"
    named = {(e.attributes["rank"], e.attributes["phase"]) for e in found}
    assert (2, "dataloader") in named
    assert {rank for rank, _ in named} == {2}  # the waiting ranks' slow all-reduce is not blamed on them
    first = next(e for e in found if e.attributes["phase"] == "dataloader")
    assert first.attributes["kind"] == "relative" and first.attributes["score"] >= 1.3
    assert first.attributes["host"] == run.processes[2].identity.host and first.severity == "warning"
    # the spread names the slow rank as the max of the phase
    max_rank = [r.value for r in run.processes[0].records if r.kind == "metric"
                and r.name == "cross_rank.dataloader.max_rank"]
    assert max_rank and set(max_rank) == {2}
    units = {r.name: r.unit for r in run.processes[0].records if r.kind == "metric" and r.group == "cross_rank"}
    # in the units of the figures they spread (train.samples_per_second is {sample}/s, not 1/s)
    assert units["cross_rank.samples_per_second.max"] == "{sample}/s"
    assert units["cross_rank.dataloader.max"] == "s"


def test_a_killed_worker_is_restarted_and_the_session_goodput_counts_the_lost_iterations(tmp_path: Path) -> None:
    result = launch(tmp_path, 2, "--max-restarts", "1", STEPS=100, KILL_RANK=1, KILL_AT=65, KILL_ATTEMPT=0,
                    CKPT_DIR=str(tmp_path), CKPT_EVERY=25, LOG_EVERY=5)
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = runs_of(tmp_path)
    job = first.session_tag
    assert (first.run_id, second.run_id) == (f"{job}.0", f"{job}.1")
    assert {p.identity.restart_count for p in second.processes} == {1}
    # the agent followed the restart: its records after it are in the second attempt's folder
    assert first.agents and second.agents
    (restart,) = events(second, "launcher", "attempt_start")
    assert restart.attributes["attempt"] == 1 and restart.identity.restart_count == 1
    failed = [r for r in first.agents[0].records if r.kind == "metric" and r.name == "workers.default.failed"]
    assert failed and failed[0].identity.run_id == f"{job}.0"
    # why the first attempt ended, in its own folder: rank 1's SIGKILL first, the cause its report names first
    exits = {e.attributes["rank"]: e.attributes for e in events(first, "launcher", "worker_failed")}
    assert exits[1]["exitcode"] == -9 and exits[1]["first_failure"] is True
    assert not any(a["first_failure"] for rank, a in exits.items() if rank != 1)
    assert build_model(first).findings[0].title.startswith("crash: rank 1 died of SIGKILL (exit code -9)")
    assert not events(second, "launcher", "worker_failed")  # the second attempt succeeded
    (end,) = events(second, "launcher", "launch_end")
    assert (end.attributes["outcome"], end.attributes["attempts"]) == ("succeeded", 2)
    # goodput over the session: the second attempt resumed at the checkpoint of step 50, so 50..64 were lost
    report = goodput(first.path.parent, rank=0)
    assert [r.run_id for r in report.runs] == [f"{job}.0", f"{job}.1"]
    assert report.runs[0].checkpointed_iterations == 50
    assert 10 <= report.lost_iterations <= 16 and report.runs[0].lost_iterations == report.lost_iterations
    assert report.runs[1].finished and report.productive_iterations == 100
    assert report.badput.lost_progress > 0
    # the Perfetto trace of the session shows each attempt's ranks and its agent
    from telemetrain.trace import build_trace

    names = [e["args"]["name"] for e in build_trace([first, second])["traceEvents"] if e["name"] == "process_name"]
    assert [n.split(" @ ")[0] for n in names] == ["rank 0", "rank 1", "agent of node 0"] * 2


def test_a_rank_that_dies_without_restarts_ends_the_job_without_a_hang(tmp_path: Path) -> None:
    result = launch(tmp_path, 2, STEPS=400, KILL_RANK=1, KILL_AT=40, KILL_ATTEMPT=-1)
    assert result.returncode == 1
    assert "FAILED" in result.stderr
    (run,) = runs_of(tmp_path)
    failures = {e.attributes["rank"]: e for e in events(run, "launcher", "worker_failed")}
    assert failures[1].attributes["exitcode"] == -9 and failures[1].severity == "error"  # the root cause is named
    (end,) = events(run, "launcher", "launch_end")
    assert (end.attributes["outcome"], end.attributes["exitcode"]) == ("failed", 1)
    assert any(e.name == "torchelastic.worker.status.FAILED" for e in events(run, "torchelastic"))


def test_the_exchange_times_out_when_a_rank_is_gone_and_training_goes_on(tmp_path: Path) -> None:
    # no collectives in the training: rank 0 trains on after rank 1 left, and its exchange must give up, not hang
    result = launch(tmp_path, 2, STEPS=160, NO_DDP=1, EXIT_RANK=1, EXIT_AT=30, TELEMETRAIN_CROSS_RANK=0,
                    CROSS_TIMEOUT=2, CROSS_EVERY=20, LOG_EVERY=20)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = runs_of(tmp_path)
    (stopped,) = events(run, "cross_rank", "cross_rank_stopped")
    assert stopped.identity.rank == 0 and stopped.attributes["step"] == 39 and stopped.severity == "warning"
    rank0 = run.processes[0]
    updates = [r for r in rank0.records if r.kind == "event" and r.name == "training_metrics_update"]
    assert updates[-1].attributes["current_iteration"] == 159  # rank 0 trained to the end


def test_aggregation_enabled_in_code_under_launch_replaces_the_environments(tmp_path: Path) -> None:
    """`telemetrain launch` sets TELEMETRAIN_CROSS_RANK, so a worker that also enables aggregation in code (as
    docs/distributed.md shows) had two aggregators building one exchange group on the same keys: one hung, was
    abandoned at close, and a rank aborted at exit (the job failed). The explicit one takes the environment's place."""
    result = launch(tmp_path, 2, STEPS=80, LOG_EVERY=10, TELEMETRAIN_CROSS_RANK=25, CROSS_TIMEOUT=20, CROSS_EVERY=20)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = runs_of(tmp_path)
    steps = {r.step for r in run.processes[0].records if r.kind == "metric" and r.name == "cross_rank.iteration.max"}
    assert steps == {19, 39, 59, 79}  # every 20 (the code's), not 25 (the environment's), and once each
    problems = [r for p in run.processes for r in p.records if r.kind == "diagnostic"]
    assert not problems and not events(run, "cross_rank", "cross_rank_stopped"), problems


def test_one_cross_rank_aggregator_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment's aggregator gives way to one enabled in code before its first exchange, and never adds a
    second; a second one in code, or after the environment's began exchanging, is a ValueError at once."""
    pytest.importorskip("torch")
    from telemetrain.containment import TelemetryWarning
    from telemetrain.distributed import cross_rank

    monkeypatch.setenv(cross_rank.ENV, "25")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    a, b = (telemetrain.Telemetry(store=False, default=False) for _ in range(2))
    try:
        from_env = cross_rank.enable_from_env(a)
        assert from_env is not None and from_env.from_env and cross_rank.enable_from_env(b) is None
        mine = telemetrain.distributed.enable_cross_rank(b, every=20)
        assert from_env.closed and from_env not in a.sinks and mine in b.sinks
        assert cross_rank.enable_from_env(a) is None
        with pytest.raises(ValueError, match=r"already runs in this process \(every=20, enabled in code"):
            telemetrain.distributed.enable_cross_rank(a, every=20)
    finally:
        a.close()
        b.close()
    # one the environment enabled that began exchanging (here: no rendezvous store, so it stopped) stays
    identity = telemetrain.identity_from_env({}, run_id="r", session_tag="s", rank=0, world_size=2)
    c = telemetrain.Telemetry(identity, store=False, default=False)
    d = telemetrain.Telemetry(store=False, default=False)
    try:
        started = cross_rank.enable_from_env(c)
        assert started is not None
        with pytest.warns(TelemetryWarning, match="cross-rank aggregation stopped at step 9: no rendezvous store"):
            c.event("training_metrics_update", {"current_iteration": 9, "window_iterations": 10}, group="training")
            assert c.flush()
        with pytest.raises(ValueError, match=r"from \$TELEMETRAIN_CROSS_RANK, exchanging already"):
            telemetrain.distributed.enable_cross_rank(d)
        assert started in c.sinks
    finally:
        c.close()
        d.close()


def test_a_sigterm_to_the_launcher_is_a_kill_by_sigterm_in_its_records(tmp_path: Path) -> None:
    """A scheduler's SIGTERM to the agent: torchelastic raises its SignalException and stops the ranks. The launcher's
    launch_end says the signal as a worker's spans do ("...; the process was stopped by SIGTERM", killed), with the
    exit status the launcher returns; show says it; it said only 'SignalException', exit code 1."""
    cmd, env = launch_command(tmp_path, 2, STEPS=10**6, LOG_EVERY=10)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S / 2
        while not any('"name":"training_metrics_update"' in f.read_text(errors="replace")
                      for f in (tmp_path / "runs").glob("*/*/rank-*.jsonl")):  # both ranks train (DDP)
            assert proc.poll() is None and time.monotonic() < deadline, "the job did not start training"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S / 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "telemetrain launch: stopped by SIGTERM" in err and "Traceback" not in err, err[-3000:]
    (run,) = runs_of(tmp_path)
    (end,) = events(run, "launcher", "launch_end")
    a = end.attributes
    assert (a["outcome"], a["signal"], a["exitcode"]) == ("killed", "SIGTERM", 128 + signal.SIGTERM), a
    assert a["error"].startswith("SignalException: ") and end_status("error", a["error"]) == "killed", a
    loops = [r for p in run.processes for r in p.records if r.kind == "span_end" and r.name == "training_loop"]
    assert len(loops) == 2 and {end_status(r.status, r.error) for r in loops} == {"killed"}, loops
    shown = subprocess.run([sys.executable, "-m", "telemetrain.cli", "show", str(run.path)], capture_output=True,
                           text=True, timeout=120, check=False)
    assert "job killed by SIGTERM" in shown.stdout, shown.stdout + shown.stderr


def test_launch_help_is_torchruns_and_bad_flags_are_torchruns_errors(capsys: pytest.CaptureFixture[str]) -> None:
    # in this process: the parsing is all that runs (the other tests launch ``python -m telemetrain.cli launch``)
    assert cli.main(["launch", "--help"]) == 0
    out = capsys.readouterr().out
    assert "telemetrain launch" in out and "--nproc-per-node" in out
    help_text = " ".join(out.split())  # (argparse wraps it)
    # torchrun's help alone did not say what the launcher adds, nor what it sets for the workers
    assert "agent's metrics and events written into the job's run store" in help_text
    for variable in ("TELEMETRAIN_PERF_TAG", "TELEMETRAIN_CROSS_RANK=1", "TELEMETRAIN_WATCHDOG=1",
                     "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        assert variable in help_text, variable
    assert cli.main(["launch", "--no-such-flag", WORKER]) == 2
    assert "--no-such-flag" in capsys.readouterr().err


# -- the straggler detector on controlled numbers --------------------------------------------------------------------


def window(iteration: float, **phases: float) -> dict[str, float]:
    out = {p: math.nan for p in ("dataloader", "forward", "backward", "optimizer")}
    out.update(phases)
    out["iteration"] = iteration
    out["samples_per_second"] = 16 / iteration
    return out


def test_a_slow_phase_is_found_after_patience_and_reported_once_then_its_end() -> None:
    d = StragglerDetector(patience=2)
    even = {r: window(0.010, dataloader=0.001, forward=0.003, backward=0.004) for r in range(4)}
    slow = dict(even)
    slow[3] = window(0.010, dataloader=0.006, forward=0.003, backward=0.001)  # the others wait in backward
    for r in range(3):
        slow[r] = window(0.010, dataloader=0.001, forward=0.003, backward=0.006)
    assert d.update(9, even) == []
    assert d.update(19, slow) == []  # one window is a hiccup
    (found,) = d.update(29, slow)
    assert (found.rank, found.phase, found.kind, found.ended) == (3, "dataloader", "relative", False)
    assert found.score == pytest.approx(0.006 / 0.001) and found.step == 29
    assert d.update(39, slow) == []  # reported once
    (ended,) = d.update(49, even)
    assert (ended.rank, ended.phase, ended.ended) == (3, "dataloader", True)
    assert d.active == []


def test_noise_and_tiny_phases_raise_nothing() -> None:
    import random

    rng = random.Random(7)
    d = StragglerDetector()
    for step in range(40):
        values = {r: window(0.010 * rng.uniform(0.9, 1.1), dataloader=0.00002 * rng.uniform(0.2, 5.0),
                            forward=0.003 * rng.uniform(0.9, 1.1), backward=0.004 * rng.uniform(0.9, 1.1))
                  for r in range(8)}
        assert d.update(step, values) == [], step


def test_a_slow_sync_phase_alone_is_reported() -> None:
    d = StragglerDetector(patience=1)
    values = {r: window(0.010, forward=0.003, backward=0.004) for r in range(3)}
    values[1] = window(0.014, forward=0.003, backward=0.008)
    found = d.update(0, values)
    assert {(f.rank, f.phase) for f in found} == {(1, "backward"), (1, "iteration"), (1, "samples_per_second")}


def test_individual_degradation_against_the_ranks_own_best() -> None:
    d = StragglerDetector(patience=2)
    even = {r: window(0.010, forward=0.005) for r in range(4)}
    for step in range(3):  # warm-up window, then the best
        assert d.update(step, even) == []
    # rank 0 degrades in forward; its iteration, like everyone's (they wait for it), is not over the threshold
    slower = {**even, 0: window(0.011, forward=0.009)}
    assert d.update(3, slower) == []
    found = d.update(4, slower)
    assert {(f.rank, f.phase, f.kind) for f in found if f.kind == "individual"} == {(0, "forward", "individual")}


def test_a_job_wide_slowdown_is_no_rank_s_straggler() -> None:
    """Every rank slower at the same step: the job got slower (the report's change-point rule names it once); no
    rank is reported, individually or relatively."""
    d = StragglerDetector(patience=2)
    for step in range(3):
        assert d.update(step, {r: window(0.010, forward=0.005) for r in range(4)}) == []
    slower = {r: window(0.020, forward=0.015) for r in range(4)}
    assert d.update(3, slower) == [] and d.update(4, slower) == [] and d.update(5, slower) == []


def test_detector_arguments_are_checked() -> None:
    for kwargs in ({"relative_threshold": 1.0}, {"individual_threshold": "2"}, {"min_share": -1}, {"patience": 0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            StragglerDetector(**kwargs)
    with pytest.raises(ValueError, match="every"):
        telemetrain.distributed.CrossRankAggregator(telemetrain.Telemetry(store=False), every=0)
    with pytest.raises(ValueError, match="record_on"):
        telemetrain.distributed.CrossRankAggregator(telemetrain.Telemetry(store=False), record_on="one")


def test_phases_of_a_report_takes_numbers_and_leaves_the_rest_nan() -> None:
    phases = phases_of({"avg_iteration_time_sec": 0.5, "avg_forward_time_sec": True, "samples_per_second": 3})
    assert phases["iteration"] == 0.5 and phases["samples_per_second"] == 3.0
    assert math.isnan(phases["forward"]) and math.isnan(phases["dataloader"])


# -- rank-0-only export for chatty sinks -----------------------------------------------------------------------------


def test_chatty_sinks_attach_on_rank_zero_only_unless_asked(tmp_path: Path) -> None:
    ident = telemetrain.identity_from_env({}, rank=1, world_size=2)
    t = telemetrain.Telemetry(ident, store=tmp_path)
    console = ConsoleSink()
    t.add_sink(console)
    assert console not in t.sinks and t.skipped_sinks == [console]
    every_rank = ConsoleSink()
    t.add_sink(every_rank, ranks="all")
    assert every_rank in t.sinks
    with pytest.raises(ValueError, match="ranks"):
        t.add_sink(ConsoleSink(), ranks="first")
    t.metric("x", 1.0)
    t.close()
    assert [r.value for r in open_run(run_dir_of(t)).records("metric")] == [1.0]  # the run store is on every rank
    zero = telemetrain.Telemetry(telemetrain.identity_from_env({}, rank=0, world_size=2), store=False)
    sink = ConsoleSink()
    zero.add_sink(sink)
    assert sink in zero.sinks
    zero.close()


def test_a_rank_set_after_the_chatty_sinks_attached_detaches_them(tmp_path: Path) -> None:
    """``mp.spawn``: the Telemetry is made before the process knows its rank (rank 0 by default), then told it. The
    ``ranks="zero"`` sinks were attached on every rank, so every rank wrote TensorBoard, MLflow and the console."""
    t = telemetrain.Telemetry(telemetrain.identity_from_env({}), store=tmp_path)
    chatty, everywhere = ListSink("chatty"), ListSink("everywhere")
    t.add_sink(chatty, ranks="zero")
    t.add_sink(everywhere)
    t.metric("before", 1.0)
    t.set_identity(world_size=2)  # still rank 0: nothing changes
    assert chatty in t.sinks and t.skipped_sinks == []
    t.set_identity(rank=1)
    assert chatty not in t.sinks and t.skipped_sinks == [chatty]
    t.metric("after", 2.0)
    t.close()
    assert [r.name for r in chatty.records if r.kind == "metric"] == ["before"]  # what it had is delivered
    assert [r.name for r in everywhere.records if r.kind == "metric"] == ["before", "after"]
    assert [r.name for r in open_run(run_dir_of(t)).records("metric")] == ["before", "after"]


def test_the_launch_example_writes_one_run_folder_and_names_its_slow_rank(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "launch_ddp.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_"))}
    env.update({"TELEMETRAIN_DIR": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1"})
    cmd = [sys.executable, "-m", "telemetrain.cli", "launch", "--nproc-per-node", "2", str(example), "--steps",
           "150", "--slow-rank", "1"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0: final loss" in result.stdout
    (run,) = runs_of(tmp_path)
    assert sorted(p.rank for p in run.processes) == [0, 1] and len(run.agents) == 1
    assert {p.identity.perf_tag for p in run.processes} == {"launch_ddp"}
    stragglers = events(run, "cross_rank", "straggler")
    assert {(e.attributes["rank"], e.attributes["phase"]) for e in stragglers} == {(1, "dataloader")}
    for p in run.processes:  # every rank's loss at every step, for the report's loss chart
        losses = [r for r in p.records if r.kind == "metric" and (r.group, r.name) == ("train", "train.loss")]
        assert [r.step for r in losses] == list(range(150)) and all(math.isfinite(r.value) for r in losses)


def test_the_launchers_environment_is_restored_for_an_in_process_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    from telemetrain.distributed.launch import environment

    monkeypatch.setenv("TELEMETRAIN_PERF_TAG", "mine")
    monkeypatch.delenv("TELEMETRAIN_CROSS_RANK", raising=False)
    monkeypatch.delenv("TELEMETRAIN_DIR", raising=False)
    with environment({"TELEMETRAIN_DIR": "/x"}, defaults={"TELEMETRAIN_PERF_TAG": "theirs",
                                                          "TELEMETRAIN_CROSS_RANK": "1"}):
        assert os.environ["TELEMETRAIN_PERF_TAG"] == "mine"  # a default never overrides what the user set
        assert os.environ["TELEMETRAIN_CROSS_RANK"] == "1" and os.environ["TELEMETRAIN_DIR"] == "/x"
    assert os.environ["TELEMETRAIN_PERF_TAG"] == "mine"
    assert "TELEMETRAIN_CROSS_RANK" not in os.environ and "TELEMETRAIN_DIR" not in os.environ
