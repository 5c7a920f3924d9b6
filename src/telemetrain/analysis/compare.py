"""Compare runs against a baseline: a bootstrap confidence interval of the ratio of medians, and a decision.

The unit of observation is the report window (``samples.py``): a run's series is one value per window (the ranks'
windows ending at the same iteration averaged into one). For each metric, both series are resampled with
replacement, independently, ``resamples`` times (a seeded ``random.Random``: the same inputs give the same answer;
``compare_bootstrap.py``, on NumPy arrays when installed, to the same interval);
each resample gives ``median(candidate*) / median(baseline*)`` and the percentile interval of those ratios is the
confidence interval. Consequence: the interval is over windows, i.e. it says how sure we are of each run's typical
window, not how much a third run on other nodes would differ; ``min_effect`` is there for that run-to-run variation.

Decision, for a lower-is-better metric (iteration time, a phase's time): a regression when the whole interval lies
above ``1 + min_effect``, an improvement when it lies below ``1 - min_effect``, otherwise no significant change.
Throughput is higher-is-better: the other way round.

Past ``MAX_UNITS`` windows, consecutive windows are averaged into ``MAX_UNITS`` blocks before resampling: neighbouring
windows are correlated (a block bootstrap respects that), and the cost stays bounded for long runs.

Noise between runs (``findings.noise``): with earlier runs of the perf tag (``history``), a metric needs at least the
change their spread explains; and a significant change of a time that the candidate's busier machine explains -- the
same test on the windows' times net of the CPU wait no longer finds it, or, without per-window waits, the process's
lower CPU share on a busy host covers it -- is ``inconclusive: the machine was busy``, not a regression. Checkpoint
saves and loads and validation loops are compared as one observation per span (the ranks' k-th averaged), goodput is
shown (one value per run: not tested). What a comparison returns is in ``compare_model.py``; one metric's test is in
``compare_metric.py``, the noise between runs in ``compare_noise.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..store.reader import Run
from .compare_bootstrap import bootstrap_ratio
from .compare_bootstrap import median as _median
from .compare_metric import MIN_WINDOWS as MIN_WINDOWS  # (the one metric's test: re-exported, as before the split)
from .compare_metric import (
    _compare_series,
    _duration_series,
    _median_or_nan,
    _Metric,
    _Series,
    _Settings,
    _window_series,
    _within,
)
from .compare_metric import decide as decide
from .compare_metric import format_ratio as format_ratio
from .compare_model import IMPROVEMENT as IMPROVEMENT  # (the verdicts: re-exported, callers import them from here)
from .compare_model import INCONCLUSIVE as INCONCLUSIVE
from .compare_model import INSUFFICIENT as INSUFFICIENT
from .compare_model import NO_CHANGE as NO_CHANGE
from .compare_model import ONE_VALUE as ONE_VALUE
from .compare_model import REGRESSION as REGRESSION
from .compare_model import CandidateComparison, Comparison, MetricComparison, RunRef
from .compare_noise import _Noise
from .findings.fmt import ranges
from .samples import OTHER, PHASES, RunSamples, read_samples, run_samples, with_goodput

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_MIN_EFFECT",
    "DEFAULT_RESAMPLES",
    "CandidateComparison",
    "Comparison",
    "ConfigMismatch",
    "MetricComparison",
    "PerfTagMismatch",
    "RunRef",
    "WorkloadMismatch",
    "bootstrap_ratio",
    "compare_runs",
]

DEFAULT_CONFIDENCE = 0.95
# 3%: smaller changes are within what the same job on the same hardware commonly varies from run to run (clock boost,
# placement, data order), which a within-run interval cannot see; larger ones are worth a look.
DEFAULT_MIN_EFFECT = 0.03
DEFAULT_RESAMPLES = 2000
FEW_WINDOWS = 10  # below this, a percentile bootstrap of a median is coarse: said in a note
# a rest of the step below this per iteration is the rounding of its boundaries (whole nanoseconds, each rounded on
# its own: phases given as float milliseconds sum to the step within a few ns), not time spent outside the phases
REST_RESIDUE_S = 1e-6
SHORT_RUN_S = 60.0  # a shorter run's typical window is one draw of the machine's state: said in a note
MAX_RANK_PHASES = 16  # per-rank phase rows up to this many ranks (a row per rank and phase beyond is too many)


class WorkloadMismatch(ValueError):
    """The runs are different workloads; comparing them needs ``force=True`` (``--force``). ``reason`` says how they
    differ, without the advice, so that each caller can name its own way to force."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}; pass force=True to compare anyway")
        self.reason = reason


class PerfTagMismatch(WorkloadMismatch):
    """The runs were tagged as different workloads (``perf_tag``)."""


class ConfigMismatch(WorkloadMismatch):
    """The runs' recorded workloads differ (``run.json``'s ``workload``: model FLOPs per sample, batch, sequence
    length, world size)."""


def _training_seconds(run: RunSamples) -> float:
    """Seconds of training in ``run``: its median iteration time times its iterations (the lowest rank's windows);
    NaN when unknown."""
    times = run.series("iteration_time")
    if not run.ranks or not times:
        return math.nan
    return _median(times) * run.steady_iterations()


def _training_per_span(run: RunSamples, spans: int) -> float:
    """Seconds of training per span of a kind (``spans`` of them in ``run``); NaN when unknown."""
    return _training_seconds(run) / spans if spans >= 1 else math.nan


def _metrics(candidate: RunSamples, baseline: RunSamples, phases: bool, ranks: bool,
             notes: list[str]) -> list[tuple[_Metric, _Series]]:
    """Every metric both runs can be compared on, with its series."""
    out: list[tuple[_Metric, _Series]] = [
        (_Metric("iteration_time", "run", "iteration time", "s", False), _window_series("iteration_time"))]
    if candidate.series("samples_per_second") and baseline.series("samples_per_second"):
        out.append((_Metric("samples_per_second", "run", "throughput", "samples/s", True),
                    _window_series("samples_per_second")))
    elif candidate.series("iteration_time") and baseline.series("iteration_time"):
        # (without any steady window either, the notes on the windows say why; global_batch_size is not the cause)
        notes.append("throughput not compared: no samples_per_second (global_batch_size not configured?)")
    clock, other = candidate.phase_source, baseline.phase_source
    on_device = " (device time)" if clock == "device" else ""
    if phases and clock != other and clock and other:
        notes.append(f"phases not compared: the candidate's phase times are {clock} times, the baseline's {other} "
                     "times (device timing on in one run only)")
        phases = False  # nor each rank's
    elif phases:
        for phase in PHASES:
            if candidate.series(phase) and baseline.series(phase):
                out.append((_Metric(phase, "phase", f"{phase} phase{on_device}", "s", False), _window_series(phase)))
        rest = candidate.series(OTHER), baseline.series(OTHER)  # the step's time outside the phases, compared too,
        # unless it is rounding residue in both runs (phases that sum to the step): a ratio of two residues would
        # read as "+222%" of nothing
        if all(rest) and max(abs(_median(r)) for r in rest) >= REST_RESIDUE_S:
            out.append((_Metric(OTHER, "phase", "rest of the step", "s", False), _window_series(OTHER)))
    for kind, label in (("checkpoint_save", "checkpoint save"), ("checkpoint_load", "checkpoint load"),
                        ("validation", "validation loop")):
        if candidate.durations.get(kind) and baseline.durations.get(kind):
            out.append((_Metric(kind, "event", label, "s", False, windowed=False), _duration_series(kind)))
    if ranks:
        common = sorted(set(candidate.ranks) & set(baseline.ranks))
        if len(common) > 1:
            for r in common:
                out.append((_Metric("iteration_time", "rank", f"rank {r} iteration time", "s", False, rank=r),
                            _window_series("iteration_time", r)))
            if phases and len(common) <= MAX_RANK_PHASES:
                for r in common:
                    for phase in PHASES:
                        if candidate.series(phase, r) and baseline.series(phase, r):
                            label = f"rank {r} {phase} phase{on_device}"
                            out.append((_Metric(phase, "rank phase", label, "s", False, rank=r),
                                        _window_series(phase, r)))
            elif phases:
                notes.append(f"per-rank phases not compared: more than {MAX_RANK_PHASES} ranks")
        missing = sorted(set(candidate.ranks) ^ set(baseline.ranks))
        if missing:
            notes.append(f"ranks in only one of the runs, not compared per rank: {ranges(missing)}")
    return out


def _goodput_row(candidate: RunSamples, baseline: RunSamples, notes: list[str]) -> MetricComparison | None:
    c, b = candidate.goodput, baseline.goodput
    runs = (("candidate", candidate), ("baseline", baseline))
    notes += [f"{role} {r.run_id}: {_whose_loop(r.open_ranks)} has not ended ("
              + ("still running: its figures so far)" if r.open_loop == "running" else "killed: SIGKILL, OOM kill, "
                 "node failure); its figures stop at its last report") for role, r in runs if r.open_loop]
    if c is None or b is None or not b > 0:
        return None
    if any(r.open_loop == "killed" for _, r in runs):  # its work since its last checkpoint is lost: often 0%
        notes.append("goodput not compared: a killed run's work since its last checkpoint counts as lost")
        return None
    return MetricComparison(metric="goodput", scope="run", label="goodput", unit="1", higher_is_better=True,
                            baseline_median=b, candidate_median=c, baseline_windows=1, candidate_windows=1,
                            ratio=c / b, ci_low=math.nan, ci_high=math.nan, verdict=ONE_VALUE,
                            note="one value per run: shown, not tested")


def _whose_loop(ranks: Sequence[int]) -> str:
    """Who the open-loop note is about: the run's own loop (rank 0, or unknown), else the ranks named."""
    if not ranks or tuple(ranks) == (0,):
        return "its training loop"
    named = ", ".join(str(r) for r in ranks[:8]) + (f" (+{len(ranks) - 8} more)" if len(ranks) > 8 else "")
    return f"the training loop of rank {named}"


def compare_samples(candidate: RunSamples, baseline: RunSamples, *, confidence: float = DEFAULT_CONFIDENCE,
                    min_effect: float = DEFAULT_MIN_EFFECT, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                    phases: bool = True, ranks: bool = True,
                    history: Sequence[RunSamples] = (), loss: str | None = None) -> CandidateComparison:
    """Every metric of ``candidate`` against ``baseline``: the run's iteration time and throughput, each phase's time,
    the checkpoint saves and loads and validation loops, each rank's iteration time and phases (the ranks both runs
    have), and goodput (shown, one value per run). ``history``: earlier runs of the same workload, whose spread
    raises the effect a change needs; a significant change that the candidate's busier machine explains is
    ``inconclusive: the machine was busy`` (``findings.noise``)."""
    settings = _Settings(confidence, min_effect, resamples, seed)
    notes: list[str] = []
    noise = _Noise(candidate, baseline, history, settings)
    metrics = []
    for what, series in _metrics(candidate, baseline, phases, ranks, notes):
        own = noise.settings_for(what, series)
        c_values, b_values = series(candidate, False), series(baseline, False)
        if what.scope == "rank phase" and _within(c_values, b_values, own.min_effect):
            # a per-rank phase row (shown only when significant): its medians' ratio inside the band cannot give a
            # significant interval, so the resampling is skipped (16 ranks x 4 phases would cost most of compare)
            metrics.append(_compare_series(c_values, b_values, what, dataclasses.replace(own, resamples=0)))
            continue
        m = noise.judge(_compare_series(c_values, b_values, what, own), what, series, own)
        if what.scope in ("phase", "rank phase") and m.significant:
            # a phase is part of a step: a large ratio of a small time (a 0.1 ms data loader 23% slower between two
            # runs on a quiet machine) is not worth naming unless the time it added (or saved) is at least min_effect
            # of the baseline's iteration time (the run's, or the rank's for a rank's phase)
            whole = _median_or_nan(baseline.series("iteration_time", what.rank))
            if abs(m.candidate_median - m.baseline_median) < own.min_effect * whole:
                m = dataclasses.replace(m, verdict=NO_CHANGE, note=f"changed by less than {own.min_effect:.0%} of "
                                        "the iteration time")
        if not what.windowed and m.significant:
            # likewise a span is part of the run: a checkpoint save (a validation loop) whose change is under
            # min_effect of the training between two of them moves the job less than runs commonly differ (two
            # clean runs' 3 ms saves on a quiet machine differed 9%, a file system's jitter), so it is not named
            between = _training_per_span(baseline, len(b_values))
            if abs(m.candidate_median - m.baseline_median) < own.min_effect * between:
                m = dataclasses.replace(m, verdict=NO_CHANGE, note=f"changed by less than {own.min_effect:.0%} of "
                                        "the training time between two of them")
        metrics.append(m)
    goodput = _goodput_row(candidate, baseline, notes)
    if goodput is not None:
        metrics.append(goodput)
    if noise.widened:
        notes.append(f"between-run spread of {len(history)} earlier run(s) with this perf_tag (and the baseline) "
                     f"raises the effect needed: {', '.join(noise.widened[:6])}"
                     + (f" (+{len(noise.widened) - 6} more)" if len(noise.widened) > 6 else ""))
    c_busy, b_busy = noise.contention
    if any(m.verdict == INCONCLUSIVE for m in metrics) or noise.factor >= 1 + min_effect:
        notes.append(f"machine: candidate {c_busy.describe()}; baseline {b_busy.describe()}")
    elif not noise.busy_free and not noise.reason and not noise.measured:
        notes.append("no contention signal (CPU wait per window, or the system sampler) and no earlier runs: a busy "
                     "machine cannot be told from a regression; the interval covers windows within each run only")
    for role, run in (("candidate", candidate), ("baseline", baseline)):
        n = len(run.series("iteration_time"))
        if n < MIN_WINDOWS:
            notes.append(f"{role} {run.run_id}: {n} steady-state report window(s) (training_metrics_update after the "
                         f"first); at least {MIN_WINDOWS} are needed: a longer run or a smaller "
                         "log_every_n_train_iterations")
        elif n < FEW_WINDOWS:
            untested = any(m.metric == "iteration_time" and m.scope == "run" and m.verdict == INSUFFICIENT
                           for m in metrics)  # the rank-sum floor: no interval was computed
            notes.append(f"{role} {run.run_id}: only {n} report windows; "
                         + ("too few for a test against the other run's" if untested else "the interval is coarse"))
    shorter = min(_training_seconds(candidate), _training_seconds(baseline))
    if not noise.measured and shorter < SHORT_RUN_S and any(m.significant for m in metrics):
        notes.append(f"the shorter run trained {shorter:.2g} s: a run that short is one draw of the machine's state "
                     "(in a VM another tenant on the same physical core shows nowhere: two clean 2 s runs on a CI VM "
                     "differed 10.6%); compare a second candidate, or against earlier runs of the perf_tag (--history)")
    from ..report.curves import pick_loss
    from .compare_quality import compare_quality

    if loss:
        lacking = [f"{role} {run.run_id}" for role, run in (("candidate", candidate), ("baseline", baseline))
                   if pick_loss(run.curves.names(), loss) is None]
        if lacking:
            notes.append(f"quality not compared: no metric {loss!r} in the {' nor the '.join(lacking)}")

    return CandidateComparison(candidate=RunRef.of(candidate), metrics=tuple(metrics), notes=tuple(notes),
                               quality=compare_quality(candidate, baseline, loss))


def comparison_samples(run: RunSamples | Run | str | Path, loss: str | None = None, goodput: bool = False,
                curves: bool = True) -> RunSamples:
    """A run's samples; read from a directory, with only the curves the quality comparison reads (none for
    ``curves=False``: a run of the history) and its goodput when asked (by the same engine)."""
    if isinstance(run, (RunSamples, Run)):
        return run if isinstance(run, RunSamples) else run_samples(run)
    from .compare_quality import quality_series

    return read_samples(run, curves=quality_series(loss) if curves else (lambda name: False), goodput=goodput)


def compare_runs(candidates: RunSamples | Run | str | Path | Iterable[RunSamples | Run | str | Path],
                 baseline: RunSamples | Run | str | Path, *, confidence: float = DEFAULT_CONFIDENCE,
                 min_effect: float = DEFAULT_MIN_EFFECT, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                 force: bool = False, phases: bool = True, ranks: bool = True,
                 history: Iterable[RunSamples | Run | str | Path] = (), goodput: bool = True,
                 loss: str | None = None) -> Comparison:
    """Compare each candidate run with ``baseline`` (run directories, ``Run``s or ``RunSamples``).

    ``history``: earlier runs of the same workload (their between-run spread raises the effect a change needs);
    ``goodput``: compute each run's own goodput for its row (reads the whole runs); ``loss``: the metric the quality
    comparison reads (default: picked by name, ``report.curves.pick_loss``). Raises ``PerfTagMismatch`` when
    a candidate's ``perf_tag`` differs from the baseline's and ``ConfigMismatch`` when their recorded workloads
    clearly differ (``training.workload.differences``), unless ``force``; and ``ValueError`` for settings out of
    range.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
    if not 0 <= min_effect < 1:
        raise ValueError(f"min_effect must be in [0, 1), got {min_effect!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise ValueError(f"resamples must be an int >= 100, got {resamples!r}")
    if isinstance(candidates, (RunSamples, Run, str, Path)):
        candidates = [candidates]
    base = comparison_samples(baseline, loss, goodput)
    cands = [comparison_samples(c, loss, goodput) for c in candidates]
    if not cands:
        raise ValueError("compare_runs needs at least one candidate run")
    notes = []
    differing = [c for c in cands if c.perf_tag != base.perf_tag]
    if differing:
        listing = ", ".join(f"{c.run_id} ({c.perf_tag!r})" for c in differing)
        message = f"perf_tag differs from the baseline {base.run_id} ({base.perf_tag!r}): {listing}"
        if not force:
            raise PerfTagMismatch(message + "; these are different workloads")
        notes.append(message + "; compared anyway (forced)")
    from ..training.workload import differences  # (the training package is not needed to read runs otherwise)

    unlike = [(c, differences(c.workload, base.workload)) for c in cands]
    unlike = [(c, diff) for c, diff in unlike if diff]
    if unlike:
        listing = "; ".join(f"{c.run_id}: {', '.join(diff)}" for c, diff in unlike)
        message = f"the workload differs from the baseline {base.run_id} ({listing}, candidate vs baseline)"
        if not force:
            raise ConfigMismatch(message + ": these are different workloads")
        notes.append(message + "; compared anyway (forced)")
    earlier = [comparison_samples(h, curves=False) for h in history]
    other = [h for h in earlier if differences(h.workload, base.workload)]
    if other:  # their medians would measure the workloads' difference as noise, and hide real changes
        earlier = [h for h in earlier if not differences(h.workload, base.workload)]
        notes.append(f"history: left out {len(other)} run(s) of another workload than the baseline's: "
                     + ", ".join(f"{h.run_id} ({', '.join(differences(h.workload, base.workload))})"
                                 for h in other[:4]) + (" ..." if len(other) > 4 else ""))
    if goodput:
        for run in (base, *cands):
            if run.goodput is None:
                with_goodput(run)
    results = tuple(compare_samples(c, base, confidence=confidence, min_effect=min_effect, resamples=resamples,
                                    seed=seed, phases=phases, ranks=ranks, history=earlier, loss=loss)
                    for c in cands)
    return Comparison(baseline=RunRef.of(base), candidates=results, confidence=confidence, min_effect=min_effect,
                      resamples=resamples, seed=seed, forced=bool(differing or unlike), notes=tuple(notes))
