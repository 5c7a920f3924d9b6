"""The ``telemetrain`` command: --version, demo (a real short training run) and show."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import telemetrain
from conftest import write_odd_run
from telemetrain import cli
from telemetrain.store import open_run
from telemetrain.store.reader import find_runs


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "telemetrain.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _printed_run_dir(stdout: str) -> Path:
    lines = [line for line in stdout.splitlines() if line.startswith("run: ")]
    assert len(lines) == 1, stdout
    return Path(lines[0][len("run: ") :])


def _synthetic_run(root: Path, run_id: str, **metrics: float) -> Path:
    """A run written through the public API, without torch."""
    identity = telemetrain.identity_from_env({}, run_id=run_id, session_tag="synthetic", perf_tag="test")
    with telemetrain.Telemetry(identity, store=root, config={"lr": 0.5, "bad": math.nan}) as t:
        for name, value in metrics.items():
            t.metric(name, value, "m")
        t.event("hello", {"x": 1}, severity="warning")
        run_dir = t.run_dir
    assert run_dir is not None
    return run_dir


def test_default_demo_is_a_launched_two_rank_job_restarted_by_the_agent(
        launched_demo: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """The default demo runs under `telemetrain launch --nproc-per-node 2`: rank 1 of the first attempt is preempted
    (SIGTERM) at 60% of the steps, the elastic agent restarts the job, the second attempt resumes from the last
    checkpoint; each attempt's folder holds both ranks and the agent; the demo ends by writing the report."""
    _, proc = launched_demo
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "will be preempted (SIGTERM) at step 24" in proc.stdout
    assert "resumed from the checkpoint of step 20" in proc.stdout
    run_dir = _printed_run_dir(proc.stdout)
    first, second = (open_run(p) for p in find_runs(run_dir.parent))
    job = first.session_tag
    assert (first.run_id, second.run_id) == (f"{job}.0", f"{job}.1") and second.path == run_dir
    for run, attempt in ((first, 0), (second, 1)):
        assert sorted(p.rank for p in run.processes) == [0, 1]
        assert {p.identity.restart_count for p in run.processes} == {attempt}
        assert len(run.agents) == 1 and run.agents[0].identity.role == "agent"
    preempted = [r for r in first.processes[1].records if r.kind == "span_end" and r.name == "training_loop"]
    assert [r.status for r in preempted] == ["terminated"]
    failed = [r for r in first.processes[0].records if r.kind == "span_end" and r.name == "training_loop"]
    # rank 0 either lost its peer mid all-reduce or was stopped by the agent first: never "finished"
    assert [r.status for r in failed] in (["error"], ["terminated"])
    report = [line for line in proc.stdout.splitlines() if line.startswith("report: ")]
    assert report and Path(report[0].split()[1]).is_file()
    # the plan said before it happens; rank 0's broken all-reduce (when it sees it first) is no traceback
    assert "[rank 1] step 24: SIGTERM (simulated preemption), as planned" in proc.stdout
    assert "Traceback" not in proc.stderr
    # what torchelastic's agent logs on stderr is what the plan announced, nothing else
    assert "logs its exit (exitcode -15), sends the other ranks a closing SIGTERM" in proc.stdout
    logged = [line for line in proc.stderr.splitlines() if line.strip()]
    assert all("failed (exitcode: -15) local_rank: 1" in line or "closing signal SIGTERM" in line
               for line in logged), proc.stderr
    shown = _run_cli("show", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"goodput +\d+\.\d% of .* productive \(40 iterations kept, [1-9]\d* lost\) over 2 run\(s\)",
                     shown.stdout)
    assert "agents      1 (node 0" in shown.stdout


def test_in_process_demo_preempts_once_restarts_and_shows_goodput(tmp_path: Path) -> None:
    """The one-process demo: attempt 1 (its own process) is sent SIGTERM at 60% of the steps, attempt 2 resumes from
    its last checkpoint in the same session; show reports both attempts and the iterations the preemption lost."""
    pytest.importorskip("torch")
    proc = _run_cli("demo", "--steps", "40", "--root", str(tmp_path), "--seed", "1", "--in-process")
    assert proc.returncode == 0, proc.stderr
    assert "SIGTERM (simulated preemption)" in proc.stdout and "resumed from the checkpoint of step 20" in proc.stdout
    run_dir = _printed_run_dir(proc.stdout)
    session = run_dir.parent
    runs = sorted(p for p in session.iterdir() if p.is_dir())
    assert [p.name[-2:] for p in runs] == ["a0", "a1"]
    first, second = open_run(runs[0]), open_run(runs[1])
    assert first.processes[0].identity.restart_count == 0 and second.processes[0].identity.restart_count == 1
    loop_end = [r for r in first.records("span_end") if r.name == "training_loop"]
    assert [r.status for r in loop_end] == ["terminated"]  # ended by telemetrain's SIGTERM handler
    updates = [r for r in first.records("event") if r.name == "training_metrics_update"]
    assert updates[-1].attributes["current_iteration"] == 23  # 60% of 40 steps, zero-based
    assert [r.name for r in second.records("span_end") if r.name == "checkpoint_load"] == ["checkpoint_load"]
    loads = [r for r in second.records("span_start") if r.name == "training_loop"]
    assert loads[0].attributes["train_iterations_start"] == 20  # its checkpoint, a quarter of the steps x 2
    shown = _run_cli("show", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"goodput +\d+\.\d% of .* productive \(40 iterations kept, 4 lost\) over 2 run\(s\)", shown.stdout)
    assert "badput lost_progress" in shown.stdout
    # a preemption (SIGTERM) reads killed, as MLflow says, not a crash
    assert re.search(r"run \S+-a0 +killed", shown.stdout) and re.search(r"run \S+-a1 +finished", shown.stdout)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"telemetrain {telemetrain.__version__}\n"


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_bad_steps_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--steps", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_demo_prints_progress_and_hint(demo_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    run_dir, proc = demo_run
    assert run_dir.is_absolute() and run_dir.is_dir() and _printed_run_dir(proc.stdout) == run_dir
    assert f"telemetrain show {run_dir}" in proc.stdout
    progress = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(progress) == 10  # every 10% of 30 steps
    assert progress[-1].startswith("step 30/30") and "samples/s" in progress[-1]
    assert "Traceback" not in proc.stderr and "NumPy" not in proc.stderr


def test_demo_writes_a_complete_run(demo_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    run_dir, _ = demo_run
    run = open_run(run_dir)
    assert run.meta["config"]["steps"] == 30 and run.meta["config"]["seed"] == 3
    assert run.perf_tag == "telemetrain-demo"
    assert run.torn == 0 and run.corrupt == 0
    metrics = run.records("metric")
    by_key: dict[tuple[str, str], list[telemetrain.MetricPoint]] = {}
    for m in metrics:
        by_key.setdefault((m.group, m.name), []).append(m)

    for name in ("train.loss", "train.samples_per_s", "train.lr", "train.grad_norm"):
        assert len(by_key[("train", name)]) == 30, name
    losses = [m.value for m in by_key[("train", "train.loss")]]
    assert all(isinstance(v, float) and math.isfinite(v) for v in losses)
    assert losses[0] > 4.0  # ~ln(97) before learning anything
    assert all(m.value > 0 for m in by_key[("train", "train.samples_per_s")])

    # @metrics.prof(group="demo"): torchelastic's key naming, one success and one duration per call
    assert len(by_key[("demo", "train.train_step.success")]) == 30
    assert len(by_key[("demo", "train.train_step.duration.ms")]) == 30
    assert {m.value for m in by_key[("demo", "train.train_step.success")]} == {1}
    assert ("demo", "train.evaluate.success") in by_key and ("demo", "train.evaluate.duration.ms") in by_key
    assert not any(name.endswith(".failure") for _, name in by_key)

    # native metrics carry unit and the global step: before training, then every 20% of steps
    val_loss = by_key[("val", "val.loss")]
    assert [m.step for m in val_loss] == [0, 6, 12, 18, 24, 30]
    assert all(m.unit == "{nat}" for m in val_loss)
    assert val_loss[-1].value < val_loss[0].value  # it learned something
    assert [m.step for m in by_key[("val", "val.accuracy")]][-1] == 30

    evs = run.records("event")
    elastic = [e for e in evs if e.group == "torchelastic"]
    assert elastic[0].name == "demo.start" and elastic[-1].name == "demo.end"
    assert sum(e.name == "demo.evaluation" for e in elastic) == 6
    assert all(e.attributes and e.attributes["torchelastic.source"] == "WORKER" for e in elastic)
    assert elastic[-1].attributes["status"] == "ok"
    checkpoint_events = [e for e in elastic if e.name == "demo.checkpoint"]
    # every quarter of the 30 steps (7, 14, 21, 28), and at the end; each overwrites the run's checkpoint file
    assert [e.attributes["step"] for e in checkpoint_events] == [7, 14, 21, 28, 30]
    checkpoint = Path(checkpoint_events[-1].attributes["path"])
    assert checkpoint.parent == run_dir and checkpoint.stat().st_size == checkpoint_events[-1].attributes["bytes"]
    native = {e.name for e in evs if e.group == "events"}
    assert {"data.loaded", "val.new_best", "demo.sample"} <= native

    import torch

    state = torch.load(checkpoint, weights_only=True)
    assert state["step"] == 30 and "embed.weight" in state["model"]


def test_demo_is_deterministic_and_restores_the_default(
    demo_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, _ = demo_run
    telemetrain.reset()
    assert cli.main(["demo", "--steps", "30", "--root", str(tmp_path), "--seed", "3", "--no-crash",
                     "--in-process"]) == 0
    second = _printed_run_dir(capsys.readouterr().out)
    assert second != first and second.is_relative_to(tmp_path.absolute())

    def losses(run_dir: Path) -> list[float]:
        return [m.value for m in open_run(run_dir).records("metric") if m.name == "train.loss"]

    assert losses(second) == pytest.approx(losses(first), rel=1e-4)
    # The demo's Telemetry was the default only while it ran: the default is a fresh one again.
    assert not telemetrain.get_telemetry().closed
    telemetrain.reset()


def test_show_summarises_the_demo_run(demo_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    run_dir, _ = demo_run
    proc = _run_cli("show", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    run = open_run(run_dir)
    assert f"run         {run.run_id}" in out
    assert f"session     {run.session_tag}" in out and "perf_tag    telemetrain-demo" in out
    assert "rank 0" in out and f"pid {run.processes[0].pid}" in out
    for group, name in (("train", "train.loss"), ("train", "train.samples_per_s"),
                        ("demo", "train.train_step.duration.ms")):
        assert re.search(rf"\n  {group} +{re.escape(name)} += \S+ +\(rank 0, 30 points", out), name
    assert re.search(r"\n  val +val\.loss += \S+ +\(rank 0, 6 points, step 30, \{nat\}\)", out)
    assert re.search(r"\n  torchelastic +demo\.evaluation +6\n", out)
    # the training lifecycle: derived metrics of the last window, and what the run did
    assert re.search(r"training +30 iterations this run \(global step 29\) on rank 0, \d+ metrics updates", out)
    assert "iteration time (rank 0, last window)  p50 " in out and "samples/s" in out and "tokens/s" in out
    assert re.search(r"checkpoints / validations \(rank 0\) +5 saved +6 validation loops +0 telemetry misuse "
                     r"errors \(all ranks\)", out)
    assert "None" not in out
    assert "torn lines 0, corrupt lines 0, diagnostics 0" in out
    assert proc.stderr == ""


def test_show_without_argument_uses_the_newest_run_under_the_default_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    older = _synthetic_run(tmp_path, "r1-older", a=1.0)
    newer = _synthetic_run(tmp_path, "r2-newer", a=2.0)
    monkeypatch.setenv("TELEMETRAIN_DIR", str(tmp_path))
    assert cli.main(["show"]) == 0
    captured = capsys.readouterr()
    assert "run         r2-newer" in captured.out and re.search(r"\n  m +a += 2 ", captured.out)
    assert "holds 2 runs; showing the newest" in captured.err

    assert cli.main(["show", "--list"]) == 0
    header, *listing = capsys.readouterr().out.splitlines()
    assert header.startswith("created") and [str(older) in listing[0], str(newer) in listing[1]] == [True, True]


def test_show_prints_nan_inf_problems_and_diagnostics(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      engine: str) -> None:
    """NaN and inf values, a damaged and a torn line, a sink's diagnostic and spans that did not end ok (a failed
    checkpoint save twice, a terminated span) are each said, by both reader paths."""
    run_dir = write_odd_run(tmp_path)
    assert cli.main(["show", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\n  m +nan += nan ", out) and re.search(r"\n  m +inf += inf ", out)
    assert re.search(r"\n  m +neg += -inf +\(rank 2, 1 point, step 7\)", out)
    assert "config      bad=inf" in out
    assert "torn lines 1, corrupt lines 1, diagnostics 1, spans not ok 3" in out
    assert "sink_error  sink mysink  x1  count 3  boom" in out
    assert re.search(r"\n  span training checkpoint_save_sync +error +x2 +rank\(s\) 2\n", out)
    assert re.search(r"\n  span training step +terminated +x1 +rank\(s\) 2\n", out)
    assert re.search(r"\ncheckpoints 1 save\(s\), 3 span\(s\) on the ranks, mean \d+\.\d+ s; the longest: a save "
                     r"naming no step on rank 2, \d+\.\d+ s \(that save's mean \d+\.\d+ s\); 2 not ok\n", out)
    assert "rank 2  pid" in out and "torn" in out.split("rank 2", 1)[1].splitlines()[0]


@pytest.mark.parametrize("kind", ["missing", "empty", "file"])
def test_show_bad_directory_is_a_one_line_error(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "x"
    if kind == "empty":
        target.mkdir()
    elif kind == "file":
        target.write_text("hi")
    proc = _run_cli("show", str(target))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("telemetrain: error: ") and str(target) in lines[0]


def test_show_with_no_runs_under_default_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TELEMETRAIN_DIR", str(tmp_path / "nothing-here"))
    for argv in (["show"], ["show", "--list"]):  # a newcomer's first commands say alike what to do
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "telemetrain demo" in err, argv
    (tmp_path / "a-file").write_text("")
    assert cli.main(["show", "--list", str(tmp_path / "a-file")]) == 2
    assert "a-file is a file" in capsys.readouterr().err  # it exists: not "no such directory"


def test_demo_without_torch_says_how_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_find_spec = importlib.util.find_spec  # (the module cli looks torch up with)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find_spec(name, *a)
    )
    assert cli.main(["demo", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "pip install torch==2.13.0" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_import_does_not_import_torch() -> None:
    code = "import sys, telemetrain, telemetrain.cli, telemetrain.demo; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


def test_show_escapes_terminal_control_sequences(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A metric named with an ANSI escape or a newline is shown escaped: it cannot recolour or rewrite the screen."""
    t = telemetrain.Telemetry(telemetrain.identity_from_env(env={}), store=tmp_path)
    try:
        t.metric("evil\x1b[2J\x1b]0;pwned\x07name", 1.0, "g\nroup")
        t.event("ev\rent", {"k": "\x9b31m"})
    finally:
        t.close()
    assert cli.main(["show", str(t.run_dir)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\x9b" not in out
    assert "evil\\x1b[2J\\x1b]0;pwned\\x07name" in out and "g\\nroup" in out


def test_demo_backend_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One flag each: the demo trains with TensorBoard, MLflow and Prometheus attached and writes the session's
    Perfetto trace at the end; what each wrote is read back with the backend's own reader."""
    pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    pytest.importorskip("prometheus_client")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for this process's MlflowClient (MLflow 3)
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator  # type: ignore[import-untyped]

    tb, trace = tmp_path / "tb", tmp_path / "trace.json"
    mlruns = f"file://{tmp_path / 'mlruns'}"
    proc = _run_cli("demo", "--steps", "30", "--no-crash", "--root", str(tmp_path / "runs"), "--prometheus",
                    "--tensorboard", str(tb), "--mlflow", mlruns, "--trace", str(trace),
                    env={"MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_DISABLE_TELEMETRY": "true"})
    assert proc.returncode == 0, proc.stderr
    assert "TelemetryWarning" not in proc.stderr, proc.stderr  # the demo's own series suit every backend
    for name in ("prometheus", "tensorboard", "mlflow"):
        assert f"backend: {name}" in proc.stdout
    run_dir = _printed_run_dir(proc.stdout)
    run = open_run(run_dir)
    assert not [d for d in run.records("diagnostic")]  # no backend failed
    # TensorBoard: the demo's training loss, every step; rank 0 only (two ranks ran: the chatty backends are rank 0's)
    assert sorted(p.rank for p in run.processes) == [0, 1]
    (rank_dir,) = [p for p in tb.rglob("rank*") if p.is_dir()]
    assert rank_dir.name == "rank0"
    acc = EventAccumulator(str(rank_dir), size_guidance={"tensors": 0})  # 0: keep every value
    acc.Reload()
    loss = [tag for tag in acc.Tags()["tensors"] if tag.endswith("train.loss")]
    points = [m for m in run.processes[0].records if m.kind == "metric" and m.name == "train.loss"]
    # (Telemetry.log at the iteration's zero-based global step, as the recorder counts)
    assert [m.step for m in points] == list(range(30))
    steps = [e.step for e in acc.Tensors(loss[0])] if loss else []
    assert len(steps) == 30 and steps == sorted(steps) and steps[-1] <= 29  # on the training loop's axis
    # MLflow: the same metric with its steps
    client = MlflowClient(mlruns)
    (experiment,) = [e for e in client.search_experiments() if e.name == "telemetrain-demo"]
    (mlrun,) = client.search_runs([experiment.experiment_id])
    keys = [k for k in mlrun.data.metrics if k.endswith("train.loss")]
    assert keys and len(client.get_metric_history(mlrun.info.run_id, keys[0])) == 30
    assert mlrun.info.status == "FINISHED"
    # Perfetto: a trace of the session with the training loop on it
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "training_loop" and e.get("ph") == "X" for e in events)


def test_goodput_and_trace_without_argument_take_the_newest_runs_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for session, run_id in (("s-old", "old.0"), ("s-new", "new.0"), ("s-new", "new.1")):
        identity = telemetrain.identity_from_env({}, run_id=run_id, session_tag=session)
        with telemetrain.Telemetry(identity, store=tmp_path / "runs") as t:
            t.metric("a", 1.0, "m")
    monkeypatch.setenv("TELEMETRAIN_DIR", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    # runs without a training lifecycle: goodput's error names the session it read, the newest run's
    assert cli.main(["goodput"]) == 2
    err = capsys.readouterr().err
    assert "s-new: empty session, its 2 run(s)" in err and "s-old" not in err
    assert cli.main(["trace", "-o", "t.json"]) == 0
    assert "2 process(es)" in capsys.readouterr().out
    trace = json.loads((tmp_path / "t.json").read_text())
    assert trace["otherData"]["telemetrain"]["runs"] == ["new.0", "new.1"]


def test_query_json_is_strict_json_with_nan_and_infinities(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A diverged loss is data: --format json must still parse (jq and strict parsers reject bare NaN)."""
    pytest.importorskip("duckdb")
    run_dir = _synthetic_run(tmp_path, "n", loss=math.nan, peak=math.inf)

    def no_bare_constants(literal: str) -> None:
        raise AssertionError(f"bare {literal} in the output")

    sql = "SELECT name, value, [value] AS listed FROM metrics WHERE group_name = 'm' ORDER BY name"
    assert cli.main(["query", str(run_dir), sql, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out, parse_constant=no_bare_constants)
    assert rows == [{"name": "loss", "value": "NaN", "listed": ["NaN"]},
                    {"name": "peak", "value": "Infinity", "listed": ["Infinity"]}]


def test_show_says_when_run_json_is_damaged_or_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without it the config and workload lines were just absent, and the problems line said nothing."""
    run_dir = _synthetic_run(tmp_path, "j", loss=1.0)
    assert cli.main(["show", str(run_dir)]) == 0
    assert "run.json" not in capsys.readouterr().out
    (run_dir / "run.json").write_text('{"run_id": "j", "config": {')  # cut off mid-write
    assert cli.main(["show", str(run_dir)]) == 0
    assert "run.json    unreadable: the run's config and workload are not known" in capsys.readouterr().out
    (run_dir / "run.json").unlink()
    assert cli.main(["show", str(run_dir)]) == 0
    assert "run.json    missing: the run's config and workload are not known" in capsys.readouterr().out


def test_compare_of_runs_without_report_windows_does_not_say_no_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs with no training reports: every row is "insufficient data", so the summary must not read as a pass."""
    candidate, baseline = _synthetic_run(tmp_path, "c", loss=1.0), _synthetic_run(tmp_path, "b", loss=1.0)
    assert cli.main(["compare", str(candidate), "--baseline", str(baseline), "--no-goodput"]) == 0
    out = capsys.readouterr().out
    assert "insufficient data" in out
    assert "nothing tested: every row had too little data (the notes say what is missing)" in out
    assert "no significant change" not in out


def test_fail_on_regression_does_not_pass_a_comparison_that_tested_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CI gate over runs that recorded no iterations (a broken benchmark) exited 0, as if nothing had regressed."""
    candidate, baseline = _synthetic_run(tmp_path, "c", loss=1.0), _synthetic_run(tmp_path, "b", loss=1.0)
    other = _synthetic_run(tmp_path, "o", loss=1.0)
    for baselines in (["--baseline", str(baseline)], ["--baseline", str(baseline), "--baseline", str(other)]):
        argv = ["compare", str(candidate), *baselines, "--no-goodput", "--fail-on-regression"]
        assert cli.main(argv) == 2
        captured = capsys.readouterr()
        assert "insufficient data" in captured.out  # the comparison is still printed
        assert "--fail-on-regression: nothing could be tested of" in captured.err
        assert str(candidate) in captured.err
        assert cli.main(argv[:-1]) == 0  # without the gate, a comparison of little data is not an error
        capsys.readouterr()


def test_each_commands_description_names_only_its_own_placeholders() -> None:
    """A description that says PATH where the usage line says RUN_DIR|SESSION_DIR leaves the reader guessing."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    wrong = []
    for name, command in commands.items():
        usage = command.format_usage()
        for word in re.findall(r"(?<![$\w])[A-Z][A-Z_]{2,}\b", command.description or ""):
            if ("DIR" in word or word in ("PATH", "FILE", "URL", "NAME", "TOPIC", "SECTION")) and word not in usage:
                wrong.append(f"telemetrain {name}: {word}")
    assert wrong == []


def test_goodput_of_a_store_root_of_one_session_names_the_session_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import train_empty_iterations

    t = telemetrain.Telemetry(telemetrain.identity_from_env({}, run_id="r", session_tag="s"), store=tmp_path / "root")
    train_empty_iterations(t, 4, batch=8, log_every=2)
    assert t.close()
    assert cli.main(["goodput", str(tmp_path / "root")]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header == f"session     s  ({tmp_path / 'root' / 's'})"  # not the root, which is no session's folder
