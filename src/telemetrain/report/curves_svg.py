"""Charts of the model's own metrics (``curves.Curve``): static SVG, every user string escaped.

One chart per metric: per line (one per rank where the ranks differ, else one) the raw values -- a thin line through
each bucket's mean, shaded from the bucket's min to its max when a bucket holds several values -- and the smoothed
line over it (``curve_scale.smooth``: a centered rolling median). Log y when the values span two decades; spikes
above the robust range are red triangles at the top edge; NaN/inf values are black crosses at the bottom edge and a
gap in the line. Several runs (``compare``) overlay on one chart, one colour per run. The values of attempts a
rollback left (``curves``: a step that went back) are a dashed grey line under the curve, and each rollback a dashed
vertical line at the step it went back to; the y axis is the curve's (an attempt that diverged is clipped at it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .curve_scale import YScale, log_allowed, smooth, smoothing_window, y_scale
from .curves import Curve, CurveLine
from .svg import PALETTE, axis_labels, axis_ticks, esc, nice_ticks

__all__ = ["curve_chart", "overlay_chart", "text_alternative"]

SMOOTH_FROM = 20  # points of a line before a smoothed line is drawn over it
_FONT = 'font-family="system-ui,sans-serif" font-size="11"'


def _fmt_x(value: float, by_step: bool) -> str:
    if by_step:
        return f"{value:,.0f}" if abs(value) >= 1 or value == 0 else f"{value:.2g}"
    return f"{value:.3g} s" if abs(value) < 1000 else f"{value:,.0f} s"


class _Plot:
    def __init__(self, width: int, height: int, x: tuple[float, float], y: YScale) -> None:
        self.width, self.height = width, height
        self.left, self.right, self.top, self.bottom = 62, width - 12, 14, height - 32
        self.x0, self.x1 = x[0], x[1] if x[1] > x[0] else x[0] + 1
        self.y = y
        self.t0, self.t1 = (math.log10(y.lo), math.log10(y.hi)) if y.log else (y.lo, y.hi)
        if self.t1 <= self.t0:
            self.t1 = self.t0 + 1

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def py(self, v: float) -> float:
        t = math.log10(v) if self.y.log else v
        t = min(max(t, self.t0), self.t1)  # clipped to the frame (spikes are drawn as markers)
        return self.bottom - (t - self.t0) / (self.t1 - self.t0) * (self.bottom - self.top)

    def axes(self, unit: str, by_step: bool, x_label: str) -> list[str]:
        out = [f'<rect x="{self.left}" y="{self.top}" width="{self.right - self.left}" '
               f'height="{self.bottom - self.top}" fill="#fff" stroke="#ccc"/>']
        if self.y.log:
            ticks = [10.0 ** e for e in range(math.ceil(self.t0), math.floor(self.t1) + 1)]
            if len(ticks) < 2:
                ticks = [self.y.lo, self.y.hi]
        else:
            ticks = axis_ticks(self.y.lo, self.y.hi, 4, unit)
        for t, text in zip(ticks, axis_labels(ticks, unit, log=self.y.log), strict=True):
            y = self.py(t)
            out.append(f'<line x1="{self.left}" x2="{self.right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                       f'<text x="{self.left - 4}" y="{y + 4:.1f}" text-anchor="end" {_FONT}>{esc(text)}</text>')
        for t in nice_ticks(self.x0, self.x1, 6):
            x = self.px(t)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{self.bottom}" y2="{self.bottom + 4}" stroke="#999"/>'
                       f'<text x="{x:.1f}" y="{self.bottom + 15}" text-anchor="middle" {_FONT}>'
                       f"{esc(_fmt_x(t, by_step))}</text>")
        axis = x_label + (" (log y)" if self.y.log else "")
        out.append(f'<text x="{(self.left + self.right) / 2:.0f}" y="{self.height - 3}" text-anchor="middle" '
                   f'{_FONT} fill="#555">{esc(axis)}</text>')
        return out

    def path(self, xs: Sequence[float], ys: Sequence[float]) -> str:
        """A polyline broken at every NaN (a gap, not a jump over it)."""
        parts: list[str] = []
        pen = "M"
        for x, v in zip(xs, ys, strict=True):
            if not (math.isfinite(v) and math.isfinite(x)) or (self.y.log and v <= 0):
                pen = "M"
                continue
            parts.append(f"{pen}{self.px(x):.1f},{self.py(v):.1f}")
            pen = "L"
        return "".join(parts)


def _x_range(lines: Sequence[CurveLine]) -> tuple[float, float] | None:
    xs = [p.x for line in lines for p in line.points if math.isfinite(p.x)]
    return (min(xs), max(xs)) if xs else None


def _draw_line(plot: _Plot, line: CurveLine, colour: str, label: str) -> list[str]:
    pts = line.points
    xs = [p.x for p in pts]
    means = [p.mean for p in pts]
    out = []
    if line.band:  # across ranks
        lo = [a for a, _ in line.band]
        hi = [b for _, b in line.band]
        out.append(_band(plot, xs, lo, hi, colour, f"{label}: lowest..highest rank mean", 0.15))
    elif any(p.n > 1 and p.hi > p.lo for p in pts):  # several values per bucket: their min..max
        out.append(_band(plot, xs, [p.lo for p in pts], [p.hi for p in pts], colour,
                         f"{label}: min..max of each bucket", 0.15))
    raw = plot.path(xs, means)
    smoothed_too = len([m for m in means if m == m]) >= SMOOTH_FROM  # fewer: the raw line says it all
    if raw:
        out.append(f'<path class="raw" d="{raw}" fill="none" stroke="{colour}" '
                   f'stroke-width="{1 if smoothed_too else 1.5}" stroke-opacity="{0.45 if smoothed_too else 1}">'
                   f"<title>{esc(label)} (raw)</title></path>")
    if smoothed_too:
        smoothed = plot.path(xs, smooth(means, smoothing_window(len(means))))
        if smoothed:
            out.append(f'<path class="smoothed" d="{smoothed}" fill="none" stroke="{colour}" stroke-width="2">'
                       f"<title>{esc(label)} (smoothed: rolling median)</title></path>")
    few = len(pts) <= 60
    for p in pts:
        if p.n and few:
            tip = f"{label}: {p.mean:.6g} at {p.x:,.6g}" + (f" (mean of {p.n})" if p.n > 1 else "")
            out.append(f'<circle class="point" cx="{plot.px(p.x):.1f}" cy="{plot.py(p.mean):.1f}" r="2.5" '
                       f'fill="{colour}"><title>{esc(tip)}</title></circle>')
        if p.bad:
            x = plot.px(p.bad_x if math.isfinite(p.bad_x) else p.x)
            y = plot.bottom - 5
            out.append(f'<path class="nonfinite" d="M{x - 4:.1f},{y - 4:.1f}L{x + 4:.1f},{y + 4:.1f}M{x - 4:.1f},'
                       f'{y + 4:.1f}L{x + 4:.1f},{y - 4:.1f}" stroke="#111" stroke-width="1.6"><title>'
                       f"{esc(f'{label}: {p.bad} NaN/inf value(s) near {p.bad_x:,.6g}')}</title></path>")
    return out


def _abandoned(plot: _Plot, curve: Curve) -> list[str]:
    out = []
    for line in curve.abandoned:
        raw = plot.path([p.x for p in line.points], [p.mean for p in line.points])
        if raw:
            out.append(f'<path class="abandoned" d="{raw}" fill="none" stroke="#888" stroke-width="1" '
                       f'stroke-dasharray="3,2" stroke-opacity="0.7"><title>{esc(line.label)}: values of an attempt '
                       "a rollback left (not the steps the final model saw)</title></path>")
    for r in curve.rollbacks[:50]:
        x = plot.px(r.to_step)
        out.append(f'<line class="rollback" x1="{x:.1f}" x2="{x:.1f}" y1="{plot.top}" y2="{plot.bottom}" '
                   f'stroke="#555" stroke-dasharray="4,3"><title>{esc(f"rank {r.rank}: went back from step ")}'
                   f"{r.from_step:,} to {r.to_step:,} (a rollback: the curve follows the new attempt)</title></line>")
    return out


def _band(plot: _Plot, xs: Sequence[float], lo: Sequence[float], hi: Sequence[float], colour: str, tip: str,
          opacity: float) -> str:
    pairs = [(x, a, b) for x, a, b in zip(xs, lo, hi, strict=True) if math.isfinite(a) and math.isfinite(b)
             and not (plot.y.log and a <= 0)]
    if len(pairs) < 2:
        return ""
    top = "L".join(f"{plot.px(x):.1f},{plot.py(b):.1f}" for x, _, b in pairs)
    bottom = "L".join(f"{plot.px(x):.1f},{plot.py(a):.1f}" for x, a, _ in reversed(pairs))
    return (f'<path class="band" d="M{top}L{bottom}Z" fill="{colour}" fill-opacity="{opacity}" stroke="none">'
            f"<title>{esc(tip)}</title></path>")


def _spikes(plot: _Plot, spikes: Sequence[tuple[float, float]], label: str) -> list[str]:
    out = []
    for x, v in spikes[:200]:
        px = plot.px(x)
        y = plot.top + 1
        out.append(f'<path class="spike" d="M{px:.1f},{y:.1f}L{px + 4:.1f},{y + 7:.1f}L{px - 4:.1f},{y + 7:.1f}Z" '
                   f'fill="#d62728"><title>{esc(f"{label}: spike to {v:.6g} at {x:,.6g} (above the axis)")}'
                   "</title></path>")
    return out


def _legend(entries: Sequence[tuple[str, str]], x0: int, y: int, width: int) -> list[str]:
    out = []
    x = x0
    for name, colour in entries[:10]:
        shown = name if len(name) <= 48 else name[:47] + "…"
        if x + 24 + 7 * len(shown) > width:
            break
        out.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{x + 14}" y="{y + 9}" {_FONT}>{esc(shown)}</text>')
        x += 24 + 7 * len(shown)
    return out


def _svg_open(width: int, height: int, label: str, metric: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart curve-chart" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(label)}" data-metric="{esc(metric)}">'
            f"<title>{esc(label)}</title>")


def text_alternative(curve: Curve) -> str:
    """What the chart shows, in words (its ``aria-label``: a screen reader's only access to it): the first line's
    first and last values and where, the lowest and highest of every line, the NaN/inf count."""
    def num(v: float) -> str:
        return f"{v:.4g}" + (f" {curve.unit}" if curve.unit and curve.unit != "1" else "")

    def at(v: float) -> str:
        return f"step {v:,.0f}" if curve.by_step else f"{v:.3g} s"

    text = f"{curve.title}, {curve.points:,} values by {curve.x_label}"
    drawn = [p for p in curve.lines[0].points if p.n] if curve.lines else []
    if drawn:
        first, last = drawn[0], drawn[-1]
        every = [p for line in curve.lines for p in line.points if p.n]
        text += (f": {curve.lines[0].label} from {num(first.mean)} at {at(first.x)} to {num(last.mean)} at "
                 f"{at(last.x)}; lowest {num(min(p.lo for p in every))}, highest {num(max(p.hi for p in every))}")
    if curve.nonfinite:
        text += f"; {curve.nonfinite:,} NaN/inf"
    if curve.rollbacks:
        text += (f"; went back {len(curve.rollbacks)} time(s) (first from step {curve.rollbacks[0].from_step:,} to "
                 f"{curve.rollbacks[0].to_step:,}): {curve.abandoned_points:,} values of abandoned attempts, dimmed")
    return text


def curve_chart(curve: Curve, *, width: int = 600, height: int = 220) -> str:
    """One metric of one run."""
    x = _x_range((*curve.lines, *curve.abandoned))
    scale = y_scale(curve.lines, allow_log=log_allowed(curve.name))
    if x is None or scale is None:
        return ""
    plot = _Plot(width, height, x, scale)
    out = [_svg_open(width, height + 18, text_alternative(curve), curve.title)]
    out += plot.axes(curve.unit, curve.by_step, curve.x_label)
    out += _abandoned(plot, curve)
    legend = []
    for i, line in enumerate(curve.lines):
        colour = PALETTE[i % len(PALETTE)]
        out += _draw_line(plot, line, colour, line.label)
        legend.append((line.label, colour))
    if curve.abandoned:
        legend.append(("abandoned attempt", "#888"))
    out += _spikes(plot, scale.spikes, curve.title)
    out += _legend(legend, plot.left, height + 5, width)
    out.append("</svg>")
    return "".join(out)


def overlay_chart(title: str, runs: Sequence[tuple[str, Curve]], *, width: int = 1280, height: int = 260) -> str:
    """The same metric of several runs on one chart (``compare``): each run's first line (its ranks' median, or
    the one line of equal ranks), one colour per run, raw and smoothed."""
    lines = [(label, c.lines[0]) for label, c in runs if c.lines]
    if not lines:
        return ""
    x = _x_range([line for _, line in lines])
    scale = y_scale([line for _, line in lines], allow_log=all(log_allowed(c.name) for _, c in runs))
    if x is None or scale is None:
        return ""
    by_step = all(c.by_step for _, c in runs)
    unit = next((c.unit for _, c in runs if c.unit), "")
    plot = _Plot(width, height, x, scale)
    out = [_svg_open(width, height + 18, title, title)]
    out += plot.axes(unit, by_step, "step" if by_step else "seconds since each run's start")
    legend = []
    for i, (label, line) in enumerate(lines):
        colour = PALETTE[i % len(PALETTE)]
        out.append(f'<g class="run" data-run="{esc(label)}">')
        out += _draw_line(plot, line, colour, f"{label}: {line.label}")
        out.append("</g>")
        legend.append((label, colour))
    out += _spikes(plot, scale.spikes, title)
    out += _legend(legend, plot.left, height + 5, width)
    out.append("</svg>")
    return "".join(out)
