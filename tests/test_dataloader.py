"""DataLoader workers (forked by torch's own DataLoader) record through the default instance: each worker's records
land in its own file, carry its own pid, and reach disk although workers leave through os._exit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from conftest import as_default, run_dir_of
from telemetrain import metrics
from telemetrain.store import open_run

torch = pytest.importorskip("torch", reason="torch is needed for a real DataLoader")


class RecordingDataset(torch.utils.data.Dataset):  # type: ignore[misc, name-defined]  # (a base from pytest.importorskip's module object: Any to mypy)
    """Each item fetched is recorded where it was fetched, with the pid that fetched it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Any:
        metrics.put_metric("item", index, "data")
        metrics.put_metric("pid", os.getpid(), "data")
        return torch.tensor([index])


@pytest.mark.parametrize("persistent_workers", [False, True], ids=["per-epoch workers", "persistent workers"])
def test_dataloader_workers_write_their_own_files(tmp_path: Path, persistent_workers: bool) -> None:
    n = 64
    t = telemetrain.Telemetry(telemetrain.identity_from_env(env={}), store=tmp_path)
    with as_default(t):
        # No record before the workers fork: the fork hook must already be in place (it is set up by Telemetry()).
        loader = torch.utils.data.DataLoader(
            RecordingDataset(n),
            batch_size=4,
            num_workers=2,
            multiprocessing_context="fork",
            persistent_workers=persistent_workers,
        )
        seen = sorted(int(x) for batch in loader for x in batch)
        metrics.put_metric("epoch_done", 1, "train")
        del loader  # persistent workers are shut down here (their iterator is dropped)
        assert t.flush()
    assert seen == list(range(n))
    run = open_run(run_dir_of(t))
    parent = os.getpid()
    workers = [p for p in run.processes if p.pid != parent]
    assert len(workers) == 2 and run.torn == 0 and run.corrupt == 0
    items: list[int] = []
    for log in workers:
        assert log.path.name == f"rank-0.{log.pid}.jsonl"
        assert all(r.identity.pid == log.pid for r in log.records)
        # the pid each worker saw itself is the pid its records carry
        assert {r.value for r in log.records if r.name == "pid"} == {log.pid}
        items += [r.value for r in log.records if r.name == "item"]
    assert sorted(items) == list(range(n))  # every fetch recorded exactly once, none lost at worker exit
    [main] = [p for p in run.processes if p.pid == parent]
    assert [r.name for r in main.records] == ["epoch_done"]
