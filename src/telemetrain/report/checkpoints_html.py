"""The report's "Checkpoints and restarts" section: the session's runs and this run's checkpoint spans on one
timeline, then the checkpoints by step across the ranks (a rank that saved late or slow, a failure, stands out in
one row however many ranks saved), every span (folded when many) and the save successes."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from ..cli_common import SHOWN_ROWS
from .html_tables import attributes_cell, few_table, folded, table
from .model import ReportModel
from .model_pass import SpanRow
from .svg import fmt_unit, timeline

__all__ = ["STATUS_COLOURS", "checkpoint_steps", "checkpoints_section"]

STATUS_COLOURS = {"finished": "#2ca02c", "interrupted": "#ff7f0e", "crash": "#d62728", "killed": "#8c1c13",
                  "running": "#17becf",
                  "no_training": "#9e9e9e", "absent": "#e0e0e0", "this run": "#1f77b4"}
MAX_SPAN_ROWS = 500  # the checkpoint spans listed one a row, the earliest
MAX_TICKS = 1000  # the checkpoints ticked on the timeline, the earliest


@dataclasses.dataclass
class CheckpointStep:
    """The spans of one checkpoint (a span name and an iteration) across the ranks."""

    name: str
    step: int | None
    start_ns: int  # the earliest start
    ranks: set[int] = dataclasses.field(default_factory=set)
    ended: list[tuple[float, int]] = dataclasses.field(default_factory=list)  # (seconds, rank) of those that ended
    not_ok: int = 0  # failed or never ended

    @property
    def median(self) -> float | None:
        return statistics.median(s for s, _ in self.ended) if self.ended else None

    @property
    def slowest(self) -> tuple[float, int] | None:
        """The longest span's seconds and rank (the lowest rank of a tie)."""
        return max(self.ended, key=lambda sr: (sr[0], -sr[1])) if self.ended else None


def checkpoint_steps(spans: list[SpanRow]) -> list[CheckpointStep]:
    """The spans grouped by name and iteration (one group per name for those naming none), by earliest start."""
    steps: dict[tuple[str, int | None], CheckpointStep] = {}
    for span in spans:
        key = (span.name, span.step)
        group = steps.get(key)
        if group is None:
            steps[key] = group = CheckpointStep(span.name, span.step, span.start_ns)
        group.start_ns = min(group.start_ns, span.start_ns)
        group.ranks.add(span.rank)
        if span.duration_s is not None:
            group.ended.append((span.duration_s, span.rank))
        if span.status != "ok":
            group.not_ok += 1
    return sorted(steps.values(), key=lambda g: (g.start_ns, g.name, -1 if g.step is None else g.step))


def _iterations(first: int | None, last: int | None) -> str | None:
    """A run's iterations, ``first..last``; None (a dash) for a run that trained none."""
    if first is None and last is None:
        return None
    return f"{'?' if first is None else first}..{'?' if last is None else last}"


def _describe(g: CheckpointStep) -> str:
    """A checkpoint's tick's tooltip."""
    head = f"{g.name} step {'-' if g.step is None else g.step}: "
    slowest, failed = g.slowest, f"{g.not_ok} failed or never ended" if g.not_ok else "ok"
    if len(g.ranks) == 1:
        took = fmt_unit(slowest[0], "s") if slowest is not None else "never ended"
        return head + f"rank {next(iter(g.ranks))}, {took}, {failed}"
    median = g.median
    if slowest is None or median is None:
        return head + f"{len(g.ranks)} ranks, {failed}"
    return (head + f"{len(g.ranks)} ranks, median {fmt_unit(median, 's')}, slowest {fmt_unit(slowest[0], 's')} "
            f"(rank {slowest[1]}), {failed}")


def _by_step(m: ReportModel, steps: list[CheckpointStep]) -> str:
    """The checkpoints by step, when more than one rank wrote checkpoint spans."""
    if len({s.rank for s in m.checkpoints}) < 2:
        return ""
    rows: list[list[Any]] = []
    slowest_s: dict[int, float] = {}  # a row's slowest seconds, by the row's id: the outliers the table lists
    for g in steps:
        median, slowest = g.median, g.slowest
        ratio = slowest[0] / median if slowest is not None and median else None
        row = [f"{(g.start_ns - m.start_ns) / 1e9:.3f}", g.name, g.step, len(g.ranks),
               fmt_unit(median, "s") if median is not None else "-",
               fmt_unit(slowest[0], "s") if slowest is not None else "-",
               slowest[1] if slowest is not None else "-", f"{ratio:.2f}x" if ratio is not None else "-", g.not_ok]
        if slowest is not None:
            slowest_s[id(row)] = slowest[0]
        rows.append(row)
    return ("<h3>checkpoints by step</h3>"
            '<p class="note">One row per checkpoint (a span name and the iteration it saved or loaded) across the '
            "ranks: how many ranks wrote it, their median time and the slowest rank's. Where every rank writes its "
            "share (a sharded checkpoint), a rank far above the median is slow to write (its storage, its share of "
            "the state) and holds the others at the next collective; where one rank writes for all, it is that "
            "rank.</p>"
            + few_table(("start (s)", "span", "step", "ranks", "median", "slowest", "slowest rank", "slowest / median",
                         "failed or never ended"), rows, numeric=(0, 2, 3, 4, 5, 6, 7, 8),
                        key=lambda r: slowest_s.get(id(r)), marked=lambda r: bool(r[8]), what="checkpoints",
                        outliers="the quickest and the slowest, those with a failure"))


def _attempt_labels(run_ids: list[str]) -> list[str]:
    """Short lane names for a session's runs: ``attempt 2 (.1)``, what tells ``<session>.1`` from its siblings (run
    ids share the session's long prefix, which would fill the lane's room); a session of one run: "this run"."""
    if len(run_ids) < 2:
        return ["this run"] * len(run_ids)  # (the bar's tooltip names it)
    lo, hi = min(run_ids), max(run_ids)  # the common prefix of all is that of these two
    common = lo[:next((i for i, (a, b) in enumerate(zip(lo, hi, strict=False)) if a != b), len(lo))]
    cut = max(common.rfind(c) for c in ".-_/")  # the distinct tails start at a separator, kept in them
    return [f"attempt {i + 1} ({rid[cut:] if cut > 0 and len(rid) > cut else rid})"
            for i, rid in enumerate(run_ids)]


def checkpoints_section(m: ReportModel) -> str:
    """The section: the session's runs and this run's checkpoints on one timeline, the runs, the checkpoints by
    step across ranks, every span, the save successes."""
    body = ""
    lanes: list[tuple[str, list[tuple[float, float, str, str]]]] = []
    markers: list[tuple[int, float, str, str]] = []
    g = m.goodput
    this_lane = 0
    origin = m.start_ns / 1e9
    if g is not None and g.runs:
        origin = min(r.start_time_sec for r in g.runs if r.start_time_sec is not None) if any(
            r.start_time_sec is not None for r in g.runs) else origin
        labels = _attempt_labels([r.run_id for r in g.runs])
        for i, r in enumerate(g.runs):
            bars = []
            if r.start_time_sec is not None and r.end_time_sec is not None:
                trained = _iterations(r.first_iteration, r.last_iteration)
                saved = r.last_checkpoint_step
                tip = (f"run {r.run_id}: {r.status}, "  # (goodput's last checkpoint: unknown is left out)
                       + (f"iterations {trained}" if trained is not None else "no iteration")
                       + (f", last checkpoint at step {saved}" if saved is not None else ""))
                bars.append((r.start_time_sec - origin, r.end_time_sec - origin,
                             STATUS_COLOURS.get(r.status, "#999"), tip))
            lanes.append((f"{'> ' if r.run_id == m.run_id else ''}{labels[i]}", bars))
            if r.run_id == m.run_id:
                this_lane = i
    else:
        lanes.append(("> this run", [(0.0, (m.end_ns - m.start_ns) / 1e9, STATUS_COLOURS["this run"],
                                      f"run {m.run_id}")]))
    steps = checkpoint_steps(m.checkpoints)
    for c in steps:  # a tick a checkpoint, not a span: a job of many ranks saves each on every rank
        colour = "#d62728" if c.not_ok else "#2ca02c" if c.name.startswith("checkpoint_save") else "#1f77b4"
        markers.append((this_lane, c.start_ns / 1e9 - origin, colour, _describe(c)))
    body += timeline("restarts and checkpoints", lanes, markers=markers[:MAX_TICKS],
                     x_label="seconds since the session's start")
    body += ('<p class="note">Bars: the session\'s runs (green finished, orange interrupted by a Ctrl-C, red '
             "crashed, dark red killed, teal running), from goodput's per-run timeline; the run of this report is "
             "marked &gt;. Ticks: this run's checkpoints, at the first rank's start (green saves, blue loads, red "
             "where a rank's span failed or never ended).</p>")
    if g is not None:
        body += "<h3>runs of the session</h3>" + table(
            ("run", "status", "iterations", "last checkpoint step", "checkpointed", "productive", "lost", "notes"),
            [(r.run_id, r.status, _iterations(r.first_iteration, r.last_iteration), r.last_checkpoint_step,
              r.checkpointed_iterations, r.productive_iterations, r.lost_iterations, "; ".join(r.notes))
             for r in g.runs], numeric=(3, 4, 5, 6))
    if m.checkpoints:
        by_step = _by_step(m, steps)
        spans = table(("start (s)", "rank", "span", "step", "duration", "status", "attributes"),
                      [(f"{(s.start_ns - m.start_ns) / 1e9:.3f}", s.rank, s.name, s.step,
                        fmt_unit(s.duration_s, "s") if s.duration_s is not None else "never ended", s.status,
                        attributes_cell(s.attributes)) for s in m.checkpoints[:MAX_SPAN_ROWS]], numeric=(0, 1, 3, 4))
        if len(m.checkpoints) > MAX_SPAN_ROWS:
            spans += (f'<p class="note">{len(m.checkpoints) - MAX_SPAN_ROWS:,} more not listed (listed: the '
                      f"earliest {MAX_SPAN_ROWS}).</p>")
        if by_step and len(m.checkpoints) > SHOWN_ROWS:  # the table by step lists them: every span folded
            spans = folded(f"every span ({len(m.checkpoints):,})", spans)
        body += by_step + "<h3>checkpoint spans</h3>" + spans
    if m.checkpoint_successes:
        successes = table(("time (s)", "source", "productive iterations", "attributes"),
                          [(f"{m.seconds(e.wall_ns):.3f}", e.source,
                            e.attributes.get("productive_train_iterations", ""), attributes_cell(e.attributes))
                           for e in m.checkpoint_successes], numeric=(0, 2))
        total = max(len(m.checkpoint_successes), m.event_counts[("ranks", "training", "save_checkpoint_success")])
        if total > len(m.checkpoint_successes):
            successes += (f'<p class="note">{total - len(m.checkpoint_successes):,} more not listed (listed: the '
                          f"earliest {len(m.checkpoint_successes):,}).</p>")
        if len({e.source for e in m.checkpoint_successes}) > 1 and len(m.checkpoint_successes) > SHOWN_ROWS:
            successes = folded(f"every event ({total:,})", successes)  # (one a rank and checkpoint)
        body += "<h3>save_checkpoint_success</h3>" + successes
    if not m.checkpoints and not m.checkpoint_successes:
        body += '<p class="note">No checkpoint spans or events in this run.</p>'
    return body


