"""One-logger exporters under telemetrain: each runs on its own delivery thread, so one that raises or blocks never
breaks or stalls training (it is counted, told once of its gap, disabled after 5 failures, or no longer waited
for); the file exporter appends and writes one file per rank; the logger exporter's lines read back; an exporter
written against nv-one-logger-core's own ``Exporter`` class works unchanged; ``OTelExporter`` reaches an OTel
``SpanExporter`` through telemetrain's OTel sink; exporters can be declared in a config file."""

from __future__ import annotations

import json
import logging
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from _onelogger import Recording, configure, provider_fixture, training_config  # noqa: F401
from conftest import run_dir_of
from telemetrain import TelemetryWarning
from telemetrain.store import open_run
from telemetrain.training import callbacks as cb
from telemetrain.training import context as ctx
from telemetrain.training.errors import ExportError
from telemetrain.training.events import TelemetryDataError
from telemetrain.training.exporters import FileExporter, LoggerExporter, OTelExporter
from telemetrain.training.training_telemetry_provider import TrainingTelemetryProvider


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _loop(iterations: int) -> None:
    with ctx.application(), ctx.training_loop(train_iterations_start=0):
        for _ in range(iterations):
            with ctx.training_iteration():
                pass


class Raising(Recording):
    def export_event(self, event: Any, span: Any) -> None:
        super().export_event(event, span)
        raise OSError("backend down")


def test_an_exporter_that_raises_is_contained_counted_told_once_and_disabled(
        provider: TrainingTelemetryProvider) -> None:
    raising, healthy = Raising(), Recording()
    configure(provider, raising, healthy, training=training_config(log_every_n_train_iterations=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _loop(40)  # 20 metrics updates, each raising in one exporter
    ours = [str(w.message) for w in caught if issubclass(w.category, TelemetryWarning)]
    assert len(ours) == 1 and "backend down" in ours[0]
    stats = {s["exporter"]: s for s in provider.recorder.export_stats()}
    assert stats["Raising"]["errors"] == 5 and stats["Raising"]["disabled"] and stats["Recording"]["errors"] == 0
    told = [args[0] for m, args in raising.calls if m == "export_telemetry_data_error"]
    assert len(told) == 1 and told[0].error_type is TelemetryDataError.ErrorType.INCOMPLETE_TELEMETRY_DATA
    assert raising.methods().count("export_event") == 5  # 5 failures (its first: the initialization), then nothing
    assert len(healthy.events("training_metrics_update")) == 20  # the other exporter got everything
    assert healthy.methods()[-1] == "close" and "close" in raising.methods()


def test_an_exporter_its_owner_closed_gets_nothing_more_when_the_recorder_closes(
        provider: TrainingTelemetryProvider, tmp_path: Path, telemetry: telemetrain.Telemetry) -> None:
    """A teardown (nv-one-logger's own tests) or a program's shutdown closes its exporter while the application span
    is still open: the recorder's close (a reset, exit, SIGTERM) stops that span without sending it there (it raised
    "Exporter is closed" and was warned about). An export to it while the recorder runs is still an error."""
    path = tmp_path / "telemetry.json"
    exporter, healthy = FileExporter(file_path=path), Recording()
    configure(provider, exporter, healthy, training=training_config())
    cb.on_app_start()
    exporter.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TrainingTelemetryProvider.reset()
    assert [str(w.message) for w in caught if issubclass(w.category, TelemetryWarning)] == []
    assert [r["type"] for r in _lines(path) if r.get("name") == "application"] == ["start"]
    assert healthy.named("export_stop")[-1:] == ["application"] and healthy.methods()[-1] == "close"
    telemetry.flush()
    ends = [r for r in open_run(run_dir_of(telemetry)).records()
            if r.kind == "span_end" and r.name == "application"]
    assert len(ends) == 1  # the run store has the span's end all the same

    TrainingTelemetryProvider.reset()
    p = TrainingTelemetryProvider.instance().with_telemetry(telemetry)
    closed_early = FileExporter(file_path=tmp_path / "early.json")
    configure(p, closed_early, training=training_config())
    cb.on_app_start()
    closed_early.close()
    with pytest.warns(TelemetryWarning, match="closed"):
        cb.on_model_init_start()


class Blocking(Recording):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def export_event(self, event: Any, span: Any) -> None:
        self.release.wait(30)
        super().export_event(event, span)


def test_an_exporter_that_blocks_is_waited_for_once_then_left_behind(provider: TrainingTelemetryProvider) -> None:
    blocking, healthy = Blocking(), Recording()
    configure(provider, blocking, healthy, training=training_config(log_every_n_train_iterations=2), wait_s=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with ctx.application(), ctx.training_loop(train_iterations_start=0):
                for _ in range(200):
                    with ctx.training_iteration():
                        pass
                # the loop ran to its end while the exporter was stuck on its first event
                stats = {s["exporter"]: s for s in provider.recorder.export_stats()}
                assert stats["Blocking"]["detached"] and stats["Blocking"]["pending"] > 50
                assert not stats["Recording"]["detached"] and len(healthy.events("training_metrics_update")) == 100
                assert [c.waits_timed_out for c in provider.recorder._channels] == [1, 0]  # one wait, one time
                blocking.release.set()
        finally:
            blocking.release.set()
    ours = [str(w.message) for w in caught if issubclass(w.category, TelemetryWarning)]
    assert len(ours) == 1 and "no longer wait" in ours[0]
    # the application's end waits (bounded) for the backlog: it arrived whole and in order
    assert blocking.methods() == healthy.methods()
    assert threading.get_ident() not in blocking.threads


def test_file_exporter_appends_per_rank_and_keeps_one_loggers_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, telemetry: telemetrain.Telemetry) -> None:
    path = tmp_path / "telemetry.json"
    for attempt in range(2):  # a restarted job appends to the same file: nothing of the first attempt is lost
        TrainingTelemetryProvider.reset()
        p = TrainingTelemetryProvider.instance().with_telemetry(telemetry)
        configure(p, FileExporter(file_path=path), training=training_config())
        with ctx.application(), ctx.training_loop(train_iterations_start=attempt * 10):
            with ctx.checkpoint_save(global_step=attempt):
                pass
    TrainingTelemetryProvider.reset()
    records = _lines(path)
    apps = [r for r in records if r.get("name") == "application" and r["type"] == "start"]
    assert len(apps) == 2
    saves = [r for r in records if r.get("name") == "checkpoint_save_sync"]
    loops = {r["id"] for r in records if r.get("name") == "training_loop"}
    assert saves and all(r["parent_id"] in loops for r in saves if "parent_id" in r)  # the tree can be rebuilt
    first = records[0]
    assert first["type"] == "start" and first["rank"] == 0 and isinstance(first["pid"], int) and first["count"] == 1
    assert [r["type"] for r in records if r.get("name") == "training_loop"] == ["start", "stop", "start", "stop"]
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    assert FileExporter(file_path=path).path == tmp_path / "telemetry.rank2.json"
    assert FileExporter(file_path=tmp_path / "t-{rank}.jsonl").path == tmp_path / "t-2.jsonl"


def test_file_exporter_write_failures_are_counted_not_swallowed(tmp_path: Path) -> None:
    exporter = FileExporter(file_path=tmp_path / "x.json")
    exporter.initialize()
    assert exporter._file is not None
    exporter._file.close()  # the descriptor is gone (a full disk, a vanished mount)
    with pytest.raises(ExportError):
        exporter.export_telemetry_data_error(TelemetryDataError.create(
            TelemetryDataError.ErrorType.NO_TELEMETRY_DATA, "x"))
    exporter.close()


def test_logger_exporter_lines_read_back(provider: TrainingTelemetryProvider, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ol-test")
    configure(provider, LoggerExporter(logger="ol-test"), training=training_config(perf_tag_or_fn="a | b=c"))
    with ctx.application():
        pass
    lines = [r.getMessage() for r in caplog.records if r.name == "ol-test"]
    records = [LoggerExporter.deserialize_log(line) for line in lines]
    update = [r for r in records if r.get("event", {}).get("name") == "update_training_telemetry_config"]
    assert update[0]["event"]["attributes"]["perf_tag"] == "a | b=c"  # one-logger's own reader splits this wrongly
    assert [r["type"] for r in records] == ["start", "event", "event", "stop"]


try:  # an exporter written for one-logger, against its own base class (which enforces @override)
    from nv_one_logger.exporter.exporter import Exporter as OneLoggerExporter
    from overrides import override
except ImportError:  # pragma: no cover - the bench extra installs nv-one-logger
    Theirs: Any = None
else:
    class Theirs(OneLoggerExporter):  # type: ignore[no-redef, misc]
        def __init__(self) -> None:
            self.seen: list[tuple[str, str]] = []

        @override
        def initialize(self) -> None:
            self.seen.append(("initialize", ""))

        @override
        def export_start(self, span: Any) -> None:
            self.seen.append(("start", span.name_str))

        @override
        def export_stop(self, span: Any) -> None:
            self.seen.append(("stop", f"{span.name_str}:{span.attributes['duration_msec'].value >= 0}"))

        @override
        def export_event(self, event: Any, span: Any) -> None:
            self.seen.append(("event", event.name_str))

        @override
        def export_error(self, event: Any, span: Any) -> None:
            self.seen.append(("error", event.error_message))

        @override
        def export_telemetry_data_error(self, error: Any) -> None:
            self.seen.append(("telemetry_data_error", error.error_type.value))

        @override
        def close(self) -> None:
            self.seen.append(("close", ""))


def test_an_exporter_subclassing_one_loggers_own_exporter_class(provider: TrainingTelemetryProvider) -> None:
    if Theirs is None:
        pytest.skip("nv-one-logger-core is not installed (the bench extra installs it)")
    theirs = Theirs()
    configure(provider, theirs, training=training_config())
    with ctx.application(), ctx.training_loop(train_iterations_start=0):
        pass
    assert theirs.seen == [("initialize", ""), ("start", "application"), ("event", "one_logger_initialization"),
                           ("event", "update_training_telemetry_config"), ("start", "training_loop"),
                           ("stop", "training_loop:True"), ("stop", "application:True"), ("close", "")]


def test_otel_exporter_reaches_an_otel_span_exporter_with_the_right_parents(
        provider: TrainingTelemetryProvider, telemetry: telemetrain.Telemetry) -> None:
    in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    spans_out = in_memory.InMemorySpanExporter()
    configure(provider, OTelExporter(spans_out), training=training_config())
    with ctx.application(), ctx.training_loop(train_iterations_start=0):
        with ctx.training_iteration():
            pass
        with ctx.checkpoint_save(global_step=1):
            pass
    assert telemetry.flush()
    finished = {s.name: s for s in spans_out.get_finished_spans()}
    assert {"application", "training_loop", "checkpoint_save_sync"} <= set(finished)
    assert finished["checkpoint_save_sync"].parent.span_id == finished["training_loop"].context.span_id
    assert finished["training_loop"].parent.span_id == finished["application"].context.span_id


def test_exporters_declared_in_a_config_file(provider: TrainingTelemetryProvider, tmp_path: Path) -> None:
    out = tmp_path / "from-config.json"
    config_file = tmp_path / "exporters.json"
    config_file.write_text(json.dumps({"exporters": [
        {"class_name": "nv_one_logger.exporter.file_exporter.FileExporter", "config": {"file_path": str(out)}},
        {"class_name": "no.such.Exporter", "config": {}},
        {"class_name": "telemetrain.training.exporters.LoggerExporter", "config": {"logger": "x"}, "enabled": False},
    ]}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        provider.with_export_config(config_file_path=config_file)
    assert any("no.such.Exporter" in str(w.message) for w in caught)  # a file's bad entry: warned, skipped
    with pytest.raises(ValueError, match=r"no\.such\.Exporter"):  # the same in code: the caller's bug
        provider.with_export_config(exporters_config=[{"class_name": "no.such.Exporter"}])
    configure(provider, training=training_config())
    assert [type(e).__name__ for e in provider.recorder._exporters] == ["FileExporter"]
    with ctx.application():
        pass
    assert [r["type"] for r in _lines(out)] == ["start", "event", "event", "stop"]


def test_callbacks_return_once_their_exports_are_delivered(provider: TrainingTelemetryProvider) -> None:
    exporter = Recording()
    configure(provider, exporter, training=training_config())
    span = cb.on_app_start()
    assert exporter.methods() == ["initialize", "export_start", "export_event", "export_event"]
    assert exporter.calls[1][1][0] is span
    cb.on_app_end()
