"""The three integration styles of one-logger's README -- context managers, callbacks, the core API with
``timed_span`` and a custom event -- and the shape of its example program (a small torch model trained for a few
epochs with sub-phase spans and checkpoint saves), written here against telemetrain's modules. Each lands in the
exporter's file in one-logger's record format, in telemetrain's run store, and in ``telemetrain report``'s model.
(one-logger's own ``docs/example.py`` runs unchanged but for its imports in the peer-test scratch run.)"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from _onelogger import base_config, provider_fixture, training_config  # noqa: F401
from conftest import run_dir_of
from telemetrain.report.model import build_model
from telemetrain.store import open_run
from telemetrain.training import callbacks as cb
from telemetrain.training import context as ctx
from telemetrain.training.attributes import Attributes
from telemetrain.training.checkpoint import CheckPointStrategy
from telemetrain.training.default_recorder import ExportCustomizationMode
from telemetrain.training.events import Event
from telemetrain.training.exporters import FileExporter
from telemetrain.training.spans import StandardTrainingJobSpanName
from telemetrain.training.timed_span import timed_span
from telemetrain.training.training_telemetry_provider import TrainingTelemetryProvider


def _file(path: Path) -> Counter[tuple[str, str]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return Counter((r["type"], r.get("name") or r.get("event", {}).get("name", "")) for r in records)


def _store(t: telemetrain.Telemetry) -> tuple[Counter[tuple[str, str]], Any]:
    assert t.flush()
    run = open_run(run_dir_of(t))
    return Counter((r.kind, r.name) for r in run.records()), build_model(run)


def test_context_manager_flow(provider: TrainingTelemetryProvider, telemetry: telemetrain.Telemetry,
                              tmp_path: Path) -> None:
    out = tmp_path / "training_telemetry.json"
    provider.with_base_config(base_config()).with_exporter(FileExporter(file_path=out)).configure_provider()

    @ctx.application()
    def main() -> None:
        TrainingTelemetryProvider.instance().set_training_telemetry_config(training_config())
        with ctx.training_loop(train_iterations_start=0):
            for _epoch in range(3):
                for _batch in range(10):
                    with ctx.training_iteration():
                        pass

    main()
    exported = _file(out)
    assert exported[("start", "application")] == 1 and exported[("stop", "application")] == 1
    assert exported[("event", "training_metrics_update")] == 3 and exported[("stop", "training_loop")] == 1
    stored, model = _store(telemetry)
    assert stored[("event", "training_metrics_update")] >= 3 and stored[("span_end", "training_loop")] == 1
    assert model is not None


def test_callback_flow(provider: TrainingTelemetryProvider, telemetry: telemetrain.Telemetry, tmp_path: Path) -> None:
    out = tmp_path / "training_telemetry.json"
    provider.with_base_config(base_config()).with_exporter(FileExporter(file_path=out)).configure_provider()
    cb.on_app_start()
    TrainingTelemetryProvider.instance().set_training_telemetry_config(training_config())
    cb.on_train_start(train_iterations_start=0)
    for step in range(20):
        cb.on_training_single_iteration_start()
        cb.on_training_single_iteration_end()
        if step % 10 == 9:
            cb.on_save_checkpoint_start(global_step=step)
            cb.on_save_checkpoint_success(global_step=step)
            cb.on_save_checkpoint_end()
    cb.on_train_end()
    cb.on_app_end()
    exported = _file(out)
    assert exported[("event", "save_checkpoint_success")] == 2 and exported[("stop", "checkpoint_save_sync")] == 2
    stored, _ = _store(telemetry)
    assert stored[("event", "save_checkpoint_success")] == 2 and stored[("span_end", "checkpoint_save_sync")] == 2


def test_core_api_flow_with_timed_span_and_a_custom_event(provider: TrainingTelemetryProvider,
                                                          telemetry: telemetrain.Telemetry, tmp_path: Path) -> None:
    out = tmp_path / "training_telemetry.json"
    (provider.with_base_config(base_config()).with_exporter(FileExporter(file_path=out))
     .with_export_customization(ExportCustomizationMode.BLACKLIST_SPANS, ["training_single_iteration"])
     .configure_provider())
    with ctx.application():
        TrainingTelemetryProvider.instance().set_training_telemetry_config(training_config())
        with ctx.training_loop(train_iterations_start=0) as training_span:
            training_span.add_attribute("my_custom_attribute", "my_custom_value")
            with timed_span("my_custom_span", span_attributes=Attributes({"my_custom_attribute": "v"})) as span:
                TrainingTelemetryProvider.instance().recorder.event(span, Event.create("my_event"))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    loop = next(r for r in records if r.get("name") == "training_loop" and r["type"] == "stop")
    assert loop["attributes"]["my_custom_attribute"] == "my_custom_value"
    custom = next(r for r in records if r.get("name") == "my_custom_span")
    assert custom["parent_id"] == loop["id"]
    assert any(r["type"] == "event" and r["event"]["name"] == "my_event" and r["span_id"] == custom["id"]
               for r in records)
    stored, _ = _store(telemetry)
    assert stored[("event", "my_event")] == 1 and stored[("span_end", "my_custom_span")] == 1


def test_the_example_programs_shape_with_torch(provider: TrainingTelemetryProvider, telemetry: telemetrain.Telemetry,
                                               tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    out = tmp_path / "training_telemetry.json"
    provider.with_base_config(base_config(world_size_or_fn=5)).with_exporter(FileExporter(file_path=out))
    provider.configure_provider()
    config = training_config(save_checkpoint_strategy=CheckPointStrategy.SYNC)
    torch.manual_seed(0)
    x = torch.randn(64, 10)
    y = (x.sum(dim=1) > 0).float()
    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1), torch.nn.Sigmoid())
    optimizer = torch.optim.Adam(model.parameters())
    loss_fn = torch.nn.BCELoss()

    @ctx.application()
    def main() -> None:
        TrainingTelemetryProvider.instance().set_training_telemetry_config(config)
        with ctx.training_loop(train_iterations_start=0) as training_span:
            training_span.add_attribute("my_custom_attribute", "my_custom_value")
            step = 0
            for epoch in range(4):
                for start in range(0, 64, 16):
                    with ctx.training_iteration():
                        with timed_span(StandardTrainingJobSpanName.MODEL_FORWARD):
                            outputs = model(x[start:start + 16])
                            with timed_span("loss_calculation_span",
                                            span_attributes=Attributes({"my_custom_attribute": "v"})):
                                loss = loss_fn(outputs.squeeze(), y[start:start + 16])
                        with timed_span(StandardTrainingJobSpanName.ZERO_GRAD):
                            optimizer.zero_grad()
                        with timed_span(StandardTrainingJobSpanName.MODEL_BACKWARD):
                            loss.backward()
                        with timed_span(StandardTrainingJobSpanName.OPTIMIZER_UPDATE):
                            optimizer.step()
                        step += 1
                if epoch % 2 == 0:
                    with ctx.checkpoint_save(global_step=step):
                        torch.save(model.state_dict(), tmp_path / f"checkpoint_{step}.pt")

    main()
    exported = _file(out)
    assert exported[("complete", "loss_calculation_span")] == 16  # every iteration's custom span, re-parented
    assert exported[("event", "training_metrics_update")] == 1 and exported[("stop", "checkpoint_save_sync")] == 2
    assert not any(name in {"model_forward", "training_single_iteration"} for _, name in exported)  # blacklisted
    stored, model_view = _store(telemetry)
    assert stored[("event", "save_checkpoint_success")] == 2
    assert stored[("span_end", "model_backward")] >= 1  # the phase split has its spans (sampled iterations)
    assert model_view is not None
