"""NaN/inf values, and spikes in the loss and the gradient norm.

**Non-finite**: any metric value stored as NaN or inf (and stat windows counting some) is a finding, per metric name,
with the count and the first step: a fact, no test.

**Spikes** (series named like a loss -- a name part containing ``loss`` -- or a gradient norm -- ``grad_norm``,
``gradnorm``, ``grad-norm``, ``gradient_norm``): each finite point is compared with the median and MAD of the
``spike_history`` finite, non-spike points before it (after ``spike_min_history`` of them): a spike when its robust z
is at least ``spike_z`` and it is at least ``spike_ratio`` times that median (a median of 0 or below: times the
largest of those points, when positive; the scale at least 1% of the median, or of the largest magnitude when the
median is 0: a reference of exact zeros has none, and nothing is a spike against it). A loss falls as training goes; the
running reference follows it, a global one would not. Spikes of one name close together (any rank) are one episode;
the confidence is Chebyshev's distribution-free bound ``1 - 1/z^2``. Only upward jumps; a slow divergence is not a
spike.

**Many ranks.** Each rank's series of a name is tested at every point: with ``m`` ranks, some rank's noisy loss
crosses ``spike_z`` by chance (per-rank losses with heavy tails: 1,024 ranks x 300 steps of a clean run gave dozens).
Chebyshev's bound makes each point's chance of ``z >= spike_z`` at most ``1/spike_z^2``; the union bound over the
ranks (as the straggler rule's) keeps a spike of few ranks when ``z >= spike_z x sqrt(m)``: the family-wise level of
one rank at ``spike_z``. When the family crossed ``spike_z`` only ``a`` times at steps of few ranks (this spike
included), fewer tests could have made it: with a tail beyond ``spike_z`` no lighter than Chebyshev's, ``z >=
spike_z x sqrt(a / spike_alpha)`` has a chance of ``spike_alpha``; the smaller of the two bounds is the cut. A spike
of the whole job (every rank's loss jumps at one step) is kept on its coincidence instead: ``k`` of the ``m`` ranks
spiking at one step has, by chance, ``p <= n x P(Binomial(m, 1/spike_z^2) >= k)`` over the ``n`` steps; kept when
``p < spike_alpha``.
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Mapping, Sequence

from .fmt import ranges
from .inputs import NonFinite, ValueSeries
from .model import Evidence, Finding
from .stats import MAD_TO_SD, binomial_tail, chebyshev_confidence, median
from .thresholds import Thresholds

__all__ = ["nonfinite", "selected_spikes", "spike_candidates_sql", "spike_points_sql", "spikes", "value_kind"]

_INF = float("inf")

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
    merged: dict[tuple[str, str], list[NonFinite]] = {}
    for item in items:
        merged.setdefault((item.name, item.group), []).append(item)
    # one finding per metric (a group and a name): ``val``'s loss is not counted as ``train``'s; a name in several
    # groups is titled by its group too
    groups_of: dict[str, int] = {}
    for name, _ in merged:
        groups_of[name] = groups_of.get(name, 0) + 1
    findings = []
    for (name, group_name), group in sorted(merged.items()):
        title = f"{group_name}/{name}" if groups_of[name] > 1 else name
        count = sum(i.count for i in group)
        stepped = [i for i in group if i.first_step is not None]
        first = min(stepped, key=lambda i: i.first_step or 0) if stepped else group[0]
        where = (f" (first at step {first.first_step}, rank {first.rank})" if first.first_step is not None
                 else f" (first on rank {first.rank})")
        ranks = tuple(sorted({i.rank for i in group}))
        findings.append(Finding(
            "warning", "nan/inf", f"non-finite values: {title}",
            f"{count} NaN/inf value(s) of {first.group}/{name}{where}, e.g. {first.example}"
            + (f"; on rank(s) {ranges(list(ranks))}" if len(ranks) > 1 else ""),
            Evidence(steps=(first.first_step, first.first_step) if first.first_step is not None else None,
                     ranks=ranks, value=first.example, test=f"{count} value(s) stored as NaN/inf")))
    return findings


class _Reference:
    """The running reference of the spike rule: the last ``size`` non-spike values, also kept sorted (the median is
    read in O(1), a new value is placed by bisection). Its test gives exactly ``median``/``mad``'s answer."""

    __slots__ = ("ordered", "recent", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.recent: deque[float] = deque()
        self.ordered: list[float] = []

    def __len__(self) -> int:
        return len(self.recent)

    def clear(self) -> None:
        self.recent.clear()
        self.ordered.clear()

    def add(self, value: float) -> None:
        self.recent.append(value)
        insort(self.ordered, value)
        if len(self.recent) > self.size:
            del self.ordered[bisect_left(self.ordered, self.recent.popleft())]

    def spike(self, value: float, th: Thresholds) -> tuple[float, float] | None:
        """``(z, median)`` when ``value`` is a spike against the reference (not empty), else None. The ratio test
        (O(1)) runs before the MAD (a sort): the answer is the same as testing both."""
        o = self.ordered
        n = len(o)
        mid = n // 2
        center = o[mid] if n % 2 else (o[mid - 1] + o[mid]) / 2
        if center > 0:
            if not value >= th.spike_ratio * center:
                return None
        elif o[-1] > 0 and not value >= th.spike_ratio * o[-1]:
            # a median of 0 or below (a loss that reached exactly 0): the ratio against the reference's largest value,
            # else its float dust (1e-7 among zeros) is infinitely many times its median
            return None
        floor = 0.01 * abs(center) if center != 0 else 0.01 * max(-o[0], o[-1])
        scale = max(MAD_TO_SD * median([abs(v - center) for v in o]), floor)
        if scale <= 0:
            return None  # a reference of exact zeros has no scale: a loss leaving 0 is no spike against it
        z = (value - center) / scale
        return (z, center) if z >= th.spike_z else None


def _series_spikes(s: ValueSeries, th: Thresholds) -> list[tuple[int, float, float, float]]:
    """(step, value, z, reference) of each spike of one series."""
    if s.selection is not None:
        found = selected_spikes(s, th)
        if found is None:
            raise ValueError(f"the points selected of {s.name} (rank {s.rank}) do not settle its spikes: a reader "
                             "must give the whole series then (values.selected_spikes)")
        return found
    reference = _Reference(th.spike_history)
    kept = 0  # non-spike finite points so far (the reference holds the last spike_history of them)
    out = []
    for step, value in s.points:
        if value != value or value in (_INF, -_INF):
            continue
        if kept >= th.spike_min_history:
            hit = reference.spike(value, th)
            if hit is not None:
                out.append((step, value, hit[0], hit[1]))
                continue  # a spike does not become the reference
        reference.add(value)
        kept += 1
    return out


def _candidate(th: Thresholds) -> str:
    """The prefilter (``spike_points_sql``) over columns fi (finite index), value and lo (the smallest of the
    ``spike_history`` finite points before)."""
    return (f"(fi >= {th.spike_min_history} AND (lo IS NULL OR lo <= 0 OR "
            f"value >= {float(th.spike_ratio)!r} * lo * (1 - 1e-9)))")


def spike_points_sql(relation: str, key: str, th: Thresholds) -> str:
    """The finite points of the value series in ``relation`` (columns ``key``, rank, step, value, pid, segment, line;
    one series per (``key``, rank), in (pid, segment, line) order, non-finite points included) as a DuckDB subquery
    with columns k, rank, step (a point without one: its position, as ``InputBuilder.metric`` gives it), value, fi
    (the index among the series' finite points), cand (the prefilter below) and nf (the series' finite points).

    **The prefilter is exact.** When the ``spike_history`` finite points before a point hold no spike they *are* its
    reference (the non-spike points before it), and their median is at least their minimum; so a point whose
    ``spike_history`` predecessors are all positive and which is below ``spike_ratio`` x their minimum is no spike.
    The candidates are the other points (from the ``spike_min_history``-th finite point on); by induction every
    spike is a candidate or follows an earlier spike within ``spike_history`` finite points
    (``selected_spikes``). The bound is loosened by 1e-9 of itself: rounding can only add candidates."""
    h = th.spike_history
    return f"""(SELECT *, {_candidate(th)} AS cand FROM (
        SELECT k, rank, coalesce(step, pos) AS step, value, row_number() OVER w - 1 AS fi,
               min(value) OVER (w ROWS BETWEEN {h} PRECEDING AND 1 PRECEDING) AS lo,
               count(*) OVER (PARTITION BY k, rank) AS nf
        FROM (SELECT {key} AS k, rank, step, value,
                     row_number() OVER (PARTITION BY {key}, rank ORDER BY pid, segment, line) - 1 AS pos
              FROM {relation})
        WHERE isfinite(value) WINDOW w AS (PARTITION BY k, rank ORDER BY pos)))"""


def spike_candidates_sql(relation: str, key: str, th: Thresholds) -> str:
    """``spike_points_sql``'s candidates (k, rank, fi; by series and index) of the series in ``relation`` that hold
    only finite values: one window pass (their points' order is their finite index). A series holding NaN/inf needs
    ``spike_points_sql``."""
    return f"""SELECT k, rank, fi FROM (
        SELECT {key} AS k, rank, value, row_number() OVER w - 1 AS fi,
               min(value) OVER (w ROWS BETWEEN {th.spike_history} PRECEDING AND 1 PRECEDING) AS lo
        FROM {relation} WINDOW w AS (PARTITION BY {key}, rank ORDER BY pid, segment, line))
        WHERE {_candidate(th)} ORDER BY k, rank, fi"""


def selected_spikes(s: ValueSeries, th: Thresholds) -> list[tuple[int, float, float, float]] | None:
    """``_series_spikes`` of a series given by its selected points (``s.selection``), or None when they do not
    settle it (a spike too close to the end of a selected stretch, a candidate without its reference: many spikes
    in a row) and the whole series is needed. Between two stretches, the points left out are no spikes: they
    are no candidates, and no spike lies within ``spike_history`` points before them (checked here)."""
    sel = s.selection
    assert sel is not None
    if (sel.history, sel.min_history, sel.ratio) != (th.spike_history, th.spike_min_history, th.spike_ratio):
        raise ValueError(f"the points of {s.name} were selected for spike_history={sel.history}, spike_min_history="
                         f"{sel.min_history}, spike_ratio={sel.ratio}: not these thresholds")
    reference = _Reference(th.spike_history)
    kept = 0
    prev = -1
    last_spike = -th.spike_history - 1
    out = []
    for (step, value), i, candidate in zip(s.points, sel.index, sel.candidate, strict=True):
        if i != prev + 1:  # points prev+1 .. i-1 left out: no spike, if none lies just before them
            if last_spike + th.spike_history > prev:
                return None
            kept += i - prev - 1
            reference.clear()  # refilled by the points selected before the next candidate
        prev = i
        if kept >= th.spike_min_history:
            if len(reference) >= th.spike_history or len(reference) == kept:
                hit = reference.spike(value, th)
                if hit is not None:
                    out.append((step, value, hit[0], hit[1]))
                    last_spike = i
                    continue
            elif candidate:
                return None
            # else: no candidate, and no spike within spike_history points before it: no spike
        reference.add(value)
        kept += 1
    if prev < sel.finite - 1 and last_spike + th.spike_history > prev:
        return None
    return out


def _families(series: Sequence[ValueSeries],
              given: Mapping[str, tuple[int, int]] | None) -> dict[str, tuple[int, int]]:
    """name -> (ranks with a finite point of it, the most finite points of one rank): of the series here, or a
    reader's count where it gave only some (``FindingsInput.value_families``), whichever is more."""
    ranks: dict[str, set[int]] = {}
    most: dict[str, int] = {}
    for s in series:
        n = s.selection.finite if s.selection is not None else \
            sum(1 for _, v in s.points if v == v and v not in (_INF, -_INF))
        if n:
            ranks.setdefault(s.name, set()).add(s.rank)
            most[s.name] = max(most.get(s.name, 0), n)
    out = {name: (len(r), most[name]) for name, r in ranks.items()}
    for name, (m, n) in (given or {}).items():
        mine = out.get(name, (0, 0))
        out[name] = (max(m, mine[0]), max(n, mine[1]))
    return out


Hit = tuple[int, int, float, float, float]  # step, rank, value, z, reference


def _beyond_chance(hits: list[Hit], ranks: int, steps: int, th: Thresholds) -> list[Hit]:
    """The spikes of one name that ``ranks`` ranks' series do not make by chance (module docstring): at a step where
    so many ranks spike that chance would not, or z past the union bound over the ranks -- or over the family's own
    other spikes, when it has few."""
    if ranks <= 1:
        return hits
    # a point's chance of z >= spike_z: at most 1/spike_z^2 (Chebyshev), unless the family crossed it more often (the
    # robust scale, a MAD, can be under the standard deviation)
    p = max(1 / th.spike_z ** 2, len(hits) / max(ranks * steps, 1))
    at_step: dict[int, set[int]] = {}
    for h in hits:
        at_step.setdefault(h[0], set()).add(h[1])
    together = {step for step, r in at_step.items()
                if max(steps, 1) * binomial_tail(len(r), ranks, p) < th.spike_alpha}
    alone = sum(1 for h in hits if h[0] not in together)
    # the tests that could have made it: every rank's (the union bound), or -- fewer, when the family crossed spike_z
    # only this and ``others`` times -- a tail beyond spike_z no lighter than Chebyshev's, P(z >= t) ~ (spike_z/t)^2
    tests = min(ranks, alone / th.spike_alpha)  # (others + 1) / alpha, for a spike that is not together
    cut = th.spike_z * math.sqrt(max(tests, 1.0))
    return [h for h in hits if h[0] in together or h[3] >= cut]


def spikes(series: Sequence[ValueSeries], th: Thresholds,
           families: Mapping[str, tuple[int, int]] | None = None) -> list[Finding]:
    """The spike findings, one per name; ``families``: a reader's count of each name's series
    (``FindingsInput.value_families``), for the correction over ranks."""
    by_name: dict[tuple[str, str], list[Hit]] = {}
    for s in series:
        for step, value, z, ref in _series_spikes(s, th):
            by_name.setdefault((s.kind, s.name), []).append((step, s.rank, value, z, ref))
    family = _families(series, families) if by_name else {}
    findings = []
    for (kind, name), found in sorted(by_name.items()):
        hits = _beyond_chance(sorted(found), *family.get(name, (1, 0)), th)
        if not hits:
            continue
        episodes: list[list[Hit]] = []
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
