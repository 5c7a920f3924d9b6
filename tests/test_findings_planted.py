"""The planted-problem suite (issue 21): real small training jobs -- one process, and 4 CPU ranks under
``telemetrain launch`` -- each with one kind of problem planted (or none, or a CPU hog started mid-run), read back
by report, show, tail and compare. Each must name exactly what was planted, with the right rank, phase and step,
and nothing else; the clean and CPU-hog runs must give no finding at all.

The jobs are ``_findings_job.py``; the scenarios and their expectations ``_planted.py`` (shared with
``bench/bench_findings.py``, which repeats them and scores precision and recall: BENCHMARKS.md). Each job runs once
per test session (``conftest.planted_runs``) and serves every assertion about it."""

from __future__ import annotations

from pathlib import Path

import pytest

# the jobs train with torch and sample the system (the memory leak is seen in the sampler's RSS): without those
# extras installed the suite cannot run its jobs, and says so
pytest.importorskip("torch")

pytest.importorskip("psutil")

from _planted import (
    COMPARISONS,
    SCENARIOS,
    PlantedRuns,
    Scenario,
    record,
    report_findings,
    score,
    score_comparison,
    show_findings,
    tail_findings,
)


@pytest.fixture
def runs(planted_runs: PlantedRuns) -> PlantedRuns:
    return planted_runs


def _check(name: str, surface: str, found: list[object], s: Scenario) -> str:
    """What is wrong with one surface's findings ("" when nothing), its score recorded."""
    expect = s.expect if surface != "tail" or s.tail_expect is None else s.tail_expect
    result = score(found, expect)
    record(name, surface, result)
    return f"{surface}: missed {result.missed}, not planted {result.extra}; all it found: {result.evidence}" \
        if result.missed or result.extra else ""


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_planted_problem_is_named_and_nothing_else(name: str, runs: dict[str, list[Path]]) -> None:
    s = SCENARIOS[name]
    run_dir = runs[name][s.report_run]
    found = [report_findings(run_dir), show_findings(run_dir), tail_findings(run_dir)]
    wrong = [_check(name, surface, f, s) for surface, f in zip(("report", "show", "tail"), found, strict=True)]
    assert not any(wrong), f"{name}: " + "; ".join(w for w in wrong if w)


# Two back-to-back clean runs of 2 s on a shared VM can differ by 10% with nothing inside the VM showing why: on
# CI (2026-11-26) the second was 10.6% slower in every phase (the memory-bound optimizer 27%), with no CPU wait and no
# busier host -- another tenant on the same physical core or memory bus, which a guest cannot see. compare's
# interval is over windows within each run and cannot know that (docs/compare.md: "compare a second candidate
# run"); so a wrong comparison is tried on up to two fresh pairs, each scored. A rule that is wrong fails every pair.
PAIR_RETRIES = 2


@pytest.mark.parametrize(("candidate", "baseline"), [(c, b) for c, b, _, _ in COMPARISONS])
def test_compare_names_the_planted_regression_and_no_other(candidate: str, baseline: str,
                                                           runs: PlantedRuns) -> None:
    must, may = next((m, y) for c, b, m, y in COMPARISONS if (c, b) == (candidate, baseline))
    pair = runs[candidate][-1], runs[baseline][-1]
    failures = []
    for attempt in range(1 + PAIR_RETRIES):
        if attempt:  # a fresh pair: either run of the last one may have been the shifted one
            pair = runs.fresh(candidate, attempt), runs.fresh(baseline, attempt)
        result, table = score_comparison(*pair, must, may)
        record(f"{candidate} vs {baseline}", "compare", result)
        if not result.missed and not result.extra:
            return
        failures.append(f"attempt {attempt + 1}: missed {result.missed}, not planted {result.extra}\n{table}")
    pytest.fail(f"compare {candidate} vs {baseline}, every pair wrong:\n" + "\n".join(failures))


def test_the_first_attempt_of_the_crashed_job_shows_its_crash(runs: dict[str, list[Path]]) -> None:
    first = runs["crash-restart"][0]
    titles = [f.title for f in report_findings(first)]
    assert [t.split(" on rank")[0] for t in titles if t.startswith("crash:")] == [
        "crash: rank 0 died of SIGKILL (exit code -9)",  # the cause first: the agent restarted from it and recorded it
        "crash: training_loop and application were killed (started, never ended)"]  # what it left: one finding
    restarted = runs["crash-restart"][1].name
    assert [t for t in titles if not t.startswith("crash:")] == [f"restart: run {restarted} after {first.name}"]
