"""``telemetrain show``: a run's summary (per rank: metrics, stats, system samples, training figures, goodput,
findings), and the listing of the runs under a folder. ``analysis.summary`` gathers the figures; this formats them."""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeGuard

from .analysis.findings.text import GoodputOf, goodput_once, run_findings_lines
from .cli_common import CLIError, fmt_config, fmt_duration, fmt_value, iso, resolve_run, table
from .phase_times import DEVICE, iteration_time, phase_times
from .store.layout import default_root
from .store.reader import NotARunError, Run, find_runs, open_run
from .text import printable

__all__ = ["summarize"]


def summarize(run: Run, engine: Any = None) -> list[str]:
    """The ``show`` report of a run, as lines. ``engine``: a ``store.engine.Engine`` over the run, to compute the
    figures by SQL (``analysis.summary``) instead of reading every record here."""
    from .analysis.summary import summarize_run, summarize_sql

    lines = [
        f"run         {run.run_id}",
        f"directory   {run.path}",
        f"session     {run.session_tag}",
        f"perf_tag    {run.perf_tag}",
    ]
    config = run.meta.get("config")
    if isinstance(config, dict) and config:
        lines.append("config      " + " ".join(f"{k}={fmt_config(v)}" for k, v in config.items()))
    workload = run.meta.get("workload")
    if isinstance(workload, dict) and workload:  # what compare checks runs against (training.workload)
        lines.append("workload    " + " ".join(f"{k}={fmt_value(v)}" for k, v in workload.items())
                     + (f" (fingerprint {run.meta['fingerprint']})" if run.meta.get("fingerprint") else ""))

    # by SQL, the findings' input first: its report windows merged by groups of ranks are the statements that parse
    # most JSON, run here while least is held in Python (the summary's figures and goodput's report grow with the
    # ranks; goodput's per-rank queries, streamed by segments since m17b, peak no higher over the windows held)
    builder = None
    if engine is not None:
        from .analysis.show_sql import findings_builder_sql

        builder = findings_builder_sql(engine, run)
    summary = summarize_sql(engine, run) if engine is not None else summarize_run(run)
    ranks = run.ranks
    lines.append(f"ranks       {len(ranks)} ({', '.join(map(str, ranks)) or 'none'}), {len(run.processes)} process(es)")
    proc_rows = []
    for p in run.processes:
        extra = "".join(f", {n} {k}" for k, n in (("torn", p.torn), ("corrupt", p.corrupt)) if n)
        proc_rows.append(
            (f"rank {p.rank}", f"pid {p.pid}", f"host {p.identity.host}", f"{p.record_count} records{extra}")
        )
    lines += table(proc_rows)
    if run.agents:  # `telemetrain launch`: the elastic agent of each node, beside its workers
        agent_rows = []
        for p in run.agents:
            events = [r for r in p.records if r.kind == "event"]
            restarts = sum(1 for r in events if r.group == "launcher" and r.name == "attempt_start"
                           and (r.attributes or {}).get("attempt"))
            end = next((r for r in events if r.group == "launcher" and r.name == "launch_end"), None)
            outcome = f", job {(end.attributes or {}).get('outcome')}" if end is not None else ""
            agent_rows.append((f"node {p.identity.group_rank}", f"pid {p.pid}", f"host {p.identity.host}",
                               f"{len(p.records)} records, {len(events)} events, {restarts} restart(s){outcome}"))
        lines.append(f"agents      {len(run.agents)} (" + "; ".join(" ".join(r[:2]) for r in agent_rows) + ")")
        lines += table(agent_rows)

    walls = ([summary.start_ns, summary.end_ns] if summary.start_ns is not None and summary.end_ns is not None
             else [p.header["wall_ns"] for p in run.processes if "wall_ns" in p.header])
    if not walls and isinstance(run.meta.get("created_wall_ns"), int):
        walls = [run.meta["created_wall_ns"]]
    if walls:
        start, end = min(walls), max(walls)
        lines.append(f"time        {iso(start)} -> {iso(end)} ({fmt_duration((end - start) / 1e9)})")
    else:
        lines.append("time        unknown (no records)")

    kinds = ", ".join(f"{k} {n}" for k, n in sorted(summary.by_kind.items()))
    lines.append(f"records     {summary.records}" + (f": {kinds}" if kinds else ""))
    lines += table([(f"group {g}", k, str(n)) for (g, k), n in sorted(summary.by_group_kind.items())])

    lines += _metric_lines(summary.metrics)
    lines += _stat_lines(summary)
    lines += _system_lines(summary)
    lines += _training_lines(summary)
    # the session's goodput once per (folder, rank): the goodput line's (rank 0) is the findings' restarts' (the
    # run's lowest rank)
    goodput_of = goodput_once(run, engine)
    if summary.training_events:
        lines += _goodput_lines(run, goodput_of)
    from .distributed.summary import diagnosis_lines  # (standard library only: no torch)

    if engine is None:
        lines += diagnosis_lines(run.records("event", agents=True))
        lines += run_findings_lines(run, goodput_of=goodput_of)  # the findings engine's, as the report shows them
    else:  # the same, from the few rows they read, selected by SQL
        from .analysis.findings import analyse
        from .analysis.findings.run import attempts_of
        from .analysis.findings.text import findings_lines, session_goodput
        from .analysis.show_sql import diagnosis_events_sql

        assert builder is not None
        lines += diagnosis_lines(diagnosis_events_sql(engine, run))
        attempts = attempts_of(session_goodput(run, goodput_of=goodput_of), run.run_id)
        lines += findings_lines(analyse(builder.build(attempts=attempts)))

    lines.append(f"events      {sum(summary.event_counts.values())}")
    lines += table([(g, n, str(c)) for (g, n), c in sorted(summary.event_counts.items())])
    if summary.severities:
        lines.append("  by severity: " + ", ".join(f"{s} {n}" for s, n in sorted(summary.severities.items())))

    lines.append(f"problems    torn lines {run.torn}, corrupt lines {run.corrupt}, diagnostics {summary.diagnostics}")
    diag_rows = []
    for (name, sink), (count, records, message) in sorted(summary.diagnostic_groups.items()):
        message = message.replace("\n", " ")[:160]
        diag_rows.append((name, f"sink {sink or '?'}", f"x{count}", f"count {records}", message))
    lines += table(diag_rows)
    return lines


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _shown_rank(series: Any) -> int:
    """The rank whose figure is shown: rank 0 when it recorded the series, else the lowest that did."""
    return int(min(series.last_by_rank))


def _across_ranks(series: Any, value: Any) -> str:
    """``2 ranks: min .. max`` of the ranks' last values, when more than one rank recorded the series."""
    if len(series.last_by_rank) < 2:
        return ""
    values = [v for v in (value(r) for r in series.last_by_rank.values()) if _is_number(v) and math.isfinite(v)]
    spread = f": {fmt_value(min(values))}..{fmt_value(max(values))}" if values else ""
    return f"; last on {len(series.last_by_rank)} ranks{spread}"


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


def _iec(n: float) -> str:
    """Bytes for people: 1.5 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _system_lines(summary: Any) -> list[str]:
    """What the system sampler recorded (``telemetrain.system``): host, processes, GPUs, allocator, run energy."""
    series = summary.system
    starts = summary.sampler_starts
    if not series and not starts:
        return []
    intervals = sorted({float(a["interval_s"]) for a in (r.attributes or {} for r in starts)
                        if _is_number(a.get("interval_s"))})
    cpus = {f"rank {r.identity.rank} pid {r.identity.pid}": (r.attributes or {}).get("process.cpu_count")
            for r in starts}
    samplers = {(r.identity.host, r.identity.pid) for r in starts}
    lines = [f"system      sampled by {len(samplers) or '?'} process(es) every "
             f"{', '.join(f'{i:g}' for i in intervals) or '?'} s (telemetrain.system)"]
    rows: list[tuple[str, ...]] = []
    for (who, group), m in sorted(series.items()):
        rows += _system_rows(who, group, m, cpus.get(who))
    lines += table(rows)
    # the run's energy: per device, the most that one of the processes sampling it saw (two ranks that both sample a
    # GPU must not count it twice)
    energy: dict[tuple[str, str, str], float] = {}
    for (who, group, name, _), joules in summary.energy_last.items():
        energy[(who, group, name)] = max(energy.get((who, group, name), 0.0), joules)
    if energy:
        total = sum(energy.values())
        how = Counter("integrated from power" if k[2].endswith("integrated") else "energy counter" for k in energy)
        lines.append(f"  energy      {total:,.1f} J = {total / 3.6e6:.6g} kWh from {len(energy)} GPU(s) while "
                     "sampled (" + ", ".join(f"{n} {s}" for s, n in sorted(how.items())) + ")")
    lines += [f"  gpu         none sampled: {reason}" for reason in summary.gpu_unavailable]
    return lines


def _system_rows(who: str, group: str, m: dict[str, Any], n_cpu: Any) -> list[tuple[str, ...]]:
    """The show rows of one (host or process, group) of system metrics (``m``: name -> ``summary.SystemSeries``)."""

    def mean(v: Any) -> float:
        return float(v.mean)

    def top(v: Any) -> float:
        return float(v.max)

    def last(name: str) -> float:
        v = m.get(name)
        return float(v.last) if v else 0.0

    rows: list[tuple[str, ...]] = []
    if group == "system":
        if m.get("system.cpu.utilization"):
            v = m["system.cpu.utilization"]
            rows.append((who, "cpu", f"mean {mean(v):.1%}  max {top(v):.1%} of all CPUs"))
        if m.get("system.memory.usage"):
            v = m["system.memory.usage"]
            swap = m.get("system.paging.usage")
            rows.append((who, "memory", f"mean {_iec(mean(v))}  max {_iec(top(v))} of "
                         f"{_iec(last('system.memory.limit'))}" + (f"; swap max {_iec(top(swap))}" if swap else "")))
        if m.get("system.disk.io.read") or m.get("system.network.io.receive"):
            rows.append((who, "i/o", f"disk read {_iec(last('system.disk.io.read'))} write "
                         f"{_iec(last('system.disk.io.write'))}; network receive "
                         f"{_iec(last('system.network.io.receive'))} transmit "
                         f"{_iec(last('system.network.io.transmit'))} (host-wide, while sampled)"))
        if m.get("process.memory.usage"):
            text = f"rss max {_iec(top(m['process.memory.usage']))}"
            if m.get("process.tree.memory.usage"):
                children = top(m["process.children.count"]) if m.get("process.children.count") else 0
                text += (f", with descendants max {_iec(top(m['process.tree.memory.usage']))} "
                         f"({children:.0f} at most)")
            for label, name in (("cpu", "process.cpu.utilization"),
                                ("with descendants", "process.tree.cpu.utilization")):
                if m.get(name):
                    cores = f" = {mean(m[name]) * n_cpu:.2f} cores" if isinstance(n_cpu, int) else ""
                    text += f"; {label} mean {mean(m[name]):.1%}{cores}, max {top(m[name]):.1%}"
            rows.append((who, "process", text))
    elif group.startswith("system.filesystem.") and m.get("system.filesystem.usage"):
        rows.append((who, f"filesystem {group.removeprefix('system.filesystem.')}",
                     f"used max {_iec(top(m['system.filesystem.usage']))} of {_iec(last('system.filesystem.limit'))}"))
    elif group.startswith("system.gpu."):
        parts = []
        if m.get("hw.gpu.utilization"):
            parts.append(f"util mean {mean(m['hw.gpu.utilization']):.0%} max {top(m['hw.gpu.utilization']):.0%}")
        if m.get("hw.gpu.memory.usage"):
            parts.append(f"memory max {_iec(top(m['hw.gpu.memory.usage']))} of {_iec(last('hw.gpu.memory.limit'))}")
        if m.get("hw.power"):
            parts.append(f"power mean {mean(m['hw.power']):.0f} W max {top(m['hw.power']):.0f} W")
        if m.get("hw.temperature"):
            parts.append(f"temperature max {top(m['hw.temperature']):.0f} C")
        for name in ("hw.gpu.throttle.power", "hw.gpu.throttle.thermal"):
            if m.get(name) and top(m[name]) > 0:
                parts.append(f"{name.rsplit('.', 1)[1]} throttling in {mean(m[name]):.0%} of samples")
        if parts:
            rows.append((who, f"gpu {group.removeprefix('system.gpu.')}", "; ".join(parts)))
    elif group.startswith("system.cuda.") and m.get("torch.cuda.memory.allocated.peak"):
        rows.append((who, f"cuda {group.removeprefix('system.cuda.')} allocator",
                     f"allocated peak {_iec(last('torch.cuda.memory.allocated.peak'))}, reserved peak "
                     f"{_iec(last('torch.cuda.memory.reserved.peak'))}, {last('torch.cuda.alloc_retries'):.0f} alloc "
                     f"retries, {last('torch.cuda.ooms'):.0f} OOMs"))
    return rows


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
        return f"{value * 1e3:.2f} ms" if _is_number(value) else "-"

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
             if _is_number(last.get(f"{phase}_time_fraction"))]
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
    if _is_number(last.get("time_to_first_iteration_sec")):
        rows.append((f"time to first iteration (rank {rank})", f"{last['time_to_first_iteration_sec']:.3f} s"))
    saves, validations = summary.saves.get(rank, 0), summary.validations.get(rank, 0)
    rows.append((f"checkpoints / validations (rank {rank})", f"{saves} saved  {validations} validation loops  "
                 f"{summary.errors} telemetry misuse errors (all ranks)"))
    return lines + table(rows)


def _throughput(a: dict[str, Any]) -> list[str]:
    """samples/s, tokens/s, TFLOP/s per GPU and MFU (as a percentage) of one report."""
    parts = [f"{fmt_value(a[key])} {label}" for key, label in (
        ("samples_per_second", "samples/s"), ("tokens_per_second", "tokens/s"),
        ("train_throughput_per_gpu", "TFLOP/s per GPU")) if _is_number(a.get(key))]
    if _is_number(a.get("mfu")):
        parts.append(f"MFU {a['mfu']:.1%}")
    return parts


def _spread_rows(lasts: dict[int, dict[str, Any]]) -> list[tuple[str, str]]:
    """Each rank's last window side by side: the fastest and slowest rank by mean iteration time, and the spread of
    throughput (every rank computes the job's samples/s from its own clock)."""
    rows = []
    # by rank: among ranks equally fast (or slow) the lowest is named, whichever order the ranks were read in
    means = {k: lasts[k]["avg_iteration_time_sec"] for k in sorted(lasts)
             if _is_number(lasts[k].get("avg_iteration_time_sec"))}
    if means:
        fast, slow = min(means, key=means.__getitem__), max(means, key=means.__getitem__)
        rows.append((f"across {len(lasts)} ranks (last window)", f"mean iteration time min {means[fast] * 1e3:.2f} ms "
                     f"(rank {fast})  max {means[slow] * 1e3:.2f} ms (rank {slow})"))
    rates = [a["samples_per_second"] for a in lasts.values() if _is_number(a.get("samples_per_second"))]
    if rates:
        rows.append(("", f"samples/s min {fmt_value(min(rates))}  max {fmt_value(max(rates))}"))
    return rows


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _goodput_lines(run: Run, goodput_of: GoodputOf) -> list[str]:
    """Goodput of the session the run belongs to (its restarts together), when it trained, on rank 0's timeline
    (``goodput_of``: ``analysis.findings.text.goodput_once`` of the run)."""
    try:
        report = goodput_of(run.path.parent if run.path.parent != run.path else run.path, 0)
    except (ValueError, OSError):
        return []
    except Exception as exc:  # noqa: BLE001 - odd records must not take the whole summary down
        return [f"goodput     not computed: {type(exc).__name__}: {exc}"]
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




@dataclass(frozen=True)
class _Listed:
    """One run of ``show --list``: what the listing says of it."""

    path: Path
    created_wall_ns: int | None
    status: str  # finished, interrupted, killed, running, no training, unreadable: ...
    start_ns: int | None
    end_ns: int | None
    iterations: int | None  # the last report of the lowest rank
    samples_per_second: float | None
    records: int


RUNNING_WITHIN_S = 60.0  # a run whose training loop never ended but which wrote this recently is still running


def _listed(path: Path, run: Run, now_ns: int, engine: Any = None) -> _Listed:
    """The listing's figures of a run, from its summary (``analysis.summary``: by SQL with ``engine``)."""
    from .analysis.summary import summarize_run, summarize_sql

    summary = summarize_sql(engine, run) if engine is not None else summarize_run(run)
    # the duration: from the first span to the last (the lifecycle's own timestamps), else of all records
    start, end = summary.span_start_ns, summary.span_end_ns
    if start is None:
        start, end = summary.start_ns, summary.end_ns
    statuses = [status for ended in summary.loop_states.values() for status in ended]
    if not statuses:
        status = "no training"
    elif "" in statuses:  # a loop that never ended: SIGKILL, OOM, a lost node -- or still going
        recent = summary.end_ns or 0
        status = "running" if now_ns - recent < RUNNING_WITHIN_S * 1e9 else "killed"
    elif any(s != "ok" for s in statuses):
        status = "interrupted"
    else:
        status = "finished"
    created = run.meta.get("created_wall_ns")
    last_update = summary.updates_by_rank[min(summary.updates_by_rank)][1] if summary.updates_by_rank else {}
    iterations = last_update.get("num_iterations")
    rate = last_update.get("samples_per_second")
    return _Listed(path, created if isinstance(created, int) else None, status, start, end,
                   int(iterations) if _is_number(iterations) else None,
                   float(rate) if _is_number(rate) else None, summary.records)


def _listing_row(item: _Listed) -> tuple[str, ...]:
    when = iso(item.created_wall_ns) if item.created_wall_ns is not None else "?"
    took = (fmt_duration((item.end_ns - item.start_ns) / 1e9)
            if item.start_ns is not None and item.end_ns is not None else "-")
    if item.iterations is not None:
        figure = f"{item.iterations:,} iterations" + (
            f", {item.samples_per_second:,.4g} samples/s" if item.samples_per_second is not None else "")
    else:
        figure = f"{item.records:,} records"
    return (when, item.status, took, figure, str(item.path))


def _list_runs(target: str | None, out: TextIO) -> int:
    from .store.engine import engine_for

    base = Path(target) if target is not None else default_root()
    if not base.is_dir():
        raise CLIError(f"no such directory: {base}")
    runs = find_runs(base)
    if not runs:
        raise CLIError(f"no telemetrain runs under {base}")
    now = time.time_ns()
    rows: list[tuple[str, ...]] = [("created", "status", "duration", "last report (lowest rank)", "run")]
    engine = engine_for(runs)  # with DuckDB the listing's figures come by SQL, the runs are not read
    try:
        for path in runs:
            try:
                run = open_run(path)
                rows.append(_listing_row(_listed(path, run, now, engine)))
            except (OSError, NotARunError) as exc:
                rows.append(("?", "unreadable", "-", str(exc), str(path)))
    finally:
        if engine is not None:
            engine.close()
    print("\n".join(printable(line) for line in table(rows, indent="")), file=out)
    return 0


def _cmd_show(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.list:
        return _list_runs(args.run_dir, out)
    from .store.engine import engine_for

    path = resolve_run(args.run_dir, err)
    try:
        run = open_run(path)
    except (OSError, NotARunError) as exc:  # FileNotFoundError included: the directory went away meanwhile
        raise CLIError(str(exc)) from None
    engine = engine_for([path])  # DuckDB when installed (the columnar extra): the run is not read into Python
    try:
        lines = summarize(run, engine)
    finally:
        if engine is not None:
            engine.close()
    # names and attributes come from whoever wrote the run: no terminal escapes reach the screen
    print("\n".join(printable(line) for line in lines), file=out)
    return 0
