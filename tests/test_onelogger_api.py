"""One-logger's training API through ``TrainingTelemetryProvider``: the exporter calls and their order, the spans'
and events' attributes (one-logger's arithmetic, on a hand-moved clock), the parents, a disabled rank, misuse (an
error event and one warning, never an exception), the core API (``timed_span``, custom events, errors) and export
customization. Everything an exporter sees is checked against what telemetrain's own run store recorded too."""

from __future__ import annotations

import socket
import threading
import warnings
from typing import Any

import pytest

import telemetrain
from _onelogger import Clock, Recording, clock_fixture, configure, provider_fixture, training_config  # noqa: F401
from conftest import run_dir_of
from telemetrain import TelemetryWarning
from telemetrain.store import open_run
from telemetrain.training import callbacks as cb
from telemetrain.training import context as ctx
from telemetrain.training.attributes import Attributes
from telemetrain.training.checkpoint import CheckPointStrategy
from telemetrain.training.default_recorder import ExportCustomizationMode
from telemetrain.training.events import ErrorEvent, Event, TelemetryDataError
from telemetrain.training.spans import Span
from telemetrain.training.timed_span import get_recorder, timed_span
from telemetrain.training.training_telemetry_provider import TrainingTelemetryProvider


def _records(t: telemetrain.Telemetry) -> list[Any]:
    assert t.flush()
    return open_run(run_dir_of(t)).records()


def _attrs(obj: Any) -> dict[str, Any]:
    return obj.attributes.to_json()  # type: ignore[no-any-return]


def test_application_lifecycle_in_one_loggers_order(provider: TrainingTelemetryProvider, clock: Clock,
                                                   telemetry: telemetrain.Telemetry) -> None:
    exporter = Recording()
    configure(provider, exporter, training=training_config())
    start_ms = clock.ms - 40_000  # the application began 40 s ago (an explicit start time)
    app = cb.on_app_start(start_ms)
    assert isinstance(app, Span) and app.parent_span is None
    assert exporter.methods() == ["initialize", "export_start", "export_event", "export_event"]
    init, update = (args[0] for m, args in exporter.calls if m == "export_event")
    assert init.name_str == "one_logger_initialization" and update.name_str == "update_training_telemetry_config"
    assert _attrs(init) == {"world_size": 4, "one_logger_training_telemetry_version": "2.3.1",
                            "enable_for_current_rank": True, "session_tag": "session-1", "is_baseline_run": False,
                            "summary_data_schema_version": "1.0.0", "node_name": socket.gethostname(), "rank": 0,
                            "timestamp_msec": int(start_ms)}
    assert _attrs(update)["global_batch_size"] == 32 and _attrs(update)["checkpoint_strategy"] == "sync"
    assert app.events[1:] == [init, update]  # the span holds what was exported, the same objects
    clock.advance(10)
    cb.on_app_end()
    assert exporter.methods()[-2:] == ["export_stop", "close"]
    assert _attrs(app)["duration_msec"] == 50_000 and not app.active
    assert exporter.threads and threading.get_ident() not in exporter.threads  # delivered from another thread
    records = _records(telemetry)
    names = [(r.kind, r.name) for r in records]
    assert ("span_start", "application") in names and ("span_end", "application") in names
    # the application config's session tag and world size reach telemetrain's own initialization event too
    [ours] = [dict(r.attributes) for r in records if r.kind == "event" and r.name == "one_logger_initialization"]
    assert ours["session_tag"] == "session-1" and ours["world_size"] == 4


def test_training_metrics_follow_one_loggers_arithmetic(provider: TrainingTelemetryProvider, clock: Clock,
                                                        telemetry: telemetrain.Telemetry) -> None:
    exporter = Recording()
    configure(provider, exporter, training=training_config(log_every_n_train_iterations=4, seq_length_or_fn=8))
    cb.on_app_start()
    loop = cb.on_train_start(train_iterations_start=2, train_iterations_target_or_fn=100,
                             train_samples_target_or_fn=3200)
    assert _attrs(loop) == {"train_iterations_start": 2, "train_samples_start": 64, "train_iterations_target": 100,
                            "train_samples_target": 3200, "train_tokens_target": 8 * 3200,
                            "completed_floating_point_operations_overall": 2 * 32 * 100}
    durations = [4.0, 2.0, 2.0, 6.0, 2.0, 2.0, 2.0]
    ends = []
    for seconds in durations:
        cb.on_training_single_iteration_start()
        clock.advance(seconds)
        cb.on_training_single_iteration_end()
        ends.append(clock.wall)
        clock.advance(1.0)  # between iterations: not iteration time
    updates = exporter.events("training_metrics_update")
    # global steps 2..8: an update where (step + 1) % 4 == 0, steps 3 and 7 (after 2 and 6 iterations)
    assert [_attrs(u)["current_iteration"] for u in updates] == [3, 7]
    assert all(s is loop for s in (args[1] for m, args in exporter.calls if m == "export_event"
                                   and args[0].name_str == "training_metrics_update"))
    first = _attrs(updates[0])
    flops = 32 * 100
    assert first["num_iterations"] == 2 and first["total_iteration_time_sec"] == 6.0
    assert first["avg_iteration_time_sec"] == 3.0 and first["min_iteration_time_sec"] == 2.0
    assert first["max_iteration_time_sec"] == 4.0 and first["num_train_samples"] == 64 and first["train_tokens"] == 512
    assert first["total_flops"] == 2 * flops and first["completed_floating_point_operations_overall"] == 4 * flops
    assert first["train_throughput_per_gpu"] == pytest.approx(2 * flops / (6.0 * 1e12 * 4))
    assert first["train_throughput_per_gpu_min"] == pytest.approx(flops / (4.0 * 1e12 * 4))  # after iteration 1
    assert first["first_logged_train_iterations_finish_timestamp_sec"] == ends[0]
    assert first["last_logged_train_iterations_finish_timestamp_sec"] == ends[1]
    cb.on_train_end()
    cb.on_app_end()
    second = _attrs(updates[1])  # cumulative over the job (one-logger's arithmetic), not the last 4 iterations
    assert second["num_iterations"] == 6 and second["total_iteration_time_sec"] == 18.0
    assert second["max_iteration_time_sec"] == 6.0 and second["avg_iteration_time_sec"] == 3.0
    # one-logger never reports step 8 (no multiple of 4 reached); telemetrain's run store has its own reports, the
    # last one at the end of training
    ours = [dict(r.attributes) for r in _records(telemetry) if r.kind == "event"
            and r.name == "training_metrics_update"]
    assert ours and ours[-1]["current_iteration"] == 2 + len(durations) - 1


def test_saves_and_validation_are_children_of_the_training_loop(provider: TrainingTelemetryProvider,
                                                                telemetry: telemetrain.Telemetry) -> None:
    exporter = Recording()
    configure(provider, exporter, training=training_config())
    with ctx.application() as app, ctx.training_loop(train_iterations_start=0) as loop:
        with ctx.training_iteration():
            pass
        with ctx.checkpoint_save(global_step=1) as save:
            pass
        with ctx.validation_loop() as validation, ctx.validation_iteration():
            pass
    # (checkpoint_save is annotated to yield a telemetrain.spans.Span; under a provider it yields a training Span)
    assert save.parent_span is loop and validation.parent_span is loop and loop.parent_span is app  # type: ignore[union-attr]
    # the same tree in telemetrain's run store
    starts = {r.name: r for r in _records(telemetry) if r.kind == "span_start"}
    loop_id = starts["training_loop"].span_id
    assert starts["checkpoint_save_sync"].parent_id == loop_id
    assert starts["validation_loop"].parent_id == loop_id
    assert starts["training_loop"].parent_id == starts["application"].span_id


def test_checkpoint_success_sync_on_the_save_async_on_the_application(provider: TrainingTelemetryProvider,
                                                                      clock: Clock) -> None:
    exporter = Recording()
    configure(provider, exporter, training=training_config(save_checkpoint_strategy=CheckPointStrategy.ASYNC))
    app = cb.on_app_start()
    cb.on_train_start(train_iterations_start=0, train_iterations_target_or_fn=10, train_samples_target_or_fn=320)
    save = cb.on_save_checkpoint_start(global_step=7)
    assert save.name_str == "checkpoint_save_async"
    assert _attrs(save) == {"checkpoint_strategy": "async", "current_iteration": 7, "save_checkpoint_attempt_count": 1}
    clock.advance(3)
    cb.on_save_checkpoint_end()  # scheduled: the blocking part is over
    clock.advance(20)
    cb.on_save_checkpoint_success(global_step=7)  # finalised later
    success = exporter.events("save_checkpoint_success")[0]
    assert success in app.events and _attrs(success)["save_checkpoint_success_count"] == 1
    assert _attrs(exporter.events("sync_checkpoint_metrics_update")[0])["save_checkpoint_sync_time_total_sec"] == 3.0
    # loop start, save start, its metrics update, its stop, then (later) the success on the application span
    assert exporter.methods()[4:] == ["export_start", "export_start", "export_event", "export_stop", "export_event"]
    cb.on_train_end()
    cb.on_app_end()


def test_a_disabled_rank_exports_nothing_but_is_still_recorded(provider: TrainingTelemetryProvider,
                                                               telemetry: telemetrain.Telemetry) -> None:
    exporter = Recording()
    configure(provider, exporter, training=training_config(), enable_for_current_rank=False)
    assert cb.on_app_start() is None
    assert cb.on_train_start() is None  # one-logger lets a disabled rank call it bare
    assert cb.on_train_start(train_iterations_start=0) is None
    for _ in range(3):
        with ctx.training_iteration() as span:
            assert span is None
    assert cb.on_save_checkpoint_start() is None and cb.on_save_checkpoint_success() is None  # type: ignore[func-returns-value]
    cb.on_train_end()
    cb.on_app_end()
    assert exporter.calls == []
    names = [(r.kind, r.name) for r in _records(telemetry)]
    assert names.count(("span_end", "training_loop")) == 1 and ("span_end", "application") in names


def test_misuse_is_recorded_and_warned_once_never_raised(provider: TrainingTelemetryProvider,
                                                         telemetry: telemetrain.Telemetry) -> None:
    exporter = Recording()
    configure(provider, exporter, training=training_config())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cb.on_app_start()
        cb.on_train_start(train_iterations_start=0)
        first = cb.on_training_single_iteration_start()
        second = cb.on_training_single_iteration_start()  # the first was never ended: it is ended now
        cb.on_model_init_end()  # never started
        again = cb.on_app_start()  # already open: the open span comes back
        cb.on_training_single_iteration_end()
        cb.on_train_end()
        cb.on_app_end()
    ours = [str(w.message) for w in caught if issubclass(w.category, TelemetryWarning)]
    assert len(ours) == 1 and "already active" in ours[0]
    assert not first.active and second is not first and not second.active and again is not None
    assert any(isinstance(e, ErrorEvent) for e in first.events)  # its timer was stopped for it
    errors = [args[0] for m, args in exporter.calls if m == "export_telemetry_data_error"]
    assert len(errors) == 1 and errors[0].error_type is TelemetryDataError.ErrorType.INCOMPLETE_TELEMETRY_DATA
    assert provider.recorder.errors == 3
    recorded = [r for r in _records(telemetry) if r.kind == "event" and r.name == "error"]
    assert len(recorded) >= 3


def test_core_api_timed_span_custom_event_and_error(provider: TrainingTelemetryProvider,
                                                    telemetry: telemetrain.Telemetry) -> None:
    exporter = Recording()
    configure(provider, exporter, training=training_config())
    recorder = get_recorder()
    assert recorder is provider.recorder
    with ctx.application(), ctx.training_loop(train_iterations_start=0) as loop:
        with ctx.training_iteration():
            with timed_span("my_span", span_attributes=Attributes({"size": 3})) as mine:
                event = Event.create("my_event", Attributes({"k": "v"}))
                assert recorder.event(mine, event) is event
        with pytest.raises(KeyError), timed_span("failing"):
            raise KeyError("missing")
        assert recorder.event(Event.create("on_the_current_span")) is not None  # no span: the latest active one
    # the iteration is not exported (default blacklist): its child hangs from the loop, not from a span no exporter saw
    assert mine.parent_span is loop and mine.direct_parent_span is not loop
    stopped = _attrs(exporter.spans("export_stop", "my_span")[0])
    assert stopped["size"] == 3 and set(stopped) == {"size", "duration_msec"}
    error = next(args[0] for m, args in exporter.calls if m == "export_error")
    assert error.exception_type == "KeyError" and "KeyError" in error.exception_traceback
    assert exporter.events("on_the_current_span")[0] in loop.events  # type: ignore[union-attr]  # (`is` above: Span | None)
    records = _records(telemetry)
    custom = [r for r in records if r.kind == "event" and r.name == "my_event"]
    spans = {r.name: r for r in records if r.kind == "span_start"}
    assert custom and dict(custom[0].attributes) == {"k": "v"} and custom[0].span_id == spans["my_span"].span_id
    failed = [r for r in records if r.kind == "span_end" and r.name == "failing"]
    assert failed[0].status == "error"


@pytest.mark.parametrize(("mode", "names", "exported"), [
    (ExportCustomizationMode.WHITELIST_SPANS, ["training_loop"], {"training_loop"}),
    (ExportCustomizationMode.BLACKLIST_SPANS, ["training_loop"], {"application", "training_single_iteration"}),
    (ExportCustomizationMode.BLACKLIST_SPANS, [], {"application", "training_loop", "training_single_iteration"}),
    (ExportCustomizationMode.EXPORT_ALL_SPANS, None, {"application", "training_loop", "training_single_iteration"}),
])
def test_export_customization(provider: TrainingTelemetryProvider, mode: ExportCustomizationMode,
                              names: list[str] | None, exported: set[str]) -> None:
    exporter = Recording()
    provider.with_export_customization(mode, names)
    configure(provider, exporter, training=training_config())
    with ctx.application(), ctx.training_loop(train_iterations_start=0), ctx.training_iteration():
        with timed_span("inner") as inner:
            pass
    assert set(exporter.named("export_start")) - {"inner"} == exported
    visible = {"application", "training_loop", "training_single_iteration"} & exported
    parent = inner.parent_span
    assert parent is None or parent.name_str in visible  # never a parent the exporter did not see


def test_export_customization_arguments_are_checked(provider: TrainingTelemetryProvider) -> None:
    with pytest.raises(TypeError, match="export_customization_mode"):
        provider.with_export_customization("blacklist", ["x"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="span_name_filter"):
        provider.with_export_customization(ExportCustomizationMode.BLACKLIST_SPANS, "training_loop")
    with pytest.raises(ValueError, match="whitelist"):
        provider.with_export_customization(ExportCustomizationMode.WHITELIST_SPANS, None)


def test_timed_span_before_any_provider_records_to_the_run_store(telemetry: telemetrain.Telemetry) -> None:
    TrainingTelemetryProvider.reset()
    with timed_span("setup_phase", span_attributes=Attributes({"n": 1})) as span:
        get_recorder().event(span, Event.create("checked"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cb.on_model_init_end()  # misuse on telemetrain's own recorder: still warned about
    assert any(issubclass(w.category, TelemetryWarning) for w in caught)
    names = [(r.kind, r.name) for r in _records(telemetry)]
    assert ("span_end", "setup_phase") in names and ("event", "checked") in names
