"""The report's "Model metrics" section: one chart per user metric (``curves``), evaluation metrics first."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis.findings.values import value_kind
from .curves import MIN_POINTS, Curve, is_user_group, pick_loss
from .curves_svg import curve_chart
from .svg import esc

__all__ = ["MAX_CURVE_CHARTS", "constant_value", "curves_section"]

MAX_CURVE_CHARTS = 60


def _order(curves: Sequence[Curve]) -> list[Curve]:
    """The training loss first, then the other losses, evaluation metrics, the rest; by name within each."""
    loss = pick_loss([(c.group, c.name) for c in curves])

    def rank(c: Curve) -> tuple[int, str]:
        if (c.group, c.name) == loss:
            return 0, ""
        if value_kind(c.name) == "loss":
            return 1, c.title
        return (2 if c.evaluation else 3), c.title

    return sorted(curves, key=rank)


def constant_value(c: Curve) -> float | None:
    """The one value every point of ``c`` holds, on every rank (None: it varies, or has NaN/inf)."""
    if c.nonfinite:
        return None
    values = {v for line in c.lines for p in line.points if p.n for v in (p.lo, p.hi)}
    values.update(v for line in c.lines for pair in line.band for v in pair)
    return values.pop() if len(values) == 1 else None


def curves_section(curves: Sequence[Curve],
                   metric_stats: Mapping[tuple[str, str], Sequence[Any]] | None = None) -> str:
    """The charts; ``metric_stats`` (the report's table, keyed (group, name)) to count the user metrics with too few
    values to chart."""
    charted = {(c.group, c.name) for c in curves}
    left_out = sum(1 for key in (metric_stats or {}) if is_user_group(key[0]) and key not in charted)
    if not curves:
        return ('<p class="note">No user metrics with at least '
                f"{MIN_POINTS} values (Telemetry.log / metric, put_metric): nothing to chart. Every metric is in the "
                "table under Metrics and spans.</p>")
    loss = pick_loss([(c.group, c.name) for c in curves])
    constant = {(c.group, c.name): value for c in curves if (c.group, c.name) != loss
                and (value := constant_value(c)) is not None}  # a flat line says nothing a number does not
    shown = _order([c for c in curves if (c.group, c.name) not in constant])[:MAX_CURVE_CHARTS]
    out = ['<p class="note">Each metric you recorded (not the training lifecycle\'s or the system sampler\'s) with '
           f"at least {MIN_POINTS} values, by step when it was logged with one (else by time). Thin line: the raw "
           "values (the mean of each bucket when there are more points than the chart draws; shaded: the bucket's "
           "min..max), thick line (from 20 points): smoothed by a centered rolling median. One line per rank where "
           "the ranks' values differ. Red triangles: spikes above the axis; black crosses: NaN/inf values; dashed "
           "grey: values of an attempt a rollback left (a step that went back), the dashed vertical line where it "
           "went back to.</p>",
           '<div class="cols">']
    for c in shown:
        facts = [f"{c.points:,} value(s)", f"{c.ranks} rank(s)" + (", differing" if c.ranks_differ else "")]
        if c.bucket_width > 1 and c.by_step:
            facts.append(f"{c.bucket_width:,.0f} steps per point")
        if c.nonfinite:
            facts.append(f"{c.nonfinite} NaN/inf")
        if c.rollbacks:
            went = ", ".join(f"{r.from_step:,} to {r.to_step:,}" for r in c.rollbacks[:3])
            facts.append(f"went back {len(c.rollbacks)} time(s) ({went}{', ...' if len(c.rollbacks) > 3 else ''}): "
                         f"the line follows the latest attempt, {c.abandoned_points:,} abandoned value(s) dashed grey")
        if c.unit:
            facts.append(f"unit {c.unit}")
        kind = "evaluation" if c.evaluation else ""
        # no finite value (a loss that was NaN from the start): no axis to draw on, said instead of an empty figure
        chart = curve_chart(c) or (f'<p class="note nothing-to-draw">Nothing to draw: all {c.points:,} values are '
                                   "NaN/inf (the nan/inf finding says from which step).</p>")
        out.append(f'<figure class="curve {kind}" data-metric="{esc(c.title)}"><h3>{esc(c.title)}</h3>'
                   + chart + f'<figcaption class="note">{esc("; ".join(facts))}</figcaption></figure>')
    out.append("</div>")
    if constant:
        values = ", ".join(f"{title} = {value:g}" for title, value in sorted(
            (c.title, constant[(c.group, c.name)]) for c in curves if (c.group, c.name) in constant))
        out.append(f'<p class="note constant">Constant, so not charted: {esc(values)}.</p>')
    if len(curves) - len(constant) > len(shown):
        out.append(f'<p class="note">{len(curves) - len(constant) - len(shown)} more metrics not charted (the table '
                   "below has them).</p>")
    if left_out:
        out.append(f'<p class="note">{left_out} user metric(s) with fewer than {MIN_POINTS} values: in the '
                   "table only.</p>")
    return "".join(out)
