"""A comparison as a terminal table (plain text; names from the runs are made printable by the caller)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .compare import (
    INCONCLUSIVE,
    INSUFFICIENT,
    MAX_RANK_PHASES,
    NO_CHANGE,
    REGRESSION,
    CandidateComparison,
    Comparison,
    MetricComparison,
    RunRef,
)
from .compare_multi import MetricTally, MultiComparison
from .compare_quality import quality_lines
from .findings.fmt import ranges

__all__ = ["format_change", "format_comparison", "format_multi", "format_quantity", "row_change", "shown_rows"]

MAX_LISTED = 8  # the slower ranks (rank phases) a line names, the most slowed first


def format_quantity(value: float, unit: str) -> str:
    """Seconds in s/ms/us, a fraction (unit ``1``) as a percentage, anything else to 4 significant digits in plain
    digits (``22,970 samples/s``, not ``2.297e+04``) unless it is tiny or huge."""
    if not math.isfinite(value):
        return "-"
    if unit == "s":
        if abs(value) >= 1:
            return f"{value:.3f} s"
        if abs(value) >= 1e-3:
            return f"{value * 1e3:.2f} ms"
        return f"{value * 1e6:.1f} us"
    if unit == "1":
        return f"{value:.1%}"
    suffix = f" {unit}" if unit else ""
    if value == 0 or not 1e-3 <= abs(value) < 1e12:
        return f"{value:.4g}{suffix}"
    return f"{value:,.{max(0, 3 - math.floor(math.log10(abs(value))))}f}{suffix}"


def format_change(ratio: float) -> str:
    return "-" if not math.isfinite(ratio) else f"{(ratio - 1) * 100:+.1f}%"


def row_change(m: MetricComparison) -> str:
    """A table row's change: relative (``+15.0%``), but in percentage points for a fraction (goodput 28.5% ->
    81.0% is ``+52.5 pp``, not ``+184.2%``)."""
    if m.unit == "1":
        diff = m.candidate_median - m.baseline_median
        return "-" if not math.isfinite(diff) else f"{diff * 100:+.1f} pp"
    return format_change(m.ratio)


def format_interval(m: MetricComparison) -> str:
    if not (math.isfinite(m.ci_low) and math.isfinite(m.ci_high)):
        return "-"
    return f"[{format_change(m.ci_low)}, {format_change(m.ci_high)}]"


def describe(m: MetricComparison, confidence: float) -> str:
    """One line naming a metric's change, its size and confidence: ``iteration time +15.0% (95% CI +14.2%..+15.9%)``."""
    interval = f"{format_change(m.ci_low)}..{format_change(m.ci_high)}"
    return f"{m.label} {format_change(m.ratio)} ({confidence:.0%} CI {interval})"


def where_lines(c: CandidateComparison) -> list[str]:
    """Where the time went: the regressed phases by the time they added, and which ranks regressed when not all."""
    lines = []
    phases = sorted((m for m in c.regressions if m.scope == "phase"),
                    key=lambda m: m.candidate_median - m.baseline_median, reverse=True)
    if phases:
        lines.append("slower phases, by time added per iteration: " + ", ".join(
            f"{m.metric} +{format_quantity(m.candidate_median - m.baseline_median, m.unit)}" for m in phases))
    ranks = [m for m in c.metrics if m.scope == "rank"]
    slow = sorted((m for m in ranks if m.verdict == REGRESSION), key=lambda m: -(m.ratio or 0.0))
    if slow and len(slow) < len(ranks):
        more = f", +{len(slow) - MAX_LISTED} more" if len(slow) > MAX_LISTED else ""
        lines.append("slower ranks: " + ", ".join(f"rank {m.rank} {format_change(m.ratio)}"
                                                  for m in slow[:MAX_LISTED])
                     + f"{more} (the other {len(ranks) - len(slow)} rank(s): no regression)")
    by_rank = sorted((m for m in c.regressions if m.scope == "rank phase"),
                     key=lambda m: m.candidate_median - m.baseline_median, reverse=True)
    if by_rank:
        lines.append("slower rank phases, by time added per iteration: " + ", ".join(
            f"rank {m.rank} {m.metric} +{format_quantity(m.candidate_median - m.baseline_median, m.unit)}"
            for m in by_rank[:MAX_LISTED]) + (f" (+{len(by_rank) - MAX_LISTED} more)" if len(by_rank) > MAX_LISTED
                                              else ""))
    return lines


def _run_line(role: str, ref: RunRef) -> str:
    ranks = ranges(ref.ranks) or "none"
    spans = ""
    if ref.iteration_p50 is not None and ref.iteration_p99 is not None:
        spans = (f"; {ref.iteration_spans} sampled iterations, p50 {format_quantity(ref.iteration_p50, 's')} "
                 f"p99 {format_quantity(ref.iteration_p99, 's')}")
    return f"{role:<10} {ref.run_id}  perf_tag {ref.perf_tag}, {ref.windows} windows, ranks {ranks}{spans}"


def shown_rows(c: CandidateComparison) -> tuple[list[MetricComparison], int]:
    """The rows a candidate's table lists, and how many per-rank rows it leaves out (``_quiet_row``)."""
    many = sum(m.scope == "rank" for m in c.metrics) > MAX_RANK_PHASES
    shown = [m for m in c.metrics if not _quiet_row(m, many)]
    return shown, len(c.metrics) - len(shown)


def _quiet_row(m: MetricComparison, many_ranks: bool) -> bool:
    """A per-rank row a table leaves out: one that says nothing (no regression, not inconclusive, no significant
    change) of a rank's phase, or of a rank's iteration time when more than ``MAX_RANK_PHASES`` ranks are compared."""
    if m.scope != "rank phase" and not (m.scope == "rank" and many_ranks):
        return False
    return m.verdict not in (REGRESSION, INCONCLUSIVE) and not m.significant


def _run_lines(role: str, ref: RunRef) -> list[str]:
    return [_run_line(role, ref), f"{'':<10} {ref.path}"]


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _candidate_lines(c: CandidateComparison, comparison: Comparison) -> list[str]:
    lines = _run_lines("candidate", c.candidate)
    header = ("metric", "baseline", "candidate", "change", f"{comparison.confidence:.0%} CI", "verdict")
    rows = [header]
    shown, quiet = shown_rows(c)
    for m in shown:
        verdict = m.verdict.upper() if m.significant else m.verdict
        if m.note and m.verdict in (NO_CHANGE, INSUFFICIENT):  # why a change whose interval clears the threshold
            verdict += f" ({m.note})"  # is none (a small phase), or why nothing was tested: as the page says it
        rows.append((m.label, format_quantity(m.baseline_median, m.unit), format_quantity(m.candidate_median, m.unit),
                     row_change(m), format_interval(m), verdict))
    lines += _table(rows)
    if quiet:
        lines.append(f"  ({quiet} per-rank row(s) with no significant change not shown; --json has them)")
    regressions, improvements = c.regressions, c.improvements
    for what, found in (("regression(s)", regressions), ("improvement(s)", improvements)):
        if found:
            lines.append(f"  {len(found)} {what}:")
            lines += [f"    {describe(m, comparison.confidence)}" for m in found]
    if c.inconclusive:
        lines.append(f"  {len(c.inconclusive)} inconclusive (the machine was busy):")
        lines += [f"    {m.label} {format_change(m.ratio)}: {m.note}" for m in c.inconclusive[:6]]
        if len(c.inconclusive) > 6:
            lines.append(f"    ... and {len(c.inconclusive) - 6} more")
    lines += [f"  {line}" for line in where_lines(c)]
    if not c.tested:
        # nothing was tested: "no change with 95% confidence" would claim a test that never ran
        lines.append("  nothing tested: every row had too little data (the notes say what is missing)")
    elif not regressions and not improvements:
        lines.append(f"  no significant change (none beyond +/-{comparison.min_effect:.0%} with "
                     f"{comparison.confidence:.0%} confidence)")
    lines += quality_lines(c.quality, speed_of(c))
    lines += [f"  note: {n}" for n in c.notes]
    return lines


def speed_of(c: CandidateComparison) -> str:
    """'is 12.0% slower' / 'is 3.1% faster' / '' (no significant change of the iteration time)."""
    m = c.metric("iteration_time")
    if m is None or not m.significant:
        return ""
    return f"is {abs(m.change):.1%} {'slower' if m.change > 0 else 'faster'}"


def _method_line(comparison: Comparison) -> str:
    return (f"method: median of per-window means, bootstrap {comparison.resamples} resamples (seed "
            f"{comparison.seed}), {comparison.confidence:.0%} percentile CI of candidate/baseline; a change is "
            f"significant when the whole CI lies beyond +/-{comparison.min_effect:.0%} (or the spread of earlier "
            "runs), and inconclusive when a busier machine explains it (`telemetrain docs compare`)")


def _body_lines(comparison: Comparison) -> list[str]:
    lines = _run_lines("baseline", comparison.baseline)
    for c in comparison.candidates:
        lines.append("")
        lines += _candidate_lines(c, comparison)
    lines.append("")
    lines += [f"note: {n}" for n in comparison.notes]
    return lines


def _result_line(comparison: Comparison) -> str:
    total = sum(1 for _, m in comparison.regressions if m.verdict == REGRESSION)
    inconclusive = sum(len(c.inconclusive) for c in comparison.candidates)
    return (f"result: {total} regression(s), {len(comparison.improvements)} improvement(s)"
            + (f", {inconclusive} inconclusive (machine busy)" if inconclusive else "")
            + f" over {len(comparison.candidates)} candidate(s)")


def format_comparison(comparison: Comparison) -> list[str]:
    """The whole comparison, as lines."""
    return [*_body_lines(comparison), _method_line(comparison), _result_line(comparison)]


def tally_text(t: MetricTally) -> str:
    """'regressed against 2 of 3 baselines (+14.8%, +15.1%, -)'."""
    verdict = (f"regressed against {t.regressed} of {t.baselines} baselines" if t.regressed
               else f"improved against {t.improved} of {t.baselines} baselines" if t.improved
               else f"no regression against any of {t.baselines} baselines")
    if t.regressed and t.improved:
        verdict += f", improved against {t.improved}"
    if t.compared < t.baselines:
        verdict += f" (compared with {t.compared})"
    changes = ", ".join(format_change(m.ratio) if m is not None else "-" for m in t.changes)
    return f"{verdict} ({changes})"


def summary_lines(multi: MultiComparison) -> list[str]:
    """Per candidate, one line per metric: against how many baselines it regressed (or improved). The run's own
    metrics and phases always; per-rank rows only when they regressed or improved against some baseline."""
    n = len(multi.comparisons)
    lines = [f"summary over {n} baselines ({', '.join(b.run_id for b in multi.baselines)}); "
             "--fail-on-regression fails on a metric that regressed against every baseline:"]
    tallies = multi.tallies()
    for ref in multi.candidates:
        mine = [t for t in tallies if t.candidate == ref
                and (t.regressed or t.improved or t.scope not in ("rank", "rank phase"))]
        lines.append(f"candidate  {ref.run_id}")
        width = max((len(t.label) for t in mine), default=0)
        for t in mine:
            flag = "  REGRESSION against every baseline" if t.regressed_against_all else ""
            lines.append(f"  {t.label.ljust(width)}  {tally_text(t)}{flag}")
    return lines


def format_multi(multi: MultiComparison) -> list[str]:
    """Several baselines: one block per baseline, headed by which, then the tally per metric and the result."""
    lines: list[str] = []
    n = len(multi.comparisons)
    for i, comparison in enumerate(multi.comparisons, 1):
        lines.append(f"== against baseline {i} of {n}: {comparison.baseline.run_id} ==")
        lines += _body_lines(comparison)
        lines.append(_result_line(comparison))
        lines.append("")
    lines += summary_lines(multi)
    lines.append("")
    lines.append(_method_line(multi.comparisons[0]))
    every = multi.regressions
    some = sum(1 for t in multi.tallies() if t.regressed and not t.regressed_against_all)
    lines.append(f"result: {len(every)} regression(s) against every one of {n} baselines, {some} against some "
                 f"only, over {len(multi.candidates)} candidate(s)")
    return lines
