"""The ``telemetrain report`` command."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..cli_common import CLIError, resolve_run
from ..output_file import check_output
from ..store.reader import NotARunError
from ..text import printable

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add this module's subcommands to the ``telemetrain`` parser (``sub`` is its subparsers action)."""
    report = sub.add_parser(
        "report",
        help="write a run's HTML report",
        description=(
            "Write one self-contained HTML file (static SVG charts, no script, works offline) about a run: identity "
            "and config, throughput, MFU, goodput, energy, time by phase, iteration time, a per-rank heatmap with "
            "stragglers, system samples, checkpoints and restarts, events and errors, and the anomalies found. "
            "RUN_DIR may also be a session directory or a store root: the newest run under it is reported; "
            "without RUN_DIR, the newest run under $TELEMETRAIN_DIR (else ./telemetrain-runs). "
            "See `telemetrain docs report`."
        ),
    )
    report.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run directory, or a directory holding runs")
    report.add_argument("-o", "--output", default="report.html", help="output file (default: %(default)s)")
    bar = report.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="show a progress bar on stderr (default: only when stderr is a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="never show it")
    report.set_defaults(run=_cmd_report)


def _cmd_report(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from . import write_report
    from .progress import TextProgress

    path = resolve_run(args.run_dir, err)
    try:
        check_output(args.output)
    except OSError as exc:
        raise CLIError(str(exc)) from None
    show = args.progress if args.progress is not None else bool(getattr(err, "isatty", lambda: False)())
    bar = TextProgress(err) if show else None
    try:
        written = write_report(path, args.output, progress=bar)
    except (OSError, NotARunError) as exc:  # FileNotFoundError included: the directory went away meanwhile
        raise CLIError(str(exc)) from None
    finally:
        if bar is not None:
            bar.close()
    print(printable(f"wrote {written} ({written.stat().st_size:,} bytes) for run {path}"), file=out)
    return 0
