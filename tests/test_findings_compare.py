"""``compare`` made noise-aware (issue 21): a busier machine is inconclusive, not a regression; earlier runs of the
perf tag set the effect a change needs; checkpoint, validation, per-rank phase and goodput rows; the baseline the
config marked (``is_baseline_run_or_fn``) is the default one.

The statistics run on ``RunSamples`` built here (plain data, controlled noise); the baseline choice and the command's
output on real run stores written by ``Telemetry`` and ``TrainingRecorder`` at explicit times."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from telemetrain import Telemetry, cli, identity_from_env
from telemetrain.analysis import compare_runs
from telemetrain.analysis.compare import (
    INCONCLUSIVE,
    INSUFFICIENT,
    NO_CHANGE,
    ONE_VALUE,
    REGRESSION,
    CandidateComparison,
    compare_samples,
)
from telemetrain.analysis.compare_html import comparison_html
from telemetrain.analysis.compare_text import format_comparison
from telemetrain.analysis.findings.noise import Contention, explained_factor, history_min_effect, steal_factor
from telemetrain.analysis.samples import RunSamples, Window
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

PHASES = {"dataloader": 0.010, "forward": 0.030, "backward": 0.045, "optimizer": 0.015}


def samples(name: str, *, scale: float = 1.0, wait: float | None = None, ranks: int = 2, windows: int = 40,
            seed: int = 0, cv: float = 0.03, rank_phase: dict[tuple[int, str], float] | None = None,
            saves: list[float] | None = None, contention: dict[str, float] | None = None,
            goodput: float | None = None) -> RunSamples:
    """A run's samples: ``scale`` on every phase; ``wait``: share of runnable time spent waiting for a CPU (the
    window's times stretched by it); ``rank_phase``: factor on one rank's phase."""
    rng = random.Random(f"{name}/{seed}")
    out = []
    for k in range(windows):
        for r in range(ranks):
            stretch = scale / (1 - wait) if wait is not None else scale
            phases = {p: v * stretch * rng.lognormvariate(0, cv) * (rank_phase or {}).get((r, p), 1.0)
                      for p, v in PHASES.items()}
            it = sum(phases.values())
            out.append(Window(rank=r, pid=100 + r, iteration=(k + 2) * 10 - 1, iterations=10, iteration_time=it,
                              samples_per_second=32 / it, phases=phases, cpu_wait_fraction=wait))
    return RunSamples(path=Path(f"/runs/s/{name}"), run_id=name, session_tag="s", perf_tag="tiny",
                      created_wall_ns=0, windows=out,
                      durations={"checkpoint_save": [(r, s) for s in (saves or []) for r in range(ranks)]},
                      contention=contention or {}, cpu_count=2, goodput=goodput)


def fast(candidate: RunSamples, baseline: RunSamples, **kwargs: Any) -> CandidateComparison:
    return compare_samples(candidate, baseline, resamples=400, **kwargs)


def verdicts(c: CandidateComparison) -> dict[str, str]:
    return {m.label: m.verdict for m in c.metrics}


def test_a_slower_run_on_a_busier_machine_is_inconclusive_not_a_regression() -> None:
    base = samples("base", wait=0.05)
    busy = samples("busy", wait=0.5)  # twice as long, all of it waiting for a CPU
    c = fast(busy, base)
    got = verdicts(c)
    assert got["iteration time"] == INCONCLUSIVE and got["forward phase"] == INCONCLUSIVE
    assert got["throughput"] == INCONCLUSIVE and not c.regressions
    (m,) = [m for m in c.metrics if m.label == "iteration time"]
    assert "with the CPU wait taken out" in m.note and "50%" in m.note
    lines = format_comparison(compare_runs([busy], base, goodput=False, resamples=400))
    assert any("inconclusive (the machine was busy)" in line for line in lines)
    assert lines[-1].startswith("result: 0 regression(s), 0 improvement(s),")


def test_a_regression_beyond_the_busy_machine_is_still_a_regression() -> None:
    c = fast(samples("slow", scale=2.5, wait=0.3), samples("base", wait=0.05))
    assert verdicts(c)["iteration time"] == REGRESSION


def test_without_cpu_wait_the_process_cpu_share_on_a_busy_host_explains_a_slowdown() -> None:
    base = samples("base", contention={"process_cpu": 0.8, "host_cpu": 0.5})
    busy_host = {"process_cpu": 0.5, "host_cpu": 0.97}
    slower = samples("c", scale=1.5, contention=busy_host)
    assert verdicts(fast(slower, base))["iteration time"] == INCONCLUSIVE
    assert verdicts(fast(samples("c", scale=3.0, contention=busy_host), base))["iteration time"] == REGRESSION
    factor, why = explained_factor(Contention(process_cpu=0.5, host_cpu=0.97),
                                   Contention(process_cpu=0.8, host_cpu=0.5))
    assert factor == pytest.approx(1.6) and "50% of its CPUs against 80%" in why


def test_the_hypervisors_steal_explains_a_slowdown_nothing_in_the_guest_shows() -> None:
    # a stolen guest believes it ran: no CPU wait, its full CPU share; only the steal shows where the time went
    base = samples("base", wait=0.0, contention={"process_cpu": 0.5, "host_cpu": 0.5, "steal": 0.0})
    stolen = {"process_cpu": 0.5, "host_cpu": 0.55, "steal": 0.055}  # 10% of its busy time went to another guest
    c = fast(samples("c", scale=1.11, wait=0.0, contention=stolen), base)
    (m,) = [m for m in c.metrics if m.label == "iteration time"]
    assert m.verdict == INCONCLUSIVE and "steal" in m.note and not c.regressions
    # the same slowdown without steal is a regression, and so is one far beyond what the steal explains
    quiet = {"process_cpu": 0.5, "host_cpu": 0.5, "steal": 0.001}
    assert verdicts(fast(samples("c", scale=1.11, wait=0.0, contention=quiet), base))["iteration time"] == REGRESSION
    assert verdicts(fast(samples("c", scale=2.5, wait=0.0, contention=stolen), base))["iteration time"] == REGRESSION
    factor, why = steal_factor(Contention(host_cpu=0.55, steal=0.055), Contention(host_cpu=0.5, steal=0.0))
    assert factor == pytest.approx(1 / (1 - 0.055 / 0.55)) and "10% of the candidate's" in why
    assert steal_factor(Contention(host_cpu=0.5, steal=0.01), Contention(host_cpu=0.5, steal=0.0)) == (1.0, "")
    assert steal_factor(Contention(host_cpu=0.5), Contention(host_cpu=0.5, steal=0.2)) == (1.0, "")  # unknown


def test_on_a_quiet_machine_a_small_regression_is_a_regression() -> None:
    c = fast(samples("c", scale=1.12, wait=0.0), samples("base", wait=0.0))
    assert verdicts(c)["iteration time"] == REGRESSION


def test_a_few_percent_of_cpu_wait_is_not_a_busy_machine() -> None:
    # both runs waited a little (2-3%: below BUSY_WAIT), so their wait factor is 0.99, not exactly 1: that alone
    # must not grant the busy machine's 60% allowance (a real HF-example run read "busy machine (waited 2%)")
    c = fast(samples("c", scale=1.12, wait=0.02), samples("base", wait=0.03))
    assert verdicts(c)["iteration time"] == REGRESSION
    # a busy one still gets it
    assert verdicts(fast(samples("c", scale=1.12, wait=0.3), samples("base", wait=0.3)))["iteration time"] == \
        INCONCLUSIVE


def test_three_windows_a_side_are_too_few_for_a_verdict() -> None:
    # 3 against 3 windows, every candidate window slower: no distribution-free test reaches 95% (p >= 0.1), though a
    # bootstrap of 3 values' median excludes 1 (two 20-step HF-example runs read REGRESSION +39% this way)
    c = fast(samples("c", scale=1.4, ranks=1, windows=3), samples("base", ranks=1, windows=3))
    (m,) = [m for m in c.metrics if m.label == "iteration time"]
    assert m.verdict == INSUFFICIENT and "3 against 3 windows" in m.note and not c.regressions
    assert any(n.endswith("only 3 report windows; too few for a test against the other run's") for n in c.notes)
    # one more window a side reaches it (2 / C(8, 4) = 0.029)
    assert verdicts(fast(samples("c", scale=1.4, ranks=1, windows=4), samples("base", ranks=1, windows=4)))[
        "iteration time"] == REGRESSION


def test_a_verdict_on_short_runs_says_they_are_one_draw_of_the_machine() -> None:
    # 40 windows of 10 iterations of ~0.1 s: 40 s of training, under a minute
    short = fast(samples("c", scale=1.12, wait=0.0), samples("base", wait=0.0))
    (note,) = [n for n in short.notes if "one draw of the machine" in n]
    assert note.startswith("the shorter run trained 40 s")
    long = fast(samples("c", scale=1.12, wait=0.0, windows=200), samples("base", wait=0.0, windows=200))
    assert verdicts(long)["iteration time"] == REGRESSION
    assert not [n for n in long.notes if "one draw" in n]
    same = fast(samples("c", wait=0.0, seed=1), samples("base", wait=0.0))  # nothing significant: nothing to doubt
    assert not same.regressions and not [n for n in same.notes if "one draw" in n]


def test_earlier_runs_set_the_effect_a_change_needs() -> None:
    history = [samples(f"h{i}", scale=s) for i, s in enumerate((0.85, 1.0, 1.15, 0.9, 1.1))]
    base = samples("base")
    cand = samples("cand", scale=1.12)
    assert verdicts(fast(cand, base))["iteration time"] == REGRESSION  # alone, 12% beats 3%
    c = fast(cand, base, history=history)
    (m,) = [m for m in c.metrics if m.label == "iteration time"]
    assert m.verdict == NO_CHANGE and m.min_effect is not None and m.min_effect > 0.2
    assert any("between-run spread of 5 earlier run(s)" in n for n in c.notes)
    assert history_min_effect([1.0, 1.0], 0.95) is None  # two runs are not a spread
    big = fast(samples("cand", scale=2.0), base, history=history)
    assert verdicts(big)["iteration time"] == REGRESSION


def test_one_earlier_run_measures_no_spread_and_changes_nothing() -> None:
    # the command reads up to --history earlier runs of the tag; one (with the baseline: 2 medians, MIN_HISTORY is 3)
    # measures no spread, so the busy machine's allowance and the short-run note stand as without it (two clean
    # 300-step CPU runs and one other run of the tag in the store read IMPROVEMENT -42%, with no note)
    base, busy = samples("base", wait=0.3), samples("c", scale=1.12, wait=0.3)
    one = [samples("h0")]
    assert verdicts(fast(busy, base, history=one))["iteration time"] == INCONCLUSIVE
    short = fast(samples("c", scale=1.12, wait=0.0), samples("base", wait=0.0), history=one)
    assert verdicts(short)["iteration time"] == REGRESSION
    assert [n for n in short.notes if n.startswith("the shorter run trained 40 s")]
    assert not [n for n in short.notes if "between-run spread" in n]
    # three earlier runs do measure it: then the spread, not the busy machine, sets the effect needed
    measured = fast(busy, base, history=[samples(f"h{i}", scale=s) for i, s in enumerate((0.99, 1.0, 1.01))])
    assert verdicts(measured)["iteration time"] == REGRESSION
    assert not [n for n in measured.notes if "one draw" in n]


def test_checkpoint_saves_per_rank_phases_and_goodput_are_compared() -> None:
    base = samples("base", ranks=4, saves=[0.20, 0.21, 0.19, 0.20], goodput=0.90)
    cand = samples("cand", ranks=4, saves=[0.95, 1.0, 0.98, 0.97], rank_phase={(2, "forward"): 1.6}, goodput=0.80)
    c = fast(cand, base)
    got = verdicts(c)
    assert got["checkpoint save"] == REGRESSION and got["rank 2 forward phase"] == REGRESSION
    assert got["rank 1 forward phase"] == NO_CHANGE and got["goodput"] == ONE_VALUE
    assert c.metric("checkpoint_save").ratio == pytest.approx(4.85, rel=0.05)  # type: ignore[union-attr]
    assert c.metric("forward", rank=2).verdict == REGRESSION  # type: ignore[union-attr]
    few = fast(samples("c", saves=[1.0, 1.0]), samples("b", saves=[0.2, 0.2]))
    assert verdicts(few)["checkpoint save"] == "insufficient data"
    text = "\n".join(format_comparison(compare_runs([cand], base, goodput=False, resamples=400)))
    assert "rank 2 forward phase" in text and "rank 1 forward phase" not in text  # quiet per-rank rows left out
    assert "slower rank phases, by time added per iteration: rank 2 forward" in text
    page = comparison_html(compare_runs([cand], base, goodput=False, resamples=400))
    assert "checkpoint save" in page and "rank 2 forward phase" in page
    assert json.loads(json.dumps(compare_runs([cand], base, goodput=False, resamples=400).as_dict()))


def test_a_few_spans_cannot_make_a_regression() -> None:
    # 3 validation loops against 3, each loop twice as long: a rank-sum test of 3 against 3 cannot reach p < 0.05
    # (every value above every other gives 0.1), so the row is "insufficient data", never a regression
    three = fast(samples("c", saves=[0.40, 0.44, 0.42]), samples("b", saves=[0.20, 0.21, 0.22]))
    row = three.metric("checkpoint_save")
    assert row is not None and row.verdict == "insufficient data" and "too few" in row.note
    # the same doubling over 12 saves a side is one; 12 against 12 interleaved is not
    many = fast(samples("c", saves=[0.40 + i / 1000 for i in range(12)]), samples("b", saves=[0.20] * 12))
    assert verdicts(many)["checkpoint save"] == REGRESSION
    mixed = fast(samples("c", saves=[0.2, 0.5] * 6), samples("b", saves=[0.19, 0.45] * 6))
    assert verdicts(mixed)["checkpoint save"] == NO_CHANGE
    # 12 saves of 3 ms against 12 of 3.3 ms, every one slower: significant, but 0.3 ms against the 3.3 s of training
    # between two saves (40 windows x 10 iterations x 100 ms / 12) is not 3% of it: what clean runs differ by
    tiny = fast(samples("c", saves=[0.0033 + i * 1e-6 for i in range(12)]), samples("b", saves=[0.0030] * 12))
    row = tiny.metric("checkpoint_save")
    assert row is not None and row.ci_low > 1.03 and row.verdict == NO_CHANGE and "training time between" in row.note


def test_a_small_phase_must_add_a_share_of_the_step_to_be_a_regression() -> None:
    # the data loader is 10 ms of a 100 ms step: 20% slower adds 2 ms (2% of the step, under min_effect 3%): not a
    # regression, though its own interval clears 3%; 60% slower adds 6 ms: one
    def loader(factor: float) -> RunSamples:
        return samples("c", rank_phase={(r, "dataloader"): factor for r in range(2)}, cv=0.01)

    base = samples("b", cv=0.01)
    small = fast(loader(1.2), base)
    row = small.metric("dataloader")
    assert row is not None and row.ci_low > 1.03 and row.verdict == NO_CHANGE and "of the iteration time" in row.note
    assert small.metric("dataloader", rank=0).verdict == NO_CHANGE  # type: ignore[union-attr]
    assert verdicts(fast(loader(1.6), base))["dataloader phase"] == REGRESSION


def test_the_rank_sum_test() -> None:
    from telemetrain.analysis.findings.stats import min_rank_sum_p, rank_sum_p

    assert min_rank_sum_p(3, 3) == pytest.approx(0.1) and min_rank_sum_p(4, 4) == pytest.approx(2 / 70)
    assert rank_sum_p([4.0, 5.0, 6.0], [1.0, 2.0, 3.0]) == pytest.approx(0.1)  # never below the exact minimum
    assert rank_sum_p(list(range(10, 22)), list(range(12))) < 1e-4
    assert rank_sum_p([1.0, 3.0, 5.0, 7.0], [2.0, 4.0, 6.0, 8.0]) > 0.5
    assert rank_sum_p([1.0] * 5, [1.0] * 5) == 1.0 and rank_sum_p([], [1.0]) == 1.0


# -- real run stores: the marked baseline, the command ----------------------------------------------------------------

BASE_MS = 1_700_000_000_000


def write_run(root: Path, run_id: str, *, ms: float, baseline: bool = False, saves_ms: float = 200.0,
              iterations: int = 200) -> Path:
    identity = identity_from_env({}, run_id=run_id, session_tag=run_id, perf_tag="tiny", rank=0, world_size=1)
    t = Telemetry(identity, store=root)
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=10,
                                                 perf_tag_or_fn="tiny", is_baseline_run_or_fn=baseline), telemetry=t)
    rng = random.Random(run_id)
    now = BASE_MS + {"a": 0, "b": 1, "c": 2}.get(run_id[-1], 0) * 1e6
    r.on_app_start(now)
    r.on_train_start(0, start_time_msec=now)
    for step in range(iterations):
        r.on_training_single_iteration_start(now)
        now += ms * rng.lognormvariate(0, 0.03)
        r.on_training_single_iteration_end(now)
        if (step + 1) % 40 == 0:
            r.on_save_checkpoint_start(step + 1, now)
            now += saves_ms * rng.lognormvariate(0, 0.03)
            r.on_save_checkpoint_success(step + 1, now)
            r.on_save_checkpoint_end(now)
    r.on_train_end(now)
    r.on_app_end(now + 1)
    assert t.close()
    return root / run_id / run_id


def test_the_default_baseline_is_the_run_marked_is_baseline_run(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    marked = write_run(tmp_path, "run-a", ms=100.0, baseline=True)
    write_run(tmp_path, "run-b", ms=150.0)  # regressed, newer: would hide the next regression
    newest = write_run(tmp_path, "run-c", ms=150.0, saves_ms=900.0)
    assert cli.main(["compare", str(newest), "--json", "--history", "0"]) == 0
    out, err = capsys.readouterr()
    assert f"baseline: {marked} (newest run marked is_baseline_run" in err
    data = json.loads(out)
    rows = {m["label"]: m for m in data["candidates"][0]["metrics"]}
    assert data["baseline"]["run_id"] == "run-a" and rows["iteration time"]["verdict"] == REGRESSION
    assert rows["checkpoint save"]["verdict"] == REGRESSION and rows["goodput"]["verdict"] == ONE_VALUE
    assert 0 < rows["goodput"]["candidate_median"] < rows["goodput"]["baseline_median"] < 1
    assert cli.main(["compare", str(newest), "--baseline", str(marked), "--no-goodput"]) == 0
    assert "goodput" not in capsys.readouterr().out


def test_without_a_marked_run_the_newest_other_run_is_the_baseline(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path, "run-a", ms=100.0)
    older = write_run(tmp_path, "run-b", ms=100.0)
    newest = write_run(tmp_path, "run-c", ms=100.0)
    assert cli.main(["compare", str(newest), "--history", "0", "--no-goodput"]) == 0
    assert f"baseline: {older} (newest other run; none is marked is_baseline_run" in capsys.readouterr().err
    assert cli.main(["compare", str(newest), "--history", "-1"]) == 2
    assert "--history must be >= 0" in capsys.readouterr().err


def test_a_run_that_got_less_than_half_its_cpu_is_inconclusive_however_slow() -> None:
    # a clean CPU torch run still being written while other jobs held the 2-core VM: windows at 77-89% CPU wait ran
    # 40x slower than the same job's quiet baseline, where the wait explains 4-5x: read as 5 regressions
    base = samples("base", wait=0.03)
    saturated = samples("c", scale=40 * 0.2, wait=0.8)  # 1/(1 - 0.8) = 5x of it from the wait, 8x beyond
    c = fast(saturated, base)
    (m,) = [m for m in c.metrics if m.label == "iteration time"]
    assert m.verdict == INCONCLUSIVE and not c.regressions
    assert m.note.startswith("the candidate got less than half the CPU it asked for (waited for a CPU 80% of")
    back = fast(base, saturated)  # the baseline the saturated one: no improvement either
    assert not back.improvements and verdicts(back)["iteration time"] == INCONCLUSIVE
    # half of it and less keeps the net re-test: a change far beyond what the wait explains is still a regression
    assert verdicts(fast(samples("c", scale=2.5, wait=0.5), base))["iteration time"] == REGRESSION
    # both runs saturated alike (4 ranks on 2 cores, before and after a change): like for like, a 2.5x is still seen
    both = samples("b2", wait=0.8)
    assert verdicts(fast(samples("c", scale=2.5, wait=0.8), both))["iteration time"] == REGRESSION
