"""The report page as a reader sees it in headless Chromium: its layout at 1280 px with names from the run that have
no space to break at."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from telemetrain import Telemetry, identity_from_env
from telemetrain.report import write_report
from test_report import _chromium, needs_chromium

LONG = "layer" + "_x" * 150 + ".grad_norm"  # 310 characters, no space


def _long_names_run(root: Path) -> Path:
    t = Telemetry(identity_from_env({}, run_id="long", session_tag="s", rank=0, world_size=1), store=root)
    for step in range(30):
        t.log({LONG: 1.0 + step, "loss": 2.0 / (step + 1)}, step=step, group="train")
    assert t.close(30)
    return root / "s" / "long"


@needs_chromium
def test_a_long_name_wraps_inside_the_page_at_1280_px(tmp_path: Path) -> None:
    """A 310-character metric name (its chart's heading, its row of the metrics table) ran off the right edge of a
    1280 px window: nothing may be drawn in the body's right margin, past the sections' border."""
    image_module = pytest.importorskip("PIL.Image")
    page = write_report(_long_names_run(tmp_path), tmp_path / "r.html")
    assert f'<td class="wrap">{LONG}</td>' in page.read_text()  # (only cells of such names and paths may break)
    shot = tmp_path / "shot.png"
    proc = _chromium(page.as_uri(), f"--screenshot={shot}", "--window-size=1280,5000", "--hide-scrollbars")
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    image = image_module.open(shot).convert("L")
    width, height = image.size
    header = 120  # the page's dark header band spans the whole width
    dark = [(x, y) for y in range(header, height) for x in range(width - 20, width) if image.getpixel((x, y)) < 120]
    assert dark == [], f"text past the right edge at {dark[:3]}"
    assert len(image.getcolors(maxcolors=1_000_000) or []) > 50  # the page rendered (not blank)


def test_a_run_without_config_says_so_instead_of_empty_tables(tmp_path: Path) -> None:
    """No config, hyperparameters or training config: each was a table of one row, no key and the value "{}"."""
    page = write_report(_long_names_run(tmp_path), tmp_path / "r.html").read_text()
    assert "<td>{}</td>" not in page and "<h3>hyperparameters</h3>" not in page
    assert "Not recorded in this run: config, hyperparameters, training config." in page
    assert "<h3>versions</h3>" in page  # what was recorded is still there


def test_a_run_still_being_written_says_so_at_the_top(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A report of a run whose loop is still going: only "crash: ... killed (started, never ended)" before; the page
    now says the run is still running, and no crash. Once the loop ends, it does not."""
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    engines = ("python", "duckdb") if importlib.util.find_spec("duckdb") else ("python",)  # both readers
    t = Telemetry(identity_from_env({}, run_id="live", session_tag="s", rank=0, world_size=1), store=tmp_path)
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=10),
                         telemetry=t)
    try:
        r.on_app_start()
        r.on_model_init_start()
        r.on_model_init_end()
        r.on_train_start(0)
        for _ in range(25):
            r.on_training_single_iteration_start()
            r.on_training_single_iteration_end()
        assert t.flush()
        for engine in engines:
            monkeypatch.setenv("TELEMETRAIN_ENGINE", engine)
            page = write_report(tmp_path / "s" / "live", tmp_path / "live.html").read_text()
            assert 'data-note="live"' in page and "Still running." in page, engine
            assert "crash:" not in page, engine  # an open loop of a live run is no crash
        r.on_train_end()
        r.on_app_end()
    finally:
        assert t.close(30)
    page = write_report(tmp_path / "s" / "live", tmp_path / "done.html").read_text()
    assert 'data-note="live"' not in page


def test_a_line_chart_says_what_it_shows_in_words() -> None:
    """The iteration-time and system charts' text alternative (aria-label) was their title alone."""
    from telemetrain.report.svg import line_chart

    svg = line_chart("iteration time, rank 0", [("p50", [(0.0, 0.1), (10.0, 0.3), (20.0, 0.2)]),
                                                ("mean", [(0.0, 0.12), (20.0, float("nan"))])],
                     markers=[(10.0, 0.3, "slow")], unit="s")
    label = svg.split('aria-label="', 1)[1].split('"', 1)[0]
    assert label == ("iteration time, rank 0: p50 from 100 ms to 200 ms (lowest 100 ms, highest 300 ms); mean from "
                     "120 ms to 120 ms (lowest 120 ms, highest 120 ms); 1 marked in red")
