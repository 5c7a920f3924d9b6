"""Compare the model's own numbers of two runs: the loss at equal steps, the step (and time) at which the candidate
reaches the baseline's final loss, and the curves to overlay.

Both runs' curves come from ``report.curves`` (``RunSamples.curves``: bounded buckets fed by whatever read the run).
The loss is picked by name (``curves.pick_loss``); each run's line is its one line (equal ranks), rank 0's, or the
ranks' median, smoothed by the same centered rolling median as the report's charts.

- **At equal steps**: at the last step both runs reached, each run's level is the median of its bucket means over
  the last 10% of the common steps (at least 3 buckets), its noise the robust spread (1.4826 x MAD) of those means
  around their least-squares line, times 1.2533 over the square root of their count (a median's standard error).
  The change is significant when
  ``|candidate - baseline| > 2 x sqrt(noise_c^2 + noise_b^2)`` (about 95% for normal noise), else *inconclusive*.
- **Reaches**: the baseline's final level (as above, over its own last 10%) is the target; the candidate reaches it
  at the first bucket whose smoothed value is at or below it (at or above for a higher-is-better metric:
  accuracy). "Does not reach" when no bucket does; the time is that bucket's last wall time, seconds since the
  run's start.
- **Diverged**: a run whose loss is NaN/inf from some step to its end (every value of its last buckets) diverged: the
  verdict is *worse* when only the candidate did (*better* when only the baseline did), whatever the finite steps
  before said, and the sentence names the step. NaN/inf are data: a run that blew up must not read "within the noise".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..report.curve_scale import smooth, smoothing_window
from ..report.curves import Curve, CurveLine, is_eval, pick_loss
from .samples import RunSamples

__all__ = ["QualityComparison", "compare_quality", "quality_lines", "quality_series"]

TAIL = 0.10  # the share of the common steps whose buckets give a run's level at the end
MAX_OVERLAYS = 6
_HIGHER = ("acc", "accuracy", "f1", "precision", "recall", "auc", "bleu", "rouge", "score", "map", "iou")

BETTER, WORSE, SAME = "better", "worse", "inconclusive: within the noise"


def higher_is_better(name: str) -> bool:
    low = name.lower().replace("/", ".").replace("_", ".").replace("-", ".")
    return any(part in _HIGHER for part in low.split("."))


@dataclass(frozen=True)
class QualityComparison:
    """One metric (the loss, else an evaluation metric) of a candidate against the baseline."""

    metric: str  # group/name
    higher_is_better: bool
    step: float | None  # the last step both reached (None: a time axis)
    baseline_value: float
    candidate_value: float
    noise: float  # the two levels' combined standard error
    verdict: str  # better, worse, inconclusive
    target: float  # the baseline's final level
    baseline_final_step: float
    reach_step: float | None  # where the candidate first reaches ``target`` (None: it does not)
    reach_seconds: float | None
    baseline_reach_seconds: float | None  # when the baseline itself first reached its final level
    baseline_reach_step: float | None = None  # where it did: a noisy loss dips to its final level long before its end
    overlays: tuple[tuple[str, Curve, Curve], ...] = ()  # (title, baseline, candidate) to draw over each other
    candidate_diverged: float | None = None  # the step from which its values are all NaN/inf to its end
    baseline_diverged: float | None = None

    @property
    def change(self) -> float:
        return (self.candidate_value - self.baseline_value) / abs(self.baseline_value) if self.baseline_value \
            else math.nan

    def sentence(self, candidate: str = "the candidate") -> str:
        """'reaches the baseline's final train/loss (1.93) at step 180 (baseline: 200), 42 s in (baseline: 51 s);
        at step 200: 1.88 vs 1.93 (-2.6%), better'."""
        x = f"step {self.step:,.0f}" if self.step is not None else "the end"
        level = (f"at {x}: {self.candidate_value:.4g} vs {self.baseline_value:.4g} ({self.change:+.1%}), "
                 f"{self.verdict}")
        if self.reach_step is None:
            reach = f"does not reach the baseline's final {self.metric} ({self.target:.4g})"
        else:
            where = f"step {self.reach_step:,.0f}" if self.step is not None else f"{self.reach_step:.3g} s"
            own = self.baseline_reach_step if self.baseline_reach_step is not None else self.baseline_final_step
            own_where = f"{own:,.0f}" if self.step is not None else f"{own:.3g} s"
            reach = f"reaches the baseline's final {self.metric} ({self.target:.4g}) at {where} (baseline: {own_where})"
            if self.reach_seconds is not None and self.baseline_reach_seconds is not None:
                reach += f", {self.reach_seconds:.3g} s in (baseline: {self.baseline_reach_seconds:.3g} s)"
        diverged = [f"the {role}'s {self.metric} is NaN/inf from {'step ' if self.step is not None else ''}"
                    f"{x:,.0f}{'' if self.step is not None else ' s'} to its end (diverged)"
                    for role, x in (("candidate", self.candidate_diverged), ("baseline", self.baseline_diverged))
                    if x is not None]
        return f"{candidate} {reach}; {level}" + "".join(f"; {d}" for d in diverged)

    def as_dict(self) -> dict[str, Any]:
        def f(v: float | None) -> float | None:
            return v if v is not None and math.isfinite(v) else None

        return {"metric": self.metric, "higher_is_better": self.higher_is_better, "step": f(self.step),
                "baseline_value": f(self.baseline_value), "candidate_value": f(self.candidate_value),
                "change": f(self.change), "noise": f(self.noise), "verdict": self.verdict, "target": f(self.target),
                "baseline_final_step": f(self.baseline_final_step), "baseline_reach_step": f(self.baseline_reach_step),
                "reach_step": f(self.reach_step), "candidate_diverged": f(self.candidate_diverged),
                "baseline_diverged": f(self.baseline_diverged),
                "reach_seconds": f(self.reach_seconds), "baseline_reach_seconds": f(self.baseline_reach_seconds),
                "overlaid": [title for title, _, _ in self.overlays]}


def _level(line: CurveLine, upto: float, span: float) -> tuple[float, float, int] | None:
    """(median, standard error, buckets) of the line's bucket means over the last ``TAIL`` of [.., upto]."""
    pts = [p for p in line.points if p.n and p.x <= upto + 1e-9]
    if not pts:
        return None
    lo = upto - max(span * TAIL, 0.0)
    chosen = [p for p in pts if p.x >= lo]
    if len(chosen) < 3:
        chosen = pts[-3:]
    tail = [p.mean for p in chosen]
    ordered = sorted(tail)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    resid = _detrended([p.x for p in chosen], tail)
    dev = sorted(abs(r) for r in resid)
    sd = 1.4826 * dev[len(dev) // 2] if dev else 0.0
    return median, 1.2533 * sd / math.sqrt(len(tail)), len(tail)  # the standard error of a median


def _detrended(xs: Sequence[float], ys: Sequence[float]) -> list[float]:
    """``ys`` less their least-squares line (a loss still falling at the end is a trend, not noise)."""
    n = len(ys)
    if n < 3 or len(xs) != n:
        return [y - sum(ys) / n for y in ys]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return [y - (my + slope * (x - mx)) for x, y in zip(xs, ys, strict=True)]


def _diverged(line: CurveLine) -> float | None:
    """The x of the first NaN/inf of the line's trailing buckets that hold nothing else, or of the bucket before them
    when it holds some (the divergence began within it); None when the line ends finite."""
    pts = line.points
    i = len(pts)
    while i and not pts[i - 1].n and pts[i - 1].bad:
        i -= 1
    if i == len(pts):
        return None
    return pts[i - 1].bad_x if i and pts[i - 1].bad else pts[i].bad_x


def _reach(line: CurveLine, target: float, higher: bool) -> tuple[float, float] | None:
    pts = [p for p in line.points if p.n]
    values = smooth([p.mean for p in pts], smoothing_window(len(pts))) if len(pts) >= 5 else [p.mean for p in pts]
    for p, v in zip(pts, values, strict=True):
        if (v >= target) if higher else (v <= target):
            return p.x, p.seconds
    return None


_LOSS_NAMES = ("loss", "train/loss", "train.loss", "train_loss", "training_loss", "train/loss_step")  # pick_loss's


def quality_series(loss: str | None = None) -> Callable[[str], bool]:
    """Whether a series (its name, ``RunSamples.curves``'s) can be read by ``compare_quality(..., loss)``: a name that
    ``pick_loss`` may pick (``loss`` itself, else a name ending in ``loss`` or one of its preferred names) or an
    evaluation metric (the fallback and the overlays). compare feeds only these series' buckets: the others (a
    learning rate, a gradient norm) are never drawn by it, and their buckets were half its reading on a long run."""

    def wanted(name: str) -> bool:
        low = name.lower()
        if loss and (loss == name or loss.endswith(f"/{name}") or loss.endswith(f".{name}")):
            return True
        return (not loss and (low.endswith("loss") or low in _LOSS_NAMES)) or is_eval(name)

    return wanted


def _curve(run: RunSamples, key: tuple[str, str]) -> Curve | None:
    """The run's curve of ``key``, its times counted from the run's start: the earlier of run.json's creation and its
    first metric (a clock that disagrees with run.json's must not make the times negative)."""
    starts = [t for t in (run.created_wall_ns, run.curves.first_wall_ns) if t]
    start = min(starts) if starts else 0
    return run.curves.curve(*key, start, min_points=3)


def _pair(candidate: RunSamples, baseline: RunSamples, loss: str | None) -> tuple[tuple[str, str], Curve, Curve] | None:
    names = sorted(set(candidate.curves.names()) & set(baseline.curves.names()))
    picked = pick_loss(names, loss)
    if picked is None and loss is None:  # (a metric asked for by name is never swapped for another, unannounced)
        picked = next((n for n in names if is_eval(n[1])), None)
    if picked is None:
        return None
    c, b = _curve(candidate, picked), _curve(baseline, picked)
    if c is None or b is None or c.by_step != b.by_step or not c.lines or not b.lines:
        return None
    return picked, c, b


def compare_quality(candidate: RunSamples, baseline: RunSamples, loss: str | None = None) -> QualityComparison | None:
    """The loss (``loss``: its name, else picked by name, else the first evaluation metric both runs have) of
    ``candidate`` against ``baseline``; None when they share no such metric with at least 3 values (with ``loss``
    given, when they do not both have it)."""
    pair = _pair(candidate, baseline, loss)
    if pair is None:
        return None
    (group, name), c, b = pair
    cl, bl = c.lines[0], b.lines[0]
    cx = [p.x for p in cl.points if p.n]
    bx = [p.x for p in bl.points if p.n]
    if not cx or not bx:
        return None
    common_lo, common_hi = max(min(cx), min(bx)), min(max(cx), max(bx))
    span = max(common_hi - common_lo, 0.0)
    c_level, b_level = _level(cl, common_hi, span), _level(bl, common_hi, span)
    b_final = _level(bl, max(bx), max(bx) - min(bx))
    if c_level is None or b_level is None or b_final is None:
        return None
    higher = higher_is_better(name)
    noise = math.hypot(c_level[1], b_level[1])
    diff = c_level[0] - b_level[0]
    if abs(diff) <= 2 * noise or diff == 0:
        verdict = SAME
    else:
        verdict = BETTER if (diff > 0) == higher else WORSE
    c_diverged, b_diverged = _diverged(cl), _diverged(bl)
    if (c_diverged is None) != (b_diverged is None):
        verdict = WORSE if c_diverged is not None else BETTER
    target = b_final[0]
    reach = _reach(cl, target, higher)
    own = _reach(bl, target, higher)
    title = f"{group}/{name}" if group not in ("", "default") else name
    overlays = [(title, b, c)]
    for key in sorted(set(candidate.curves.names()) & set(baseline.curves.names())):
        if key != (group, name) and len(overlays) < MAX_OVERLAYS and is_eval(key[1]):
            oc, ob = _curve(candidate, key), _curve(baseline, key)
            if oc is not None and ob is not None and oc.by_step == ob.by_step:
                overlays.append((oc.title, ob, oc))
    return QualityComparison(
        metric=title, higher_is_better=higher, step=common_hi if c.by_step else None,
        baseline_value=b_level[0], candidate_value=c_level[0], noise=noise, verdict=verdict, target=target,
        baseline_final_step=max(bx), reach_step=reach[0] if reach else None,
        reach_seconds=reach[1] if reach and math.isfinite(reach[1]) else None,
        baseline_reach_seconds=own[1] if own and math.isfinite(own[1]) else None,
        baseline_reach_step=own[0] if own else None, overlays=tuple(overlays), candidate_diverged=c_diverged,
        baseline_diverged=b_diverged)


def quality_lines(q: QualityComparison | None, speed: str = "") -> list[str]:
    """The text form: the sentence, with the speed change first (``speed``: e.g. 'is 12.0% slower'), and a compact
    overlay (each run's smoothed curve as a sparkline, both on one scale of values and one of steps)."""
    if q is None:
        return []
    lines = ["  quality: " + q.sentence("the candidate" + (f" {speed} and" if speed else ""))]
    for title, b, c in q.overlays:
        series = []
        for line in (b.lines[0], c.lines[0]):
            pts = [p for p in line.points if p.n]
            series.append(list(zip([p.x for p in pts],
                                   smooth([p.mean for p in pts], smoothing_window(len(pts))), strict=True)))
        base, cand = _shared_scale(series)
        lines.append(f"  {title}: baseline  {base}")
        lines.append(f"  {' ' * len(title)}  candidate {cand}")
    return lines


def _shared_scale(series: Sequence[Sequence[tuple[float, float]]], width: int = 40) -> list[str]:
    """Each series of (x, value) as a sparkline, all on one scale of values and one of x: a run that stopped at a
    third of the other's steps (a crash) fills a third of the cells, not all of them (stretched, the same curve would
    read as another). A cell holds the mean of the values whose x falls in it; one with none inside the series' own
    range repeats the cell before (sparse points); past its range it is blank."""
    from .tail_progress import BLOCKS

    finite = [v for s in series for _, v in s if math.isfinite(v)]
    xs = [x for s in series for x, _ in s]
    if not finite or not xs:
        return ["" for _ in series]
    lo, hi = min(finite), max(finite)
    x_lo, x_hi = min(xs), max(xs)
    cells_n = max(1, min(width, max(len(s) for s in series)))
    step = (x_hi - x_lo) / cells_n or 1.0
    top = len(BLOCKS) - 1
    out = []

    def cell_of(x: float) -> int:
        return min(int((x - x_lo) / step), cells_n - 1)

    for s in series:
        cells: list[list[float]] = [[] for _ in range(cells_n)]
        for x, v in s:
            cells[cell_of(x)].append(v)
        text, prev = [], " "
        for i, cell in enumerate(cells):
            if not s or not cell_of(s[0][0]) <= i <= cell_of(s[-1][0]):
                text.append(" ")
                continue
            share = [v for v in cell if math.isfinite(v)]
            if share:
                prev = BLOCKS[0 if hi == lo else round((sum(share) / len(share) - lo) / (hi - lo) * top)]
            elif cell:
                prev = "!"  # only NaN/inf here
            text.append(prev)
        out.append("".join(text).rstrip())
    return out
