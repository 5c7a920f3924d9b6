"""Drop-in contracts found in an audit of the compat modules: what a user switching by changing an import relies on,
checked against the real torch module where one exists."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch.monitor as tm

import telemetrain
from _onelogger import Recording, configure, provider_fixture, training_config  # noqa: F401
from conftest import run_dir_of
from telemetrain import monitor
from telemetrain.store.reader import open_run
from telemetrain.training import callbacks as cb
from telemetrain.training.training_telemetry_provider import TrainingTelemetryProvider

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter (module attributes depend on what was imported before)."""
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("prefix", ["torch.distributed.elastic", "telemetrain"])
def test_package_import_exposes_api_and_handlers_submodules(prefix: str) -> None:
    # torch's packages import their .api (and events' .handlers), so code written as ``metrics.api.put_metric``
    # after ``from torch.distributed.elastic import metrics`` alone works; the drop-in must too
    out = _fresh_python(f"""
        from {prefix} import events, metrics
        print(metrics.api.put_metric is metrics.put_metric, events.api.Event is events.Event,
              events.handlers.get_logging_handler is events.get_logging_handler)
    """)
    assert out.split() == ["True", "True", "True"]


@pytest.mark.parametrize("mod", [tm, monitor], ids=["torch", "telemetrain"])
def test_aggregation_prints_as_its_name(mod: object) -> None:
    agg = mod.Aggregation.SUM  # type: ignore[attr-defined]
    assert str(agg) == "Aggregation.SUM"
    assert f"{agg}" == "Aggregation.SUM"
    assert agg.name == "SUM" and int(agg.value) == 4


# -- nv-one-logger ---------------------------------------------------------------------------------------------------


def test_one_logger_errors_take_message_by_keyword_and_assert_that_exists() -> None:
    from telemetrain.training.errors import OneLoggerError, assert_that
    from telemetrain.training.exporters import ExportError

    # one-logger's signature is ``__init__(self, message)``; exporters written for it raise with message=...
    assert str(OneLoggerError(message="bad state")) == "bad state"
    assert str(ExportError(message="closed")) == "closed"
    assert_that(1, "never raised")
    with pytest.raises(OneLoggerError, match=r"^invariant broken$"):
        assert_that([], "invariant broken")


def test_config_values_from_the_environment_convert_as_one_loggers_pydantic_models_do() -> None:
    from telemetrain.training.config import TrainingTelemetryConfig
    from telemetrain.training.errors import InvalidConfigError
    from telemetrain.training.one_logger_config import OneLoggerConfig, OneLoggerErrorHandlingStrategy

    # values read from os.environ are str: typed Any here, as they are where a config file or a launcher gives them
    env: dict[str, Any] = {"WORLD_SIZE": "4", "GBS": " 32 ", "LOG_EVERY": "10", "THROUGHPUT": "false",
                           "BASELINE": "yes", "ENABLED": "0", "FLOPS": "6000000000", "FOUR": 4.0, "ZERO": 0}
    tt = TrainingTelemetryConfig(global_batch_size_or_fn=env["GBS"], log_every_n_train_iterations=env["LOG_EVERY"],
                                 world_size_or_fn=env["FOUR"], is_log_throughput_enabled_or_fn=env["THROUGHPUT"],
                                 flops_per_sample_or_fn=env["FLOPS"], is_save_checkpoint_enabled_or_fn=env["ZERO"])
    assert (tt.global_batch_size, tt.log_every_n_train_iterations, tt.world_size) == (32, 10, 4)
    assert tt.is_log_throughput_enabled is False  # a non-empty str was truthy: throughput on, silently
    assert tt.is_save_checkpoint_enabled is False
    assert tt.flops_per_sample == 6e9
    config = OneLoggerConfig(application_name="app", session_tag_or_fn="s", world_size_or_fn=env["WORLD_SIZE"],
                             is_baseline_run_or_fn=env["BASELINE"], enable_for_current_rank=env["ENABLED"])
    assert (config.world_size, config.is_baseline_run, config.enable_for_current_rank) == (4, True, False)
    # a disabled rank gets one-logger's quiet strategy, decided from the converted flag
    assert config.error_handling_strategy is OneLoggerErrorHandlingStrategy.DISABLE_QUIETLY_AND_REPORT_METRIC_ERROR
    # what pydantic rejects is still an error naming the field
    bad: dict[str, Any] = {"half": "4.5", "word": "eight", "maybe": "maybe", "exp": "1e12"}
    with pytest.raises(InvalidConfigError, match="world_size"):
        OneLoggerConfig(application_name="app", session_tag_or_fn="s", world_size_or_fn=bad["half"])
    with pytest.raises(InvalidConfigError, match="global_batch_size_or_fn"):
        TrainingTelemetryConfig(global_batch_size_or_fn=bad["word"])
    with pytest.raises(InvalidConfigError, match="flops_per_sample_or_fn"):
        TrainingTelemetryConfig(global_batch_size_or_fn=8, flops_per_sample_or_fn=bad["exp"])
    with pytest.raises(InvalidConfigError, match="is_log_throughput_enabled_or_fn"):
        TrainingTelemetryConfig(global_batch_size_or_fn=8, is_log_throughput_enabled_or_fn=bad["maybe"],
                                flops_per_sample_or_fn=1)


def test_throughput_logging_without_flops_per_sample_is_a_config_error() -> None:
    from telemetrain.training.config import TrainingTelemetryConfig
    from telemetrain.training.errors import OneLoggerError

    # one-logger's validator: throughput figures need the FLOPs per sample; without it they were silently absent
    with pytest.raises(OneLoggerError, match="flops_per_sample"):
        TrainingTelemetryConfig(global_batch_size_or_fn=8, is_log_throughput_enabled_or_fn=True)
    assert TrainingTelemetryConfig(global_batch_size_or_fn=8, is_log_throughput_enabled_or_fn=True,
                                   flops_per_sample_or_fn=lambda: 100).flops_per_sample == 100


def test_callbacks_given_times_export_exactly_their_durations(provider: TrainingTelemetryProvider,
                                                               telemetry: telemetrain.Telemetry) -> None:
    # a job that passes its own *_time_msec (replayed or measured elsewhere): a span started at t and finished at
    # t + d ms lasts d ms. Each explicit time's perf counter used to come from a fresh pair of clock readings, so
    # the exported durations were truncated from d - a few microseconds: d - 1 about half the time
    seen = Recording()
    configure(provider, seen, training=training_config())
    t = float(int(time.time() * 1000) - 60_000)
    cb.on_app_start(start_time_msec=t)
    cb.on_train_start(train_iterations_start=0, start_time_msec=t + 1)
    t += 2
    expected = []
    for d in range(1, 41):
        cb.on_validation_start(start_time_msec=t)
        cb.on_validation_single_iteration_start(start_time_msec=t)
        cb.on_validation_single_iteration_end(finish_time_msec=t + d)
        cb.on_validation_end(finish_time_msec=t + d)
        expected.append(d)
        t += d + 3
    cb.on_train_end(finish_time_msec=t)
    cb.on_app_end(finish_time_msec=t + 1)
    durations = [span.duration_msec() for span in seen.spans("export_stop", "validation_loop")]
    assert durations == expected
    updates = seen.events("validation_metrics_update")
    assert [round(e.attributes["max_iteration_time_sec"].value * 1000, 3) for e in updates] == [
        float(max(expected[: i + 1])) for i in range(40)]


def test_bridge_keeps_metadata_keys_named_like_its_own(telemetry: telemetrain.Telemetry) -> None:
    # torch's own events module, bridged: a metadata key "source" (the job's data source, say) is data and must
    # survive; the event's own source and time are also under the drop-in's keys, so both routes share a schema
    from torch.distributed.elastic import events as te_events

    from telemetrain.integrations.torchelastic import install

    with install(telemetry):
        te_events.record(te_events.Event("ingest", te_events.EventSource.WORKER, timestamp=1234,
                                         metadata={"source": "s3://bucket", "timestamp_ms": 7, "n": 2}))
        te_events.record(te_events.Event("plain", te_events.EventSource.AGENT, timestamp=99))
    telemetry.flush()
    by_name = {r.name: r for r in open_run(run_dir_of(telemetry)).records("event")}
    ingest = by_name["ingest"].attributes
    assert (ingest["source"], ingest["timestamp_ms"], ingest["n"]) == ("s3://bucket", 7, 2)
    assert (ingest["torchelastic.source"], ingest["torchelastic.timestamp"]) == ("WORKER", 1234)
    plain = by_name["plain"].attributes
    assert (plain["source"], plain["timestamp_ms"], plain["torchelastic.source"]) == ("AGENT", 99, "AGENT")


def test_deserialize_takes_torchelastics_own_event_objects() -> None:
    # torch's deserialize returns an Event object as it is; code that switched imports still gets torch's objects
    # from torch's agent, and ours used to refuse them with a TypeError
    from torch.distributed.elastic import events as te_events

    from telemetrain import events

    theirs = te_events.Event("n", te_events.EventSource.AGENT, 5, {"k": 1})
    ours = events.Event.deserialize(theirs)
    assert isinstance(ours, events.Event)
    assert ours == events.Event("n", events.EventSource.AGENT, 5, {"k": 1})
    assert events.Event.deserialize(theirs.serialize()) == ours
    rdzv = te_events.RdzvEvent("r", "run", "msg", "host", 7, te_events.NodeState.FAILED, rank=2, error_trace="tb")
    mine = events.RdzvEvent.deserialize(rdzv)
    assert isinstance(mine, events.RdzvEvent) and mine.node_state is events.NodeState.FAILED
    assert mine.serialize() == rdzv.serialize()
    with pytest.raises(TypeError, match="data"):
        events.Event.deserialize({"name": "n"})
