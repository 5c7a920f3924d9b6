"""TensorBoardSink: event files read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import io
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing import event_accumulator  # type: ignore[import-untyped]
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator  # type: ignore[import-untyped]
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2  # type: ignore[import-untyped]
from tensorboard.util import tensor_util  # type: ignore[import-untyped]

import telemetrain
from conftest import run_dir_of
from telemetrain.hparams import log_hyperparams
from telemetrain.records import StatWindow
from telemetrain.semconv import series_key
from telemetrain.sinks.tensorboard import TensorBoardSink, metric_tag
from telemetrain.store import open_run


def load(directory: Path) -> EventAccumulator:
    ea = EventAccumulator(str(directory), size_guidance={"tensors": 0})  # 0: keep every value
    ea.Reload()
    return ea


def scalars(directory: Path) -> dict[str, list[tuple[int, float, float]]]:
    """tag -> [(step, value, wall time)] of every scalar, read as scripts read them: the classic EventAccumulator's
    ``Scalars()`` (torch's SummaryWriter writes ``simple_value``; so does the sink)."""
    ea = event_accumulator.EventAccumulator(str(directory), size_guidance={event_accumulator.SCALARS: 0})
    ea.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def hparams_dashboard(logdir: Path) -> list[Any]:
    """The session groups TensorBoard's HParams dashboard shows for ``logdir``: the plugin's own request handlers
    (GetExperiment, then ListSessionGroups with every hparam and metric as a column) over a data provider."""
    from tensorboard import context  # type: ignore[import-untyped]
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin  # type: ignore[import-untyped]
    from tensorboard.plugins.hparams import backend_context, get_experiment, list_session_groups

    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    backend = backend_context.Context(base_plugin.TBContext(logdir=str(logdir), multiplexer=mux,
                                                            data_provider=provider))
    request_context = context.RequestContext()
    experiment = get_experiment.Handler(request_context, backend, "",
                                        api_pb2.GetExperimentRequest(include_metrics=True)).run()
    request = api_pb2.ListSessionGroupsRequest(start_index=0, slice_size=100, allowed_statuses=[
        api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE, api_pb2.STATUS_RUNNING])
    for info in experiment.metric_infos:
        request.col_params.add(metric=info.name)
    for hparam in experiment.hparam_infos:
        request.col_params.add(hparam=hparam.name)
    return list(list_session_groups.Handler(request_context, backend, "", request).run().session_groups)


def session_start(directory: Path) -> Any:
    content = load(directory).PluginTagToContent("hparams")["_hparams_/session_start_info"]
    return plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info


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
        t.metric("system.cpu.utilization", v, "system", unit="1")  # no step: at the global step (80)
        t.metric("hw.gpu.utilization", v / 2, "system.gpu.0", unit="1", attributes={"hw.id": "0", "hw.type": "gpu"})
    for direction, value in (("read", 10), ("write", 30)):  # one series (tag) per attribute value
        t.metric("system.disk.io", value, "system", unit="By", attributes={"disk.io.direction": direction})
    t.metric("train.mfu", 0.41, "training", step=99)
    t.metric("train.phase.duration", 0.02, "training", unit="s", step=99, attributes={"train.phase": "forward"})
    t.log({"val_loss": 0.5, "val_acc": 0.8})  # no step: the global step
    mono, wall = t.now()
    for n in range(2):
        t.emit(StatWindow(mono + n, wall + n, t.identity, "default", "latency", mono - 10, 5,
                          {"mean": 1.5 + n, "p99": float("inf") if n else 2.5, "count": 5}, "s"))
    t.event("training_metrics_update", {"current_iteration": 149, "num_iterations": 150, "mfu": 0.38}, group="training")
    t.metric("system.cpu.utilization", 0.5, "system", unit="1")  # after the report: at its iteration
    t.event("unrelated", {"x": 1.0})
    t.close()

    got = scalars(rank_dir(logdir, t))
    records = open_run(run_dir_of(t)).records()
    want: dict[str, list[tuple[int, float, float]]] = {}
    global_step = 0
    for r in records:
        wall_s = r.wall_ns / 1e9
        if r.kind == "metric":
            global_step = max(global_step, r.step if r.step is not None else 0)
            tag = metric_tag(r.group, series_key(r.name, r.attributes))
            step = r.step if r.step is not None else global_step
            with np.errstate(over="ignore"):  # 1e39 -> inf, as TensorBoard stores it
                want.setdefault(tag, []).append((step, float(np.float32(r.value)), wall_s))
        elif r.kind == "stat":
            for agg, v in r.values.items():
                want.setdefault(f"latency/{agg}", []).append((global_step, float(np.float32(v)), wall_s))
        elif r.kind == "event" and r.name == "training_metrics_update":
            global_step = max(global_step, r.attributes["current_iteration"])
    assert sorted(got) == sorted(want)
    for tag, points in want.items():
        assert len(got[tag]) == len(points), tag
        for (gs, gv, gw), (ws, wv, ww) in zip(got[tag], points, strict=True):
            assert gs == ws and same(gv, wv) and gw == pytest.approx(ww, abs=1e-6), (tag, (gs, gv, gw), (ws, wv, ww))
    loss = [v for _, v, _ in got["loss"]]
    assert math.isnan(loss[0]) and loss[1:4] == [math.inf, -math.inf, math.inf]  # 1e39: past float32's range
    assert [s for s, _, _ in got["system/system.cpu.utilization"]] == [80, 80, 80, 149]  # the global step
    assert [v for _, v, _ in got["system/gpu.0/hw.gpu.utilization"]] == [0.125, 0.25, 0.375]
    assert [v for _, v, _ in got["system/system.disk.io.read"]] == [10] and "system/system.disk.io" not in got
    assert got["training/train.phase.duration/forward"][0][:2] == (99, pytest.approx(0.02))  # type: ignore[comparison-overlap]
    assert got["val_loss"][0][:2] == (99, 0.5) and [s for s, _, _ in got["latency/mean"]] == [99, 99]
    assert not any(tag.startswith("training_metrics_update/") for tag in got)  # one tag per series: no copies


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
    start = session_start(rank_dir(tmp_path, t))
    assert start.hparams["identity.run_id"].string_value == t.identity.run_id
    assert start.hparams["identity.world_size"].number_value == 1
    assert start.hparams["config.global_batch_size"].number_value == 256


def test_the_runs_config_and_hyperparameters_are_hparams_with_the_final_metrics(tmp_path: Path) -> None:
    """The run's config, the training config and logged hyperparameters in one session start (written at the first
    record with a step, so the hyperparameters a job logs before training are in it), the final value of each metric
    beside it, and a session end."""
    config = {"lr": 3e-4, "model": {"layers": 12, "act": "gelu"}, "amp": True, "eps": float("nan")}
    t = telemetrain.Telemetry(store=False, config=config)
    t.add_sink(TensorBoardSink(tmp_path))
    t.metric("system.cpu.utilization", 0.5, "system", unit="1")  # no step: does not start the session
    log_hyperparams({"batch_size": 32, "optimizer": {"name": "adamw", "betas": [0.9, 0.95]}}, telemetry=t)
    for step in range(3):
        t.log({"loss": 1.0 / (step + 1), "acc": 0.5 + step / 10}, step=step)
    log_hyperparams({"late": 1}, telemetry=t)  # after the session start: in the run/hparams text
    t.close()
    directory = rank_dir(tmp_path, t)
    hparams = session_start(directory).hparams
    assert hparams["lr"].number_value == pytest.approx(3e-4) and hparams["model.layers"].number_value == 12
    assert hparams["model.act"].string_value == "gelu" and hparams["amp"].bool_value is True
    assert hparams["eps"].string_value == "nan"  # HParams take no NaN
    assert hparams["batch_size"].number_value == 32 and hparams["optimizer.name"].string_value == "adamw"
    assert hparams["optimizer.betas"].string_value == "[0.9, 0.95]"
    assert "late" not in hparams
    ea = load(directory)
    end_content = ea.PluginTagToContent("hparams")["_hparams_/session_end_info"]
    end = plugin_data_pb2.HParamsPluginData.FromString(end_content).session_end_info
    assert end.status == api_pb2.STATUS_SUCCESS
    texts = [tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in ea.Tensors("run/hparams")]
    assert "| late | 1 |" in texts[-1]
    # what the HParams dashboard shows: the session, its hyperparameters and the final value of each metric
    (group,) = hparams_dashboard(tmp_path)
    assert group.hparams["lr"].number_value == pytest.approx(3e-4) and group.hparams["batch_size"].number_value == 32
    final = {m.name.tag: (m.training_step, m.value) for m in group.metric_values}
    assert final["loss"] == (2, pytest.approx(1 / 3)) and final["acc"] == (2, pytest.approx(0.7))
    assert [session.status for session in group.sessions] == [api_pb2.STATUS_SUCCESS]


def test_flush_makes_the_data_visible(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=False)
    t.add_sink(TensorBoardSink(tmp_path, run_subdirs=False))
    try:
        t.metric("a", 1.0, step=1)
        assert t.flush()
        assert scalars(tmp_path)["a"][0][:2] == (1, 1.0)
        t.metric("a", 2.0, step=2)
        assert t.flush()
        assert [p[:2] for p in scalars(tmp_path)["a"]] == [(1, 1.0), (2, 2.0)]
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
    records = open_run(run_dir_of(t)).records()
    assert [r.value for r in records if r.kind == "metric"] == [0.0, 1.0, 2.0]  # the run store got everything
    assert any(r.kind == "diagnostic" and r.name == "sink_error" and r.sink == "tensorboard" for r in records)


def test_a_torn_write_does_not_hide_the_records_after_it(tmp_path: Path) -> None:
    # A file size limit (as a full disk would) lets only part of a batch reach the file: that batch fails, and its
    # torn record is cut off again, so TensorBoard still reads what is written once there is room (it stopped at the
    # torn record before). In a subprocess: the limit is the process's.
    code = textwrap.dedent(f"""
        import glob, os, resource, signal
        import telemetrain
        from telemetrain.sinks.tensorboard import TensorBoardSink
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        t = telemetrain.Telemetry(store=False)
        t.add_sink(TensorBoardSink({str(tmp_path)!r}, run_subdirs=False))
        t.metric("a", 1.0, step=1)
        assert t.flush()
        size = os.path.getsize(glob.glob({str(tmp_path)!r} + "/events*")[0])
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 20, hard))  # room for part of the next batch
        for step in range(2, 5):
            t.metric("a", float(step), step=step)
        t.flush()
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        for step in range(5, 8):
            t.metric("a", float(step), step=step)
        t.close()
        (tb,) = [s for s in t.health()["sinks"] if s["sink"] == "tensorboard"]
        print(tb["failures"], tb["delivered"])
    """)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    failures, delivered = map(int, out.stdout.split())
    assert failures >= 1 and delivered == 4  # the torn batch failed (steps 2-4), the others were delivered
    assert [p[:2] for p in scalars(tmp_path)["a"]] == [(1, 1.0), (5, 5.0), (6, 6.0), (7, 7.0)]


def test_two_processes_of_a_run_get_their_own_directories(tmp_path: Path) -> None:
    t = telemetrain.Telemetry(store=False)
    sink = TensorBoardSink(tmp_path)
    t.add_sink(sink, ranks="all")  # (by default rank 1 would detach it: the sink is rank 0's only)
    t.metric("x", 1.0, step=0)
    t.set_identity(rank=1, world_size=2)
    t.metric("x", 2.0, step=0)
    t.close()
    run = tmp_path / t.identity.run_id
    assert sorted(p.name for p in run.iterdir()) == ["rank0", "rank1"]
    assert scalars(run / "rank0")["x"][0][1] == 1.0 and scalars(run / "rank1")["x"][0][1] == 2.0


def test_an_identity_set_after_start_keeps_its_file_and_shows_in_the_hparams(tmp_path: Path) -> None:
    """Rank 0 learns the world size once the process group is up (``set_identity``): still one event file (one
    session start, which TensorBoard would otherwise take from the first, stale, file), the world size the
    HParams show is the new one, and a record without a step stays on the global step."""
    t = telemetrain.Telemetry(store=False)
    t.add_sink(TensorBoardSink(tmp_path))
    t.metric("system.cpu.utilization", 0.5, "system", unit="1")  # before the process group: world size 1
    assert t.flush()
    t.set_identity(world_size=2)
    for step in range(3):
        t.metric("loss", 1.0 / (step + 1), step=step)
    t.metric("system.cpu.utilization", 0.25, "system", unit="1")
    assert t.flush()
    t.set_identity(world_size=4)  # after the session start: in the texts
    t.metric("system.cpu.utilization", 0.75, "system", unit="1")
    t.close()
    directory = rank_dir(tmp_path, t)
    assert len(list(directory.iterdir())) == 1
    assert session_start(directory).hparams["identity.world_size"].number_value == 2
    cpu = scalars(directory)["system/system.cpu.utilization"]
    assert [(step, value) for step, value, _ in cpu] == [(0, 0.5), (2, 0.25), (2, 0.75)]
    ea = load(directory)
    identities = [tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in ea.Tensors("run/identity")]
    assert "| world\\_size | 4 |" in identities[-1]
    texts = [tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in ea.Tensors("run/hparams")]
    assert "| identity.world\\_size | 4 |" in texts[-1]


def test_records_are_framed_byte_for_byte_as_tensorboards_record_writer() -> None:
    from tensorboard.summary.writer.record_writer import RecordWriter  # type: ignore[import-untyped]

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
