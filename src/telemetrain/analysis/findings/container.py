"""A likely OOM kill by the container's cgroup: a run that ended killed (a training loop or application span that
never ended: SIGKILL leaves no traceback and no exit code in the run) on a host whose cgroup memory limit it was
about to reach, or whose cgroup's OOM-kill counter rose while it ran.

**The rule**: on a host with a killed rank (or, the rank's host unknown, any host), the cgroup's ``oom_kill``
counter (``container.memory.oom_kills``) rose over the run, or one of its last ``LAST_SAMPLES`` samples was at least
``NEAR_LIMIT`` of the limit: of the working set where it was read (``container.memory.working_set``: usage less the
inactive file cache, which the kernel reclaims before it kills), else of the usage. A run that ended normally gets no
such finding, however close to its limit it ran.

What it cannot see: the sampler runs in the training process, so the kill that ends it is rarely counted in the run
(the counter rises when another process of the cgroup -- a DataLoader worker, another rank -- is killed first); memory
that climbs to the limit within one sampling interval leaves no sample near it, and the last ~0.2 s of samples (the
store's flush interval) die with the process. Under ``telemetrain launch`` the agent, which outlives its workers,
reads the count at a worker's SIGKILL: the crash finding (``worker_exits``) names the container's OOM killer then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .fmt import bytes_, ranges
from .inputs import ContainerMemory, SpanFailure
from .model import Evidence, Finding

__all__ = ["LAST_SAMPLES", "NEAR_LIMIT", "oom_kills"]

NEAR_LIMIT = 0.95  # usage / limit in a last sample: "within a few percent of the limit"
LAST_SAMPLES = 3


def oom_kills(failures: Sequence[SpanFailure], containers: Sequence[ContainerMemory],
              hosts: Mapping[int, str]) -> list[Finding]:
    killed = sorted({f.rank for f in failures if f.status == "never ended"})
    if not killed or not containers:
        return []
    findings = []
    for c in sorted(containers, key=lambda c: c.host):
        ranks = [r for r in killed if hosts.get(r) in (c.host, None, "")]
        if not ranks:
            continue
        last = [v for _, v in sorted(c.last)[-LAST_SAMPLES:]]
        peak = max(last, default=0.0)
        rose = c.oom_kills is not None and c.oom_kills[1] > c.oom_kills[0]
        near = bool(last) and peak >= NEAR_LIMIT * c.limit
        if not (rose or near):
            continue
        where = f" on {c.host}" if c.host else ""
        evidence = [f"cgroup memory limit {bytes_(c.limit)}"]
        if last:
            what = "working set (usage less inactive file cache)" if c.working_set else "usage"
            evidence.append(f"last {what} {bytes_(last[-1])} ({last[-1] / c.limit:.1%} of the limit; peak of the last "
                            f"{len(last)} sample(s) {peak / c.limit:.1%})")
        if c.oom_kills is not None:
            kills = c.oom_kills[1] - c.oom_kills[0]
            moved = f"rose by {kills:.0f}" if rose else "did not rise"
            evidence.append(f"the cgroup's oom_kill counter {moved} while sampled ({c.oom_kills[0]:.0f} -> "
                            f"{c.oom_kills[1]:.0f})")
        findings.append(Finding(
            "error", "oom kill",
            f"oom kill: rank(s) {ranges(ranks)} likely killed by the container's OOM killer{where}",
            f"rank(s) {ranges(ranks)} were killed (their training spans never ended) while their container's memory "
            f"was {'at' if near else 'under'} its cgroup limit: " + "; ".join(evidence) + ". Raise the container's "
            "memory limit or lower the job's host memory (DataLoader workers, prefetch, pinned buffers)",
            Evidence(ranks=tuple(ranks), value=last[-1] if last else None, reference=c.limit,
                     effect=(last[-1] / c.limit) if last else None, effect_unit="of limit",
                     test="killed run vs cgroup memory limit and oom_kill counter")))
    return findings
