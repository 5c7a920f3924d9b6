"""The planted-problem scenarios (issue 21): real small training jobs (``_findings_job.py``, alone or under
``telemetrain launch``), what each must be found to hold, and the scoring of what report, show, tail and compare
said. Shared by ``test_findings_planted.py`` (every scenario, asserted) and ``bench/bench_findings.py`` (repeated,
scored: the precision/recall table of BENCHMARKS.md)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOB = str(Path(__file__).with_name("_findings_job.py"))
JOB_TIMEOUT_S = 300  # a hang fails the scenario, not the suite


@dataclass(frozen=True)
class Expect:
    """One finding a scenario must produce: its kind and a test of its title and evidence."""

    kind: str
    what: str  # for people: "straggler rank 2 forward"
    check: Callable[[Any], object] = lambda f: True  # its truth value counts (a match, a bool)

    def matches(self, f: Any) -> bool:
        try:
            return f.kind == self.kind and bool(self.check(f))
        except (AttributeError, TypeError, IndexError):
            return False


def steps_from(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda f: lo <= f.evidence.steps[0] <= hi


def straggler(rank: int, phase: str) -> Expect:
    return Expect("straggler", f"straggler rank {rank} {phase}",
                  lambda f: f.evidence.ranks == (rank,) and f.evidence.phase == phase)


@dataclass(frozen=True)
class Scenario:
    name: str
    nproc: int  # 0: the job alone; N: telemetrain launch --nproc-per-node N
    env: dict[str, str]
    expect: tuple[Expect, ...] = ()
    launch_args: tuple[str, ...] = ()
    attempts: int = 1  # run folders it writes (a restart: 2)
    tail_expect: tuple[Expect, ...] | None = None  # what tail must show, when it differs (tail sees one run)
    report_run: int = -1  # which attempt's run report/show/tail read


SINGLE = {"STEPS": "600", "CKPT_EVERY": "50", "VAL_EVERY": "200"}
FOUR = {"STEPS": "240", "CKPT_EVERY": "120"}

SCENARIOS = {s.name: s for s in (
    Scenario("clean", 0, SINGLE),
    Scenario("clean-again", 0, SINGLE),
    Scenario("cpu-hog", 0, {**SINGLE, "HOG_AT": "250", "HOG_PROCS": "2", "HOG_S": "4"}),
    Scenario("slow-checkpoint", 0, {**SINGLE, "CKPT_SLOW_S": "0.1"}),
    # 400 slow steps: ~3.7 s on a quiet machine, well over the 2 s a slowdown must last (slowdown_min_seconds)
    Scenario("mid-run-slowdown", 0, {"STEPS": "700", "SLOW_FROM": "300", "SLOW_FACTOR": "3"},
             (Expect("slowdown", "slowdown from step 300", steps_from(290, 310)),)),
    Scenario("leak-spike-nan", 0, {"STEPS": "600", "LEAK_MB": "1", "SPIKE_AT": "200", "NAN_AT": "400",
                                      "SAMPLER_S": "0.05"}, (  # enough RSS samples however fast the job runs
        Expect("memory growth", "RSS growth rank 0", lambda f: f.evidence.ranks == (0,) and "RSS" in f.title),
        Expect("spike", "loss spike at 200", lambda f: "train.loss" in f.title and f.evidence.steps[0] == 200),
        Expect("spike", "grad norm spike at 200",
               lambda f: "train.grad_norm" in f.title and f.evidence.steps[0] == 200),
        Expect("nan/inf", "NaN loss at 400", lambda f: f.title.endswith("train.loss") and f.evidence.steps[0] == 400),
        Expect("nan/inf", "NaN grad norm at 400",
               lambda f: f.title.endswith("train.grad_norm") and f.evidence.steps[0] == 400))),
    Scenario("crash-restart", 1, {"STEPS": "400", "CKPT_EVERY": "100", "CRASH_AT": "250"}, (
        # (and why, from the first attempt's agent: the planted SIGKILL)
        Expect("crash", "the first attempt killed", lambda f: re.fullmatch(
            r"crash: run \S+\.0 killed; rank 0 died of SIGKILL \(exit code -9\)", f.title)),
        Expect("restart", "the restart", lambda f: re.fullmatch(r"restart: run \S+\.1 after \S+\.0", f.title))),
        launch_args=("--max-restarts", "1"), attempts=2, tail_expect=()),
    Scenario("clean-4-ranks", 4, FOUR),
    Scenario("stragglers-4-ranks", 4, {**FOUR, "STRAGGLERS": "1:dataloader:0.01,2:forward:4"},
             (straggler(1, "dataloader"), straggler(2, "forward"))),
    # rank 2's saves take 1.5 s more than the others' (the ranks meet at a barrier after them)
    Scenario("slow-checkpoint-rank-4-ranks", 4, {**FOUR, "CKPT_SLOW_RANK": "2:1.5"},
             (Expect("slow checkpoint rank", "rank 2's saves, 2 x ~1.5 s",
                     lambda f: f.evidence.ranks == (2,) and 2.5 <= f.evidence.cost_seconds < 4.5),)),
    Scenario("slowdown-4-ranks", 4, {**FOUR, "SLOW_FROM": "120", "SLOW_FACTOR": "3"},
             (Expect("slowdown", "job-wide slowdown from step 120",
                     lambda f: 110 <= f.evidence.steps[0] <= 130 and "job-wide" in f.detail),)),
)}

# compare: (candidate, baseline, the regressions it must name, the regressions it may also name)
COMPARISONS: tuple[tuple[str, str, set[str], set[str]], ...] = (
    ("clean-again", "clean", set(), set()),
    ("cpu-hog", "clean", set(), set()),
    # each save sleeps 100 ms: the core idles (its clock and caches cool, other processes take it), and on a quiet
    # machine the iterations after a save are slower (the window after each save 1.1-2x the others', in clean runs
    # the same): the job's iteration time and phases 5-15% slower are a consequence, not noise
    ("slow-checkpoint", "clean", {"checkpoint save"},
     {"iteration time", "throughput", "dataloader phase", "forward phase", "backward phase", "optimizer phase",
      "rest of the step"}),
    # the ranks that wait for the late ones wait in backward (and take longer per iteration): consequences
    ("stragglers-4-ranks", "clean-4-ranks", {"rank 1 dataloader phase", "rank 2 forward phase"},
     {"iteration time", "throughput", "backward phase", "dataloader phase", "forward phase", "optimizer phase",
      *(f"rank {r} iteration time" for r in range(4)), *(f"rank {r} backward phase" for r in range(4)),
      *(f"rank {r} optimizer phase" for r in range(4))}),
)


class PlantedRuns(dict[str, list[Path]]):
    """The scenarios' run folders, each job run on first use; ``fresh`` runs one again in a folder of its own."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> list[Path]:
        self[name] = found = run_scenario(SCENARIOS[name], self.root / name)
        return found

    def fresh(self, name: str, attempt: int) -> Path:
        # a folder per call: two comparisons that retry with the same baseline ("clean") each run it afresh, and the
        # second must not find the first's run in its folder
        workdir = Path(tempfile.mkdtemp(prefix=f"{name}-{attempt}-", dir=self.root))
        return run_scenario(SCENARIOS[name], workdir)[-1]


def run_scenario(s: Scenario, workdir: Path) -> list[Path]:
    """Run the scenario's job in ``workdir``; its run folders, in restart order."""
    from telemetrain.store.reader import find_runs

    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_"))}
    env.update({"TELEMETRAIN_DIR": str(workdir / "runs"), "OMP_NUM_THREADS": "1", "CKPT_PATH": str(workdir / "c.pt"),
                **s.env})
    src = str(Path(__file__).resolve().parent.parent / "src")
    if Path(src).is_dir():  # the tree under test, as the caller's PYTHONPATH would have it
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    if s.nproc:
        cmd = [sys.executable, "-m", "telemetrain.cli", "launch", "--nproc-per-node", str(s.nproc),
               "--monitor-interval", "0.1", *s.launch_args, JOB]
    else:
        cmd = [sys.executable, JOB]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"scenario {s.name} exited {result.returncode}: {result.stderr[-3000:]}")
    runs = find_runs(workdir / "runs")
    if len(runs) != s.attempts:
        raise RuntimeError(f"scenario {s.name} wrote {len(runs)} run(s), expected {s.attempts}: {runs}")
    return runs


# -- what each surface says -------------------------------------------------------------------------------------------


def report_findings(run_dir: Path) -> list[Any]:
    from telemetrain.report.model import build_model
    from telemetrain.store.reader import open_run

    return list(build_model(open_run(run_dir)).findings)


def show_findings(run_dir: Path) -> list[Any]:
    """``telemetrain show``'s findings: its text, and the engine result it printed (they must agree)."""
    from telemetrain.analysis.findings.text import run_findings_lines
    from telemetrain.cli import main
    from telemetrain.store.reader import open_run

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["show", str(run_dir)]) == 0
    text = out.getvalue()
    lines = run_findings_lines(open_run(run_dir))
    assert "\n".join(lines) in text, "show printed other findings than the engine's"
    from telemetrain.analysis.findings.run import run_findings
    from telemetrain.analysis.findings.text import session_goodput

    run = open_run(run_dir)
    return list(run_findings(run, goodput_report=session_goodput(run)).findings)


def tail_findings(run_dir: Path) -> list[Any]:
    from telemetrain.analysis.tail import TailState

    state = TailState(run_dir)
    state.poll()
    return list(state.findings().findings)


@dataclass
class Score:
    expected: int = 0
    found: int = 0  # expected and found
    extra: list[str] = field(default_factory=list)  # found, not expected (false positives)
    missed: list[str] = field(default_factory=list)
    # when wrong: every finding's detail and evidence (a flake's cause, kept in the scores file)
    evidence: list[str] = field(default_factory=list)

    @property
    def false_positives(self) -> int:
        return len(self.extra)

    def add(self, other: Score) -> None:
        self.expected += other.expected
        self.found += other.found
        self.extra += other.extra
        self.missed += other.missed
        self.evidence += other.evidence


def score(findings: Sequence[Any], expect: Sequence[Expect]) -> Score:
    """Each expected finding must match one finding; every finding must be expected."""
    s = Score(expected=len(expect))
    left = list(findings)
    for e in expect:
        hit = next((f for f in left if e.matches(f)), None)
        if hit is None:
            s.missed.append(e.what)
        else:
            s.found += 1
            left.remove(hit)
    s.extra = [f"{f.kind}: {f.title}" for f in left]
    if s.extra or s.missed:
        s.evidence = [f"{f.kind}: {f.title} -- {f.detail} -- {f.evidence}" for f in findings]
    return s


SCORES_ENV = "TELEMETRAIN_PLANTED_SCORES"  # a file: each check's score is appended to it (bench_findings.py reads it)


def record(scenario: str, surface: str, s: Score) -> None:
    """Append one check's score to ``$TELEMETRAIN_PLANTED_SCORES`` (one JSON object a line), when set."""
    path = os.environ.get(SCORES_ENV)
    if not path:
        return
    import json

    line = {"scenario": scenario, "surface": surface, "expected": s.expected, "found": s.found, "extra": s.extra,
            "missed": s.missed, "evidence": s.evidence}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def score_comparison(candidate: Path, baseline: Path, must: set[str], may: set[str]) -> tuple[Score, str]:
    """compare's regressions against what it must and may name; and its table (for a failure's message)."""
    from telemetrain.analysis import compare_runs
    from telemetrain.analysis.compare_text import format_comparison

    c = compare_runs([candidate], baseline, history=())
    named = {m.label for m in c.candidates[0].regressions}
    s = Score(expected=len(must), found=len(must & named))
    s.missed = sorted(must - named)
    s.extra = sorted(named - must - may)
    return s, "\n".join(format_comparison(c))
