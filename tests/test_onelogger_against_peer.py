"""The same program on nv-one-logger 2.3.1 and on telemetrain (its imports changed): the exporter receives the same
calls in the same order -- span starts and stops with their parents and attribute names, events with theirs, the
error of a failing ``timed_span`` -- in a fresh process each (one-logger is a process singleton). Skipped when
nv-one-logger is not installed (the ``bench`` extra installs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nv_one_logger.training_telemetry.api.training_telemetry_provider")

SRC = Path(__file__).resolve().parents[1] / "src"

PROGRAM = r'''
import json, sys
if sys.argv[1] == "one-logger":
    from nv_one_logger.api.config import OneLoggerConfig
    from nv_one_logger.api.timed_span import get_recorder, timed_span
    from nv_one_logger.core.attributes import Attributes
    from nv_one_logger.core.event import Event
    from nv_one_logger.exporter.exporter import Exporter
    from nv_one_logger.training_telemetry.api.config import TrainingTelemetryConfig
    from nv_one_logger.training_telemetry.api.context import (application, checkpoint_save, training_iteration,
                                                              training_loop, validation_iteration, validation_loop)
    from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider
    from overrides import override
else:
    import telemetrain
    telemetrain.set_telemetry(telemetrain.Telemetry(store=False))
    from telemetrain.training.one_logger_config import OneLoggerConfig
    from telemetrain.training.timed_span import get_recorder, timed_span
    from telemetrain.training.attributes import Attributes
    from telemetrain.training.events import Event
    from telemetrain.training.exporters import Exporter
    from telemetrain.training.config import TrainingTelemetryConfig
    from telemetrain.training.context import (application, checkpoint_save, training_iteration, training_loop,
                                              validation_iteration, validation_loop)
    from telemetrain.training.training_telemetry_provider import TrainingTelemetryProvider
    def override(method):
        return method


from strenum import StrEnum  # one-logger's own enum base (installed with it)


class Names(StrEnum):  # (one-logger 2.3.1 on Python < 3.12 cannot start a span named by a plain str)
    MINE = "my_span"
    FAILING = "failing_span"


calls = []


class Seen(Exporter):
    @override
    def initialize(self):
        calls.append(["initialize"])

    @override
    def export_start(self, span):
        parent = span.parent_span.name_str if span.parent_span else None
        calls.append(["start", span.name_str, parent, sorted(span.attributes.to_json())])

    @override
    def export_stop(self, span):
        calls.append(["stop", span.name_str, sorted(span.attributes.to_json())])

    @override
    def export_event(self, event, span):
        calls.append(["event", event.name_str, span.name_str, sorted(event.attributes.to_json())])

    @override
    def export_error(self, event, span):
        calls.append(["error", span.name_str, event.exception_type])

    @override
    def export_telemetry_data_error(self, error):
        calls.append(["telemetry_data_error", error.error_type.value])

    @override
    def close(self):
        calls.append(["close"])


training = TrainingTelemetryConfig(perf_tag_or_fn="p", global_batch_size_or_fn=8, log_every_n_train_iterations=10,
                                   flops_per_sample_or_fn=100, is_log_throughput_enabled_or_fn=True,
                                   train_iterations_target_or_fn=100, train_samples_target_or_fn=800)
(TrainingTelemetryProvider.instance()
 .with_base_config(OneLoggerConfig(application_name="a", world_size_or_fn=2, session_tag_or_fn="s"))
 .with_exporter(Seen()).configure_provider())
with application():
    TrainingTelemetryProvider.instance().set_training_telemetry_config(training)
    with training_loop(train_iterations_start=0) as loop:
        loop.add_attribute("custom", "x")
        for step in range(25):
            with training_iteration():
                pass
            if step % 10 == 9:
                with checkpoint_save(global_step=step):
                    pass
                with validation_loop():
                    for _ in range(2):
                        with validation_iteration():
                            pass
        with timed_span(Names.MINE, span_attributes=Attributes({"k": 1})) as span:
            get_recorder().event(span, Event.create("my_event", Attributes({"v": 2})))
        try:
            with timed_span(Names.FAILING):
                raise ValueError("boom")
        except ValueError:
            pass
print(json.dumps(calls))
'''


def _run(which: str, tmp_path: Path) -> list[list[object]]:
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cwd = tmp_path / which  # one-logger writes onelogger.log/.err into the working directory
    cwd.mkdir()
    proc = subprocess.run([sys.executable, "-c", PROGRAM, which], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls: list[list[object]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return calls


def test_the_exporter_receives_what_one_logger_would_send(tmp_path: Path) -> None:
    theirs = _run("one-logger", tmp_path)
    ours = _run("telemetrain", tmp_path)
    assert len(theirs) == 30
    assert ours == theirs
