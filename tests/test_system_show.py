"""``telemetrain show``'s system lines at the scale of a large node: devices in their numeric order, and a host of
many GPUs or filesystems summarised rather than listed row by row (the least and the most used kept)."""

from __future__ import annotations

import re
from pathlib import Path

import telemetrain
from conftest import run_dir_of
from telemetrain.cli import summarize
from telemetrain.store import open_run


def _gpu_rows(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := re.match(r"^  host \S+ +gpu (\d+) ", line))]


def _record_gpus(tmp_path: Path, n: int, idle: int) -> Path:
    t = telemetrain.Telemetry(store=tmp_path)
    t.event("system.sampler.start", {"interval_s": 10.0, "session": 1, "host_metrics": True}, group="system")
    for gpu in range(n):
        for value in ((0.0, 0.1) if gpu == idle else (0.5, 1.0)):
            t.metric("hw.gpu.utilization", value, f"system.gpu.{gpu}", unit="1")
    t.close()
    return run_dir_of(t)


def test_gpus_are_listed_in_numeric_order(tmp_path: Path) -> None:
    lines = summarize(open_run(_record_gpus(tmp_path, 12, idle=-1)))
    assert _gpu_rows(lines) == list(range(12)), "\n".join(lines)  # 2 before 10, not 0, 1, 10, 11, 2


def test_a_node_of_64_gpus_shows_the_first_and_the_outliers(tmp_path: Path) -> None:
    run_dir = _record_gpus(tmp_path, 64, idle=40)
    lines = summarize(open_run(run_dir))
    text = "\n".join(lines)
    assert _gpu_rows(lines) == [*range(8), 40], text  # the first 8 and the idle one
    assert re.search(r"\.\.\. and 55 more GPU\(s\) of host \S+ .*`telemetrain show --all` lists every one", text), text
    assert "energy" not in text  # none recorded: none made up
    assert _gpu_rows(summarize(open_run(run_dir), every_process=True)) == list(range(64))
