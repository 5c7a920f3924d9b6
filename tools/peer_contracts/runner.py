"""Running a peer's rewritten tests under pytest (with a result-collecting plugin) and judging the outcome."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .expected import Peer
from .rewrite import leftover_imports, resolve, rewrite_source, string_candidates
from .sources import PeerSource, SetupError

# A pytest plugin of ours, written into the scratch directory: one outcome per test id, as JSON.
PLUGIN = '''
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

