"""The training reports as typed rows: the columnar copy's derived table ``reports`` (schema version 3).

A ``training_metrics_update`` event carries its window's figures in its JSON attributes (~30 numbers, ~1.2 KB). Every
reader wants those figures, for every report of every rank: parsing the JSON for them (``json_extract``) was the
costliest part of reading a large run (64 ranks x 1M iterations: 1.28 M reports, ~5 CPU seconds per pass, and 30-60
MiB of DuckDB working memory per statement). So compaction types them once, into a table of their own beside the
``events`` (which keep each report whole, attributes included): one row per report, the record's identity, position
and clocks, and one column per figure below. The engine gives the JSONL not yet compacted (and copies of version 2,
which have no such table) the same rows, typed by the same SQL at read time (``report_rows_sql``), so the readers
see one table whichever way a segment is read.

Typing, the same for every reader: an integer figure is a JSON integer within 64 bits (else NULL); the loop's start
(``train_iterations_start``) also keeps a JSON bool apart (``train_iterations_start_bool``), which the findings read
as an integer as Python's ``isinstance(True, int)`` does, and the other readers do not; any other figure is a DOUBLE
from a JSON number that is not a bool, the non-finite ones included (``{"$float": "NaN"}`` inside attributes), else
NULL. A figure a report does not carry is NULL. docs/format.md ("Columnar copy") lists the columns.
"""

from __future__ import annotations

from .columnar import COLUMNS, COMMON, IDENTITY_COLUMNS, POSITION_COLUMNS

__all__ = ["ALL_COLUMNS", "REPORT", "REPORTS_TABLE", "REPORT_FIELDS", "REPORT_FIELDS_SINCE", "report_rows_sql"]

REPORTS_TABLE = "reports"
REPORT = ("training", "training_metrics_update")  # (group, name) of the events typed here

_PHASES = ("dataloader", "h2d", "forward", "backward", "optimizer", "zero_grad")
_INTEGERS = ("current_iteration", "window_iterations", "train_iterations_start")
# Every figure a reader takes from every report (the findings' window points, the windows view, compare's series,
# goodput's timestamps); a figure not listed here is still in the event's attributes.
REPORT_FIELDS: tuple[tuple[str, str], ...] = (
    *((n, "BIGINT") for n in _INTEGERS), ("train_iterations_start_bool", "BOOLEAN"),
    *((n, "DOUBLE") for n in (
        "avg_iteration_time_sec", "p50_iteration_time_sec", "p90_iteration_time_sec", "p99_iteration_time_sec",
        "max_iteration_time_sec", "total_iteration_time_sec", "samples_per_second", "window_seconds",
        "cpu_time_sec", "cpu_wait_sec", "train_thread_cpu_time_sec", "train_thread_cpu_wait_sec",
        "avg_comm_wait_time_sec", "avg_comm_world_wait_time_sec", "avg_iteration_device_time_sec",
        "last_logged_train_iterations_finish_timestamp_sec",
        *(f"avg_{p}_time_sec" for p in _PHASES), *(f"avg_{p}_device_time_sec" for p in _PHASES),
        *(f"avg_{p}_comm_wait_sec" for p in (*_PHASES, "other")))),
)
# the figures added after the table was (the schema version whose copies have them): older copies read NULL there
REPORT_FIELDS_SINCE = {"avg_comm_world_wait_time_sec": 5}
REPORT_COLUMNS = (*IDENTITY_COLUMNS, *POSITION_COLUMNS, *COMMON, *REPORT_FIELDS)
ALL_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {**COLUMNS, REPORTS_TABLE: REPORT_COLUMNS}


def _json_double(x: str) -> str:
    """SQL: the JSON value ``x`` as a DOUBLE when it is a number (not a bool), the non-finite ones included (written
    ``{"$float": "NaN"}`` inside attributes); NULL otherwise."""
    return (f"(CASE WHEN json_type({x}) IN ('BIGINT', 'UBIGINT', 'DOUBLE') THEN TRY_CAST({x} AS DOUBLE) "
            f"WHEN json_type({x}) = 'OBJECT' AND json_extract_string({x}, '$.\"$float\"') IN "
            f"('NaN', 'Infinity', '-Infinity') AND len(json_keys({x})) = 1 THEN "
            f"CAST(json_extract_string({x}, '$.\"$float\"') AS DOUBLE) END)")


def report_rows_sql(source: str, where: str = "true", *, partitions: bool = False, extra: str = "") -> str:
    """SQL: the ``reports`` rows (``REPORT_COLUMNS``, in that order; then ``session``, ``run``, ``rank`` with
    ``partitions``; then the columns ``extra`` names, ", a, b") of the event rows of ``source`` that ``where`` selects:
    each report's attributes parsed once (one ``json_extract`` of every path), then typed."""
    wanted = [n for n, _ in REPORT_FIELDS if n != "train_iterations_start_bool"]
    index = {n: i for i, n in enumerate(wanted, start=1)}
    paths = "[" + ", ".join(f"'$.{n}'" for n in wanted) + "]"
    fields = []
    for name, typ in REPORT_FIELDS:
        if name == "train_iterations_start_bool":
            x = f"j[{index['train_iterations_start']}]"
            fields.append(f"(CASE WHEN json_type({x}) = 'BOOLEAN' THEN TRY_CAST({x} AS BOOLEAN) END) AS {name}")
        elif typ == "BIGINT":
            x = f"j[{index[name]}]"
            fields.append(f"(CASE WHEN json_type({x}) IN ('BIGINT', 'UBIGINT') THEN TRY_CAST({x} AS BIGINT) END) "
                          f"AS {name}")
        else:
            fields.append(f"{_json_double(f'j[{index[name]}]')} AS {name}")
    head = ", ".join(f'"{n}"' for n, _ in (*IDENTITY_COLUMNS, *POSITION_COLUMNS, *COMMON))
    tail = (", session, run, rank" if partitions else "") + extra
    return (f"SELECT {head}, {', '.join(fields)}{tail} FROM (SELECT *, json_extract(attributes, {paths}) AS j "
            f"FROM {source} WHERE group_name = '{REPORT[0]}' AND name = '{REPORT[1]}' AND ({where}))")
