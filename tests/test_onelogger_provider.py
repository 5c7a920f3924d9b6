"""``TrainingTelemetryProvider`` and ``OneLoggerConfig``: one-logger's builder, its once-only rules kept as rules but
never raised into the job (recorded, warned once, the call ignored), invalid configuration raised as a ``ValueError``
that is also a ``OneLoggerError``, nested overrides, a late training config, ``reset``, an independent instance, and
the one-logger model objects (attributes, events, spans, timestamps)."""

from __future__ import annotations

import json
import uuid
import warnings
from pathlib import Path

import pytest

import telemetrain
from _onelogger import Recording, base_config, configure, provider_fixture, training_config  # noqa: F401
from conftest import run_dir_of
from telemetrain import TelemetryWarning
from telemetrain.store import open_run
from telemetrain.training import callbacks as cb
from telemetrain.training import context as ctx
from telemetrain.training.attributes import Attribute, Attributes, TrainingLoopAttributes
from telemetrain.training.default_recorder import ExportCustomizationMode
from telemetrain.training.errors import InvalidConfigError, OneLoggerError
from telemetrain.training.events import ErrorEvent, Event
from telemetrain.training.one_logger_config import OneLoggerConfig, OneLoggerErrorHandlingStrategy
from telemetrain.training.spans import Span
from telemetrain.training.timestamps import TracingTimestamp
from telemetrain.training.training_telemetry_provider import TrainingTelemetryProvider


def _warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, TelemetryWarning)]


def test_once_only_rules_are_recorded_and_warned_never_raised(provider: TrainingTelemetryProvider,
                                                              telemetry: telemetrain.Telemetry) -> None:
    first, second = Recording(), Recording()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        provider.with_base_config(base_config(application_name="first"))
        provider.with_base_config(base_config(application_name="second"))  # ignored: the first is kept
        provider.with_export_customization(ExportCustomizationMode.BLACKLIST_SPANS, ["training_loop"])
        provider.with_export_customization(ExportCustomizationMode.BLACKLIST_SPANS, ["application"])  # ignored
        provider.with_exporter(first).configure_provider()
        provider.configure_provider()  # ignored
        provider.with_exporter(second)  # too late: ignored
        provider.with_config_override({"world_size_or_fn": 9})  # too late: ignored
        provider.set_training_telemetry_config(training_config())
        provider.set_training_telemetry_config(training_config(global_batch_size_or_fn=64))  # ignored
    assert len(_warnings(caught)) == 1  # warned once
    assert provider.errors == 6
    assert provider.config.application_name == "first" and provider.config.world_size == 4
    assert provider.config.telemetry_config is not None
    assert provider.config.telemetry_config.global_batch_size == 32
    assert provider.recorder._exporters == [first]
    with ctx.application(), ctx.training_loop(train_iterations_start=0):
        pass
    assert first.named("export_start") == ["application"]  # the first customization (training_loop filtered)
    assert second.calls == []
    assert telemetry.flush()
    errors = [r for r in open_run(run_dir_of(telemetry)).records() if r.kind == "event" and r.name == "error"]
    assert len(errors) >= 6


def test_invalid_configuration_is_a_value_error_that_one_logger_code_catches(
        provider: TrainingTelemetryProvider) -> None:
    with pytest.raises(InvalidConfigError, match="No configuration was provided"):
        provider.configure_provider()
    provider.with_base_config(base_config()).with_config_override({"world_size_or_fn": 0})
    with pytest.raises(ValueError, match="world_size must be set to a positive value") as raised:
        provider.configure_provider()
    assert isinstance(raised.value, OneLoggerError)
    TrainingTelemetryProvider.reset()
    p = TrainingTelemetryProvider.instance()
    p.with_config_override({"application_name": "a", "session_tag_or_fn": "s", "world_size_or_fn": 2,
                            "not_a_field": 1})
    with pytest.raises(InvalidConfigError, match="not_a_field"):
        p.configure_provider()
    with pytest.raises(InvalidConfigError, match="application_name"):
        OneLoggerConfig(application_name=" ", world_size_or_fn=1, session_tag_or_fn="s")
    with pytest.raises(TypeError, match="one_logger_config"):
        p.with_base_config({"application_name": "a"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="exporter"):
        p.with_exporter(object())


def test_nested_overrides_merge_over_the_base(provider: TrainingTelemetryProvider, tmp_path: Path) -> None:
    override_file = tmp_path / "overrides.json"
    override_file.write_text(json.dumps({"telemetry_config": {"log_every_n_train_iterations": 200}}))
    provider.with_base_config(base_config(telemetry_config=training_config()))
    provider.with_config_override({"world_size_or_fn": 8, "telemetry_config": {"log_every_n_train_iterations": 100}})
    provider.with_config_override_from_json_file(override_file)
    provider.configure_provider()
    config = provider.config
    assert config.world_size == 8 and config.application_name == "app"
    assert config.telemetry_config is not None
    assert config.telemetry_config.log_every_n_train_iterations == 200
    assert config.telemetry_config.global_batch_size == 32  # from the base
    config.application_name = "changed"
    assert provider.config.application_name == "app"  # .config is a copy


def test_a_training_config_set_before_the_application_starts_is_reported_at_its_start(
        provider: TrainingTelemetryProvider) -> None:
    exporter = Recording()
    configure(provider, exporter)
    telemetrain.training.set_training_telemetry_config(training_config(perf_tag_or_fn="late"))  # routed here
    assert exporter.methods() == ["initialize"]
    with ctx.application():
        pass
    updates = exporter.events("update_training_telemetry_config")
    assert len(updates) == 1 and updates[0].attributes.to_json()["perf_tag"] == "late"


def test_disable_quietly_stops_exporting_after_the_first_error(provider: TrainingTelemetryProvider) -> None:
    exporter = Recording()
    strategy = OneLoggerErrorHandlingStrategy.DISABLE_QUIETLY_AND_REPORT_METRIC_ERROR
    configure(provider, exporter, training=training_config(), error_handling_strategy=strategy)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        cb.on_app_start()
        cb.on_model_init_end()  # never started: the first error
        cb.on_model_init_start()
    assert exporter.methods()[-1] == "export_telemetry_data_error"
    assert exporter.named("export_start") == ["application"]  # nothing after the error
    cb.on_app_end()


def test_a_disabled_rank_defaults_to_the_quiet_strategy() -> None:
    config = OneLoggerConfig(application_name="a", world_size_or_fn=2, session_tag_or_fn="s",
                             enable_for_current_rank=False)
    assert config.error_handling_strategy is OneLoggerErrorHandlingStrategy.DISABLE_QUIETLY_AND_REPORT_METRIC_ERROR
    copy = config.model_copy(update={"application_name": "b"})
    assert copy.application_name == "b" and copy.world_size == 2
    assert OneLoggerConfig.model_validate(config.model_dump()) == config


def test_reset_closes_the_exporters_and_an_independent_provider_stays_apart(
        provider: TrainingTelemetryProvider, tmp_path: Path) -> None:
    mine, module_level = Recording(), Recording()
    configure(provider, module_level, training=training_config())
    with telemetrain.Telemetry(store=tmp_path / "other") as other:
        own = TrainingTelemetryProvider(telemetry=other)
        configure(own, mine, training=training_config())
        own.callbacks.on_app_start()
        cb.on_app_start()  # the module-level callbacks drive the process-wide provider
        own.callbacks.on_app_end()
        assert mine.named("export_start") == ["application"] and module_level.named("export_start") == ["application"]
        assert mine.methods()[-1] == "close" and module_level.methods()[-1] != "close"
    TrainingTelemetryProvider.reset()
    assert module_level.methods()[-2:] == ["export_stop", "close"]  # reset stopped the open span and closed
    assert cb.on_app_start() is not None  # routed to telemetrain's own default recorder again
    cb.on_app_end()


def test_one_logger_model_objects() -> None:
    attributes = Attributes({"a": 1})
    event = Event.create("e", attributes)
    assert "timestamp_msec" in event.attributes and "timestamp_msec" not in attributes  # the caller's object is kept
    with pytest.raises(TypeError, match="'bad'"):
        Attributes({"bad": {"a": "dict"}})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="one primitive type"):
        Attribute("mixed", [1, "a"])
    loop = TrainingLoopAttributes.create(train_iterations_start=3, train_samples_start=96)
    assert loop.train_iterations_start == 3 and loop.train_iterations_target is None
    with pytest.raises(OneLoggerError, match="must be an integer"):
        Attributes({"x": "y"}).get_int_value("x")
    with pytest.raises(TypeError, match="train_samples_start"):
        TrainingLoopAttributes.create(train_iterations_start=0, train_samples_start=None)  # type: ignore[arg-type]
    start = TracingTimestamp.for_timestamp(timestamp_sec=1_000.0, perf_counter=10.0, validate_timestamp=False)
    span = Span.create("s", span_attributes=Attributes({"k": "v"}), start_time=start)
    span.add_attributes({"n": 2})
    span.stop(stop_time=TracingTimestamp.for_timestamp(1_002.5, perf_counter=12.5, validate_timestamp=False))
    assert span.attributes.to_json() == {"k": "v", "n": 2, "duration_msec": 2500} and span.stop_event is not None
    assert isinstance(span.id, uuid.UUID) and Span.from_json(json.loads(json.dumps(span.to_json()))).id == span.id
    with pytest.raises(ValueError, match="10 hours"):
        TracingTimestamp.for_timestamp(timestamp_sec=1_000.0)  # seconds since the epoch, not a perf counter
    try:
        raise KeyError("k")
    except KeyError as exc:
        error = ErrorEvent.create("failed", exc)
    assert error.exception_type == "KeyError" and "raise KeyError" in (error.exception_traceback or "")
    assert Event.from_json(error.to_json()) == error


def test_the_run_store_initialization_event_has_the_application_config_when_the_training_config_comes_late(
        provider: TrainingTelemetryProvider, telemetry: telemetrain.Telemetry) -> None:
    """one-logger's README sets the training config after on_app_start: the run store's one_logger_initialization
    still carries the application config's session tag, world size, baseline flag and metadata, as the exported
    event does (not the run id and the launcher's world size)."""
    exported = Recording()
    configure(provider, exported, session_tag_or_fn=lambda: "session-7", world_size_or_fn=5, is_baseline_run_or_fn=True,
              custom_metadata={"team": "x"})
    cb.on_app_start()
    provider.set_training_telemetry_config(training_config())
    cb.on_app_end()
    telemetry.flush()
    [stored] = [r.attributes for r in open_run(run_dir_of(telemetry)).records("event")
                if r.name == "one_logger_initialization"]
    [sent] = [e.attributes.to_json() for e in exported.events("one_logger_initialization")]
    keys = ("session_tag", "world_size", "is_baseline_run", "custom_metadata")
    assert {k: stored[k] for k in keys} == {k: sent[k] for k in keys} == {
        "session_tag": "session-7", "world_size": 5, "is_baseline_run": True, "custom_metadata": ["team:x"]}
