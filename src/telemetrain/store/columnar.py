"""The columnar copy of the run store: its schema (version 4), and JSONL segments -> typed rows, in DuckDB SQL.

docs/format.md ("Columnar copy") documents every table and column; this module is the one place that defines them.
One table per record kind, partitioned Hive-style by the identity every engine groups by::

    <prefix>/<table>/session=<session_tag>/run=<run_id>/rank=<rank>/<segment stem>.parquet
    <prefix>/_shared/<table>/session=<session_tag>/run=<run_id>/<batch>.parquet   a batch's segments (version 4)
    <prefix>/_segments/<segment file name>.json          the manifest of one compacted segment (written last)

``<prefix>`` is ``<run_dir>/_columnar`` for the copy kept beside a run, or any directory or object-store URL given to
``telemetrain compact --to``. The partition columns (``session``, ``run``, ``rank``) live only in the paths, as Hive
and every engine reading its layout expect (a shared file, ``compact_batch``, holds them as columns, with
``source``); the other identity fields are columns (constant per file, so they cost a few bytes after dictionary
and run-length encoding).

Conversion rules are ``codec.decode_line``'s, expressed in SQL (``typed_rows_sql``): a line with a field of the wrong
type is corrupt and skipped, a last line without its newline is torn; the same lines are kept as the Python reader
keeps, which the tests check line by line. Importing this module needs nothing beyond the standard library; the
functions that run SQL take a DuckDB connection.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..identity import Identity
from .codec import decode_identity

__all__ = ["COLUMNS", "KEPT_SINCE", "READABLE_SINCE", "REPORTS_SINCE", "SCHEMA_VERSION", "TABLES",
           "ColumnarVersionError", "Prescan", "fast_metric_rows_sql", "fast_span_rows_sql", "prescan", "typed_rows_sql"]

# 2: metric rows carry format v2's attributes (JSON text, as events'); v1 lines read as before. 3: the derived table
# ``reports`` (``report_rows``), the training reports' figures typed; a version-2 copy is still read (its reports typed
# at read time), and ``telemetrain compact`` rewrites it. 4: a manifest's file may be shared by the segments of a batch
# (``compact_batch``: one file a table for many tiny segments, their rows told apart by ``source``); a version-3 copy
# is the same layout without shared files, read and kept as it is. 5: ``reports`` has the wait in collectives over
# every rank (``avg_comm_world_wait_time_sec``); older copies read NULL there (``report_rows.REPORT_FIELDS_SINCE``).
SCHEMA_VERSION = 5
READABLE_SINCE = 2
REPORTS_SINCE = 3  # copies from this version on have the typed ``reports`` table
KEPT_SINCE = 3  # ``telemetrain compact`` keeps a valid copy of this version or newer (rewrites older ones)
PARTITIONS = (("session", "VARCHAR"), ("run", "VARCHAR"), ("rank", "BIGINT"))

# The identity fields stored as columns in every record table (session, run and rank are the partitions).
IDENTITY_COLUMNS = (("pid", "BIGINT"), ("host", "VARCHAR"), ("role", "VARCHAR"), ("local_rank", "BIGINT"),
                    ("world_size", "BIGINT"), ("group_rank", "BIGINT"), ("restart_count", "BIGINT"),
                    ("perf_tag", "VARCHAR"))
# Where a record sits in the JSONL log: file order within a process is (segment, line).
POSITION_COLUMNS = (("segment", "INTEGER"), ("line", "INTEGER"))
COMMON = (("mono_ns", "BIGINT"), ("wall_ns", "BIGINT"), ("group_name", "VARCHAR"), ("name", "VARCHAR"))

KIND_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "metric": (("value", "DOUBLE"), ("value_int", "BIGINT"), ("value_bool", "BOOLEAN"), ("unit", "VARCHAR"),
               ("step", "BIGINT"), ("attributes", "VARCHAR")),
    "event": (("severity", "VARCHAR"), ("attributes", "VARCHAR"), ("event_id", "VARCHAR"), ("span_id", "VARCHAR")),
    "span_start": (("span_id", "VARCHAR"), ("parent_id", "VARCHAR"), ("trace_id", "VARCHAR"),
                   ("attributes", "VARCHAR")),
    "span_end": (("span_id", "VARCHAR"), ("duration_ns", "BIGINT"), ("status", "VARCHAR"), ("error", "VARCHAR"),
                 ("attributes", "VARCHAR")),
    "stat": (("start_mono_ns", "BIGINT"), ("sample_count", "BIGINT"), ("values", "VARCHAR"), ("unit", "VARCHAR"),
             ("histogram", "VARCHAR")),
    "diagnostic": (("sink", "VARCHAR"), ("record_count", "BIGINT"), ("message", "VARCHAR")),
}
TABLES: dict[str, str] = {"metric": "metrics", "event": "events", "span_start": "span_starts",
                          "span_end": "span_ends", "stat": "stats", "diagnostic": "diagnostics"}
KIND_OF_TABLE = {table: kind for kind, table in TABLES.items()}
PROCESS_TABLE = "processes"
PROCESS_COLUMNS = (*POSITION_COLUMNS, ("mono_ns", "BIGINT"), ("wall_ns", "BIGINT"), ("header", "VARCHAR"))

COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    **{table: (*IDENTITY_COLUMNS, *POSITION_COLUMNS, *COMMON, *KIND_COLUMNS[kind]) for kind, table in TABLES.items()},
    PROCESS_TABLE: (*IDENTITY_COLUMNS, *PROCESS_COLUMNS),
}
JSON_COLUMNS = frozenset({"attributes", "values", "histogram", "header"})


class ColumnarVersionError(ValueError):
    """A columnar copy written with a schema version this telemetrain does not know."""

    def __init__(self, version: Any, where: str) -> None:
        super().__init__(f"{where} was written with columnar schema version {version!r}; this telemetrain reads "
                         f"version {SCHEMA_VERSION}: upgrade telemetrain to read it (or delete the columnar copy and "
                         "run `telemetrain compact` again)")
        self.version = version


# -- the Python side of a conversion: lines, headers, identities -----------------------------------------------------


@dataclass
class Prescan:
    """What a pass over a segment's bytes finds before the SQL conversion: every header line (valid or not) and the
    identity in force from each line on. Python decides the headers, exactly as the reader does, so the two agree
    on which identity each record belongs to. Line numbers here count from the first line read (``first_line`` in
    the file)."""

    path: Path
    size: int  # the file offset where the complete lines read end
    lines: int  # complete lines (newline-terminated), blank ones included
    torn: int
    start: int = 0  # the file offset where reading began
    first_line: int = 0  # the line number of the first line read
    header_lines: list[int] = field(default_factory=list)  # every header line, valid or not (not records)
    bad_headers: int = 0  # header-looking lines that did not decode (corrupt)
    identities: list[tuple[int, Identity]] = field(default_factory=list)  # (from line, identity), ascending
    headers: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # valid header objects by line
    first_header: dict[str, Any] = field(default_factory=dict)
    body: bytes = b""  # with ``prescan(..., keep=True)``: the complete lines read (``start`` to ``size``)
    metrics_in_order: bool = False  # set by ``convert_segment``: ``seg``'s metric rows come in file order unsorted


def prescan(path: Path, fallback: Identity, size: int | None = None, *, start: int = 0,
            first_line: int = 0, keep: bool = False) -> Prescan:
    """Read a segment's complete lines from offset ``start`` (line ``first_line``: the part of a file that grew after
    its columnar copy was made) to ``size`` bytes when given (a file being appended to is read up to a known point),
    and find its headers. ``fallback``: the identity of records before any valid header (the previous segment's, else
    what the file name and run.json tell). With ``keep``, the lines read are kept in ``body`` (the conversion's
    input: read once)."""
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read() if size is None else fh.read(max(size - start, 0))
    body_end = data.rfind(b"\n") + 1
    scan = Prescan(path=path, size=start + body_end, lines=data.count(b"\n", 0, body_end),
                   torn=1 if data[body_end:].strip() else 0, start=start, first_line=first_line)
    scan.identities.append((0, fallback))
    if keep:
        scan.body = data[:body_end] if body_end < len(data) else data
    # Header lines: the first line, and any line holding '"process"' (found with bytes.find, in C: the bulk of a
    # segment is never looked at line by line).
    candidates = []
    first_start = -1  # where the first non-blank line starts (a header even without '"process"' in plain text)
    if start == 0:
        pos = 0
        while pos < body_end:
            end = data.index(b"\n", pos)
            if data[pos:end].strip():
                first_start = pos
                candidates.append(pos)
                break
            pos = end + 1
    pos = data.find(b'"process"', 0, body_end)
    while pos >= 0:
        line_start = data.rfind(b"\n", 0, pos) + 1
        if not candidates or candidates[-1] != line_start:
            candidates.append(line_start)
        pos = data.find(b'"process"', data.index(b"\n", pos), body_end)
    n_at, n = 0, 0  # line number of byte offset n_at
    for line_start in candidates:
        n += data.count(b"\n", n_at, line_start)
        n_at = line_start
        raw = data[line_start:data.index(b"\n", line_start)]
        if not raw.strip():
            continue
        is_first = line_start == first_start
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            continue  # a broken line: the SQL side counts it corrupt
        if type(obj) is not dict or obj.get("kind") != "process":
            continue
        scan.header_lines.append(n)
        try:
            identity = decode_identity(obj)
        except ValueError:
            scan.bad_headers += 1
            continue
        scan.identities.append((n, identity))
        scan.headers.append((n, obj))
        if is_first:
            scan.first_header = obj
    return scan


# -- the SQL side: lines -> typed rows -------------------------------------------------------------------------------

FIELDS = ("v", "kind", "mono_ns", "wall_ns", "group", "name", "value", "unit", "step", "severity", "attributes",
          "event_id", "span_id", "parent_id", "trace_id", "duration_ns", "status", "error", "start_mono_ns", "count",
          "values", "histogram", "sink", "message")
# How each field is checked, then read. The checks look at the JSON text of each field as DuckDB extracts it (an
# integer is digits, a string starts with a quote, a missing key is NULL, a JSON null is 'null'): a cheap string test
# instead of a JSON type query per field. The values come from one typed parse of the line (``from_json``), which is
# lenient (it would turn "5" into 5), so it is read only for lines whose every field passed its check.
_TYPES = {"mono_ns": "BIGINT", "wall_ns": "BIGINT", "group": "VARCHAR", "name": "VARCHAR", "unit": "VARCHAR",
          "step": "BIGINT", "severity": "VARCHAR", "event_id": "VARCHAR", "span_id": "VARCHAR", "parent_id": "VARCHAR",
          "trace_id": "VARCHAR", "duration_ns": "BIGINT", "status": "VARCHAR", "error": "VARCHAR",
          "start_mono_ns": "BIGINT", "count": "BIGINT", "sink": "VARCHAR", "message": "VARCHAR"}
# The field's JSON text (NULL: no such key), taken out of the extracted list once per line, before any CASE: a CASE
# over the list itself would copy it per row (seconds for a line of a megabyte).
_T = {name: f"j_{name}" for name in FIELDS}
_WHITESPACE = "chr(32)||chr(9)||chr(13)||chr(11)||chr(12)"  # bytes.strip()'s, less the newline split on


def _is_int(t: str) -> str:
    """A JSON integer within 64 bits (JSON numbers have no leading zeros or '+': digits are an integer)."""
    return f"(regexp_full_match({t}, '-?[0-9]+') AND TRY_CAST({t} AS BIGINT) IS NOT NULL)"


def _is_str(t: str) -> str:
    return f"starts_with({t}, '\"')"


def _is_num(t: str) -> str:
    """A number, a bool, or one of the non-finite tag strings."""
    return f"regexp_full_match({t}, '-?[0-9][0-9.eE+-]*|true|false|\"NaN\"|\"Infinity\"|\"-Infinity\"')"


def _opt_null(t: str, check: str) -> str:
    return f"({t} IS NULL OR {t} = 'null' OR {check})"


def _is_object(t: str) -> str:
    return f"starts_with({t}, '{{')"


def _attrs_ok(t: str) -> str:
    return f"({t} = 'null' OR {_is_object(t)})"


def _valid_checks(t: dict[str, str]) -> dict[str, str]:
    """Each kind's field checks over the fields' JSON texts ``t``."""
    return {
        "metric": f"{_is_num(t['value'])} AND ({t['unit']} IS NULL OR {_is_str(t['unit'])}) AND "
                  f"{_opt_null(t['step'], _is_int(t['step']))} AND "
                  f"{_opt_null(t['attributes'], _is_object(t['attributes']))}",
        "event": f"{_is_str(t['severity'])} AND {_attrs_ok(t['attributes'])} AND {_is_str(t['event_id'])} AND "
                 f"{_is_str(t['span_id'])}",
        "span_start": f"{_is_str(t['span_id'])} AND {_is_str(t['parent_id'])} AND {_is_str(t['trace_id'])} AND "
                      f"{_attrs_ok(t['attributes'])}",
        "span_end": f"{_is_str(t['span_id'])} AND {_is_int(t['duration_ns'])} AND {_is_str(t['status'])} AND "
                    f"{_attrs_ok(t['attributes'])} AND {_is_str(t['error'])}",
        "stat": f"starts_with({t['values']}, '{{') AND list_bool_and(list_transform(map_values(json_transform("
                f"{t['values']}, '\"MAP(VARCHAR, JSON)\"')), lambda x: {_is_num('x::VARCHAR')})) IS NOT FALSE AND "
                f"{_is_int(t['start_mono_ns'])} AND {_is_int(t['count'])} AND {_is_str(t['unit'])} AND "
                f"{_opt_null(t['histogram'], _is_object(t['histogram']))}",
        "diagnostic": f"{_is_str(t['sink'])} AND {_is_int(t['count'])} AND {_is_str(t['message'])}",
    }


_VALID = _valid_checks(_T)
_VALUE = "value_text"  # the value's JSON text, from the metric fast path or the general one


def _value_columns(t: dict[str, str], value: str, unit: str, step: str) -> dict[str, str]:
    """Each output column's expression over the fields' JSON text ``t``, the value's text ``value`` and the unit's and
    step's expressions (which differ between the two paths)."""
    return {
        "value": f"(CASE WHEN {value} = 'true' THEN 1.0 WHEN {value} = 'false' THEN 0.0 "
                 f"WHEN starts_with({value}, '\"') THEN TRY_CAST(trim({value}, '\"') AS DOUBLE) "
                 f"ELSE TRY_CAST({value} AS DOUBLE) END)",
        "value_int": f"(CASE WHEN {_is_int(value)} THEN TRY_CAST({value} AS BIGINT) END)",
        "value_bool": f"(CASE WHEN {value} IN ('true', 'false') THEN {value} = 'true' END)",
        "unit": unit,
        "step": step,
        "attributes": f"(CASE WHEN starts_with({t['attributes']}, '{{') AND {t['attributes']} <> '{{}}' "
                      f"THEN {t['attributes']} END)",
        "severity": "s.severity",
        "event_id": "s.event_id",
        "span_id": "s.span_id",
        "parent_id": "s.parent_id",
        "trace_id": "s.trace_id",
        "duration_ns": "s.duration_ns",
        "status": "s.status",
        "error": "s.error",
        "start_mono_ns": "s.start_mono_ns",
        "sample_count": "s.count",
        "values": t["values"],
        "histogram": f"(CASE WHEN starts_with({t['histogram']}, '{{') THEN {t['histogram']} END)",
        "sink": "s.sink",
        "record_count": "s.count",
        "message": "s.message",
    }


_VALUES = _value_columns(_T, _VALUE, "coalesce(CASE WHEN m IS NOT NULL THEN m.unit ELSE s.unit END, '')",
                        "CASE WHEN m IS NOT NULL THEN m.step ELSE s.step END")


# JSON has no NaN or Infinity; Python's parser and DuckDB's both take some as an extension, differently. The reader
# refuses them (``codec.loads``); here: a line holding one outside a string (strings blanked first) is not JSON.
# (Such a constant stands where a value starts: after ':', '[' or ',', or after a '-', maybe after whitespace.)
# Such a constant holds "nan" or "inf" in some case: a line without either (most lines: two string searches, cheaper
# than the regular expressions) needs neither regular expression.
_BARE_CONSTANT = ("(CASE WHEN (contains(lower(line), 'nan') OR contains(lower(line), 'inf')) AND "
                  "regexp_matches(line, '[:\\[,-][ \\t\\r\\n]*[NnIi]') THEN regexp_matches("
                  "regexp_replace(line, '\"(\\\\.|[^\"\\\\])*\"', '\"\"', 'g'), '(?i)nan|inf') ELSE false END)")


# The metric fast path. A line of the one shape the writer gives a plain metric (``codec._enc_metric`` without
# attributes: these keys in this order, no whitespace, strings without escapes or control characters, integers that
# fit 64 bits, a number, a bool or a non-finite tag as the value) is valid JSON with no bare constant, no duplicate or
# unknown key and every field of its type: what the general checks would find, proven by one regular expression (a
# DFA pass) instead of a validation, an extraction of every field and their checks. Its fields are then read with one
# typed parse of seven fields. Any other line, of any kind, takes the general path below, as before.
_FAST_STR = '"(?:[^"\\\\\\x00-\\x1f]*)"'
_FAST_INT = "(?:-?(?:0|[1-9][0-9]{0,17}|[1-8][0-9]{18}))"  # within 64 bits by its digits alone
_FAST_NUM = ('(?:-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|"NaN"|"Infinity"|"-Infinity")')
_FAST_METRIC = ('\\{"v":[12],"kind":"metric","mono_ns":' + _FAST_INT + ',"wall_ns":' + _FAST_INT + ',"group":'
                + _FAST_STR + ',"name":' + _FAST_STR + ',"value":' + _FAST_NUM + '(?:,"unit":' + _FAST_STR
                + ')?(?:,"step":(?:' + _FAST_INT + '|null))?\\}')
_FAST_FIELDS = ('{"mono_ns": "BIGINT", "wall_ns": "BIGINT", "group": "VARCHAR", "name": "VARCHAR", "value": "JSON", '
                '"unit": "VARCHAR", "step": "BIGINT"}')


def _lines_cte(source: str, lines: bool) -> str:
    """The ``lines`` CTE (``line``, ``n``: its number from 0): ``source`` split at every newline, or (with ``lines``)
    ``source`` itself, already split (``convert.split_lines``: the same strings, an empty one after the last newline
    included, without DuckDB's copy of every line into a list and out of it again: ~0.7 us a line)."""
    if lines:
        return f"lines AS (SELECT line, n FROM {source}),"
    return (f"split AS (SELECT string_split(content, chr(10)) AS l FROM {source}),\n"
            "lines AS (SELECT unnest(l) AS line, generate_subscripts(l, 1) - 1 AS n FROM split),")


def _fast_ctes(source: str, lines: bool) -> str:
    """The CTEs both fast-path queries begin with: ``lines``, ``body`` (the lines that are records: complete, not
    blank, not a header) and ``fast`` (``m``: the plain metric shape's typed fields, NULL for any other line)."""
    fast_rx = _FAST_METRIC.replace("'", "''")
    return f"""WITH {_lines_cte(source, lines)}
body AS (SELECT n, line FROM lines WHERE n < $lines AND (starts_with(line, '{{') OR trim(line, {_WHITESPACE}) <> '')
         AND NOT list_contains($headers, n)),
fast AS (SELECT n, line, CASE WHEN regexp_full_match(line, '{fast_rx}') THEN from_json(line, '{_FAST_FIELDS}') END AS m
         FROM body),"""


def typed_rows_sql(source: str, *, fast: bool = True, lines: bool = False) -> str:
    """A query over one segment's text: one row per line that is not a header, with ``n`` (its line number), ``kind``
    (NULL when the line is corrupt: broken JSON, not v1, a field of the wrong type, an unknown kind) and every typed
    field. ``source`` is a table expression with one column ``content`` (the file's text), or with ``lines`` one of
    its lines already split (columns ``line`` and ``n``, see ``_lines_cte``); the parameter ``$headers`` lists the
    header lines (a prescan's), which are not records, and ``$lines`` the complete lines to take. Without ``fast``,
    every line takes the general path, in the query of ``_general_rows_sql`` (``convert`` asks for it where a line is
    long)."""
    if not fast:
        return _general_rows_sql(source, lines)
    paths = "[" + ", ".join(f"'$.\"{name}\"'" for name in FIELDS) + "]"
    typed = "{" + ", ".join(f'"{name}": "{typ}"' for name, typ in _TYPES.items()) + "}"
    common = (f"{_T['v']} IN ('1', '2') AND {_is_int(_T['mono_ns'])} AND {_is_int(_T['wall_ns'])} AND "
              f"{_is_str(_T['group'])} AND {_is_str(_T['name'])}")
    kind = _T["kind"]
    valid = " ".join(f"WHEN {kind} = '\"{k}\"' THEN ({cond})" for k, cond in _VALID.items())
    values = ",\n  ".join(f"{expr} AS {name}" for name, expr in _VALUES.items())
    unpack = ", ".join(f"f[{i + 1}]::VARCHAR AS j_{name}" for i, name in enumerate(FIELDS))

    def pick(name: str) -> str:  # a typed field: the fast path's, else the general one's
        return f"CASE WHEN m IS NOT NULL THEN m.{name} ELSE s.{name} END"

    return f"""
{_fast_ctes(source, lines)}
parsed AS (SELECT n, line, m, json_extract(CASE WHEN m IS NULL AND json_valid(line) AND NOT {_BARE_CONSTANT}
           THEN line END, {paths}) AS f FROM fast),
unpacked AS (SELECT n, line, m, f IS NOT NULL AS parsed, {unpack} FROM parsed),
checked AS (SELECT * EXCLUDE (parsed), CASE WHEN parsed THEN coalesce({common} AND (CASE {valid} ELSE false END),
            false) ELSE false END AS ok FROM unpacked),
typed AS (SELECT * EXCLUDE (line), CASE WHEN ok THEN from_json(line, '{typed}') END AS s,
          CASE WHEN m IS NOT NULL THEN m.value::VARCHAR ELSE {_T['value']} END AS {_VALUE} FROM checked),
rows AS (SELECT n, CASE WHEN m IS NOT NULL THEN 'metric' WHEN ok THEN trim({kind}, '"') END AS kind,
  {pick('mono_ns')} AS mono_ns, {pick('wall_ns')} AS wall_ns, {pick('"group"')} AS group_name, {pick('name')} AS name,
  {values}
FROM typed)
SELECT * FROM rows"""


# -- the metric fast path in a table of its own ----------------------------------------------------------------------
# The combined query above carries every line through the general path's 24 extracted fields and 27 output columns,
# NULL for a fast line: ~0.8 us a line of projections and storage. Compaction instead converts a chunk in two steps:
# ``fast_metric_rows_sql`` gives each line either its metric row (the fast path's columns, computed by the same
# expressions) or, for any other line, its text in ``rest``; ``typed_rows_sql(..., fast=False)`` then reads only
# those texts. Same rows (tests/test_compaction_fast_path.py): a line takes the fast path on the same test.

_FAST_VALUES = _value_columns({**_T, "attributes": "NULL::VARCHAR"}, _VALUE, "coalesce(m.unit, '')", "m.step")
FAST_METRIC_COLUMNS = ("value", "value_int", "value_bool", "unit", "step")


def fast_metric_rows_sql(source: str, *, lines: bool = True) -> str:
    """Step one of the two-step conversion: one row per line of ``source`` (as ``typed_rows_sql`` takes it: split
    already with ``lines``, else a ``content`` to split) that is not a header, as ``typed_rows_sql`` keeps them: a line
    of the plain-metric shape as its metric row (``n``, ``mono_ns``, ``wall_ns``, ``group_name``, ``name`` and
    ``FAST_METRIC_COLUMNS``; ``rest`` NULL), any other as its text in ``rest`` (the other columns NULL), for
    ``typed_rows_sql(..., fast=False, lines=True)``. Parameters as ``typed_rows_sql``'s."""
    values = ", ".join(f"CASE WHEN m IS NOT NULL THEN {_FAST_VALUES[name]} END AS {name}"
                       for name in FAST_METRIC_COLUMNS)
    return f"""
{_fast_ctes(source, lines)}
typed AS (SELECT n, m, CASE WHEN m IS NULL THEN line END AS rest, m.value::VARCHAR AS {_VALUE} FROM fast)
SELECT n, m.mono_ns AS mono_ns, m.wall_ns AS wall_ns, m."group" AS group_name, m.name AS name, {values}, rest
FROM typed"""


# Spans of the writer's shape without attributes (``codec._enc_span_start``/``_enc_span_end`` with ``{}``: the
# lifecycle's iteration spans), among the lines step one left: proven valid by one regular expression each, as
# metrics are, read by one typed parse; the others go on to the general path. Same rows as the general path's.
_FAST_HEAD = ('\\{"v":[12],"kind":"%s","mono_ns":' + _FAST_INT + ',"wall_ns":' + _FAST_INT + ',"group":' + _FAST_STR
              + ',"name":' + _FAST_STR + ',"span_id":' + _FAST_STR)
_FAST_SPAN_START = (_FAST_HEAD % "span_start") + ',"parent_id":' + _FAST_STR + ',"trace_id":' + _FAST_STR + \
    ',"attributes":\\{\\}\\}'
_FAST_SPAN_END = (_FAST_HEAD % "span_end") + ',"duration_ns":' + _FAST_INT + ',"status":' + _FAST_STR + \
    ',"attributes":\\{\\},"error":' + _FAST_STR + '\\}'
_FAST_SPAN_FIELDS = ('{"mono_ns": "BIGINT", "wall_ns": "BIGINT", "group": "VARCHAR", "name": "VARCHAR", '
                     '"span_id": "VARCHAR", "parent_id": "VARCHAR", "trace_id": "VARCHAR", "duration_ns": "BIGINT", '
                     '"status": "VARCHAR", "error": "VARCHAR"}')


def fast_span_rows_sql(source: str) -> str:
    """Step one and a half: the lines of ``source`` (``n``, ``line``: what step one left, filtered already) as span
    rows where they have the plain span shape (``kind``, the common columns, ``unit`` '' as the general path gives
    every record, the span's columns; ``rest`` NULL), any other as its text in ``rest``."""
    start = _FAST_SPAN_START.replace("'", "''")
    end = _FAST_SPAN_END.replace("'", "''")

    def only(shape: int, column: str) -> str:
        return f"CASE WHEN shape = {shape} THEN m.{column} END AS {column}"

    return f"""
WITH k AS (SELECT n, line, CASE WHEN regexp_full_match(line, '{start}') THEN 1
                                WHEN regexp_full_match(line, '{end}') THEN 2 END AS shape FROM {source}),
p AS (SELECT n, line, shape, CASE WHEN shape IS NOT NULL THEN from_json(line, '{_FAST_SPAN_FIELDS}') END AS m FROM k)
SELECT n, CASE shape WHEN 1 THEN 'span_start' WHEN 2 THEN 'span_end' END AS kind, m.mono_ns AS mono_ns,
  m.wall_ns AS wall_ns, m."group" AS group_name, m.name AS name, CASE WHEN shape IS NOT NULL THEN '' END AS unit,
  m.span_id AS span_id, {only(1, 'parent_id')}, {only(1, 'trace_id')}, {only(2, 'duration_ns')}, {only(2, 'status')},
  {only(2, 'error')}, CASE WHEN shape IS NULL THEN line END AS rest
FROM p"""


# -- the general path alone (every line checked in full), for text with long lines ----------------------------------
# The query as it was before the metric fast path, kept verbatim: with a long line (a megabyte) among lines of the fast
# path, the combined query costs DuckDB a copy of the long line per row of its vector (seconds a line); this one does
# not. Same rows: ``typed_rows_sql`` gives what this gives, line for line (tests/test_compaction_rate.py).

_T_G = {name: f"f[{i + 1}]::VARCHAR" for i, name in enumerate(FIELDS)}  # the field's JSON text (NULL: no such key)
_VALID_G = _valid_checks(_T_G)
_VALUE_G = _T_G["value"]
_VALUES_G = _value_columns(_T_G, _VALUE_G, "coalesce(s.unit, '')", "s.step")


# JSON has no NaN or Infinity; Python's parser and DuckDB's both take some as an extension, differently. The reader
# refuses them (``codec.loads``); here: a line holding one outside a string (strings blanked first) is not JSON.
# (Such a constant stands where a value starts: after ':', '[' or ',', or after a '-', maybe after whitespace.)
_BARE_CONSTANT_G = ("(CASE WHEN regexp_matches(line, '[:\\[,-][ \\t\\r\\n]*[NnIi]') THEN regexp_matches("
                  "regexp_replace(line, '\"(\\\\.|[^\"\\\\])*\"', '\"\"', 'g'), '(?i)nan|inf') ELSE false END)")


def _general_rows_sql(source: str, lines: bool = False) -> str:
    """``typed_rows_sql`` without the metric fast path: the general checks on every line, as before it."""
    paths = "[" + ", ".join(f"'$.\"{name}\"'" for name in FIELDS) + "]"
    typed = "{" + ", ".join(f'"{name}": "{typ}"' for name, typ in _TYPES.items()) + "}"
    common = (f"{_T_G['v']} IN ('1', '2') AND {_is_int(_T_G['mono_ns'])} AND {_is_int(_T_G['wall_ns'])} AND "
              f"{_is_str(_T_G['group'])} AND {_is_str(_T_G['name'])}")
    kind = _T_G["kind"]
    valid = " ".join(f"WHEN {kind} = '\"{k}\"' THEN ({cond})" for k, cond in _VALID_G.items())
    values = ",\n  ".join(f"{expr} AS {name}" for name, expr in _VALUES_G.items())
    return f"""
WITH {_lines_cte(source, lines)}
body AS (SELECT n, line FROM lines WHERE n < $lines AND (starts_with(line, '{{') OR trim(line, {_WHITESPACE}) <> '')
         AND NOT list_contains($headers, n)),
parsed AS (SELECT n, line, CASE WHEN json_valid(line) AND NOT {_BARE_CONSTANT_G} THEN json_extract(line, {paths}) END
           AS f FROM body),
checked AS (SELECT n, line, f, coalesce(f IS NOT NULL AND {common} AND (CASE {valid} ELSE false END), false) AS ok
            FROM parsed),
typed AS (SELECT n, f, ok, CASE WHEN ok THEN from_json(line, '{typed}') END AS s FROM checked)
SELECT n, CASE WHEN ok THEN trim({kind}, '"') END AS kind, s.mono_ns AS mono_ns, s.wall_ns AS wall_ns,
  s.group AS group_name, s.name AS name,
  {values}
FROM typed"""
