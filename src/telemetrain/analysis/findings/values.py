"""NaN/inf values, and spikes in the loss and the gradient norm.

**Non-finite**: any metric value stored as NaN or inf (and stat windows counting some) is a finding, per metric name,
with the count and the first step: a fact, no test.

**Spikes** (series named like a loss -- a name part containing ``loss`` -- or a gradient norm -- ``grad_norm``,
``gradnorm``, ``grad-norm``, ``gradient_norm``): each finite point is compared with the median and MAD of the
``spike_history`` finite, non-spike points before it (after ``spike_min_history`` of them): a spike when its robust z
is at least ``spike_z`` and it is at least ``spike_ratio`` times that median. A loss falls as training goes; the
running reference follows it, a global one would not. Spikes of one name close together (any rank) are one episode;
the confidence is Chebyshev's distribution-free bound ``1 - 1/z^2``. Only upward jumps; a slow divergence is not a
spike.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from .fmt import ranges
from .inputs import NonFinite, ValueSeries
from .model import Evidence, Finding
from .stats import MAD_TO_SD, chebyshev_confidence, mad, median
from .thresholds import Thresholds

__all__ = ["nonfinite", "spikes", "value_kind"]

_GRAD = ("grad_norm", "gradnorm", "grad-norm", "grad.norm", "gradient_norm", "gradient-norm")


@functools.lru_cache(maxsize=4096)  # called per point by the input builders: a run has a few hundred names
def value_kind(name: str) -> str | None:
    """``loss``, ``grad_norm`` or None: which training value a metric name is."""
    low = name.lower()
    if any(g in low for g in _GRAD):
        return "grad_norm"
    parts = low.replace("/", ".").split(".")
    return "loss" if any("loss" in p for p in parts) else None


def nonfinite(items: Sequence[NonFinite]) -> list[Finding]:
    merged: dict[str, list[NonFinite]] = {}
    for item in items:
        merged.setdefault(item.name, []).append(item)
    findings = []
    for name, group in sorted(merged.items()):
        count = sum(i.count for i in group)
        stepped = [i for i in group if i.first_step is not None]
        first = min(stepped, key=lambda i: i.first_step or 0) if stepped else group[0]
        where = (f" (first at step {first.first_step}, rank {first.rank})" if first.first_step is not None
                 else f" (first on rank {first.rank})")
        ranks = tuple(sorted({i.rank for i in group}))
        findings.append(Finding(
            "warning", "nan/inf", f"non-finite values: {name}",
            f"{count} NaN/inf value(s) of {first.group}/{name}{where}, e.g. {first.example}"
            + (f"; on rank(s) {ranges(list(ranks))}" if len(ranks) > 1 else ""),
            Evidence(steps=(first.first_step, first.first_step) if first.first_step is not None else None,
                     ranks=ranks, value=first.example, test=f"{count} value(s) stored as NaN/inf")))
    return findings


def _series_spikes(s: ValueSeries, th: Thresholds) -> list[tuple[int, float, float, float]]:
    """(step, value, z, reference) of each spike of one series."""
    history: list[float] = []
    out = []
    for step, value in s.points:
        if value != value or value in (float("inf"), float("-inf")):
            continue
        if len(history) >= th.spike_min_history:
            recent = history[-th.spike_history:]
            center = median(recent)
            scale = max(MAD_TO_SD * mad(recent, center), 0.01 * abs(center), 1e-12)
            z = (value - center) / scale
            if z >= th.spike_z and (center <= 0 or value >= th.spike_ratio * center):
                out.append((step, value, z, center))
                continue  # a spike does not become the reference
        history.append(value)
    return out


def spikes(series: Sequence[ValueSeries], th: Thresholds) -> list[Finding]:
    by_name: dict[tuple[str, str], list[tuple[int, int, float, float, float]]] = {}
    for s in series:
        for step, value, z, ref in _series_spikes(s, th):
            by_name.setdefault((s.kind, s.name), []).append((step, s.rank, value, z, ref))
    findings = []
    for (kind, name), hits in sorted(by_name.items()):
        hits.sort()
        episodes: list[list[tuple[int, int, float, float, float]]] = []
        for h in hits:  # spikes within a few steps of each other (any rank) are one episode
            if episodes and h[0] - episodes[-1][-1][0] <= 3:
                episodes[-1].append(h)
            else:
                episodes.append([h])
        worst = max(hits, key=lambda h: h[3])
        steps = [e[0][0] for e in episodes]
        ranks = tuple(sorted({h[1] for h in hits}))
        label = "loss" if kind == "loss" else "gradient norm"
        ratio = worst[2] / worst[4] if worst[4] > 0 else float("inf")
        findings.append(Finding(
            "warning", "spike", f"{label} spike: {name} at step{'s' if len(steps) > 1 else ''} {ranges(steps)}",
            f"{len(episodes)} spike(s) of {name} (steps {ranges(steps)}, rank(s) {ranges(list(ranks))}); worst: "
            f"{worst[2]:.4g} at step {worst[0]} on rank {worst[1]}, {ratio:.3g}x the running median of the previous "
            f"{th.spike_history} points ({worst[4]:.4g}), robust z {worst[3]:.3g}",
            Evidence(effect=ratio, confidence=chebyshev_confidence(worst[3]), steps=(hits[0][0], hits[-1][0]),
                     ranks=ranks, value=worst[2], reference=worst[4],
                     test=f"{len(hits)} point(s) far above the running median (robust z, Chebyshev bound)")))
    return findings
