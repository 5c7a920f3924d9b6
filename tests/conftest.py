"""Shared fixtures: an isolated default ``Telemetry`` per test, and a check that no test leaks one or its threads."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from _planted import PlantedRuns
from telemetrain.sinks import Sink
from telemetrain.span_lifecycle import _current
from telemetrain.store import open_run
from telemetrain.telemetry import _default

# Variables that shape the identity or the default instance: cleared so the tests do not depend on the environment
# they run in (a CI job under torchrun, a developer's TELEMETRAIN_DIR, ...).
IDENTITY_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_NAME",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_RESTART_COUNT",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_NODEID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "TELEMETRAIN_RUN_ID",
    "TELEMETRAIN_SESSION_TAG",
    "TELEMETRAIN_PERF_TAG",
    "TELEMETRAIN_DIR",
    "TELEMETRAIN_STORE",
    "TELEMETRAIN_CONSOLE",
)


HAVE_DUCKDB = importlib.util.find_spec("duckdb") is not None


def telemetrain_threads() -> list[threading.Thread]:
    return [th for th in threading.enumerate() if th.name.startswith("telemetrain-") and th.is_alive()]


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_under_pytests_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tests and the processes they start make their temporary files under pytest's base directory, which pytest
    prunes (it keeps the last three): torch's elastic agent makes a log directory for every job it runs
    (``torchelastic_*``) and never removes it."""
    base = tmp_path_factory.mktemp("tmp", numbered=False)
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(base)
    try:
        yield
    finally:
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env


@pytest.fixture(autouse=True)
def _clean_env_and_no_leaks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Clear the identity variables; after the test, fail if it left a default instance or a dispatcher thread."""
    for name in IDENTITY_ENV:
        monkeypatch.delenv(name, raising=False)
    if HAVE_DUCKDB and not os.environ.get("TELEMETRAIN_ENGINE"):
        # the readers take the Python path for small runs (store.engine.SMALL_RUN_BYTES), and the tests' runs are
        # small: with DuckDB installed they ask for it, so the SQL readers stay under test (a test of the Python path,
        # or of the choice, sets or removes the variable itself)
        monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    leaked_before = telemetrain_threads()
    yield
    problems = []
    if _default.telemetry is not None:
        problems.append("a default Telemetry instance was left behind")
        telemetrain.reset()
    _default.candidates.clear()  # an instance a test left open must not become a later test's default
    threads = [th for th in telemetrain_threads() if th not in leaked_before]
    deadline = time.monotonic() + 2.0  # a thread on its way out (its last tick in flight on a loaded machine) is not
    for th in threads:  # a leak: a leaked one is still running after this grace
        th.join(max(0.0, deadline - time.monotonic()))
    threads = [th for th in threads if th.is_alive()]
    if threads:
        problems.append(f"dispatcher threads left running: {[th.name for th in threads]}")
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


@pytest.fixture(autouse=True)
def _no_current_span_across_tests() -> Iterator[None]:
    """Each test starts with no current span and leaves none behind: pytest runs every test in one context, where a
    span a test leaves current (open at its Telemetry's close, say) would become the parent of the next test's."""
    token = _current.set(None)  # private: there is no public way to reset the current span
    yield
    _current.reset(token)


@pytest.fixture(scope="session")
def launched_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The default demo, ``telemetrain demo --steps 40 --seed 1`` (two ranks under ``telemetrain launch``, rank 1
    preempted, the agent restarting the job), run once for the tests that read it: its store root and the process.
    Its readers only read the session (a test that changed it would copy it first)."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("launched-demo")
    env = {k: v for k, v in os.environ.items() if k not in IDENTITY_ENV}
    if HAVE_DUCKDB and "TELEMETRAIN_ENGINE" not in env:
        env["TELEMETRAIN_ENGINE"] = "duckdb"  # (as the tests' own environment asks, _clean_env_and_no_leaks)
    proc = subprocess.run([sys.executable, "-m", "telemetrain.cli", "demo", "--steps", "40", "--root", str(root),
                           "--seed", "1"], capture_output=True, text=True, timeout=240, env=env)
    return root, proc


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``telemetrain demo --steps 30 --seed 3 --no-crash --in-process`` (one rank, no launcher, no preemption), run
    once for the tests that read it: its run directory and the process. Its readers only read the run."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("in-process-demo")
    env = {k: v for k, v in os.environ.items() if k not in IDENTITY_ENV}
    proc = subprocess.run([sys.executable, "-m", "telemetrain.cli", "demo", "--steps", "30", "--root", str(root),
                           "--seed", "3", "--no-crash", "--in-process"], capture_output=True, text=True, timeout=240,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    (run_json,) = root.glob("*/*/run.json")
    return run_json.parent, proc


@pytest.fixture(scope="session")
def planted_runs(tmp_path_factory: pytest.TempPathFactory) -> PlantedRuns:
    """The planted-problem jobs (``_planted.PlantedRuns``), each run once a session, for the tests that read them (a
    test that changes a run, compacting it, works on a copy)."""
    return PlantedRuns(tmp_path_factory.mktemp("planted"))


@pytest.fixture(params=["python", "duckdb"])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test runs twice, by the record-by-record pass and by the SQL path (the readers' choice,
    ``store.engine.engine_for``, made by ``TELEMETRAIN_ENGINE``): the name of the path of this run."""
    name = str(request.param)
    if name == "duckdb":
        pytest.importorskip("duckdb")
    monkeypatch.setenv("TELEMETRAIN_ENGINE", name)
    return name


@pytest.fixture
def telemetry(tmp_path: Path) -> Iterator[telemetrain.Telemetry]:
    """A Telemetry writing its run store under ``tmp_path``, installed as the default instance."""
    t = telemetrain.Telemetry(store=tmp_path)
    telemetrain.set_telemetry(t)
    try:
        yield t
    finally:
        telemetrain.reset()
        t.close()  # in case a test replaced the default: close ours anyway (idempotent)


@pytest.fixture
def read_run() -> Callable[..., list[Any]]:
    """``read_run(t, kinds=None)``: flush ``t`` and read its run back from the store, in time order."""

    def read(t: telemetrain.Telemetry, kinds: str | None = None) -> list[Any]:
        assert t.flush(), "flush did not finish"
        return open_run(run_dir_of(t)).records(kinds)

    return read


def train_empty_iterations(t: telemetrain.Telemetry, iterations: int, *, batch: int, log_every: int) -> None:
    """A whole training lifecycle on ``t`` whose iterations do nothing: the application, one loop of
    ``iterations``, reports every ``log_every``; ``t`` is left open."""
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=batch, log_every_n_train_iterations=log_every),
                         telemetry=t)
    r.on_app_start()
    r.on_train_start(0)
    for _ in range(iterations):
        r.on_training_single_iteration_start()
        r.on_training_single_iteration_end()
    r.on_train_end()
    r.on_app_end()


def write_odd_run(root: Path) -> Path:
    """Rank 2 of 4 of run "odd": NaN and infinite metrics (``neg`` at step 7), an infinite config value, a sink's
    diagnostic, checkpoint saves that ended in error twice and a terminated span, then a line that is not JSON and
    a line cut mid-write (``show``'s problems, in text and JSON)."""
    import math

    from telemetrain.records import Diagnostic
    from telemetrain.spans import tracer

    identity = telemetrain.identity_from_env({}, run_id="odd", session_tag="s", rank=2, world_size=4)
    with telemetrain.Telemetry(identity, store=root, config={"bad": math.inf}) as t:
        spans = tracer(t)
        for status in ("error", "ok", "error", "terminated"):
            spans.start("checkpoint_save_sync" if status != "terminated" else "step", group="training").end(status)
        t.metric("nan", math.nan, "m")
        t.metric("inf", math.inf, "m")
        t.metric("neg", -math.inf, "m", step=7)
        mono, wall = t.now()
        t.emit(Diagnostic(mono, wall, t.identity, "telemetrain", "sink_error", "mysink", 3, "boom"))
        run_dir = t.run_dir
    assert run_dir is not None
    (log,) = run_dir.glob("rank-*.jsonl")
    with open(log, "a") as fh:
        fh.write("this is not json\n")
        fh.write('{"v":1,"kind":"metric","mo')  # a crash mid-line
    return run_dir


def logged_queries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every SQL statement the DuckDB engine executes from now on (the test's monkeypatch undoes it), in order."""
    from telemetrain.store.engine import Engine  # here: conftest loads without the columnar extra

    queries: list[str] = []
    execute = Engine.execute

    def logged(self: Engine, q: str, p: Any = None) -> Any:
        queries.append(q)
        return execute(self, q, p)

    monkeypatch.setattr(Engine, "execute", logged)
    return queries


def run_dir_of(t: telemetrain.Telemetry) -> Path:
    """``t.run_dir`` of a Telemetry that has a run store (typed ``Path``: ``Telemetry.run_dir`` is ``Path | None``)."""
    run_dir = t.run_dir
    assert run_dir is not None, "this Telemetry has no run store"
    return run_dir


def norm_type(tp: Any) -> Any:
    """An annotation in a form that does not depend on the defining module or on ``X | None`` vs ``Optional[X]``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return ("union", frozenset(norm_type(a) for a in typing.get_args(tp)))
    if origin is not None:
        return (norm_type(origin), tuple(norm_type(a) for a in typing.get_args(tp)))
    if tp is None or tp is type(None):
        return "None"
    if isinstance(tp, type):
        return tp.__qualname__
    return repr(tp)


# -- torchelastic side by side ------------------------------------------------------------------------------------


class ListHandler(logging.Handler):
    """A logging handler that keeps every message it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.messages.append(record.getMessage())


def recorder(base: type) -> Any:
    """A MetricHandler (of torchelastic's or our base class) that keeps what it is given."""

    class Recorder(base):  # type: ignore[misc]
        def __init__(self) -> None:
            self.data: list[Any] = []

        def emit(self, metric_data: Any) -> None:
            self.data.append(metric_data)

    return Recorder()


@pytest.fixture
def torch_metrics(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """torchelastic's metrics module with fresh module globals for this test (it keeps its handlers in globals)."""
    import torch.distributed.elastic.metrics as tmetrics
    import torch.distributed.elastic.metrics.api as tapi

    monkeypatch.setattr(tapi, "_metrics_map", {})
    monkeypatch.setattr(tapi, "_default_metrics_handler", tapi.NullMetricHandler())
    return tmetrics


@pytest.fixture
def torch_rdzv_handler(monkeypatch: pytest.MonkeyPatch) -> Iterator[ListHandler]:
    """torchelastic's rendezvous events switched on for this test (its only switch: replace the private handler)."""
    import torch.distributed.elastic.events as tevents
    import torch.distributed.elastic.events.handlers as thandlers

    handler = ListHandler()
    monkeypatch.setitem(thandlers._log_handlers, "dynamic_rendezvous", handler)
    monkeypatch.setattr(tevents, "_events_loggers", {})
    yield handler
    logging.getLogger("torchelastic-events-dynamic_rendezvous").removeHandler(handler)


# -- sinks and the default instance ----------------------------------------------------------------------------------


class ListSink(Sink):
    """Collects every record it is given (thread-safe)."""

    def __init__(self, name: str = "collect", *, background: bool = True) -> None:
        self.name = name
        self.background = background
        self.records: list[Any] = []
        self._lock = threading.Lock()

    def write(self, records: Sequence[Any]) -> None:
        with self._lock:
            self.records.extend(records)


@contextlib.contextmanager
def as_default(t: telemetrain.Telemetry) -> Iterator[telemetrain.Telemetry]:
    """``t`` is the default instance inside the block; afterwards it is closed and the previous default is back."""
    previous = telemetrain.set_telemetry(t)
    try:
        yield t
    finally:
        t.close()
        if previous is not None:
            telemetrain.set_telemetry(previous)
        else:
            telemetrain.reset()


# -- helper subprocesses -----------------------------------------------------------------------------------------------


def run_helper_process(
    tmp_path: Path, code: str, run_id: str, session: str, *, sigterm: bool, timeout: float = 20.0
) -> tuple[int | None, Path, str]:
    """Run ``python -c code`` (with ``tests/`` importable, ``_proc_helpers`` scenarios) under a fixed identity; wait
    for it to print ``ready``; send SIGTERM if asked; wait up to ``timeout``. Returns (exit status, or None if it hung
    and was killed; its run directory; its stderr)."""
    tests = Path(__file__).parent
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, text=True,
                                env=helper_env(run_id, session, pythonpath=tests), cwd=tests)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", stderr_path.read_text()
            if sigterm:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        finally:
            returncode = proc.poll()
            if returncode is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    return returncode, tmp_path / session / run_id, stderr_path.read_text()


def helper_env(run_id: str, session: str, *, pythonpath: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment of a helper subprocess: a fixed identity (``run_id``, ``session``), nothing inherited that could
    change it (telemetrain's, torchelastic's and SLURM's variables, the rank variables), unbuffered output;
    ``pythonpath`` first on PYTHONPATH (a folder the helper imports from); ``extra`` on top."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_", "SLURM_"))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "ROLE_NAME")
    }
    env.update({"TELEMETRAIN_RUN_ID": run_id, "TELEMETRAIN_SESSION_TAG": session, "PYTHONUNBUFFERED": "1"})
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env
