"""The ``telemetrain query`` and ``telemetrain compact`` commands (the ``columnar`` extra)."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any, TextIO

from ..cli_common import CLIError, int_at_least, json_value, resolve_run
from ..text import printable

__all__ = ["register"]

_EXTRA = 'needs DuckDB, which is not installed: pip install "telemetrain[columnar]"'


def register(sub: Any) -> None:
    """Add this module's subcommands to the ``telemetrain`` parser (``sub`` is its subparsers action)."""
    query = sub.add_parser(
        "query",
        help="run a read-only SQL query over a run",
        description=(
            "Run one SELECT over a run's tables with DuckDB: metrics, events, span_starts, span_ends, stats, "
            "diagnostics, processes, reports (the training reports' figures, typed), windows (the training "
            "processes' reports) and damage (torn and corrupt lines). "
            "The columnar copy and the JSONL not yet compacted are read together. Anything but a SELECT, and any file "
            "outside the run, is refused. See `telemetrain docs format` for the columns and a cookbook. "
            'Needs pip install "telemetrain[columnar]".'
        ),
    )
    query.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (or a directory holding runs: the newest)")
    query.add_argument("sql", metavar="SQL", help='the query, e.g. "SELECT name, count(*) FROM metrics GROUP BY 1"')
    query.add_argument("--format", choices=("table", "csv", "json"), default="table",
                       help="output format (default: %(default)s)")
    query.add_argument("--max-rows", type=_row_limit, default=1000, metavar="N",
                       help="print at most N rows (default: %(default)s; 0: all)")
    query.add_argument("--null", type=_null_string, metavar="STR",
                       help="how csv and table output write SQL NULL (default: csv an empty field, table NULL); a "
                       "string equal to it is quoted in csv, so that the two stay distinct (an empty string is "
                       "written \"\"), as DuckDB's COPY and PostgreSQL's CSV do; json writes null")
    query.set_defaults(run=_cmd_query)

    compact = sub.add_parser(
        "compact",
        help="write (or repair) the columnar Parquet copy of runs",
        description=(
            "Convert every JSONL segment of the runs under RUN_DIR|SESSION_DIR (a run, a session directory or a store "
            "root) that has no valid columnar copy into Parquet (zstd), Hive-partitioned by session, run and rank: for "
            "runs written without the extra, or cut off by SIGKILL (every complete line is kept). The JSONL files are "
            "not changed. "
            "--to writes the same tree to another directory or an object store URL (s3://bucket/prefix, via fsspec). "
            'Needs pip install "telemetrain[columnar]".'
        ),
    )
    compact.add_argument("path", metavar="RUN_DIR|SESSION_DIR", help="a run, a session directory or a store root")
    compact.add_argument("--to", metavar="URL", help="where to write the copy (default: <run>/_columnar)")
    compact.add_argument("--force", action="store_true", help="rewrite copies that are already valid")
    compact.set_defaults(run=_cmd_compact)


_row_limit = int_at_least(0, "0: all rows")  # --max-rows: a negative number (a typo) must not mean all too


def _null_string(text: str) -> str:
    """An argparse ``type`` for --null: written unquoted in csv, it must not hold what would need quoting."""
    if any(c in text for c in ',"\r\n'):
        raise argparse.ArgumentTypeError(f"must not hold a comma, a double quote or a line break, got {text!r}")
    return text


def _cell(value: Any, null: str = "NULL") -> str:
    if value is None:
        return null
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


def _csv_field(value: Any, null: str, escape: bool = False) -> str:
    """One RFC 4180 field: NULL as ``null`` unquoted, and any text equal to ``null`` quoted (Python's csv module
    cannot quote one field alone), so that a reader told the null string tells the two apart. ``escape``: control
    characters written as escapes (``printable``), for a terminal."""
    if value is None:
        return null
    text = printable(_cell(value)) if escape else _cell(value)
    if text == null or any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # a stream without one, or closed
        return False


def _cmd_query(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        import duckdb
    except ImportError:
        raise CLIError(f"telemetrain query {_EXTRA}") from None
    from .columnar import ColumnarVersionError
    from .engine import QUERY_MEMORY, Engine, ReadOnlyQueryError, memory_limit
    from .reader import NotARunError, check_run_format

    path = resolve_run(args.run_dir, err)
    try:
        check_run_format(path)
        engine = Engine([path], memory=memory_limit(QUERY_MEMORY))
    except (ColumnarVersionError, NotARunError) as exc:
        raise CLIError(str(exc)) from None
    try:
        try:
            result = engine.query(args.sql)
            names = list(result.columns)
            rows = result.fetchall() if args.max_rows <= 0 else result.limit(args.max_rows + 1).fetchall()
        except ReadOnlyQueryError as exc:  # (DuckDB's parser error goes on with a caret drawing: its first line)
            raise CLIError(f"query refused: {str(exc).splitlines()[0]}") from None
        except duckdb.Error as exc:
            raise CLIError(f"query failed: {printable(str(exc).splitlines()[0])}") from None
    finally:
        engine.close()
    more = args.max_rows > 0 and len(rows) > args.max_rows
    rows = rows[: args.max_rows] if more else rows
    if args.format == "json":
        rows_out = [{name: json_value(v) for name, v in zip(names, r, strict=True)} for r in rows]
        print(json.dumps(rows_out, default=str, allow_nan=False), file=out)
    elif args.format == "csv":
        null = "" if args.null is None else args.null
        # the values as they are to a file or a pipe; on a terminal, escaped as ls does (a value's escape sequences
        # would otherwise reach the terminal)
        escape = _is_terminal(out)
        for line in [names, *rows]:
            out.write(",".join(_csv_field(v, null, escape) for v in line) + "\r\n")
    else:
        null = "NULL" if args.null is None else args.null
        cells = [names] + [[printable(_cell(v, null)) for v in r] for r in rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(names))]
        for n, line in enumerate(cells):
            print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)
            if n == 0:
                print("  ".join("-" * w for w in widths), file=out)
    if more:
        print(f"(first {args.max_rows} rows; --max-rows 0 for all)", file=err)
    elif not rows and args.format == "table":  # a header alone reads like a cut-off output (psql says "(0 rows)")
        print("(0 rows)", file=err)
    return 0


def _cmd_compact(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        import duckdb  # noqa: F401
    except ImportError:
        raise CLIError(f"telemetrain compact {_EXTRA}") from None
    from .columnar import ColumnarVersionError
    from .compact import compact
    from .reader import NotARunError

    try:
        result = compact(args.path, args.to, force=args.force)
    except (OSError, NotARunError, ColumnarVersionError) as exc:
        raise CLIError(str(exc)) from None
    rate = result.records / result.seconds if result.seconds > 0 else 0.0
    ratio = f", {result.bytes_out / result.bytes_in:.1%} of the JSONL bytes" if result.bytes_in else ""
    print(f"compacted {result.segments} segment(s) ({result.records:,} records, {result.bytes_in:,} bytes of JSONL -> "
          f"{result.bytes_out:,} bytes of Parquet{ratio}) in {result.seconds:.2f} s ({rate:,.0f} records/s); "
          f"{result.skipped} already compacted", file=out)
    for error in result.errors:
        print(f"telemetrain compact: {printable(error)}", file=err)
    return 1 if result.errors else 0
