"""The ``telemetrain`` command: ``demo`` writes a run from a small real training job, ``show`` summarises a run.

Standard library only at import: torch is imported by ``demo`` alone, when it runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from . import guides
from ._version import __version__
from .analysis import commands as analysis_commands
from .cli_common import CLIError, fmt_value, int_at_least, quoted, resolve_run
from .distributed import commands as launch_commands
from .output_file import check_output
from .report import commands as report_commands
from .show import _cmd_show, summarize
from .store import commands as store_commands
from .store.allocator import one_c_heap
from .store.columnar import ColumnarVersionError
from .store.layout import default_root
from .store.reader import NotARunError
from .text import printable

__all__ = ["main", "summarize"]

DEFAULT_DEMO_STEPS = 800  # ~10-20 s on a 2-core CPU
TORCH_PIN = "torch==2.13.0"


# -- demo --------------------------------------------------------------------------------------------------------------


def _demo_root(args: argparse.Namespace) -> Path:
    """The run store the demo writes to, created now: a root that cannot be (a file, no permission) is one error line
    here, not a traceback, or a launcher's failure banner, after the training started."""
    root = Path(args.root) if args.root is not None else default_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CLIError(f"{root} is a file; the run store is a directory (--root DIR)") from None
    except OSError as exc:
        raise CLIError(f"cannot create the run store {root}: {exc.strerror or exc}") from None
    return root


def _cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if importlib.util.find_spec("torch") is None:
        raise CLIError(f"the demo needs PyTorch, which is not installed: pip install {TORCH_PIN}")
    root = _demo_root(args)
    if args.trace is not None:  # written at the end: a path that cannot be must not cost the whole demo first
        target = Path(args.trace)
        if not target.parent.is_dir():
            raise CLIError(f"cannot write {target}: the directory {target.parent} does not exist")
        if target.is_dir():
            raise CLIError(f"cannot write {target}: it is a directory")
    with warnings.catch_warnings():
        # A CPU torch without numpy warns at import; the demo never uses numpy.
        warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")
        from .demo.backends import Backends
        from .demo.launched import run_launched_demo
        from .demo.session import run_demo
        from .demo.train import DemoConfig

    backends = Backends(prometheus=args.prometheus, otel=args.otel, tensorboard=args.tensorboard, mlflow=args.mlflow,
                        trace=args.trace)
    cfg = DemoConfig(steps=args.steps, seed=args.seed)
    if args.in_process:
        result = run_demo(cfg, root=root, console=args.console, out=out, crash=args.crash, backends=backends)
        run_dir = result.run_dir.absolute()
        print(
            f"done: {result.steps} steps in {result.seconds:.1f} s, val loss {fmt_value(result.val_loss)}, "
            f"accuracy {result.val_accuracy:.1%}",
            file=out,
        )
        print(f"sample: {result.sample!r}", file=out)
    else:
        launched = run_launched_demo(cfg, root=root, nproc=args.nproc, crash=args.crash, console=args.console,
                                     backends=backends, out=out)
        if launched.status > 128:  # a signal (Ctrl-C): the launcher has said which, and stopped the ranks
            where = f"; its run so far: {quoted(launched.run_dir)}" if launched.run_dir is not None else ""
            print(f"telemetrain demo: interrupted{where}", file=err)
            return launched.status
        if launched.run_dir is None:
            raise CLIError(f"the launched demo wrote no run under {launched.session_dir}")
        run_dir = launched.run_dir.absolute()
        if launched.status != 0:
            print(f"the demo job failed (exit status {launched.status}); its run: {run_dir}", file=err)
            return launched.status
        if backends.trace is not None:
            from .trace import export_trace

            written = export_trace(launched.session_dir, backends.trace)
            print(f"trace: {written.path} ({written.events} events): open it in https://ui.perfetto.dev", file=out)
    print(f"run: {run_dir}", file=out)
    from .report import write_report

    report = write_report(run_dir)
    print(f"report: {report}  (open it in a browser; it covers the session's restarts too)", file=out)
    print(f"see it with: telemetrain show {quoted(run_dir)}   (the session's goodput covers every attempt)", file=out)
    return 0


# -- trace -------------------------------------------------------------------------------------------------------------


def _cmd_trace(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .trace import export_trace

    try:
        source = args.run_dir if args.run_dir is not None else resolve_run(None, err).parent
        check_output(args.output)
        result = export_trace(source, args.output, max_per_name=args.max_per_name, all_metrics=args.all_metrics)
    except (OSError, NotARunError) as exc:
        raise CLIError(str(exc)) from None
    dropped = sum(n for kinds in result.dropped.values() for names in kinds.values() for n in names.values())
    note = f", {dropped} left out by --max-per-name" if dropped else ""
    print(f"wrote {printable(str(result.path))} ({result.size_bytes} bytes, {result.events} events, {result.processes} "
          f"process(es){note}); open it in https://ui.perfetto.dev", file=out)
    return 0


# -- entry point -----------------------------------------------------------------------------------------------------


_positive_int = int_at_least(1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="telemetrain", description="Telemetry for PyTorch training jobs: write a demo run, summarise runs."
    )
    parser.add_argument("--version", action="version", version=f"telemetrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Commands that live with what they drive; each sets ``run(args, out, err) -> int`` as its default.
    launch_commands.register(sub)
    report_commands.register(sub)
    analysis_commands.register(sub)
    store_commands.register(sub)
    guides.register(sub)

    demo = sub.add_parser(
        "demo",
        help="train a small real model on the CPU and write its run",
        description=(
            "Train a next-character GRU (~47k parameters) on the source code of a few Python standard-library "
            "modules (read from this Python install; nothing is downloaded), recording metrics, events and a "
            f"checkpoint into the run store. Needs {TORCH_PIN}."
        ),
    )
    demo.add_argument(
        "--steps", type=_positive_int, default=DEFAULT_DEMO_STEPS, help="training steps (default: %(default)s)"
    )
    demo.add_argument(
        "--root", help="run store root (default: $TELEMETRAIN_DIR, else ./telemetrain-runs)", metavar="DIR"
    )
    demo.add_argument("--seed", type=int, default=0, help="random seed; same seed, same run (default: %(default)s)")
    demo.add_argument("--nproc", type=_positive_int, default=2,
                      help="gloo ranks on this CPU, under `telemetrain launch` (default: %(default)s)")
    demo.add_argument("--in-process", action="store_true",
                      help="train in this process instead, without the launcher (one rank; the preemption is a "
                      "SIGTERM to a first child process)")
    demo.add_argument("--console", action="store_true", help="also print every record to stderr")
    demo.add_argument("--prometheus", action="store_true",
                      help="serve the metrics for Prometheus on 127.0.0.1:9464 (needs telemetrain[prometheus])")
    demo.add_argument("--otel", action="store_true",
                      help="export spans and metrics by OTLP/HTTP to $OTEL_EXPORTER_OTLP_ENDPOINT (default "
                      "localhost:4318; needs telemetrain[otel])")
    demo.add_argument("--tensorboard", metavar="DIR", help="write TensorBoard event files under DIR "
                      "(needs telemetrain[tensorboard])")
    demo.add_argument("--mlflow", metavar="URI", help="log to the MLflow tracking URI, e.g. file:///tmp/mlruns "
                      "(needs telemetrain[mlflow])")
    demo.add_argument("--trace", metavar="FILE", help="at the end, write the session as a Perfetto/Chrome trace")
    demo.add_argument(
        "--no-crash",
        dest="crash",
        action="store_false",
        help="do not simulate the preemption and restart (by default the last rank of the first attempt gets SIGTERM "
        "at 60%% of the steps, the elastic agent restarts the job, and the second attempt resumes from the last "
        "checkpoint, in the same session)",
    )

    show = sub.add_parser(
        "show",
        help="summarise a run",
        description=(
            "Summarise a run: identity, processes, time span, records per kind and group, the last value of every "
            "metric, every stat's last window, the checkpoint saves across the ranks, events by name, and problems "
            "(torn or corrupt lines, diagnostics, spans that ended not ok). RUN_DIR may also be a session directory "
            "or a store root: the newest run under it is shown, with a note on stderr. Without RUN_DIR, the newest "
            "run under $TELEMETRAIN_DIR (else ./telemetrain-runs)."
        ),
    )
    show.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run directory, or a directory holding runs")
    show.add_argument("--list", action="store_true", help="list the runs under RUN_DIR (oldest first) instead")
    show.add_argument("--all", action="store_true",
                      help="a row for every process, agent and sampled host (default: the first ones and the "
                           "outliers when there are more than 16)")
    show.add_argument("--json", action="store_true",
                      help="print the summary (with --list: the listing) as one JSON object: every figure, the "
                           "last report window as recorded, the goodput, the findings (for scripts and CI)")

    trace = sub.add_parser(
        "trace",
        help="write a run's timeline as a Chrome trace for Perfetto",
        description=(
            "Write the spans, throughput and system counters, and events of a run (or of every run under a session "
            "directory: restarts and ranks side by side) as a Chrome Trace Event Format JSON file, to open in "
            "https://ui.perfetto.dev or chrome://tracing."
        ),
    )
    trace.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                       help="a run directory, or a directory holding runs; default: the newest run's session (its "
                       "restarts side by side)")
    trace.add_argument("-o", "--output", default="trace.json", help="output file (default: %(default)s)")
    trace.add_argument("--max-per-name", type=_positive_int, default=5000,
                       help="at most this many spans, counter points and instants per name and process, evenly "
                       "spaced (default: %(default)s)")
    trace.add_argument("--all-metrics", action="store_true",
                       help="every numeric metric as a counter track, not only throughput and the main system samples")
    for command in sub.choices.values():  # so that main can report a stray argument with the command's own usage
        command.set_defaults(command_parser=command)
    return parser


# the commands that read runs through DuckDB, in a process of their own (``console``)
_READERS = frozenset({"report", "compare", "goodput", "show", "trace", "tail", "query", "compact"})


def console() -> int:
    """The ``telemetrain`` command (and ``python -m telemetrain.cli``): ``main`` on ``sys.argv``, in a process that is
    the command's own, so that a reader may shape the process's C heap first (``store.allocator.one_c_heap``; a
    library call, ``main`` included, leaves its caller's process as it is)."""
    if sys.argv[1:2] and sys.argv[1] in _READERS:
        one_c_heap()
    return main()


def _printable_warnings(shown: Callable[..., str]) -> Callable[..., str]:
    """``formatwarning`` with the message's control characters escaped: a warning may quote a path or a name from a
    run store someone else wrote (recorders, ``-W error`` and ``pytest.warns`` see the warning itself)."""

    def format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                       line: str | None = None) -> str:
        return shown(printable(str(message)), category, filename, lineno, line)

    return format_warning


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for a usage or input error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["launch"]:  # torchrun's flags go to torchrun's own parser, untouched
        try:
            return launch_commands.run_launch(argv[1:])
        except CLIError as exc:
            print(f"telemetrain: error: {printable(str(exc))}", file=sys.stderr)
            return 2
        except SystemExit as exc:  # torchrun's parser: --help, usage errors (it has printed them)
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    parser = build_parser()
    try:
        args, stray = parser.parse_known_args(argv)
        if stray:  # parse_args would print the top-level usage, which does not show the command's flags
            getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(stray)}")
    except SystemExit as exc:  # --help, --version and usage errors: argparse has printed what it had to
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    out, err = sys.stdout, sys.stderr
    shown = warnings.formatwarning
    warnings.formatwarning = _printable_warnings(shown)
    try:
        return _run_command(args, parser, out, err)
    finally:
        warnings.formatwarning = shown


def _run_command(args: argparse.Namespace, parser: argparse.ArgumentParser, out: TextIO, err: TextIO) -> int:
    try:
        if args.command == "demo":
            return _cmd_demo(args, out, err)
        if args.command == "show":
            return _cmd_show(args, out, err)
        if args.command == "trace":
            return _cmd_trace(args, out, err)
        run = getattr(args, "run", None)
        if run is not None:
            return int(run(args, out, err))
        parser.print_help(out)
        return 2
    except (CLIError, PermissionError, ColumnarVersionError) as exc:  # paths may hold control characters: escaped
        print(f"telemetrain: error: {printable(str(exc))}", file=err)
        return 2
    except KeyboardInterrupt:
        print("telemetrain: interrupted", file=err)
        return 130
    except BrokenPipeError:
        # `telemetrain show | head`: the reader left; stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(console())
