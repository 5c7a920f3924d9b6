"""The report page: sections of tables and inline SVG charts, one self-contained HTML file, no script.

Every string that comes from the run (names, attributes, config, paths) is escaped here or in ``svg``; nothing is
inserted raw except the markup this module and ``svg`` build.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from .. import __version__
from ..analysis.findings.fmt import bytes_
from ..phase_times import LABELS
from .checkpoints_html import checkpoints_section
from .curves_html import curves_section
from .gpu_html import gpu_section
from .html_tables import attribute_value, attributes_cell, few_table, table
from .many_ranks import envelope, few_rows, heatmap_rows
from .model import ReportModel
from .model_pass import PHASES, Window
from .svg import esc, fmt_unit, heatmap, line_chart, stacked_bars

__all__ = ["render"]

MAX_CHART_POINTS = 1000
GOODPUT_COLOURS = {"productive": "#2ca02c", "initialization": "#ff7f0e", "checkpoint_load": "#17becf",
                   "checkpoint_save": "#1f77b4", "data_wait": "#bcbd22", "lost_progress": "#d62728",
                   "validation": "#9467bd", "idle": "#bbbbbb"}
PHASE_COLOURS = {"dataloader": "#ff7f0e", "forward": "#1f77b4", "backward": "#9467bd", "optimizer": "#2ca02c",
                 "zero_grad": "#8c564b", "other": "#bbbbbb"}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#222;background:#f6f7f9}
header{background:#1f2a37;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#cbd5e1;font-size:13px}
nav{background:#fff;border-bottom:1px solid #ddd;padding:6px 24px;font-size:13px;position:sticky;top:0}
nav a{margin-right:14px;color:#1f5fa8;text-decoration:none}
main{padding:8px 24px 40px;max-width:1360px}
section{background:#fff;border:1px solid #e2e5e9;border-radius:6px;margin:14px 0;padding:10px 16px}
h2{font-size:17px;margin:6px 0 10px}h3{font-size:14px;margin:14px 0 6px;color:#333}
table{border-collapse:collapse;font-size:12px;margin:4px 0 8px}
td,th{border-bottom:1px solid #eee;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f1f3f5}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(240px,1fr));gap:10px}
.card{border:1px solid #e2e5e9;border-radius:6px;padding:8px 12px}
.card .v{font-size:20px;font-weight:600}.card .l{font-size:12px;color:#555}.card .h{font-size:11px;color:#888}
.finding{border-left:4px solid #999;padding:4px 10px;margin:6px 0;font-size:13px}
.finding.error{border-color:#d62728;background:#fdf0f0}.finding.warning{border-color:#ff9f1c;background:#fff8ec}
.finding.info{border-color:#1f77b4;background:#f0f6fc}.finding b{display:block}
.finding .evidence{color:#555;font-size:12px;margin-top:2px}
.note{color:#666;font-size:12px}.attrs{font-family:ui-monospace,monospace;font-size:11px;word-break:break-all}
.cols{display:flex;flex-wrap:wrap;gap:0 28px;align-items:flex-start}.cols>div>p.note{max-width:640px}
svg.chart{display:block;margin:6px 0;max-width:100%;height:auto}
figure.curve{margin:0}figure.curve h3{margin:10px 0 2px}
h1,h2,h3,p,li,summary,figcaption,.finding,td.wrap{overflow-wrap:anywhere}
"""


def _iso(wall_ns: int) -> str:
    return _dt.datetime.fromtimestamp(wall_ns / 1e9, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{esc(title)}</h2>{body}</section>'


def _flatten(prefix: str, value: Any, out: list[tuple[str, str]]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out.append((prefix, attribute_value(value)))


# -- sections --------------------------------------------------------------------------------------------------------


def _headline(m: ReportModel) -> str:
    cards = "".join(f'<div class="card"><div class="l">{esc(label)}</div><div class="v">{esc(value)}</div>'
                    f'<div class="h">{esc(how)}</div></div>' for label, value, how in m.headline)
    return f'<div class="cards">{cards}</div>'


def _findings(m: ReportModel) -> str:
    notes = "".join(f'<p class="note" data-note="{esc(n.kind)}">Context: {esc(n.text)}</p>' for n in m.notes)
    if not m.findings:
        # "no slowdown" is only news where the rules had report windows to read: say which could not look
        blind = ("No report windows (training_metrics_update: no TrainingRecorder in this run): slowdowns, "
                 "stragglers, slow iterations and memory growth could not be looked for." if not m.windows else
                 "Report windows of one rank only: stragglers need two or more ranks to compare."
                 if len(m.windows) == 1 else "")
        return '<p class="note">No anomaly found: no crash, stall, slowdown, straggler, slow iteration, memory ' \
               "growth, NaN/inf value or spike, GPU throttling or memory pressure, dropped record, sink failure or " \
               "damaged line (`telemetrain docs report findings`).</p>" \
               + (f'<p class="note" data-note="blind">{esc(blind)}</p>' if blind else "") + notes
    return "".join(f'<div class="finding {esc(f.severity)}" data-kind="{esc(f.kind)}"><b>{esc(f.title)}</b>'
                   f"{esc(f.detail)}" + (f'<div class="evidence">evidence: {esc(f.evidence.summary())}</div>'
                                         if f.evidence is not None and f.evidence.summary() else "") + "</div>"
                   for f in m.findings) + notes


def _identity(m: ReportModel) -> str:
    meta = m.meta
    rows = [("run", m.run_id), ("session", m.session_tag), ("perf tag", m.perf_tag), ("directory", str(m.path)),
            ("world size", meta.get("world_size", "?")), ("restart count", meta.get("restart_count", "?"))]
    created = meta.get("created_wall_ns")
    if isinstance(created, int):
        rows.append(("created", _iso(created)))
    if m.end_ns > m.start_ns:
        rows.append(("records from", f"{_iso(m.start_ns)} to {_iso(m.end_ns)}"))
    body = '<div class="cols"><div>' + table(("field", "value"), rows) + "</div>"
    sections = (("config", meta.get("config")), ("hyperparameters", m.hyperparameters),
                ("training config", m.training_config), ("versions", meta.get("versions")),
                ("hardware", meta.get("hardware")))
    absent = []
    for key, values in sections:
        flat: list[tuple[str, str]] = []
        if values:  # (an empty one was a table of one row: no key, value "{}")
            _flatten("", values, flat)
        if flat:
            body += f"<div><h3>{esc(key)}</h3>" + table(("key", "value"), flat) + "</div>"
        else:
            absent.append(key)
    body += "</div>"
    if absent:
        body += f'<p class="note" data-note="absent">Not recorded in this run: {esc(", ".join(absent))}.</p>'
    procs = []
    for p in m.processes:
        i = p.identity
        argv = p.header.get("argv")
        procs.append((i.rank, i.local_rank, i.host, i.pid, i.role, p.record_count, p.torn, p.corrupt, p.path.name,
                      " ".join(map(str, argv))[:200] if isinstance(argv, list) else ""))
    body += "<h3>processes</h3>" + few_table(
        ("rank", "local rank", "host", "pid", "role", "records", "torn", "corrupt", "file", "argv"), procs,
        numeric=(0, 1, 3, 5, 6, 7), key=lambda row: row[5], marked=lambda row: bool(row[6] or row[7]),
        what="processes", outliers="the fewest and the most records, any with damaged lines")
    if m.agents:
        body += "<h3>launcher agents</h3>" + few_table(
            ("host", "pid", "records", "file"),
            [(p.identity.host, p.identity.pid, len(p.records), p.path.name) for p in m.agents], numeric=(1, 2),
            key=lambda row: row[2], what="agents",
            outliers="the fewest and the most records")
    return body


def _phases(m: ReportModel) -> str:
    body = ""
    if m.phase_seconds:
        names, slow = (*PHASES, "other"), dict(m.slow_ranks)
        totals = {rank: sum(seconds.values()) for rank, seconds in m.phase_seconds.items()}
        table_rows = []
        for rank, seconds in sorted(m.phase_seconds.items()):
            total = totals[rank] or 1.0
            table_rows.append((rank, *(f"{fmt_unit(seconds.get(p, 0.0), 's')} ({seconds.get(p, 0.0) / total:.0%})"
                                       for p in names)))
        # past 16 ranks the bars of the first, the least and the most time, the slow ranks, after the ranks' median
        shown, left = few_rows(table_rows, key=lambda row: totals[row[0]], marked=lambda row: row[0] in slow)
        bars = [(f"rank {row[0]}", [(p, m.phase_seconds[row[0]].get(p, 0.0)) for p in names]) for row in shown]
        if left:
            bars.insert(0, (f"median of {len(table_rows):,}", [(p, statistics.median(
                s.get(p, 0.0) for s in m.phase_seconds.values())) for p in names]))
        clocks = " and ".join(sorted({LABELS.get(v, v) for v in m.phase_source.values()})) or LABELS["host"]
        body += f"<h3>iteration time by phase, per rank: {esc(clocks)}</h3>" + stacked_bars(
            "iteration time by phase per rank", bars, colours=PHASE_COLOURS)
        body += few_table(("rank", *names), table_rows, numeric=tuple(range(7)), key=lambda row: totals[row[0]],
                          marked=lambda row: row[0] in slow, what="ranks",
                          outliers="the least and the most time, the slow ranks")
        body += ('<p class="note">From the training_metrics_update events: avg_&lt;phase&gt;_time_sec x '
                 "window_iterations, summed over the windows; other = avg_iteration_time_sec x window_iterations "
                 "minus the phases (a loop's warm-up iteration taken at its window's mean). "
                 "Without those events, the exported sub-phase spans are summed (a sample of the iterations). "
                 "Where device timing was on (CUDA events), the device times are shown instead: "
                 "avg_&lt;phase&gt;_device_time_sec, and other against avg_iteration_device_time_sec; the host "
                 "times of a GPU job measure kernel launches, and the phase that holds a sync absorbs the rest.</p>")
    lifecycle: dict[str, list[float]] = defaultdict(list)
    rank0 = m.ranks[0] if m.ranks else 0
    for span in m.lifecycle:
        if span.rank == rank0 and span.duration_s is not None:
            lifecycle[span.name].append(span.duration_s)
    if lifecycle:
        body += f"<h3>lifecycle spans (rank {rank0})</h3>" + table(
            ("span", "count", "total", "mean"),
            [(name, len(d), fmt_unit(sum(d), "s"), fmt_unit(sum(d) / len(d), "s")) for name, d in lifecycle.items()],
            numeric=(1, 2, 3))
    g = m.goodput
    if g is not None:
        segments = [("productive", g.productive_seconds), *g.badput.as_dict().items()]
        body += f"<h3>where the session's time went (goodput, rank {g.rank})</h3>" + stacked_bars(
            "session time by category", [("session", segments)],
            colours=GOODPUT_COLOURS)
        body += table(("category", "seconds", "share"),
                      [(name, f"{s:.3f}", f"{s / g.wall_seconds:.1%}" if g.wall_seconds else "-")
                       for name, s in segments], numeric=(1, 2))
    return body or '<p class="note">No training phases recorded (no TrainingRecorder spans or events).</p>'


def _bucket(windows: Sequence[Window], limit: int) -> list[list[Window]]:
    if len(windows) <= limit:
        return [[w] for w in windows]
    size = math.ceil(len(windows) / limit)
    return [list(windows[i:i + size]) for i in range(0, len(windows), size)]


def _iteration_chart(m: ReportModel) -> str:
    if m.windows:
        rank = min(m.windows)
        buckets = _bucket(m.windows[rank], MAX_CHART_POINTS)

        def line(get: Any, agg: Any) -> list[tuple[float, float]]:
            out = []
            for b in buckets:
                values = [v for v in (get(w) for w in b) if v is not None]
                if values:
                    out.append((float(b[-1].iteration), float(agg(values))))
            return out

        p50 = line(lambda w: w.p50, statistics.fmean)
        p90 = line(lambda w: w.p90, max)
        p99 = line(lambda w: w.p99, max)
        avg = line(lambda w: w.avg, statistics.fmean)
        markers = [(float(w.iteration), w.max or 0.0, f"rank {w.rank}: an iteration of {fmt_unit(w.max or 0.0, 's')} "
                    f"in the window ending at iteration {w.iteration}") for w in m.slow_windows if w.rank == rank]
        chart = line_chart(f"iteration time, rank {rank}", [("p50", p50), ("mean", avg)],
                           bands=[("p50..p90", p50, p90), ("p90..p99", p90, p99)], markers=markers[:500], unit="s",
                           x_label="iteration (end of each metrics window)")
        count = m.window_counts.get(rank, len(m.windows[rank]))
        note = (f"Rank {rank}'s training_metrics_update windows ({count}): the window's p50 and mean "
                "iteration time, shaded from p50 to p90 and p90 to p99; red: the windows of the 'slow iterations' "
                "finding (`telemetrain docs report findings`). Other ranks: the heatmap below.")
        if len(buckets) < count:
            note += (f" Drawn as {len(buckets)} points of {math.ceil(count / len(buckets))} windows "
                     "each (mean of p50 and mean, max of p90 and p99).")
        return chart + f'<p class="note">{esc(note)}</p>'
    if m.iteration_spans:
        rank = min(m.iteration_spans)
        points = m.iteration_spans[rank]
        step = max(1, len(points) // MAX_CHART_POINTS)
        chart = line_chart(f"iteration time, rank {rank}", [("exported iteration spans", points[::step])], unit="s",
                           x_label="seconds since the run's start")
        return chart + ('<p class="note">No training_metrics_update events: the duration of the exported '
                        "training_single_iteration spans (one in export_iteration_spans_every).</p>")
    return '<p class="note">No iteration timing in this run.</p>'


def _heatmap(m: ReportModel) -> str:
    heat = m.heatmap
    if heat is None:
        return '<p class="note">No per-rank iteration windows (training_metrics_update events).</p>' + \
            _stragglers_table(m)
    ranks = heat.ranks
    slow = dict(m.slow_ranks)
    labels, cells, row_of, per_row = heatmap_rows(ranks, heat.cells, slow)
    flags_by_cell: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for s in m.stragglers:
        who, step = s.get("rank"), s.get("step")
        if isinstance(who, int) and who in row_of and isinstance(step, int):
            flags_by_cell[(row_of[who], heat.column(step))].append(s)
    flags = []
    for (i, j), items in flags_by_cell.items():
        scores = [float(s["score"]) for s in items if isinstance(s.get("score"), (int, float))]
        phases = sorted({str(s.get("phase")) for s in items})
        who = ", ".join(f"rank {r}" for r in sorted({s["rank"] for s in items})[:8])
        flags.append((i, j, f"{who}: {len(items)} straggler report(s) ({', '.join(phases)})"
                      + (f", score up to {max(scores):.2f}" if scores else "")))
    width = heat.width
    columns = [(heat.lo + j * width, heat.lo + (j + 1) * width - 1) for j in range(heat.ncols)]
    chart = heatmap("per-rank mean iteration time", labels, cells, typical=heat.typical, columns=columns,
                    flags=flags)
    grouping = (f" {len(ranks):,} ranks: each row is {per_row} consecutive ranks, coloured by the highest of their "
                "means (a slow rank shows in its group's row); the table below lists the ranks." if per_row > 1
                else "")
    note = (f"Colour: each rank's mean iteration time (avg_iteration_time_sec of its windows) against the median of "
            f"all windows ({fmt_unit(heat.typical, 's')}). Triangles: straggler events (group cross_rank). A rank is "
            "marked slow when the findings name it a straggler (its slowdown against the other ranks shown)."
            + grouping)
    rank_rows = []
    for rank in ranks:
        med = heat.medians.get(rank)
        rank_rows.append((rank, m.window_counts.get(rank, 0), fmt_unit(med, "s") if med is not None else "-",
                          f"{slow[rank]:.2f}x" if rank in slow else ""))
    return (chart + f'<p class="note">{esc(note)}</p>' +
            few_table(("rank", "windows", "median window mean", "slow"), rank_rows, numeric=(0, 1, 2),
                      key=lambda row: row[1], marked=lambda row: bool(row[3]), what="ranks",
                      outliers="the fewest and the most windows, the slow ranks") +
            _stragglers_table(m))


def _stragglers_table(m: ReportModel) -> str:
    if not m.stragglers:
        return '<p class="note">No straggler events (group cross_rank) in this run.</p>'
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for s in m.stragglers:
        groups[tuple(str(s.get(k)) for k in ("rank", "host", "phase", "kind"))].append(s)
    rows = []
    # by rank as a number (rank 10 after rank 9), then host, phase and kind
    for key, items in sorted(groups.items(), key=lambda kv: (len(kv[0][0]), kv[0])):
        scores = [float(s["score"]) for s in items if isinstance(s.get("score"), (int, float))]
        steps = [s["step"] for s in items if isinstance(s.get("step"), int)]
        thresholds = {s.get("threshold") for s in items}
        rows.append((*key, len(items), f"{max(scores):.2f}" if scores else "-",
                     ", ".join(str(t) for t in thresholds), f"{min(steps)}..{max(steps)}" if steps else "-"))
    # a row per (rank, host, phase, kind): past 16 (a slow node of many ranks, thousands of ranks), the first and the
    # outliers, every row folded
    return "<h3>straggler reports</h3>" + few_table(
        ("rank", "host", "phase", "kind", "reports", "max score", "threshold", "steps"), rows, numeric=(4, 5),
        key=lambda row: row[4], what="(rank, phase) rows", outliers="the fewest and the most reports")


def _system(m: ReportModel) -> str:
    if not m.system:
        return ('<p class="note">No system samples (telemetrain.system sampler off, or psutil missing).</p>'
                + gpu_section(m.gpu))
    out = []
    for title, unit, series in m.system:
        lines, bands, note = envelope(series)  # (past 8 ranks or hosts: their envelope and the highest peaks)
        out.append(f"<div><h3>{esc(title)}</h3>" + line_chart(
            title, lines, bands=bands, unit=unit, x_label="seconds since the run's start", height=170, width=640)
            + (f'<p class="note">{esc(note)}</p>' if note else "") + "</div>")
    return _container_note(m) + '<div class="cols">' + "".join(out) + "</div>" + gpu_section(m.gpu)


def _container_note(m: ReportModel) -> str:
    """The container's memory against its cgroup limit, from the metrics table (over every host: each host's share
    is its line in the chart)."""
    usage, ws, limit = (m.metric_stats.get(("system", f"container.memory.{name}"))
                        for name in ("usage", "working_set", "limit"))
    if not usage or usage[3] is None:
        return ""
    text = f"Container memory: usage max {bytes_(usage[3])}"
    cap = float(limit[1]) if limit and isinstance(limit[1], (int, float)) and limit[1] > 0 else None
    if cap is not None:
        text += f" of its cgroup limit {bytes_(cap)} ({usage[3] / cap:.1%})"
    if ws and ws[3] is not None:
        text += f"; working set (usage less inactive file cache) max {bytes_(ws[3])}" + (
            f" ({ws[3] / cap:.1%} of the limit: the OOM killer acts near 100%)" if cap is not None else "")
    return f'<p class="note">{esc(text)}.</p>'


def _events(m: ReportModel) -> str:
    body = "<h3>warnings, errors, failed spans, diagnostics</h3>"
    if m.problems:
        body += table(("time (s)", "source", "group", "name", "severity", "attributes"),
                      [(f"{m.seconds(e.wall_ns):.3f}", e.source, e.group, e.name, e.severity,
                        attributes_cell(e.attributes))
                       for e in m.problems[:500]], numeric=(0,))
        if len(m.problems) > 500:
            body += f'<p class="note">{len(m.problems) - 500} more not shown.</p>'
    else:
        body += '<p class="note">None.</p>'
    body += "<h3>events</h3>"
    if m.events:
        body += table(("time (s)", "source", "group", "name", "severity", "attributes"),
                      [(f"{m.seconds(e.wall_ns):.3f}", e.source, e.group, e.name, e.severity,
                        attributes_cell(e.attributes))
                       for e in m.events], numeric=(0,))
        if m.events_left_out:
            body += f'<p class="note">{m.events_left_out} more events not shown (counts below).</p>'
    else:
        body += '<p class="note">None besides the training metrics updates.</p>'
    if m.event_counts:
        body += "<h3>events by name</h3>" + table(
            ("source", "group", "name", "count"),
            [(*key, n) for key, n in sorted(m.event_counts.items())], numeric=(3,))
    return body


def _records(m: ReportModel) -> str:
    body = ""
    if m.metric_stats:
        rows = []
        for (group, name), (count, last, lo, hi, unit) in sorted(m.metric_stats.items())[:2000]:
            rows.append((group, name, count, attribute_value(last), attribute_value(lo), attribute_value(hi), unit))
        body += "<h3>metrics</h3>" + table(("group", "name", "count", "last", "min", "max", "unit"), rows,
                                           numeric=(2, 3, 4, 5))
        if len(m.metric_stats) > 2000:
            body += f'<p class="note">{len(m.metric_stats) - 2000} more metric names not shown.</p>'
    if m.span_stats:
        span_rows = [(group, name, count, fmt_unit(seconds, "s"), fmt_unit(seconds / count, "s"), bad)
                for (group, name), (count, seconds, bad) in sorted(m.span_stats.items())[:2000]]
        body += "<h3>spans (ended)</h3>" + table(("group", "name", "count", "total", "mean", "not ok"), span_rows,
                                                 numeric=(2, 3, 4, 5))
    return body or '<p class="note">No metrics or spans.</p>'


def _curves(m: ReportModel) -> str:
    return curves_section(m.curves, m.metric_stats)


SECTIONS = (
    ("headline", "Headline"),
    ("anomalies", "Anomalies"),
    ("curves", "Model metrics"),
    ("iterations", "Iteration time"),
    ("ranks", "Per-rank heatmap"),
    ("phases", "Time by phase"),
    ("system", "System samples"),
    ("checkpoints", "Checkpoints and restarts"),
    ("events", "Events and errors"),
    ("identity", "Run and config"),
    ("records", "Metrics and spans"),
)


def _live(m: ReportModel) -> str:
    """A run still being written (``ReportModel.running``: its loop open, a recent record, no process of it known
    dead): said at the top, since every figure is the run as it stood."""
    if not m.running:
        return ""
    age_s = (time.time_ns() - m.end_ns) / 1e9
    return (f'<p class="finding info" data-note="live"><b>Still running.</b> Its training loop has not ended and its '
            f"last record is {max(age_s, 0.0):.0f} s old: the page shows the run as it stood when written, and its "
            "open loop is not read as a crash.</p>")


def render(m: ReportModel) -> str:
    """The whole page."""
    builders = {"headline": _headline, "anomalies": _findings, "identity": _identity, "phases": _phases,
                "iterations": _iteration_chart, "ranks": _heatmap, "system": _system,
                "checkpoints": checkpoints_section, "events": _events, "records": _records, "curves": _curves}
    sections = _live(m) + "".join(_section(anchor, title, builders[anchor](m)) for anchor, title in SECTIONS)
    nav = "".join(f'<a href="#{anchor}">{esc(title)}</a>' for anchor, title in SECTIONS)
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    title = f"telemetrain report: {m.run_id}"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "img-src data:\">"
        f"<meta name=\"viewport\" content=\"width=device-width\"><title>{esc(title)}</title><style>{_CSS}</style>"
        f"</head><body><header><h1>{esc(title)}</h1><p>session {esc(m.session_tag)} &middot; perf tag "
        f"{esc(m.perf_tag)} &middot; {len(m.ranks)} rank(s), {len(m.processes)} process(es) &middot; {esc(m.path)}"
        + (" &middot; <b>still running</b> (its training loop has not ended)" if m.running else "")
        + f" &middot; generated {esc(now)} by telemetrain {esc(__version__)}</p></header><nav>{nav}</nav>"
        f"<main>{sections}</main></body></html>\n"
    )
