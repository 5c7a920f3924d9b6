"""Metric attributes (format v2), ``log(dict, step=)``, hyperparameters, and the old format still read.

``data/v1_store`` is a run written by the format-v1 code (before metric attributes): the system sampler's direction
in the name (``system.disk.io.read``), ``process.open_file_descriptor.count``, the derived metrics' old names.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from telemetrain import cli
from telemetrain.hparams import flatten, log_hyperparams
from telemetrain.records import MetricPoint, pack, unpack
from telemetrain.semconv import SYSTEM_SERIES, series_key
from telemetrain.store import open_run

V1_STORE = Path(__file__).parent / "data" / "v1_store"


def _records(t: telemetrain.Telemetry, kind: str = "metric") -> list[Any]:
    assert t.flush() and t.run_dir is not None
    return list(open_run(t.run_dir).records(kind))


@pytest.fixture
def t(tmp_path: Path) -> Any:
    telemetry = telemetrain.Telemetry(store=tmp_path / "runs")
    yield telemetry
    telemetry.close()


# -- the record ------------------------------------------------------------------------------------------------------


def test_attributes_travel_packed_flat_and_reach_the_store(t: telemetrain.Telemetry) -> None:
    t.metric("system.disk.io", 4096, "system", unit="By", attributes={"disk.io.direction": "read"})
    t.metric("labelled", math.nan, attributes={"n": 2, "x": 1.5, "flag": True, "text": "NaN"})
    t.metric("plain", 1.0)
    t.metric("plain", 2.0, step=3)
    (disk, labelled, plain, stepped) = _records(t)
    assert (disk.value, disk.unit, disk.step, disk.attributes) == (4096, "By", None, {"disk.io.direction": "read"})
    assert math.isnan(labelled.value) and labelled.attributes == {"n": 2, "x": 1.5, "flag": True, "text": "NaN"}
    assert plain.attributes is None and stepped.attributes is None and stepped.step == 3
    # packed: one flat tuple of atomics (the GC untracks it), keys then values at the end; the short forms unchanged
    record = MetricPoint(1, 2, t.identity, "g", "m", 1.0, "s", 4, {"a": "x", "b": 2})
    packed = pack(record, 7)
    assert packed[5:] == (1.0, "s", 4, "a", "b", "x", 2)
    assert unpack(packed, t.identity, 0)[5:] == (1.0, "s", 4, {"a": "x", "b": 2})
    assert pack(MetricPoint(1, 2, t.identity, "g", "m", 1.0), 7)[5:] == (1.0, "", None)
    assert unpack(("metric", 1, 7, "g", "m", 1.0), t.identity, 0).attributes is None
    built = ("metric", 1, 7, "g", "m", 1.0, "", None, "k", "v")
    gc.collect()
    assert not gc.is_tracked(built)


def test_attributes_the_caller_gets_wrong_raise_naming_the_argument(t: telemetrain.Telemetry) -> None:
    with pytest.raises(TypeError, match="attributes must be a mapping"):
        t.metric("m", 1.0, attributes=[("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"attributes\['a'\] must be a str, int, float or bool"):
        t.metric("m", 1.0, attributes={"a": [1, 2]})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="attributes keys must be non-empty str"):
        t.metric("m", 1.0, attributes={1: "x"})  # type: ignore[dict-item]
    t.metric("m", 1.0, attributes={})  # empty: no attributes
    assert [r.attributes for r in _records(t)] == [None]  # nothing else was recorded


def test_attributes_are_copied(t: telemetrain.Telemetry) -> None:
    attributes = {"phase": "forward"}
    t.metric("m", 1.0, attributes=attributes)
    attributes["phase"] = "backward"
    assert _records(t)[0].attributes == {"phase": "forward"}


# -- log(dict, step=) ------------------------------------------------------------------------------------------------


def test_log_records_a_dict_at_one_step_and_time(t: telemetrain.Telemetry) -> None:
    t.log({"loss": 0.31, "lr": 3e-4, "tokens": 4096}, step=120)
    t.log({"val/acc": 0.9}, group="eval", unit="1", attributes={"split": "val"})
    loss, lr, tokens, acc = _records(t)
    assert [(r.name, r.value, r.step) for r in (loss, lr, tokens)] == [("loss", 0.31, 120), ("lr", 3e-4, 120),
                                                                        ("tokens", 4096, 120)]
    assert loss.mono_ns == lr.mono_ns == tokens.mono_ns and loss.group == "default"
    assert (acc.group, acc.unit, acc.step, acc.attributes) == ("eval", "1", None, {"split": "val"})


def test_log_refuses_a_tensor_with_the_hint_and_records_nothing(t: telemetrain.Telemetry) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"metrics\['loss'\] must be an int or float.*tensor\.item\(\) yourself"):
        t.log({"lr": 0.1, "loss": torch.tensor(0.5)}, step=1)
    with pytest.raises(TypeError, match="metrics must be a mapping"):
        t.log([("loss", 0.5)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="step must be an int"):
        t.log({"loss": 0.5}, step="one")  # type: ignore[arg-type]
    t.log({"ok": 1.0})
    assert [r.name for r in _records(t)] == ["ok"]  # the bad calls recorded nothing, not even their good values


def test_module_level_log_uses_the_default_instance(tmp_path: Path) -> None:
    telemetrain.set_telemetry(telemetrain.Telemetry(store=tmp_path))
    try:
        telemetrain.log({"loss": 0.5}, step=2)
        telemetrain.metric("io", 1, attributes={"disk.io.direction": "write"})
        t = telemetrain.get_telemetry()
        loss, io = _records(t)
        assert (loss.name, loss.step) == ("loss", 2) and io.attributes == {"disk.io.direction": "write"}
    finally:
        telemetrain.reset()


# -- hyperparameters ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Optim:
    name: str = "adamw"
    betas: tuple[float, float] = (0.9, 0.95)


def test_flatten_hyperparameters() -> None:
    params = {"lr": 3e-4, "model": {"layers": 12, "norm": None}, "optim": _Optim(), "args": argparse.Namespace(seed=1),
              "empty": {}}
    assert flatten(params) == {"lr": 3e-4, "model.layers": 12, "model.norm": "None", "optim.name": "adamw",
                               "optim.betas": "(0.9, 0.95)", "args.seed": 1, "empty": "{}"}
    with pytest.raises(TypeError, match="hyperparameters must be a mapping"):
        flatten([1, 2])


def test_log_hyperparams_is_an_event_of_group_run(t: telemetrain.Telemetry) -> None:
    assert log_hyperparams({"model": {"layers": 2}}, t) == {"model.layers": 2}
    (event,) = _records(t, "event")
    assert (event.group, event.name, event.attributes) == ("run", "hyperparameters", {"model.layers": 2})


def test_the_runs_config_is_handed_to_every_sink(tmp_path: Path) -> None:
    from telemetrain.sinks.null import NullSink

    with telemetrain.Telemetry(store=False, config={"lr": 0.1, "model": {"layers": 2}}) as t:
        sink = NullSink()
        t.add_sink(sink)
        assert sink.run_config == {"lr": 0.1, "model.layers": 2}
    with telemetrain.Telemetry(store=False) as t:
        sink = NullSink()
        t.add_sink(sink)
        assert sink.run_config is None


# -- the old format ----------------------------------------------------------------------------------------------------


@pytest.fixture
def v1_run(tmp_path: Path) -> Path:
    shutil.copytree(V1_STORE, tmp_path / "store")
    return tmp_path / "store" / "v1-session" / "v1-run"


def test_a_format_v1_run_still_reads_and_its_series_keep_their_keys(v1_run: Path, t: telemetrain.Telemetry) -> None:
    run = open_run(v1_run)
    assert run.processes[0].corrupt == 0 and run.processes[0].torn == 0
    old = {r.name: r for r in run.records("metric")}
    assert {"system.disk.io.read", "system.disk.io.write", "process.open_file_descriptor.count",
            "train.tflops_per_gpu", "train.phase.forward"} <= set(old)
    assert all(r.attributes is None for r in old.values())
    # a v2 record of each series gets the key the v1 record has
    for key, (name, attributes) in SYSTEM_SERIES.items():
        assert series_key(name, attributes) == key
        assert series_key(key, None) == key  # the v1 record
        assert series_key(name, {**attributes, "hw.id": "0", "hw.type": "gpu"}) == key  # the device is the group's
    assert series_key("process.open_file_descriptor.count", None) == "process.unix.file_descriptor.count"
    assert series_key("train.phase.duration", {"train.phase": "forward"}) == "train.phase.duration/forward"
    assert series_key("loss", None) == "loss"


def test_show_reads_the_system_rows_of_a_v1_and_a_v2_run_alike(v1_run: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("psutil")
    from telemetrain.system import Sampler

    assert cli.main(["show", str(v1_run)]) == 0
    old = capsys.readouterr().out
    with telemetrain.Telemetry(store=tmp_path / "v2") as t:
        sampler = Sampler(t, interval=60, host=True, disk_paths=["/"])
        sampler.sample_now()
        sampler.sample_now()
        sampler.stop()
        run_dir = t.run_dir
    assert cli.main(["show", str(run_dir)]) == 0
    new = capsys.readouterr().out
    for out in (old, new):
        (io,) = [line for line in out.splitlines() if " i/o " in line]
        assert "disk read" in io and "network receive" in io
        assert any(" memory " in line and " of " in line for line in out.splitlines())


def test_the_report_of_a_v1_run(v1_run: Path, tmp_path: Path) -> None:
    from telemetrain.report import write_report
    from telemetrain.report.model import build_model

    model = build_model(open_run(v1_run))
    assert ("system", "system.disk.io.read") in model.metric_stats
    assert model.training_config.get("global_batch_size") == 2
    html = write_report(v1_run, tmp_path / "report.html").read_text()
    assert "system.disk.io.read" in html and "lr" in html


def test_the_console_shows_a_metrics_labels(t: telemetrain.Telemetry) -> None:
    from telemetrain.sinks.console import format_record

    record = MetricPoint(1, 2, t.identity, "system", "system.disk.io", 10, "By", None, {"disk.io.direction": "read"})
    assert format_record(record) == ("metric", "system/system.disk.io = 10 By disk.io.direction=read")
