"""``telemetrain show``'s system lines: what the system sampler recorded (``telemetrain.system``) per host and
process, GPU and allocator, and the run's GPU energy."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from .cli_common import few, is_number, table

__all__ = ["system_lines"]


def _iec(n: float) -> str:
    """Bytes for people: 1.5 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def system_lines(summary: Any, *, every_process: bool = False) -> list[str]:
    """What the system sampler recorded (``telemetrain.system``): host, processes, GPUs, allocator, run energy."""
    series = summary.system
    starts = summary.sampler_starts
    if not series and not starts:
        return []
    intervals = sorted({float(a["interval_s"]) for a in (r.attributes or {} for r in starts)
                        if is_number(a.get("interval_s"))})
    cpus = {f"rank {r.identity.rank} pid {r.identity.pid}": (r.attributes or {}).get("process.cpu_count")
            for r in starts}
    samplers = {(r.identity.host, r.identity.pid) for r in starts}
    lines = [f"system      sampled by {len(samplers) or '?'} process(es) every "
             f"{', '.join(f'{i:g}' for i in intervals) or '?'} s (telemetrain.system)"]
    shown, hidden = _shown_whos(series, every_process)
    rows: list[tuple[str, ...]] = []
    # GPU 2 before GPU 10: groups compared by their numbers too
    keys = sorted((k for k in series if k[0] in shown), key=lambda k: (_natural(k[0]), _natural(k[1])))
    keys, devices_hidden = _shown_devices(keys, series, every_process)
    for who, group in keys:
        rows += _system_rows(who, group, series[(who, group)], cpus.get(who), summary.counter_totals)
    lines += table(rows)
    if hidden:
        lines.append(f"  ... and {' and '.join(hidden)} more, sampled alike; `telemetrain show --all` lists every one")
    lines += [f"  ... and {n} more {what} (the least and the most used are shown); `telemetrain show --all` lists "
              "every one" for n, what in devices_hidden]
    # the run's energy: per device, its counter's total over the sampler's lifetimes (a restart adds; two ranks that
    # sample a GPU at once count it once: analysis.counter_totals)
    energy = {k: j for k, j in summary.counter_totals.items() if k[2] in ("hw.energy", "hw.energy.integrated")}
    if energy:
        total = sum(energy.values())
        how = Counter("integrated from power" if k[2].endswith("integrated") else "energy counter" for k in energy)
        lines.append(f"  energy      {total:,.1f} J = {total / 3.6e6:.6g} kWh from {len(energy)} GPU(s) while "
                     "sampled (" + ", ".join(f"{n} {s}" for s, n in sorted(how.items())) + ")")
    lines += [f"  gpu         none sampled: {reason}" for reason in summary.gpu_unavailable]
    return lines


def _natural(who: str) -> tuple[tuple[int, int | str], ...]:
    """``rank 2 pid 7`` before ``rank 10 pid 3``: the numbers in a name compared as numbers."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", who))


def _shown_devices(keys: list[tuple[str, str]], series: dict[tuple[str, str], dict[str, Any]],
                   every: bool) -> tuple[list[tuple[str, str]], list[tuple[int, str]]]:
    """``keys`` less, per host or process and kind of device (GPU, filesystem, allocator), those past the first ones
    (``cli_common.few``: a node of 64 GPUs would print 64 rows), keeping the least and the most used; and what was
    left out: (56, "GPU(s) of host a")."""
    by_kind: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for who, group in keys:
        kind = group.split(".")[1] if group.count(".") >= 2 else ""
        by_kind.setdefault((who, kind), []).append((who, group))
    usage = {"gpu": "hw.gpu.utilization", "filesystem": "system.filesystem.utilization",
             "cuda": "torch.cuda.memory.allocated.peak"}
    out: set[tuple[str, str]] = set()
    hidden: list[tuple[int, str]] = []
    for (who, kind), members in by_kind.items():
        if not kind:
            out.update(members)
            continue

        def used(key: tuple[str, str], name: str = usage.get(kind, "")) -> float | None:
            v = series[key].get(name)
            return float(v.mean) if v else None

        shown, more = few(members, every=every, extremes=used)
        out.update(shown)
        if more:
            hidden.append((more, f"{_KINDS.get(kind, kind)}(s) of {who}"))
    return [k for k in keys if k in out], hidden


_KINDS = {"gpu": "GPU", "filesystem": "filesystem", "cuda": "CUDA allocator"}


def _shown_whos(series: dict[tuple[str, str], dict[str, Any]], every: bool) -> tuple[set[str], list[str]]:
    """The hosts and processes whose rows are shown (``cli_common.few``: the first ones, the host with the busiest
    CPU and the process with the largest resident set), and what the others are ("3 host(s)", "120 process(es)")."""
    def peak(who: str, group: str, name: str, stat: str) -> float:
        v = series.get((who, group), {}).get(name)
        return float(getattr(v, stat)) if v else float("-inf")

    whos = sorted({who for who, _ in series}, key=_natural)
    hosts = [w for w in whos if w.startswith("host ")]
    processes = [w for w in whos if not w.startswith("host ")]
    busiest = max(hosts, key=lambda w: peak(w, "system", "system.cpu.utilization", "mean"), default=None)
    largest = max(processes, key=lambda w: peak(w, "system", "process.memory.usage", "max"), default=None)
    shown_hosts, more_hosts = few(hosts, keep=lambda w: w == busiest, every=every)
    shown_processes, more_processes = few(processes, keep=lambda w: w == largest, every=every)
    hidden = ([f"{more_hosts} host(s)"] if more_hosts else []) + (
        [f"{more_processes} process(es)"] if more_processes else [])
    return set(shown_hosts) | set(shown_processes), hidden


def _system_rows(who: str, group: str, m: dict[str, Any], n_cpu: Any,
                 counters: dict[tuple[str, str, str], float]) -> list[tuple[str, ...]]:
    """The show rows of one (host or process, group) of system metrics (``m``: name -> ``summary.SystemSeries``;
    ``counters``: ``summary.counter_totals``)."""

    def mean(v: Any) -> float:
        return float(v.mean)

    def top(v: Any) -> float:
        return float(v.max)

    def last(name: str) -> float:
        v = m.get(name)
        return float(v.last) if v else 0.0

    def total(name: str) -> float:  # a counter: over the sampler's lifetimes, not the last one's
        return counters.get((who, group, name), 0.0)

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
        if m.get("container.memory.usage"):
            rows.append((who, "container", _container(m, total("container.memory.oom_kills"))))
        if m.get("system.disk.io.read") or m.get("system.network.io.receive"):
            rows.append((who, "i/o", f"disk read {_iec(total('system.disk.io.read'))} write "
                         f"{_iec(total('system.disk.io.write'))}; network receive "
                         f"{_iec(total('system.network.io.receive'))} transmit "
                         f"{_iec(total('system.network.io.transmit'))} (host-wide, while sampled)"))
        if m.get("process.memory.usage"):
            text = f"rss max {_iec(top(m['process.memory.usage']))}"
            if m.get("process.tree.memory.usage"):
                children = top(m["process.children.count"]) if m.get("process.children.count") else 0
                text += (f", with descendants max {_iec(top(m['process.tree.memory.usage']))} "
                         f"({children:.0f} descendant process(es) at most)")
            for label, name in (("cpu", "process.cpu.utilization"),
                                ("with descendants", "process.tree.cpu.utilization")):
                if m.get(name):
                    cores = f" = {mean(m[name]) * n_cpu:.2f} cores" if is_number(n_cpu) else ""
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


def _container(m: dict[str, Any], oom_kills: float) -> str:
    """The container's memory against its cgroup limit (``container.memory.*``): the peak and its share of the
    limit, the OOM kills and the memory pressure seen."""
    usage, limit = m["container.memory.usage"], m.get("container.memory.limit")
    text = f"memory mean {_iec(float(usage.mean))}  max {_iec(float(usage.max))}"
    if limit:
        text += f" of its cgroup limit {_iec(float(limit.last))} ({float(usage.max) / float(limit.last):.1%} at peak)"
    else:
        text += " (no cgroup limit)"
    ws = m.get("container.memory.working_set")
    if ws:  # (usage less the inactive file cache: what the kernel cannot reclaim before it kills)
        text += f"; working set max {_iec(float(ws.max))}" + (
            f" ({float(ws.max) / float(limit.last):.1%} of the limit)" if limit else "")
    if m.get("container.memory.oom_kills"):  # (its total over the sampler's lifetimes: counter_totals)
        text += f"; {oom_kills:.0f} OOM kill(s) in the cgroup while sampled"
    some = m.get("container.memory.pressure.some")
    if some:
        text += f"; memory pressure (some, 10 s) max {float(some.max):.0%}"
    return text
