"""Candidates against several baselines: one ``Comparison`` per baseline, and a tally per metric.

Each candidate is compared with each baseline exactly as ``compare_runs`` does with one (same statistics, same seed,
same history); the tally counts, per candidate and metric, the baselines it regressed (improved) against. A metric
that regressed against **every** baseline is a change that one noisy or unlucky baseline cannot explain: that is
what ``--fail-on-regression`` fails on when there are several baselines. A metric compared against only some
baselines (throughput without a batch size in one of them) cannot be regressed against every one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..store.reader import Run
from .compare import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MIN_EFFECT,
    DEFAULT_RESAMPLES,
    IMPROVEMENT,
    REGRESSION,
    Comparison,
    MetricComparison,
    RunRef,
    compare_runs,
    comparison_samples,
)
from .samples import RunSamples

__all__ = ["MetricTally", "MultiComparison", "compare_baselines"]

_RunLike = RunSamples | Run | str | Path


@dataclass(frozen=True)
class MetricTally:
    """One metric of one candidate over all the baselines."""

    candidate: RunRef
    metric: str
    scope: str
    label: str
    rank: int | None
    baselines: int  # how many baselines there are
    compared: int  # against how many of them the metric was compared (it has a row)
    regressed: int
    improved: int
    changes: tuple[MetricComparison | None, ...]  # the row against each baseline, in order (None: no row)

    @property
    def regressed_against_all(self) -> bool:
        return self.baselines > 0 and self.regressed == self.baselines

    def as_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate.run_id, "metric": self.metric, "scope": self.scope, "label": self.label,
                "rank": self.rank, "baselines": self.baselines, "compared": self.compared,
                "regressed": self.regressed, "improved": self.improved,
                "regressed_against_all": self.regressed_against_all,
                "changes": [m.as_dict()["change"] if m is not None else None for m in self.changes],
                "verdicts": [m.verdict if m is not None else None for m in self.changes]}


@dataclass(frozen=True)
class MultiComparison:
    """The candidates against each of several baselines (``comparisons``, in the baselines' order)."""

    comparisons: tuple[Comparison, ...]

    @property
    def baselines(self) -> list[RunRef]:
        return [c.baseline for c in self.comparisons]

    @property
    def candidates(self) -> list[RunRef]:
        return [c.candidate for c in self.comparisons[0].candidates] if self.comparisons else []

    def tallies(self) -> list[MetricTally]:
        """Every (candidate, metric) with a row against at least one baseline, in the first baseline's row order
        (rows only some baselines have come after)."""
        out = []
        n = len(self.comparisons)
        for i, ref in enumerate(self.candidates):
            rows: dict[tuple[str, str, int | None], list[MetricComparison | None]] = {}
            labels: dict[tuple[str, str, int | None], str] = {}
            for j, comparison in enumerate(self.comparisons):
                for m in comparison.candidates[i].metrics:
                    key = (m.metric, m.scope, m.rank)
                    rows.setdefault(key, [None] * n)[j] = m
                    labels.setdefault(key, m.label)
            for key, changes in rows.items():
                present = [m for m in changes if m is not None]
                out.append(MetricTally(
                    candidate=ref, metric=key[0], scope=key[1], label=labels[key], rank=key[2], baselines=n,
                    compared=len(present), regressed=sum(m.verdict == REGRESSION for m in present),
                    improved=sum(m.verdict == IMPROVEMENT for m in present), changes=tuple(changes)))
        return out

    @property
    def untested(self) -> list[RunRef]:
        """The candidates of which nothing was tested against at least one baseline (then no metric of theirs can
        have regressed against every baseline)."""
        return [ref for i, ref in enumerate(self.candidates)
                if any(not comparison.candidates[i].tested for comparison in self.comparisons)]

    @property
    def regressions(self) -> list[MetricTally]:
        """The metrics that regressed against every baseline (what ``--fail-on-regression`` fails on)."""
        return [t for t in self.tallies() if t.regressed_against_all]

    def as_dict(self) -> dict[str, Any]:
        """``baselines``: each baseline's ``Comparison.as_dict()``; ``summary``: the tally of every metric that
        regressed or improved against at least one baseline; ``regressed_against_all``: their labels per candidate."""
        tallies = self.tallies()
        first = self.comparisons[0]
        return {"baselines": [c.as_dict() for c in self.comparisons],
                "summary": [t.as_dict() for t in tallies if t.regressed or t.improved],
                "regressed_against_all": {ref.run_id: [t.label for t in tallies
                                                       if t.candidate == ref and t.regressed_against_all]
                                          for ref in self.candidates},
                "confidence": first.confidence, "min_effect": first.min_effect, "resamples": first.resamples,
                "seed": first.seed}


def _key(run: RunSamples) -> str:
    return str(Path(run.path).resolve())


def compare_baselines(candidates: _RunLike | Iterable[_RunLike], baselines: Iterable[_RunLike], *,
                      confidence: float = DEFAULT_CONFIDENCE, min_effect: float = DEFAULT_MIN_EFFECT,
                      resamples: int = DEFAULT_RESAMPLES, seed: int = 0, force: bool = False, phases: bool = True,
                      ranks: bool = True, history: Iterable[_RunLike] = (), goodput: bool = True,
                      loss: str | None = None) -> MultiComparison:
    """Compare each candidate with each baseline (``compare_runs``' arguments, ``baselines`` a list). Each run is
    read once. Raises ``ValueError`` when no baseline is given, a baseline is given twice, or a baseline is also a
    candidate; ``PerfTagMismatch``/``ConfigMismatch`` as ``compare_runs`` does, naming the baseline."""
    if isinstance(candidates, (RunSamples, Run, str, Path)):
        candidates = [candidates]
    # read as compare_runs reads them: only the curves the quality comparison reads, goodput by the same engine
    cands = [comparison_samples(c, loss, goodput) for c in candidates]
    bases = [comparison_samples(b, loss, goodput) for b in baselines]
    if not bases:
        raise ValueError("compare_baselines needs at least one baseline run")
    seen: set[str] = set()
    for b in bases:
        if _key(b) in seen:
            raise ValueError(f"the baseline {b.path} is given twice")
        seen.add(_key(b))
    both = [c for c in cands if _key(c) in seen]
    if both:
        raise ValueError(f"the baseline {both[0].path} is also a candidate")
    earlier = [comparison_samples(h, curves=False) for h in history]
    return MultiComparison(tuple(
        compare_runs(cands, b, confidence=confidence, min_effect=min_effect, resamples=resamples, seed=seed,
                     force=force, phases=phases, ranks=ranks, history=earlier, goodput=goodput, loss=loss)
        for b in bases))

