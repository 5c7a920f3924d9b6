"""The report's headline table: (label, value, how it was computed) rows of wall time, iterations, throughput,
tokens/s, TFLOP/s and MFU, iteration-time percentiles, communication (from the lowest rank's last
``training_metrics_update``), goodput of the session, GPU energy and the GPU health rows. docs/report.md, "Headline".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .gpu_health import gpu_headline

if TYPE_CHECKING:
    from .model import ReportModel
    from .model_pass import _Collector

__all__ = ["headline"]


def _num(attributes: dict[str, Any], key: str) -> float | None:
    value = attributes.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _fmt_s(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if abs(seconds) < 1:
        return f"{seconds * 1e3:.3g} ms"
    if abs(seconds) < 1000:
        return f"{seconds:.3g} s"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _energy_headline(energy: dict[tuple[str, str, str], float]) -> tuple[str, str]:
    if not energy:
        return "n/a", "no GPU energy samples (hw.energy): a CPU-only run, or the system sampler was off"
    per_device: dict[tuple[str, str], tuple[float, str]] = {}
    for (host, group, name), joules in energy.items():
        best = per_device.get((host, group))
        if best is None or (name == "hw.energy" and best[1] != "hw.energy"):  # the counter over the integral
            per_device[(host, group)] = (joules, name)
    total = sum(j for j, _ in per_device.values())
    counters = sum(1 for _, n in per_device.values() if n == "hw.energy")
    return (f"{total / 3.6e6:.3g} kWh ({total:,.0f} J)",
            f"sum over {len(per_device)} GPU(s) of the energy recorded for it, sampler restarts added up "
            f"({counters} from the energy counter, {len(per_device) - counters} integrated from power)")


def _fmt_num(value: float | None, unit: str = "", digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if not math.isfinite(value):
        return str(value)
    return (f"{value:,.0f}" if abs(value) >= 10**digits else f"{value:,.{digits}g}") + unit


def headline(model: ReportModel, c: _Collector) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    ranks = sorted(c.last_update)
    last = c.last_update[ranks[0]] if ranks else {}
    who = f"rank {ranks[0]}'s last training_metrics_update" if ranks else ""
    rows.append(("wall time", _fmt_s(max(0.0, (model.end_ns - model.start_ns) / 1e9)),
                 "first to last record of the run, all processes"))
    if last:
        done = _num(last, "num_iterations")
        step = last.get("current_iteration")
        rows.append(("iterations", f"{done:,.0f} (to step {step})" if done is not None else "n/a",
                     f"num_iterations of {who}"))
        rows.append(("throughput", _fmt_num(_num(last, "cumulative_samples_per_second"), " samples/s"),
                     f"cumulative_samples_per_second of {who}: samples since warm-up / seconds since then, less the "
                     "checkpoint saves and validation"))
        tokens = _num(last, "tokens_per_second")
        if tokens:
            rows.append(("tokens/s (last window)", _fmt_num(tokens), f"tokens_per_second of {who}"))
        tflops = _num(last, "cumulative_train_throughput_per_gpu")
        rows.append(("TFLOP/s per GPU", _fmt_num(tflops),
                     "cumulative_train_throughput_per_gpu (needs flops_per_sample in the config)"))
        peak = _num(last, "peak_tflops_per_gpu")
        mfu = tflops / peak if tflops is not None and peak else _num(last, "mfu")
        rows.append(("MFU", f"{mfu:.1%}" if mfu is not None and math.isfinite(mfu) else "n/a",
                     "cumulative TFLOP/s per GPU / peak_tflops_per_gpu (n/a without a known peak: CPU, unknown GPU)"))
        rows.append(("iteration time p50 / p99",
                     f"{_fmt_s(_num(last, 'cumulative_p50_iteration_time_sec'))} / "
                     f"{_fmt_s(_num(last, 'cumulative_p99_iteration_time_sec'))}",
                     f"cumulative percentiles of {who} (warm-up excluded)"))
        comm = _num(last, "avg_comm_time_sec")
        if comm is not None:
            share = _num(last, "comm_wait_fraction")
            rows.append(("communication", f"{_fmt_s(comm)} per iteration" + (
                f", waiting {share:.1%} of the time" if share is not None else ""),
                f"avg_comm_time_sec and comm_wait_fraction of {who} (distributed.comm)"))
    else:
        rows.append(("throughput", "n/a", "no training_metrics_update events (no TrainingRecorder in this run)"))
    g = model.goodput
    if g is not None:
        rows.append(("goodput", f"{g.goodput:.1%}" + (" (approx.)" if g.approximate else ""),
                     f"productive seconds / wall seconds of session {g.session_tag} ({len(g.runs)} run(s), rank "
                     f"{g.rank}'s timeline; `telemetrain docs goodput`)"))
    else:
        rows.append(("goodput", "n/a", model.goodput_error or "not computed"))
    value, how = _energy_headline(c.energy)
    rows.append(("GPU energy", value, how))
    rows += gpu_headline(model.gpu)
    return rows
