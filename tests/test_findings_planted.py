"""The planted-problem suite (issue 21): real small training jobs -- one process, and 4 CPU ranks under
``telemetrain launch`` -- each with one kind of problem planted (or none, or a CPU hog started mid-run), read back
by report, show, tail and compare. Each must name exactly what was planted, with the right rank, phase and step,
and nothing else; the clean and CPU-hog runs must give no finding at all.

The jobs are ``_findings_job.py``; the scenarios and their expectations ``_planted.py`` (shared with
``bench/bench_findings.py``, which repeats them and scores precision and recall: BENCHMARKS.md). Each job runs once
per test session and serves every assertion about it."""

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
    Scenario,
    record,
    report_findings,
    run_scenario,
    score,
    score_comparison,
    show_findings,
    tail_findings,
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """The scenarios' run folders, each job run on first use."""
    root = tmp_path_factory.mktemp("planted")

    class Lazy(dict[str, list[Path]]):
        def __missing__(self, name: str) -> list[Path]:
            self[name] = found = run_scenario(SCENARIOS[name], root / name)
            return found

    return Lazy()


def _check(name: str, surface: str, found: list[object], s: Scenario) -> str:
    """What is wrong with one surface's findings ("" when nothing), its score recorded."""
    expect = s.expect if surface != "tail" or s.tail_expect is None else s.tail_expect
    result = score(found, expect)
    record(name, surface, result)
    return f"{surface}: missed {result.missed}, not planted {result.extra}" if result.missed or result.extra else ""


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_planted_problem_is_named_and_nothing_else(name: str, runs: dict[str, list[Path]]) -> None:
    s = SCENARIOS[name]
    run_dir = runs[name][s.report_run]
    found = [report_findings(run_dir), show_findings(run_dir), tail_findings(run_dir)]
    wrong = [_check(name, surface, f, s) for surface, f in zip(("report", "show", "tail"), found, strict=True)]
    assert not any(wrong), f"{name}: " + "; ".join(w for w in wrong if w)


@pytest.mark.parametrize(("candidate", "baseline"), [(c, b) for c, b, _, _ in COMPARISONS])
def test_compare_names_the_planted_regression_and_no_other(candidate: str, baseline: str,
                                                           runs: dict[str, list[Path]]) -> None:
    must, may = next((m, y) for c, b, m, y in COMPARISONS if (c, b) == (candidate, baseline))
    result, table = score_comparison(runs[candidate][-1], runs[baseline][-1], must, may)
    record(f"{candidate} vs {baseline}", "compare", result)
    assert not result.missed and not result.extra, (
        f"compare {candidate} vs {baseline}: missed {result.missed}, not planted {result.extra}\n{table}")


def test_the_first_attempt_of_the_crashed_job_shows_its_crash(runs: dict[str, list[Path]]) -> None:
    first = runs["crash-restart"][0]
    titles = sorted(f.title for f in report_findings(first))
    assert [t.split(" on rank")[0] for t in titles if t.startswith("crash:")] == [
        "crash: application was killed (started, never ended)",
        "crash: training_loop was killed (started, never ended)"]
    restarted = runs["crash-restart"][1].name
    assert [t for t in titles if not t.startswith("crash:")] == [f"restart: run {restarted} after {first.name}"]
