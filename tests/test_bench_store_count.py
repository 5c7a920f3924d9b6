"""bench_training.py's store check reads every segment of a process: a 1M-iteration run's store passes the writer's
segment size, and counting its last file alone reported most of the run's records as missing."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import telemetrain
from telemetrain.sinks import jsonl

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_count_store_reads_every_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    children = importlib.import_module("_training_children")
    monkeypatch.setattr(jsonl, "SEGMENT_BYTES", 4096)  # the real writer, rolling small segments
    t = telemetrain.Telemetry(store=tmp_path / "store")
    for i in range(2000):
        t.metric("loss", float(i), "train", step=i)
    assert t.close(timeout=60)
    assert t.store is not None and t.store.path is not None
    segments = list(t.store.path.parent.glob("rank-*.jsonl"))
    assert len(segments) > 1, segments
    counts = children._count_store(t.store.path)
    assert counts["metric:loss"] == 2000
    assert counts["process:"] == len(segments)  # each segment's header
    sys.modules.pop("_training_children", None)
