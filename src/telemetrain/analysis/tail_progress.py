"""What ``tail`` shows of the model and of the way to the end: a sparkline of the loss, and an ETA.

The loss is a curve of ``report.curves`` (the same bounded buckets as the report's charts, fed by whatever reads the
run), picked by name (``curves.pick_loss``: ``--loss NAME``, else ``loss``/``train/loss``/..., else a name ending in
``loss``). The ETA is the iterations left to ``train_iterations_target`` (the training config's, from its
``update_training_telemetry_config`` event or a report) at the pace of the recent reports: none without a target.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..report.curve_scale import log_allowed, y_scale
from ..report.curves import Curve
from ..store.reader import ProcessLog
from ..store.segments import parse_segment_name

__all__ = ["BLOCKS", "Pace", "files_in_start_order", "format_eta", "loss_line", "sparkline", "target_of"]

BLOCKS = "▁▂▃▄▅▆▇█"
PACE_REPORTS = 10  # the pace is measured over this many recent reports of the most advanced rank


def sparkline(values: Sequence[float], width: int = 40, *, log: bool = False) -> str:
    """``values`` in ``width`` characters (each the mean of its share of the values), lowest ▁ to highest █; ``!``
    where a share holds only NaN/inf; log-scaled with ``log``."""
    if not values or width < 1:
        return ""
    n = len(values)
    cells: list[float] = []
    for i in range(min(width, n)):
        a, b = i * n // min(width, n), (i + 1) * n // min(width, n)
        share = [v for v in values[a:b] if math.isfinite(v) and (v > 0 or not log)]
        cells.append(sum(share) / len(share) if share else math.nan)
    scaled = [math.log10(v) if log and v == v else v for v in cells]
    finite = [v for v in scaled if v == v]
    if not finite:
        return "!" * len(cells)
    lo, hi = min(finite), max(finite)
    top = len(BLOCKS) - 1
    return "".join("!" if v != v else BLOCKS[0 if hi == lo else round((v - lo) / (hi - lo) * top)] for v in scaled)


def loss_line(curve: Curve, width: int = 40) -> tuple[str, float | None, int]:
    """(sparkline, the latest finite value, the latest step) of the curve's first line (its one line, rank 0's, or
    the ranks' median)."""
    line = curve.lines[0]
    means = [p.mean for p in line.points]
    scale = y_scale([line], allow_log=log_allowed(curve.name))
    spark = sparkline(means, width, log=bool(scale and scale.log))
    last = next((p for p in reversed(line.points) if p.n), None)
    latest = None if last is None else last.mean
    step = int(line.points[-1].x) if line.points and curve.by_step else -1
    return spark, latest, step


def target_of(attributes: Mapping[str, Any]) -> int | None:
    """``train_iterations_target`` of a config or report event's attributes, when it is a positive int."""
    value = attributes.get("train_iterations_target")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class Pace:
    """Iterations per second of the most advanced rank's recent reports (their ``window_iterations`` over their
    ``window_seconds``: the wall time of the window, evaluation and checkpoints included; else the reports' own
    times), and the ETA to a target."""

    def __init__(self) -> None:
        # rank -> (wall_ns, iteration, window iterations, window seconds) of its recent reports
        self._recent: dict[int, deque[tuple[int, int, int | None, float | None]]] = {}

    def report(self, rank: int, wall_ns: int, iteration: int, window_iterations: int | None = None,
               window_seconds: float | None = None) -> None:
        recent = self._recent.setdefault(rank, deque(maxlen=PACE_REPORTS))
        if recent and iteration < recent[-1][1]:  # a restart went back to a checkpoint: the pace starts over
            recent.clear()
        recent.append((wall_ns, iteration, window_iterations, window_seconds))

    def per_second(self) -> float | None:
        best = max(self._recent.values(), key=lambda d: d[-1][1] if d else -1, default=None)
        if not best:
            return None
        windows = [(n, s) for _, _, n, s in best if n and s and s > 0 and math.isfinite(s)]
        if windows:  # the windows that know their own time
            return sum(n for n, _ in windows) / sum(s for _, s in windows)
        if len(best) < 2:
            return None
        (t0, i0, _, _), (t1, i1, _, _) = best[0], best[-1]
        return (i1 - i0) / ((t1 - t0) / 1e9) if t1 > t0 and i1 > i0 else None

    def eta_seconds(self, target: int | None, iteration: int | None) -> float | None:
        """Seconds to ``target`` iterations from ``iteration`` (zero-based, the last one done); None when the target
        or the pace is unknown."""
        rate = self.per_second()
        if target is None or iteration is None or rate is None:
            return None
        return max(0, target - (iteration + 1)) / rate


def format_eta(seconds: float | None, target: int | None, iteration: int | None, finished: bool) -> str:
    if target is None:
        return "- (no train_iterations_target in the training config)"
    done = f"{(iteration or 0) + 1 if iteration is not None else 0:,}/{target:,}"
    if finished or (iteration is not None and iteration + 1 >= target):
        return f"done ({done})"
    if seconds is None:
        return f"- ({done}; no pace yet)"
    hours, rest = divmod(int(seconds), 3600)
    text = f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
    return f"{text} ({done})"


def files_in_start_order(files: list[Path], starts: dict[Path, int]) -> list[Path]:
    """Process files by rank, then each rank's processes by their start (``store.reader.in_start_order``), pid and
    segment: a restart's records after those of the process it restarted, whatever its pid (pid namespaces,
    containers), so the loss curve sees its rollback as written. ``starts``: each file's first header's wall time,
    kept between polls (0 until it has one)."""
    first: dict[tuple[int, int], int] = {}
    for f in files:
        name = parse_segment_name(f.name)
        if name is not None:
            if not starts.get(f):
                starts[f] = ProcessLog([f]).start_wall_ns
            first[(name.rank, name.pid)] = min(first.get((name.rank, name.pid), starts[f]), starts[f])

    def order(path: Path) -> tuple[int, int, int, int, str]:
        n = parse_segment_name(path.name)
        return (-1, -1, -1, -1, path.name) if n is None else (n.rank, first[(n.rank, n.pid)], n.pid, n.segment,
                                                              path.name)

    return sorted(files, key=order)
