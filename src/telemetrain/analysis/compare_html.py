"""A comparison as one self-contained HTML page: inline CSS and SVG, no script, nothing fetched.

Every string that comes from a run (ids, paths, tags, labels) goes through ``html.escape``.
"""

from __future__ import annotations

import html
import math

from .compare import IMPROVEMENT, INCONCLUSIVE, REGRESSION, CandidateComparison, Comparison, MetricComparison, RunRef
from .compare_text import format_change, format_interval, format_quantity, speed_of, where_lines

__all__ = ["comparison_html"]

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { padding: .25em .7em; border-bottom: 1px solid #ddd; text-align: right; white-space: nowrap; }
th:first-child, td:first-child, td.verdict { text-align: left; }
tr.regression td.verdict { color: #b00020; font-weight: bold; }
tr.improvement td.verdict { color: #1b7f3b; font-weight: bold; }
tr.insufficient td { color: #888; }
tr.inconclusive td.verdict { color: #8a6d00; }
.run { font-family: ui-monospace, monospace; }
.note { color: #555; }
svg { vertical-align: middle; }
"""

_BAR_W, _BAR_H = 180, 14


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _span(c: CandidateComparison, min_effect: float) -> float:
    """The bars of one table show ratios 1 +/- this: room for every interval and the band, at most +/-100%."""
    reach = [abs(v - 1) for m in c.metrics for v in (m.ci_low, m.ci_high) if math.isfinite(v)]
    return min(1.0, max(2 * min_effect, 0.05, 1.2 * max(reach, default=0.0)))


def _ci_bar(m: MetricComparison, min_effect: float, span: float) -> str:
    """The interval against the +/- min_effect band around no change."""
    if not (math.isfinite(m.ci_low) and math.isfinite(m.ci_high)):
        return ""

    def _x(ratio: float) -> float:
        clipped = min(max(ratio, 1 - span), 1 + span)
        return (clipped - (1 - span)) / (2 * span) * _BAR_W

    colour = {REGRESSION: "#b00020", IMPROVEMENT: "#1b7f3b"}.get(m.verdict, "#555")
    band_lo, band_hi = _x(1 - min_effect), _x(1 + min_effect)
    lo, hi, mid = _x(m.ci_low), _x(m.ci_high), _x(m.ratio)
    return (f'<svg width="{_BAR_W}" height="{_BAR_H}" role="img" aria-label="confidence interval">'
            f'<rect x="{band_lo:.1f}" y="0" width="{band_hi - band_lo:.1f}" height="{_BAR_H}" fill="#eee"/>'
            f'<line x1="{_x(1.0):.1f}" x2="{_x(1.0):.1f}" y1="0" y2="{_BAR_H}" stroke="#999"/>'
            f'<rect x="{lo:.1f}" y="4" width="{max(hi - lo, 1):.1f}" height="6" fill="{colour}"/>'
            f'<circle cx="{mid:.1f}" cy="7" r="3" fill="{colour}"/></svg>')


def _run_block(role: str, ref: RunRef) -> str:
    spans = ""
    if ref.iteration_p50 is not None and ref.iteration_p99 is not None:
        spans = (f", sampled iterations p50 {_e(format_quantity(ref.iteration_p50, 's'))}, "
                 f"p99 {_e(format_quantity(ref.iteration_p99, 's'))}")
    return (f"<p><b>{_e(role)}</b> <span class=run>{_e(ref.run_id)}</span> (perf_tag "
            f"<span class=run>{_e(ref.perf_tag)}</span>, {ref.windows} windows, ranks "
            f"{_e(', '.join(map(str, ref.ranks)) or 'none')}{spans})<br>"
            f"<span class='run note'>{_e(ref.path)}</span></p>")


def _candidate_section(c: CandidateComparison, comparison: Comparison) -> str:
    rows = []
    span = _span(c, comparison.min_effect)
    for m in c.metrics:
        css = {REGRESSION: "regression", IMPROVEMENT: "improvement", INCONCLUSIVE: "inconclusive"}.get(m.verdict, "")
        if m.verdict == "insufficient data":
            css = "insufficient"
        verdict = f"{m.verdict} ({m.note})" if m.note else m.verdict
        rows.append(
            f"<tr class='{css}'><td>{_e(m.label)}</td><td>{_e(format_quantity(m.baseline_median, m.unit))}</td>"
            f"<td>{_e(format_quantity(m.candidate_median, m.unit))}</td><td>{_e(format_change(m.ratio))}</td>"
            f"<td>{_e(format_interval(m))}</td><td>{_ci_bar(m, comparison.min_effect, span)}</td>"
            f"<td class=verdict>{_e(verdict)}</td><td>{m.candidate_windows} / {m.baseline_windows}</td></tr>")
    regressions = c.regressions
    summary = (f"{len(regressions)} regression(s): " + ", ".join(_e(m.label) for m in regressions)
               if regressions else "no regression")
    notes = "".join(f"<p>{_e(line)}</p>" for line in where_lines(c)) + _quality(c, comparison.baseline.run_id)
    notes += "".join(f"<p class=note>note: {_e(n)}</p>" for n in c.notes)
    return (f"<h2>{_e(c.candidate.run_id)}: {summary}</h2>{_run_block('candidate', c.candidate)}"
            f"<table><tr><th>metric</th><th>baseline median</th><th>candidate median</th><th>change</th>"
            f"<th>{comparison.confidence:.0%} CI</th><th>CI, axis &plusmn;{span:.0%}</th>"
            f"<th>verdict</th><th>windows</th></tr>{''.join(rows)}</table>{notes}")


def _quality(c: CandidateComparison, base_id: str) -> str:
    """The model's side: the quality sentence and the runs' curves over each other (report.curves_svg)."""
    q = c.quality
    if q is None:
        return ""
    from ..report.curves_svg import overlay_chart

    speed = speed_of(c)
    out = [f"<p class=quality><b>quality</b>: {_e(q.sentence('the candidate' + (f' {speed} and' if speed else '')))}"
           "</p>"]
    for title, base, cand in q.overlays:
        runs = [(f"baseline {base_id}", base), (f"candidate {c.candidate.run_id}", cand)]
        out.append(f"<h3>{_e(title)}</h3>" + overlay_chart(title, runs, width=960, height=220))
    return "".join(out)


def comparison_html(comparison: Comparison, title: str = "telemetrain compare") -> str:
    """The page, as a string."""
    notes = "".join(f"<p class=note>note: {_e(n)}</p>" for n in comparison.notes)
    method = (f"Median of per-window mean iteration times (and throughput, phase times); {comparison.resamples} "
              f"bootstrap resamples of the windows (seed {comparison.seed}); {comparison.confidence:.0%} percentile "
              f"interval of candidate/baseline. A change counts when the whole interval lies beyond "
              f"&plusmn;{comparison.min_effect:.0%} (grey band; wider when earlier runs of the perf tag spread "
              "more), and is inconclusive when a busier machine explains it. The interval is over windows within "
              "each run.")
    body = "".join(_candidate_section(c, comparison) for c in comparison.candidates)
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1>{_run_block('baseline', comparison.baseline)}"
            f"{notes}{body}<p class=note>{method}</p></body></html>\n")
