"""``telemetrain show``: a run's summary (per rank: metrics, stats, system samples, training figures, goodput,
findings). ``analysis.summary`` gathers the figures; this formats them (the system lines: ``show_system``; ``show
--list``: ``show_list``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any, TextIO

from .analysis.findings.fmt import ranges
from .analysis.findings.run import run_findings
from .analysis.findings.text import GoodputOf, findings_lines, goodput_once, session_goodput
from .cli_common import CLIError, few, fmt_config, fmt_duration, fmt_value, is_number, iso, resolve_run, table
from .phase_times import DEVICE, iteration_time, phase_times
from .show_json import show_dict
from .show_list import list_runs
from .show_system import system_lines
from .store.layout import RUN_META
from .store.reader import NotARunError, ProcessLog, Run, open_run
from .text import printable

__all__ = ["summarize"]


def summarize(run: Run, engine: Any = None, *, every_process: bool = False) -> list[str]:
    """The ``show`` report of a run, as lines. ``engine``: a ``store.engine.Engine`` over the run, to compute the
    figures by SQL (``analysis.summary``) instead of reading every record here. ``every_process``: a row for each
    process, agent and sampled host however many (else the first and the outliers, ``cli_common.few``)."""
    lines = [
        f"run         {run.run_id}",
        f"directory   {run.path}",
        f"session     {run.session_tag}",
        f"perf_tag    {run.perf_tag}",
    ]
    if not run.meta:  # else the config and workload lines are simply absent, and nothing says why
        state = "unreadable" if (run.path / RUN_META).exists() else "missing"
        lines.append(f"run.json    {state}: the run's config and workload are not known")
    config = run.meta.get("config")
    if isinstance(config, dict) and config:
        lines.append("config      " + " ".join(f"{k}={fmt_config(v)}" for k, v in config.items()))
    workload = run.meta.get("workload")
    if isinstance(workload, dict) and workload:  # what compare checks runs against (training.workload)
        lines.append("workload    " + " ".join(f"{k}={fmt_value(v)}" for k, v in workload.items())
                     + (f" (fingerprint {run.meta['fingerprint']})" if run.meta.get("fingerprint") else ""))

    read = read_for_show(run, engine)
    summary = read.summary
    ranks = run.ranks
    hosts = {p.identity.host for p in run.processes}
    lines.append(f"ranks       {len(ranks)} ({ranges(ranks) if ranks else 'none'}), {len(run.processes)} process(es)"
                 f" on {len(hosts)} host(s)")
    lines += _process_rows(run.processes, every_process)
    if run.agents:  # `telemetrain launch`: the elastic agent of each node, beside its workers
        from .distributed.summary import agent_node  # (standard library only: no torch)

        agent_rows = []
        for p in run.agents:
            events = [r for r in p.records if r.kind == "event"]
            restarts = sum(1 for r in events if r.group == "launcher" and r.name == "attempt_start"
                           and (r.attributes or {}).get("attempt"))
            end = next((r for r in events if r.group == "launcher" and r.name == "launch_end"), None)
            ended = (end.attributes or {}) if end is not None else {}
            by = f" by {ended['signal']}" if ended.get("signal") else ""  # (a signal stopped the agent)
            outcome = f", job {ended.get('outcome')}{by}" if end is not None else ""
            agent_rows.append((f"node {agent_node(p.records, p.identity.group_rank)}", f"pid {p.pid}",
                               f"host {p.identity.host}",
                               f"{len(p.records)} records, {len(events)} events, {restarts} restart(s){outcome}"))
        shown, hidden = few(agent_rows, keep=lambda row: "job " in row[3] and "job succeeded" not in row[3],
                            every=every_process)
        lines.append(f"agents      {len(run.agents)} (" + "; ".join(" ".join(r[:2]) for r in shown) +
                     (f"; ... {hidden} more" if hidden else "") + ")")
        lines += table(shown)

    walls = ([summary.start_ns, summary.end_ns] if summary.start_ns is not None and summary.end_ns is not None
             else [p.header["wall_ns"] for p in run.processes if "wall_ns" in p.header])
    if not walls and isinstance(run.meta.get("created_wall_ns"), int):
        walls = [run.meta["created_wall_ns"]]
    if walls:
        start, end = min(walls), max(walls)
        lines.append(f"time        {iso(start)} -> {iso(end)} ({fmt_duration((end - start) / 1e9)})"
                     + ("  still running (its training loop has not ended)" if read.running else ""))
    else:
        lines.append("time        unknown (no records)")

    kinds = ", ".join(f"{k} {n}" for k, n in sorted(summary.by_kind.items()))
    lines.append(f"records     {summary.records}" + (f": {kinds}" if kinds else ""))
    lines += table([(f"group {g}", k, str(n)) for (g, k), n in sorted(summary.by_group_kind.items())])

    lines += _metric_lines(summary.metrics)
    lines += _stat_lines(summary)
    lines += system_lines(summary, every_process=every_process)
    lines += _training_lines(summary)
    lines += _checkpoint_lines(summary)
    if summary.training_events:
        lines += _goodput_lines(run, read.goodput_of)
    lines += read.diagnosis
    lines += findings_lines(read.findings)  # the findings engine's, as the report shows them

    lines.append(f"events      {sum(summary.event_counts.values())}")
    lines += table([(g, n, str(c)) for (g, n), c in sorted(summary.event_counts.items())])
    if summary.severities:
        lines.append("  by severity: " + ", ".join(f"{s} {n}" for s, n in sorted(summary.severities.items())))

    failed = sum(n for n, _ in summary.failed_spans.values())
    lines.append(f"problems    torn lines {run.torn}, corrupt lines {run.corrupt}, diagnostics {summary.diagnostics}, "
                 f"spans not ok {failed}")
    lines += table([(f"span {group} {name}", status, f"x{n}", f"rank(s) {ranges(sorted(ranks))}")
                    for (group, name, status), (n, ranks) in sorted(summary.failed_spans.items())])
    diag_rows = []
    for (name, sink), (count, records, message) in sorted(summary.diagnostic_groups.items()):
        message = message.replace("\n", " ")[:160]
        diag_rows.append((name, f"sink {sink or '?'}", f"x{count}", f"count {records}", message))
    lines += table(diag_rows)
    return lines


@dataclasses.dataclass(frozen=True)
class ShowRead:
    """What ``show`` reads of a run, as text (``summarize``) or JSON (``show_json``)."""

    summary: Any  # analysis.summary.RunSummary
    goodput_of: GoodputOf  # the session's goodput, computed once per (folder, rank)
    diagnosis: list[str]  # what the distributed diagnosis found (hangs, late ranks, stragglers, clocks)
    findings: Any  # analysis.findings.Findings
    running: bool = False  # its training loop has not ended and it is still writing (``show --list``'s rule)


def read_for_show(run: Run, engine: Any = None) -> ShowRead:
    """The summary, goodput, diagnosis and findings of ``run``; by SQL with ``engine`` (``summarize``'s)."""
    from .analysis.summary import summarize_run, summarize_sql
    from .distributed.summary import diagnosis_lines  # (standard library only: no torch)
    from .show_list import still_running

    # by SQL, the findings' input first: its report windows merged by groups of ranks are the statements that parse
    # most JSON, run here while least is held in Python (the summary's figures and goodput's report grow with the
    # ranks; goodput's per-rank queries, streamed by segments since m17b, peak no higher over the windows held)
    builder = None
    if engine is not None:
        from .analysis.show_sql import findings_builder_sql

        builder = findings_builder_sql(engine, run)
    summary = summarize_sql(engine, run) if engine is not None else summarize_run(run)
    # the session's goodput once per (folder, rank): the goodput line's (rank 0) is the findings' restarts' (the
    # run's lowest rank)
    goodput_of = goodput_once(run, engine)
    # a loop still open in a run still being written is no crash (as `tail` and the report read it)
    running = any("" in states for states in summary.loop_states.values()) and still_running(run, summary.end_ns or 0)
    if engine is None:
        diagnosis = diagnosis_lines(run.records("event", agents=True))
        findings = run_findings(run, goodput_report=session_goodput(run, goodput_of=goodput_of),
                                open_spans_crashed=not running)
    else:  # the same, from the few rows they read, selected by SQL
        from .analysis.findings import analyse
        from .analysis.findings.run import attempts_of
        from .analysis.show_sql import diagnosis_events_sql

        assert builder is not None
        diagnosis = diagnosis_lines(diagnosis_events_sql(engine, run))
        attempts = attempts_of(session_goodput(run, goodput_of=goodput_of), run.run_id)
        findings = analyse(builder.build(attempts=attempts, open_spans_crashed=not running))
    return ShowRead(summary, goodput_of, diagnosis, findings, running)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _shown_rank(series: Any) -> int:
    """The rank whose figure is shown: rank 0 when it recorded the series, else the lowest that did."""
    return int(min(series.last_by_rank))


def _across_ranks(series: Any, value: Any) -> str:
    """``2 ranks: min .. max`` of the ranks' last values, when more than one rank recorded the series."""
    if len(series.last_by_rank) < 2:
        return ""
    values = [v for v in (value(r) for r in series.last_by_rank.values()) if is_number(v) and math.isfinite(v)]
    spread = f": {fmt_value(min(values))}..{fmt_value(max(values))}" if values else ""
    return f"; last on {len(series.last_by_rank)} ranks{spread}"


def _process_rows(processes: Sequence[ProcessLog], every: bool) -> list[str]:
    """A row per process: the first ones, those with damaged lines and those that wrote the fewest and the most
    records (``cli_common.few``), then what the others wrote."""
    if not processes:
        return []
    fewest = min(processes, key=lambda p: p.record_count)
    most = max(processes, key=lambda p: p.record_count)
    shown, hidden = few(processes, keep=lambda p: bool(p.torn or p.corrupt) or p is fewest or p is most,
                        every=every)
    rows = []
    for p in shown:
        extra = "".join(f", {n} {k}" for k, n in (("torn", p.torn), ("corrupt", p.corrupt)) if n)
        rows.append((f"rank {p.rank}", f"pid {p.pid}", f"host {p.identity.host}", f"{p.record_count} records{extra}"))
    lines = table(rows)
    if hidden:
        counts = sorted(p.record_count for p in processes)
        lines.append(f"  ... and {hidden} more process(es); records per process min {counts[0]} (rank {fewest.rank}), "
                     f"median {counts[len(counts) // 2]}, max {counts[-1]} (rank {most.rank}); "
                     "`telemetrain show --all` lists every one")
    return lines


def _metric_lines(metrics: dict[tuple[str, str], Any]) -> list[str]:
    """Each metric's last value on one rank (named), with the spread of the other ranks' last values."""
    lines = [f"metrics     {len(metrics)} (group, name = last value on the rank shown; points of all ranks)"]
    rows = []
    for (group, name), m in sorted(metrics.items()):
        if not m.last_by_rank:
            continue
        rank = _shown_rank(m)
        r = m.last_by_rank[rank]
        notes = [f"rank {rank}{_across_ranks(m, lambda x: x.value)}", _plural(m.count, "point")]
        if r.step is not None:
            notes.append(f"step {r.step}")
        if r.unit:
            notes.append(r.unit)
        rows.append((group, name, f"= {fmt_value(r.value)}", f"({', '.join(notes)})"))
    return lines + table(rows)


def _stat_lines(summary: Any) -> list[str]:
    """Per stat: windows, samples, and the last window's values on one rank (named)."""
    stats = summary.stats
    lines = [f"stats       {len(stats)} (group, name: windows and samples of all ranks; the last window's values on "
             "the rank shown)"]
    rows = []
    for (group, name), st in sorted(stats.items()):
        if not st.last_by_rank:
            continue
        rank = _shown_rank(st)
        last = st.last_by_rank[rank]
        unit = f" {last.unit}" if last.unit else ""
        values = " ".join(f"{k}={fmt_value(v)}" for k, v in last.values.items() if k != "count")
        others = f" ({len(st.last_by_rank)} ranks)" if len(st.last_by_rank) > 1 else ""
        rows.append((group, name, _plural(st.count, "window"), _plural(st.samples, "sample"),
                     f"rank {rank}{others}: {values}{unit}"))
    return lines + table(rows)


def _training_lines(summary: Any) -> list[str]:
    """The derived training metrics of one rank (named: rank 0's, else the lowest rank's), the spread across ranks,
    and the lifecycle."""
    updates = summary.updates_by_rank  # rank -> (reports, the last one's attributes)
    if not updates:
        return []
    rank = min(updates)
    last = updates[rank][1]
    lasts = {k: a for k, (_, a) in updates.items()}

    def ms(key: str) -> str:
        value = last.get(key)
        return f"{value * 1e3:.2f} ms" if is_number(value) else "-"

    ranks_note = f" from {len(updates)} ranks" if len(updates) > 1 else ""
    lines = [f"training    {last.get('num_iterations', '?')} iterations this run (global step "
             f"{last.get('current_iteration', '?')}) on rank {rank}, {summary.updates} metrics updates{ranks_note} "
             "(training_metrics_update)"]
    on = f"rank {rank}, last window"
    rows = [(f"iteration time ({on})", f"p50 {ms('p50_iteration_time_sec')}  p90 {ms('p90_iteration_time_sec')}"
             f"  p99 {ms('p99_iteration_time_sec')}  mean {ms('avg_iteration_time_sec')}"
             f"  max {ms('max_iteration_time_sec')}")]
    rows.append((f"iteration time (rank {rank}, whole run)", f"p50 {ms('cumulative_p50_iteration_time_sec')}  p99 "
                 f"{ms('cumulative_p99_iteration_time_sec')}  mean {ms('cumulative_avg_iteration_time_sec')}"))
    rows.append((f"throughput ({on})", "  ".join(_throughput(last)) or "-"))
    split = [f"{phase} {last[f'{phase}_time_fraction']:.0%}" for phase in
             ("dataloader", "forward", "backward", "optimizer", "zero_grad")
             if is_number(last.get(f"{phase}_time_fraction"))]
    label = ""
    device, clock = phase_times(last)
    device_total = iteration_time(last, clock)
    if clock == DEVICE and device_total:  # on a GPU the host split is launches: the device's instead
        split = [f"{phase} {seconds / device_total:.0%}" for phase, seconds in device.items()]
        label = ", device time"
    if split:
        rows.append((f"time split ({on}{label})", "  ".join(split)))
    if len(lasts) > 1:
        rows += _spread_rows(lasts)
    if is_number(last.get("time_to_first_iteration_sec")):
        rows.append((f"time to first iteration (rank {rank})", f"{last['time_to_first_iteration_sec']:.3f} s"))
    saves, validations = summary.saves.get(rank, 0), summary.validations.get(rank, 0)
    rows.append((f"checkpoints / validations (rank {rank})", f"{saves} saved  {validations} validation loops  "
                 f"{summary.errors} telemetry misuse errors (all ranks)"))
    return lines + table(rows)


def _checkpoint_lines(summary: Any) -> list[str]:
    """The checkpoint saves of every rank: how many, the mean span, and the save that took longest on some rank
    (which rank, against that save's mean: a rank slow to write holds the others at the next collective)."""
    saves = summary.saves_by_step
    if not saves:
        return []
    spans = sum(c.spans for c in saves.values())
    mean = sum(c.total_ns for c in saves.values()) / spans / 1e9
    (_, step), worst = longest_save(saves)
    failed = sum(c.not_ok for c in saves.values())
    at = f"step {step}" if step is not None else "a save naming no step"
    line = (f"checkpoints {len(saves)} save(s), {spans} span(s) on the ranks, mean {fmt_duration(mean)}; the longest: "
            f"{at} on rank {worst.slowest_rank}, {fmt_duration(worst.slowest_ns / 1e9)}")
    if worst.spans > 1:
        line += f" (that save's mean {fmt_duration(worst.mean_s)})"
    return [line + (f"; {failed} not ok" if failed else "")]


def longest_save(saves: dict[tuple[str, int | None], Any]) -> tuple[tuple[str, int | None], Any]:
    """The checkpoint whose save took longest on some rank; of a tie, the earliest step (then the span name): the
    same answer whichever reader read the run."""
    return max(saves.items(), key=lambda kv: (kv[1].slowest_ns, -(-1 if kv[0][1] is None else kv[0][1]), kv[0][0]))


def session_report(run: Run, goodput_of: GoodputOf) -> Any:
    """The session's goodput report on rank 0's timeline; None when there is none to compute (no training), an
    ``Exception`` when odd records made it fail (said, not raised: the rest of the summary stands)."""
    try:
        return goodput_of(run.path.parent if run.path.parent != run.path else run.path, 0)
    except (ValueError, OSError):
        return None
    except Exception as exc:  # noqa: BLE001 - odd records must not take the whole summary down
        return exc


def _throughput(a: dict[str, Any]) -> list[str]:
    """samples/s, tokens/s, TFLOP/s per GPU and MFU (as a percentage) of one report."""
    parts = [f"{fmt_value(a[key])} {label}" for key, label in (
        ("samples_per_second", "samples/s"), ("tokens_per_second", "tokens/s"),
        ("train_throughput_per_gpu", "TFLOP/s per GPU")) if is_number(a.get(key))]
    if is_number(a.get("mfu")):
        parts.append(f"MFU {a['mfu']:.1%}")
    return parts


def _spread_rows(lasts: dict[int, dict[str, Any]]) -> list[tuple[str, str]]:
    """Each rank's last window side by side: the fastest and slowest rank by mean iteration time, and the spread of
    throughput (every rank computes the job's samples/s from its own clock)."""
    rows = []
    # by rank: among ranks equally fast (or slow) the lowest is named, whichever order the ranks were read in
    means = {k: lasts[k]["avg_iteration_time_sec"] for k in sorted(lasts)
             if is_number(lasts[k].get("avg_iteration_time_sec"))}
    if means:
        fast, slow = min(means, key=means.__getitem__), max(means, key=means.__getitem__)
        rows.append((f"across {len(lasts)} ranks (last window)", f"mean iteration time min {means[fast] * 1e3:.2f} ms "
                     f"(rank {fast})  max {means[slow] * 1e3:.2f} ms (rank {slow})"))
    rates = [a["samples_per_second"] for a in lasts.values() if is_number(a.get("samples_per_second"))]
    if rates:
        rows.append(("", f"samples/s min {fmt_value(min(rates))}  max {fmt_value(max(rates))}"))
    return rows


def _goodput_lines(run: Run, goodput_of: GoodputOf) -> list[str]:
    """Goodput of the session the run belongs to (its restarts together), when it trained, on rank 0's timeline
    (``goodput_of``: ``analysis.findings.text.goodput_once`` of the run)."""
    report = session_report(run, goodput_of)
    if report is None:
        return []
    if isinstance(report, Exception):
        return [f"goodput     not computed: {type(report).__name__}: {report}"]
    runs = report.runs
    lines = [f"goodput     {report.goodput:.1%} of {fmt_duration(report.wall_seconds)} productive "
             f"({report.productive_iterations} iterations kept, {report.lost_iterations} lost) over {len(runs)} "
             f"run(s) of session {report.session_tag}, on rank {report.rank}'s timeline"
             + ("  (approximate)" if report.approximate else "")]
    badput = report.badput.as_dict()
    rows = [(f"badput {name}", f"{seconds:.3f} s", f"{seconds / report.wall_seconds:.1%}")
            for name, seconds in badput.items() if isinstance(seconds, (int, float)) and report.wall_seconds > 0]
    for r in runs:
        iterations = ("no iterations" if r.first_iteration is None or r.last_iteration is None
                      else f"iterations {r.first_iteration}..{r.last_iteration}")
        checkpoint = ("no checkpoint" if r.last_checkpoint_step is None
                      else f"last checkpoint at step {r.last_checkpoint_step}")
        rows.append((f"run {r.run_id}", r.status, f"{iterations}, {checkpoint}"))
    return lines + table(rows)




def _cmd_show(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.list:
        return list_runs(args.run_dir, out, as_json=args.json)
    from .store.engine import engine_for

    path = resolve_run(args.run_dir, err)
    try:
        run = open_run(path)
    except (OSError, NotARunError) as exc:  # FileNotFoundError included: the directory went away meanwhile
        raise CLIError(str(exc)) from None
    engine = engine_for([path])  # DuckDB when installed (the columnar extra): the run is not read into Python
    try:
        if args.json:  # (strict JSON: no terminal can be fooled by it, json.dumps escapes control characters)
            print(json.dumps(show_dict(run, engine), indent=2, allow_nan=False, default=str), file=out)
            return 0
        lines = summarize(run, engine, every_process=args.all)
    finally:
        if engine is not None:
            engine.close()
    # names and attributes come from whoever wrote the run: no terminal escapes reach the screen
    print("\n".join(printable(line) for line in lines), file=out)
    return 0
