"""Reading runs back: comparisons against a baseline, session goodput, a live view.

``compare_runs(candidates, baseline)`` is the Python entry point of ``telemetrain compare`` (docs/compare.md);
``compare_baselines(candidates, baselines)`` compares them with several baselines.
"""

from .compare import (
    CandidateComparison,
    Comparison,
    ConfigMismatch,
    MetricComparison,
    PerfTagMismatch,
    RunRef,
    WorkloadMismatch,
    bootstrap_ratio,
    compare_runs,
)
from .compare_multi import MetricTally, MultiComparison, compare_baselines
from .samples import RunSamples, Window, run_samples

__all__ = [
    "CandidateComparison",
    "Comparison",
    "ConfigMismatch",
    "MetricComparison",
    "MetricTally",
    "MultiComparison",
    "PerfTagMismatch",
    "RunRef",
    "RunSamples",
    "Window",
    "WorkloadMismatch",
    "bootstrap_ratio",
    "compare_baselines",
    "compare_runs",
    "run_samples",
]
