"""The peers method, shared by ``bench_core.py`` and ``bench_stats.py`` (BENCHMARKS.md, "Method").

Each statement is compiled into its own function and run ``n`` times in ``for _ in itertools.repeat(None, n)``,
timed with ``time.perf_counter_ns``; ``n`` is calibrated to about ``--target-ms`` per repeat (within ``--min-n`` ..
``--max-n``); ``--repeats`` repeats, median and best reported; the GC stays enabled and ``gc.collect()`` runs before
each repeat; a busy loop (``--warmup-s``) warms the CPU up first. Numbers include the loop overhead.

Also here: ``paired`` (a statement and its peer's timed in adjacent repeats), what a run has measured (``RESULTS``),
noted (``NOTES``) and skipped (``SKIPPED``), the options every script has, progress on stderr, and the description of
the machine and of the source a run measured. A script runs alone in its process and imports this module as a sibling
(its own folder is first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from pathlib import Path
from time import perf_counter_ns
from typing import Any

ARGS: argparse.Namespace  # set by parse_args()
RESULTS: list[dict[str, Any]] = []
NOTES: list[str] = []
SKIPPED: list[str] = []


# -- options --------------------------------------------------------------------------------------------------------


def parser(doc: str | None, quick_help: str) -> argparse.ArgumentParser:
    """The options of the method (the script adds its own after them; ``parse_args`` adds ``--quiet`` last)."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--json", metavar="FILE", help="also write the raw results to FILE")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--target-ms", type=float, default=200.0, help="approximate duration of one repeat")
    ap.add_argument("--max-n", type=int, default=1_000_000)
    ap.add_argument("--min-n", type=int, default=5_000)
    ap.add_argument("--warmup-s", type=float, default=1.0)
    return ap


def parse_args(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; the result is also the ``ARGS`` the functions here read."""
    global ARGS
    ap.add_argument("-q", "--quiet", dest="verbose", action="store_false", help="no progress on stderr")
    ARGS = ap.parse_args(argv)
    return ARGS


# -- measuring ------------------------------------------------------------------------------------------------------

_LOOP = """
def timed(n, _clock=_clock, _repeat=_repeat):
    t0 = _clock()
    for _ in _repeat(None, n):
        {stmt}
    return _clock() - t0
"""


def compile_stmt(stmt: str, names: dict[str, Any]) -> Callable[[int], int]:
    """``stmt`` (one line) in its own function ``timed(n) -> elapsed ns``, with ``names`` as its globals."""
    scope = dict(names, _clock=perf_counter_ns, _repeat=repeat)
    exec(compile(_LOOP.format(stmt=stmt), f"<bench {stmt[:50]}>", "exec"), scope)
    timed: Callable[[int], int] = scope["timed"]
    return timed


def calibrated_n(per_ns: float, max_n: int | None = None) -> int:
    """Operations per repeat for about ``--target-ms`` at ``per_ns`` each, within ``--min-n`` .. ``max_n``."""
    min_n: int = ARGS.min_n
    return max(min_n, min(max_n or ARGS.max_n, int(ARGS.target_ms * 1e6 / per_ns)))


def measure(
    stmt: str,
    names: dict[str, Any] | None = None,
    *,
    between: Callable[[], None] | None = None,
    gc_off: bool = False,
    max_n: int | None = None,
    warm: int = 2000,
    collect: bool = True,
) -> tuple[list[float], int]:
    """ns per run of ``stmt``, one sample per repeat, and the calibrated ``n``. ``between()`` runs after calibration
    and after every repeat, outside the timed region; ``collect``: ``gc.collect()`` before each repeat."""
    timed = compile_stmt(stmt, names or {})
    timed(warm)  # first calls; lets 3.11 specialise the bytecode
    n = calibrated_n(max(timed(warm) / warm, 1.0), max_n)
    samples = []
    for _ in range(ARGS.repeats):
        if between is not None:
            between()
        if collect:
            gc.collect()
        if gc_off:
            gc.disable()
        try:
            samples.append(timed(n) / n)
        finally:
            gc.enable()
    if between is not None:
        between()
    return samples, n


def new_row(lib: str, op: str, samples: list[float], n: object) -> dict[str, Any]:
    """A result row (not yet in ``RESULTS``): the median and the best of ``samples``."""
    return {
        "library": lib,
        "operation": op,
        "median_ns": statistics.median(samples),
        "best_ns": min(samples),
        "n": n,
        "repeats": samples,
    }


def difference_row(lib: str, op: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Row ``a - b`` (not yet in ``RESULTS``): median - median, best - best; its repeats are the differences of
    the paired repeats."""
    row = new_row(lib, op, [x - y for x, y in zip(a["repeats"], b["repeats"], strict=True)], "-")
    row["median_ns"] = a["median_ns"] - b["median_ns"]
    row["best_ns"] = a["best_ns"] - b["best_ns"]
    return row


def record_with_peer(row: dict[str, Any], peer: dict[str, Any] | None) -> dict[str, Any]:
    """``row`` with its peer row and the ratio to it (medians), added to RESULTS."""
    row["peer"] = None if peer is None else f"{peer['library']} | {peer['operation']}"
    row["peer_median_ns"] = None if peer is None else peer["median_ns"]
    row["ratio"] = None if peer is None else row["median_ns"] / peer["median_ns"]
    RESULTS.append(row)
    ratio = "" if row["ratio"] is None else f"  {row['ratio']:.3f}x peer"
    progress(f"{row['library']:<24} {row['operation'][:84]:<84} {row['median_ns']:11.1f} ns{ratio}  (n={row['n']})")
    return row


def paired(
    lib: str,
    op: str,
    stmt: str,
    names: dict[str, Any],
    peer: dict[str, Any],
    peer_stmt: str,
    peer_names: dict[str, Any],
    between: Callable[[], None] | None = None,
    *,
    collect: bool = True,
) -> dict[str, Any]:
    """``stmt`` and its peer's statement timed in adjacent repeats (2 x ``--repeats`` pairs, the order alternating), so
    that a slow spell of the machine hits both sides of a pair: the row's ratio is the median of the per-pair ratios.
    ``between()`` runs before every pair and after the last, outside the timed region; ``collect``: ``gc.collect()``
    before each pair. The row is added to RESULTS with ``peer`` as its peer."""
    ours, theirs = compile_stmt(stmt, names), compile_stmt(peer_stmt, peer_names)
    for f in (ours, theirs):
        f(2000)
    n = calibrated_n(max(ours(2000) / 2000, theirs(2000) / 2000, 1.0))
    mine, ratios = [], []
    for k in range(2 * ARGS.repeats):
        if between is not None:
            between()
        if collect:
            gc.collect()
        if k % 2:
            a, b = ours(n) / n, theirs(n) / n
        else:
            b, a = theirs(n) / n, ours(n) / n
        mine.append(a)
        ratios.append(a / b)
    if between is not None:
        between()
    row = record_with_peer(new_row(lib, op, mine, n), peer)
    row["ratio"] = statistics.median(ratios)
    row["pair_ratios"] = ratios
    progress(f"{'':<24} paired ratio {row['ratio']:.4f} (pairs: {', '.join(f'{r:.3f}' for r in ratios)})")
    return row


def row_of(lib: str, op_prefix: str) -> dict[str, Any] | None:
    for r in RESULTS:
        if r["library"] == lib and r["operation"].startswith(op_prefix):
            return r
    return None


def spin(seconds: float) -> None:
    end = perf_counter_ns() + int(seconds * 1e9)
    while perf_counter_ns() < end:
        pass


# -- running --------------------------------------------------------------------------------------------------------


def progress(msg: str) -> None:
    if ARGS.verbose:
        print("  " + msg, file=sys.stderr, flush=True)


def skip(section: str, exc: BaseException) -> None:
    SKIPPED.append(f"{section}: skipped ({type(exc).__name__}: {exc})")
    progress(SKIPPED[-1])


def run_sections(
    sections: Iterable[tuple[str, Callable[[], None]]], must_pass: Callable[[str], bool], only: str | None = None
) -> bool:
    """Run the sections in order (``only``: a comma-separated subset, the baseline always); one that raises is
    skipped with a note and the run goes on. Returns whether a section for which ``must_pass(name)`` raised
    something other than an ImportError (a peer not installed)."""
    wanted = {"baseline", *only.split(",")} if only else None
    failed = False
    for name, fn in sections:
        if wanted is not None and name not in wanted:
            continue
        progress(f"[{name}]")
        t0 = perf_counter_ns()
        try:
            fn()
        except ImportError as exc:
            skip(name, exc)
        except Exception as exc:  # noqa: BLE001 - report and go on; the caller says which sections fail the run
            skip(name, exc)
            failed = failed or must_pass(name)
        progress(f"[{name}] {(perf_counter_ns() - t0) / 1e9:.1f} s")
    return failed


def run_framework_bench(
    prefix: str,
    sections_in: Callable[[str], list[tuple[str, Callable[[], None]]]],
    checks: Callable[[], list[dict[str, Any]]],
    table: Callable[[], str],
    dists: Sequence[str],
    extra: dict[str, Any],
) -> int:
    """The whole run of a framework benchmark (bench_hf, bench_lightning): its sections in a temporary directory
    (``sections_in(tmpdir)``), then the header, the method line, the table, the checks and the JSON. Exit status 1
    when a section failed or the last check (every telemetry run complete) did."""
    tmpdir = tempfile.mkdtemp(prefix=prefix)
    load_before = loadavg()
    t_start = perf_counter_ns()
    spin(ARGS.warmup_s)
    try:
        failed = run_sections(sections_in(tmpdir), lambda name: True, ARGS.only)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    load_after = loadavg()
    results_checks = checks()
    failed = failed or results_checks[-1]["status"] == "FAIL"
    print_header(dists, load_before, load_after)
    print(f"method: the peers method (bench/_method.py) for the hooks rows ({ARGS.repeats} repeats); training runs in "
          f"rounds (see the notes); whole run {(perf_counter_ns() - t_start) / 1e9:.0f} s")
    print_report(table(), results_checks, ARGS.json, dists, (load_before, load_after), ARGS, extra)
    return 1 if failed else 0


# -- description of the run -----------------------------------------------------------------------------------------


def versions(dists: Sequence[str]) -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def source_state() -> str:
    """The commit of the telemetrain checkout this run measured (and whether src/ had local changes)."""
    import hashlib
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        diff = subprocess.run(
            ["git", "diff", "HEAD", "--", "src"], cwd=root, capture_output=True, timeout=10, check=True
        ).stdout
        untracked = subprocess.run(
            ["git", "ls-files", "--others", "--exclude-standard", "--", "src"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return "n/a"
    if not diff and not untracked:
        return head
    return (
        f"{head} + uncommitted changes in src/ (diff sha1 {hashlib.sha1(diff).hexdigest()[:10]}, "
        f"{len(untracked)} untracked files)"
    )


def loadavg() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def print_header(dists: Sequence[str], load_before: str, load_after: str) -> None:
    """The machine, the versions of ``dists``, the source measured and the load around the run."""
    print(
        f"python {platform.python_version()} ({platform.python_implementation()}), {platform.machine()}, "
        f"os.cpu_count()={os.cpu_count()}"
    )
    print("versions: " + ", ".join(f"{k}=={v}" for k, v in versions(dists).items()))
    print(f"telemetrain source: {source_state()}")
    print(f"load average (1, 5, 15 min) before: {load_before}; after: {load_after}")


def render_table(extra: Sequence[tuple[str, str]], cells: Callable[[dict[str, Any]], Sequence[str]]) -> str:
    """RESULTS as a markdown table: library, operation, median, best, then the script's ``extra`` columns (title,
    alignment; ``cells(row)`` gives a row's), then n."""
    lines = [
        "| library | operation | median ns/op | best ns/op | " + "".join(f"{title} | " for title, _ in extra) + "n |",
        "|---|---|---:|---:|" + "".join(f"{align}|" for _, align in extra) + "---:|",
    ]
    for r in RESULTS:
        op = r["operation"].replace("|", "\\|")
        n = f"{r['n']:,}" if isinstance(r["n"], int) else r["n"]
        lines.append(
            f"| {r['library']} | {op} | {r['median_ns']:.1f} | {r['best_ns']:.1f} | "
            + "".join(f"{c} | " for c in cells(r))
            + f"{n} |"
        )
    return "\n".join(lines)


def print_notes() -> None:
    for note in NOTES:
        print(f"- {note}")
    for s in SKIPPED:
        print(f"- SKIPPED {s}")


def print_report(table: str, checks: list[dict[str, Any]], json_path: str | None, dists: Sequence[str],
                 load: tuple[str, str], args: object, extra: dict[str, Any]) -> None:
    """After the header and method lines: the table, the notes, the checks; the JSON when asked for."""
    print()
    print(table)
    print()
    print_notes()
    print()
    print_checks(checks)
    write_run_json(json_path, dists, load, args, extra, checks)


def print_checks(checks: list[dict[str, Any]]) -> None:
    print("checks (medians of this run):")
    for c in checks:
        print(f"check {c['id']}: {c['status']}: {c.get('title', '')}: {c['text']}")


def write_run_json(path: str | None, dists: Sequence[str], load: tuple[str, str], args: object, extra: dict[str, Any],
                   checks: list[dict[str, Any]]) -> None:
    """``write_json`` with the fields every script writes (source, load, arguments, rows) and its ``extra``; nothing
    when ``path`` is None (no ``--json``)."""
    if path:
        fields = {"source": source_state(), "load_before": load[0], "load_after": load[1], "args": vars(args),
                  "results": RESULTS, **extra}
        write_json(path, dists, fields, checks)


def write_json(path: str, dists: Sequence[str], fields: dict[str, Any], checks: list[dict[str, Any]]) -> None:
    """The raw results: the machine, ``fields`` (the script's), then the checks, notes and skipped sections."""
    data = {
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "versions": versions(dists),
        **fields,
        "checks": checks,
        "notes": NOTES,
        "skipped": SKIPPED,
    }
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1, default=str)
