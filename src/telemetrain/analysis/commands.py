"""The ``telemetrain compare, goodput and tail`` commands."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from ..cli_common import CLIError, int_at_least, json_value, resolve_run
from ..output_file import check_output, write_output
from ..report.curves import pick_loss
from ..report.progress import TextProgress
from ..store.reader import NotARunError, find_runs
from ..text import printable
from .compare import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MIN_EFFECT,
    DEFAULT_RESAMPLES,
    WorkloadMismatch,
    compare_runs,
)
from .compare_model import RunRef
from .compare_multi import compare_baselines
from .compare_quality import quality_series
from .samples import RunSamples, open_run_meta, read_samples, run_bytes

__all__ = ["register"]

_PROGRESS_FROM_BYTES = 32 << 20  # smaller runs load in about a second: no bar
DEFAULT_HISTORY = 5  # earlier runs of the perf tag read for the between-run spread
_RICH_MISSING = 'needs rich, which is not installed: pip install "telemetrain[report]"'


def _fraction(text: str) -> float:
    """``0.03``, ``3%``."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or percentage: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def register(sub: Any) -> None:
    """Add this module's subcommands to the ``telemetrain`` parser (``sub`` is its subparsers action)."""
    compare = sub.add_parser(
        "compare",
        help="compare runs' iteration time and throughput against a baseline",
        description=(
            "Compare each RUN_DIR with a baseline run: median iteration time, throughput, each phase's time, "
            "checkpoint saves and loads, validation loops, each rank's iteration time and phases, with a bootstrap "
            "confidence interval of the candidate/baseline ratio; and goodput (shown, one value per run). A change "
            "is a regression or improvement only when the whole interval lies beyond --min-effect, or beyond the "
            "spread of up to --history earlier runs with the same perf_tag when there are at least 3; it is "
            "inconclusive when a busier machine explains it. The baseline is --baseline, else the newest other "
            "run with --perf-tag (default: the first candidate's perf_tag) under --root (default: the candidate's "
            "store root) that its config marked is_baseline_run, else the newest such run. Runs whose perf_tags "
            "differ are refused unless --force. Several baselines (--baseline repeated, or --baselines N): each "
            "candidate is compared with each baseline, one block per baseline, then per metric against how many "
            "baselines it regressed; --fail-on-regression then fails only on a metric that regressed against "
            "every baseline."
        ),
    )
    compare.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="candidate run(s)")
    which = compare.add_mutually_exclusive_group()
    which.add_argument("--baseline", metavar="RUN_DIR", action="append",
                       help="a baseline run; repeat it to compare with several")
    which.add_argument("--perf-tag", metavar="TAG", help="baseline: the newest other run with this perf_tag")
    compare.add_argument("--baselines", type=int, metavar="N",
                         help="the N newest other runs with the perf_tag (--perf-tag, else the first candidate's) "
                         "as baselines, those marked is_baseline_run first (default: 1)")
    compare.add_argument("--root", metavar="DIR", help="where --perf-tag looks for the baseline")
    compare.add_argument("--force", action="store_true", help="compare even if the perf_tags or the recorded "
                         "workloads (FLOPs per sample, world size, batch size, sequence length) differ")
    compare.add_argument("--confidence", type=_fraction, default=DEFAULT_CONFIDENCE, metavar="LEVEL",
                         help="confidence level of the interval (default: %(default)s)")
    compare.add_argument("--min-effect", type=_fraction, default=DEFAULT_MIN_EFFECT, metavar="FRACTION",
                         help="smallest relative change reported as significant, e.g. 0.03 or 3%% (default: "
                         "%(default)s)")
    compare.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, metavar="N",
                         help="bootstrap resamples (default: %(default)s)")
    compare.add_argument("--seed", type=int, default=0, metavar="N", help="bootstrap seed (default: %(default)s)")
    compare.add_argument("--history", type=int, default=DEFAULT_HISTORY, metavar="N",
                         help="earlier runs with the perf_tag whose spread sets the noise (0: none; default: "
                         "%(default)s)")
    compare.add_argument("--no-goodput", action="store_true",
                         help="leave out the goodput row (it reads the whole runs)")
    compare.add_argument("--loss", metavar="NAME", help="the metric the quality comparison reads, NAME or "
                         "GROUP/NAME (default: one named loss, train/loss, ..., else the first ending in loss)")
    compare.add_argument("--html", metavar="FILE", help="also write the comparison as a self-contained HTML page")
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON instead of a table")
    compare.add_argument("--fail-on-regression", action="store_true",
                         help="exit with status 1 when a regression is found (for CI); with several baselines, "
                         "when a metric regressed against every baseline (a change one noisy baseline cannot "
                         "explain); with status 2 when nothing could be tested of a candidate")
    compare.set_defaults(run=_cmd_compare)

    goodput = sub.add_parser(
        "goodput",
        help="goodput and badput of a session across its restarts",
        description=(
            "Goodput of a session (every restart of one job): productive time against each badput category "
            "(initialization, checkpoint load and save, data wait, lost progress, validation, idle), and one row per "
            "attempt. SESSION_DIR is <root>/<session_tag>; a run directory stands for its session, a store root of "
            "one session for that session; without it, the session of the newest run under $TELEMETRAIN_DIR "
            "(default ./telemetrain-runs). "
            "See `telemetrain docs goodput`."
        ),
    )
    goodput.add_argument("session_dir", nargs="?", metavar="SESSION_DIR",
                         help="a session directory (or one of its runs); default: the newest run's session")
    goodput.add_argument("--rank", type=int, default=0, metavar="R", help="whose timeline (default: %(default)s)")
    goodput.add_argument("--by-rank", action="store_true", help="also one row per rank's view")
    goodput.add_argument("--max-rows", type=int_at_least(0, "0: all ranks"), metavar="N",
                         default=20,  # goodput_view.BY_RANK_ROWS (importing it loads the training package)
                         help="--by-rank lists the N ranks of lowest goodput, and the spread of all (0: every rank; "
                              "default: %(default)s)")
    goodput.add_argument("--json", action="store_true", help="print the report as JSON")
    goodput.set_defaults(run=_cmd_goodput)

    tail = sub.add_parser(
        "tail",
        help="a live terminal view of a running job",
        description=(
            "Follow a run as it is written: latest iteration, throughput, iteration time p50/p99, each rank's last "
            "report, recent warnings, errors and checkpoints. RUN_DIR may be a session or store root (the newest run "
            'under it). Needs rich: pip install "telemetrain[report]".'
        ),
    )
    tail.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run directory, or a directory holding runs")
    tail.add_argument("--interval", type=_positive_float, default=2.0, metavar="SECONDS",
                      help="seconds between refreshes (default: %(default)s)")
    tail.add_argument("--once", action="store_true", help="draw one frame and exit")
    tail.add_argument("--loss", metavar="NAME", help="the metric the loss sparkline shows, NAME or GROUP/NAME "
                      "(default: one named loss, train/loss, train.loss, ..., else the first ending in loss)")
    tail.set_defaults(run=_cmd_tail)


# -- compare -----------------------------------------------------------------------------------------------------------


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@contextlib.contextmanager
def _progress(err: TextIO, total: int, what: str) -> Iterator[TextProgress | None]:
    """The report's plain-text bar on ``err`` while ``total`` bytes of runs are read, when ``err`` is a terminal and
    the read is long; else nothing."""
    if not _is_terminal(err) or total < _PROGRESS_FROM_BYTES:
        yield None
        return
    bar = TextProgress(err)
    bar(f"{what} ({total / 2**20:.0f} MiB)", 0, total)
    try:
        yield bar
    finally:
        bar.close()


def _load_all(paths: Sequence[Path], err: TextIO, curves: Callable[[str], bool] | None = None,
              goodput: bool = False) -> list[RunSamples]:
    """Each run's samples (``read_samples``: ``curves`` the user series its curves keep, ``goodput`` its own
    goodput, read by the same engine)."""
    total = sum(run_bytes(p) for p in paths)
    loaded = []
    done = 0
    with _progress(err, total, "loading runs") as bar:

        def on_file(size: int) -> None:
            nonlocal done
            done += size
            if bar is not None:
                bar("loading runs", done, total)

        for path in paths:
            try:
                loaded.append(read_samples(path, on_file, curves=curves, goodput=goodput))
            except (OSError, NotARunError) as exc:
                raise CLIError(str(exc)) from None
    return loaded


def _perf_tag_of(path: Path) -> str:
    """A run's perf_tag from run.json, else its first process header; "" when neither says."""
    tag = open_run_meta(path).get("perf_tag")
    if tag:
        return str(tag)
    for f in sorted(path.glob("rank-*.jsonl")):
        try:
            with open(f, "rb") as fh:
                header = json.loads(fh.readline(1 << 20))  # a header, never a line of any length
            return str(header["identity"]["perf_tag"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return ""


def _is_baseline(path: Path) -> bool:
    """Whether the run's config marked it ``is_baseline_run``: run.json, else the ``one_logger_initialization``
    event near the top of its lowest rank's file (the first 256 KiB: it comes at the application's start)."""
    meta = open_run_meta(path)
    if isinstance(meta.get("is_baseline_run"), bool):
        return bool(meta["is_baseline_run"])
    for f in sorted(path.glob("rank-*.jsonl"))[:1]:
        try:
            with open(f, "rb") as fh:
                head = fh.read(256 << 10)
        except OSError:
            return False
        for line in head.split(b"\n"):
            if b'"one_logger_initialization"' in line:
                try:
                    return json.loads(line).get("attributes", {}).get("is_baseline_run") is True
                except (ValueError, AttributeError):
                    return False
    return False


def _has_workers(run: Path) -> bool:
    """Whether a training process wrote a file in ``run``: a job that died before its first record leaves its
    run.json alone, which has nothing to compare (and, picked as a baseline or read as history, failed the compare)."""
    try:
        return any(p.name.startswith("rank-") and p.name.endswith(".jsonl") for p in run.iterdir())
    except OSError:
        return False


def _same_tag(tag: str, root: Path, exclude: set[Path]) -> list[Path]:
    """The runs under ``root`` with ``tag`` and a training process's file, newest first, but those in ``exclude``."""
    if not root.is_dir():
        raise CLIError(f"no such directory: {root} (where to look for a baseline with perf_tag {tag!r})")
    return [p for p in reversed(find_runs(root))
            if p.resolve() not in exclude and _perf_tag_of(p) == tag and _has_workers(p)]


def _workload_of(run: Path) -> dict[str, Any]:
    workload = open_run_meta(run).get("workload")
    return workload if isinstance(workload, dict) else {}


def _same_workload(runs: list[Path], like: Path) -> list[Path]:
    """Those of ``runs`` whose recorded workload (run.json) does not differ from ``like``'s: one perf_tag may cover a
    sweep of batch sizes, and a run of another workload is neither a baseline nor a measure of the noise."""
    from ..training.workload import differences

    mine = _workload_of(like)
    return [p for p in runs if not differences(_workload_of(p), mine)]


def _find_baselines(tag: str, root: Path, exclude: set[Path], count: int, like: Path) -> list[tuple[Path, str]]:
    """The ``count`` newest runs with the tag (of ``like``'s workload when any is), those marked
    ``is_baseline_run`` first (newest first), then the others (newest first); and how each was chosen."""
    runs = _same_tag(tag, root, exclude)
    if not runs:
        raise CLIError(f"no other run with perf_tag {tag!r} under {root} to compare with (pass --baseline RUN_DIR)")
    runs = _same_workload(runs, like) or runs  # (none alike: the comparison refuses, and says how they differ)
    marked = [p for p in runs if _is_baseline(p)]
    if count == 1:
        if marked:
            return [(marked[0], "newest run marked is_baseline_run")]
        return [(runs[0], "newest other run; none is marked is_baseline_run")]
    chosen = [(p, "marked is_baseline_run") for p in marked]
    chosen += [(p, "newest other run") for p in runs if p not in marked]
    return chosen[:count]


def _baselines(args: argparse.Namespace, candidates: list[Path], err: TextIO) -> list[Path]:
    """The baseline runs the arguments name, each once, none a candidate."""
    exclude = {c.resolve() for c in candidates}
    if args.baselines is not None and args.baselines < 1:
        raise CLIError(f"--baselines must be at least 1, got {args.baselines}")
    if args.baseline:
        if args.baselines is not None:
            raise CLIError("--baselines N picks the baselines by perf_tag; it does not go with --baseline "
                           "(repeat --baseline to name several)")
        baselines: list[Path] = []
        for target in args.baseline:
            baseline = resolve_run(target, err)
            if baseline.resolve() in exclude:
                raise CLIError(f"the baseline {baseline} is also a candidate")
            if any(baseline.resolve() == b.resolve() for b in baselines):
                raise CLIError(f"the baseline {baseline} is given twice")
            baselines.append(baseline)
        return baselines
    tag = args.perf_tag if args.perf_tag is not None else _perf_tag_of(candidates[0])
    root = Path(args.root) if args.root is not None else candidates[0].resolve().parent.parent
    count = args.baselines or 1
    found = _find_baselines(tag, root, exclude, count, candidates[0])
    for baseline, how in found:
        print(printable(f"baseline: {baseline} ({how}, perf_tag {tag!r}, under {root})"), file=err)
    if len(found) < count:
        print(printable(f"note: only {len(found)} run(s) with perf_tag {tag!r} under {root} besides the candidates; "
                        f"--baselines {count} asked for {count}"), file=err)
    return [p for p, _ in found]


def _cmd_compare(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if not 0 < args.confidence < 1:
        raise CLIError(f"--confidence must be between 0 and 1, got {args.confidence}")
    if not 0 <= args.min_effect < 1:
        raise CLIError(f"--min-effect must be in [0, 1), got {args.min_effect}")
    if args.resamples < 100:
        raise CLIError(f"--resamples must be at least 100, got {args.resamples}")
    if args.history < 0:
        raise CLIError(f"--history must be >= 0, got {args.history}")
    if args.html:
        try:
            check_output(args.html)
        except OSError as exc:
            raise CLIError(str(exc)) from None
    candidates = [resolve_run(target, err) for target in args.run_dirs]
    for n, candidate in enumerate(candidates):  # (it would be compared, and counted, twice)
        if any(candidate.resolve() == c.resolve() for c in candidates[:n]):
            raise CLIError(f"the candidate {candidate} is given twice")
    baselines = _baselines(args, candidates, err)
    exclude = {c.resolve() for c in candidates} | {b.resolve() for b in baselines}
    history: list[Path] = []
    if args.history:
        tag = _perf_tag_of(baselines[0])
        root = Path(args.root) if args.root is not None else baselines[0].resolve().parent.parent
        if root.is_dir():
            history = _same_workload(_same_tag(tag, root, exclude), baselines[0])[:args.history]
    # each run once, whatever it is compared with; of the user's curves only those the quality comparison reads
    loaded = _load_all([*candidates, *baselines], err, quality_series(args.loss), goodput=not args.no_goodput)
    if args.loss and all(pick_loss(run.curves.names(), args.loss) is None for run in loaded):
        # a mistyped name would otherwise be compared as another metric (the first evaluation one), unannounced
        raise CLIError(f"--loss {args.loss!r}: no run compared has a metric so named (NAME or GROUP/NAME, as "
                       "`telemetrain show` lists them)")
    cand_samples, base_samples = loaded[:len(candidates)], loaded[len(candidates):]
    earlier = _load_all(history, err, lambda name: False) if history else []  # (their series only)
    settings: dict[str, Any] = dict(confidence=args.confidence, min_effect=args.min_effect, resamples=args.resamples,
                                    seed=args.seed, force=args.force, history=earlier, goodput=not args.no_goodput,
                                    loss=args.loss)
    from .compare_html import comparison_html, multi_html
    from .compare_text import format_comparison, format_multi

    try:
        if len(base_samples) == 1:
            one = compare_runs(cand_samples, base_samples[0], **settings)
            return _emit(args, out, err, one.as_dict(), format_comparison(one), lambda: comparison_html(one),
                         bool(one.regressions), one.untested)
        # several baselines: fail only on a metric that regressed against every one
        multi = compare_baselines(cand_samples, base_samples, **settings)
        return _emit(args, out, err, multi.as_dict(), format_multi(multi), lambda: multi_html(multi),
                     bool(multi.regressions), multi.untested)
    except WorkloadMismatch as exc:
        raise CLIError(f"{exc.reason}; pass --force to compare anyway") from None


def _emit(args: argparse.Namespace, out: TextIO, err: TextIO, data: dict[str, Any], lines: list[str],
          page: Callable[[], str], regressed: bool, untested: list[RunRef]) -> int:
    """The comparison as JSON or text on ``out``, the page to --html; the exit status."""
    if args.json:
        print(json.dumps(data, indent=2, allow_nan=False), file=out)
    else:
        print("\n".join(printable(line) for line in lines), file=out)
    if args.html:
        try:
            write_output(args.html, page())
        except OSError as exc:
            raise CLIError(str(exc)) from None
        print(f"wrote {printable(str(args.html))}", file=err)
    if not args.fail_on_regression:
        return 0
    if regressed:
        return 1
    if untested:  # a CI gate that passes because the runs had no data to test would hide a broken benchmark
        names = ", ".join(printable(ref.path) for ref in untested)
        print(f"telemetrain: error: --fail-on-regression: nothing could be tested of {names} (too little "
              "data; the notes say what is missing)", file=err)
        return 2
    return 0


# -- goodput -----------------------------------------------------------------------------------------------------------


def _session_of(target: str) -> Path:
    path = Path(target)
    if not path.exists():
        raise CLIError(f"no such directory: {path}")
    if not path.is_dir():
        raise CLIError(f"{path} is a file; a session is a directory holding run directories")
    runs = find_runs(path)
    if path in runs:  # a run: its session is the folder it is in
        return path.parent
    if not runs:
        raise CLIError(f"{path} is not a telemetrain session directory: it holds no runs")
    sessions = {run.parent for run in runs}
    if len(sessions) == 1:  # a store root of one session: that session's folder is the one to name
        return sessions.pop()
    return path  # several sessions: goodput says which and asks for one


def _cmd_goodput(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..training.goodput import goodput, goodput_by_rank
    from .goodput_view import by_rank_entry, format_goodput, format_goodput_by_rank

    session = _session_of(args.session_dir) if args.session_dir is not None else resolve_run(None, err).parent
    try:
        with _progress(err, sum(run_bytes(run) for run in find_runs(session)), "reading the session"):
            # the session read once: --by-rank's reports hold the chosen rank's (converting the JSONL of thousands
            # of ranks twice doubled the time); a rank without lifecycle records gets goodput's own error
            by_rank = goodput_by_rank(session) if args.by_rank else None
            report = by_rank[args.rank] if by_rank is not None and args.rank in by_rank else \
                goodput(session, rank=args.rank)
    except (OSError, ValueError) as exc:  # an empty session, several sessions, a rank without records
        raise CLIError(str(exc)) from None
    if args.json:
        head = json.dumps(json_value(report.as_dict()), indent=2, allow_nan=False)
        if by_rank is None:
            print(head, file=out)
            return 0
        # written a rank at a time (the whole as one object held ~1 GiB at 2,048 ranks), each rank's report less
        # the session's ranks and energy the top level holds (by_rank_entry: the document grew as ranks^2)
        top = json_value(report.as_dict())
        out.write(head[:-2] + ',\n  "by_rank": {')
        for n, (rank, r) in enumerate(by_rank.items()):
            text = json.dumps(by_rank_entry(json_value(r.as_dict()), top), indent=2,
                              allow_nan=False).replace("\n", "\n    ")
            out.write(f'{"," if n else ""}\n    {json.dumps(str(rank))}: {text}')
        print("\n  }\n}" if by_rank else "}\n}", file=out)
        return 0
    lines = format_goodput(report)
    if by_rank is not None:
        lines += ["", *format_goodput_by_rank(by_rank, args.max_rows)]
    print("\n".join(printable(line) for line in lines), file=out)
    return 0


# -- tail --------------------------------------------------------------------------------------------------------------


def _cmd_tail(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        import rich  # noqa: F401 - the view is drawn with it
    except ImportError:
        raise CLIError(f"telemetrain tail {_RICH_MISSING}") from None
    from ..store.reader import NotARunError, check_run_format
    from .tail import run_tail

    path = resolve_run(args.run_dir, err)
    try:
        check_run_format(path)
    except NotARunError as exc:  # (a run of a newer format: every line would read as corrupt)
        raise CLIError(str(exc)) from None
    return run_tail(path, out, interval=args.interval, once=args.once, loss=args.loss)
