"""How much two runs of the same job differ without any change: the machine's contention and the between-run
variance, for ``compare``.

**Contention.** A run on a busier machine is slower without being worse. Three signals, best first:

1. the process's wait for a CPU (``cpu_wait_sec`` and ``cpu_time_sec`` per report window, Linux: the share
   ``wait / (cpu + wait)`` of its runnable time that another process had the CPU): each window's times can be
   taken net of it (``busy_free``), so compare re-tests a change on those; a regression that disappears is
   *inconclusive: the machine was busy*;
2. the sampler's process CPU share (``process.cpu.utilization``) while the host was busy (``system.cpu.utilization``
   at least ``BUSY_HOST``): a process that got a fraction ``f`` of the CPU it had before may take ``1/f`` as long;
3. the hypervisor's steal (``system.cpu.steal``, Linux guests): the share of the guest's busy CPU time another guest
   had (``steal / system.cpu.utilization``). It is in neither the process's CPU wait nor its CPU time -- the guest
   believes it ran -- so a stolen run looks slower with nothing else to show for it; from ``BUSY_STEAL`` on the
   machine was busy, and a run that lost a share ``s`` may take ``1/(1-s)`` as long (``steal_factor``);
4. GPU throttling (``hw.gpu.throttle.*``): a rise in the share of throttled samples is reported with the verdict.

``explained_factor`` turns 2 (or 1, as a whole-run figure) into the slowdown the machine alone could explain. What
the CPU wait does not capture -- a busy machine also slows a process *on* the CPU -- is allowed for, without earlier
runs, by ``BUSY_RESIDUAL`` (measured, see below).

**Between-run variance.** With earlier runs of the same perf tag, a metric's run medians spread by a robust standard
deviation ``s`` (of their logs); two runs then differ by ``exp(z s sqrt(2))`` or more by chance alone (``z``: the
confidence's normal quantile), and compare demands at least that effect (``history_min_effect``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .stats import MAD_TO_SD, mad, normal_quantile

__all__ = ["BUSY_HOST", "BUSY_RESIDUAL", "BUSY_STEAL", "BUSY_WAIT", "SATURATED_WAIT", "Contention", "explained_factor",
           "history_min_effect", "steal_factor"]

BUSY_HOST = 0.9  # host CPU utilisation from which a lower process CPU share is taken as contention
BUSY_WAIT = 0.05  # a run whose threads waited for a CPU this share of their runnable time ran on a busy machine
BUSY_STEAL = 0.05  # ... or whose guest lost this share of its busy CPU time to other guests (steal)
# On a busy machine a process also runs slower *on* the CPU (caches, memory bandwidth and SMT siblings shared with
# the other load, a hypervisor's steal): measured on repeated clean runs on a loaded 2-core VM
# (bench/bench_findings.py --calibrate; docs/compare.md), what is left after the CPU wait is taken out still differs
# between two clean runs by up to BUSY_RESIDUAL. Without earlier runs to measure the spread, a change within it on
# a busy machine is inconclusive.
BUSY_RESIDUAL = 0.6
# A run whose threads waited for a CPU more than this share of their runnable time got less than half the CPU it
# asked for, and its times say little of its code: threads that meet at barriers (an intra-op pool, a collective) stall
# on the one descheduled, far beyond 1/(1 - wait). Measured on the loaded 2-core VM, clean CPU torch runs: windows
# at 45-80% wait ran 7-40x slower than the same job's quiet windows, where 1/(1 - wait) explains 2-5x.
SATURATED_WAIT = 0.5
MIN_HISTORY = 3  # run medians needed for a between-run spread


@dataclass(frozen=True)
class Contention:
    """A run's contention signals (None: not recorded)."""

    wait_fraction: float | None = None  # median over windows of the contention share (wait / (cpu + wait))
    process_cpu: float | None = None  # mean process.cpu.utilization (share of the CPUs it may use)
    host_cpu: float | None = None  # mean system.cpu.utilization
    gpu_throttled: float | None = None  # share of GPU samples with a throttle flag
    cpu_count: float | None = None  # the CPUs process_cpu is a share of
    steal: float | None = None  # mean system.cpu.steal (share of all the host's CPU time)

    @property
    def stolen(self) -> float | None:
        """The share of the guest's busy CPU time that the hypervisor gave another guest: host-wide steal over the
        host's busy share (an idle CPU loses nothing: steal over all CPU time would dilute it)."""
        if self.steal is None:
            return None
        if self.host_cpu is not None and self.host_cpu > 0:
            return min(self.steal / self.host_cpu, 1.0)
        return self.steal

    @property
    def busy(self) -> bool:
        """The run shared a busy machine: its threads waited for a CPU, or its host was nearly saturated."""
        stolen = self.stolen
        return (self.wait_fraction is not None and self.wait_fraction >= BUSY_WAIT) or \
            (self.host_cpu is not None and self.host_cpu >= BUSY_HOST) or (stolen is not None and stolen >= BUSY_STEAL)

    @classmethod
    def of(cls, wait_fraction: float | None, signals: Mapping[str, float], cpu_count: float | None) -> Contention:
        return cls(wait_fraction, signals.get("process_cpu"), signals.get("host_cpu"), signals.get("gpu_throttled"),
                   cpu_count, signals.get("steal"))

    def describe(self) -> str:
        parts = []
        if self.wait_fraction is not None:
            parts.append(f"waited for a CPU {self.wait_fraction:.0%} of its runnable time")
        if self.process_cpu is not None:
            cores = f" = {self.process_cpu * self.cpu_count:.2f} cores" if self.cpu_count else ""
            parts.append(f"process CPU {self.process_cpu:.0%}{cores}")
        if self.host_cpu is not None:
            parts.append(f"host CPU {self.host_cpu:.0%} busy")
        stolen = self.stolen
        if stolen:
            parts.append(f"the hypervisor took {stolen:.0%} of it (steal)")
        if self.gpu_throttled:
            parts.append(f"GPU throttled in {self.gpu_throttled:.0%} of samples")
        return ", ".join(parts) or "no contention signal recorded"


def explained_factor(candidate: Contention, baseline: Contention) -> tuple[float, str]:
    """How many times slower the candidate could be from its machine alone (above 1: busier than the baseline's;
    below 1: the baseline's was the busier), and the signal behind it ("" when none says anything)."""
    if candidate.wait_fraction is not None and baseline.wait_fraction is not None:
        factor = (1 - baseline.wait_fraction) / max(1 - candidate.wait_fraction, 1e-3)
        return factor, (f"its threads waited for a CPU {candidate.wait_fraction:.0%} of their runnable time against "
                        f"{baseline.wait_fraction:.0%} in the baseline")
    c, b = candidate, baseline
    if c.process_cpu and b.process_cpu and c.host_cpu is not None and b.host_cpu is not None:
        busier = c if c.process_cpu < b.process_cpu else b
        if busier.host_cpu is not None and busier.host_cpu >= BUSY_HOST:
            factor = b.process_cpu / c.process_cpu
            return factor, (f"the process got {c.process_cpu:.0%} of its CPUs against {b.process_cpu:.0%} in the "
                            f"baseline, on a host {busier.host_cpu:.0%} busy")
    return 1.0, ""


def steal_factor(candidate: Contention, baseline: Contention) -> tuple[float, str]:
    """How many times slower the candidate could be from the steal alone (above 1: more of its CPU time was stolen
    than the baseline's), and why ("" when neither run lost ``BUSY_STEAL`` or either is unknown). Steal is in neither
    the CPU wait nor the process CPU share: it multiplies ``explained_factor``'s."""
    c, b = candidate.stolen, baseline.stolen
    if c is None or b is None or max(c, b) < BUSY_STEAL:
        return 1.0, ""
    return (1 - b) / max(1 - c, 1e-3), (f"the hypervisor took {c:.0%} of the candidate's busy CPU time against "
                                        f"{b:.0%} of the baseline's (steal)")


def history_min_effect(medians: Sequence[float], confidence: float) -> float | None:
    """The smallest relative change between two runs that the spread of ``medians`` (one per earlier run, the
    baseline's included) does not explain at ``confidence``; None with fewer than ``MIN_HISTORY`` usable values."""
    logs = [math.log(m) for m in medians if m > 0 and math.isfinite(m)]
    if len(logs) < MIN_HISTORY:
        return None
    spread = MAD_TO_SD * mad(logs)
    z = normal_quantile((1 + confidence) / 2)
    return math.exp(z * spread * math.sqrt(2)) - 1
