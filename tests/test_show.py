"""``telemetrain show``: every figure says which rank it comes from (or that it spans the ranks), no literal None,
MFU as a percentage; ``show --list`` gives each run's status, duration and a key figure (issue 15, item 6)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from telemetrain import Telemetry, identity_from_env, show_list
from telemetrain.cli import main
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

BASE_MS = 1_700_000_000_000.0


def rank_run(root: Path, run_id: str, rank: int, *, ms: float, last_value: float | None = None, iterations: int = 8,
             save: bool = True, start_ms: float = 0.0) -> Path:
    """One rank of a two-rank run on an explicit timeline: ``ms`` per iteration; a metric whose last value is
    ``last_value`` (written now, not on the timeline); a checkpoint save at iteration 4 unless ``save`` is False."""
    identity = identity_from_env({}, run_id=run_id, session_tag=run_id, perf_tag="gpt-tiny", rank=rank,
                                 local_rank=rank, world_size=2)
    t = Telemetry(identity, store=root)
    config = TrainingTelemetryConfig(global_batch_size_or_fn=64, flops_per_sample_or_fn=6e9, peak_tflops_per_gpu=10.0,
                                     log_every_n_train_iterations=4)
    r = TrainingRecorder(config, telemetry=t)
    now = BASE_MS + start_ms
    r.on_app_start(now)
    r.on_train_start(0, start_time_msec=now)
    for i in range(iterations):
        r.on_training_single_iteration_start(now)
        now += ms
        r.on_training_single_iteration_end(now)
        if i == 3 and save:
            r.on_save_checkpoint_start(i + 1, now)
            r.on_save_checkpoint_success(i + 1, now + 1)
            r.on_save_checkpoint_end(now + 1)
            now += 1  # (the next iteration starts after the save: a 1 ms pause the rates leave out)
    if last_value is not None:
        t.metric("loss", last_value, "train")
    r.on_train_end(now)
    r.on_app_end(now + 1)
    assert t.close()
    return root / run_id / run_id


def show(*argv: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["show", *argv]) == 0
    return capsys.readouterr().out


def test_show_names_the_rank_of_each_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rank_run(tmp_path, "job", 0, ms=100.0, last_value=1.5)
    run_dir = rank_run(tmp_path, "job", 1, ms=125.0, last_value=2.5, start_ms=50.0)  # slower, and later in time
    out = show(str(run_dir), capsys=capsys)
    assert "None" not in out
    # the metric's last value is rank 0's, named, with the spread of the ranks' last values
    assert re.search(r"\n  train +loss += 1\.5 +\(rank 0; last on 2 ranks: 1\.5\.\.2\.5, 2 points\)", out)
    assert re.search(r"training +8 iterations this run \(global step 7\) on rank 0, 4 metrics updates from 2 ranks",
                     out)
    assert re.search(r"iteration time \(rank 0, last window\) +p50 100\.00 ms", out)
    # 64 samples per 100 ms; 6e9 FLOPs a sample over 2 GPUs: 1.92 TFLOP/s per GPU of a 10 TFLOP/s peak
    assert re.search(r"throughput \(rank 0, last window\) +640 samples/s +1\.92 TFLOP/s per GPU +MFU 19\.2%", out)
    assert re.search(r"across 2 ranks \(last window\) +mean iteration time min 100\.00 ms \(rank 0\) +max 125\.00 ms "
                     r"\(rank 1\)", out)
    assert re.search(r"samples/s min 512 +max 640", out)
    assert re.search(r"checkpoints / validations \(rank 0\) +1 saved", out)
    assert "on rank 0's timeline" in out  # goodput


def test_show_spells_out_a_run_without_checkpoint_or_iterations(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = rank_run(tmp_path, "nock", 0, ms=10.0, save=False)
    out = show(str(run_dir), capsys=capsys)
    assert "None" not in out
    assert re.search(r"run nock +finished +iterations 0\.\.7, no checkpoint", out)


def test_show_prints_group_and_name_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = Telemetry(identity_from_env({}, run_id="fs", session_tag="fs"), store=tmp_path)
    t.metric("system.filesystem.limit", 1e9, "system.filesystem./", unit="By")
    t.event("saved", group="ckpt/io")
    assert t.close()
    out = show(str(t.run_dir), capsys=capsys)
    assert "//" not in out
    assert re.search(r"\n  system\.filesystem\./ +system\.filesystem\.limit += 1e\+09 ", out)
    assert re.search(r"\n  ckpt/io +saved +1\n", out)


def test_show_list_gives_status_duration_and_a_key_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    done = rank_run(tmp_path, "a-done", 0, ms=100.0)
    killed = rank_run(tmp_path, "b-killed", 0, ms=100.0)
    for f in killed.glob("rank-*.jsonl"):  # as after a SIGKILL: the loop and the application never ended
        f.write_text("".join(line for line in f.read_text().splitlines(keepends=True) if '"span_end"' not in line
                             or '"name":"training_single_iteration"' in line))
        # written by this (live) process: without its start in the header, the silence rule decides (an older run's;
        # test_liveness checks a writer's own life)
        f.write_text(re.sub(r',"process_start":\{[^}]*\}', "", f.read_text(), count=1))
    t = Telemetry(identity_from_env({}, run_id="c-plain", session_tag="c-plain"), store=tmp_path)
    t.metric("x", 1)
    assert t.close()
    lines = show("--list", str(tmp_path), capsys=capsys).splitlines()
    assert re.fullmatch(r"created +status +duration +last report \(lowest rank\) +run", lines[0])
    rows = {line.split()[-1]: line for line in lines[1:]}
    assert re.search(r"Z +finished +0\.80\d s +8 iterations, 640 samples/s +", rows[str(done)])
    # a loop that never ended, in a run written within the last minute: still running
    assert re.search(r"Z +running \(no news for \d+ s\) +\S+ s +8 iterations, 640 samples/s +", rows[str(killed)])
    assert re.search(r"Z +no training +\S+ s +1 records +", rows[str(tmp_path / "c-plain" / "c-plain")])
    monkeypatch.setattr(show_list, "RUNNING_WITHIN_S", 0.0)  # as if read later: it was killed
    lines = show("--list", str(tmp_path), capsys=capsys).splitlines()
    assert re.search(r"Z +killed \(no news for \d+ s\) +\S+ s +8 iterations",
                     {line.split()[-1]: line for line in lines}[str(killed)])


KILLED_IN_ITS_LOOP = """
import os, signal, sys
from telemetrain import Telemetry
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

t = Telemetry(store=sys.argv[1])
rec = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=2), telemetry=t)
rec.on_app_start()
rec.on_train_start(train_iterations_start=0)
for _ in range(4):
    rec.on_training_single_iteration_start()
    rec.on_training_single_iteration_end()
assert t.flush()
os.kill(os.getpid(), signal.SIGKILL)  # an OOM kill: the loop never ends
"""


def test_show_list_says_killed_right_after_a_sigkill(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A loop that never ended, written within the last minute, was listed as "running" though its process was gone:
    the processes of a run on this host are now looked up."""
    proc = subprocess.run([sys.executable, "-c", KILLED_IN_ITS_LOOP, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    [row] = show("--list", str(tmp_path), capsys=capsys).splitlines()[1:]
    assert re.search(r"Z +killed +\S+ s +4 iterations", row), row


def test_show_of_many_ranks_lists_the_first_and_the_outliers_and_all_with_all(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """40 ranks on 20 hosts: show keeps 8 rows of each kind plus the outliers (the rank that wrote the most records,
    the process with the largest resident set, the busiest host) and says what it left out; --all lists each."""
    for rank in range(40):
        identity = identity_from_env({}, run_id="wide", session_tag="wide", rank=rank, world_size=40,
                                     host=f"node{rank // 2:02d}")
        t = Telemetry(identity, store=tmp_path)
        for step in range(30 if rank == 23 else 10):  # rank 23 writes the most
            t.metric("loss", 1.0 / (step + 1), "train", step=step)
        t.metric("process.memory.usage", 5e8 if rank == 31 else 1e8 + rank, "system", unit="By")
        if rank % 2 == 0:  # one sampler per host: node17 the busiest
            t.metric("system.cpu.utilization", 0.95 if rank == 34 else 0.2, "system", unit="1")
        assert t.close()
    run_dir = next(p for p in (tmp_path / "wide").iterdir() if p.is_dir())
    assert main(["show", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "ranks       40 (0..39), 40 process(es) on 20 host(s)" in out
    process_rows = re.findall(r"^  rank (\d+) +pid \d+ +host", out, re.M)
    assert process_rows == [str(r) for r in range(8)] + ["23"]  # the first 8 and the one that wrote the most
    assert re.search(r"  \.\.\. and 31 more process\(es\); records per process min 11 \(rank 1\), median 12, "
                     r"max 31 \(rank 23\); `telemetrain show --all` lists every one", out)
    sampled = re.findall(r"^  (host node\d+|rank \d+ pid \d+) ", out, re.M)
    assert [w for w in sampled if w.startswith("host")] == [f"host node{n:02d}" for n in range(8)] + ["host node17"]
    assert [w.split(" pid")[0] for w in sampled if w.startswith("rank")] == [f"rank {r}" for r in (*range(8), 31)]
    assert "  ... and 11 host(s) and 31 process(es) more, sampled alike" in out
    assert main(["show", "--all", str(run_dir)]) == 0
    every = capsys.readouterr().out
    assert len(re.findall(r"^  rank \d+ +pid \d+ +host", every, re.M)) == 40 and "more process(es)" not in every
    assert len({w for w in re.findall(r"^  (host node\d+|rank \d+ pid \d+) ", every, re.M)}) == 60
