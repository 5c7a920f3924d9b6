"""Goodput across restarts (``telemetrain.training.goodput``), on real run stores.

Each simulated run is a real ``Telemetry`` writing the store and a real ``TrainingRecorder`` driven with explicit
``start_time_msec``/``finish_time_msec`` (a fixed timeline in whole milliseconds), so every expected number below is
exact (up to the ~256 ns a float millisecond timestamp rounds to). A process "dies" by closing its Telemetry at a
given moment (what exit or SIGTERM does: open spans end as ``terminated``, the last iterations are reported); the
SIGKILL case is a real subprocess killed with SIGKILL.
"""

from __future__ import annotations

import dataclasses
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from conftest import helper_env
from telemetrain import Telemetry, TelemetryWarning, identity_from_env, span_lifecycle
from telemetrain.training import SpanName, TrainingContexts, TrainingRecorder, TrainingTelemetryConfig
from telemetrain.training.goodput import BADPUT_CATEGORIES, GoodputReport, goodput, goodput_by_rank

SESSION = "gp"
BASE_MS = 1_700_000_000_000  # the simulated timeline: milliseconds since the epoch (2023-11-14)
TOL = 1e-6  # seconds: a float millisecond timestamp is exact to 256 ns
TESTS = Path(__file__).parent


class Sim:
    """One process of one run, driven at explicit times: ``now`` is the simulated clock (ms after BASE_MS) and
    ``step`` the global iterations completed."""

    def __init__(self, root: Path, run_id: str, *, rank: int = 0, world_size: int = 1, log_every: int = 5,
                 warmup: int = 0, export_every: int | None = None, restart_count: int = 0, now: int = 0,
                 session: str = SESSION, telemetry: Telemetry | None = None) -> None:
        identity = identity_from_env({}, run_id=run_id, session_tag=session, perf_tag="goodput", rank=rank,
                                     local_rank=rank, world_size=world_size, restart_count=restart_count)
        self.t = telemetry if telemetry is not None else Telemetry(identity, store=root)
        config = TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=log_every,
                                         warmup_iterations=warmup, export_iteration_spans_every=export_every)
        self.r = TrainingRecorder(config, telemetry=self.t)
        self.now = now
        self.step = 0

    @staticmethod
    def ms(at: int) -> int:
        return BASE_MS + at

    def mono(self, at: int) -> int:
        """``at`` on the Telemetry's monotonic clock (as the recorder converts ``*_time_msec``)."""
        return round(self.ms(at) * 1e6) - self.t.wall_offset_ns

    def wait(self, ms: int) -> Sim:
        self.now += ms
        return self

    def app_start(self) -> Sim:
        self.r.on_app_start(self.ms(self.now))
        return self

    def phase(self, what: str, ms: int) -> Sim:
        """An initialisation phase (``distributed_init``, ``model_init``, ...) or ``load_checkpoint`` of ``ms``."""
        getattr(self.r, f"on_{what}_start")(self.ms(self.now))
        getattr(self.r, f"on_{what}_end")(self.ms(self.now + ms))
        self.now += ms
        return self

    def train_start(self, iteration: int = 0) -> Any:
        self.step = iteration
        return self.r.on_train_start(iteration, start_time_msec=self.ms(self.now))

    def iterations(self, n: int, ms: int, *, gap: int = 0, data: int = 0, data_outside: bool = False,
                   first: int | None = None) -> Sim:
        """``n`` iterations of ``ms`` each (the first one ``first`` ms if given), ``gap`` ms after each; ``data`` ms
        of data loading in each (timed inside the iteration, or just before it with ``data_outside``)."""
        for i in range(n):
            duration = first if i == 0 and first is not None else ms
            if data and data_outside:
                s = self.r.tracer.start(SpanName.DATA_LOADING.value, group="training", start_ns=self.mono(self.now))
                s.end(end_ns=self.mono(self.now + data))
                self.now += data
            self.r.on_training_single_iteration_start(self.ms(self.now))
            if data and not data_outside:
                s = self.r.tracer.start(SpanName.DATA_LOADING.value, group="training", start_ns=self.mono(self.now))
                s.end(end_ns=self.mono(self.now + data))
            self.r.on_training_single_iteration_end(self.ms(self.now + duration))
            self.now += duration + gap
            self.step += 1
        return self

    def save(self, ms: int, *, ok: bool = True) -> Sim:
        self.r.on_save_checkpoint_start(self.step, self.ms(self.now))
        if ok:
            self.r.on_save_checkpoint_success(self.step, self.ms(self.now + ms))
        self.r.on_save_checkpoint_end(self.ms(self.now + ms))
        self.now += ms
        return self

    def validation(self, ms: int) -> Sim:
        self.r.on_validation_start(self.ms(self.now))
        self.r.on_validation_end(self.ms(self.now + ms))
        self.now += ms
        return self

    def train_end(self) -> Sim:
        self.r.on_train_end(self.ms(self.now))
        return self

    def app_end(self) -> None:
        """End the application now and close (a clean exit)."""
        self.r.on_app_end(self.ms(self.now))
        assert self.t.close()

    def die(self) -> None:
        """Exit now without ending anything (an exception, SIGTERM): the Telemetry closes, the recorder reports the
        iterations since its last report, the open spans end as ``terminated`` -- at this simulated moment."""
        at = self.mono(self.now)
        with mock.patch.object(span_lifecycle, "_mono", lambda: at):
            assert self.t.close()


def check_identity(report: GoodputReport) -> None:
    """productive + every badput category == wall, and no category negative."""
    parts = [report.productive_seconds, *report.badput.as_dict().values()]
    assert all(p >= -1e-9 for p in parts), report.as_dict()
    assert sum(parts) == pytest.approx(report.wall_seconds, abs=1e-9)
    assert report.productive_seconds + report.badput_seconds == pytest.approx(report.wall_seconds, abs=1e-9)
    assert report.goodput == pytest.approx(report.productive_seconds / report.wall_seconds)


def badput(report: GoodputReport, **expected: float) -> None:
    """Each category as expected (those not named: 0)."""
    got = report.badput.as_dict()
    assert got == pytest.approx({name: expected.get(name, 0.0) for name in BADPUT_CATEGORIES}, abs=TOL)


# -- the scenarios -----------------------------------------------------------------------------------------------------


def test_the_last_checkpoint_is_the_later_of_two_saves_holding_the_same_work(tmp_path: Path) -> None:
    # a periodic save at step 10, then an end-of-epoch save of the same 10 iterations under the next step
    s = Sim(tmp_path, "r0").app_start()
    s.train_start(0)
    s.iterations(10, 1000).save(500)
    s.r.on_save_checkpoint_start(11, s.ms(s.now))
    s.r.on_save_checkpoint_success(11, s.ms(s.now + 500))
    s.r.on_save_checkpoint_end(s.ms(s.now + 500))
    s.now += 500
    s.train_end().app_end()
    [run] = goodput(tmp_path / SESSION).runs
    assert (run.last_checkpoint_step, run.checkpointed_iterations) == (11, 10)
    [by_rank] = goodput_by_rank(tmp_path / SESSION)[0].runs
    assert by_rank.last_checkpoint_step == 11


def test_clean_single_run(tmp_path: Path) -> None:
    """Init phases, iterations with data loading inside them and gaps between them, a validation, a checkpoint, more
    iterations, a clean end: every category exact, the run finished and all its iterations productive."""
    s = Sim(tmp_path, "r0").app_start()
    s.phase("distributed_init", 2000).wait(500).phase("model_init", 3000).phase("optimizer_init", 500)
    s.phase("dataloader_init", 1000)  # now 7000
    s.train_start(0)
    s.iterations(10, 1000, gap=100, data=200)  # 18000
    s.validation(1000).save(500)  # 19500: checkpoint of 10 iterations
    s.iterations(5, 1000, data=200)  # 24500: the last one is reported at iteration 15, so no final report
    s.train_end().wait(500).app_end()  # 25000

    report = goodput(tmp_path / SESSION)
    check_identity(report)
    assert report.wall_seconds == pytest.approx(25.0, abs=TOL)
    assert report.start_time_sec == pytest.approx(BASE_MS / 1e3, abs=TOL)
    # iterations: 15 x 1 s, of which 15 x 0.2 s data loading; 10 gaps of 0.1 s and 0.5 s of teardown are idle
    assert report.productive_seconds == pytest.approx(12.0, abs=TOL)
    badput(report, initialization=7.0, validation=1.0, checkpoint_save=0.5, data_wait=3.0, idle=1.5)
    assert report.goodput == pytest.approx(12.0 / 25.0)
    assert (report.productive_iterations, report.lost_iterations) == (15, 0)
    assert not report.approximate
    [run] = report.runs
    assert (run.run_id, run.restart_order, run.status, run.finished) == ("r0", 0, "finished", True)
    assert (run.first_iteration, run.last_iteration) == (0, 14)
    assert (run.last_checkpoint_step, run.checkpointed_iterations) == (10, 10)
    assert run.productive_seconds == pytest.approx(12.0, abs=TOL)
    assert run.data_wait_seconds == pytest.approx(3.0, abs=TOL)
    assert run.ranks == (0,)


def test_crash_after_checkpoint_then_resume(tmp_path: Path) -> None:
    """Run A saves at iteration 10, runs 7 more iterations and dies; run B loads the checkpoint, resumes at 10 and
    finishes: the 7 iterations after the checkpoint are lost progress, the gap between the runs idle."""
    a = Sim(tmp_path, "job.0", restart_count=0).app_start().phase("model_init", 1000)
    a.train_start(0)
    a.iterations(10, 1000).save(500)  # 11500: checkpoint of 10 iterations
    a.iterations(7, 1000)  # 18500: reported at 15, then 2 more
    a.die()
    b = Sim(tmp_path, "job.1", restart_count=1, now=20000).app_start().phase("model_init", 1000)
    b.phase("load_checkpoint", 1000)
    b.train_start(10)
    b.iterations(10, 1000).save(500)  # 32500
    b.train_end().wait(500).app_end()  # 33000

    report = goodput(tmp_path / SESSION)
    check_identity(report)
    assert report.wall_seconds == pytest.approx(33.0, abs=TOL)
    assert report.productive_seconds == pytest.approx(20.0, abs=TOL)
    badput(report, initialization=2.0, checkpoint_load=1.0, checkpoint_save=1.0, lost_progress=7.0, idle=2.0)
    assert (report.productive_iterations, report.lost_iterations) == (20, 7)
    assert not report.approximate  # the dying process reported its last iterations
    run_a, run_b = report.runs
    assert (run_a.run_id, run_a.restart_order, run_a.restart_count) == ("job.0", 0, 0)
    assert (run_a.status, run_a.finished) == ("crash", False)
    assert (run_a.first_iteration, run_a.last_iteration) == (0, 16)
    assert (run_a.last_checkpoint_step, run_a.checkpointed_iterations) == (10, 10)
    assert (run_a.productive_iterations, run_a.lost_iterations) == (10, 7)
    assert run_a.lost_seconds == pytest.approx(7.0, abs=TOL)
    assert (run_b.run_id, run_b.restart_order, run_b.status, run_b.finished) == ("job.1", 1, "finished", True)
    assert (run_b.first_iteration, run_b.last_iteration) == (10, 19)
    assert (run_b.last_checkpoint_step, run_b.checkpointed_iterations) == (20, 20)
    assert (run_b.productive_iterations, run_b.lost_iterations) == (10, 0)


@pytest.mark.parametrize("ending", ["crash", "finish"])
def test_no_checkpoint(tmp_path: Path, ending: str) -> None:
    """Without any checkpoint, a run that dies loses all its progress; one that finishes keeps all of it."""
    s = Sim(tmp_path, "solo").app_start().phase("dataloader_init", 1000)
    s.train_start(0)
    s.iterations(8, 500)  # 5000: reported at 5, the last 3 at the end
    s.wait(1000)  # 6000
    if ending == "crash":
        s.die()
    else:
        s.train_end().app_end()

    report = goodput(tmp_path / SESSION)
    check_identity(report)
    assert report.wall_seconds == pytest.approx(6.0, abs=TOL)
    [run] = report.runs
    assert (run.first_iteration, run.last_iteration, run.last_checkpoint_step, run.checkpointed_iterations) == (
        0, 7, None, None)
    if ending == "crash":
        assert report.productive_seconds == 0.0 and report.goodput == 0.0
        badput(report, initialization=1.0, lost_progress=4.0, idle=1.0)
        assert (run.status, run.productive_iterations, run.lost_iterations) == ("crash", 0, 8)
    else:
        assert report.productive_seconds == pytest.approx(4.0, abs=TOL)
        badput(report, initialization=1.0, idle=1.0)
        assert (run.status, run.productive_iterations, run.lost_iterations) == ("finished", 8, 0)


def test_multiple_ranks(tmp_path: Path) -> None:
    """Two ranks: rank 1 starts 1 s earlier and iterates faster (0.9 s + 0.1 s between iterations), only rank 0
    reports the checkpoint's success, and rank 1 dies 0.5 s after rank 0. The session's wall time spans both ranks;
    each rank's report splits it on its own timeline; rank 1 takes the checkpoint from rank 0."""
    r0 = Sim(tmp_path, "mr", rank=0, world_size=2, now=1000).app_start()
    r1 = Sim(tmp_path, "mr", rank=1, world_size=2, now=0).app_start()
    r0.wait(1000).train_start(0)  # 2000
    r1.wait(2000).train_start(0)
    r0.iterations(10, 1000).save(500)
    with pytest.warns(TelemetryWarning, match="ended without on_save_checkpoint_success"):  # a misuse, recorded
        r1.iterations(10, 900, gap=100).save(500, ok=False)  # saves its shard; the success is rank 0's
    r0.iterations(3, 1000)  # 15500
    r1.iterations(3, 900, gap=100).wait(500)  # 16000
    r0.die()
    r1.die()

    reports = goodput_by_rank(tmp_path / SESSION)
    assert sorted(reports) == [0, 1]
    rep0 = goodput(tmp_path / SESSION)
    assert rep0 == reports[0]
    for rep in reports.values():
        check_identity(rep)
        assert rep.wall_seconds == pytest.approx(16.0, abs=TOL)
        assert rep.ranks == (0, 1)
        assert (rep.productive_iterations, rep.lost_iterations) == (10, 3)
    assert rep0.productive_seconds == pytest.approx(10.0, abs=TOL)
    badput(rep0, initialization=1.0, checkpoint_save=0.5, lost_progress=3.0, idle=1.5)
    rep1 = reports[1]
    assert rep1.rank == 1
    assert rep1.productive_seconds == pytest.approx(9.0, abs=TOL)
    badput(rep1, initialization=2.0, checkpoint_save=0.5, lost_progress=2.7, idle=1.8)
    [run1] = rep1.runs
    assert (run1.checkpointed_iterations, run1.last_iteration) == (10, 12)
    assert any("another rank" in n for n in run1.notes)
    with pytest.raises(ValueError, match=r"rank 2 wrote no training lifecycle record.*records: 0\.\.1\)"):
        goodput(tmp_path / SESSION, rank=2)


_KILLED = """
import os, signal, sys
from pathlib import Path
from test_goodput import Sim
a = Sim(Path(sys.argv[1]), "job.0").app_start().wait(1000)
a.train_start(0)
a.iterations(10, 1000).save(500)   # 11500: checkpoint of 10 iterations
a.iterations(7, 1000)              # 18500: reported at 15; iteration 15 (exported, 1 in 5) ends at 17500
a.r.on_training_single_iteration_start(a.ms(a.now))   # in flight when killed
assert a.t.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_sigkill_no_final_report(tmp_path: Path) -> None:
    """A run killed with SIGKILL: no final report, its spans never end. Its figures stop at its last report (iteration
    14) and are flagged approximate; the iterations after that report are not seen (their time is idle); the restart
    resumes from its checkpoint and finishes."""
    script = tmp_path / "killed.py"
    script.write_text(_KILLED)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], env=helper_env("job.0", SESSION,
                          pythonpath=TESTS), capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    b = Sim(tmp_path, "job.1", restart_count=1, now=20000).app_start().phase("load_checkpoint", 1000)
    b.train_start(10)
    b.iterations(10, 1000)  # 31000
    b.train_end().app_end()

    report = goodput(tmp_path / SESSION)
    check_identity(report)
    assert report.wall_seconds == pytest.approx(31.0, abs=TOL)
    assert report.productive_seconds == pytest.approx(20.0, abs=TOL)
    # killed run: its last lifecycle timestamp is the end of iteration 15 (17500); iterations 10-14 are lost, 15
    # (done but not reported) is idle, and so is the gap to the restart
    badput(report, initialization=1.0, checkpoint_load=1.0, checkpoint_save=0.5, lost_progress=5.0, idle=3.5)
    assert report.approximate
    killed, resumed = report.runs
    assert (killed.status, killed.finished, killed.approximate) == ("killed", False, True)
    assert (killed.last_iteration, killed.checkpointed_iterations, killed.lost_iterations) == (14, 10, 5)
    assert any("no final report" in n for n in killed.notes)
    assert killed.end_time_sec == pytest.approx((BASE_MS + 17500) / 1e3, abs=TOL)
    assert (resumed.status, resumed.first_iteration, resumed.last_iteration) == ("finished", 10, 19)


# -- the figures' sources and edge cases -----------------------------------------------------------------------------


def test_crash_during_initialization(tmp_path: Path) -> None:
    """Run A dies while building its model (no training loop): all its time is initialisation; run B trains. A run
    folder alone is a session of one run."""
    a = Sim(tmp_path, "a").app_start().phase("distributed_init", 1000)
    a.r.on_model_init_start(a.ms(a.now))
    a.wait(2000).die()  # 3000
    b = Sim(tmp_path, "b", now=4000).app_start()
    b.train_start(0)
    b.iterations(4, 1000).train_end().app_end()  # 8000

    report = goodput(tmp_path / SESSION)
    check_identity(report)
    badput(report, initialization=3.0, idle=1.0)
    assert report.productive_seconds == pytest.approx(4.0, abs=TOL)
    run_a, run_b = report.runs
    assert (run_a.status, run_a.first_iteration, run_a.last_iteration, run_a.productive_iterations) == (
        "no_training", None, None, 0)
    assert run_b.status == "finished"
    alone = goodput(tmp_path / SESSION / "a")
    assert [r.run_id for r in alone.runs] == ["a"] and alone.wall_seconds == pytest.approx(3.0, abs=TOL)


def test_resume_from_an_older_checkpoint_counts_the_redone_iterations_as_lost(tmp_path: Path) -> None:
    """Run A checkpoints 10 and 20 iterations and dies at 23; run B resumes from 10 (the newer checkpoint was
    unusable): A's iterations 10-22 were redone, so they are lost, and nothing is counted twice."""
    a = Sim(tmp_path, "a").app_start()
    a.train_start(0)
    a.iterations(10, 1000).save(500).iterations(10, 1000).save(500).iterations(3, 1000)  # 24000
    a.die()
    b = Sim(tmp_path, "b", now=25000).app_start()
    b.train_start(10)
    b.iterations(20, 1000).train_end().app_end()  # 45000

    report = goodput(tmp_path / SESSION)
    check_identity(report)
    assert (report.productive_iterations, report.lost_iterations) == (30, 13)
    assert report.productive_seconds == pytest.approx(30.0, abs=TOL)
    badput(report, checkpoint_save=1.0, lost_progress=13.0, idle=1.0)
    run_a = report.runs[0]
    assert (run_a.checkpointed_iterations, run_a.productive_iterations, run_a.lost_iterations) == (20, 10, 13)
    assert any("redone" in n for n in run_a.notes)


def test_loop_ended_with_error_is_not_finished(tmp_path: Path) -> None:
    """What ``training.training_loop()`` does on an exception: the loop ends with status error, after a final
    report. The run did not finish: its iterations after the checkpoint are lost."""
    s = Sim(tmp_path, "err").app_start()
    loop = s.train_start(0)
    s.iterations(5, 1000).save(1000).iterations(2, 1000)
    loop.set_status("error", "RuntimeError: boom")
    s.train_end().app_end()  # 8000

    report = goodput(tmp_path / SESSION)
    check_identity(report)
    [run] = report.runs
    assert (run.status, run.finished, run.approximate) == ("crash", False, False)
    assert (run.productive_iterations, run.lost_iterations) == (5, 2)
    assert report.productive_seconds == pytest.approx(5.0, abs=TOL)
    badput(report, checkpoint_save=1.0, lost_progress=2.0)


def test_a_span_end_written_before_its_start_is_still_matched(tmp_path: Path) -> None:
    """A span's end record before its start: the tracer's tick may write a long `with` span's start just as the
    span ends, after its end (spans.Tracer.tick). Here the data-loading and checkpoint-save spans of a run are so
    reordered in the file: the same figures as in call order (the save's end is not lost, so its time is not
    stretched to the end of the process)."""
    s = Sim(tmp_path, "late-start").app_start()
    s.train_start(0)
    s.iterations(5, 1000, data=250, data_outside=True).save(500)
    s.iterations(3, 1000, data=250, data_outside=True)
    s.die()
    (path,) = (tmp_path / SESSION / "late-start").glob("rank-*.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    moved = 0
    for name in ("data_loading", "checkpoint_save_sync"):
        starts = [i for i, line in enumerate(lines) if '"kind":"span_start"' in line and f'"name":"{name}"' in line]
        for i in starts:  # each start moved to just after its end
            line = lines[i]
            span_id = json.loads(line)["span_id"]
            end = next(k for k, other in enumerate(lines) if '"kind":"span_end"' in other
                       and json.loads(other)["span_id"] == span_id)
            lines.insert(end + 1, line)
            lines[i] = ""
            moved += 1
    assert moved == 9
    path.write_text("".join(lines))
    report = goodput(tmp_path / SESSION)
    check_identity(report)
    assert report.productive_seconds == pytest.approx(5.0, abs=TOL)
    badput(report, checkpoint_save=0.5, data_wait=1.25, lost_progress=3.75)


def test_data_loading_outside_the_iterations(tmp_path: Path) -> None:
    """Data loading timed before each iteration (not inside it): it is not part of the iteration times, so it comes
    out of the time between iterations; lost iterations take their data loading with them."""
    s = Sim(tmp_path, "dl").app_start()
    s.train_start(0)
    s.iterations(5, 1000, data=250, data_outside=True).save(500)  # 6750
    s.iterations(3, 1000, data=250, data_outside=True)  # 10500
    s.die()

    report = goodput(tmp_path / SESSION)
    check_identity(report)
    assert report.productive_seconds == pytest.approx(5.0, abs=TOL)
    badput(report, checkpoint_save=0.5, data_wait=1.25, lost_progress=3.75)


def test_warmup_iterations(tmp_path: Path) -> None:
    """The recorder leaves warm-up iterations out of the windows' iteration times. With one warm-up iteration its
    time is recovered exactly (from the first iteration span, always exported, or from a checkpoint taken at a
    report); with more, and not every span exported, it is estimated and the report says so."""
    exact = tmp_path / "exact"
    s = Sim(exact, "w1", warmup=1).app_start()
    s.train_start(0)
    s.iterations(10, 1000, first=4000).train_end().app_end()  # 13000: no checkpoint at all
    report = goodput(exact / SESSION)
    check_identity(report)
    assert report.productive_seconds == pytest.approx(13.0, abs=TOL)
    assert not report.approximate

    saved = tmp_path / "saved"
    s = Sim(saved, "w1", warmup=1, log_every=5).app_start()
    s.train_start(0)
    s.iterations(5, 1000, first=4000).save(500).iterations(2, 1000)
    s.die()
    report = goodput(saved / SESSION)
    check_identity(report)
    assert report.productive_seconds == pytest.approx(8.0, abs=TOL)
    badput(report, checkpoint_save=0.5, lost_progress=2.0)
    assert not report.approximate

    estimated = tmp_path / "estimated"
    s = Sim(estimated, "w3", warmup=3, log_every=5, export_every=5).app_start()
    s.train_start(0)
    s.iterations(10, 1000, first=4000).train_end().app_end()  # 13000
    report = goodput(estimated / SESSION)
    check_identity(report)
    assert report.approximate
    assert report.productive_seconds == pytest.approx(10.0, abs=TOL)  # 3 warm-up iterations at the 1 s mean
    assert report.badput.idle == pytest.approx(3.0, abs=TOL)
    assert any("warm-up" in n for n in report.notes)


def test_corrupt_and_torn_lines_are_skipped(tmp_path: Path) -> None:
    s = Sim(tmp_path, "c").app_start().phase("model_init", 1000)
    s.train_start(0)
    s.iterations(10, 1000).save(500).train_end().app_end()  # 11500
    clean = goodput(tmp_path / SESSION)
    [path] = (tmp_path / SESSION / "c").glob("rank-*.jsonl")
    lines = path.read_bytes().split(b"\n")
    lines.insert(4, b'{"v":1,"kind":"event","mono_ns":"garbage"}')
    lines.insert(9, b"\x00\xffnot json")
    path.write_bytes(b"\n".join(lines) + b'{"v":1,"kind":"met')  # and a last line cut short

    report = goodput(tmp_path / SESSION)
    check_identity(report)
    assert report.productive_seconds == pytest.approx(clean.productive_seconds) == pytest.approx(10.0, abs=TOL)
    assert report.badput == clean.badput
    assert any("2 corrupt and 1 torn" in n for n in report.notes)


def test_empty_and_wrong_folders(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        goodput(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty session, no runs"):
        goodput(tmp_path / "empty")
    t = Telemetry(identity_from_env({}, run_id="quiet", session_tag="quiet"), store=tmp_path / "store")
    t.metric("loss", 1.0)
    assert t.close()
    with pytest.raises(ValueError, match=r"empty session, its 1 run.* no training lifecycle record"):
        goodput(tmp_path / "store" / "quiet")
    Sim(tmp_path / "store", "other", session="other").app_start().wait(10).app_end()
    with pytest.raises(ValueError, match="holds runs of 2 sessions"):
        goodput(tmp_path / "store")
    with pytest.raises(ValueError, match="rank must be"):
        goodput(tmp_path / "store" / "other", rank=-1)


def test_real_clocks_and_the_context_managers(tmp_path: Path) -> None:
    """No explicit times: the context managers on the real clocks, a failure after a checkpoint (the loop ends with
    status error). The figures are whatever the clocks say; their structure is checked."""
    t = Telemetry(identity_from_env({}, run_id="live", session_tag=SESSION), store=tmp_path)
    recorder = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=3),
                                telemetry=t)
    ctx = TrainingContexts(lambda: recorder)
    with pytest.raises(RuntimeError, match="boom"), ctx.application():
        with ctx.model_init():
            time.sleep(0.002)
        with ctx.training_loop(0):
            for step in range(8):
                with ctx.training_iteration():
                    with ctx.data_loading():
                        time.sleep(0.001)
                    time.sleep(0.002)
                if step == 4:
                    with ctx.checkpoint_save(5):
                        time.sleep(0.001)
            raise RuntimeError("boom")
    assert t.close()

    report = goodput(tmp_path / SESSION)
    check_identity(report)
    [run] = report.runs
    assert (run.status, run.finished) == ("crash", False)
    # the checkpoint (5) falls between two reports (3, 6): its iteration seconds are exact (the save carries them),
    # its data-loading seconds interpolated
    assert run.approximate and any("interpolated" in n for n in run.notes)
    assert (run.first_iteration, run.last_iteration, run.checkpointed_iterations) == (0, 7, 5)
    assert (report.productive_iterations, report.lost_iterations) == (5, 3)
    assert report.productive_seconds >= 5 * 0.002
    assert report.badput.lost_progress >= 3 * 0.003
    assert report.badput.data_wait >= 5 * 0.001
    assert report.badput.initialization >= 0.002 and report.badput.checkpoint_save >= 0.001


def test_report_is_frozen_and_json_able(tmp_path: Path) -> None:
    a = Sim(tmp_path, "a").app_start()
    a.train_start(0)
    a.iterations(6, 1000).save(500).iterations(2, 1000)
    a.die()
    report = goodput(tmp_path / SESSION)
    data = report.as_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert data["badput"] == report.badput.as_dict()
    assert data["badput_seconds"] == pytest.approx(report.badput_seconds)
    assert data["runs"][0]["status"] == "crash"
    assert set(data["badput"]) == set(BADPUT_CATEGORIES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.goodput = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("seed", range(6))
def test_identity_on_random_sessions(tmp_path: Path, seed: int) -> None:
    """Random sessions (restarts, init phases, checkpoints, validation, crashes, warm-up, one or two ranks): every
    second is counted once, nothing is negative, and no iteration is productive twice."""
    rng = random.Random(seed)
    world = rng.choice([1, 2])
    now, step, target = 0, 0, rng.randint(20, 40)
    for attempt in range(rng.randint(1, 4)):
        sims = [Sim(tmp_path, f"run{attempt}", rank=r, world_size=world, now=now, restart_count=attempt,
                    log_every=rng.choice([1, 3, 5]), warmup=rng.choice([0, 1, 2])) for r in range(world)]
        for s in sims:
            s.app_start().phase("model_init", rng.randint(100, 3000))
            if attempt:
                s.phase("load_checkpoint", rng.randint(100, 2000))
        last = attempt == 3 or rng.random() < 0.3
        saved = step
        iterations = target - step if last else rng.randint(1, 15)
        for s in sims:
            s.train_start(step)
        for _ in range(iterations):
            ms, gap = rng.randint(100, 1500), rng.randint(0, 200)
            for s in sims:
                s.iterations(1, ms, gap=gap, data=rng.randint(0, 50))
            if rng.random() < 0.15:
                for s in sims:
                    s.save(rng.randint(50, 800))
                saved = sims[0].step
            if rng.random() < 0.05:
                for s in sims:
                    s.validation(rng.randint(100, 500))
        if last:
            for s in sims:
                s.train_end().app_end()
        else:
            for s in sims:
                s.wait(rng.randint(0, 1000)).die()
        now = max(s.now for s in sims) + rng.randint(0, 5000)
        step = saved
        if last:
            break

    for rank, report in goodput_by_rank(tmp_path / SESSION).items():
        assert report.rank == rank
        check_identity(report)
        assert report.productive_iterations <= target
        if report.runs[-1].finished:
            assert report.productive_iterations == target
        for run in report.runs:
            assert run.productive_seconds >= 0 and run.lost_seconds >= 0
            assert run.productive_iterations >= 0 and run.lost_iterations >= 0
