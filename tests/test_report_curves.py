"""Charts of the model's own metrics (report/curves.py, curves_svg.py): the bounded builder, the axis rules, and the
report page of real runs written through the pipeline (HTML parsed; the demo's report opened in headless Chromium)."""

from __future__ import annotations

import math
import random
import re
import shutil
import subprocess
import sys
import tracemalloc
from html.parser import HTMLParser
from pathlib import Path

import pytest

from telemetrain import Telemetry, identity_from_env
from telemetrain.report import write_report
from telemetrain.report.curve_scale import smooth, y_scale
from telemetrain.report.curves import CurveBuilder, is_user_group, pick_loss
from telemetrain.report.curves_html import constant_value, curves_section
from telemetrain.report.curves_svg import curve_chart, overlay_chart
from telemetrain.report.model import build_model
from telemetrain.report.svg import axis_labels, axis_ticks, nice_ticks
from telemetrain.store import open_run

HOSTILE = '<script>alert("m")</script>&'


class _Charts(HTMLParser):
    """Every curve chart of a page: its data-metric, and the classes of the elements drawn inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, list[str]] = {}
        self.current: str | None = None
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        if tag == "svg" and "curve-chart" in (a.get("class") or ""):
            self.current = a.get("data-metric") or ""
            self.charts[self.current] = []
        elif self.current is not None and a.get("class"):
            self.charts[self.current].append(str(a["class"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self.current = None


def _charts(page: str) -> _Charts:
    parser = _Charts()
    parser.feed(page)
    return parser


# -- the builder ---------------------------------------------------------------------------------------------------


def test_memory_is_bounded_and_a_spike_survives_the_downsampling() -> None:
    b = CurveBuilder(capacity=64)
    for step in range(200_000):
        b.add(0, "train", "loss", step, 5.0 if step == 123_457 else 1.0 + 1.0 / (step + 1), step * 1000)
    curve = b.curve("train", "loss")
    assert curve is not None and curve.points == 200_000
    (line,) = curve.lines
    assert 32 <= len(line.points) <= 64  # never more than the capacity, however long the run
    assert sum(p.n for p in line.points) == 200_000
    top = max(line.points, key=lambda p: p.hi)
    assert top.hi == 5.0 and top.hi_x == 123_457  # min/max per bucket: the one-step spike is still there
    assert curve.bucket_width >= 200_000 / 64
    # and memory does not grow with the run: another 200k points allocate (almost) nothing that stays
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for step in range(200_000, 400_000):
        b.add(0, "train", "loss", step, 1.0, step * 1000)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert after - before < 64 * 1024


def test_a_one_point_metric_is_not_charted_and_system_groups_are_not_users() -> None:
    b = CurveBuilder()
    b.add(0, "train", "once", 1, 0.5, 1)
    for step in range(10):
        b.add(0, "system", "system.cpu.utilization", step, 0.5, step)
        b.add(0, "training", "train.iterations", step, step, step)
        b.add(0, "system.cuda.0", "torch.cuda.memory.allocated", step, 1.0, step)
        b.add(0, "train", "flag", step, True, step)  # bools are not curves
    assert b.curves() == []
    assert b.names() == [("train", "once")]
    assert b.curve("train", "once") is not None  # asked for by name, one point is enough
    assert not is_user_group("system.filesystem./") and is_user_group("val") and is_user_group("default")


def test_nan_is_a_gap_and_a_marker_not_a_crash() -> None:
    b = CurveBuilder()
    for step in range(30):
        b.add(0, "train", "loss", step, math.nan if step in (10, 11) else 2.0 - step / 30, step)
    b.add(0, "train", "loss", 30, math.inf, 30)
    curve = b.curve("train", "loss")
    assert curve is not None and curve.nonfinite == 3
    gaps = [p for p in curve.lines[0].points if p.bad]
    assert [p.bad_x for p in gaps] == [10.0, 11.0, 30.0] and all(math.isnan(p.mean) for p in gaps)
    svg = curve_chart(curve)
    assert svg.count('class="nonfinite"') == 3
    raw = re.search(r'<path class="raw" d="([^"]+)"', svg)
    assert raw is not None and raw.group(1).count("M") == 2  # the line breaks at the NaNs (no segment over them)


def test_a_metric_that_is_nan_throughout_says_so_instead_of_an_empty_chart() -> None:
    b = CurveBuilder()
    for step in range(30):
        b.add(0, "train", "loss", step, math.nan, step)
        b.add(0, "train", "acc", step, step / 30, step)
    page = curves_section(b.curves())
    figures = re.findall(r'<figure class="curve[^"]*" data-metric="([^"]+)">(.*?)</figure>', page)
    assert [name for name, _ in figures] == ["train/loss", "train/acc"]
    loss = dict(figures)["train/loss"]
    assert "<svg" not in loss and "Nothing to draw: all 30 values are NaN/inf" in loss  # was a heading alone
    assert "<svg" in dict(figures)["train/acc"]


def test_ranks_that_agree_are_one_line_ranks_that_differ_one_each_many_a_median_and_band() -> None:
    same, differ, many = CurveBuilder(), CurveBuilder(), CurveBuilder()
    for rank in range(3):
        for step in range(20):
            same.add(rank, "train", "loss", step, 1.0 / (step + 1), step)
            differ.add(rank, "train", "loss", step, 1.0 / (step + 1) + rank, step)
    for rank in range(20):
        for step in range(20):
            many.add(rank, "train", "loss", step, float(rank + step), step)
    (one,) = same.curves()
    assert not one.ranks_differ and [line.label for line in one.lines] == ["all 3 ranks (equal)"]
    (three,) = differ.curves()
    assert three.ranks_differ and [line.rank for line in three.lines] == [0, 1, 2]
    assert curve_chart(three).count('class="smoothed"') == 3
    (median,) = many.curves()
    (line,) = median.lines
    assert line.label == "median of 20 ranks" and line.band[0] == (0.0, 19.0)
    assert line.points[0].mean == 9.5


def test_drawing_reads_the_builders_buckets_without_changing_them() -> None:
    """``curves()`` reads the builder's own buckets (no copy at a series' own width, each rank's line made as it is
    compared): drawing twice, or drawing and then feeding more, gives what a builder fed everything at once gives;
    a last rank that differs still makes the lines differ."""
    def feed(b: CurveBuilder, steps: range) -> None:
        for rank in range(12):
            for step in steps:  # rank 0 logs 4x the losses: the others are aligned to its wider buckets
                if rank == 0 or step < 1000:
                    b.add(rank, "train", "loss", step, 1.0 / (step + 1) + (0.5 if rank == 0 else 0.0), step)
                b.add(rank, "train", "lr", step, 1e-3, step)
    whole, parts = CurveBuilder(capacity=16), CurveBuilder(capacity=16)
    feed(whole, range(4000))
    feed(parts, range(2000))
    first = parts.curves()
    assert parts.curves() == first
    feed(parts, range(2000, 4000))
    drawn = parts.curves()
    assert drawn == whole.curves() and drawn != first
    loss, lr = drawn
    assert loss.ranks_differ and loss.lines[0].label == "median of 12 ranks" and loss.ranks == 12
    assert not lr.ranks_differ and lr.lines[0].label == "all 12 ranks (equal)"
    last = CurveBuilder()
    for rank in range(3):
        for step in range(20):
            last.add(rank, "train", "loss", step, float(step) + (1.0 if rank == 2 else 0.0), step)
    (three,) = last.curves()
    assert three.ranks_differ and [line.rank for line in three.lines] == [0, 1, 2]
    assert three.lines[0].points == three.lines[1].points != three.lines[2].points


def test_a_metric_without_steps_is_drawn_against_time() -> None:
    b = CurveBuilder()
    start = 1_000_000_000_000
    for i in range(10):
        b.add(0, "train", "samples_per_s", None, 100.0 + i, start + i * 500_000_000)
    (curve,) = b.curves(start)
    assert not curve.by_step and curve.x_label == "seconds since the run's start"
    assert [round(p.x, 3) for p in curve.lines[0].points] == [i * 0.5 for i in range(10)]


def test_axis_log_for_decades_and_a_spike_does_not_flatten_the_curve() -> None:
    decades = CurveBuilder()
    spiky = CurveBuilder()
    for step in range(200):
        decades.add(0, "train", "loss", step, 10.0 * 0.96 ** step, step)  # 10 -> 3e-3
        spiky.add(0, "train", "loss", step, 1e4 if step == 150 else 2.0 - step / 400 + 0.01 * (step % 3), step)
    (c,) = decades.curves()
    scale = y_scale(c.lines)
    assert scale is not None and scale.log and "(log y)" in curve_chart(c)
    (s,) = spiky.curves()
    scale = y_scale(s.lines)
    assert scale is not None and not scale.log
    assert scale.hi < 3 and scale.spikes == ((150.0, 1e4),)  # the range is the curve's; the spike is a marker
    assert curve_chart(s).count('class="spike"') == 1


def test_a_falling_loss_drawn_in_buckets_has_no_spikes_and_a_real_one_still_shows() -> None:
    """A loss falling fast at first, several steps to a drawn point: each early bucket's max (its first step) lies
    far above its mean, which made the start of every clean loss curve a row of red "spikes" over a clipped axis
    (the initial loss of an LM run, ~11, marked "above the axis")."""
    for offset, height in ((0.0, 1.0), (2.0, 8.0)):  # 1 -> 0.001 on a log axis; 10 -> 2 on a linear one
        b = CurveBuilder(capacity=64)
        for step in range(1000):
            b.add(0, "train", "loss", step, offset + height / (step + 1), step)
        (c,) = b.curves()
        assert c.bucket_width > 1
        scale = y_scale(c.lines)
        assert scale is not None and scale.spikes == () and scale.hi >= offset + height, scale
        assert 'class="spike"' not in curve_chart(c)
    # the same curve bucketed, with a one-step jump to 50 at step 600: still a marker above the range
    b = CurveBuilder(capacity=64)
    for step in range(1000):
        b.add(0, "train", "loss", step, 50.0 if step == 600 else 2.0 + 8.0 / (step + 1), step)
    (c,) = b.curves()
    scale = y_scale(c.lines)
    assert scale is not None and scale.spikes == ((600.0, 50.0),) and scale.hi >= 10.0


def test_the_ordinary_maxima_of_a_bucketed_metric_are_not_spikes() -> None:
    # a metric that alternates (two kinds of batch): 4 steps per drawn point, so every bucket's maximum is the high
    # value while the bucket means lie flat. The maxima's usual reach is not a spike; a real one still is.
    rng = random.Random(0)
    b = CurveBuilder()
    for step in range(800):
        value = (0.18 if step % 2 else 0.14) + rng.gauss(0, 0.002)
        b.add(0, "train", "grad_norm", step, 1.5 if step == 601 else value, step)
    (c,) = b.curves()
    assert c.lines[0].points[0].n == 4
    scale = y_scale(c.lines)
    assert scale is not None and scale.spikes == ((601.0, 1.5),)
    assert 0.18 < scale.hi < 0.25 and curve_chart(c).count('class="spike"') == 1


def test_axis_labels_tell_every_tick_apart_in_plain_digits() -> None:
    assert axis_labels(nice_ticks(0.59, 0.607, 4), "1") == ["59.0%", "59.5%", "60.0%", "60.5%"]  # not 60% twice
    assert axis_labels(nice_ticks(2000, 4100, 4), "1/s") == ["2,000", "3,000", "4,000"]  # not 2e+03
    assert axis_labels([0.15, 0.175, 0.2], "") == ["0.150", "0.175", "0.200"]
    assert axis_labels([0.0, 5e5, 1e6, 1.5e6], "") == ["0", "0.5M", "1.0M", "1.5M"]
    assert axis_labels([0.0, 1e-5, 2e-5], "") == ["0", "1e-05", "2e-05"]  # tiny values keep an exponent
    # a log axis (a perplexity from 20,000 down): its decades in plain digits too, not 1e+03, 1e+04
    assert axis_labels([1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7], "", log=True) == [
        "1", "10", "100", "1,000", "10,000", "100,000", "1M", "10M"]
    ppl = CurveBuilder()
    for step in range(40):
        ppl.add(0, "train", "perplexity", step, 20_000.0 * 0.8 ** step, step)
    (c,) = ppl.curves()
    labels = re.findall(r'text-anchor="end"[^>]*>([^<]+)</text>', curve_chart(c))
    assert "(log y)" in curve_chart(c) and "10,000" in labels and not any("e+" in t for t in labels), labels
    assert axis_labels([0.0123, 0.01235, 0.0124], "s") == ["12.3 ms", "12.35 ms", "12.4 ms"]
    assert axis_labels([3 * 2**20, 4 * 2**20], "bytes") == ["3 MiB", "4 MiB"]
    ticks = axis_ticks(0.0, 3.1e8, 4, "By")  # bytes tick at round MiB, not at round decimal byte counts
    assert axis_labels(ticks, "By") == ["0 B", "100 MiB", "200 MiB"] and axis_ticks(0.0, 1.0, 4) == nice_ticks(0, 1, 4)
    b = CurveBuilder()
    for step in range(40):
        b.add(0, "val", "val.accuracy", step, 0.595 + step * 0.0002, step, unit="1")
    (c,) = b.curves()
    labels = re.findall(r'text-anchor="end"[^>]*>([^<]+)</text>', curve_chart(c))
    assert len(labels) >= 3 and len(set(labels)) == len(labels) and all(t.endswith("%") for t in labels)


def test_a_constant_metric_is_a_number_not_a_chart_but_a_flat_loss_is_charted() -> None:
    b = CurveBuilder()
    for rank in range(2):
        for step in range(30):
            b.add(rank, "train", "epoch", step, 0, step)
            b.add(rank, "train", "loss", step, 2.5, step)  # stuck: still the chart a reader looks for first
            b.add(rank, "train", "lr", step, 0.1 if step < 20 else 0.01, step)
            b.add(rank, "train", "odd", step, math.nan if step == 3 else 1.0, step)  # NaN is data: charted
    curves = b.curves()
    assert [constant_value(c) for c in curves] == [0, 2.5, None, None]  # (by group and name)
    page = curves_section(curves)
    charted = re.findall(r'<figure class="curve[^"]*" data-metric="([^"]+)"', page)
    assert charted == ["train/loss", "train/lr", "train/odd"]
    assert "Constant, so not charted: train/epoch = 0." in page


def test_smooth_is_a_centered_median() -> None:
    assert smooth([1, 1, 9, 1, 1], 3) == [1, 1, 1, 1, 1]
    assert smooth([1.0, math.nan, 3.0], 3)[1] != smooth([1.0, math.nan, 3.0], 3)[1]  # NaN stays NaN
    assert smooth(list(range(7)), 3) == list(range(7))  # a trend is not delayed


def test_pick_loss_by_name() -> None:
    names = [("val", "val.loss"), ("train", "train.loss"), ("train", "lr")]
    assert pick_loss(names) == ("train", "train.loss")
    assert pick_loss([("val", "val_loss"), ("default", "my_loss")]) == ("default", "my_loss")
    assert pick_loss(names, "val/val.loss") == ("val", "val.loss")
    assert pick_loss(names, "nope") is None and pick_loss([("train", "lr")]) is None


def test_pick_loss_prefers_the_training_groups_loss_to_an_evaluation_groups_of_the_same_name(tmp_path: Path) -> None:
    """``train``/``loss`` and ``eval``/``loss``: "eval" sorts first, and was taken for the training loss (charted
    first, and the loss ``compare`` and ``tail`` follow)."""
    for evaluation in ("eval", "dev", "test"):
        names = [(evaluation, "loss"), ("train", "loss")]
        assert pick_loss(names) == ("train", "loss") and pick_loss(names, "loss") == ("train", "loss")
        assert pick_loss(names, f"{evaluation}/loss") == (evaluation, "loss")
    assert pick_loss([("eval", "ce_loss"), ("train", "ce_loss")]) == ("train", "ce_loss")
    # on the page: the training loss's chart comes first
    t = Telemetry(identity_from_env({}, run_id="ev", session_tag="s", rank=0, world_size=1), store=tmp_path)
    for step in range(30):
        t.log({"loss": 2.0 / (step + 1)}, step=step, group="train")
        t.log({"loss": 3.0 / (step + 1)}, step=step, group="eval")
    assert t.close(30)
    page = write_report(tmp_path / "s" / "ev", tmp_path / "r.html").read_text()
    assert list(_charts(page).charts)[:2] == ["train/loss", "eval/loss"]


# -- the report of real runs -----------------------------------------------------------------------------------------


def _two_rank_run(root: Path) -> Path:
    for rank in range(2):
        identity = identity_from_env({}, run_id="curves", session_tag="s", rank=rank, world_size=2)
        t = Telemetry(identity, store=root)
        for step in range(40):
            t.log({"loss": 3.0 / (step + 1) + 0.1 * rank, HOSTILE: float(step)}, step=step, group="train")
            if step == 20:
                t.metric("grad_norm", math.nan, "train", step=step)
            else:
                t.metric("grad_norm", 1.0, "train", step=step)
            if step % 10 == 9:
                t.metric("val/accuracy", 0.5 + step / 100, "val", unit="1", step=step)
        t.metric("once", 1.0, "train", step=0)
        t.metric("only.two", 1.0, "train", step=0)
        t.metric("only.two", 2.0, "train", step=1)
        assert t.close()
    return root / "s" / "curves"


def test_report_charts_each_user_metric_per_rank_escaped(tmp_path: Path) -> None:
    run_dir = _two_rank_run(tmp_path)
    model = build_model(open_run(run_dir))
    titles = {c.title for c in model.curves}
    assert titles == {"train/loss", f"train/{HOSTILE}", "train/grad_norm", "val/val/accuracy"}
    page = write_report(run_dir, tmp_path / "r.html").read_text()
    assert HOSTILE not in page and "&lt;script&gt;alert(&quot;m&quot;)&lt;/script&gt;&amp;" in page
    charts = _charts(page)
    assert charts.scripts == 0
    assert set(charts.charts) == titles  # the 1- and 2-point metrics are in the table only
    assert charts.charts["train/loss"].count("smoothed") == 2  # the ranks differ: one line each
    assert charts.charts["train/grad_norm"].count("nonfinite") == 1  # rank 0's and rank 1's NaN, one bucket each
    assert charts.charts[f"train/{HOSTILE}"].count("raw") == 1  # equal on both ranks: one line
    assert charts.charts["val/val/accuracy"].count("point") == 4  # an evaluation metric: its points marked
    assert "2 user metric(s) with fewer than 4 values" in page
    loss = next(c for c in model.curves if c.title == "train/loss")
    assert loss.ranks_differ and [line.label for line in loss.lines] == ["rank 0", "rank 1"]
    assert [f.kind for f in model.findings] == ["nan/inf"]  # the charts add no finding: the NaN's own only


def test_each_chart_says_what_it_shows_in_words(tmp_path: Path) -> None:
    """A chart's text alternative (aria-label, what a screen reader reads) was its name alone."""
    page = write_report(_two_rank_run(tmp_path), tmp_path / "r.html").read_text()
    found = re.findall(r'<svg[^>]*aria-label="([^"]+)" data-metric="([^"]+)"', page)
    labels = {metric: label for label, metric in found}
    # rank 0's loss is 3 / (step + 1), rank 1's 0.1 above it: the first line's ends, the lowest and highest of both
    assert labels["train/loss"] == ("train/loss, 80 values by step: rank 0 from 3 at step 0 to 0.075 at step 39; "
                                    "lowest 0.075, highest 3.1")
    assert labels["train/grad_norm"].endswith("lowest 1, highest 1; 2 NaN/inf")


def test_overlay_draws_each_run(tmp_path: Path) -> None:
    a, b = CurveBuilder(), CurveBuilder()
    for step in range(50):
        a.add(0, "train", "loss", step, 2.0 / (step + 1), step)
        b.add(0, "train", "loss", step, 2.5 / (step + 1), step)
    ca, cb = a.curve("train", "loss"), b.curve("train", "loss")
    assert ca is not None and cb is not None
    svg = overlay_chart("train/loss", [("run <a>", ca), ("run b", cb)])
    assert svg.count('<g class="run"') == 2 and 'data-run="run &lt;a&gt;"' in svg


# -- the demo in headless Chromium ---------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium (Debian's chromium) is not installed; .ci/run "
                    "installs it")
def test_the_demo_report_shows_loss_and_validation_accuracy_curves_in_chromium(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-m", "telemetrain.cli", "demo", "--steps", "60", "--root", str(tmp_path),
                           "--seed", "2", "--no-crash", "--in-process"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.glob("*/*") if p.is_dir() and (p / "run.json").exists()]
    page = write_report(run_dir, tmp_path / "demo.html")
    assert CHROMIUM is not None
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--disable-extensions", "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert [line for line in dom.stderr.splitlines() if ":CONSOLE" in line] == []
    charts = _charts(dom.stdout)  # the DOM as Chromium built it
    assert charts.scripts == 0
    loss, accuracy = charts.charts["train/train.loss"], charts.charts["val/val.accuracy"]
    assert "raw" in loss and "smoothed" in loss  # 60 steps: raw and smoothed
    assert "raw" in accuracy and accuracy.count("point") >= 3  # an evaluation every few steps, each marked
    assert re.search(r'<figure class="curve evaluation" data-metric="val/val.accuracy">', dom.stdout)


# -- compare: the runs' curves overlaid, the quality compared ----------------------------------------------------------


def _loss_run(root: Path, run_id: str, factor: float, noise_seed: int) -> Path:
    import random

    rng = random.Random(noise_seed)
    identity = identity_from_env({}, run_id=run_id, session_tag="q", perf_tag="p", rank=0, world_size=1)
    t = Telemetry(identity, store=root)
    for step in range(300):
        t.log({"loss": factor * (0.5 + 3.0 / (1 + step / 20)) * (1 + 0.01 * rng.gauss(0, 1))}, step=step,
              group="train")
        if step % 50 == 49:
            t.metric("val_accuracy", 0.9 - 0.3 / (1 + step / 50) / factor, "val", unit="1", step=step)
    assert t.close()
    return root / "q" / run_id


def test_compare_reach_is_against_the_baselines_own_reach_step(tmp_path: Path) -> None:
    """A flat, noisy loss dips to its final level early: the baseline's step in "(baseline: N)" is where the baseline
    itself first got there, not its last step (two identical runs must read the same step twice)."""
    from telemetrain.analysis.compare_quality import compare_quality
    from telemetrain.analysis.samples import read_samples

    def flat(run_id: str) -> Path:
        rng = random.Random(7)  # the same noise in both runs
        identity = identity_from_env({}, run_id=run_id, session_tag="q", perf_tag="p", rank=0, world_size=1)
        t = Telemetry(identity, store=tmp_path)
        for step in range(300):
            t.log({"loss": 1.0 + 0.2 * rng.gauss(0, 1)}, step=step, group="train")
        assert t.close()
        return tmp_path / "q" / run_id

    q = compare_quality(read_samples(flat("cand")), read_samples(flat("base")))
    assert q is not None and q.reach_step is not None
    assert q.reach_step < q.baseline_final_step  # the case: reached well before the end
    assert f"at step {q.reach_step:,.0f} (baseline: {q.reach_step:,.0f})" in q.sentence()
    assert q.as_dict()["baseline_reach_step"] == q.reach_step


def test_compare_overlays_the_runs_and_compares_the_loss(tmp_path: Path) -> None:
    from telemetrain.analysis import compare_runs
    from telemetrain.analysis.compare_html import comparison_html
    from telemetrain.analysis.compare_quality import BETTER, SAME, compare_quality
    from telemetrain.analysis.compare_text import format_comparison
    from telemetrain.analysis.samples import read_samples

    base = read_samples(_loss_run(tmp_path, "base", 1.0, 1))
    better = read_samples(_loss_run(tmp_path, "better", 0.9, 2))
    same = read_samples(_loss_run(tmp_path, "same", 1.0, 3))
    q = compare_quality(better, base)
    assert q is not None and q.metric == "train/loss" and q.verdict == BETTER
    assert q.change == pytest.approx(-0.1, abs=0.02)
    assert q.reach_step is not None and q.reach_step < 250  # the lower curve reaches the baseline's end early
    assert [t for t, _, _ in q.overlays] == ["train/loss", "val/val_accuracy"]
    assert compare_quality(same, base) is not None and compare_quality(same, base).verdict == SAME  # type: ignore[union-attr]
    comparison = compare_runs([better], base, goodput=False, resamples=200)
    text = "\n".join(format_comparison(comparison))
    assert "quality: the candidate reaches the baseline's final train/loss" in text and "better" in text
    assert "train/loss: baseline " in text and "candidate " in text  # the compact overlay
    page = comparison_html(comparison)
    charts = _charts(page)
    assert charts.scripts == 0 and set(charts.charts) == {"train/loss", "val/val_accuracy"}
    assert page.count('<g class="run"') == 4  # both runs on each of the two charts
    assert comparison.as_dict()["candidates"][0]["quality"]["verdict"] == BETTER
