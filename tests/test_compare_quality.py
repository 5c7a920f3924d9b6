"""compare's quality comparison of runs that differ in length: the text overlay puts both runs on one axis of steps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis.compare_quality import BETTER, SAME, WORSE, compare_quality, quality_lines
from telemetrain.analysis.samples import read_samples


def _loss_run(root: Path, run_id: str, steps: int, nan_from: int | None = None) -> Path:
    identity = identity_from_env({}, run_id=run_id, session_tag="q", perf_tag="p", rank=0, world_size=1)
    t = Telemetry(identity, store=root)
    for step in range(steps):
        loss = 0.5 + 3.0 / (1 + step / 20)  # the same curve in every run
        t.log({"loss": math.nan if nan_from is not None and step >= nan_from else loss}, step=step, group="train")
    assert t.close()
    return root / "q" / run_id


def test_a_run_that_stopped_early_is_drawn_over_its_own_steps_not_stretched(tmp_path: Path) -> None:
    # a candidate that crashed at a third of the baseline's 1,500 steps, on the very same curve: stretched over the
    # 40 cells it read as a loss falling far more slowly than the baseline's
    base = read_samples(_loss_run(tmp_path, "base", 1500))
    crashed = read_samples(_loss_run(tmp_path, "crashed", 500))
    q = compare_quality(crashed, base)
    assert q is not None and q.step is not None and 490 <= q.step < 500
    (_, b_line, c_line) = quality_lines(q)
    b_cells = b_line.split("baseline  ", 1)[1]
    c_cells = c_line.split("candidate ", 1)[1]
    assert len(b_cells) == 40 and 12 <= len(c_cells) <= 15  # a third of the axis
    differing = [i for i, (b, c) in enumerate(zip(b_cells, c_cells, strict=False)) if b != c]
    assert len(differing) <= 2, (b_cells, c_cells)  # the same curve: the same cells (a bucket's edge may differ)
    # runs of equal length fill the same cells
    (_, same_b, same_c) = quality_lines(compare_quality(read_samples(_loss_run(tmp_path, "same", 1500)), base))
    assert same_b.split("baseline  ", 1)[1] == same_c.split("candidate ", 1)[1]
    assert len(same_c.split("candidate ", 1)[1]) == 40


@pytest.mark.parametrize("engine", ["python", "duckdb"])
def test_a_loss_that_diverged_to_nan_is_worse_not_within_the_noise(tmp_path: Path, engine: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if engine == "python":
        monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    else:
        pytest.importorskip("duckdb")
    # the candidate's loss is NaN from step 301 to its end: on the finite steps it equals the baseline, which read
    # "at step 300: 0.6977 vs 0.6977 (+0.0%), inconclusive: within the noise" for a run that blew up
    base = read_samples(_loss_run(tmp_path, "base", 600))
    blown = read_samples(_loss_run(tmp_path, "blown", 600, nan_from=301))
    q = compare_quality(blown, base)
    assert q is not None and q.verdict == WORSE and q.candidate_diverged == 301 and q.baseline_diverged is None
    assert q.sentence().endswith("worse; the candidate's train/loss is NaN/inf from step 301 to its end (diverged)")
    assert q.as_dict()["candidate_diverged"] == 301
    back = compare_quality(base, blown)  # the other way round: the baseline blew up
    assert back is not None and back.verdict == BETTER and back.baseline_diverged == 301
    both = compare_quality(blown, read_samples(_loss_run(tmp_path, "also", 600, nan_from=301)))
    assert both is not None and both.verdict == SAME and both.candidate_diverged == both.baseline_diverged == 301
    # a NaN in the middle, then finite values again (a skipped step), is no divergence
    t = Telemetry(identity_from_env({}, run_id="blip", session_tag="q", perf_tag="p", rank=0, world_size=1),
                  store=tmp_path)
    for step in range(600):
        t.log({"loss": math.nan if step == 200 else 0.5 + 3.0 / (1 + step / 20)}, step=step, group="train")
    assert t.close()
    blip = compare_quality(read_samples(tmp_path / "q" / "blip"), base)
    assert blip is not None and blip.verdict == SAME and blip.candidate_diverged is None
