"""Helpers of the one-logger compatibility tests: an exporter that records its calls, a controllable clock for the
one-logger layer, and a provider fixture that is always reset."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

import telemetrain
from telemetrain.training import one_logger_recorder_base, timestamps
from telemetrain.training.config import TrainingTelemetryConfig
from telemetrain.training.exporters import Exporter
from telemetrain.training.one_logger_config import OneLoggerConfig
from telemetrain.training.training_telemetry_provider import TrainingTelemetryProvider


class Recording(Exporter):
    """Records every call: ``calls`` is ``[(method, args)]`` in arrival order; ``threads`` the threads they came on."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.threads: set[int] = set()

    def _record(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        self.threads.add(threading.get_ident())

    def initialize(self) -> None:
        self._record("initialize")

    def export_start(self, span: Any) -> None:
        self._record("export_start", span)

    def export_stop(self, span: Any) -> None:
        self._record("export_stop", span)

    def export_event(self, event: Any, span: Any) -> None:
        self._record("export_event", event, span)

    def export_error(self, event: Any, span: Any) -> None:
        self._record("export_error", event, span)

    def export_telemetry_data_error(self, error: Any) -> None:
        self._record("export_telemetry_data_error", error)

    def close(self) -> None:
        self._record("close")

    def methods(self) -> list[str]:
        return [method for method, _ in self.calls]

    def named(self, method: str) -> list[str]:
        """The span (export_start/stop) or event (export_event/error) names of one method's calls."""
        return [args[0].name_str for m, args in self.calls if m == method]

    def spans(self, method: str, name: str) -> list[Any]:
        return [args[0] for m, args in self.calls if m == method and args[0].name_str == name]

    def events(self, name: str) -> list[Any]:
        return [args[0] for m, args in self.calls if m == "export_event" and args[0].name_str == name]


class Clock:
    """The one-logger layer's clock (``time.time``/``time.perf_counter`` as its modules see them), moved by hand;
    the wall clock starts a minute before the real one. telemetrain's own recorder keeps the real clock."""

    def __init__(self) -> None:
        self.wall = float(int(time.time()) - 60)
        self.perf = 5000.0

    def time(self) -> float:
        return self.wall

    def perf_counter(self) -> float:
        return self.perf

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.perf += seconds

    @property
    def ms(self) -> float:
        return self.wall * 1000.0


@pytest.fixture(name="clock")
def clock_fixture(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    fake = types.SimpleNamespace(time=c.time, perf_counter=c.perf_counter, monotonic=time.monotonic)
    for module in (timestamps, one_logger_recorder_base):  # (its _msec reads time.time)
        monkeypatch.setattr(module, "time", fake)
    return c


@pytest.fixture(name="provider")
def provider_fixture(telemetry: telemetrain.Telemetry) -> Iterator[TrainingTelemetryProvider]:
    """The process-wide provider, on the test's Telemetry, reset (its exporters closed) after the test."""
    TrainingTelemetryProvider.reset()
    p = TrainingTelemetryProvider.instance().with_telemetry(telemetry)
    try:
        yield p
    finally:
        TrainingTelemetryProvider.reset()


def base_config(**changes: Any) -> OneLoggerConfig:
    fields: dict[str, Any] = {"application_name": "app", "session_tag_or_fn": "session-1", "world_size_or_fn": 4}
    fields.update(changes)
    return OneLoggerConfig(**fields)


def training_config(**changes: Any) -> TrainingTelemetryConfig:
    fields: dict[str, Any] = {"perf_tag_or_fn": "perf", "global_batch_size_or_fn": 32, "flops_per_sample_or_fn": 100,
                              "log_every_n_train_iterations": 10, "is_log_throughput_enabled_or_fn": True}
    fields.update(changes)
    return TrainingTelemetryConfig(**fields)


def configure(p: TrainingTelemetryProvider, *exporters: Any, training: TrainingTelemetryConfig | None = None,
              wait_s: float = 10.0, **base: Any) -> TrainingTelemetryProvider:
    """Configure ``p``; ``wait_s``: the delivery wait (long by default: on a loaded machine a test that reads what
    an exporter got right after a callback must not see a slow thread switch as a blocked exporter)."""
    p.with_base_config(base_config(telemetry_config=training, **base))
    p.with_delivery_wait(wait_s)
    for exporter in exporters:
        p.with_exporter(exporter)
    p.configure_provider()
    return p


__all__ = ["Clock", "Recording", "base_config", "clock_fixture", "configure", "provider_fixture", "training_config"]
