"""The report's findings: the findings engine (``analysis.findings``) over what the report's pass collected (it also
picks the chart's slow windows and the heatmap's slow ranks by the same rules), the GPU findings,
and the run store's health findings (dropped records, sink failures, damaged lines, missing ranks, error events,
failed spans), errors first. docs/report.md, Findings.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import TYPE_CHECKING

from ..analysis.findings import Finding, Note, Thresholds, analyse
from ..analysis.findings.builder import CRASH_SPANS
from ..analysis.findings.fmt import ranges
from ..analysis.findings.run import attempts_of
from ..analysis.findings.slowdown import slow_iteration_windows
from ..analysis.findings.worker_exits import EVENT as WORKER_FAILED
from .gpu_health import gpu_findings

if TYPE_CHECKING:
    from .model import ReportModel
    from .model_pass import _Collector

__all__ = ["model_torn_corrupt", "report_findings"]


def _engine_findings(model: ReportModel, c: _Collector, thresholds: Thresholds | None) -> tuple[list[Finding],
                                                                                               list[Note]]:
    """The findings engine over what the pass collected; also sets the chart's slow windows and the heatmap's slow
    ranks from the same rules."""
    for span in model.lifecycle:
        if model.running and span.status == "never ended" and span.name in CRASH_SPANS:
            continue  # still going: its loop is open, not killed (as `tail` reads it)
        c.inputs.span_failure(span.name, span.rank, span.status, span.error)
        c.inputs.checkpoint_save(span.rank, span.name, span.step, span.duration_s, span.status)
    hosts = {p.rank: p.identity.host for p in model.processes}
    data = c.inputs.build(start_ns=model.start_ns, open_spans_crashed=False,
                          attempts=attempts_of(model.goodput, model.run_id))
    data = dataclasses.replace(data, hosts={**data.hosts, **hosts})
    result = analyse(data, thresholds)
    flagged = {(w.rank, w.first_step, w.step) for w in slow_iteration_windows(data.windows, thresholds)}
    model.slow_windows = sorted(c.windows_at(flagged), key=lambda w: (w.iteration, w.rank))
    model.slow_ranks = sorted({(f.evidence.ranks[0], f.evidence.effect or 0.0) for f in result.findings
                               if f.kind == "straggler" and f.evidence and f.evidence.ranks}, key=lambda x: -x[1])
    return list(result.findings), list(result.notes)


def report_findings(model: ReportModel, c: _Collector, thresholds: Thresholds | None) -> list[Finding]:
    found, model.notes = _engine_findings(model, c, thresholds)
    found += [Finding(*f) for f in gpu_findings(model.gpu)]
    if c.dropped:
        found.append(Finding("warning", "dropped records", f"dropped records: {c.dropped}",
                             f"{c.dropped} record(s) were dropped before reaching a sink (queue full or sink "
                             "suspended; diagnostic records named 'dropped')"))
    for (sink, what), count in sorted(c.sink_failures.items()):
        found.append(Finding("warning", "sink failure", f"sink failure: {sink} ({what})",
                             f"{count} record(s) concerned by {what} diagnostics of sink {sink!r}"))
    if c.unencodable:
        found.append(Finding("warning", "unencodable", f"unencodable records: {c.unencodable}",
                             "records that could not be encoded were replaced by diagnostics"))
    torn, corrupt = model_torn_corrupt(model)
    if torn or corrupt:
        found.append(Finding("warning", "damaged lines", f"damaged lines: {corrupt} corrupt, {torn} torn",
                             "lines the reader skipped: a torn last line (a crash mid-write) or lines that did not "
                             "decode"))
    world = model.meta.get("world_size")
    if isinstance(world, int) and model.processes and len(model.ranks) < world:
        missing = sorted(set(range(world)) - set(model.ranks))
        found.append(Finding("warning", "missing ranks", f"missing ranks: {len(missing)}",
                             f"world_size is {world} but rank(s) {ranges(missing)} wrote nothing in this run"))
    # (the training loop's and the application's are the crash findings')
    failed_spans = [e for e in model.problems if "span status" in e.attributes and e.name not in CRASH_SPANS]
    errors = [e for e in model.problems if e.severity in ("error", "critical") and "span status" not in e.attributes
              and (e.group, e.name) != WORKER_FAILED]  # (the agent's worker exits: the crash finding says them)
    if errors:
        names = Counter(e.name for e in errors)
        found.append(Finding("error", "errors", f"error events: {len(errors)}",
                             ", ".join(f"{n} x{k}" for n, k in names.most_common(8))))
    if failed_spans:
        names = Counter(f"{e.name} ({e.attributes['span status']})" for e in failed_spans)
        found.append(Finding("warning", "failed spans", f"spans not ok: {len(failed_spans)}",
                             ", ".join(f"{n} x{k}" for n, k in names.most_common(8))))
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(found, key=lambda f: order.get(f.severity, 3))


def model_torn_corrupt(model: ReportModel) -> tuple[int, int]:
    logs = model.processes + model.agents
    return sum(p.torn for p in logs), sum(p.corrupt for p in logs)
