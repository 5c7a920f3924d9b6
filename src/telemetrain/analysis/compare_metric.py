"""One metric of two runs tested: the candidate's and the baseline's series (one value per report window, or per
span) in blocks, the bootstrap interval of the ratio of their medians (``compare_bootstrap.py``), a rank-sum test for
the few spans, and the verdict (``decide``); what a metric is (``_Metric``) and how its series is read from a run
(``_Series``). ``compare.py`` lists the metrics and judges each test against the noise between runs
(``compare_noise.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .compare_bootstrap import blocks as _blocks
from .compare_bootstrap import bootstrap_ratio
from .compare_bootstrap import median as _median
from .compare_model import IMPROVEMENT, INSUFFICIENT, NO_CHANGE, REGRESSION, MetricComparison
from .findings.stats import min_rank_sum_p, rank_sum_p
from .samples import RunSamples

__all__ = ["MIN_WINDOWS", "decide", "format_ratio"]

MIN_WINDOWS = 3  # per side: fewer and resampling tells nothing


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
    windowed: bool = True  # a per-window series (a busy-free version exists), not one value per span


# what each metric's series is, from a run: (run, busy_free) -> values
_Series = Callable[[RunSamples, bool], list[float]]


def _window_series(metric: str, rank: int | None = None) -> _Series:
    return lambda run, busy_free: run.series(metric, rank, busy_free=busy_free)


def _duration_series(kind: str) -> _Series:
    return lambda run, busy_free: run.duration_series(kind)


def _median_or_nan(values: Sequence[float]) -> float:
    return _median(values) if values else math.nan


def _compare_series(candidate: Sequence[float], baseline: Sequence[float], what: _Metric,
                    settings: _Settings) -> MetricComparison:
    c, b = _blocks(candidate), _blocks(baseline)

    def result(ratio: float, low: float, high: float, verdict: str) -> MetricComparison:
        return MetricComparison(
            metric=what.metric, scope=what.scope, label=what.label, unit=what.unit,
            higher_is_better=what.higher_is_better, rank=what.rank, baseline_median=_median_or_nan(b),
            candidate_median=_median_or_nan(c), baseline_windows=len(baseline),
            candidate_windows=len(candidate), ratio=ratio, ci_low=low, ci_high=high, verdict=verdict,
            min_effect=settings.min_effect)

    if len(c) < MIN_WINDOWS or len(b) < MIN_WINDOWS or _median(b) <= 0:
        return result(math.nan, math.nan, math.nan, INSUFFICIENT)
    if not settings.resamples:
        return result(_median(c) / _median(b), math.nan, math.nan, NO_CHANGE)
    alpha = 1 - settings.confidence
    if min_rank_sum_p(len(c), len(b)) > alpha:
        # a handful (of spans, or of report windows) cannot be told apart from a noisy machine at this confidence,
        # whatever their spread (3 against 3 gives p >= 0.1); a percentile bootstrap of 3 values' median would
        # still give an interval that excludes 1 whenever one side lies above the other
        return dataclasses.replace(result(_median(c) / _median(b), math.nan, math.nan, INSUFFICIENT), note=(
            f"{len(c)} against {len(b)} {'windows' if what.windowed else 'spans'}: too few for a test at "
            f"{settings.confidence:.0%}"))
    ratio, low, high = bootstrap_ratio(c, b, confidence=settings.confidence, resamples=settings.resamples,
                                       seed=settings.seed)
    verdict = decide(low, high, higher_is_better=what.higher_is_better, min_effect=settings.min_effect)
    if verdict != NO_CHANGE and not what.windowed and rank_sum_p(c, b) >= alpha:
        # spans are few: the bootstrap of their medians is coarse; the values must also tend to lie on one side
        verdict = NO_CHANGE
    return result(ratio, low, high, verdict)


def _within(candidate: Sequence[float], baseline: Sequence[float], min_effect: float) -> bool:
    if len(candidate) < MIN_WINDOWS or len(baseline) < MIN_WINDOWS:
        return False
    b = _median(_blocks(baseline))
    return b > 0 and abs(_median(_blocks(candidate)) / b - 1) <= min_effect


def format_ratio(ratio: float) -> str:
    return "-" if not math.isfinite(ratio) else f"{(ratio - 1) * 100:+.1f}%"
