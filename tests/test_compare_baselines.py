"""``telemetrain compare`` against several baselines (``--baseline`` repeated, ``--baselines N`` by perf tag), and the
HTML page's ratio axis (a +134% or -60% change is drawn where it is, not clipped to an edge).

The runs are written through the real pipeline (``Telemetry`` + ``TrainingRecorder`` with explicit times, one rank,
and a logged loss), 120 iterations each: 11 steady-state report windows, enough for the bootstrap.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from telemetrain import Telemetry, cli, identity_from_env
from telemetrain.analysis import compare_runs
from telemetrain.analysis.compare import IMPROVEMENT, REGRESSION, MetricComparison
from telemetrain.analysis.compare_html import RatioAxis, comparison_html, multi_html
from telemetrain.analysis.compare_multi import compare_baselines
from telemetrain.analysis.compare_text import format_quantity, row_change
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

BASE_MS = 1_700_000_000_000
FAST = ("--resamples", "200", "--history", "0", "--no-goodput")


def write_run(root: Path, run_id: str, *, ms: float, marked: bool = False, perf_tag: str = "tiny",
              iterations: int = 120) -> Path:
    """A finished one-rank run whose iterations take ``ms`` (3% noise) and whose loss falls with the step."""
    identity = identity_from_env({}, run_id=run_id, session_tag=run_id, perf_tag=perf_tag, rank=0, world_size=1)
    t = Telemetry(identity, store=root)
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=10,
                                                 perf_tag_or_fn=perf_tag, is_baseline_run_or_fn=marked), telemetry=t)
    rng = random.Random(run_id)
    now = float(BASE_MS)
    r.on_app_start(now)
    r.on_train_start(0, start_time_msec=now)
    for step in range(iterations):
        r.on_training_single_iteration_start(now)
        now += ms * rng.lognormvariate(0, 0.03)
        r.on_training_single_iteration_end(now)
        t.log({"loss": 0.5 + 3.0 / (1 + step / 20) * (1 + 0.01 * rng.gauss(0, 1))}, step=step, group="train")
    r.on_train_end(now)
    r.on_app_end(now + 1)
    assert t.close()
    return root / run_id / run_id


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Written in this order (oldest first): b1 the marked baseline, b2 like it, b3 slower, c the candidate (+20%
    against b1 and b2, faster than b3)."""
    root = tmp_path_factory.mktemp("multi")
    return {"root": root, "b1": write_run(root, "b1", ms=100.0, marked=True), "b2": write_run(root, "b2", ms=100.0),
            "b3": write_run(root, "b3", ms=135.0), "c": write_run(root, "c", ms=120.0)}


def run_cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


class Page(HTMLParser):
    """The parts of a compare page the tests read: sections, tables, each CI bar's shapes, the axes' tick labels,
    the overlay charts' runs."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.sections = self.tables = 0
        self.bars: list[list[tuple[str, dict[str, str]]]] = []  # per svg.ci: its (tag, attrs)
        self.axes: list[list[str]] = []  # per svg.axis: its tick labels
        self.overlay_runs: list[str] = []
        self._in: str | None = None
        self._text = False
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "section" and a.get("class") == "baseline":
            self.sections += 1
        elif tag == "table":
            self.tables += 1
        elif tag == "svg" and a.get("class") in ("ci", "axis"):
            self._in = a["class"]
            (self.bars if self._in == "ci" else self.axes).append([])
            if self._in == "ci":
                self.bars[-1].append(("svg", a))
        elif tag == "g" and a.get("class") == "run":
            self.overlay_runs.append(a.get("data-run", ""))
        elif self._in == "ci":
            self.bars[-1].append((tag, a))
        elif self._in == "axis" and tag == "text":
            self._text = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._in = None
        elif tag == "text":
            self._text = False

    def handle_data(self, data: str) -> None:
        if self._text:
            self.axes[-1].append(data)


def _percent(label: str) -> float:
    return 0.0 if label == "0" else float(label.rstrip("%"))


# -- several baselines: the command -----------------------------------------------------------------------------------


def test_repeated_baselines_give_a_block_each_and_a_tally(runs: dict[str, Path],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli("compare", str(runs["c"]), "--baseline", str(runs["b1"]), "--baseline", str(runs["b2"]),
                             "--baseline", str(runs["b3"]), "--fail-on-regression", *FAST, capsys=capsys)
    assert code == 0, err  # regressed against b1 and b2, not against b3: not every baseline
    assert "== against baseline 1 of 3: b1 ==" in out and "== against baseline 3 of 3: b3 ==" in out
    blocks = out.split("== against baseline ")[1:]
    assert "iteration time" in blocks[0] and "REGRESSION" in blocks[0] and "IMPROVEMENT" in blocks[2]
    summary = out.split("summary over 3 baselines (b1, b2, b3)")[1]
    line = next(x for x in summary.splitlines() if x.strip().startswith("iteration time"))
    assert re.search(r"regressed against 2 of 3 baselines, improved against 1 \(\+\d", line), line
    assert "REGRESSION against every baseline" not in line
    assert "result: 0 regression(s) against every one of 3 baselines" in out
    # the quality line's times count from the run's start, never negative (a clock unlike run.json's)
    assert not re.search(r"-\d[\d.]* s in", out), out

    code, out, err = run_cli("compare", str(runs["c"]), "--baseline", str(runs["b1"]), "--baseline", str(runs["b2"]),
                             "--fail-on-regression", *FAST, capsys=capsys)
    assert code == 1, err  # regressed against every baseline
    line = next(x for x in out.split("summary over")[1].splitlines() if x.strip().startswith("iteration time"))
    assert "regressed against 2 of 2 baselines" in line and "REGRESSION against every baseline" in line


def test_several_baselines_as_json_and_one_keeps_its_shape(runs: dict[str, Path],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli("compare", str(runs["c"]), "--baseline", str(runs["b1"]), "--baseline", str(runs["b3"]),
                           "--json", *FAST, capsys=capsys)
    assert code == 0
    data = json.loads(out)
    assert [b["baseline"]["run_id"] for b in data["baselines"]] == ["b1", "b3"]
    assert all(b["candidates"][0]["candidate"]["run_id"] == "c" for b in data["baselines"])
    it = next(t for t in data["summary"] if t["label"] == "iteration time")
    assert it["verdicts"] == [REGRESSION, IMPROVEMENT] and it["regressed"] == 1 and it["improved"] == 1
    assert it["baselines"] == 2 and not it["regressed_against_all"] and it["changes"][0] > 0.1 > it["changes"][1]
    assert data["regressed_against_all"] == {"c": []}
    code, out, _ = run_cli("compare", str(runs["c"]), "--baseline", str(runs["b1"]), "--json", *FAST, capsys=capsys)
    single = json.loads(out)  # one baseline: the shape users already read
    assert single["baseline"]["run_id"] == "b1" and "baselines" not in single and "summary" not in single


def test_several_baselines_as_html(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "multi.html"
    code, _, err = run_cli("compare", str(runs["c"]), "--baseline", str(runs["b1"]), "--baseline", str(runs["b2"]),
                           "--html", str(page), *FAST, capsys=capsys)
    assert code == 0 and "wrote" in err
    text = page.read_text()
    parsed = Page(text)
    assert parsed.sections == 2 and parsed.tables == 1 + 2  # the tally, then one table per baseline
    assert "against baseline 1 of 2: b1" in text and "against baseline 2 of 2: b2" in text
    assert "summary: 2 regression(s) against every one of 2 baselines" in text  # iteration time, throughput
    # the loss once, with every baseline's curve and the candidate's
    assert sorted(parsed.overlay_runs) == ["baseline b1", "baseline b2", "candidate c"]
    assert "Content-Security-Policy" in text and "<script" not in text


def test_baselines_n_takes_the_marked_run_first(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli("compare", str(runs["c"]), "--perf-tag", "tiny", "--baselines", "2",
                             "--root", str(runs["root"]), *FAST, capsys=capsys)
    assert code == 0, err
    chosen = [line for line in err.splitlines() if line.startswith("baseline: ")]
    assert chosen[0].startswith(f"baseline: {runs['b1']} (marked is_baseline_run")
    assert chosen[1].startswith(f"baseline: {runs['b3']} (newest other run")  # b3 is newer than b2
    assert len(chosen) == 2 and "against baseline 1 of 2: b1" in out and "against baseline 2 of 2: b3" in out
    code, out, err = run_cli("compare", str(runs["c"]), "--baselines", "9", *FAST, capsys=capsys)  # its own tag
    assert code == 0 and "only 3 run(s) with perf_tag 'tiny'" in err
    assert "summary over 3 baselines (b1, b3, b2)" in out


def test_refusals_are_one_line_errors(runs: dict[str, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    c, b1, b2 = str(runs["c"]), str(runs["b1"]), str(runs["b2"])
    cases = [
        (["--baseline", b1, "--baseline", b1], f"the baseline {b1} is given twice"),
        (["--baseline", b1, "--baseline", c], f"the baseline {c} is also a candidate"),
        (["--baseline", b1, "--baselines", "2"], "--baselines N picks the baselines by perf_tag; it does not go "
         "with --baseline"),
        (["--baselines", "0"], "--baselines must be at least 1, got 0"),
    ]
    for extra, message in cases:
        code, _, err = run_cli("compare", c, *extra, *FAST, capsys=capsys)
        assert code == 2 and message in err, (extra, err)
        assert len(err.strip().splitlines()) == 1
    other = write_run(tmp_path, "other", ms=100.0, perf_tag="llama", iterations=40)
    code, _, err = run_cli("compare", c, "--baseline", b2, "--baseline", str(other), *FAST, capsys=capsys)
    assert code == 2 and "perf_tag differs from the baseline other ('llama')" in err and "--force" in err
    code, out, _ = run_cli("compare", c, "--baseline", b2, "--baseline", str(other), "--force", *FAST, capsys=capsys)
    assert code == 0 and "compared anyway (forced)" in out
    with pytest.raises(ValueError, match="is given twice"):
        compare_baselines(runs["c"], [runs["b1"], runs["b1"]], resamples=200)


# -- the HTML axis ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ms", "outer"), [(234.0, 100.0), (40.0, -50.0)])
def test_a_large_change_is_drawn_inside_the_axis_with_its_ticks(runs: dict[str, Path], tmp_path: Path, ms: float,
                                                                outer: float) -> None:
    """+134% and -60%: the interval and the marker lie inside the plot, not on its edge, and the axis's tick labels
    reach the change; the +/-3% band keeps a readable width."""
    changed = write_run(tmp_path, "changed", ms=ms)
    comparison = compare_runs(changed, runs["b1"], goodput=False, resamples=200, history=())
    it = comparison.candidates[0].metric("iteration_time")
    assert it is not None and it.ratio == pytest.approx(ms / 100, rel=0.05)
    page = Page(comparison_html(comparison))
    assert len(page.axes) == 1
    ticks = [_percent(t) for t in page.axes[0]]
    assert "0" in page.axes[0] and (max(ticks) >= outer if outer > 0 else min(ticks) <= outer), page.axes[0]
    bar = page.bars[0]  # iteration time's
    width = float(bar[0][1]["width"])
    marker = next(a for tag, a in bar if tag == "circle")
    interval = next(a for tag, a in bar if tag == "rect" and a["fill"] != "#eee")
    band = next(a for tag, a in bar if tag == "rect" and a["fill"] == "#eee")
    cx, lo, hi = float(marker["cx"]), float(interval["x"]), float(interval["x"]) + float(interval["width"])
    assert 3 < cx < width - 3 and 0 < lo <= cx <= hi < width
    assert (cx > width * 0.75) if outer > 0 else (cx < width * 0.25)  # the change is at its side, near the end
    assert float(band["width"]) >= 15  # small changes stay readable next to a large one


def test_a_small_change_gets_a_narrow_axis(runs: dict[str, Path]) -> None:
    page = Page(comparison_html(compare_runs(runs["b2"], runs["b1"], goodput=False, resamples=200)))
    ticks = [_percent(t) for t in page.axes[0]]
    assert max(ticks) <= 10 and min(ticks) >= -10 and len(ticks) >= 3  # labelled in a few percent
    html_page = multi_html(compare_baselines(runs["c"], [runs["b1"], runs["b2"]], goodput=False, resamples=200))
    assert all(len(axis) >= 3 for axis in Page(html_page).axes)


def test_the_library_reads_each_run_as_compare_runs_does(runs: dict[str, Path]) -> None:
    """``compare_baselines`` given run folders reads them as ``compare_runs`` does (the quality curves only, goodput
    by the same engine): the comparison with each baseline is the one ``compare_runs`` makes."""
    multi = compare_baselines(runs["c"], [runs["b1"], runs["b2"]], resamples=200)
    for baseline, got in zip((runs["b1"], runs["b2"]), multi.comparisons, strict=True):
        alone = compare_runs(runs["c"], baseline, resamples=200)
        assert got.as_dict() == alone.as_dict()


def test_quantities_read_as_people_write_them() -> None:
    assert format_quantity(22970.4, "samples/s") == "22,970 samples/s"  # not 2.297e+04
    assert format_quantity(0.2849, "1") == "28.5%"  # goodput, a fraction
    assert format_quantity(0.0123, "s") == "12.30 ms" and format_quantity(0.2849, "") == "0.2849"
    assert format_quantity(3.5e13, "FLOP/s") == "3.5e+13 FLOP/s" and format_quantity(float("nan"), "s") == "-"
    goodput = MetricComparison(metric="goodput", scope="run", label="goodput", unit="1", higher_is_better=True,
                               baseline_median=0.285, candidate_median=0.81, baseline_windows=1, candidate_windows=1,
                               ratio=0.81 / 0.285, ci_low=math.nan, ci_high=math.nan, verdict="not tested")
    assert row_change(goodput) == "+52.5 pp"  # a fraction's change in points, not +184.2%
    assert row_change(dataclasses.replace(goodput, unit="s")) == "+184.2%"


@pytest.mark.parametrize("ratios", [[0.001, 500.0], [0.5, 2.0], [0.97, 1.04], [1.0, 250.0]])
def test_the_ratio_axis_labels_do_not_overlap(ratios: list[float]) -> None:
    svg = RatioAxis(ratios, 0.03).svg()
    texts = re.findall(r'<text x="([0-9.]+)"[^>]*text-anchor="(\w+)"[^>]*>([^<]+)</text>', svg)
    assert len(texts) >= 3 and "0" in [t for _, _, t in texts] and not any("e+" in t for _, _, t in texts)
    spans = []
    for x, anchor, text in texts:  # 10 px text: at most 6 px a character
        w = 6.0 * len(text)
        left = float(x) - {"start": 0.0, "middle": w / 2, "end": w}[anchor]
        spans.append((left, left + w))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
