"""TensorBoardSink: event files read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import io
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

import telemetrain
from telemetrain.records import StatWindow
from telemetrain.sinks.tensorboard import TensorBoardSink, metric_tag
from telemetrain.store import open_run


def load(directory: Path) -> EventAccumulator:
    ea = EventAccumulator(str(directory), size_guidance={"tensors": 0})  # 0: keep every value
    ea.Reload()
    return ea


def scalars(ea: EventAccumulator) -> dict[str, list[tuple[int, float, float]]]:
    """tag -> [(step, value, wall time)] of every scalar tag."""
    out = {}
    for tag in ea.Tags()["tensors"]:
        if ea.SummaryMetadata(tag).plugin_data.plugin_name == "scalars":
            out[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time) for e in ea.Tensors(tag)]
    return out


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def rank_dir(logdir: Path, t: telemetrain.Telemetry) -> Path:
    return logdir / t.identity.run_id / f"rank{t.identity.rank}"


def test_every_scalar_reads_back_with_its_step_value_and_wall_time(tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    t = telemetrain.Telemetry(store=tmp_path / "store")
    t.add_sink(TensorBoardSink(logdir))
    specials = [float("nan"), float("inf"), float("-inf"), 1e39, -0.0, 3.14159265358979, True, 7, 2**40]
    for i, v in enumerate(specials):
        t.metric("loss", v, step=10 * i)  # group default: tag is the name
    for v in (0.25, 0.5, 0.75):
        t.metric("system.cpu.utilization", v, "system", unit="1")  # no step: 0, 1, 2
        t.metric("hw.gpu.utilization", v / 2, "system.gpu.0", unit="1")
    t.metric("train.mfu", 0.41, "training", step=99)
    mono, wall = t.now()
    for n in range(2):
        t.emit(StatWindow(mono + n, wall + n, t.identity, "default", "latency", mono - 10, 5,
                          {"mean": 1.5 + n, "p99": float("inf") if n else 2.5, "count": 5}, "s"))
    t.event("training_metrics_update", {"current_iteration": 49, "num_iterations": 50, "mfu": 0.38,
                                        "samples_per_second": float("nan"), "final": True, "peak_source": "table"},
            group="training")
    t.event("training_metrics_update", {"current_iteration": 99, "num_iterations": 100, "mfu": 0.4},
            group="training")
    t.event("unrelated", {"x": 1.0})  # only the two training events become scalars
    t.close()

    got = scalars(load(rank_dir(logdir, t)))
    records = open_run(t.run_dir).records()
    want: dict[str, list[tuple[int, float, float]]] = {}
    counters: dict[str, int] = {}
    for r in records:
        wall_s = r.wall_ns / 1e9
        if r.kind == "metric":
            tag = metric_tag(r.group, r.name)
            step = r.step if r.step is not None else counters.setdefault(tag, 0)
            if r.step is None:
                counters[tag] += 1
            with np.errstate(over="ignore"):  # 1e39 -> inf, as TensorBoard stores it
                want.setdefault(tag, []).append((step, float(np.float32(r.value)), wall_s))
        elif r.kind == "stat":
            n = counters.setdefault("latency", 0)
            counters["latency"] += 1
            for agg, v in r.values.items():
                want.setdefault(f"latency/{agg}", []).append((n, float(v), wall_s))
        elif r.kind == "event" and r.name == "training_metrics_update":
            a = r.attributes
            for k in ("current_iteration", "num_iterations", "mfu", "samples_per_second"):
                if k in a:
                    want.setdefault(f"training_metrics_update/{k}", []).append(
                        (a["current_iteration"], float(np.float32(a[k])), wall_s))
    assert sorted(got) == sorted(want)
    for tag, points in want.items():
        assert len(got[tag]) == len(points), tag
        for (gs, gv, gw), (ws, wv, ww) in zip(got[tag], points, strict=True):
            assert gs == ws and same(gv, wv) and gw == pytest.approx(ww, abs=1e-6), (tag, (gs, gv, gw), (ws, wv, ww))
    loss = [v for _, v, _ in got["loss"]]
    assert math.isnan(loss[0]) and loss[1:4] == [math.inf, -math.inf, math.inf]  # 1e39: past float32's range
    assert [s for s, _, _ in got["system/system.cpu.utilization"]] == [0, 1, 2]
    assert [v for _, v, _ in got["system/gpu.0/hw.gpu.utilization"]] == [0.125, 0.25, 0.375]
    assert got["training_metrics_update/mfu"][1][:2] == (99, pytest.approx(0.4))


def test_identity_and_training_config_as_text_and_hparams(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=False)
    t.add_sink(TensorBoardSink(tmp_path))
    t.event("update_training_telemetry_config", {"global_batch_size": 256, "perf_tag": "a|b<script>"},
            group="training")
    t.close()
    ea = load(rank_dir(tmp_path, t))
    (ident,) = ea.Tensors("run/identity")
    text = tensor_util.make_ndarray(ident.tensor_proto).item().decode()
    assert t.identity.run_id.replace("_", "\\_") in text and "| rank | 0 |" in text
    (config,) = ea.Tensors("run/training_config")
    text = tensor_util.make_ndarray(config.tensor_proto).item().decode()
    assert "| global\\_batch\\_size | 256 |" in text and "a\\|b\\<script\\>" in text  # escaped, one table cell
    content = ea.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert start.hparams["run_id"].string_value == t.identity.run_id
    assert start.hparams["world_size"].number_value == 1


def test_flush_makes_the_data_visible(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=False)
    t.add_sink(TensorBoardSink(tmp_path, run_subdirs=False))
    try:
        t.metric("a", 1.0, step=1)
        assert t.flush()
        assert scalars(load(tmp_path))["a"][0][:2] == (1, 1.0)
        t.metric("a", 2.0, step=2)
        assert t.flush()
        assert [p[:2] for p in scalars(load(tmp_path))["a"]] == [(1, 1.0), (2, 2.0)]
    finally:
        t.close()


def test_an_unwritable_logdir_is_contained_and_counted(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the log directory should be")  # fails even for root, unlike a chmod
    t = telemetrain.Telemetry(store=tmp_path / "store")
    t.add_sink(TensorBoardSink(blocker / "tb"))
    with pytest.warns(telemetrain.TelemetryWarning, match="sink 'tensorboard' failed"):
        for i in range(3):
            t.metric("loss", float(i), step=i)  # never raises into the caller
        assert t.flush()
    (tb,) = [s for s in t.health()["sinks"] if s["sink"] == "tensorboard"]
    assert tb["failed"] == 3 and tb["failures"] >= 1 and tb["delivered"] == 0
    assert "NotADirectoryError" in tb["last_error"] or "FileExistsError" in tb["last_error"]
    t.close()
    records = open_run(t.run_dir).records()
    assert [r.value for r in records if r.kind == "metric"] == [0.0, 1.0, 2.0]  # the run store got everything
    assert any(r.kind == "diagnostic" and r.name == "sink_error" and r.sink == "tensorboard" for r in records)


def test_two_processes_of_a_run_get_their_own_directories(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=False)
    sink = TensorBoardSink(tmp_path)
    t.add_sink(sink)
    t.metric("x", 1.0, step=0)
    t.set_identity(rank=1, world_size=2)
    t.metric("x", 2.0, step=0)
    t.close()
    run = tmp_path / t.identity.run_id
    assert sorted(p.name for p in run.iterdir()) == ["rank0", "rank1"]
    assert scalars(load(run / "rank0"))["x"][0][1] == 1.0 and scalars(load(run / "rank1"))["x"][0][1] == 2.0


def test_records_are_framed_byte_for_byte_as_tensorboards_record_writer() -> None:
    from tensorboard.summary.writer.record_writer import RecordWriter

    from telemetrain.sinks import tensorboard as tb

    assert tb.masked_crc32c is tb._fast_masked_crc32c  # the C CRC is installed with the test extra
    for data in (b"", b"x", bytes(range(256)) * 7, np.random.default_rng(1).bytes(4099)):
        out = io.BytesIO()
        RecordWriter(out).write(data)
        assert tb.tfrecord(data) == out.getvalue()


def test_importing_without_tensorboard_names_the_extra() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["tensorboard"] = None  # as if the [tensorboard] extra were not installed
        try:
            import telemetrain.sinks.tensorboard
        except ImportError as exc:
            print(exc)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'telemetrain[tensorboard]'" in proc.stdout
