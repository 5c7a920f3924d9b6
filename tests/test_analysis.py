"""``telemetrain compare``, ``goodput`` and ``tail`` (``telemetrain.analysis``) on real run stores.

The runs are written by real ``Telemetry`` instances (one per rank) and real ``TrainingRecorder``s driven with explicit
``*_time_msec`` times: each iteration is timed as four sub-phase spans (data loading, forward, backward, optimizer)
whose durations are drawn with a seeded generator (5% coefficient of variation, plus rare 3x spikes), so a planted
problem -- a slow phase, a slow rank, a 15% regression -- is known exactly while the noise is realistic.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import pytest

from telemetrain import Telemetry, cli, identity_from_env, span_lifecycle
from telemetrain.analysis import PerfTagMismatch, bootstrap_ratio, commands, compare_runs, run_samples
from telemetrain.analysis.compare import IMPROVEMENT, INCONCLUSIVE, NO_CHANGE, ONE_VALUE, REGRESSION, decide
from telemetrain.analysis.compare_html import comparison_html
from telemetrain.analysis.compare_text import format_comparison
from telemetrain.analysis.tail import FileFollower, TailState, run_tail
from telemetrain.training import SpanName, TrainingRecorder, TrainingTelemetryConfig
from telemetrain.training.goodput import goodput_by_rank

BASE_MS = 1_700_000_000_000
PHASE_SPANS = {"dataloader": SpanName.DATA_LOADING.value, "forward": SpanName.MODEL_FORWARD.value,
               "backward": SpanName.MODEL_BACKWARD.value, "optimizer": SpanName.OPTIMIZER_UPDATE.value}
PHASE_MS = {"dataloader": 10.0, "forward": 30.0, "backward": 45.0, "optimizer": 15.0}  # 100 ms an iteration


class RankSim:
    """One rank of one run on an explicit timeline (``now``: ms after BASE_MS)."""

    def __init__(self, root: Path, run_id: str, *, rank: int, world_size: int, perf_tag: str, session: str,
                 log_every: int, now: float = 0.0, restart_count: int = 0) -> None:
        identity = identity_from_env({}, run_id=run_id, session_tag=session, perf_tag=perf_tag, rank=rank,
                                     local_rank=rank, world_size=world_size, restart_count=restart_count)
        self.t = Telemetry(identity, store=root)
        config = TrainingTelemetryConfig(global_batch_size_or_fn=32, log_every_n_train_iterations=log_every,
                                         perf_tag_or_fn=perf_tag)
        self.r = TrainingRecorder(config, telemetry=self.t)
        self.now = now
        self.step = 0

    def mono(self, at: float) -> int:
        return round((BASE_MS + at) * 1e6) - self.t.wall_offset_ns

    def start(self, iteration: int = 0, *, load_ms: float = 0.0) -> RankSim:
        self.r.on_app_start(BASE_MS + self.now)
        self.r.on_model_init_start(BASE_MS + self.now)
        self.now += 500
        self.r.on_model_init_end(BASE_MS + self.now)
        if load_ms:
            self.r.on_load_checkpoint_start(BASE_MS + self.now)
            self.now += load_ms
            self.r.on_load_checkpoint_end(BASE_MS + self.now)
        self.step = iteration
        self.r.on_train_start(iteration, start_time_msec=BASE_MS + self.now)
        return self

    def iteration(self, phase_ms: dict[str, float]) -> None:
        self.r.on_training_single_iteration_start(BASE_MS + self.now)
        for phase, ms in phase_ms.items():
            s = self.r.tracer.start(PHASE_SPANS[phase], group="training", start_ns=self.mono(self.now))
            self.now += ms
            s.end(end_ns=self.mono(self.now))
        self.r.on_training_single_iteration_end(BASE_MS + self.now)
        self.now += 1.0  # between iterations
        self.step += 1

    def save(self, ms: float = 200.0) -> None:
        self.r.on_save_checkpoint_start(self.step, BASE_MS + self.now)
        self.r.on_save_checkpoint_success(self.step, BASE_MS + self.now + ms)
        self.r.on_save_checkpoint_end(BASE_MS + self.now + ms)
        self.now += ms

    def finish(self) -> None:
        self.r.on_train_end(BASE_MS + self.now)
        self.r.on_app_end(BASE_MS + self.now + 10)
        assert self.t.close()

    def die(self) -> None:
        """Exit now without ending anything (SIGTERM): open spans end as terminated at this simulated moment."""
        at = self.mono(self.now)
        with mock.patch.object(span_lifecycle, "_mono", lambda: at):
            assert self.t.close()


def noisy(rng: random.Random, ms: float, cv: float = 0.05) -> float:
    """``ms`` with a 5% coefficient of variation (log-normal) and a rare 3x spike (a GC pause, a slow batch)."""
    sigma = math.sqrt(math.log1p(cv * cv))
    value = ms * rng.lognormvariate(-sigma * sigma / 2, sigma)
    return value * 3 if rng.random() < 0.005 else value


def make_run(root: Path, run_id: str, *, seed: int, perf_tag: str = "gpt-tiny", session: str = "cmp",
             ranks: int = 2, iterations: int = 300, log_every: int = 10, scale: float = 1.0,
             phase_scale: dict[str, float] | None = None, rank_scale: dict[int, float] | None = None) -> Path:
    """A finished run of ``ranks`` ranks; ``scale`` slows every phase, ``phase_scale`` one phase, ``rank_scale`` one
    rank."""
    for rank in range(ranks):
        rng = random.Random(f"{seed}/{rank}")
        sim = RankSim(root, run_id, rank=rank, world_size=ranks, perf_tag=perf_tag, session=session,
                      log_every=log_every).start()
        factor = scale * (rank_scale or {}).get(rank, 1.0)
        for _ in range(iterations):
            sim.iteration({p: noisy(rng, ms * factor * (phase_scale or {}).get(p, 1.0)) for p, ms in PHASE_MS.items()})
        sim.finish()
    return root / session / run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Runs shared by the comparison tests: three clean baselines of the same distribution and planted problems."""
    root = tmp_path_factory.mktemp("store")
    return {
        "base": make_run(root, "base", seed=1),
        "clean1": make_run(root, "clean1", seed=2),
        "clean2": make_run(root, "clean2", seed=3),
        "clean3": make_run(root, "clean3", seed=4),
        "regressed": make_run(root, "regressed", seed=5, scale=1.15),
        "slow_phase": make_run(root, "slow_phase", seed=6, phase_scale={"forward": 1.4}),
        "slow_rank": make_run(root, "slow_rank", seed=7, rank_scale={1: 1.3}),
        "faster": make_run(root, "faster", seed=8, scale=0.85),
    }


def run_cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- the statistics ----------------------------------------------------------------------------------------------------


def test_bootstrap_ratio_is_seeded_and_brackets_the_estimate() -> None:
    rng = random.Random(0)
    baseline = [100 * rng.lognormvariate(0, 0.02) for _ in range(60)]
    candidate = [v * 1.15 for v in baseline]  # exactly 15% slower, window by window
    ratio, low, high = bootstrap_ratio(candidate, baseline, seed=7)
    assert ratio == pytest.approx(1.15)
    assert low <= ratio <= high and high - low < 0.03
    assert bootstrap_ratio(candidate, baseline, seed=7) == (ratio, low, high)
    assert bootstrap_ratio(candidate, baseline, seed=8) != (ratio, low, high)
    # a higher confidence widens the interval
    _, low99, high99 = bootstrap_ratio(candidate, baseline, seed=7, confidence=0.99)
    assert low99 <= low and high99 >= high and (low99, high99) != (low, high)
    with pytest.raises(ValueError, match="both sides"):
        bootstrap_ratio([], baseline)


@pytest.mark.parametrize(("low", "high", "higher_is_better", "expected"), [
    (1.10, 1.20, False, REGRESSION),
    (0.80, 0.90, False, IMPROVEMENT),
    (1.02, 1.20, False, NO_CHANGE),  # straddles 1 + min_effect: not sure it is a 3% change
    (0.99, 1.01, False, NO_CHANGE),
    (0.80, 0.90, True, REGRESSION),  # throughput down
    (1.10, 1.20, True, IMPROVEMENT),
])
def test_decision_rule(low: float, high: float, higher_is_better: bool, expected: str) -> None:
    assert decide(low, high, higher_is_better=higher_is_better, min_effect=0.03) == expected


# -- compare: planted problems -----------------------------------------------------------------------------------------


def test_a_15_percent_regression_is_flagged_with_its_size(store: dict[str, Path]) -> None:
    comparison = compare_runs(store["regressed"], store["base"])
    [result] = comparison.candidates
    it = result.metric("iteration_time")
    assert it is not None and it.verdict == REGRESSION
    assert it.change == pytest.approx(0.15, abs=0.02)
    assert it.ci_low > 1.03 and it.ci_low <= it.ratio <= it.ci_high
    throughput = result.metric("samples_per_second")
    assert throughput is not None and throughput.verdict == REGRESSION
    assert throughput.change == pytest.approx(1 / 1.15 - 1, abs=0.02)
    assert {m.label for _, m in comparison.regressions} >= {"iteration time", "throughput"}
    assert not comparison.improvements


def test_the_text_says_how_many_spans_the_percentiles_are_of_and_why_a_small_phase_is_no_change(
        store: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """2 ranks x 300 iterations, one in 10 exported: p50/p99 of 60 spans, said; the data loader (10 of 100 ms) 15%
    slower clears 3% on its own but adds 1.5 ms to the step: the row says why it is no change, as the page does."""
    code, out, _ = run_cli("compare", str(store["regressed"]), "--baseline", str(store["base"]), capsys=capsys)
    assert code == 0
    assert out.count("ranks 0..1; 60 sampled iterations, p50 ") == 2, out
    [row] = [line for line in out.splitlines() if line.strip().startswith("dataloader phase")]
    assert row.endswith("no significant change (changed by less than 3% of the iteration time)"), row
    # the simulated phases sum to the step: its rest is rounding residue (a few ns) in both runs, not a change
    assert "rest of the step" not in out


def test_clean_pairs_raise_no_regression(store: dict[str, Path]) -> None:
    """Same distribution, different seeds: nothing significant, in any metric, phase or rank."""
    comparison = compare_runs([store["clean1"], store["clean2"], store["clean3"]], store["base"])
    assert len(comparison.candidates) == 3
    for result in comparison.candidates:
        # run-level (and goodput), phases (the simulated phases make the whole step: no rest of it), ranks, each
        # rank's phases
        scopes = [m.scope for m in result.metrics]
        assert (scopes.count("run"), scopes.count("phase"), scopes.count("rank"), scopes.count("rank phase")) == \
            (3, 4, 2, 8)
        # goodput is shown, one value per run: not tested
        assert [m.label for m in result.metrics if m.verdict not in (NO_CHANGE, ONE_VALUE)] == [], \
            result.candidate.run_id
        it = result.metric("iteration_time")
        assert it is not None and abs(it.change) < 0.02
    assert not comparison.regressions and not comparison.improvements


def test_a_slow_phase_is_named(store: dict[str, Path]) -> None:
    [result] = compare_runs(store["slow_phase"], store["base"]).candidates
    flagged = {m.label: m for m in result.regressions}
    assert "forward phase" in flagged
    assert flagged["forward phase"].change == pytest.approx(0.40, abs=0.05)
    for phase in ("dataloader", "backward", "optimizer"):
        m = result.metric(phase)
        assert m is not None and m.verdict == NO_CHANGE, phase
    assert "iteration time" in flagged  # 30 ms of 100 ms, 40% slower: +12%


def test_a_slow_rank_is_named(store: dict[str, Path]) -> None:
    [result] = compare_runs(store["slow_rank"], store["base"]).candidates
    rank1, rank0 = result.metric("iteration_time", rank=1), result.metric("iteration_time", rank=0)
    assert rank1 is not None and rank1.verdict == REGRESSION and rank1.change == pytest.approx(0.30, abs=0.04)
    assert rank0 is not None and rank0.verdict == NO_CHANGE
    assert "rank 1 iteration time" in {m.label for m in result.regressions}


def test_an_improvement_is_not_a_regression(store: dict[str, Path]) -> None:
    [result] = compare_runs(store["faster"], store["base"]).candidates
    assert not result.regressions
    it = result.metric("iteration_time")
    assert it is not None and it.verdict == IMPROVEMENT and it.change == pytest.approx(-0.15, abs=0.02)


def test_windows_exclude_warmup_and_are_averaged_over_ranks(store: dict[str, Path], engine: str) -> None:
    samples = run_samples(store["base"])
    # 300 iterations, a report every 10: 30 windows per rank, the first (warm-up) left out
    assert samples.skipped_windows == 2 and samples.window_count == 2 * 29
    if engine == "python":
        assert min(w.iteration for w in samples.windows) == 19
        assert set(samples.iteration_spans) == {0, 1}  # one in 10 iterations exported
    assert samples.iteration_percentiles() is not None
    assert len(samples.series("iteration_time")) == 29
    assert len(samples.series("iteration_time", rank=1)) == 29
    assert samples.series("iteration_time")[0] == pytest.approx(
        (samples.series("iteration_time", rank=0)[0] + samples.series("iteration_time", rank=1)[0]) / 2)
    assert 0.095 < samples.series("iteration_time")[5] < 0.106  # ~100 ms an iteration


def test_too_few_windows_is_said_not_guessed(tmp_path: Path, store: dict[str, Path]) -> None:
    """A run without training reports, and one with a handful: insufficient data or a note, never a verdict from
    nothing."""
    identity = identity_from_env({}, run_id="no-training", session_tag="cmp", perf_tag="gpt-tiny", rank=0,
                                 local_rank=0, world_size=1)
    with Telemetry(identity, store=tmp_path) as t:
        t.metric("loss", 0.5)
    short = make_run(tmp_path, "short", seed=3, ranks=2, iterations=60)  # 6 reports a rank, 5 after warm-up
    comparison = compare_runs([tmp_path / "cmp" / "no-training", short], store["base"])
    empty, few = comparison.candidates
    assert {m.verdict for m in empty.metrics} == {"insufficient data"} and empty.metrics[0].candidate_windows == 0
    assert any("0 steady-state report window(s)" in n for n in empty.notes)
    # no window at all: global_batch_size is not why throughput went uncompared (the note above says why)
    assert not any("global_batch_size" in n for n in empty.notes)
    assert not any("global_batch_size" in n for n in few.notes)  # (its windows carry samples_per_second)
    assert any("only 5 report windows; the interval is coarse" in n for n in few.notes)
    assert not comparison.regressions
    text = "\n".join(format_comparison(comparison)).split("\ncandidate  ")
    assert "nothing tested: every row had too little data" in text[1]  # no claim of a test that never ran
    assert "no significant change (none beyond" not in text[1]
    assert "nothing tested" not in text[2] and "no significant change (none beyond" in text[2]


# -- compare: the command ----------------------------------------------------------------------------------------------


def test_cli_names_each_regression_and_writes_html(store: dict[str, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "cmp.html"
    code, out, err = run_cli("compare", str(store["regressed"]), str(store["slow_phase"]), str(store["slow_rank"]),
                             "--baseline", str(store["base"]), "--html", str(page), "--fail-on-regression",
                             capsys=capsys)
    assert code == 1, err
    blocks = out.split("\ncandidate  ")
    assert len(blocks) == 4
    regressed, slow_phase, slow_rank = blocks[1:]
    assert regressed.startswith("regressed") and "REGRESSION" in regressed
    assert "regression(s):\n    iteration time +1" in regressed and "95% CI" in regressed
    assert "forward phase +4" in slow_phase.split("regression(s):")[1]
    assert "rank 1 iteration time +" in slow_rank.split("regression(s):")[1]
    assert "rank 0 iteration time" not in slow_rank.split("regression(s):")[1]
    assert "slower ranks: rank 1 +" in slow_rank and "(the other 1 rank(s): no regression)" in slow_rank
    assert "slower phases, by time added per iteration: forward +" in slow_phase
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "http" not in text.replace("http-equiv", "")
    assert "forward phase" in text and "regression" in text


def test_cli_clean_pair_exits_zero_even_when_failing_on_regressions(store: dict[str, Path],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli("compare", str(store["clean1"]), "--baseline", str(store["base"]), "--fail-on-regression",
                           capsys=capsys)
    assert code == 0
    assert "REGRESSION" not in out and "no significant change (none beyond +/-3% with 95% confidence)" in out
    code, out, _ = run_cli("compare", str(store["clean1"]), "--baseline", str(store["base"]), "--json", capsys=capsys)
    data = json.loads(out)
    assert data["baseline"]["run_id"] == "base" and data["candidates"][0]["regressions"] == []
    assert data["min_effect"] == 0.03 and data["confidence"] == 0.95


def test_perf_tags_must_match_unless_forced(tmp_path: Path, store: dict[str, Path],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    other = make_run(tmp_path, "other", seed=9, perf_tag="llama-7b", ranks=1, iterations=60)
    code, _, err = run_cli("compare", str(other), "--baseline", str(store["base"]), capsys=capsys)
    assert code == 2
    assert "perf_tag differs" in err and "'llama-7b'" in err and "'gpt-tiny'" in err and "--force" in err
    with pytest.raises(PerfTagMismatch):
        compare_runs(other, store["base"])
    code, out, _ = run_cli("compare", str(other), "--baseline", str(store["base"]), "--force", capsys=capsys)
    assert code == 0 and "compared anyway (forced)" in out
    assert "ranks in only one of the runs, not compared per rank: 1" in out


def test_perf_tag_picks_the_newest_other_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = make_run(tmp_path, "a-old", seed=1, ranks=1, iterations=40, session="s1")
    newer = make_run(tmp_path, "b-newer", seed=2, ranks=1, iterations=40, session="s2")
    make_run(tmp_path, "c-other-tag", seed=3, ranks=1, iterations=40, perf_tag="other", session="s3")
    candidate = make_run(tmp_path, "d-candidate", seed=4, ranks=1, iterations=40, session="s4")
    # runs are ordered by creation time: the newest other run with the tag is b-newer, not the other-tag or itself
    code, out, err = run_cli("compare", str(candidate), "--perf-tag", "gpt-tiny", capsys=capsys)
    assert code == 0, err
    assert f"baseline: {newer}" in err and "baseline   b-newer" in out
    code, out, err = run_cli("compare", str(candidate), capsys=capsys)  # default: the candidate's own tag
    assert code == 0 and "baseline   b-newer" in out
    code, out, err = run_cli("compare", str(newer), str(candidate), "--root", str(tmp_path), capsys=capsys)
    assert code == 0 and "baseline   a-old" in out and str(old) in out
    code, _, err = run_cli("compare", str(candidate), "--perf-tag", "nobody", capsys=capsys)
    assert code == 2 and "no other run with perf_tag 'nobody'" in err


def test_html_escapes_what_the_runs_wrote(tmp_path: Path) -> None:
    tag = "<img src=x onerror=alert(1)>"
    a = make_run(tmp_path, "a<b>&", seed=1, ranks=1, iterations=40, perf_tag=tag)
    b = make_run(tmp_path, "b", seed=2, ranks=1, iterations=40, perf_tag=tag)
    page = comparison_html(compare_runs(a, b))
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "a&lt;b&gt;&amp;" in page and "a<b>" not in page


def test_html_renders_in_chromium(store: dict[str, Path], tmp_path: Path) -> None:
    """The page as a browser builds it: one table per candidate, a row per metric, the verdict in each."""
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.skip("chromium not installed")
    page = tmp_path / "cmp.html"
    page.write_text(comparison_html(compare_runs([store["regressed"], store["clean1"]], store["base"])))
    proc = subprocess.run([str(chromium), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                           page.as_uri()], capture_output=True, text=True, timeout=60)
    dom = proc.stdout
    assert dom.count("<table>") == 2, proc.stderr[-2000:]
    # everything slowed 15% in the regressed run: run-level, ranks, and the phases whose 15% adds at least 3% of the
    # 100 ms step (forward, backward; the 10 ms data loader and 15 ms optimizer add 1.5 and 2.25 ms), run and ranks
    assert dom.count("<tr class=\"regression\">") >= 2 + 2 + 2 + 4
    assert "regressed: 10 regression(s)" in dom and "clean1: no regression" in dom


class Terminal(io.StringIO):
    """stderr as a terminal (rich draws on anything that says it is one)."""

    def isatty(self) -> bool:
        return True


def test_long_loads_show_progress_on_a_terminal(store: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "_PROGRESS_FROM_BYTES", 0)  # every load counts as long
    err, out = Terminal(), io.StringIO()
    args = cli.build_parser().parse_args(["compare", str(store["clean1"]), "--baseline", str(store["base"])])
    assert args.run(args, out, err) == 0
    assert "loading runs" in err.getvalue() and "no significant change" in out.getvalue()
    err = Terminal()
    args = cli.build_parser().parse_args(["goodput", str(store["base"])])
    assert args.run(args, out, err) == 0
    assert "reading the session" in err.getvalue()
    quiet = io.StringIO()  # not a terminal: nothing drawn
    args = cli.build_parser().parse_args(["compare", str(store["clean1"]), "--baseline", str(store["base"])])
    assert args.run(args, out, quiet) == 0 and quiet.getvalue() == ""


def test_bench_compare_quick(tmp_path: Path) -> None:
    """bench/bench_compare.py runs end to end (small) and writes its table and JSON (timings are not asserted)."""
    script = Path(__file__).resolve().parents[1] / "bench" / "bench_compare.py"
    out_json = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(script), "--ranks", "2", "--iterations", "1000", "--repeats", "1",
                           "--json", str(out_json)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "telemetrain compare --json" in proc.stdout
    data = json.loads(out_json.read_text())
    assert data["windows"] == 2 * 2 * 19 and len(data["results"]) == 3
    assert all(math.isfinite(r["median_s"]) and r["median_s"] > 0 for r in data["results"])


# -- errors ------------------------------------------------------------------------------------------------------------


def test_missing_and_foreign_directories_are_one_line_errors(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8")
    for argv in (["compare", str(tmp_path / "nope")], ["compare", str(foreign)], ["goodput", str(tmp_path / "nope")],
                 ["goodput", str(foreign)]):
        _assert_one_line_directory_error(argv, capsys)


def test_tail_on_missing_and_foreign_directories_is_a_one_line_error(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """(Without rich, tail says that first: test_tail_without_rich_says_how_to_install.)"""
    pytest.importorskip("rich", reason="tail draws its view with rich (the [report] extra)")
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8")
    for argv in (["tail", "--once", str(foreign)], ["tail", "--once", str(tmp_path / "x")]):
        _assert_one_line_directory_error(argv, capsys)


def _assert_one_line_directory_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(*argv, capsys=capsys)
    assert code == 2, argv
    assert err.startswith("telemetrain: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert "no such directory" in err or "not a telemetrain" in err, err


def test_bad_settings_are_usage_errors(store: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli("compare", str(store["clean1"]), "--baseline", str(store["base"]), "--confidence", "1.5",
                           capsys=capsys)
    assert code == 2 and "--confidence must be between 0 and 1" in err
    code, _, err = run_cli("compare", str(store["clean1"]), "--baseline", str(store["clean1"]), capsys=capsys)
    assert code == 2 and "also a candidate" in err
    with pytest.raises(ValueError, match="min_effect"):
        compare_runs(store["clean1"], store["base"], min_effect=2)


# -- a crash and a restart: goodput, and compare on the restarted run --------------------------------------------------


def make_restarted_session(root: Path) -> Path:
    """Attempt 0 saves at iteration 100, runs 40 more and is killed by SIGTERM; attempt 1 loads the checkpoint,
    resumes at 100 and finishes at 300."""
    rng = random.Random(11)
    a = RankSim(root, "job.0", rank=0, world_size=1, perf_tag="gpt-tiny", session="job", log_every=10).start()
    for _ in range(100):
        a.iteration({p: noisy(rng, ms) for p, ms in PHASE_MS.items()})
    a.save()
    for _ in range(40):
        a.iteration({p: noisy(rng, ms) for p, ms in PHASE_MS.items()})
    a.die()
    b = RankSim(root, "job.1", rank=0, world_size=1, perf_tag="gpt-tiny", session="job", log_every=10,
                now=a.now + 30_000, restart_count=1).start(100, load_ms=300)
    for _ in range(200):
        b.iteration({p: noisy(rng, ms) for p, ms in PHASE_MS.items()})
    b.save()
    b.finish()
    return root / "job"


def test_goodput_of_a_crash_and_restart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    session = make_restarted_session(tmp_path)
    code, out, err = run_cli("goodput", str(session), capsys=capsys)
    assert code == 0, err
    assert "iterations  300 productive, 40 lost" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("  0  ") or line.startswith("  1  ")]
    assert rows[0][:5] == ["0", "job.0", "crash", "0..139", "step"]
    assert rows[1][:5] == ["1", "job.1", "finished", "100..299", "step"]
    assert "badput lost_progress" in out and "badput checkpoint_load" in out
    # a run directory stands for its session; --json is the library's report
    code, out, _ = run_cli("goodput", str(session / "job.1"), "--json", "--by-rank", capsys=capsys)
    data = json.loads(out)
    assert data["session_tag"] == "job" and data["lost_iterations"] == 40 and len(data["runs"]) == 2
    assert data["badput"]["lost_progress"] > 3.9 and set(data["by_rank"]) == {"0"}
    assert data["productive_seconds"] + data["badput_seconds"] == pytest.approx(data["wall_seconds"])
    code, _, err = run_cli("goodput", str(session), "--rank", "3", capsys=capsys)
    assert code == 2 and "rank" in err
    make_run(session.parent, "other.0", seed=1, session="other", ranks=1, iterations=20)
    code, _, err = run_cli("goodput", str(session.parent), capsys=capsys)  # a folder of two sessions
    assert code == 2 and "2 sessions" in err


def test_goodput_by_rank_lists_the_lowest_ranks_past_max_rows(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Thousands of ranks must not print thousands of rows: past --max-rows the ranks of lowest goodput, and the
    spread of all; --max-rows 0 and --json keep every rank."""
    run = make_run(tmp_path, "wide", seed=7, ranks=5, iterations=40, rank_scale={3: 1.4})
    code, out, err = run_cli("goodput", str(run), "--json", "--by-rank", capsys=capsys)
    assert code == 0, err
    by_rank = {int(r): v["goodput"] for r, v in json.loads(out)["by_rank"].items()}
    assert len(by_rank) == 5
    lowest = sorted(by_rank, key=lambda r: (by_rank[r], r))[:2]
    code, out, err = run_cli("goodput", str(run), "--by-rank", "--max-rows", "2", capsys=capsys)
    assert code == 0, err
    section = out[out.index("by rank"):].splitlines()
    assert "the 2 lowest of 5 ranks" in section[0]
    listed = [int(line.split()[0]) for line in section[2:] if line.split() and line.split()[0].isdigit()]
    assert listed == sorted(lowest)
    assert f"lowest: rank {lowest[0]} at {by_rank[lowest[0]]:.1%}" in out and "over 5 ranks" in out
    code, out, _ = run_cli("goodput", str(run), "--by-rank", "--max-rows", "0", capsys=capsys)
    section = out[out.index("by rank"):].splitlines()
    assert [int(line.split()[0]) for line in section[2:] if line.split() and line.split()[0].isdigit()] == \
        list(range(5))
    code, _, err = run_cli("goodput", str(run), "--by-rank", "--max-rows", "-1", capsys=capsys)
    assert code == 2 and "--max-rows" in err


def test_compare_across_a_restart(tmp_path: Path) -> None:
    """The restarted attempt against a clean run of the same workload: no regression; the killed attempt compares
    too (its windows up to the crash)."""
    session = make_restarted_session(tmp_path)
    base = make_run(tmp_path, "base", seed=1, ranks=1, iterations=300)
    comparison = compare_runs([session / "job.1", session / "job.0"], base)
    restarted, killed = comparison.candidates
    assert restarted.candidate.windows == 19 and killed.candidate.windows >= 12
    assert not comparison.regressions


def test_compare_of_many_ranks_lists_the_ranks_that_changed_and_counts_the_others(tmp_path: Path) -> None:
    """40 ranks, the same iterations in both runs but rank 7's, 30% slower in the candidate: the run lines name the
    ranks as a range, the table and the page list rank 7's row and count the 39 that did not change (a row each
    would be 40 rows here, 1,024 on a big job), and the slower-ranks line names rank 7 alone."""
    base = make_run(tmp_path, "b40", seed=11, ranks=40, iterations=60)
    slow = make_run(tmp_path, "c40", seed=11, ranks=40, iterations=60, rank_scale={7: 1.3})
    comparison = compare_runs([slow], base)
    [candidate] = comparison.candidates
    assert sum(m.scope == "rank" for m in candidate.metrics) == 40  # every rank compared: --json has them all
    text = "\n".join(format_comparison(comparison))
    assert "ranks 0..39" in text and "ranks 0, 1" not in text
    assert "rank 7 iteration time" in text and "rank 8 iteration time" not in text
    assert "(39 per-rank row(s) with no significant change not shown; --json has them)" in text
    assert re.search(r"slower ranks: rank 7 \+\d+(\.\d+)?% \(the other 39 rank\(s\): no regression\)", text), text
    page = comparison_html(comparison)
    assert "ranks 0..39" in page and "<td>rank 7 iteration time</td>" in page
    assert "<td>rank 8 iteration time</td>" not in page and "39 per-rank row(s) with no significant change" in page


# -- the demo's runs ---------------------------------------------------------------------------------------------------


def test_compare_and_goodput_on_the_demo(launched_demo: tuple[Path, subprocess.CompletedProcess[str]],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``telemetrain demo`` writes a session of two attempts (a simulated preemption, then a restart). Rank 1's first
    attempt is preempted (SIGTERM: killed); rank 0's ends by whichever comes first, gloo's lost peer (a crash) or the
    agent's closing SIGTERM (killed: on a busy machine). Either way its loop ended and reported its last iterations:
    compare shows goodput (only a loop that never ended, a SIGKILL, leaves it out)."""
    root, proc = launched_demo
    assert proc.returncode == 0, proc.stderr[-3000:]
    [session] = [p for p in root.iterdir() if p.is_dir()]
    first, second = sorted(p for p in session.iterdir() if p.is_dir())
    code, out, err = run_cli("compare", str(second), "--baseline", str(first), "--json", capsys=capsys)
    assert code == 0, err
    [result] = json.loads(out)["candidates"]
    labels = [m["label"] for m in result["metrics"]]
    assert labels[:2] == ["iteration time", "throughput"] and "backward phase" in labels
    # the demo's two attempts ran on whatever machine this is: a busy one makes changes inconclusive
    assert all(m["verdict"] in (REGRESSION, IMPROVEMENT, NO_CHANGE, INCONCLUSIVE, ONE_VALUE, "insufficient data")
               for m in result["metrics"])
    assert next(m for m in result["metrics"] if m["label"] == "goodput")["verdict"] == ONE_VALUE
    assert not [n for n in result["notes"] if "has not ended" in n or "goodput not compared" in n], result["notes"]
    code, out, err = run_cli("goodput", str(session), capsys=capsys)
    assert code == 0, err
    assert "attempts (2, in restart order)" in out and "finished" in out
    statuses = {rank: [r.status for r in report.runs] for rank, report in goodput_by_rank(session).items()}
    assert statuses[1] == ["killed", "finished"] and statuses[0][1] == "finished", statuses
    assert statuses[0][0] in ("crash", "killed"), statuses


# -- tail --------------------------------------------------------------------------------------------------------------


def test_tail_counts_the_spans_that_ended_not_ok_by_their_own_status(tmp_path: Path) -> None:
    """A span's own status decides, not an attribute named ``status``: polling reads the failed save whose
    attributes say ok and skips the ok one whose attributes say error; the SQL catch-up counts the same."""
    from telemetrain.spans import tracer

    t = Telemetry(identity_from_env({}, run_id="spans", session_tag="s"), store=tmp_path)
    spans = tracer(t)
    for own, attribute in (("error", "ok"), ("ok", "error")):
        span = spans.start("checkpoint_save_sync", group="training")
        span.set_attribute("status", attribute)  # (an end attribute: on the span end's line)
        span.end(own, "disk full" if own == "error" else "")
    spans.start("step", group="user").end("terminated")
    assert t.close()
    polled = TailState(tmp_path / "s" / "spans")
    polled.poll()
    assert polled.spans_not_ok == 2
    assert [(e[2], e[3], e[4]) for e in polled.recent] == [
        ("error", "span training/checkpoint_save_sync", "error: disk full"),
        ("warning", "span user/step", "terminated")]
    if importlib.util.find_spec("duckdb") is not None:
        from telemetrain.store.engine import Engine

        caught = TailState(tmp_path / "s" / "spans")
        with Engine([caught.path]) as engine:
            caught.catch_up(engine)
        assert (caught.spans_not_ok, caught.records, list(caught.recent)) == (2, polled.records, list(polled.recent))


def test_follower_holds_back_a_torn_line(tmp_path: Path) -> None:
    run = make_run(tmp_path, "r", seed=1, ranks=1, iterations=30)
    [src] = run.glob("rank-*.jsonl")
    data = src.read_bytes()
    target = tmp_path / "copy" / src.name
    target.parent.mkdir()
    cut = data.index(b'"name":"training_metrics_update"') + 10  # inside the first report's line
    target.write_bytes(data[:cut])
    follower = FileFollower(target, {})
    before = follower.poll()
    assert not any(getattr(r, "name", "") == "training_metrics_update" for r in before)
    assert follower.pending and follower.corrupt == 0
    with open(target, "ab") as fh:
        fh.write(data[cut:])
    after = follower.poll()
    updates = [r for r in after if r.name == "training_metrics_update"]
    assert [u.attributes["current_iteration"] for u in updates] == [9, 19, 29]
    assert follower.pending == b"" and follower.poll() == []
    assert follower.identity is not None and follower.identity.rank == 0


def test_follower_counts_a_cut_line_of_a_kind_it_does_not_decode(tmp_path: Path) -> None:
    """A line cut short (the writer killed mid-line, the file reopened after it) was counted as corrupt only when its
    kind was one tail decodes; the SQL catch-up counts every one."""
    run = make_run(tmp_path, "r", seed=1, ranks=1, iterations=30)
    [src] = run.glob("rank-*.jsonl")
    data = src.read_bytes()
    start = data.index(b'{"v":2,"kind":"span_start"')
    cut = data[:start + 40] + b"\n" + data[start:]  # the span_start line, cut, then written whole
    target = tmp_path / "copy" / "s" / "r" / src.name
    target.parent.mkdir(parents=True)
    target.write_bytes(cut)
    follower = FileFollower(target, {})
    follower.poll()
    assert follower.corrupt == 1
    if importlib.util.find_spec("duckdb") is not None:
        from telemetrain.store.engine import Engine

        caught = TailState(target.parent)
        with Engine([caught.path]) as engine:
            caught.catch_up(engine)
        assert caught.corrupt == 1


def test_tail_once_follows_a_live_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A thread trains (real time) and flushes; ``tail --once`` shows its progress while it runs, then its end."""
    pytest.importorskip("rich", reason="tail draws its view with rich (the [report] extra)")
    identity = identity_from_env({}, run_id="live", session_tag="s", perf_tag="live-tag", rank=0, local_rank=0,
                                 world_size=1)
    t = Telemetry(identity, store=tmp_path)
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=5),
                         telemetry=t)
    reported = threading.Event()
    stop = threading.Event()
    errors: list[BaseException] = []

    def train() -> None:
        try:
            r.on_app_start()
            r.on_train_start(0)
            i = 0
            while not stop.is_set():
                r.on_training_single_iteration_start()
                time.sleep(0.002)
                r.on_training_single_iteration_end()
                i += 1
                if i % 5 == 0:
                    t.flush()
                    if i >= 15:
                        reported.set()
            t.event("slow_batch", {"batch": 7}, group="data", severity="warning")
            r.on_train_end()
            r.on_app_end()
        except Exception as exc:  # noqa: BLE001 - failed in the thread: reported by the test below
            errors.append(exc)

    thread = threading.Thread(target=train)
    thread.start()
    try:
        assert reported.wait(30)
        code, out, err = run_cli("tail", "--once", str(tmp_path / "s" / "live"), capsys=capsys)
        assert code == 0, err
        assert "run live  perf_tag live-tag  training" in out
        row = next(line for line in out.splitlines() if line.startswith("│    0 │"))
        assert int(row.split("│")[2]) >= 14  # the iteration of the latest report
    finally:
        stop.set()
        thread.join(30)
        assert t.close()
    assert not errors
    code, out, _ = run_cli("tail", "--once", str(tmp_path), capsys=capsys)  # a root: its newest run
    assert code == 0 and "live-tag  finished" in out and "data/slow_batch" in out and "batch=7" in out
    assert "0 errors, 1 warnings, 0 spans not ok" in out
    if "findings: none so far" not in out:  # the first tail, in this process, can slow the loop briefly: a note
        assert "findings (0;" in out and ("│ note     │ a brief slowdown" in out or "│ note     │ the machine" in out)
    else:
        assert "┃ severity ┃ finding" not in out  # no empty table


def test_tail_refreshes_until_interrupted(tmp_path: Path) -> None:
    """The live loop: between refreshes the job trains on; the view shows the new reports; Ctrl-C ends it with 0."""
    pytest.importorskip("rich", reason="tail draws its view with rich (the [report] extra)")
    sim = RankSim(tmp_path, "live", rank=0, world_size=1, perf_tag="p", session="s", log_every=10).start()
    rng = random.Random(0)

    def train(n: int) -> None:
        for _ in range(n):
            sim.iteration({p: noisy(rng, ms) for p, ms in PHASE_MS.items()})
        sim.t.flush()

    train(20)
    refreshes = []

    def sleep(seconds: float) -> None:  # the interval elapses: more training, then (the third time) Ctrl-C
        refreshes.append(seconds)
        if len(refreshes) == 3:
            raise KeyboardInterrupt
        train(20)

    out = io.StringIO()
    assert run_tail(tmp_path / "s" / "live", out, interval=0.5, once=False, sleep=sleep) == 0
    assert refreshes == [0.5, 0.5, 0.5]
    row = next(line for line in out.getvalue().splitlines()[::-1] if line.startswith("│    0 │"))
    assert int(row.split("│")[2]) == 59  # the last frame: the report after 60 iterations
    # not a terminal (`telemetrain tail > log`): every frame is written as it is drawn, not the last one at exit
    rows = [int(line.split("│")[2]) for line in out.getvalue().splitlines() if line.startswith("│    0 │")]
    assert rows == [19, 39, 59]
    sim.finish()


def test_tail_state_is_incremental(tmp_path: Path) -> None:
    run = make_run(tmp_path, "r", seed=1, ranks=2, iterations=30)
    state = TailState(run)
    first = state.poll()
    assert first > 0 and state.poll() == 0  # nothing new: nothing re-read
    assert {s.rank: s.iteration for s in state.ranks.values()} == {0: 29, 1: 29}
    assert state.status() == "finished"


def test_tail_without_rich_says_how_to_install(tmp_path: Path) -> None:
    run = make_run(tmp_path, "r", seed=1, ranks=1, iterations=20)
    code = ("import sys; sys.modules['rich'] = None\n"
            "from telemetrain import cli\n"
            f"sys.exit(cli.main(['tail', '--once', {str(run)!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ('telemetrain: error: telemetrain tail needs rich, which is not installed: '
                                   'pip install "telemetrain[report]"')



def test_time_outside_the_phases_is_blamed_on_the_rest_of_the_step(tmp_path: Path) -> None:
    """A 10 ms sleep in the step, outside every timed phase: the 'rest of the step' row regresses, no phase does."""
    for run_id, extra_ms in (("base", 0.5), ("sleepy", 10.5)):  # (untimed work: 0.5 ms a step)
        sim = RankSim(tmp_path, run_id, rank=0, world_size=1, perf_tag="p", session="o", log_every=10).start()
        rng = random.Random(run_id)
        for _ in range(200):
            sim.r.on_training_single_iteration_start(BASE_MS + sim.now)
            for phase, ms in PHASE_MS.items():
                s = sim.r.tracer.start(PHASE_SPANS[phase], group="training", start_ns=sim.mono(sim.now))
                sim.now += noisy(rng, ms)
                s.end(end_ns=sim.mono(sim.now))
            sim.now += extra_ms  # the sleep: inside the iteration, outside the phases
            sim.r.on_training_single_iteration_end(BASE_MS + sim.now)
            sim.now += 1.0
        sim.finish()
    (result,) = compare_runs([tmp_path / "o" / "sleepy"], tmp_path / "o" / "base", goodput=False).candidates
    assert [m.metric for m in result.regressions if m.scope == "phase"] == ["other"]
    rest = result.metric("other")
    assert rest is not None and rest.label == "rest of the step"
    assert rest.candidate_median - rest.baseline_median == pytest.approx(0.010, abs=0.002)
    assert result.metric("iteration_time").verdict == REGRESSION  # type: ignore[union-attr]
