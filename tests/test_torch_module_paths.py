"""torch's module paths under telemetrain: ``metrics.api``, ``events.api``, ``events.handlers`` (torch's docs and
tests import from them) hold the same objects as the packages, and ``monitor._WaitCounter`` (torch's own monitor test
uses it) records each guarded block."""

from __future__ import annotations

import logging

import pytest

import telemetrain
from conftest import run_dir_of
from telemetrain import events, metrics, monitor
from telemetrain.events import api as events_api
from telemetrain.events import handlers
from telemetrain.metrics import api as metrics_api
from telemetrain.store import open_run


def test_the_submodules_are_the_packages_objects() -> None:
    torch_api = pytest.importorskip("torch.distributed.elastic.metrics.api")
    assert set(torch_api.__all__) <= set(metrics_api.__all__)
    for name in metrics_api.__all__:
        assert getattr(metrics_api, name) is getattr(metrics, name)
    for name in ("Event", "EventSource", "NodeState", "RdzvEvent", "EventMetadataValue"):
        assert getattr(events_api, name) is getattr(events, name)
    assert handlers._log_handlers is events._log_handlers
    handler = logging.NullHandler()
    handlers.register_logging_handler("i16-test", handler)
    try:
        assert events.get_logging_handler("i16-test") is handler  # one table, whichever path registered it
    finally:
        handlers._log_handlers.pop("i16-test", None)


def test_wait_counter_records_each_guarded_block(telemetry: telemetrain.Telemetry,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    counter = monitor._WaitCounter("checkpoint_wait")
    with counter.guard():
        pass
    monkeypatch.setenv("TORCH_DISABLE_WAIT_COUNTERS", "1")
    with counter.guard():  # disabled, as in torch
        pass
    assert telemetry.flush()
    found = [r for r in open_run(run_dir_of(telemetry)).records() if r.kind == "metric"
             and r.name == "checkpoint_wait"]
    assert len(found) == 1 and found[0].group == "torch.monitor.wait_counter" and found[0].value >= 0
    with pytest.raises(ValueError):
        monitor._WaitCounter("")
