"""Compare runs against a baseline: a bootstrap confidence interval of the ratio of medians, and a decision.

The unit of observation is the report window (``samples.py``): a run's series is one value per window (the ranks'
windows ending at the same iteration averaged into one). For each metric, both series are resampled with
replacement, independently, ``resamples`` times (a seeded ``random.Random``: the same inputs give the same answer);
each resample gives ``median(candidate*) / median(baseline*)`` and the percentile interval of those ratios is the
confidence interval. Consequence: the interval is over windows, i.e. it says how sure we are of each run's typical
window, not how much a third run on other nodes would differ; ``min_effect`` is there for that run-to-run variation.

Decision, for a lower-is-better metric (iteration time, a phase's time): a regression when the whole interval lies
above ``1 + min_effect``, an improvement when it lies below ``1 - min_effect``, otherwise no significant change.
Throughput is higher-is-better: the other way round.

Past ``MAX_UNITS`` windows, consecutive windows are averaged into ``MAX_UNITS`` blocks before resampling: neighbouring
windows are correlated (a block bootstrap respects that), and the cost stays bounded for long runs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store.reader import Run
from .samples import PHASES, RunSamples, run_samples

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_MIN_EFFECT",
    "DEFAULT_RESAMPLES",
    "CandidateComparison",
    "Comparison",
    "MetricComparison",
    "PerfTagMismatch",
    "RunRef",
    "bootstrap_ratio",
    "compare_runs",
]

DEFAULT_CONFIDENCE = 0.95
# 3%: smaller changes are within what the same job on the same hardware commonly varies from run to run (clock boost,
# placement, data order), which a within-run interval cannot see; larger ones are worth a look.
DEFAULT_MIN_EFFECT = 0.03
DEFAULT_RESAMPLES = 2000
MAX_UNITS = 200
MIN_WINDOWS = 3  # per side: fewer and resampling tells nothing
FEW_WINDOWS = 10  # below this, a percentile bootstrap of a median is coarse: said in a note

REGRESSION = "regression"
IMPROVEMENT = "improvement"
NO_CHANGE = "no significant change"
INSUFFICIENT = "insufficient data"


class PerfTagMismatch(ValueError):
    """The runs were tagged as different workloads (``perf_tag``); comparing them needs ``force=True``."""


@dataclass(frozen=True)
class MetricComparison:
    """One metric of a candidate against the baseline."""

    metric: str  # "iteration_time", "samples_per_second", a phase name
    scope: str  # "run", "phase" or "rank"
    label: str  # what a person reads: "iteration time", "forward phase", "rank 3 iteration time"
    unit: str
    higher_is_better: bool
    baseline_median: float
    candidate_median: float
    baseline_windows: int
    candidate_windows: int
    ratio: float  # candidate median / baseline median
    ci_low: float
    ci_high: float
    verdict: str  # regression, improvement, no significant change, insufficient data
    rank: int | None = None

    @property
    def change(self) -> float:
        """Relative change of the median, candidate against baseline (+0.15: 15% higher)."""
        return self.ratio - 1.0

    @property
    def significant(self) -> bool:
        return self.verdict in (REGRESSION, IMPROVEMENT)

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric, "scope": self.scope, "label": self.label, "unit": self.unit,
            "rank": self.rank, "higher_is_better": self.higher_is_better,
            "baseline_median": _json_float(self.baseline_median),
            "candidate_median": _json_float(self.candidate_median),
            "baseline_windows": self.baseline_windows, "candidate_windows": self.candidate_windows,
            "ratio": _json_float(self.ratio), "change": _json_float(self.change),
            "ci_low": _json_float(self.ci_low), "ci_high": _json_float(self.ci_high), "verdict": self.verdict,
        }


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class RunRef:
    """Which run a comparison read."""

    path: str
    run_id: str
    session_tag: str
    perf_tag: str
    windows: int  # steady-state windows, all ranks
    ranks: tuple[int, ...]
    iteration_p50: float | None = None  # of the sampled iteration spans, seconds
    iteration_p99: float | None = None

    @classmethod
    def of(cls, s: RunSamples) -> RunRef:
        pct = s.iteration_percentiles()
        return cls(path=str(s.path), run_id=s.run_id, session_tag=s.session_tag, perf_tag=s.perf_tag,
                   windows=s.window_count, ranks=tuple(s.ranks), iteration_p50=pct[0] if pct else None,
                   iteration_p99=pct[1] if pct else None)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "run_id": self.run_id, "session_tag": self.session_tag, "perf_tag": self.perf_tag,
                "windows": self.windows, "ranks": list(self.ranks), "iteration_p50": self.iteration_p50,
                "iteration_p99": self.iteration_p99}


@dataclass(frozen=True)
class CandidateComparison:
    """Every metric of one candidate run against the baseline."""

    candidate: RunRef
    metrics: tuple[MetricComparison, ...]
    notes: tuple[str, ...] = ()

    @property
    def regressions(self) -> list[MetricComparison]:
        return [m for m in self.metrics if m.verdict == REGRESSION]

    @property
    def improvements(self) -> list[MetricComparison]:
        return [m for m in self.metrics if m.verdict == IMPROVEMENT]

    def metric(self, metric: str, rank: int | None = None) -> MetricComparison | None:
        for m in self.metrics:
            if m.metric == metric and m.rank == rank and (rank is not None or m.scope != "rank"):
                return m
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate.as_dict(), "metrics": [m.as_dict() for m in self.metrics],
                "regressions": [m.label for m in self.regressions],
                "improvements": [m.label for m in self.improvements], "notes": list(self.notes)}


@dataclass(frozen=True)
class Comparison:
    """Candidates against one baseline, with the settings that produced the verdicts."""

    baseline: RunRef
    candidates: tuple[CandidateComparison, ...]
    confidence: float
    min_effect: float
    resamples: int
    seed: int
    forced: bool = False  # perf tags differed and the comparison was forced
    notes: tuple[str, ...] = field(default=())

    @property
    def regressions(self) -> list[tuple[RunRef, MetricComparison]]:
        return [(c.candidate, m) for c in self.candidates for m in c.regressions]

    @property
    def improvements(self) -> list[tuple[RunRef, MetricComparison]]:
        return [(c.candidate, m) for c in self.candidates for m in c.improvements]

    def as_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.as_dict(), "candidates": [c.as_dict() for c in self.candidates],
                "confidence": self.confidence, "min_effect": self.min_effect, "resamples": self.resamples,
                "seed": self.seed, "forced": self.forced, "notes": list(self.notes)}


# -- the statistics ----------------------------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _blocks(values: Sequence[float], limit: int = MAX_UNITS) -> list[float]:
    """``values`` as at most ``limit`` means of consecutive runs of values (unchanged when short enough)."""
    n = len(values)
    if n <= limit:
        return list(values)
    size = math.ceil(n / limit)
    return [math.fsum(values[i:i + size]) / len(values[i:i + size]) for i in range(0, n, size)]


def bootstrap_ratio(candidate: Sequence[float], baseline: Sequence[float], *, confidence: float = DEFAULT_CONFIDENCE,
                    resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """``median(candidate) / median(baseline)`` and its percentile bootstrap interval at ``confidence``, resampling
    each side independently with ``random.Random(seed)``. Both sides need at least one value."""
    if not candidate or not baseline:
        raise ValueError("bootstrap_ratio needs values on both sides")
    rng = random.Random(seed)
    c, b = list(candidate), list(baseline)
    nc, nb = len(c), len(b)
    ratios = []
    choices = rng.choices
    for _ in range(resamples):
        mb = _median(choices(b, k=nb))
        ratios.append(_median(choices(c, k=nc)) / mb if mb else math.inf)
    ratios.sort()
    alpha = (1.0 - confidence) / 2
    low = ratios[max(0, math.floor(alpha * (resamples - 1)))]
    high = ratios[min(resamples - 1, math.ceil((1 - alpha) * (resamples - 1)))]
    mb = _median(b)
    return (_median(c) / mb if mb else math.inf), low, high


def decide(ci_low: float, ci_high: float, *, higher_is_better: bool, min_effect: float) -> str:
    """The verdict for an interval of candidate/baseline."""
    worse_above = not higher_is_better
    if ci_low > 1 + min_effect:
        return REGRESSION if worse_above else IMPROVEMENT
    if ci_high < 1 - min_effect:
        return IMPROVEMENT if worse_above else REGRESSION
    return NO_CHANGE


@dataclass(frozen=True)
class _Settings:
    confidence: float
    min_effect: float
    resamples: int
    seed: int


@dataclass(frozen=True)
class _Metric:
    metric: str
    scope: str
    label: str
    unit: str
    higher_is_better: bool
    rank: int | None = None


def _compare_series(candidate: Sequence[float], baseline: Sequence[float], what: _Metric,
                    settings: _Settings) -> MetricComparison:
    c, b = _blocks(candidate), _blocks(baseline)

    def result(ratio: float, low: float, high: float, verdict: str) -> MetricComparison:
        nan = math.nan
        return MetricComparison(
            metric=what.metric, scope=what.scope, label=what.label, unit=what.unit,
            higher_is_better=what.higher_is_better, rank=what.rank, baseline_median=_median(b) if b else nan,
            candidate_median=_median(c) if c else nan, baseline_windows=len(baseline),
            candidate_windows=len(candidate), ratio=ratio, ci_low=low, ci_high=high, verdict=verdict)

    if len(c) < MIN_WINDOWS or len(b) < MIN_WINDOWS or _median(b) <= 0:
        return result(math.nan, math.nan, math.nan, INSUFFICIENT)
    ratio, low, high = bootstrap_ratio(c, b, confidence=settings.confidence, resamples=settings.resamples,
                                       seed=settings.seed)
    return result(ratio, low, high, decide(low, high, higher_is_better=what.higher_is_better,
                                           min_effect=settings.min_effect))


def compare_samples(candidate: RunSamples, baseline: RunSamples, *, confidence: float = DEFAULT_CONFIDENCE,
                    min_effect: float = DEFAULT_MIN_EFFECT, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                    phases: bool = True, ranks: bool = True) -> CandidateComparison:
    """Every metric of ``candidate`` against ``baseline``: the run's iteration time and throughput, each phase's time,
    and each rank's iteration time (the ranks both runs have)."""
    settings = _Settings(confidence, min_effect, resamples, seed)
    metrics = [_compare_series(candidate.series("iteration_time"), baseline.series("iteration_time"),
                               _Metric("iteration_time", "run", "iteration time", "s", False), settings)]
    cs, bs = candidate.series("samples_per_second"), baseline.series("samples_per_second")
    notes = []
    if cs and bs:
        metrics.append(_compare_series(cs, bs, _Metric("samples_per_second", "run", "throughput", "samples/s", True),
                                       settings))
    else:
        notes.append("throughput not compared: no samples_per_second (global_batch_size not configured?)")
    if phases:
        for phase in PHASES:
            cs, bs = candidate.series(phase), baseline.series(phase)
            if cs and bs:
                metrics.append(_compare_series(cs, bs, _Metric(phase, "phase", f"{phase} phase", "s", False),
                                               settings))
    if ranks:
        common = sorted(set(candidate.ranks) & set(baseline.ranks))
        if len(common) > 1:
            for r in common:
                metrics.append(_compare_series(
                    candidate.series("iteration_time", rank=r), baseline.series("iteration_time", rank=r),
                    _Metric("iteration_time", "rank", f"rank {r} iteration time", "s", False, rank=r), settings))
        missing = sorted(set(candidate.ranks) ^ set(baseline.ranks))
        if missing:
            notes.append(f"ranks in only one of the runs, not compared per rank: {', '.join(map(str, missing))}")
    for role, run in (("candidate", candidate), ("baseline", baseline)):
        n = len(run.series("iteration_time"))
        if n < MIN_WINDOWS:
            notes.append(f"{role} {run.run_id}: {n} steady-state report window(s) (training_metrics_update after the "
                         f"first); at least {MIN_WINDOWS} are needed: a longer run or a smaller "
                         "log_every_n_train_iterations")
        elif n < FEW_WINDOWS:
            notes.append(f"{role} {run.run_id}: only {n} report windows; the interval is coarse")
    return CandidateComparison(candidate=RunRef.of(candidate), metrics=tuple(metrics), notes=tuple(notes))


def _as_samples(run: RunSamples | Run | str | Path) -> RunSamples:
    return run if isinstance(run, RunSamples) else run_samples(run)


def compare_runs(candidates: RunSamples | Run | str | Path | Iterable[RunSamples | Run | str | Path],
                 baseline: RunSamples | Run | str | Path, *, confidence: float = DEFAULT_CONFIDENCE,
                 min_effect: float = DEFAULT_MIN_EFFECT, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                 force: bool = False, phases: bool = True, ranks: bool = True) -> Comparison:
    """Compare each candidate run with ``baseline`` (run directories, ``Run``s or ``RunSamples``).

    Raises ``PerfTagMismatch`` when a candidate's ``perf_tag`` differs from the baseline's, unless ``force``; and
    ``ValueError`` for settings out of range.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
    if not 0 <= min_effect < 1:
        raise ValueError(f"min_effect must be in [0, 1), got {min_effect!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise ValueError(f"resamples must be an int >= 100, got {resamples!r}")
    if isinstance(candidates, (RunSamples, Run, str, Path)):
        candidates = [candidates]
    base = _as_samples(baseline)
    cands = [_as_samples(c) for c in candidates]
    if not cands:
        raise ValueError("compare_runs needs at least one candidate run")
    differing = [c for c in cands if c.perf_tag != base.perf_tag]
    notes = []
    if differing:
        listing = ", ".join(f"{c.run_id} ({c.perf_tag!r})" for c in differing)
        message = f"perf_tag differs from the baseline {base.run_id} ({base.perf_tag!r}): {listing}"
        if not force:
            raise PerfTagMismatch(message + "; these are different workloads (force to compare anyway)")
        notes.append(message + "; compared anyway (forced)")
    results = tuple(compare_samples(c, base, confidence=confidence, min_effect=min_effect, resamples=resamples,
                                    seed=seed, phases=phases, ranks=ranks) for c in cands)
    return Comparison(baseline=RunRef.of(base), candidates=results, confidence=confidence, min_effect=min_effect,
                      resamples=resamples, seed=seed, forced=bool(differing), notes=tuple(notes))
