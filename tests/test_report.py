"""The HTML report (``telemetrain report``, ``telemetrain.report.write_report``) on real run stores.

The session below is written by real ``Telemetry`` instances (one per rank and run) driving real ``TrainingRecorder``s
at explicit times (``*_time_msec`` and explicit monotonic ns for the sub-phase spans), with problems planted in it:
a slow phase (data loading, iterations 60-79 on every rank), a slow rank (rank 2, every phase 1.6x), one slow
iteration, straggler events, a NaN loss, a sink that fails, a torn line, and a crash (the first run closes mid-loop,
after a checkpoint) followed by a restart from that checkpoint. The page is opened in real headless Chromium.
"""

from __future__ import annotations

import itertools
import math
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import train_empty_iterations
from telemetrain import Telemetry, identity_from_env
from telemetrain.cli import main
from telemetrain.dispatch import FailurePolicy
from telemetrain.report import write_report
from telemetrain.report.load import load_run
from telemetrain.report.model import build_model
from telemetrain.sinks import Sink
from telemetrain.spans import tracer
from telemetrain.store import open_run
from telemetrain.training import SpanName, TrainingRecorder, TrainingTelemetryConfig
from telemetrain.training.goodput import goodput
from test_reader_damage import ENGINES

pytestmark = pytest.mark.filterwarnings("ignore:telemetrain. sink 'broken' failed")

SESSION = "rep"
# The simulated timeline ends shortly before the real clock's now: the crash (a real close) and the records without
# explicit times (metrics, events) then fall just after it, as in a real run.
BASE_MS = int(time.time() * 1000) - 40_000
WORLD = 4
XSS = "<script>alert(1)</script>"
XSS_CONSOLE = "<script>console.error('xss-ran')</script>"
PHASE_MS = {SpanName.DATA_LOADING: 10, SpanName.MODEL_FORWARD: 30, SpanName.MODEL_BACKWARD: 50,
            SpanName.OPTIMIZER_UPDATE: 10}
SLOW_RANK, SLOW_RANK_FACTOR = 2, 1.6
SLOW_PHASE_STEPS, SLOW_PHASE_MS = range(60, 100), 120
SLOW_ITERATION_STEP, SLOW_ITERATION_MS = 45, 2000


class BrokenSink(Sink):
    """A backend that always fails: the run store gets its sink_error, sink_suspended and dropped diagnostics."""

    name = "broken"

    def write(self, records: Any) -> None:
        raise OSError("disk full (planted)")


class Rank:
    """One rank of one run, driven at explicit times: ``now`` is ms after BASE_MS, ``step`` the next iteration."""

    def __init__(self, root: Path, run_id: str, rank: int, *, restart_count: int = 0, now: int = 0) -> None:
        identity = identity_from_env({}, run_id=run_id, session_tag=SESSION, perf_tag="report-test", rank=rank,
                                     local_rank=rank, world_size=WORLD, restart_count=restart_count)
        # one failure suspends a sink for a minute: what the broken sink is offered meanwhile is dropped
        policy = FailurePolicy(max_consecutive=1, backoff_s=60.0, backoff_max_s=60.0)
        self.t = Telemetry(identity, store=root, config={"model": XSS, "lr": 0.1, "nested": {"depth": 2}},
                           failure_policy=policy)
        config = TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=10,
                                         flops_per_sample_or_fn=1e9, peak_tflops_per_gpu=1.0)
        self.r = TrainingRecorder(config, telemetry=self.t)
        self.rank = rank
        self.now = now
        self.step = 0

    def ms(self, at: int) -> int:
        return BASE_MS + at

    def mono(self, at: int) -> int:
        return round(self.ms(at) * 1e6) - self.t.wall_offset_ns

    def start(self, *, resume_from: int = 0) -> Rank:
        self.r.on_app_start(self.ms(self.now))
        for phase, ms in (("model_init", 200), ("dataloader_init", 100)):
            getattr(self.r, f"on_{phase}_start")(self.ms(self.now))
            getattr(self.r, f"on_{phase}_end")(self.ms(self.now + ms))
            self.now += ms
        if resume_from:
            self.r.on_load_checkpoint_start(self.ms(self.now))
            self.r.on_load_checkpoint_end(self.ms(self.now + 300))
            self.now += 300
        self.step = resume_from
        self.r.on_train_start(resume_from, start_time_msec=self.ms(self.now))
        return self

    def iterations(self, until: int) -> Rank:
        scale = SLOW_RANK_FACTOR if self.rank == SLOW_RANK else 1.0
        while self.step < until:
            start = self.now
            self.r.on_training_single_iteration_start(self.ms(start))
            at = start
            for name, ms in PHASE_MS.items():
                if name == SpanName.DATA_LOADING and self.step in SLOW_PHASE_STEPS:
                    ms = SLOW_PHASE_MS
                ms = round(ms * scale)
                s = self.r.tracer.start(name.value, group="training", start_ns=self.mono(at))
                s.end(end_ns=self.mono(at + ms))
                at += ms
            if self.step == SLOW_ITERATION_STEP and self.rank == 0:
                at += SLOW_ITERATION_MS
            self.r.on_training_single_iteration_end(self.ms(at))
            self.now = at + 5
            self.step += 1
        return self

    def save(self) -> Rank:
        self.r.on_save_checkpoint_start(self.step, self.ms(self.now))
        self.r.on_save_checkpoint_success(self.step, self.ms(self.now + 400))
        self.r.on_save_checkpoint_end(self.ms(self.now + 400))
        self.now += 400
        return self

    def finish(self) -> None:
        self.r.on_train_end(self.ms(self.now))
        self.r.on_app_end(self.ms(self.now + 50))
        assert self.t.close()


def _write_session(root: Path) -> tuple[Path, Path]:
    """The first run crashes at iteration 130 (its last checkpoint: 100); the second resumes at 100 and finishes."""
    ranks = [Rank(root, "job.0", r, now=7 * r).start() for r in range(WORLD)]
    ranks[3].t.add_sink(BrokenSink())
    ranks[3].t.metric("probe", 1.0, "train")
    ranks[3].t.flush()  # the broken sink fails and is suspended
    for r in ranks:
        r.iterations(50).save().iterations(100).save().iterations(130)
    ranks[3].t.flush()  # what the suspended broken sink was offered: dropped (its close's last write would try it)
    for step in (20, 40, 60):
        ranks[0].t.event("straggler", {"rank": SLOW_RANK, "host": "node-b", "phase": "iteration", "kind": "relative",
                                       "score": SLOW_RANK_FACTOR, "threshold": 1.2, "step": step}, group="cross_rank")
    ranks[1].t.metric("train.loss", float("nan"), "train", step=33)
    ranks[1].t.metric("train.loss", 0.5, "train", step=34)
    ranks[0].t.metric(XSS, 1.0, "train")
    ranks[0].t.metric(XSS_CONSOLE, 2.0, "train")
    ranks[0].t.event(XSS, {"payload": XSS_CONSOLE}, severity="warning")
    ranks[0].r.tracer.start(XSS, group="user").end()
    ranks[0].t.event("loss spike", {"value": 12.5}, severity="error", group="train")
    for r in ranks:  # the crash: every rank's telemetry closes mid-loop (SIGTERM); spans end terminated
        assert r.t.close()
    run0 = root / SESSION / "job.0"
    with open(next(run0.glob("rank-1.*.jsonl")), "ab") as fh:
        fh.write(b'{"v":1,"kind":"metric","mono_ns":1,"wall_')  # a torn last line
    restarted = [Rank(root, "job.1", r, restart_count=1, now=60_000).start(resume_from=100) for r in range(WORLD)]
    for r in restarted:
        r.iterations(200).save().finish()
    # the launcher's agent of the second attempt writes its own file into the run folder
    agent = Telemetry(identity_from_env({}, run_id="job.1", session_tag=SESSION, role="agent", rank=0, group_rank=0,
                                        world_size=WORLD, restart_count=1), store=root)
    agent.event("torchelastic.worker.status.SUCCEEDED", {"group_world_size": 1, "state": "SUCCEEDED"},
                group="torchelastic")
    assert agent.close()
    return run0, root / SESSION / "job.1"


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _write_session(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def crashed_page(session: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(session[0], tmp_path_factory.mktemp("page") / "crashed.html")


def _kinds(run_dir: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in build_model(open_run(run_dir)).findings:
        out.setdefault(f.kind, []).append(f.title)
    return out


def test_the_report_names_each_planted_problem(session: tuple[Path, Path], crashed_page: Path) -> None:
    kinds = _kinds(session[0])
    assert kinds["slowdown"] == ["slowdown: 2.10x from step 60 to 99"]  # the slow data loading, every rank
    # rank 2, 1.6x in every phase: named once (by its costliest phase, the others listed), no other rank
    [late] = kinds["straggler"]
    assert late.startswith(f"straggler: rank {SLOW_RANK} (")
    assert kinds["slow iterations"] == ["slow iterations: 1 window(s)"]
    # the loop and the application it ran in ended together on the same ranks: one finding
    assert kinds["crash"] == [f"crash: training_loop and application ended terminated on rank(s) 0..{WORLD - 1}"]
    assert "failed spans" not in kinds  # (the loop's and the application's are that crash finding, not said twice)
    assert kinds["nan/inf"] == ["non-finite values: train.loss"]
    assert any(t.startswith("sink failure: broken") for t in kinds["sink failure"])
    assert kinds["dropped records"]
    assert kinds["damaged lines"] == ["damaged lines: 0 corrupt, 1 torn"]
    assert kinds["errors"] == ["error events: 1"]
    page = crashed_page.read_text()
    for title in ("slowdown: 2.10x from step 60", f"straggler: rank {SLOW_RANK} (",
                  "crash: training_loop and application ended terminated", "non-finite values: train.loss",
                  "sink failure: broken", "loss spike"):
        assert title in page, title
    assert page.count('class="evidence">evidence: ') >= 4  # each statistical finding shows its evidence


def test_the_slow_phase_and_the_slow_rank_are_located(session: tuple[Path, Path]) -> None:
    model = build_model(open_run(session[0]))
    [slow] = [f for f in model.findings if f.kind == "slowdown"]
    # windows end at iterations 9, 19, ...: the slow steps 60..99 are the windows ending at 69..99, on every rank
    assert "on every rank (job-wide)" in slow.detail and "dataloader +110 ms" in slow.detail
    assert slow.evidence is not None and slow.evidence.steps == (60, 99) and slow.evidence.phase == "dataloader"
    [late] = [f for f in model.findings if f.kind == "straggler"]
    assert late.evidence is not None and late.evidence.ranks == (SLOW_RANK,)
    assert any("live cross-rank detector reported it too" in n for n in late.evidence.notes)  # the planted events
    assert [rank for rank, _ in model.slow_ranks] == [SLOW_RANK]
    assert model.slow_ranks[0][1] == pytest.approx(SLOW_RANK_FACTOR, rel=0.1)
    [slow_window] = model.slow_windows
    assert (slow_window.rank, slow_window.iteration) == (0, 49)
    assert slow_window.max == pytest.approx((sum(PHASE_MS.values()) + SLOW_ITERATION_MS) / 1e3, abs=1e-3)


def test_time_by_phase_adds_up_the_planted_phase_times(session: tuple[Path, Path]) -> None:
    """Rank 1 (not slow) of the restarted run: iterations 100..199, none in the slow range. The phase times cover
    every iteration, the loop's warm-up one included."""
    model = build_model(open_run(session[1]))
    seconds = model.phase_seconds[1]
    timed = 100
    assert seconds["dataloader"] == pytest.approx(timed * 0.010, rel=1e-3)
    assert seconds["forward"] == pytest.approx(timed * 0.030, rel=1e-3)
    assert seconds["backward"] == pytest.approx(timed * 0.050, rel=1e-3)
    assert seconds["optimizer"] == pytest.approx(timed * 0.010, rel=1e-3)
    assert seconds["other"] == pytest.approx(0.0, abs=1e-3)  # the 5 ms gaps are between iterations, not in them
    assert model.phase_seconds[SLOW_RANK]["backward"] == pytest.approx(timed * 0.080, rel=1e-3)


def test_the_restarted_run_shows_the_crash_the_restart_and_the_session_goodput(session: tuple[Path, Path],
                                                                             tmp_path: Path) -> None:
    model = build_model(open_run(session[1]))
    titles = [f.title for f in model.findings]
    assert "crash: run job.0 crashed" in titles
    assert "restart: run job.1 after job.0" in titles
    expected = goodput(session[1].parent)
    headline = {label: value for label, value, _ in model.headline}
    assert headline["goodput"] == f"{expected.goodput:.1%}"
    assert [r.run_id for r in model.goodput.runs] == ["job.0", "job.1"]
    page = write_report(session[1], tmp_path / "r.html").read_text()
    assert "restarts and checkpoints" in page and "job.0" in page and "crash" in page
    # a lane per attempt, named so that it fits, the report's own run marked (the bars' tooltips name the runs)
    timeline = re.search(r'<svg[^>]*class="chart timeline".*?</svg>', page, re.S)
    assert timeline is not None
    lanes = re.findall(r'text-anchor="end"[^>]*>([^<]*)<title>', timeline.group(0))
    assert lanes == ["attempt 1 (.0)", "&gt; attempt 2 (.1)"] and "<title>run job.1: finished" in timeline.group(0)


def test_the_launcher_agents_events_are_shown_apart_from_the_ranks(session: tuple[Path, Path]) -> None:
    model = build_model(open_run(session[1]))
    assert model.ranks == list(range(WORLD)) and len(model.agents) == 1  # the agent is not a rank
    [row] = [e for e in model.events if e.group == "torchelastic"]
    assert (row.source, row.name) == (f"agent {model.agents[0].identity.host}",
                                      "torchelastic.worker.status.SUCCEEDED")
    assert not any(f.kind == "missing ranks" for f in model.findings)


def test_headline_numbers_come_from_the_last_metrics_update(session: tuple[Path, Path]) -> None:
    run = open_run(session[1])
    updates = [r for r in run.processes[0].records if r.kind == "event" and r.name == "training_metrics_update"]
    last = updates[-1].attributes
    headline = {label: value for label, value, _ in build_model(run).headline}
    assert headline["throughput"] == f"{last['cumulative_samples_per_second']:,.4g} samples/s"
    tflops = last["cumulative_train_throughput_per_gpu"]
    assert headline["TFLOP/s per GPU"] == f"{tflops:,.4g}"
    assert headline["MFU"] == f"{tflops / 1.0:.1%}"  # peak_tflops_per_gpu=1.0 in the config
    assert headline["iterations"] == "100 (to step 199)"
    assert headline["GPU energy"] == "n/a"


def test_gpu_energy_counts_each_device_once(tmp_path: Path) -> None:
    """Two ranks of one host record the same GPU's counter over the same time: the largest value counts, once;
    another GPU adds."""
    ts = [Telemetry(identity_from_env({}, run_id="e", session_tag="s", rank=rank, world_size=2), store=tmp_path)
          for rank in range(2)]
    for half in (0.5, 1.0):  # both ranks sampling at once
        for t, gpu0 in zip(ts, (1000.0, 3600.0), strict=True):
            t.metric("hw.energy", gpu0 * half, "system.gpu.0", unit="J")
    ts[1].metric("hw.energy.integrated", 500.0, "system.gpu.1", unit="J")
    assert all(t.close() for t in ts)
    [(_, value, how)] = [h for h in build_model(open_run(tmp_path / "s" / "e")).headline if h[0] == "GPU energy"]
    assert value == f"{4100 / 3.6e6:.3g} kWh (4,100 J)"
    assert "2 GPU(s)" in how and "1 from the energy counter, 1 integrated" in how


def test_names_from_the_run_are_escaped(crashed_page: Path) -> None:
    page = crashed_page.read_text()
    assert XSS not in page and XSS_CONSOLE not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;script&gt;console.error(&#x27;xss-ran&#x27;)&lt;/script&gt;" in page
    assert "<script" not in page.lower()  # the page has no script of its own either
    escaped = "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>"
    assert f"<td>train</td>{escaped}" in page  # the metric, in the metrics table
    assert f"<td>user</td>{escaped}" in page  # the span, in the spans table


# -- headless Chromium -----------------------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")


def _chromium(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--no-first-run", "--disable-extensions", *flags, url],
        capture_output=True, text=True, timeout=90,
    )


def _console(stderr: str) -> list[str]:
    """What the page wrote to the console (messages and uncaught errors), from Chromium's log."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@needs_chromium
def test_console_check_sees_a_script_that_runs(tmp_path: Path) -> None:
    """The control for the check below: an unescaped payload does run, and the check sees it."""
    page = tmp_path / "raw.html"
    page.write_text(f"<!DOCTYPE html><html><body><p>{XSS_CONSOLE}</p></body></html>")
    proc = _chromium(page.as_uri(), "--dump-dom")
    assert any("xss-ran" in line for line in _console(proc.stderr)), proc.stderr[-2000:]


@needs_chromium
def test_chromium_renders_the_report_without_console_errors(crashed_page: Path, tmp_path: Path) -> None:
    dom = _chromium(crashed_page.as_uri(), "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console(dom.stderr) == [], _console(dom.stderr)
    html = dom.stdout
    assert "<script" not in html.lower()  # the payloads stayed text: no script element in the live DOM
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert len(re.findall(r'<svg[^>]*class="chart line-chart"', html)) >= 1
    assert len(re.findall(r'<svg[^>]*class="chart heatmap"', html)) == 1
    assert len(re.findall(r'<svg[^>]*class="chart bars"', html)) >= 1
    assert len(re.findall(r'<svg[^>]*class="chart timeline"', html)) == 1
    assert len(re.findall(r'class="flag"', html)) >= 1  # the straggler reports on the heatmap

    shot = tmp_path / "shot.png"
    proc = _chromium(crashed_page.as_uri(), f"--screenshot={shot}", "--window-size=1200,1600",
                     "--hide-scrollbars")
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    image = pytest.importorskip("PIL.Image").open(shot).convert("RGB")
    assert image.size == (1200, 1600)
    colours = image.getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 50, "the screenshot is (nearly) blank"
    background = max(colours)[0]
    assert background < 0.9 * image.size[0] * image.size[1]  # not one colour almost everywhere


# -- command line ------------------------------------------------------------------------------------------------------


def test_cli_writes_the_report_and_prints_its_path(session: tuple[Path, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.html"
    assert main(["report", str(session[1].parent), "-o", str(out), "--progress"]) == 0
    captured = capsys.readouterr()
    assert f"wrote {out}" in captured.out and str(session[1]) in captured.out  # the newest run of the session
    assert "holds 2 runs" in captured.err
    assert "\rreading agent-0." in captured.err and "100%" in captured.err  # the bar, asked for (first file first)
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("case", ["missing", "file", "foreign"])
def test_cli_errors_are_one_readable_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "nothing-here"
    if case == "file":
        target.write_text("hello")
    elif case == "foreign":
        target.mkdir()
        (target / "notes.txt").write_text("not a run")
    assert main(["report", str(target), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("telemetrain: error: ")
    expected = {"missing": "no such directory", "file": "is a file", "foreign": "is not a telemetrain run directory"}
    assert expected[case] in err
    assert not (tmp_path / "r.html").exists()


def test_write_report_default_path_and_progress(session: tuple[Path, Path], tmp_path: Path) -> None:
    run_dir = tmp_path / "copy"
    shutil.copytree(session[1], run_dir)
    calls: list[tuple[str, int, int]] = []
    path = write_report(run_dir, progress=lambda what, done, total: calls.append((what, done, total)))
    assert path == run_dir / "report.html" and path.exists()
    reads = [c for c in calls if c[0].startswith("reading ")]
    assert len(reads) == WORLD + 1 and [c[1] for c in reads] == sorted(c[1] for c in reads)  # the ranks and the agent
    assert calls[-1][0] == "written" and calls[-1][1] == calls[-1][2]
    assert load_run(run_dir, lambda *a: None).run_id == open_run(run_dir).run_id  # the report file is not a rank file
    with pytest.raises(FileNotFoundError):
        write_report(tmp_path / "absent")


def test_a_run_without_training_still_reports(tmp_path: Path) -> None:
    identity = identity_from_env({}, run_id="plain", session_tag="s", rank=0, world_size=1)
    t = Telemetry(identity, store=tmp_path)
    for step in range(5):
        t.metric("loss", 1.0 / (step + 1), "train", step=step)
    t.metric("loss", math.inf, "train", step=5)
    with tracer(t).span("work"):
        pass
    assert t.close()
    model = build_model(open_run(tmp_path / "s" / "plain"))
    assert [f.title for f in model.findings] == ["non-finite values: loss"]
    assert model.goodput is None and "no training lifecycle" in model.goodput_error
    page = write_report(tmp_path / "s" / "plain", tmp_path / "p.html").read_text()
    assert "No iteration timing in this run." in page and "work" in page


def test_no_anomaly_says_which_rules_had_nothing_to_read(tmp_path: Path) -> None:
    """'No slowdown, straggler...' on a run with no report windows (a bridge writing only metrics) claims checks
    that could not run: the page says so; a single rank's says stragglers need two."""
    identity = identity_from_env({}, run_id="bare", session_tag="s", rank=0, world_size=1)
    t = Telemetry(identity, store=tmp_path)
    for step in range(5):
        t.metric("loss", 1.0 / (step + 1), "train", step=step)
    assert t.close()
    page = write_report(tmp_path / "s" / "bare", tmp_path / "bare.html").read_text()
    assert "No anomaly found" in page and "could not be looked for" in page
    identity = identity_from_env({}, run_id="trained", session_tag="s2", rank=0, world_size=1)
    t = Telemetry(identity, store=tmp_path)
    train_empty_iterations(t, 12, batch=4, log_every=5)
    assert t.close()
    page = write_report(tmp_path / "s2" / "trained", tmp_path / "trained.html").read_text()
    assert "No anomaly found" in page and "could not be looked for" not in page
    assert "Report windows of one rank only: stragglers need two or more ranks" in page


def test_a_run_that_never_checkpointed_shows_dashes_not_none(tmp_path: Path) -> None:
    identity = identity_from_env({}, run_id="nockpt", session_tag="s", rank=0, world_size=1)
    t = Telemetry(identity, store=tmp_path)
    train_empty_iterations(t, 12, batch=4, log_every=5)
    assert t.close()
    model = build_model(open_run(tmp_path / "s" / "nockpt"))
    assert model.goodput is not None and model.goodput.runs[0].last_checkpoint_step is None
    page = write_report(tmp_path / "s" / "nockpt", tmp_path / "p.html").read_text()
    row = re.search(r"<h3>runs of the session</h3><table>.*?</table>", page)
    assert row is not None and '<td class="num">-</td>' in row.group(0)
    assert ">None<" not in page


def test_without_metrics_windows_the_exported_iteration_spans_are_charted(tmp_path: Path) -> None:
    identity = identity_from_env({}, run_id="spans", session_tag="s", rank=0, world_size=1)
    t = Telemetry(identity, store=tmp_path)
    tr = tracer(t)
    for _ in range(3):
        with tr.span("training_single_iteration", group="training"):
            with tr.span("model_forward", group="training"):
                pass
    assert t.close()
    model = build_model(open_run(tmp_path / "s" / "spans"))
    assert not model.windows and len(model.iteration_spans[0]) == 3
    assert set(model.phase_seconds[0]) == {"forward"}  # from the exported sub-phase spans
    page = write_report(tmp_path / "s" / "spans", tmp_path / "p.html").read_text()
    assert "the duration of the exported training_single_iteration spans" in page
    assert page.count('class="chart line-chart"') == 1


def test_odd_records_do_not_break_the_report(tmp_path: Path) -> None:
    """Events with the right names and the wrong shapes (written by someone else), bools and NaN among metrics."""
    identity = identity_from_env({}, run_id="odd", session_tag="s", rank=0, world_size=3)
    t = Telemetry(identity, store=tmp_path)
    t.event("training_metrics_update", {"current_iteration": "ten", "avg_iteration_time_sec": "fast"},
            group="training")
    t.event("training_metrics_update", {"current_iteration": 9, "avg_iteration_time_sec": math.nan,
                                        "max_iteration_time_sec": math.inf, "avg_forward_time_sec": None},
            group="training")
    t.event("straggler", {"rank": "two", "score": "high"}, group="cross_rank")
    t.event("straggler", {}, group="cross_rank")
    t.event("save_checkpoint_success", {"productive_train_iterations": [1, 2]}, group="training")
    t.metric("flag", True, "train")
    t.metric("flag", False, "train")
    t.metric("x", math.nan, "train")
    t.metric("x", 2.0, "train")
    t.metric("hw.power", math.nan, "system.gpu.0", unit="W")
    assert t.close()
    model = build_model(open_run(tmp_path / "s" / "odd"))
    kinds = {f.kind for f in model.findings}
    assert {"nan/inf", "missing ranks"} <= kinds
    # the malformed straggler events: no finding (the windows do not confirm them), a note and their table rows
    assert "straggler" not in kinds
    [note] = [n for n in model.notes if n.kind == "unconfirmed"]
    assert note.text == "2 live straggler event(s) that the offline rule did not confirm: rank two; rank None"
    assert model.metric_stats[("train", "flag")][:2] == [2, False]
    assert model.metric_stats[("train", "x")][:4] == [2, 2.0, 2.0, 2.0]  # min and max of the finite values
    page = write_report(tmp_path / "s" / "odd", tmp_path / "p.html").read_text()
    assert "<td>two</td>" in page and "rank(s) 1..2 wrote nothing" in page
    assert "Context: 2 live straggler event(s)" in page


def test_attribute_cells_keep_a_timestamps_digits() -> None:
    from telemetrain.report.html_tables import attribute_value

    assert attribute_value(1795870920.5123456) == "1795870920.512"  # was 1.79587e+09: the second lost
    assert attribute_value(453771264.0) == "453771264" and attribute_value(-2.5e6) == "-2500000"
    assert attribute_value(0.000123456789) == "0.000123457" and attribute_value(3.14159265) == "3.14159"
    assert attribute_value(1e20) == "1e+20" and attribute_value(float("nan")) == "nan"
    assert attribute_value(None) == "-" and attribute_value(7) == "7" and attribute_value("x") == "x"


@pytest.mark.parametrize("engine", ENGINES)
def test_many_ranks_chart_their_envelope_and_list_the_first_and_the_outlier_processes(
        tmp_path: Path, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """40 ranks on 5 hosts: each host's CPU a line (5 series, node5 before node10), the ranks' resident memory as
    their envelope (the band and the median) with the 3 highest peaks drawn alone; the processes table lists the
    first 8 ranks and the outliers (a damaged file, the fewest and the most records), all 40 folded below; the events
    list holds 16 of each name, so that another name's event is not crowded out."""
    monkeypatch.setenv("TELEMETRAIN_ENGINE", engine)
    for rank in range(40):
        t = Telemetry(identity_from_env({}, run_id="many", session_tag="s", rank=rank, world_size=40,
                                        host=f"node{rank // 8 * 5}"), store=tmp_path)
        for i in range(3 if rank == 25 else 20 if rank == 33 else 6):  # rank 25 the fewest records, 33 the most
            t.metric("process.memory.usage", 1e9 + 1e6 * rank + i, "system", unit="By")
            if rank % 8 == 0:
                t.metric("system.cpu.utilization", 0.1 * (rank // 8), "system", unit="1")
        t.event("ready", {"rank": rank}, group="job")
        for window in range(1, 4):  # its report windows, with the time by phase (rank 30 the slowest, 12 the fastest)
            t.event("training_metrics_update", {
                "current_iteration": 10 * window, "window_iterations": 10, "train_iterations_start": 0,
                "avg_iteration_time_sec": 0.1 + 0.05 * (rank == 30) - 0.001 * (rank == 12),
                "avg_forward_time_sec": 0.03, "avg_backward_time_sec": 0.05 + 0.05 * (rank == 30),
                "window_seconds": 1.0}, group="training")
        if rank == 39:
            t.event("late", {"rank": rank}, group="job")
        assert t.close()
    run = tmp_path / "s" / "many"
    with open(next(run.glob("rank-17.*.jsonl")), "a") as fh:
        fh.write('{"v":1,"kind":"metr\n')  # a damaged line
    page = write_report(run, tmp_path / "p.html").read_text()
    memory = page[page.index("<h3>process resident memory (per rank)</h3>"):]
    memory = memory[:memory.index("</div>")]
    legend = re.findall(r"<text[^>]*>([^<]*)</text>", memory.split("</title>", 1)[1])
    assert {"range of 40", "median", "rank 39", "rank 38", "rank 37"} <= set(legend)
    assert not [name for name in legend if re.fullmatch(r"rank ([0-9]|[12][0-9]|3[0-6])", name)]
    assert "40 series" in memory and "(rank 39, rank 38, rank 37)" in memory
    cpu = page[page.index("<h3>host CPU utilization</h3>"):]
    cpu = cpu[:cpu.index("</div>")]
    assert re.findall(r">(node\d+)</text>", cpu) == ["node0", "node5", "node10", "node15", "node20"]  # in order
    processes = page[page.index("<h3>processes</h3>"):]
    listed, folded = processes.split("<details>", 1)
    ranks = [int(r) for r in re.findall(r'<tr><td class="num">(\d+)</td>', listed)]
    assert ranks == [0, 1, 2, 3, 4, 5, 6, 7, 17, 25, 33]
    assert "29 more not listed" in listed and "all 40 processes" in folded
    assert [int(r) for r in re.findall(r'<tr><td class="num">(\d+)</td>', folded.split("</details>")[0])] == \
        list(range(40))
    phases = page[page.index("<h3>iteration time by phase, per rank"):]
    phases = phases[:phases.index("</section>")]
    bars = re.findall(r'text-anchor="end"[^>]*>([^<]*)</text>', phases.split("<table>")[0])
    assert bars[0] == "median of 40" and bars[1:] == [f"rank {r}" for r in (*range(8), 12, 30)]
    listed = phases.split("<details>")[0]
    assert [int(r) for r in re.findall(r'<tr><td class="num">(\d+)</td>', listed)] == [*range(8), 12, 30]
    events = page[page.index("<h3>events</h3>"):page.index("<h3>events by name</h3>")]
    assert events.count("<td>ready</td>") == 16 and events.count("<td>late</td>") == 1  # 16 of a name, then others
    assert "24 more events not shown" in events


def test_a_heatmap_of_many_ranks_names_every_nth_row_and_each_slow_rank_and_the_table_lists_the_outliers() -> None:
    from telemetrain.report.html_tables import few_table
    from telemetrain.report.svg import heatmap

    rows = [f"rank {r}" + (" slow" if r == 77 else "") for r in range(256)]
    cells = [[0.02 * (1.75 if r == 77 else 1.0)] * 4 for r in range(256)]
    svg = heatmap("h", rows, cells, typical=0.02, columns=[(0, 9), (10, 19), (20, 29), (30, 39)])
    named = re.findall(r'text-anchor="end"[^>]*>(rank [^<]*)</text>', svg)
    assert "rank 77 slow" in named and "rank 0" in named and "rank 252" in named
    assert "rank 76" not in named and "rank 1" not in named  # (3 px a row: every 4th, none beside the slow one)
    y = {name: float(m) for m, name in re.findall(r'<text x="\d+" y="([\d.]+)" text-anchor="end"[^>]*>([^<]*)<', svg)}
    assert min(abs(a - b) for a, b in itertools.combinations(sorted(y.values()), 2)) >= 12  # no two overlap
    table_rows = [(r, 20 - (r == 200), "1.75x" if r == 77 else "") for r in range(256)]  # rank 200: fewest windows
    page = few_table(("rank", "windows", "slow"), table_rows, numeric=(0, 1), key=lambda row: row[1],
                     marked=lambda row: bool(row[2]), what="ranks", outliers="the slow")
    listed, folded = page.split("<details>")
    assert [int(r) for r in re.findall(r'<tr><td class="num">(\d+)</td>', listed)] == [*range(8), 77, 200]
    assert "246 more not listed" in listed and folded.count("<tr>") == 257


def test_a_heatmap_of_more_ranks_than_rows_draws_groups_of_ranks_at_their_highest_mean(
        session: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of ranks are not thousands of rows (a row each drew ~800,000 cells at 4,096 ranks x 200 columns):
    past MAX_HEATMAP_ROWS, each row is a group of consecutive ranks coloured by its highest mean, so that the slow
    rank's group shows it; the straggler marks land on that group's row; the table still lists every rank."""
    from telemetrain.report import html, many_ranks
    from telemetrain.report.svg import heatmap as svg_heatmap

    model = build_model(open_run(session[0]))
    heat = model.heatmap
    assert heat is not None and heat.ranks == list(range(WORLD))
    monkeypatch.setattr(many_ranks, "MAX_HEATMAP_ROWS", 2)
    page = html.render(model)
    svg = page[page.index('class="chart heatmap"'):]
    svg = svg[:svg.index("</svg>")]
    assert re.findall(r'text-anchor="end"[^>]*>([^<]*)</text>', svg) == ["ranks 0..1", "ranks 2..3 slow"]
    cells = [float(v) for v in re.findall(r"ranks \d\.\.\d(?: slow)?, iterations [^:]*: ([\d.]+) ms", svg)]
    expected = [max(v for v in col if v is not None) * 1000 for pair in (heat.cells[0:2], heat.cells[2:4])
                for col in zip(*pair, strict=True) if any(v is not None for v in col)]
    assert cells == pytest.approx(expected, rel=5e-3)  # (the cell's tooltip: 3 significant digits)
    flags = re.findall(r'class="flag" d="M[\d.]+,([\d.]+)L[^"]*"[^>]*><title>([^<]*)</title>', svg)
    assert flags and all(t.startswith(f"rank {SLOW_RANK}:") for _, t in flags)
    rows_y = [float(y) for y in re.findall(r'<rect x="[\d.]+" y="(\d+)"[^>]*><title>ranks 2\.\.3', svg)]
    assert {float(y) for y, _ in flags} and min(rows_y) <= min(float(y) for y, _ in flags)  # on the second row
    assert "each row is 2 consecutive ranks" in page
    # a group's longer name is not cut at the chart's left edge (an 11 px font: ~6 px a character at least)
    wide = svg_heatmap("h", ["ranks 0..63", "ranks 2016..2047 slow"], [[0.1], [0.2]], typical=0.1,
                       columns=[(0, 49)])
    x = {name: float(x) for x, name in re.findall(r'<text x="([\d.]+)"[^>]*text-anchor="end"[^>]*>([^<]*)<', wide)}
    assert x["ranks 2016..2047 slow"] >= 6 * len("ranks 2016..2047 slow")
    monkeypatch.undo()  # up to MAX_HEATMAP_ROWS ranks: a row each
    page = html.render(model)
    svg = page[page.index('class="chart heatmap"'):]
    assert re.findall(r'text-anchor="end"[^>]*>([^<]*)</text>', svg[:svg.index("</svg>")])[:4] == \
        ["rank 0", "rank 1", f"rank {SLOW_RANK} slow", "rank 3"]
    assert "each row is" not in page


@pytest.mark.parametrize("engine", ENGINES)
def test_checkpoints_of_many_ranks_are_one_row_a_step_naming_the_slowest_rank(
        tmp_path: Path, engine: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """20 ranks load a checkpoint (no step named) then save at iterations 10, 20 and 30: one row a checkpoint, with
    its ranks, median and slowest rank (rank 7 2.4 times the median at 20; rank 3's save at 30 failed), every span
    folded below. The steps are known for every span, also past those whose attributes the report keeps. ``show``
    names the longest save in a line."""
    monkeypatch.setenv("TELEMETRAIN_ENGINE", engine)
    monkeypatch.setattr("telemetrain.report.model.MAX_CHECKPOINT_SPANS", 10)
    monkeypatch.setattr("telemetrain.report.model_sql.MAX_CHECKPOINT_SPANS", 10)
    for rank in range(20):
        t = Telemetry(identity_from_env({}, run_id="ckpt", session_tag="s", rank=rank, world_size=20), store=tmp_path)
        tr, at = tracer(t), time.monotonic_ns() - 100 * 10**9
        tr.start("checkpoint_load", group="training", start_ns=at).end(end_ns=at + 10**9)
        for step in (10, 20, 30):
            at += 20 * 10**9
            seconds = 3.0 if (rank, step) == (7, 20) else 1.0 + 0.5 * (rank % 2)
            span = tr.start("checkpoint_save_sync", group="training", start_ns=at + rank * 10**6,
                            attributes={"current_iteration": step, "save_checkpoint_attempt_count": step // 10})
            failed = (rank, step) == (3, 30)
            span.end("error" if failed else None, end_ns=at + rank * 10**6 + round(seconds * 1e9))
            if not failed:
                t.event("save_checkpoint_success", {"current_iteration": step}, group="training")
        assert t.close()
    model = build_model(open_run(tmp_path / "s" / "ckpt"))
    assert len(model.checkpoints) == 80 and not model.checkpoints[-1].attributes  # (past the kept attributes)
    assert sorted((s.name, s.step) for s in model.checkpoints) == sorted(
        [("checkpoint_load", None)] * 20 + [("checkpoint_save_sync", s) for s in (10, 20, 30) for _ in range(20)])
    page = write_report(tmp_path / "s" / "ckpt", tmp_path / "p.html").read_text()
    section = page[page.index("<h3>checkpoints by step</h3>"):page.index("<h3>checkpoint spans</h3>")]
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr><td.*?</tr>", section)]
    assert [row[1:] for row in rows] == [
        ["checkpoint_load", "-", "20", "1 s", "1 s", "0", "1.00x", "0"],
        ["checkpoint_save_sync", "10", "20", "1.25 s", "1.5 s", "1", "1.20x", "0"],
        ["checkpoint_save_sync", "20", "20", "1.25 s", "3 s", "7", "2.40x", "0"],
        ["checkpoint_save_sync", "30", "20", "1.25 s", "1.5 s", "1", "1.20x", "1"]]
    spans = page[page.index("<h3>checkpoint spans</h3>"):]
    assert spans.index("<details><summary>every span (80)</summary>") < spans.index("<table>")
    assert "<td>None" not in page  # (the session's one run trained no iteration: a dash, not None..None)
    bars = re.findall(r"<rect [^>]*><title>(run [^<]*)</title>", page)  # the session's runs' bars' tooltips
    assert len(bars) == 1 and bars[0] == "run ckpt: no_training, no iteration", bars
    successes = page[page.index("<h3>save_checkpoint_success</h3>"):]
    assert successes.index("<details><summary>every event (59)</summary>") < successes.index("<table>")
    assert main(["show", str(tmp_path / "s" / "ckpt")]) == 0  # show says the same in one line
    assert ("\ncheckpoints 3 save(s), 60 span(s) on the ranks, mean 1.275 s; the longest: step 20 on rank 7, 3.000 s "
            "(that save's mean 1.325 s); 1 not ok\n") in capsys.readouterr().out


def test_the_straggler_reports_of_many_ranks_list_the_first_and_the_outliers_then_fold() -> None:
    """A slow node of many ranks (or thousands of ranks) was a row per (rank, phase) in the page, in string order."""
    from telemetrain.report import html
    from telemetrain.report.model import ReportModel

    model = ReportModel(path=Path("r"), meta={}, run_id="r", session_tag="s", perf_tag="p", start_ns=0, end_ns=1,
                        processes=[], agents=[])
    model.stragglers = [{"rank": r, "host": f"node{r // 8}", "phase": "backward", "kind": "relative",
                         "score": 1.5 + r / 100, "step": step, "threshold": 1.3}
                        for r in range(40) for step in range(1 + (r == 33))]  # rank 33: two reports
    section = html._stragglers_table(model)
    listed, folded = section.split("<details>")
    assert [int(r) for r in re.findall(r"<tr><td>(\d+)</td>", listed)] == [*range(8), 33]
    assert "31 more not listed above" in listed
    assert [int(r) for r in re.findall(r"<tr><td>(\d+)</td>", folded)] == list(range(40))  # by rank, as numbers
