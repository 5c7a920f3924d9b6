"""The report's "GPU health by window" block (``gpu_health``), laid out in the System samples section."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .gpu_health import RISE, GpuHealth, GpuWindow
from .html_tables import table
from .svg import fmt_unit

__all__ = ["gpu_section"]

MAX_ROWS = 40


def _mhz(hz: float | None) -> str:
    return f"{hz / 1e6:.0f} MHz" if hz else "-"


def _row(w: GpuWindow) -> list[Any]:
    return [w.rank, w.iteration, fmt_unit(w.avg, "s") if w.avg is not None else "-",
            f"{w.rise:+.0%}" if w.rise is not None else "-",
            fmt_unit(w.device_avg, "s") if w.device_avg is not None else "-",
            ", ".join(w.throttles) or "-", _mhz(w.sm_clock_min),
            f"{w.power_mean:.0f} W" if w.power_mean is not None else "-",
            f"{w.memory_max:.0%}" if w.memory_max is not None else "-",
            w.alloc_retries if w.alloc_retries is not None else "-",
            f"{w.energy_per_sample:.4g} J" if w.energy_per_sample is not None else "-"]


def gpu_section(health: GpuHealth | None) -> str:
    """Per rank a summary, then the windows worth a look (slowed while throttled first, then throttled or under
    memory pressure), at most ``MAX_ROWS``."""
    if health is None or not (health.sampled or health.energy_J is not None):
        return ('<h3>GPU health by window</h3><p class="note">No GPU samples joined to training windows (no NVIDIA '
                "GPU, nvidia-ml-py missing, or the system sampler off).</p>")
    by_rank: dict[int, list[GpuWindow]] = defaultdict(list)
    for w in health.windows:
        by_rank[w.rank].append(w)
    summary = []
    for rank, ws in sorted(by_rank.items()):
        clocks = [w.sm_clock_mean for w in ws if w.sm_clock_mean]
        powers = [w.power_mean for w in ws if w.power_mean is not None]
        summary.append((rank, len(ws), sum(1 for w in ws if w.samples), sum(1 for w in ws if w.throttles),
                        sum(1 for w in ws if w.flagged),
                        f"{min(clocks) / 1e6:.0f}-{max(clocks) / 1e6:.0f} MHz" if clocks else "-",
                        f"{sum(powers) / len(powers):.0f} W" if powers else "-"))
    body = "<h3>GPU health by window</h3>" + table(
        ("rank", "windows", "with GPU samples", "throttled", "slowed while throttled", "SM clock (window means)",
         "mean power"), summary, numeric=(1, 2, 3, 4))
    notable = sorted((w for w in health.windows if w.throttles or w.alloc_retries),
                     key=lambda w: (not w.flagged, w.iteration, w.rank))
    if notable:
        body += table(("rank", "iteration", "iteration time", "vs median", "device time", "throttle",
                       "SM clock min", "power", "GPU memory", "alloc retries", "energy / sample"),
                      [_row(w) for w in notable[:MAX_ROWS]], numeric=(1, 2, 3, 4, 6, 7, 8, 9, 10))
        if len(notable) > MAX_ROWS:
            body += f'<p class="note">{len(notable) - MAX_ROWS} more window(s) not shown.</p>'
    body += ('<p class="note">Each window is joined with the GPU samples of its own rank (the system sampler\'s '
             "hw.gpu.* and torch.cuda.* records in the same process file) that fall in it, a sample standing for half "
             f"its sampling interval on either side. A window is flagged when its iteration time is {RISE:.0%} or more "
             "above the rank's median window while a throttle reason (power cap or brake, thermal, hardware "
             "slowdown) was active.</p>")
    return body
