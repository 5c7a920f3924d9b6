"""Static inline SVG charts: lines with percentile bands, a heatmap, stacked bars, a timeline.

Each function returns one ``<svg>`` element as a string. Every piece of text that reaches the markup goes through
``esc`` (labels and tooltips come from whoever wrote the run); tooltips are SVG ``<title>`` elements, which browsers
show on hover without any script.
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Callable, Sequence

from ..text import printable

__all__ = ["PALETTE", "axis_labels", "axis_ticks", "esc", "fmt_unit", "heatmap", "line_chart", "nice_ticks",
           "stacked_bars", "timeline"]

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
_FONT = 'font-family="system-ui,sans-serif" font-size="11"'
Point = tuple[float, float]


def esc(text: object) -> str:
    """Markup escaped, and control characters shown as the terminal shows them (``\\x1b``): in a page they are
    invisible, or reorder the text around them (the bidi overrides)."""
    return html.escape(printable(str(text)), quote=True)


def fmt_unit(value: float, unit: str, digits: int = 3) -> str:
    """A value for an axis or a tooltip: seconds as ms/s, fractions as %, bytes in IEC units; ``digits``
    significant digits (a percentage: ``digits - 3`` decimals, so 3 gives ``60%``)."""
    if not math.isfinite(value):
        return str(value)
    if unit == "s":
        if abs(value) < 1:
            return f"{value * 1e3:.{digits}g} ms"
        return f"{value:.{digits}g} s" if abs(value) < 1000 else f"{value:,.{max(0, digits - 4)}f} s"
    if unit == "1":
        if abs(value) >= 0.1 or value == 0:
            return f"{value:.{max(0, digits - 3)}%}"
        return f"{value:.{digits - 2}%}"
    if unit in ("By", "bytes"):
        for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(value) < 1024 or suffix == "TiB":
                return f"{value:.{digits}g} {suffix}"
            value /= 1024
    if unit == "Cel":
        return f"{value:.{digits}g} °C"
    return _plain(value, digits) + (f" {unit}" if unit else "")


def _plain(value: float, digits: int) -> str:
    """``digits`` significant digits in plain digits for everyday magnitudes (``4,000``, ``25,000``; ``1M`` past a
    million), not ``4e+03`` (a log axis's ticks, a tooltip); tiny values keep their exponent."""
    rounded = float(f"{value:.{digits}g}")
    if abs(rounded) >= 1e6:
        scale, suffix = next((f, n) for f, n in _SI if abs(rounded) >= f)
        return f"{rounded / scale:.{digits}g}{suffix}"
    if abs(rounded) >= 1000:
        return f"{rounded:,.0f}"
    return f"{value:.{digits}g}"


_UNIT_TICKS = ("s", "1", "By", "bytes", "Cel")  # units fmt_unit writes out; other units are named beside the chart
_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"))


def axis_labels(ticks: Sequence[float], unit: str = "", *, log: bool = False) -> list[str]:
    """Labels for an axis's ticks that tell every tick from its neighbours (``59.5%``, ``60%``, ``60.5%``, never
    ``60%`` twice), with plain digits for everyday magnitudes (``4,000``, ``0.175``; ``2.5M`` past a million), not
    ``4e+03``. Units ``fmt_unit`` knows are written with the value; any other unit is left to the chart's caption."""
    if unit in _UNIT_TICKS or log or len(ticks) < 2:
        labels: list[str] = []
        for digits in range(3, 10):  # the fewest digits that tell the ticks apart
            labels = [fmt_unit(t, unit if unit in _UNIT_TICKS else "", digits) for t in ticks]
            if len(set(labels)) == len(labels):
                break
        return labels
    finite = [t for t in ticks if math.isfinite(t)]
    top = max((abs(t) for t in finite), default=0.0)
    gaps = [b - a for a, b in itertools.pairwise(finite) if b > a]
    if not gaps or top < 1e-3:
        return axis_labels(ticks, unit, log=True)
    scale, suffix = next(((f, n) for f, n in _SI if top >= f), (1.0, ""))
    step = min(gaps) / scale
    decimals = max(0, -math.floor(math.log10(step)))
    while decimals < 12 and abs(step * 10 ** decimals - round(step * 10 ** decimals)) > 1e-6:
        decimals += 1  # a step of 2.5 x 10^k needs one digit more than its power of ten
    return ["0" if t == 0 else f"{t / scale:,.{decimals}f}{suffix}" if math.isfinite(t) else str(t) for t in ticks]


def axis_ticks(lo: float, hi: float, n: int, unit: str = "") -> list[float]:
    """``nice_ticks``, in the axis's own unit: bytes at round MiB/GiB (binary), not at round decimal byte counts
    (``95.4 MiB``, ``191 MiB``)."""
    top = max(abs(lo), abs(hi)) if math.isfinite(lo) and math.isfinite(hi) else 0.0
    if unit in ("By", "bytes") and top >= 1024:
        scale = 1024.0 ** min(4, int(math.log(top, 1024)))
        return [t * scale for t in nice_ticks(lo / scale, hi / scale, n)]
    return nice_ticks(lo, hi, n)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values (1, 2, 2.5, 5 x a power of ten apart) from ``lo`` to ``hi``."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


class _Frame:
    """Plot area and the data -> pixel mapping."""

    def __init__(self, width: int, height: int, x: tuple[float, float], y: tuple[float, float],
                 left: int = 64, right: int = 16, top: int = 12, bottom: int = 34) -> None:
        self.width, self.height = width, height
        self.left, self.right, self.top, self.bottom = left, width - right, top, height - bottom
        x0, x1 = x
        y0, y1 = y
        self.x0, self.x1 = x0, (x1 if x1 > x0 else x0 + 1)
        self.y0, self.y1 = y0, (y1 if y1 > y0 else y0 + 1)

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def py(self, y: float) -> float:
        return self.bottom - (y - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)

    def axes(self, x_fmt: Callable[[float], str], y_unit: str, x_label: str) -> list[str]:
        out = [f'<rect x="{self.left}" y="{self.top}" width="{self.right - self.left}" '
               f'height="{self.bottom - self.top}" fill="#fff" stroke="#ccc"/>']
        ticks = axis_ticks(self.y0, self.y1, 4, y_unit)
        for t, text in zip(ticks, axis_labels(ticks, y_unit), strict=True):
            y = self.py(t)
            out.append(f'<line x1="{self.left}" x2="{self.right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
            out.append(f'<text x="{self.left - 4}" y="{y + 4:.1f}" text-anchor="end" {_FONT}>{esc(text)}</text>')
        for t in nice_ticks(self.x0, self.x1, 6):
            x = self.px(t)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{self.bottom}" y2="{self.bottom + 4}" stroke="#999"/>')
            out.append(f'<text x="{x:.1f}" y="{self.bottom + 15}" text-anchor="middle" {_FONT}>'
                       f'{esc(x_fmt(t))}</text>')
        out.append(f'<text x="{(self.left + self.right) / 2:.0f}" y="{self.height - 3}" text-anchor="middle" '
                   f'{_FONT} fill="#555">{esc(x_label)}</text>')
        return out


def _open(width: int, height: int, label: str, cls: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {cls}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(label)}">')


def _finite(points: Sequence[Point]) -> list[Point]:
    return [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]


def _path(frame: _Frame, points: Sequence[Point]) -> str:
    return "M" + "L".join(f"{frame.px(x):.1f},{frame.py(y):.1f}" for x, y in points)


def _number(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 or v == int(v) else f"{v:.3g}"


def _in_words(label: str, lines: Sequence[tuple[str, Sequence[Point]]], unit: str, markers: int) -> str:
    """A line chart's text alternative (its ``aria-label``): each line's first and last value, lowest and highest
    (the first 8 lines), the red markers' count."""
    said = []
    for name, points in lines[:8]:
        pts = _finite(points)
        if pts:
            ys = [y for _, y in pts]
            said.append(f"{name} from {fmt_unit(pts[0][1], unit)} to {fmt_unit(pts[-1][1], unit)} (lowest "
                        f"{fmt_unit(min(ys), unit)}, highest {fmt_unit(max(ys), unit)})")
    text = label + (": " + "; ".join(said) if said else "")
    if len(lines) > 8:
        text += f"; and {len(lines) - 8} more lines"
    return text + (f"; {markers} marked in red" if markers else "")


def line_chart(
    label: str,
    lines: Sequence[tuple[str, Sequence[Point]]],
    *,
    bands: Sequence[tuple[str, Sequence[Point], Sequence[Point]]] = (),
    markers: Sequence[tuple[float, float, str]] = (),
    unit: str = "",
    x_label: str = "",
    x_fmt: Callable[[float], str] = _number,
    width: int = 1280,
    height: int = 260,
    y_zero: bool = True,
) -> str:
    """Lines (label, points), shaded bands (label, lower, upper: same x values) under them, and red markers
    (x, y, tooltip). A legend names every line and band."""
    ys = [y for _, pts in lines for _, y in _finite(pts)] + [y for _, lo, hi in bands for _, y in _finite(hi)]
    ys += [y for _, y, _ in markers if math.isfinite(y)]
    xs = [x for _, pts in lines for x, _ in _finite(pts)] + [x for _, lo, _ in bands for x, _ in _finite(lo)]
    if not xs or not ys:
        return ""
    y_lo = 0.0 if y_zero and min(ys) >= 0 else min(ys)
    y_hi = max(ys) * 1.05 if max(ys) > 0 else max(ys) + 1
    frame = _Frame(width, height, (min(xs), max(xs)), (y_lo, y_hi))
    out = [_open(width, height + 18, _in_words(label, lines, unit, len(markers)), "line-chart"),
           f"<title>{esc(label)}</title>"]
    out += frame.axes(x_fmt, unit, x_label)
    legend: list[tuple[str, str, float]] = []
    for i, (name, lower, upper) in enumerate(bands):
        lo, hi = _finite(lower), _finite(upper)
        if not lo or not hi:
            continue
        opacity = 0.35 if i == 0 else 0.18
        d = _path(frame, hi) + "L" + "L".join(f"{frame.px(x):.1f},{frame.py(y):.1f}" for x, y in reversed(lo)) + "Z"
        out.append(f'<path d="{d}" fill="{PALETTE[0]}" fill-opacity="{opacity}" stroke="none">'
                   f"<title>{esc(name)}</title></path>")
        legend.append((name, PALETTE[0], opacity))
    for i, (name, points) in enumerate(lines):
        pts = _finite(points)
        if not pts:
            continue
        colour = PALETTE[i % len(PALETTE)]
        out.append(f'<path d="{_path(frame, pts)}" fill="none" stroke="{colour}" stroke-width="1.5">'
                   f"<title>{esc(name)}</title></path>")
        if len(pts) == 1:
            out.append(f'<circle cx="{frame.px(pts[0][0]):.1f}" cy="{frame.py(pts[0][1]):.1f}" r="3" '
                       f'fill="{colour}"/>')
        legend.append((name, colour, 1.0))
    for x, y, tip in markers:
        if math.isfinite(x) and math.isfinite(y):
            out.append(f'<circle class="marker" cx="{frame.px(x):.1f}" cy="{frame.py(y):.1f}" r="3.5" '
                       f'fill="#d62728"><title>{esc(tip)}</title></circle>')
    if markers:
        legend.append(("flagged", "#d62728", 1.0))
    x = frame.left
    for name, colour, opacity in legend[:12]:
        out.append(f'<rect x="{x}" y="{height + 5}" width="10" height="10" fill="{colour}" '
                   f'fill-opacity="{opacity}"/>')
        out.append(f'<text x="{x + 14}" y="{height + 14}" {_FONT}>{esc(name)}</text>')
        x += 24 + 6 * min(len(name), 40)
    out.append("</svg>")
    return "".join(out)


def _heat_colour(ratio: float) -> str:
    """1.0 (typical) -> pale, 2.0 and above -> dark red; below typical -> pale blue."""
    if not math.isfinite(ratio):
        return "#000"
    if ratio < 1:
        t = min(1.0, (1 - ratio) * 4)
        r, g, b = 255 - 60 * t, 255 - 30 * t, 245.0
    else:
        t = min(1.0, (ratio - 1))
        r, g, b = 255 - 55 * t, 245 - 200 * t, 220 - 190 * t
    return f"#{int(r):02x}{int(g):02x}{int(b):02x}"


def heatmap(
    label: str,
    rows: Sequence[str],
    cells: Sequence[Sequence[float | None]],
    *,
    typical: float,
    columns: Sequence[tuple[float, float]],
    flags: Sequence[tuple[int, int, str]] = (),
    unit: str = "s",
    width: int = 1280,
) -> str:
    """``cells[row][col]`` coloured by its ratio to ``typical``; ``columns[col]`` = (first, last) iteration of the
    column; ``flags`` (row, col, tooltip) draw a marker on a cell."""
    if not rows or not columns:
        return ""
    row_h = max(3, min(22, 360 // len(rows)))
    # room for the longest name (~6.5 px a character at the chart's 11 px): "ranks 2016..2047" was cut at 96
    left, top = max(96, 12 + math.ceil(6.5 * max(len(r) for r in rows))), 6
    plot_w = width - left - 16
    col_w = plot_w / len(columns)
    height = top + row_h * len(rows) + 56
    out = [_open(width, height, label, "heatmap"), f"<title>{esc(label)}</title>"]
    # too many rows for a name each: each marked slow, and every n-th where it does not overlap one of those
    every = max(1, math.ceil(12 / row_h))
    slow = [i for i, name in enumerate(rows) if name.endswith(" slow")]
    for i, name in enumerate(rows):
        y = top + i * row_h
        if i in slow or (i % every == 0 and not any(abs(i - k) < every for k in slow)):
            out.append(f'<text x="{left - 4}" y="{y + row_h / 2 + 4:.1f}" text-anchor="end" {_FONT}>'
                       f"{esc(name)}</text>")
        for j, value in enumerate(cells[i]):
            if value is None:
                continue
            a, b = columns[j]
            tip = f"{name}, iterations {a:,.0f}..{b:,.0f}: {fmt_unit(value, unit)} ({value / typical:.2f}x typical)"
            out.append(f'<rect x="{left + j * col_w:.2f}" y="{y}" width="{col_w + 0.3:.2f}" height="{row_h - 1}" '
                       f'fill="{_heat_colour(value / typical)}"><title>{esc(tip)}</title></rect>')
    for i, j, tip in flags:
        cx = left + (j + 0.5) * col_w
        cy = top + i * row_h + row_h / 2
        s = max(3.0, min(6.0, row_h / 2.5))
        d = f"M{cx:.1f},{cy - s:.1f}L{cx + s:.1f},{cy + s:.1f}L{cx - s:.1f},{cy + s:.1f}Z"
        out.append(f'<path class="flag" d="{d}" fill="#111" stroke="#fff" stroke-width="0.8">'
                   f"<title>{esc(tip)}</title></path>")
    base = top + row_h * len(rows)
    for t in nice_ticks(columns[0][0], columns[-1][1], 6):
        span = (columns[-1][1] - columns[0][0]) or 1
        x = left + (t - columns[0][0]) / span * plot_w
        out.append(f'<text x="{x:.1f}" y="{base + 14}" text-anchor="middle" {_FONT}>{_number(t)}</text>')
    out.append(f'<text x="{left + plot_w / 2:.0f}" y="{base + 28}" text-anchor="middle" {_FONT} fill="#555">'
               f"iteration</text>")
    for k, ratio in enumerate((0.75, 1.0, 1.25, 1.5, 2.0)):
        x = left + k * 120
        out.append(f'<rect x="{x}" y="{base + 36}" width="14" height="10" fill="{_heat_colour(ratio)}" '
                   f'stroke="#ccc"/><text x="{x + 18}" y="{base + 45}" {_FONT}>{ratio:g}x typical</text>')
    out.append(f'<path d="M{left + 606},{base + 36}L{left + 612},{base + 46}L{left + 600},{base + 46}Z" '
               f'fill="#111"/><text x="{left + 618}" y="{base + 45}" {_FONT}>straggler report</text>')
    out.append("</svg>")
    return "".join(out)


def stacked_bars(
    label: str,
    rows: Sequence[tuple[str, Sequence[tuple[str, float]]]],
    *,
    unit: str = "s",
    width: int = 1280,
    colours: dict[str, str] | None = None,
) -> str:
    """One horizontal bar per row, its segments (name, value) side by side, all bars on one scale."""
    rows = [(name, [(s, v) for s, v in segs if math.isfinite(v) and v > 0]) for name, segs in rows]
    totals = [sum(v for _, v in segs) for _, segs in rows]
    if not rows or max(totals, default=0) <= 0:
        return ""
    names: list[str] = []
    for _, segs in rows:
        names += [s for s, _ in segs if s not in names]
    colour = {n: (colours or {}).get(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)}
    bar_h, left = 20, 110
    plot_w = width - left - 90
    height = 8 + len(rows) * (bar_h + 6) + 26
    scale = plot_w / max(totals)
    out = [_open(width, height, label, "bars"), f"<title>{esc(label)}</title>"]
    for i, ((name, segs), total) in enumerate(zip(rows, totals, strict=True)):
        y = 8 + i * (bar_h + 6)
        out.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end" {_FONT}>{esc(name)}</text>')
        x = float(left)
        for seg, value in segs:
            w = value * scale
            tip = f"{name}: {seg} {fmt_unit(value, unit)} ({value / total:.1%})"
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{bar_h}" fill="{colour[seg]}">'
                       f"<title>{esc(tip)}</title></rect>")
            if w > 60:
                out.append(f'<text x="{x + 4:.1f}" y="{y + 14}" {_FONT} fill="#fff">{esc(seg)} '
                           f"{value / total:.0%}</text>")
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + 14}" {_FONT}>{esc(fmt_unit(total, unit))}</text>')
    x = left
    y = height - 14
    for n in names:
        out.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{colour[n]}"/>'
                   f'<text x="{x + 14}" y="{y + 9}" {_FONT}>{esc(n)}</text>')
        x += 30 + 6 * len(n)
    out.append("</svg>")
    return "".join(out)


def _lane_label(name: str, room: int = 19) -> str:
    """What fits left of a lane (150 px of 11 px text): the end of a long name after an ellipsis, keeping a
    leading ``"> "`` (the lane a caption points at)."""
    if len(name) <= room:
        return name
    head = "> " if name.startswith("> ") else ""
    return head + "…" + name[len(name) - (room - len(head) - 1):]


def timeline(
    label: str,
    lanes: Sequence[tuple[str, Sequence[tuple[float, float, str, str]]]],
    *,
    markers: Sequence[tuple[int, float, str, str]] = (),
    x_label: str = "seconds since the start",
    width: int = 1280,
) -> str:
    """Lanes (label, bars: (start, end, colour, tooltip)) on one time axis; markers (lane, x, colour, tooltip)."""
    xs = [v for _, bars in lanes for a, b, _, _ in bars for v in (a, b)] + [x for _, x, _, _ in markers]
    xs = [x for x in xs if math.isfinite(x)]
    if not lanes or not xs:
        return ""
    lane_h = 26
    frame = _Frame(width, 10 + lane_h * len(lanes) + 34, (min(xs), max(xs)), (0, len(lanes)), left=150, top=10)
    out = [_open(width, frame.height, label, "timeline"), f"<title>{esc(label)}</title>"]
    for t in nice_ticks(frame.x0, frame.x1, 6):
        x = frame.px(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{frame.top}" y2="{frame.bottom}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{frame.bottom + 15}" text-anchor="middle" {_FONT}>{_number(t)}</text>')
    out.append(f'<text x="{(frame.left + frame.right) / 2:.0f}" y="{frame.height - 3}" text-anchor="middle" '
               f'{_FONT} fill="#555">{esc(x_label)}</text>')
    for i, (name, bars) in enumerate(lanes):
        y = frame.top + i * lane_h
        out.append(f'<text x="{frame.left - 6}" y="{y + 17}" text-anchor="end" {_FONT}>{esc(_lane_label(name))}'
                   f"<title>{esc(name)}</title></text>")
        for a, b, colour, tip in bars:
            x0, x1 = frame.px(a), frame.px(b)
            out.append(f'<rect x="{x0:.2f}" y="{y + 4}" width="{max(x1 - x0, 1.5):.2f}" height="{lane_h - 8}" '
                       f'fill="{colour}"><title>{esc(tip)}</title></rect>')
    for lane, x, colour, tip in markers:
        px = frame.px(x)
        y = frame.top + lane * lane_h
        out.append(f'<path class="marker" d="M{px:.1f},{y + 2}L{px + 4:.1f},{y - 5}L{px - 4:.1f},{y - 5}Z" '
                   f'fill="{colour}"><title>{esc(tip)}</title></path>'
                   f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{y + 2}" y2="{y + lane_h - 2}" stroke="{colour}"/>')
    out.append("</svg>")
    return "".join(out)
