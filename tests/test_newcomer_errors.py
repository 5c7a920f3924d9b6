"""What a newcomer meets when something is missing or mistyped (issue 15, item 7): one clear error line naming what
to do, output files written alike by every command."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import IDENTITY_ENV, train_empty_iterations
from telemetrain import Telemetry, identity_from_env
from telemetrain.cli import main
from telemetrain.store.reader import find_runs
from test_cli import _synthetic_run


@pytest.mark.parametrize(("statement", "blocked", "extra"), [
    ("import telemetrain.sinks.prometheus", ["prometheus_client"], "prometheus"),
    ("import telemetrain.sinks.otel", ["opentelemetry"], "otel"),
    ("import telemetrain.sinks.mlflow", ["mlflow"], "mlflow"),
    ("import telemetrain.sinks.tensorboard", ["tensorboard"], "tensorboard"),
    ("import telemetrain.system", ["psutil"], "system"),
    ("import telemetrain.integrations.hf", ["transformers"], "hf"),
    ("from telemetrain.integrations.lightning import TelemetrainCallback", ["lightning", "pytorch_lightning"],
     "lightning"),
])
def test_a_missing_extra_is_one_clear_error(statement: str, blocked: list[str], extra: str) -> None:
    """As without the extra installed (the module made unimportable): one ImportError naming the extra to install,
    not chained to the ModuleNotFoundError it replaces (whose text it carries)."""
    code = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in blocked) + statement
    env = {k: v for k, v in os.environ.items() if k not in IDENTITY_ENV}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    assert proc.returncode == 1
    assert "The above exception was the direct cause" not in proc.stderr
    assert "During handling of the above exception" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if not line.startswith(" ") and "Error" in line]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("ImportError: ") and errors[0].endswith(f"pip install 'telemetrain[{extra}]'")
    assert proc.stderr.rstrip().splitlines()[-1] == errors[0]  # the line to act on is the last one


@pytest.fixture
def trained_run(tmp_path: Path) -> Path:
    t = Telemetry(identity_from_env({}, run_id="r", session_tag="s"), store=tmp_path / "runs")
    train_empty_iterations(t, 4, batch=8, log_every=2)
    assert t.close()
    assert t.run_dir is not None
    return t.run_dir


@pytest.mark.parametrize("command", ["report", "trace", "compare"])
def test_an_output_in_a_missing_directory_is_one_clear_error(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    target = tmp_path / "missing" / "dir" / "out.html"
    argv = {"report": ["report", str(trained_run), "-o", str(target)],
            "trace": ["trace", str(trained_run), "-o", str(target)],
            "compare": ["compare", str(trained_run), "--baseline", str(trained_run), "--html", str(target)]}[command]
    if command == "compare":  # a run is no baseline of itself: compare it with a copy
        copy = tmp_path / "runs" / "s" / "r2"
        copy.mkdir()
        for f in trained_run.iterdir():
            (copy / f.name).write_bytes(f.read_bytes())
        argv[argv.index("--baseline") + 1] = str(copy)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"telemetrain: error: cannot write {target}: the directory {target.parent} does not exist\n"
    assert ".tmp" not in err
    assert list(tmp_path.glob("**/.*.tmp")) == []


@pytest.fixture
def umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_trace_report_and_compare_files_get_the_umasks_permissions(trained_run: Path, tmp_path: Path,
                                                                   umask: None) -> None:
    outputs = {"trace": tmp_path / "trace.json", "report": tmp_path / "report.html"}
    assert main(["trace", str(trained_run), "-o", str(outputs["trace"])]) == 0
    assert main(["report", str(trained_run), "-o", str(outputs["report"])]) == 0
    for name, path in outputs.items():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, name
    os.umask(0o077)  # a private umask is respected too
    assert main(["trace", str(trained_run), "-o", str(tmp_path / "private.json")]) == 0
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600


def test_compact_to_an_unusable_url_is_one_clear_error(trained_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped protocol fails before any run is compacted; a backend's own failure (here not an OSError, as
    botocore's missing credentials are not) is one line naming the URL, not a traceback."""
    pytest.importorskip("duckdb")
    pytest.importorskip("fsspec")
    import fsspec  # type: ignore[import-untyped]

    class Refusing(fsspec.AbstractFileSystem):  # type: ignore[misc]
        protocol = "refusing"

        def put_file(self, lpath: str, rpath: str, **kwargs: object) -> None:
            raise RuntimeError("no credentials here")

    fsspec.register_implementation("refusing", Refusing, clobber=True)
    assert main(["compact", str(trained_run), "--to", "nosuchprotocol://bucket/x"]) == 2
    err = capsys.readouterr().err
    assert err == "telemetrain: error: cannot write to nosuchprotocol://bucket/x: Protocol not known: nosuchprotocol\n"
    assert main(["compact", str(trained_run), "--to", "refusing://bucket/x"]) == 2
    err = capsys.readouterr().err
    assert err == "telemetrain: error: cannot upload to refusing://bucket/x: RuntimeError: no credentials here\n"
    assert not (trained_run / "_columnar").exists()  # the run is left as it was


def test_compare_with_a_loss_no_run_has_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped --loss was compared as another metric (the first evaluation one) without a word."""
    runs = []
    for run_id in ("a", "b"):
        t = Telemetry(identity_from_env({}, run_id=run_id, session_tag=run_id), store=tmp_path / "runs")
        for step in range(6):
            t.metric("train.loss", 2.0 - step / 10, "train", step=step)
            t.metric("val.accuracy", step / 10, "val", step=step)
        train_empty_iterations(t, 8, batch=8, log_every=2)
        assert t.close() and t.run_dir is not None
        runs.append(str(t.run_dir))
    argv = ["compare", runs[0], "--baseline", runs[1], "--no-goodput", "--json"]
    for named in ("train/train.loss", "train.loss"):  # GROUP/NAME and NAME alike
        assert main([*argv, "--loss", named]) == 0
    capsys.readouterr()
    assert main([*argv, "--loss", "train.los"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("telemetrain: error: --loss 'train.los': no run compared has a metric so named (NAME or "
                            "GROUP/NAME, as `telemetrain show` lists them)\n")


def test_query_refuses_a_negative_row_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """0 means every row; -1 is a typo, not a second spelling of it."""
    pytest.importorskip("duckdb")
    run_dir = _synthetic_run(tmp_path, "q", loss=1.0)
    assert main(["query", str(run_dir), "SELECT name FROM metrics", "--max-rows", "0"]) == 0
    capsys.readouterr()
    assert main(["query", str(run_dir), "SELECT name FROM metrics", "--max-rows", "-1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "argument --max-rows: must be >= 0 (0: all rows), got -1" in captured.err


@pytest.mark.parametrize("command", ["show", "report", "goodput", "trace", "docs"])
def test_a_stray_argument_shows_the_commands_own_usage(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Not the top-level usage, which hides the flags the user was looking for."""
    assert main([command, "--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: telemetrain {command} ")
    assert err.endswith(f"telemetrain {command}: error: unrecognized arguments: --no-such-flag\n")


def test_compare_refuses_a_candidate_given_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As a baseline given twice is: it would be compared, and counted in the result line, twice."""
    candidate, baseline = _synthetic_run(tmp_path, "c", loss=1.0), _synthetic_run(tmp_path, "b", loss=1.0)
    assert main(["compare", str(candidate), str(tmp_path / "synthetic" / ".." / "synthetic" / "c"),
                     "--baseline", str(baseline), "--no-goodput"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("telemetrain: error: the candidate ") and "is given twice" in captured.err


def test_query_with_a_syntax_error_is_one_readable_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """DuckDB's parser message goes on over lines (LINE 1: ..., a caret); escaped into one line they read as \\n\\n."""
    pytest.importorskip("duckdb")
    run_dir = _synthetic_run(tmp_path, "s", loss=1.0)
    assert main(["query", str(run_dir), "SELEC name FROM metrics"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("telemetrain: error: query refused: cannot parse the query: ") and "SELEC" in err
    assert err.count("\n") == 1 and "\\n" not in err


def test_demo_with_a_root_that_is_a_file_is_one_error_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was a traceback (in process) or the launcher's failure banner, after the model had started training."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the demo checks for torch first")
    root = tmp_path / "not-a-dir"
    root.write_text("mine\n")
    assert main(["demo", "--root", str(root), "--steps", "2", "--in-process", "--no-crash"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"telemetrain: error: {root} is a file; the run store is a directory (--root DIR)\n"
    assert root.read_text() == "mine\n"


def test_demo_with_a_trace_path_it_cannot_write_fails_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trace is written once the demo ends: a missing directory was a traceback after the whole training."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the demo checks for torch first")
    target = tmp_path / "missing" / "t.json"
    argv = ["demo", "--root", str(tmp_path / "runs"), "--steps", "2", "--in-process", "--no-crash"]
    assert main([*argv, "--trace", str(target)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"telemetrain: error: cannot write {target}: the directory {target.parent} does not exist\n"
    assert find_runs(tmp_path / "runs") == []  # nothing trained


def test_compare_passes_over_a_run_that_died_before_its_first_record(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A launch that failed at start leaves run.json alone; as the newest run of the perf_tag it was picked as the
    baseline, and as history it failed every compare of that perf_tag: 'holds no process files'."""
    runs = []
    for run_id in ("a", "b", "c"):
        t = Telemetry(identity_from_env({}, run_id=run_id, session_tag=run_id, perf_tag="job"),
                      store=tmp_path / "runs")
        train_empty_iterations(t, 8, batch=8, log_every=2)
        assert t.close() and t.run_dir is not None
        runs.append(t.run_dir)
    dead = tmp_path / "runs" / "d" / "d"
    dead.mkdir(parents=True)
    (dead / "run.json").write_bytes((runs[2] / "run.json").read_bytes())  # as new as the newest
    assert main(["compare", str(runs[2]), "--no-goodput", "--json"]) == 0
    assert f"baseline: {runs[1]} (newest other run" in capsys.readouterr().err
    assert main(["compare", str(runs[2]), "--baseline", str(runs[1]), "--no-goodput", "--json"]) == 0


@pytest.mark.parametrize(("flags", "message"), [
    (["--nproc-per-node", "x"], "argument --nproc-per-node: Unsupported nproc_per_node value: x"),
    (["--nproc-per-node", "0"], "argument --nproc-per-node: expected a number >= 1, or auto, cpu, gpu, got 0"),
    (["--nnodes", "x"], "argument --nnodes: expected N or MIN:MAX, got 'x'"),
    (["--nnodes", "2:1"], "argument --nnodes: expected 0 < MIN <= MAX, got '2:1'"),
])
def test_launch_with_a_bad_size_is_a_usage_error(flags: list[str], message: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """torchrun raised a traceback (a ValueError, or a bare AssertionError for 0) for these; nothing is started."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    assert main(["launch", *flags, str(script)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1] == f"telemetrain launch: error: {message}"
    assert "Traceback" not in captured.err


def test_launch_of_a_script_that_is_not_there_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Not each worker's "can't open file", torchrun's 20-line failure banner and a failed job in the run store."""
    pytest.importorskip("torch")
    monkeypatch.setenv("TELEMETRAIN_DIR", str(tmp_path / "runs"))
    assert main(["launch", "--nproc-per-node", "1", str(tmp_path / "trian.py")]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines()[-1] == f"telemetrain launch: error: argument training_script: no such file: " \
                                            f"{str(tmp_path / 'trian.py')!r}"
    assert not (tmp_path / "runs").exists()


def test_an_output_path_that_cannot_be_is_refused_before_the_runs_are_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """report, compare --html and trace read the runs first (minutes on a large job), then failed on a mistyped
    output directory; compare had printed its whole table by then, under a failing exit status."""
    runs = []
    for run_id in ("a", "b"):
        t = Telemetry(identity_from_env({}, run_id=run_id, session_tag=run_id, perf_tag="job"),
                      store=tmp_path / "runs")
        train_empty_iterations(t, 8, batch=8, log_every=2)
        assert t.close() and t.run_dir is not None
        runs.append(str(t.run_dir))
    missing = tmp_path / "no-such-dir" / "out.html"
    expected = f"telemetrain: error: cannot write {missing}: the directory {missing.parent} does not exist\n"
    for argv in (["report", runs[1], "-o", str(missing), "--progress"],
                 ["compare", runs[1], "--baseline", runs[0], "--no-goodput", "--html", str(missing)],
                 ["trace", runs[1], "-o", str(missing)]):
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", expected), argv
    assert main(["report", runs[1], "-o", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"telemetrain: error: cannot write {tmp_path}: Is a directory\n"
