#!/usr/bin/env python3
"""Run the peers' own tests against telemetrain, with only their import paths changed (docs/compat.md).

The peer test files are read from a checkout or git directory of pytorch/pytorch and NVIDIA/nv-one-logger, copied
into a scratch directory outside this repository, rewritten (module paths in imports and in dotted-path strings, per
the mapping tables of docs/compat.md) and run with pytest under the current interpreter, ``PYTHONPATH`` pointing at
this repository's ``src``. The outcome is compared with the expected failures documented in docs/compat.md (kept
below as data). nv-one-logger's ``docs/example.py`` is run the same way and its output checked: the file exporter's
JSON lines, the run store and ``telemetrain report``.

Exit status: 0 when every failing test is an expected one (and the example checks hold); 1 otherwise; with
``--strict`` also 1 when an expected failure passes (a stale entry). 2 for a usage or setup error.

Nothing of the peers is kept in this repository: the sources are read from wherever the caller has them.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tokenize
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"

# --- what is run -------------------------------------------------------------------------------------------------

# pytorch/pytorch revisions whose test files run with torch 2.13's ``torch.testing._internal`` (the newest
# test_monitor.py needs ``HardwareClassification``, which torch 2.13 lacks). ``--pytorch-rev`` overrides all three.
_TORCH_API_TEST_REV = "14159896cdbe0901b88a74e0344490cf7788c645"
_TORCH_LIB_TEST_REV = "0821eee16b1f4b75edbcf72ca54701c6ccc93cca"
_TORCH_MONITOR_TEST_REV = "1492ff433a85c1cfbe9229821cef433ab64ba62e"
# NVIDIA/nv-one-logger: "Release: 2.3.1" (the version compat.md describes).
_ONE_LOGGER_REV = "ff0195bfdd0f8c88f96563f549968cc8d6c99023"
_OL_TESTS = "nv_one_logger/one_logger_training_telemetry/tests/nv_one_logger/training_telemetry/api"
_OL_EXAMPLE = "nv_one_logger/one_logger_training_telemetry/src/nv_one_logger/training_telemetry/docs/example.py"


@dataclass(frozen=True)
class PeerFile:
    """One file of a peer: where it is in the peer's repository, at which revision, where it goes in the scratch."""

    path: str
    rev: str
    dest: str  # relative to the peer's scratch directory
    is_test: bool = True


@dataclass(frozen=True)
class Peer:
    name: str
    files: tuple[PeerFile, ...]
    # module path prefix -> telemetrain module (docs/compat.md's tables); longest match wins
    mapping: Mapping[str, str]
    # a module path of the peer's own package: any import left with it after rewriting is an error
    peer_package: str
    # one pytest process per group of files (by scratch sub-directory)
    separate_processes: bool
    expected_failures: Mapping[str, str] = field(default_factory=dict)


_TORCH_MAPPING = {
    "torch.distributed.elastic.metrics": "telemetrain.metrics",
    "torch.distributed.elastic.events": "telemetrain.events",
    "torch.monitor": "telemetrain.monitor",
}

_OL_API = "nv_one_logger.training_telemetry.api"
_ONE_LOGGER_MAPPING: dict[str, str] = {
    **{
        f"{_OL_API}.{name}": f"telemetrain.training.{name}"
        for name in (
            "callbacks", "context", "config", "attributes", "spans", "events", "checkpoint",
            "training_telemetry_provider", "training_recorder",
        )
    },
    _OL_API: "telemetrain.training",
    "nv_one_logger.api.config": "telemetrain.training.one_logger_config",
    "nv_one_logger.api.telemetry_config": "telemetrain.training.one_logger_config",
    "nv_one_logger.api.one_logger_provider": "telemetrain.training.one_logger_provider",
    "nv_one_logger.api.timed_span": "telemetrain.training.timed_span",
    "nv_one_logger.api.recorder": "telemetrain.training.default_recorder",
    "nv_one_logger.core.attributes": "telemetrain.training.attributes",
    "nv_one_logger.core.event": "telemetrain.training.events",
    "nv_one_logger.core.span": "telemetrain.training.spans",
    "nv_one_logger.core.time": "telemetrain.training.timestamps",
    "nv_one_logger.core.exceptions": "telemetrain.training.errors",
    "nv_one_logger.recorder.default_recorder": "telemetrain.training.default_recorder",
    **{
        f"nv_one_logger.exporter.{name}": "telemetrain.training.exporters"
        for name in (
            "exporter", "file_exporter", "logger_exporter", "base_json_exporter", "export_config_manager",
            "exporter_config",
        )
    },
    "nv_one_logger.otel.exporter.otel_exporter": "telemetrain.training.exporters",
    "nv_one_logger.core.internal.multi_window_timer": "telemetrain.training.timers",
    "nv_one_logger.core.internal.metric_summarizer": "telemetrain.training.timers",
    "nv_one_logger.core.internal.singleton": "telemetrain.training.singleton",
    "nv_one_logger.training_telemetry.integration.pytorch_lightning": "telemetrain.integrations.lightning_trainer",
}

# Test ids relative to the peer file's name; each reason is ours and points at the docs/compat.md row.
_TORCH_EXPECTED = {
    "api_test.py::MetricsApiTest::test_profile":
        "patches metrics.api.getStream per call; our @prof routes at decoration (compat.md metrics: @prof key)",
    "api_test.py::MetricsApiTest::test_inheritance":
        "same as test_profile: getStream patched, @prof routes at decoration (compat.md metrics: @prof key)",
    "lib_test.py::RdzvEventLibTest::test_construct_and_record_rdzv_event_does_not_run_if_invalid_dest":
        "rendezvous events are recorded even for a NullHandler destination (compat.md events: rendezvous events)",
    "test_monitor.py::TestMonitorTensorboard::test_event_handler":
        "after max_samples the next window starts at once: [10, 35], not [10] (compat.md torch.monitor: max_samples)",
}

_RAISE_NOT = "misuse is recorded, not raised (compat.md nv-one-logger: misuse raises OneLoggerError)"
_ONCE_ONLY = "once-only rules are recorded, warned once, ignored (compat.md nv-one-logger: misuse, builder twice)"
_CONFIG_EARLY = "a training config set before on_app_start is sent at on_app_start (compat.md: set_training_...)"
_PROVIDER_TESTS = "test_training_telemetry_provider.py::TestTrainingTelemetryProvider::"
_PROVIDER_SET = "test_training_telemetry_provider.py::TestTrainingTelemetryProviderSetTrainingTelemetryConfig::"
_E2E = "test_app_e2e_scenarios.py::TestCrashScenariosWithRealExporter::"
_RECORDER = "test_training_recorder.py::TestTrainingRecorderUpdateApplicationSpanWithTrainingTelemetryConfig::"
_ONE_LOGGER_EXPECTED = {
    "test_callbacks.py::test_invalid_callback_usage": _RAISE_NOT,
    "test_training_recorder.py::test_span_with_same_name_active": _RAISE_NOT,
    _E2E + "test_timer_data_export_with_missing_first_iteration_end_and_complete_second_iteration": _RAISE_NOT,
    _E2E + "test_timer_data_export_with_new_iteration_start_before_old_iteration_end": _RAISE_NOT,
    _PROVIDER_TESTS + "test_with_base_config_called_twice_raises_error": _ONCE_ONLY,
    _PROVIDER_TESTS + "test_with_export_customization_called_twice_raises_error": _ONCE_ONLY,
    _PROVIDER_TESTS + "test_with_config_override_after_configure_provider_raises_error": _ONCE_ONLY,
    _PROVIDER_TESTS + "test_with_exporter_after_configure_provider_raises_error": _ONCE_ONLY,
    _PROVIDER_TESTS + "test_with_export_customization_after_configure_raises_error": _ONCE_ONLY,
    _PROVIDER_TESTS + "test_set_training_telemetry_config_already_set_raises_error_updated": _ONCE_ONLY,
    _PROVIDER_SET + "test_set_training_telemetry_config_already_set": _ONCE_ONLY,
    _PROVIDER_SET + "test_with_export_config_after_configure_provider_raises_error": _ONCE_ONLY,
    _PROVIDER_TESTS + "test_set_training_loop_config_deprecated": _CONFIG_EARLY,
    _RECORDER + "test_update_application_span_with_training_telemetry_config_no_app_span": _CONFIG_EARLY,
    _PROVIDER_SET + "test_set_training_telemetry_config_not_configured":
        "flips the private name-mangled __fully_configured flag (compat.md: nv-one-logger's own tests)",
    _RECORDER + "test_update_application_span_with_no_telemetry_config":
        "private method called with None: recorded, not raised (compat.md nv-one-logger: misuse)",
    _RECORDER + "test_update_application_span_skipped_when_disabled":
        "expects the per-call 'Skipping execution' log on a disabled rank (compat.md: enable_for_current_rank)",
}

_OL_TEST_FILES = (
    "test_callbacks.py", "test_context.py", "test_training_recorder.py", "test_training_telemetry_provider.py",
    "integration_test.py", "test_app_e2e_scenarios.py",
)
# the scratch package that holds one-logger's tests (they import each other relatively)
_OL_PACKAGE = "one_logger_tests"


def _peers(pytorch_rev: str | None, one_logger_rev: str | None) -> tuple[Peer, Peer]:
    def t(path: str, rev: str, dest: str) -> PeerFile:
        return PeerFile(path, pytorch_rev or rev, dest)

    torch_peer = Peer(
        name="pytorch",
        files=(
            t("test/distributed/elastic/metrics/api_test.py", _TORCH_API_TEST_REV, "api_test/api_test.py"),
            t("test/distributed/elastic/events/lib_test.py", _TORCH_LIB_TEST_REV, "lib_test/lib_test.py"),
            t("test/test_monitor.py", _TORCH_MONITOR_TEST_REV, "test_monitor/test_monitor.py"),
        ),
        mapping=_TORCH_MAPPING,
        peer_package="torch.distributed.elastic",
        separate_processes=True,
        expected_failures=_TORCH_EXPECTED,
    )
    ol_rev = one_logger_rev or _ONE_LOGGER_REV
    support = ("__init__.py", "conftest.py", "utils.py")
    one_logger = Peer(
        name="nv-one-logger",
        files=tuple(
            PeerFile(f"{_OL_TESTS}/{name}", ol_rev, f"{_OL_PACKAGE}/{name}", is_test=name in _OL_TEST_FILES)
            for name in support + _OL_TEST_FILES
        ),
        mapping=_ONE_LOGGER_MAPPING,
        peer_package="nv_one_logger",
        separate_processes=False,
        expected_failures=_ONE_LOGGER_EXPECTED,
    )
    return torch_peer, one_logger


# --- reading the peers' sources ----------------------------------------------------------------------------------


class SetupError(Exception):
    """The peer sources or the environment are not usable (exit status 2)."""


class PeerSource:
    """A git directory (bare or a checkout's) read at pinned revisions, or a plain directory tree read as it is."""

    def __init__(self, root: Path) -> None:
        if not root.is_dir():
            raise SetupError(f"{root}: not a directory")
        self.root = root
        self.git_dir: str | None = None
        probe = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--absolute-git-dir"], capture_output=True, text=True, check=False
        )
        if probe.returncode == 0:
            self.git_dir = probe.stdout.strip()

    def describe(self, rev: str) -> str:
        if self.git_dir is None:
            return f"{self.root} (plain tree: pins not checked)"
        return f"{self.git_dir} @ {rev}"

    def read(self, peer_file: PeerFile) -> str:
        if self.git_dir is None:
            path = self.root / peer_file.path
            if not path.is_file():
                raise SetupError(f"{path}: missing")
            return path.read_text(encoding="utf-8")
        shown = subprocess.run(
            ["git", "--git-dir", self.git_dir, "show", f"{peer_file.rev}:{peer_file.path}"],
            capture_output=True, text=True, check=False,
        )
        if shown.returncode != 0:
            raise SetupError(
                f"{self.git_dir}: cannot read {peer_file.rev}:{peer_file.path}: {shown.stderr.strip()} (a shallow "
                "clone lacks the pinned revisions: fetch them, choose one with --pytorch-rev/--one-logger-rev, or "
                "give a plain directory tree holding the files at their repository paths)"
            )
        return shown.stdout


# --- rewriting -----------------------------------------------------------------------------------------------------

_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\Z")


@dataclass
class Rewrite:
    text: str
    code_paths: int = 0  # module paths changed in code (imports)
    strings: list[tuple[str, str]] = field(default_factory=list)  # (old, new) dotted-path string literals
    kept: list[str] = field(default_factory=list)  # strings naming a peer path that telemetrain does not have


def _map_path(dotted: str, mapping: Mapping[str, str]) -> str | None:
    for key in sorted(mapping, key=len, reverse=True):
        if dotted == key or dotted.startswith(key + "."):
            return mapping[key] + dotted[len(key):]
    return None


def _code_pattern(mapping: Mapping[str, str]) -> re.Pattern[str]:
    keys = "|".join(re.escape(k) for k in sorted(mapping, key=len, reverse=True))
    return re.compile(rf"(?<![\w.])(?:{keys})(?![\w])")


def _offsets(source: str) -> list[int]:
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def rewrite_source(source: str, mapping: Mapping[str, str], resolvable: set[str]) -> Rewrite:
    """Change the module paths in ``source``: every one in code (imports); a string literal only when it is a whole
    dotted path under a mapped module that names something telemetrain has (``resolvable``), so that an event named
    ``"torch.monitor.TestEvent"`` stays as it is. Comments are not touched."""
    starts = _offsets(source)
    pattern = _code_pattern(mapping)
    edits: list[tuple[int, int, str]] = []
    result = Rewrite(source)
    code_start = 0

    def code_edits(begin: int, end: int) -> None:
        for match in pattern.finditer(source, begin, end):
            new = _map_path(match.group(0), mapping)
            assert new is not None
            edits.append((match.start(), match.end(), new))
            result.code_paths += 1

    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.STRING, tokenize.COMMENT):
            continue
        begin = starts[tok.start[0] - 1] + tok.start[1]
        end = starts[tok.end[0] - 1] + tok.end[1]
        code_edits(code_start, begin)
        code_start = end
        if tok.type != tokenize.STRING:
            continue
        try:
            value = ast.literal_eval(tok.string)
        except (ValueError, SyntaxError):
            continue
        if not isinstance(value, str) or not _DOTTED.match(value):
            continue
        new = _map_path(value, mapping)
        if new is None:
            continue
        if new in resolvable:
            quote = tok.string[-1]
            prefix = tok.string[: tok.string.index(quote)]
            edits.append((begin, end, f"{prefix}{quote}{new}{quote}"))
            result.strings.append((value, new))
        else:
            result.kept.append(value)
    code_edits(code_start, len(source))
    text = source
    for begin, end, new in sorted(edits, reverse=True):
        text = text[:begin] + new + text[end:]
    result.text = text
    return result


def string_candidates(source: str, mapping: Mapping[str, str]) -> set[str]:
    """The telemetrain paths that the dotted-path string literals of ``source`` would become."""
    found: set[str] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.STRING:
            continue
        try:
            value = ast.literal_eval(tok.string)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, str) and _DOTTED.match(value):
            new = _map_path(value, mapping)
            if new is not None:
                found.add(new)
    return found


_RESOLVE = """
import importlib, json, sys
ok = []
for path in json.loads(sys.stdin.read()):
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            break
        ok.append(path)
        break
print(json.dumps(ok))
"""


def resolve(paths: set[str], env: Mapping[str, str]) -> set[str]:
    """Those of ``paths`` that name a module or an attribute in telemetrain (checked in a process of its own)."""
    if not paths:
        return set()
    done = subprocess.run(
        [sys.executable, "-c", _RESOLVE], input=json.dumps(sorted(paths)), capture_output=True, text=True,
        env=dict(env), check=False,
    )
    if done.returncode != 0:
        raise SetupError(f"cannot import telemetrain to resolve dotted paths:\n{done.stderr}")
    return set(json.loads(done.stdout))


def leftover_imports(source: str, package: str) -> list[str]:
    """Imports of the peer's own package still in ``source`` after rewriting (an incomplete mapping)."""
    left: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        left += [name for name in names if name == package or name.startswith(package + ".")]
    return left


# --- running -------------------------------------------------------------------------------------------------------

# A pytest plugin of ours, written into the scratch directory: one outcome per test id, as JSON.
_PLUGIN = '''
import json
import os
import sys

_outcomes = {}


def _note(nodeid, outcome, message):
    previous = _outcomes.get(nodeid)
    if previous is None or previous[0] == "passed" or outcome == "failed":
        if previous is not None and previous[0] == "failed":
            return
        _outcomes[nodeid] = (outcome, message)


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.splitlines()[0] if crash.message else ""
    text = str(report.longrepr or "").strip().splitlines()
    return text[-1] if text else ""


def pytest_runtest_logreport(report):
    if report.failed:
        _note(report.nodeid, "failed", _message(report))
    elif report.skipped:
        _note(report.nodeid, "skipped", _message(report))
    elif report.when == "call":
        _note(report.nodeid, "passed", "")


def pytest_collectreport(report):
    if report.failed:
        _note(report.nodeid or "<collection>", "failed", "collection error: " + _message(report))


def pytest_sessionfinish(session, exitstatus):
    leaked = sorted(m for m in sys.modules if m == "nv_one_logger" or m.startswith("nv_one_logger."))
    with open(os.environ["PEER_CONTRACTS_RESULTS"], "w", encoding="utf-8") as out:
        json.dump({"outcomes": _outcomes, "peer_modules_loaded": leaked}, out)
'''


@dataclass
class Outcome:
    test_id: str  # relative to the peer file's name: "api_test.py::MetricsApiTest::test_profile"
    outcome: str  # passed, failed, skipped
    message: str


def _short_id(nodeid: str) -> str:
    path, sep, rest = nodeid.partition("::")
    return Path(path).name + sep + rest


def run_pytest(
    directory: Path, targets: Sequence[str], env: Mapping[str, str], results: Path, timeout: float
) -> tuple[list[Outcome], list[str], str]:
    """pytest on ``targets`` in ``directory``; the outcomes, the peer modules it loaded, the tail of its output."""
    (directory / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    run_env = dict(env)
    run_env["PEER_CONTRACTS_RESULTS"] = str(results)
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "peer_contracts_plugin", "-p", "no:cacheprovider",
        f"--rootdir={directory}", "-c", str(directory / "pytest.ini"), *targets,
    ]
    try:
        done = subprocess.run(
            command, cwd=directory, env=run_env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise SetupError(f"pytest in {directory} ran past {timeout:.0f} s") from exc
    output = done.stdout + done.stderr
    tail = "\n".join(output.strip().splitlines()[-3:])
    if not results.is_file():
        raise SetupError(f"pytest in {directory} left no results (exit {done.returncode}):\n{output[-4000:]}")
    data = json.loads(results.read_text(encoding="utf-8"))
    outcomes = [Outcome(_short_id(nodeid), o, m) for nodeid, (o, m) in sorted(data["outcomes"].items())]
    return outcomes, list(data["peer_modules_loaded"]), tail


@dataclass
class PeerReport:
    peer: str
    source: str
    per_file: dict[str, dict[str, int]] = field(default_factory=dict)
    unexpected: list[Outcome] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    expected_failed: int = 0
    problems: list[str] = field(default_factory=list)


def run_peer(
    peer: Peer, source: PeerSource, scratch: Path, env: Mapping[str, str], timeout: float, verbose: bool
) -> PeerReport:
    root = scratch / peer.name
    root.mkdir(parents=True, exist_ok=True)
    revs = sorted({f.rev for f in peer.files})
    report = PeerReport(peer.name, "; ".join(sorted({source.describe(rev) for rev in revs})))
    texts = {f: source.read(f) for f in peer.files}
    candidates: set[str] = set()
    for text in texts.values():
        candidates |= string_candidates(text, peer.mapping)
    resolvable = resolve(candidates, env)
    for peer_file, text in texts.items():
        rewritten = rewrite_source(text, peer.mapping, resolvable)
        dest = root / peer_file.dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(rewritten.text, encoding="utf-8")
        left = leftover_imports(rewritten.text, peer.peer_package)
        if left:
            report.problems.append(f"{peer_file.dest}: imports not mapped: {', '.join(sorted(set(left)))}")
        if verbose:
            print(
                f"  {peer_file.dest}: {rewritten.code_paths} module paths in code, "
                f"{len(rewritten.strings)} dotted-path strings rewritten"
                + (f"; kept as they are: {sorted(set(rewritten.kept))}" if rewritten.kept else "")
            )
    tests = [f for f in peer.files if f.is_test]
    groups: list[tuple[Path, list[str]]]
    if peer.separate_processes:
        groups = [((root / f.dest).parent, [Path(f.dest).name]) for f in tests]
    else:
        groups = [(root, [f.dest for f in tests])]
    outcomes: list[Outcome] = []
    for index, (directory, targets) in enumerate(groups):
        found, leaked, tail = run_pytest(directory, targets, env, root / f"results-{index}.json", timeout)
        if leaked:
            report.problems.append(f"the peer's own modules were imported: {', '.join(leaked)}")
        if verbose:
            print(f"  pytest {' '.join(targets)}: {tail.splitlines()[-1] if tail else '(no output)'}")
        outcomes += found
    seen = {o.test_id for o in outcomes}
    for test in tests:
        name = Path(test.dest).name
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        for o in outcomes:
            if o.test_id.partition("::")[0] == name:
                counts[o.outcome] = counts.get(o.outcome, 0) + 1
        report.per_file[name] = counts
    for o in outcomes:
        if o.outcome != "failed":
            continue
        if o.test_id in peer.expected_failures:
            report.expected_failed += 1
        else:
            report.unexpected.append(o)
    for test_id in peer.expected_failures:
        if test_id not in seen:
            report.stale.append(f"{test_id} (not found)")
        elif any(o.test_id == test_id and o.outcome == "passed" for o in outcomes):
            report.stale.append(f"{test_id} (passes now)")
    return report


# --- nv-one-logger's docs/example.py ---------------------------------------------------------------------------

_EXPORT_FILE = "training_telemetry.json"
# what the example's run must export: (record type, span or event name)
_EXAMPLE_EXPORTS = (
    ("start", "application"), ("stop", "application"), ("start", "training_loop"), ("stop", "training_loop"),
    ("start", "checkpoint_save_sync"), ("stop", "checkpoint_save_sync"), ("complete", "loss_calculation_span"),
    ("event", "one_logger_initialization"), ("event", "update_training_telemetry_config"),
    ("event", "training_metrics_update"), ("event", "save_checkpoint_success"),
)


def run_example(
    source: PeerSource, rev: str, scratch: Path, env: Mapping[str, str], timeout: float
) -> tuple[list[str], list[str]]:
    """Run one-logger's example (imports rewritten) in a scratch directory of its own with a run store there; check
    that its spans and events reach the file exporter, the run store and ``telemetrain report``. Returns (facts,
    problems)."""
    work = scratch / "nv-one-logger-example"
    work.mkdir(parents=True, exist_ok=True)
    peer_file = PeerFile(_OL_EXAMPLE, rev, "example.py", is_test=False)
    text = source.read(peer_file)
    rewritten = rewrite_source(text, _ONE_LOGGER_MAPPING, resolve(string_candidates(text, _ONE_LOGGER_MAPPING), env))
    (work / "example.py").write_text(rewritten.text, encoding="utf-8")
    facts: list[str] = []
    problems = [f"example.py: imports not mapped: {m}" for m in leftover_imports(rewritten.text, "nv_one_logger")]
    store = work / "runs"
    run_env = {**env, "TELEMETRAIN_DIR": str(store)}
    try:
        done = subprocess.run(
            [sys.executable, "example.py"], cwd=work, env=run_env, capture_output=True, text=True, timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return facts, [f"example.py ran past {timeout:.0f} s"]
    if done.returncode != 0:
        return facts, [f"example.py exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"]
    facts.append(f"example.py exited 0 ({len(done.stdout.splitlines())} lines printed)")

    # the file exporter: one JSON object a line, spans (start/stop/complete) and events
    exported = sorted(work.glob("training_telemetry*.json"))
    if not exported:
        problems.append(f"no {_EXPORT_FILE} written by the FileExporter")
    else:
        seen: dict[tuple[str, str], int] = {}
        for path in exported:
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    record = json.loads(line)
                    kind = str(record.get("type"))
                    inner = record.get("event")
                    name = inner.get("name") if kind == "event" and isinstance(inner, dict) else record.get("name")
                    seen[(kind, str(name))] = seen.get((kind, str(name)), 0) + 1
        by_kind: dict[str, int] = {}
        for (kind, _), count in seen.items():
            by_kind[kind] = by_kind.get(kind, 0) + count
        facts.append(
            f"file exporter ({', '.join(p.name for p in exported)}): "
            + ", ".join(f"{kind} {count}" for kind, count in sorted(by_kind.items()))
        )
        missing = [f"{kind} {name}" for kind, name in _EXAMPLE_EXPORTS if (kind, name) not in seen]
        if missing:
            problems.append(f"file exporter: missing {', '.join(missing)}")

    # the run store: `telemetrain show` on it, then `telemetrain report`
    if not store.is_dir() or not any(store.iterdir()):
        problems.append(f"no run store under {store}")
        return facts, problems
    cli = [sys.executable, "-m", "telemetrain.cli"]
    shown = subprocess.run(
        [*cli, "show", str(store)], cwd=work, env=run_env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if shown.returncode != 0:
        problems.append(f"telemetrain show exited {shown.returncode}: {shown.stderr.strip()[-1000:]}")
    else:
        lines = shown.stdout.splitlines()
        records = next((line for line in lines if line.startswith("records")), "")
        facts.append("run store: " + " ".join(records.split()))
        for kind in ("span_start", "span_end", "event", "metric"):
            if f" {kind} " not in records + " ":
                problems.append(f"run store: no {kind} records ({records.strip()!r})")
        events = set(" ".join(lines).split())
        missing = [name for kind, name in _EXAMPLE_EXPORTS if kind == "event" and name not in events]
        if missing:
            problems.append(f"run store: events missing: {', '.join(missing)}")
        training = next((line for line in lines if line.startswith("training ")), "")
        if " 320 iterations" not in training:
            problems.append(f"run store: expected 320 iterations (10 epochs of 32 batches): {training.strip()!r}")
        else:
            facts.append("run store: " + " ".join(training.split()))
    html = work / "report.html"
    reported = subprocess.run(
        [*cli, "report", "-o", str(html), str(store)], cwd=work, env=run_env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )
    if reported.returncode != 0 or not html.is_file():
        problems.append(f"telemetrain report exited {reported.returncode}: {reported.stderr.strip()[-1000:]}")
    else:
        page = html.read_text(encoding="utf-8")
        absent = [name for kind, name in _EXAMPLE_EXPORTS if kind == "event" and name not in page]
        if absent:
            problems.append(f"telemetrain report: {html.name} does not name {', '.join(absent)}")
        facts.append(f"telemetrain report: {html.name}, {len(page):,} bytes, names the example's events")
    return facts, problems


# --- command line --------------------------------------------------------------------------------------------------


def _environment(extra_paths: Sequence[str]) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(SRC), *extra_paths, ""]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.pop("TELEMETRAIN_DIR", None)
    return env


def _check_torch_testing(env: Mapping[str, str]) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import torch.testing._internal.common_utils"], env=dict(env), capture_output=True,
        text=True, check=False,
    )
    if probe.returncode != 0:
        last = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else ""
        raise SetupError(
            "torch's test utilities do not import (" + last + "); torch's tests need them. If a module is missing "
            "(expecttest is not among this project's dependencies), install it outside the project's venv, e.g. "
            "`pip install --target DIR expecttest`, and pass --extra-path DIR"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pytorch", type=Path, help="a checkout or git directory of pytorch/pytorch")
    parser.add_argument("--one-logger", type=Path, help="a checkout or git directory of NVIDIA/nv-one-logger")
    parser.add_argument("--pytorch-rev", help="read all three torch test files at this revision (default: the pins)")
    parser.add_argument("--one-logger-rev", help=f"nv-one-logger revision (default: {_ONE_LOGGER_REV[:12]}, 2.3.1)")
    parser.add_argument("--scratch", type=Path, help="scratch directory outside the repository (default: a tempdir)")
    parser.add_argument("--keep", action="store_true", help="keep the default temporary scratch directory")
    parser.add_argument("--extra-path", action="append", default=[], metavar="DIR",
                        help="a directory put on PYTHONPATH after the repository's src (e.g. one holding expecttest)")
    parser.add_argument("--strict", action="store_true", help="an expected failure that passes now is an error too")
    parser.add_argument("--no-example", action="store_true", help="skip nv-one-logger's docs/example.py")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for each pytest or example process")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the rewriting and pytest's last lines")
    return parser


def _inside_repo(path: Path) -> bool:
    try:
        path.resolve().relative_to(REPO)
    except ValueError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.pytorch is None and args.one_logger is None:
        print("peer_contracts: give --pytorch and/or --one-logger", file=sys.stderr)
        return 2
    if args.scratch is not None and _inside_repo(args.scratch):
        print("peer_contracts: the scratch directory must be outside the repository", file=sys.stderr)
        return 2
    env = _environment(args.extra_path)
    temporary = args.scratch is None
    scratch = Path(tempfile.mkdtemp(prefix="peer-contracts-")) if temporary else args.scratch
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "peer_contracts_plugin.py").write_text(_PLUGIN, encoding="utf-8")
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(scratch)])
    torch_peer, one_logger = _peers(args.pytorch_rev, args.one_logger_rev)
    reports: list[PeerReport] = []
    example: tuple[list[str], list[str]] | None = None
    try:
        if args.pytorch is not None:
            _check_torch_testing(env)
            reports.append(run_peer(torch_peer, PeerSource(args.pytorch), scratch, env, args.timeout, args.verbose))
        if args.one_logger is not None:
            source = PeerSource(args.one_logger)
            reports.append(run_peer(one_logger, source, scratch, env, args.timeout, args.verbose))
            if not args.no_example:
                example = run_example(source, args.one_logger_rev or _ONE_LOGGER_REV, scratch, env, args.timeout)
    except SetupError as exc:
        print(f"peer_contracts: {exc}", file=sys.stderr)
        return 2
    finally:
        if temporary and not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    failed = False
    for report in reports:
        print(f"{report.peer}: {report.source}")
        for name, counts in report.per_file.items():
            total = sum(counts.values())
            line = f"  {name}: {counts['passed']}/{total} passed, {counts['failed']} failed"
            print(line + (f", {counts['skipped']} skipped" if counts["skipped"] else ""))
        print(f"  expected failures: {report.expected_failed} of {len(_expected(report.peer))} documented")
        for outcome in report.unexpected:
            print(f"  UNEXPECTED FAILURE {outcome.test_id}: {outcome.message}")
        for stale in report.stale:
            print(f"  STALE expected failure {stale}")
        for problem in report.problems:
            print(f"  PROBLEM {problem}")
        failed |= bool(report.unexpected or report.problems) or (args.strict and bool(report.stale))
    if example is not None:
        facts, problems = example
        print("nv-one-logger docs/example.py:")
        for fact in facts:
            print(f"  {fact}")
        for problem in problems:
            print(f"  PROBLEM {problem}")
        failed |= bool(problems)
    if not temporary or args.keep:
        print(f"scratch: {scratch}")
    print("peer contracts: " + ("FAILED" if failed else "OK"))
    return 1 if failed else 0


def _expected(peer: str) -> Mapping[str, str]:
    return _TORCH_EXPECTED if peer == "pytorch" else _ONE_LOGGER_EXPECTED


if __name__ == "__main__":
    sys.exit(main())
