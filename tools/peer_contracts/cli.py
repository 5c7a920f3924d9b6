"""The command line: arguments, the environment for the peers' processes, the runs and the summary."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import __doc__ as PACKAGE_DOC
from .example import run_example
from .expected import ONE_LOGGER_REV, documented_failures, peers
from .runner import PLUGIN, PeerReport, run_peer
from .sources import PeerSource, SetupError

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"


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
    parser = argparse.ArgumentParser(
        prog="python -m tools.peer_contracts", description=PACKAGE_DOC.splitlines()[0] if PACKAGE_DOC else None
    )
    parser.add_argument("--pytorch", type=Path, help="a checkout or git directory of pytorch/pytorch")
    parser.add_argument("--one-logger", type=Path, help="a checkout or git directory of NVIDIA/nv-one-logger")
    parser.add_argument("--pytorch-rev", help="read all three torch test files at this revision (default: the pins)")
    parser.add_argument("--one-logger-rev", help=f"nv-one-logger revision (default: {ONE_LOGGER_REV[:12]}, 2.3.1)")
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
    (scratch / "peer_contracts_plugin.py").write_text(PLUGIN, encoding="utf-8")
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(scratch)])
    torch_peer, one_logger = peers(args.pytorch_rev, args.one_logger_rev)
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
                example = run_example(source, args.one_logger_rev or ONE_LOGGER_REV, scratch, env, args.timeout)
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
        print(f"  expected failures: {report.expected_failed} of {len(documented_failures(report.peer))} documented")
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

