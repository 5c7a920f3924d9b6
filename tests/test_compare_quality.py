"""compare's quality comparison of runs that differ in length: the text overlay puts both runs on one axis of steps."""

from __future__ import annotations

from pathlib import Path

from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis.compare_quality import compare_quality, quality_lines
from telemetrain.analysis.samples import read_samples


def _loss_run(root: Path, run_id: str, steps: int) -> Path:
    identity = identity_from_env({}, run_id=run_id, session_tag="q", perf_tag="p", rank=0, world_size=1)
    t = Telemetry(identity, store=root)
    for step in range(steps):
        t.log({"loss": 0.5 + 3.0 / (1 + step / 20)}, step=step, group="train")  # the same curve in every run
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
