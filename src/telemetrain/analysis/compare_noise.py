"""The noise between runs, which a metric's significant change is judged against (``findings.noise``): the
between-run spread of the perf tag's earlier runs raises the effect a change needs, and a change of a time that the
busier machine explains (the same test net of the CPU wait no longer finds it; or the busy machine's allowance covers
it, when no earlier runs measure the spread) is inconclusive, not a regression.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .compare_bootstrap import median as _median
from .compare_metric import _compare_series, _Metric, _Series, _Settings, format_ratio
from .compare_model import INCONCLUSIVE, REGRESSION, MetricComparison
from .findings.noise import (
    BUSY_RESIDUAL,
    SATURATED_WAIT,
    Contention,
    explained_factor,
    history_min_effect,
    steal_factor,
)
from .samples import RunSamples

__all__: list[str] = []


class _Noise:
    """What a candidate's changes are judged against: the between-run spread of the perf tag's history (per metric)
    and the candidate's and baseline's contention (``findings.noise``)."""

    def __init__(self, candidate: RunSamples, baseline: RunSamples, history: Sequence[RunSamples],
                 settings: _Settings) -> None:
        self.candidate, self.baseline, self.history, self.settings = candidate, baseline, history, settings
        self.busy_free = candidate.waits_known and baseline.waits_known
        self.contention = (Contention.of(candidate.wait_fraction(), candidate.contention, candidate.cpu_count),
                           Contention.of(baseline.wait_fraction(), baseline.contention, baseline.cpu_count))
        self.factor, self.reason = explained_factor(*self.contention)
        # the steal is in neither the CPU wait nor the CPU share: it multiplies what those explain
        self.steal, why = steal_factor(*self.contention)
        self.reason = "; ".join(r for r in (self.reason, why) if r)
        self.widened: list[str] = []
        # the metrics whose between-run spread the history measured (it needs MIN_HISTORY run medians: one or two
        # earlier runs measure nothing, and must not switch off the busy-machine allowance and the notes)
        self.measured: set[str] = set()

    def settings_for(self, what: _Metric, series: _Series) -> _Settings:
        """The settings with ``min_effect`` raised to the between-run spread of the history, where it is larger."""
        if not self.history:
            return self.settings
        medians = [_median(v) for v in (series(run, False) for run in (*self.history, self.baseline)) if v]
        spread = history_min_effect(medians, self.settings.confidence)
        if spread is None:
            return self.settings
        self.measured.add(what.label)
        if spread <= self.settings.min_effect:
            return self.settings
        spread = min(spread, 0.99)
        self.widened.append(f"{what.label} +/-{spread:.0%}")
        return dataclasses.replace(self.settings, min_effect=spread)

    def judge(self, m: MetricComparison, what: _Metric, series: _Series, settings: _Settings) -> MetricComparison:
        """A significant change of a time (or throughput) that the machine explains becomes inconclusive: the same
        test on the windows' times net of the CPU wait no longer finds it; or the machine was busy, no earlier runs
        measure the spread, and the change is within what a busy machine does to clean runs (``BUSY_RESIDUAL``,
        times the process CPU share's factor when that is the only signal)."""
        if not m.significant or what.metric == "goodput":
            return m
        slower = m.verdict == REGRESSION  # the candidate is the slower run (else the baseline is)
        busier, other = self.contention if slower else self.contention[::-1]
        # (both saturated alike, as ranks sharing cores on both sides: like for like, the net re-test below decides)
        if busier.wait_fraction is not None and busier.wait_fraction > SATURATED_WAIT and \
                (other.wait_fraction is None or other.wait_fraction <= SATURATED_WAIT):
            return dataclasses.replace(m, verdict=INCONCLUSIVE, note=(
                f"the {'candidate' if slower else 'baseline'} got less than half the CPU it asked for "
                f"({busier.describe()}): its times say little of its code"))
        if self.busy_free and what.windowed:
            net = _compare_series(series(self.candidate, True), series(self.baseline, True), what, settings)
            if net.verdict != m.verdict:
                return dataclasses.replace(m, verdict=INCONCLUSIVE, note=(
                    f"with the CPU wait taken out the change is {format_ratio(net.ratio)} ({net.verdict}): "
                    + self.reason))
            m_net = net
        else:
            m_net = m
        # with the CPU waits known the net series above took the factor out: a wait ratio a hair off 1 (2% against
        # 3%) says nothing of a busy machine, so only the busier run's own signals (or the steal) grant the allowance
        explained = self.factor != 1.0 and not self.busy_free
        if what.label in self.measured or not (busier.busy or explained or self.steal != 1.0):
            return m
        factor = (self.factor if not self.busy_free else 1.0) * self.steal
        factor = factor if slower else 1 / factor
        allowed = max(factor, 1.0) * (1 + BUSY_RESIDUAL)
        # the bound of the (net) interval nearest "no change", as a slowdown factor of the busier run
        low, high = m_net.ci_low, m_net.ci_high
        nearest = (low if slower else 1 / high) if not what.higher_is_better else (1 / high if slower else low)
        if nearest <= allowed:
            return dataclasses.replace(m, verdict=INCONCLUSIVE, note=(
                f"the {'candidate' if slower else 'baseline'} ran on a busy machine ({busier.describe()}); there "
                f"busy-machine noise reaches {allowed - 1:.0%} between clean runs, and no earlier runs of this "
                "perf_tag measure it better"))
        return m
