"""The ``telemetrain`` command: ``demo`` writes a run from a small real training job, ``show`` summarises a run.

Standard library only at import: torch is imported by ``demo`` alone, when it runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import shlex
import sys
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO, TypeGuard

from ._version import __version__
from .analysis import commands as analysis_commands
from .analysis.findings.text import run_findings_lines
from .cli_common import CLIError, resolve_run
from .distributed import commands as launch_commands
from .phase_times import DEVICE, iteration_time, phase_times
from .report import commands as report_commands
from .store import commands as store_commands
from .store.columnar import ColumnarVersionError
from .store.layout import default_root
from .store.reader import NotARunError, Run, find_runs, open_run
from .text import printable

__all__ = ["main"]

DEFAULT_DEMO_STEPS = 800  # ~10-20 s on a 2-core CPU
TORCH_PIN = "torch==2.13.0"


# -- formatting helpers ------------------------------------------------------------------------------------------------


def _iso(wall_ns: int) -> str:
    dt = datetime.fromtimestamp(wall_ns / 1e9, tz=timezone.utc)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _fmt_value(value: Any) -> str:
    """Numbers for people: ints as they are, floats to 6 significant digits, nan/inf/-inf spelled so."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.6g}"


def _fmt_config(value: Any) -> str:
    """Config values as written (``1.0`` stays ``1.0``), non-finite floats as nan/inf."""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else _fmt_value(value)
    return str(value)


def _fmt_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3f} s"
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}h{minutes:02d}m{secs:06.3f}s" if hours else f"{minutes}m{secs:06.3f}s"


def _table(rows: Sequence[tuple[Any, ...]], indent: str = "  ") -> list[str]:
    """Left-aligned columns (the last one unpadded)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows]


# -- show --------------------------------------------------------------------------------------------------------------


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
        lines.append("config      " + " ".join(f"{k}={_fmt_config(v)}" for k, v in config.items()))
    workload = run.meta.get("workload")
    if isinstance(workload, dict) and workload:  # what compare checks runs against (training.workload)
        lines.append("workload    " + " ".join(f"{k}={_fmt_value(v)}" for k, v in workload.items())
                     + (f" (fingerprint {run.meta['fingerprint']})" if run.meta.get("fingerprint") else ""))

    summary = summarize_sql(engine, run) if engine is not None else summarize_run(run)
    ranks = run.ranks
    lines.append(f"ranks       {len(ranks)} ({', '.join(map(str, ranks)) or 'none'}), {len(run.processes)} process(es)")
    proc_rows = []
    for p in run.processes:
        extra = "".join(f", {n} {k}" for k, n in (("torn", p.torn), ("corrupt", p.corrupt)) if n)
        proc_rows.append(
            (f"rank {p.rank}", f"pid {p.pid}", f"host {p.identity.host}", f"{p.record_count} records{extra}")
        )
    lines += _table(proc_rows)
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
        lines += _table(agent_rows)

    walls = ([summary.start_ns, summary.end_ns] if summary.start_ns is not None and summary.end_ns is not None
             else [p.header["wall_ns"] for p in run.processes if "wall_ns" in p.header])
    if not walls and isinstance(run.meta.get("created_wall_ns"), int):
        walls = [run.meta["created_wall_ns"]]
    if walls:
        start, end = min(walls), max(walls)
        lines.append(f"time        {_iso(start)} -> {_iso(end)} ({_fmt_duration((end - start) / 1e9)})")
    else:
        lines.append("time        unknown (no records)")

    kinds = ", ".join(f"{k} {n}" for k, n in sorted(summary.by_kind.items()))
    lines.append(f"records     {summary.records}" + (f": {kinds}" if kinds else ""))
    lines += _table([(f"group {g}", k, str(n)) for (g, k), n in sorted(summary.by_group_kind.items())])

    lines += _metric_lines(summary.metrics)
    lines += _stat_lines(summary)
    lines += _system_lines(summary)
    lines += _training_lines(summary)
    if summary.training_events:
        lines += _goodput_lines(run, engine)
    from .distributed.summary import diagnosis_lines  # (standard library only: no torch)

    if engine is None:
        lines += diagnosis_lines(run.records("event", agents=True))
        lines += run_findings_lines(run)  # the findings engine's, as the report shows them
    else:  # the same, from the few rows they read, selected by SQL
        from .analysis.findings import analyse
        from .analysis.findings.run import attempts_of
        from .analysis.findings.text import findings_lines, session_goodput
        from .analysis.show_sql import diagnosis_events_sql, findings_builder_sql

        lines += diagnosis_lines(diagnosis_events_sql(engine, run))
        attempts = attempts_of(session_goodput(run, engine), run.run_id)
        lines += findings_lines(analyse(findings_builder_sql(engine, run).build(attempts=attempts)))

    lines.append(f"events      {sum(summary.event_counts.values())}")
    lines += _table([(g, n, str(c)) for (g, n), c in sorted(summary.event_counts.items())])
    if summary.severities:
        lines.append("  by severity: " + ", ".join(f"{s} {n}" for s, n in sorted(summary.severities.items())))

    lines.append(f"problems    torn lines {run.torn}, corrupt lines {run.corrupt}, diagnostics {summary.diagnostics}")
    diag_rows = []
    for (name, sink), (count, records, message) in sorted(summary.diagnostic_groups.items()):
        message = message.replace("\n", " ")[:160]
        diag_rows.append((name, f"sink {sink or '?'}", f"x{count}", f"count {records}", message))
    lines += _table(diag_rows)
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
    spread = f": {_fmt_value(min(values))}..{_fmt_value(max(values))}" if values else ""
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
        rows.append((group, name, f"= {_fmt_value(r.value)}", f"({', '.join(notes)})"))
    return lines + _table(rows)


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
        values = " ".join(f"{k}={_fmt_value(v)}" for k, v in last.values.items() if k != "count")
        others = f" ({len(st.last_by_rank)} ranks)" if len(st.last_by_rank) > 1 else ""
        rows.append((group, name, _plural(st.count, "window"), _plural(st.samples, "sample"),
                     f"rank {rank}{others}: {values}{unit}"))
    return lines + _table(rows)


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
    lines += _table(rows)
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
    return lines + _table(rows)


def _throughput(a: dict[str, Any]) -> list[str]:
    """samples/s, tokens/s, TFLOP/s per GPU and MFU (as a percentage) of one report."""
    parts = [f"{_fmt_value(a[key])} {label}" for key, label in (
        ("samples_per_second", "samples/s"), ("tokens_per_second", "tokens/s"),
        ("train_throughput_per_gpu", "TFLOP/s per GPU")) if _is_number(a.get(key))]
    if _is_number(a.get("mfu")):
        parts.append(f"MFU {a['mfu']:.1%}")
    return parts


def _spread_rows(lasts: dict[int, dict[str, Any]]) -> list[tuple[str, str]]:
    """Each rank's last window side by side: the fastest and slowest rank by mean iteration time, and the spread of
    throughput (every rank computes the job's samples/s from its own clock)."""
    rows = []
    means = {k: a["avg_iteration_time_sec"] for k, a in lasts.items() if _is_number(a.get("avg_iteration_time_sec"))}
    if means:
        fast, slow = min(means, key=means.__getitem__), max(means, key=means.__getitem__)
        rows.append((f"across {len(lasts)} ranks (last window)", f"mean iteration time min {means[fast] * 1e3:.2f} ms "
                     f"(rank {fast})  max {means[slow] * 1e3:.2f} ms (rank {slow})"))
    rates = [a["samples_per_second"] for a in lasts.values() if _is_number(a.get("samples_per_second"))]
    if rates:
        rows.append(("", f"samples/s min {_fmt_value(min(rates))}  max {_fmt_value(max(rates))}"))
    return rows


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _goodput_lines(run: Run, engine: Any = None) -> list[str]:
    """Goodput of the session the run belongs to (its restarts together), when it trained."""
    from .training.goodput import goodput

    try:
        report = goodput(run.path.parent if run.path.parent != run.path else run.path, opened=(run,), engine=engine)
    except (ValueError, OSError):
        return []
    except Exception as exc:  # noqa: BLE001 - odd records must not take the whole summary down
        return [f"goodput     not computed: {type(exc).__name__}: {exc}"]
    runs = report.runs
    lines = [f"goodput     {report.goodput:.1%} of {_fmt_duration(report.wall_seconds)} productive "
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
    return lines + _table(rows)


def _q(path: Path | str) -> str:
    return shlex.quote(str(path))


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
    when = _iso(item.created_wall_ns) if item.created_wall_ns is not None else "?"
    took = (_fmt_duration((item.end_ns - item.start_ns) / 1e9)
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
    print("\n".join(printable(line) for line in _table(rows, indent="")), file=out)
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


# -- demo --------------------------------------------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if importlib.util.find_spec("torch") is None:
        raise CLIError(f"the demo needs PyTorch, which is not installed: pip install {TORCH_PIN}")
    with warnings.catch_warnings():
        # A CPU torch without numpy warns at import; the demo never uses numpy.
        warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")
        from .demo.backends import Backends
        from .demo.launched import run_launched_demo
        from .demo.train import DemoConfig, run_demo

    root = Path(args.root) if args.root is not None else default_root()
    backends = Backends(prometheus=args.prometheus, otel=args.otel, tensorboard=args.tensorboard, mlflow=args.mlflow,
                        trace=args.trace)
    cfg = DemoConfig(steps=args.steps, seed=args.seed)
    if args.in_process:
        result = run_demo(cfg, root=root, console=args.console, out=out, crash=args.crash, backends=backends)
        run_dir = result.run_dir.absolute()
        print(
            f"done: {result.steps} steps in {result.seconds:.1f} s, val loss {_fmt_value(result.val_loss)}, "
            f"accuracy {result.val_accuracy:.1%}",
            file=out,
        )
        print(f"sample: {result.sample!r}", file=out)
    else:
        launched = run_launched_demo(cfg, root=root, nproc=args.nproc, crash=args.crash, console=args.console,
                                     backends=backends, out=out)
        if launched.run_dir is None:
            raise CLIError(f"the launched demo wrote no run under {launched.session_dir}")
        run_dir = launched.run_dir.absolute()
        if launched.status != 0:
            print(f"the demo job failed (exit status {launched.status}); its run: {run_dir}", file=err)
            return launched.status
        if backends.trace is not None:
            from .trace import export_trace

            written = export_trace(launched.session_dir, backends.trace)
            print(f"trace: {written.path} ({written.events} events): open it in https://ui.perfetto.dev", file=out)
    print(f"run: {run_dir}", file=out)
    from .report import write_report

    report = write_report(run_dir)
    print(f"report: {report}  (open it in a browser; it covers the session's restarts too)", file=out)
    print(f"see it with: telemetrain show {_q(run_dir)}   (the session's goodput covers every attempt)", file=out)
    return 0


# -- trace -------------------------------------------------------------------------------------------------------------


def _cmd_trace(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .trace import export_trace

    try:
        result = export_trace(args.run_dir, args.output, max_per_name=args.max_per_name, all_metrics=args.all_metrics)
    except (OSError, NotARunError) as exc:
        raise CLIError(str(exc)) from None
    dropped = sum(n for kinds in result.dropped.values() for names in kinds.values() for n in names.values())
    note = f", {dropped} left out by --max-per-name" if dropped else ""
    print(f"wrote {printable(str(result.path))} ({result.size_bytes} bytes, {result.events} events, {result.processes} "
          f"process(es){note}); open it in https://ui.perfetto.dev", file=out)
    return 0


# -- entry point -----------------------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="telemetrain", description="Telemetry for PyTorch training jobs: write a demo run, summarise runs."
    )
    parser.add_argument("--version", action="version", version=f"telemetrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Commands that live with what they drive; each sets ``run(args, out, err) -> int`` as its default.
    launch_commands.register(sub)
    report_commands.register(sub)
    analysis_commands.register(sub)
    store_commands.register(sub)

    demo = sub.add_parser(
        "demo",
        help="train a small real model on the CPU and write its run",
        description=(
            "Train a next-character GRU (~47k parameters) on the source code of a few Python standard-library "
            "modules (read from this Python install; nothing is downloaded), recording metrics, events and a "
            f"checkpoint into the run store. Needs {TORCH_PIN}."
        ),
    )
    demo.add_argument(
        "--steps", type=_positive_int, default=DEFAULT_DEMO_STEPS, help="training steps (default: %(default)s)"
    )
    demo.add_argument(
        "--root", help="run store root (default: $TELEMETRAIN_DIR, else ./telemetrain-runs)", metavar="DIR"
    )
    demo.add_argument("--seed", type=int, default=0, help="random seed; same seed, same run (default: %(default)s)")
    demo.add_argument("--nproc", type=_positive_int, default=2,
                      help="gloo ranks on this CPU, under `telemetrain launch` (default: %(default)s)")
    demo.add_argument("--in-process", action="store_true",
                      help="train in this process instead, without the launcher (one rank; the preemption is a "
                      "SIGTERM to a first child process)")
    demo.add_argument("--console", action="store_true", help="also print every record to stderr")
    demo.add_argument("--prometheus", action="store_true",
                      help="serve the metrics for Prometheus on 127.0.0.1:9464 (needs telemetrain[prometheus])")
    demo.add_argument("--otel", action="store_true",
                      help="export spans and metrics by OTLP/HTTP to $OTEL_EXPORTER_OTLP_ENDPOINT (default "
                      "localhost:4318; needs telemetrain[otel])")
    demo.add_argument("--tensorboard", metavar="DIR", help="write TensorBoard event files under DIR "
                      "(needs telemetrain[tensorboard])")
    demo.add_argument("--mlflow", metavar="URI", help="log to the MLflow tracking URI, e.g. file:///tmp/mlruns "
                      "(needs telemetrain[mlflow])")
    demo.add_argument("--trace", metavar="FILE", help="at the end, write the session as a Perfetto/Chrome trace")
    demo.add_argument(
        "--no-crash",
        dest="crash",
        action="store_false",
        help="do not simulate the preemption and restart (by default the last rank of the first attempt gets SIGTERM "
        "at 60%% of the steps, the elastic agent restarts the job, and the second attempt resumes from the last "
        "checkpoint, in the same session)",
    )

    show = sub.add_parser(
        "show",
        help="summarise a run",
        description=(
            "Summarise a run: identity, processes, time span, records per kind and group, the last value of every "
            "metric, every stat's last window, events by name, and problems (torn or corrupt lines, diagnostics). "
            "RUN_DIR may also be a session directory or a store root: the newest run under it is shown, with a "
            "note on stderr. Without RUN_DIR, the newest run under $TELEMETRAIN_DIR (else ./telemetrain-runs)."
        ),
    )
    show.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run directory, or a directory holding runs")
    show.add_argument("--list", action="store_true", help="list the runs under RUN_DIR (oldest first) instead")

    trace = sub.add_parser(
        "trace",
        help="write a run's timeline as a Chrome trace for Perfetto",
        description=(
            "Write the spans, throughput and system counters, and events of a run (or of every run under a session "
            "directory: restarts and ranks side by side) as a Chrome Trace Event Format JSON file, to open in "
            "https://ui.perfetto.dev or chrome://tracing."
        ),
    )
    trace.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, or a directory holding runs")
    trace.add_argument("-o", "--output", default="trace.json", help="output file (default: %(default)s)")
    trace.add_argument("--max-per-name", type=_positive_int, default=5000,
                       help="at most this many spans, counter points and instants per name and process, evenly "
                       "spaced (default: %(default)s)")
    trace.add_argument("--all-metrics", action="store_true",
                       help="every numeric metric as a counter track, not only throughput and the main system samples")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for a usage or input error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["launch"]:  # torchrun's flags go to torchrun's own parser, untouched
        try:
            return launch_commands.run_launch(argv[1:])
        except CLIError as exc:
            print(f"telemetrain: error: {printable(str(exc))}", file=sys.stderr)
            return 2
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors: argparse has printed what it had to
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    out, err = sys.stdout, sys.stderr
    try:
        if args.command == "demo":
            return _cmd_demo(args, out, err)
        if args.command == "show":
            return _cmd_show(args, out, err)
        if args.command == "trace":
            return _cmd_trace(args, out, err)
        run = getattr(args, "run", None)
        if run is not None:
            return int(run(args, out, err))
        parser.print_help(out)
        return 2
    except (CLIError, PermissionError, ColumnarVersionError) as exc:  # paths may hold control characters: escaped
        print(f"telemetrain: error: {printable(str(exc))}", file=err)
        return 2
    except KeyboardInterrupt:
        print("telemetrain: interrupted", file=err)
        return 130
    except BrokenPipeError:
        # `telemetrain show | head`: the reader left; stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
