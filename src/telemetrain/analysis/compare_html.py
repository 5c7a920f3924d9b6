"""A comparison as one self-contained HTML page: inline CSS and SVG, no script, nothing fetched.

Every string that comes from a run (ids, paths, tags, labels) goes through ``html.escape``, its control characters
shown as escapes (``text.printable``).
"""

from __future__ import annotations

import html
import math

from ..report.curves import Curve
from ..text import printable
from .compare import IMPROVEMENT, INCONCLUSIVE, REGRESSION, CandidateComparison, Comparison, MetricComparison, RunRef
from .compare_multi import MultiComparison
from .compare_text import (
    format_change,
    format_interval,
    format_quantity,
    row_change,
    shown_rows,
    speed_of,
    tally_text,
    where_lines,
)
from .findings.fmt import ranges

__all__ = ["RatioAxis", "comparison_html", "multi_html"]

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { padding: .25em .7em; border-bottom: 1px solid #ddd; text-align: right; white-space: nowrap; }
th:first-child, td:first-child, td.verdict { text-align: left; }
td.verdict { white-space: normal; min-width: 20em; max-width: 40em; }
tr.regression td.verdict { color: #b00020; font-weight: bold; }
tr.improvement td.verdict { color: #1b7f3b; font-weight: bold; }
tr.insufficient td { color: #888; }
tr.inconclusive td.verdict { color: #8a6d00; }
.run { font-family: ui-monospace, monospace; }
.note { color: #555; }
svg { vertical-align: middle; }
"""

_BAR_W, _BAR_H, _PAD = 240, 14, 6  # the bars' width and height; room at each end for a marker's radius
_AXIS_H = 24
# the changes an axis may label (%), as ratios: round numbers on both sides (the axis is symmetric in log(ratio))
_TICKS = sorted({1 + p / 100 for p in (1, 2, 3, 5, 10, 20, 30, 50, 100, 200, 300, 500, 1000, 2000, 5000, 10000)}
                | {1 - p / 100 for p in (1, 2, 3, 5, 10, 20, 30, 50, 70, 80, 90, 95, 99, 99.9)})


def _e(text: object) -> str:
    return html.escape(printable(str(text)), quote=True)  # control characters visible, as in report.svg.esc


class RatioAxis:
    """A ratio axis for one table: symmetric-log in log(ratio) -- linear within about +/- ``min_effect`` of no
    change, logarithmic beyond -- and wide enough for every interval and marker in the table, so that a +134%
    change and a +3% change both show where they are (a linear axis had to clip one or squash the other)."""

    def __init__(self, ratios: list[float], min_effect: float, width: int = _BAR_W) -> None:
        self.width = width
        self.scale = max(math.log1p(min_effect), 0.01)  # where the axis turns from linear to logarithmic
        reach = [abs(self._f(r)) for r in ratios if math.isfinite(r) and r > 0]
        least = self._f(1 + max(2 * min_effect, 0.05))  # an axis of small changes keeps them readable
        self.half = max(least, 1.08 * max(reach, default=0.0))

    def _f(self, ratio: float) -> float:
        u = math.log(ratio)
        return math.copysign(math.log1p(abs(u) / self.scale), u)

    def x(self, ratio: float) -> float:
        """The pixel of ``ratio`` (clamped to the plot: a ratio <= 0 or beyond the axis sits on its edge)."""
        f = self._f(ratio) if ratio > 0 else -math.inf
        f = min(max(f, -self.half), self.half)
        return _PAD + (f + self.half) / (2 * self.half) * (self.width - 2 * _PAD)

    def ticks(self, min_gap: float = 36.0) -> list[float]:
        """No change, and the changes from the outermost inwards that keep ``min_gap`` pixels from the others and
        whose labels do not touch theirs."""
        inside = [r for r in _TICKS if abs(self._f(r)) <= self.half]
        chosen = [1.0]
        for r in sorted(inside, key=lambda r: -abs(self._f(r))):
            lo, hi = self._label_extent(r)
            if all(abs(self.x(r) - self.x(c)) >= min_gap and (hi + 4 <= self._label_extent(c)[0]
                                                              or self._label_extent(c)[1] + 4 <= lo)
                   for c in chosen):
                chosen.append(r)
        return sorted(chosen)

    def _anchor(self, x: float) -> str:
        return "start" if x < 20 else "end" if x > self.width - 20 else "middle"

    def _label_extent(self, ratio: float) -> tuple[float, float]:
        """The pixels a tick's label covers (10 px text: about 6 px a character)."""
        x, w = self.x(ratio), 6.0 * len(_tick_label(ratio))
        anchor = self._anchor(x)
        return (x, x + w) if anchor == "start" else (x - w, x) if anchor == "end" else (x - w / 2, x + w / 2)

    def svg(self) -> str:
        """The axis itself, with its tick labels (in the table's header)."""
        out = [f'<svg class=axis width="{self.width}" height="{_AXIS_H}" role="img" '
               f'aria-label="change, candidate against baseline">']
        for r in self.ticks():
            x = self.x(r)
            anchor = self._anchor(x)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_AXIS_H - 6}" y2="{_AXIS_H}" stroke="#999"/>'
                       f'<text x="{x:.1f}" y="{_AXIS_H - 9}" font-size="10" text-anchor="{anchor}" '
                       f'fill="#555">{_e(_tick_label(r))}</text>')
        out.append("</svg>")
        return "".join(out)


def _tick_label(ratio: float) -> str:
    """A change in percent (``+50%``, ``-99.9%``); from 10 times on, the factor (``101x``, not ``+1e+04%``)."""
    change = (ratio - 1) * 100
    if ratio >= 10:
        return f"{ratio:.3g}x"
    return "0" if abs(change) < 1e-9 else f"{change:+.3g}%"


def _axis_for(metrics: list[MetricComparison], min_effect: float) -> RatioAxis:
    ratios = [v for m in metrics for v in (m.ci_low, m.ci_high, m.ratio)
              if math.isfinite(m.ci_low) and math.isfinite(m.ci_high)]
    return RatioAxis(ratios, min_effect)


def _ci_bar(m: MetricComparison, min_effect: float, axis: RatioAxis) -> str:
    """The interval against the +/- min_effect band around no change, with the axis's ticks as faint lines."""
    if not (math.isfinite(m.ci_low) and math.isfinite(m.ci_high)):
        return ""
    x = axis.x
    colour = {REGRESSION: "#b00020", IMPROVEMENT: "#1b7f3b"}.get(m.verdict, "#555")
    effect = m.min_effect if m.min_effect is not None else min_effect
    band_lo, band_hi = x(1 - effect), x(1 + effect)
    lo, hi, mid = x(m.ci_low), x(m.ci_high), x(m.ratio)
    grid = "".join(f'<line x1="{x(r):.1f}" x2="{x(r):.1f}" y1="0" y2="{_BAR_H}" stroke="#f0f0f0"/>'
                   for r in axis.ticks() if r != 1.0)
    return (f'<svg class=ci width="{axis.width}" height="{_BAR_H}" role="img" aria-label="confidence interval">'
            f'{grid}<rect x="{band_lo:.1f}" y="0" width="{band_hi - band_lo:.1f}" height="{_BAR_H}" fill="#eee"/>'
            f'<line x1="{x(1.0):.1f}" x2="{x(1.0):.1f}" y1="0" y2="{_BAR_H}" stroke="#999"/>'
            f'<rect x="{lo:.1f}" y="4" width="{max(hi - lo, 1):.1f}" height="6" fill="{colour}"/>'
            f'<circle cx="{mid:.1f}" cy="7" r="3" fill="{colour}"/></svg>')


def _run_block(role: str, ref: RunRef) -> str:
    spans = ""
    if ref.iteration_p50 is not None and ref.iteration_p99 is not None:
        spans = (f", {ref.iteration_spans} sampled iterations, p50 {_e(format_quantity(ref.iteration_p50, 's'))}, "
                 f"p99 {_e(format_quantity(ref.iteration_p99, 's'))}")
    return (f"<p><b>{_e(role)}</b> <span class=run>{_e(ref.run_id)}</span> (perf_tag "
            f"<span class=run>{_e(ref.perf_tag)}</span>, {ref.windows} windows, ranks "
            f"{_e(ranges(ref.ranks) or 'none')}{spans})<br>"
            f"<span class='run note'>{_e(ref.path)}</span></p>")


def _candidate_section(c: CandidateComparison, comparison: Comparison, overlays: bool = True) -> str:
    rows = []
    shown, quiet = shown_rows(c)
    axis = _axis_for(shown, comparison.min_effect)  # (fits the rows drawn)
    for m in shown:
        css = {REGRESSION: "regression", IMPROVEMENT: "improvement", INCONCLUSIVE: "inconclusive"}.get(m.verdict, "")
        if m.verdict == "insufficient data":
            css = "insufficient"
        verdict = f"{m.verdict} ({m.note})" if m.note else m.verdict
        rows.append(
            f"<tr class='{css}'><td>{_e(m.label)}</td><td>{_e(format_quantity(m.baseline_median, m.unit))}</td>"
            f"<td>{_e(format_quantity(m.candidate_median, m.unit))}</td><td>{_e(row_change(m))}</td>"
            f"<td>{_e(format_interval(m))}</td><td>{_ci_bar(m, comparison.min_effect, axis)}</td>"
            f"<td class=verdict>{_e(verdict)}</td><td>{m.candidate_windows} / {m.baseline_windows}</td></tr>")
    regressions = c.regressions
    summary = (f"{len(regressions)} regression(s): " + ", ".join(_e(m.label) for m in regressions)
               if regressions else "no regression")
    notes = (f"<p class=note>{quiet} per-rank row(s) with no significant change not shown (`--json` has "
             "them).</p>" if quiet else "")
    notes += "".join(f"<p>{_e(line)}</p>" for line in where_lines(c))
    notes += _quality(c, comparison.baseline.run_id, overlays)
    notes += "".join(f"<p class=note>note: {_e(n)}</p>" for n in c.notes)
    return (f"<h2>{_e(c.candidate.run_id)}: {summary}</h2>{_run_block('candidate', c.candidate)}"
            f"<table><tr><th>metric</th><th>baseline median</th><th>candidate median</th><th>change</th>"
            f"<th>{comparison.confidence:.0%} CI</th><th>{axis.svg()}</th>"
            f"<th>verdict</th><th>windows</th></tr>{''.join(rows)}</table>{notes}")


def _quality(c: CandidateComparison, base_id: str, overlays: bool = True) -> str:
    """The model's side: the quality sentence and the runs' curves over each other (report.curves_svg)."""
    q = c.quality
    if q is None:
        return ""
    speed = speed_of(c)
    out = [f"<p class=quality><b>quality</b>: {_e(q.sentence('the candidate' + (f' {speed} and' if speed else '')))}"
           "</p>"]
    if overlays:
        for title, base, cand in q.overlays:
            runs = [(f"baseline {base_id}", base), (f"candidate {c.candidate.run_id}", cand)]
            out.append(_overlay(title, runs))
    return "".join(out)


def _overlay(title: str, runs: list[tuple[str, Curve]]) -> str:
    from ..report.curves_svg import overlay_chart

    return f"<h3>{_e(title)}</h3>" + overlay_chart(title, runs, width=960, height=220)


def _method(comparison: Comparison) -> str:
    return (f"Median of per-window mean iteration times (and throughput, phase times); {comparison.resamples} "
            f"bootstrap resamples of the windows (seed {comparison.seed}); {comparison.confidence:.0%} percentile "
            f"interval of candidate/baseline. A change counts when the whole interval lies beyond "
            f"&plusmn;{comparison.min_effect:.0%} (grey band; wider when earlier runs of the perf tag spread "
            "more), and is inconclusive when a busier machine explains it. The interval is over windows within "
            "each run. The bars' axis is linear near no change and logarithmic beyond (its ticks say the change), "
            "so that every interval of a table fits.")


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            f"img-src data:\"><title>{_e(title)}</title><style>{_CSS}</style></head><body><h1>{_e(title)}</h1>"
            f"{body}</body></html>\n")


def _comparison_body(comparison: Comparison, overlays: bool = True) -> str:
    notes = "".join(f"<p class=note>note: {_e(n)}</p>" for n in comparison.notes)
    body = "".join(_candidate_section(c, comparison, overlays) for c in comparison.candidates)
    return f"{_run_block('baseline', comparison.baseline)}{notes}{body}"


def comparison_html(comparison: Comparison, title: str = "telemetrain compare") -> str:
    """The page, as a string."""
    return _page(title, f"{_comparison_body(comparison)}<p class=note>{_method(comparison)}</p>")


def _summary_table(multi: MultiComparison) -> str:
    """Per candidate and metric: against how many baselines it regressed, and its change against each."""
    heads = "".join(f"<th>vs {_e(b.run_id)}</th>" for b in multi.baselines)
    rows = []
    for t in multi.tallies():
        if not (t.regressed or t.improved or t.scope not in ("rank", "rank phase")):
            continue
        css = "regression" if t.regressed_against_all else ""
        cells = "".join(f"<td>{_e(format_change(m.ratio)) if m is not None else '-'}</td>" for m in t.changes)
        rows.append(f"<tr class='{css}'><td>{_e(t.candidate.run_id)}</td><td>{_e(t.label)}</td>{cells}"
                    f"<td class=verdict>{_e(tally_text(t).split(' (')[0])}</td></tr>")
    return (f"<table class=summary><tr><th>candidate</th><th>metric</th>{heads}<th>against the baselines</th></tr>"
            f"{''.join(rows)}</table>")


def _overlays_of(multi: MultiComparison) -> str:
    """Each overlaid metric once: every baseline's curve and every candidate's, on one chart."""
    charts: dict[str, list[tuple[str, Curve]]] = {}
    for comparison in multi.comparisons:
        for c in comparison.candidates:
            if c.quality is None:
                continue
            for title, base, cand in c.quality.overlays:
                runs = charts.setdefault(title, [])
                for label, curve in ((f"baseline {comparison.baseline.run_id}", base),
                                     (f"candidate {c.candidate.run_id}", cand)):
                    if all(label != seen for seen, _ in runs):
                        runs.append((label, curve))
    return "".join(_overlay(title, runs) for title, runs in charts.items())


def multi_html(multi: MultiComparison, title: str = "telemetrain compare") -> str:
    """Several baselines: the tally, one section per baseline (its tables), and each overlaid metric with every
    baseline's and candidate's curve."""
    n = len(multi.comparisons)
    every = multi.regressions
    head = (f"<h2>summary: {len(every)} regression(s) against every one of {n} baselines</h2>"
            f"<p>A metric regressed against every baseline is a change one noisy baseline cannot explain "
            f"(--fail-on-regression fails on it).</p>{_summary_table(multi)}")
    sections = "".join(
        f"<section class=baseline><h2>against baseline {i} of {n}: {_e(comparison.baseline.run_id)}</h2>"
        f"{_comparison_body(comparison, overlays=False)}</section>"
        for i, comparison in enumerate(multi.comparisons, 1))
    curves = _overlays_of(multi)
    if curves:
        curves = f"<h2>the model's metrics, every run</h2>{curves}"
    return _page(title, f"{head}{sections}{curves}<p class=note>{_method(multi.comparisons[0])}</p>")
