"""What ``compare`` returns: each metric's comparison (``MetricComparison``), the runs it read (``RunRef``), every
metric of one candidate (``CandidateComparison``) and candidates against one baseline (``Comparison``), with the
verdicts they carry and their JSON form (``--json``). ``compare.py`` makes them. docs/compare.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .samples import RunSamples

__all__ = [
    "IMPROVEMENT",
    "INCONCLUSIVE",
    "INSUFFICIENT",
    "NO_CHANGE",
    "ONE_VALUE",
    "REGRESSION",
    "CandidateComparison",
    "Comparison",
    "MetricComparison",
    "RunRef",
]

REGRESSION = "regression"
IMPROVEMENT = "improvement"
NO_CHANGE = "no significant change"
INSUFFICIENT = "insufficient data"
INCONCLUSIVE = "inconclusive: the machine was busy"
ONE_VALUE = "not tested"


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
    verdict: str  # regression, improvement, no significant change, insufficient data, inconclusive, not tested
    rank: int | None = None
    note: str = ""  # why a verdict is inconclusive or not tested
    min_effect: float | None = None  # the effect this metric needed (the history's spread may raise it)

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
            "note": self.note, "min_effect": self.min_effect,
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
    iteration_spans: int = 0  # how many sampled spans the two are of

    @classmethod
    def of(cls, s: RunSamples) -> RunRef:
        pct = s.iteration_percentiles()
        return cls(path=str(s.path), run_id=s.run_id, session_tag=s.session_tag, perf_tag=s.perf_tag,
                   windows=s.window_count, ranks=tuple(s.ranks), iteration_p50=pct[0] if pct else None,
                   iteration_p99=pct[1] if pct else None, iteration_spans=pct[2] if pct else 0)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "run_id": self.run_id, "session_tag": self.session_tag, "perf_tag": self.perf_tag,
                "windows": self.windows, "ranks": list(self.ranks), "iteration_p50": self.iteration_p50,
                "iteration_p99": self.iteration_p99, "iteration_spans": self.iteration_spans}


@dataclass(frozen=True)
class CandidateComparison:
    """Every metric of one candidate run against the baseline."""

    candidate: RunRef
    metrics: tuple[MetricComparison, ...]
    notes: tuple[str, ...] = ()
    quality: Any = None  # compare_quality.QualityComparison: the loss (or an eval metric) of both runs, and curves

    @property
    def regressions(self) -> list[MetricComparison]:
        return [m for m in self.metrics if m.verdict == REGRESSION]

    @property
    def improvements(self) -> list[MetricComparison]:
        return [m for m in self.metrics if m.verdict == IMPROVEMENT]

    @property
    def inconclusive(self) -> list[MetricComparison]:
        return [m for m in self.metrics if m.verdict == INCONCLUSIVE]

    @property
    def tested(self) -> bool:
        """Whether any row was decided (every row short of data means no regression could have been found)."""
        return any(m.verdict not in (INSUFFICIENT, ONE_VALUE) for m in self.metrics)

    def metric(self, metric: str, rank: int | None = None) -> MetricComparison | None:
        """A metric by name: ``iteration_time``, ``samples_per_second``, a phase, ``checkpoint_save``,
        ``checkpoint_load``, ``validation``, ``goodput``; with ``rank``, that rank's (iteration time or phase)."""
        for m in self.metrics:
            if m.metric == metric and m.rank == rank and (rank is not None or m.scope not in ("rank", "rank phase")):
                return m
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate.as_dict(), "metrics": [m.as_dict() for m in self.metrics],
                "regressions": [m.label for m in self.regressions],
                "improvements": [m.label for m in self.improvements],
                "inconclusive": [m.label for m in self.inconclusive], "notes": list(self.notes),
                "quality": self.quality.as_dict() if self.quality is not None else None}


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

    @property
    def untested(self) -> list[RunRef]:
        """The candidates of which nothing was tested."""
        return [c.candidate for c in self.candidates if not c.tested]

    def as_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.as_dict(), "candidates": [c.as_dict() for c in self.candidates],
                "confidence": self.confidence, "min_effect": self.min_effect, "resamples": self.resamples,
                "seed": self.seed, "forced": self.forced, "notes": list(self.notes)}
