"""Compaction's metric fast path (``columnar.typed_rows_sql``) against the general path it bypasses (the query as it was
before the fast path, ``fast=False``): the same rows, bit for bit, on lines of every shape the fast path could take
or misjudge; and a chunk holding a long line (which takes the general path) keeps every record."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import pytest

duckdb = pytest.importorskip("duckdb")

from telemetrain.store import open_run  # noqa: E402
from telemetrain.store.columnar import typed_rows_sql  # noqa: E402
from telemetrain.store.compact import compact, connect  # noqa: E402
from telemetrain.store.convert import FAST_PATH_MAX_LINE, replace_lone_surrogates  # noqa: E402
from test_reader_damage import DAMAGED, _write_run  # noqa: E402


def _metric(value: str = "1", mono: str = "5", group: str = '"g"', name: str = '"n"', tail: str = "") -> str:
    return (f'{{"v":2,"kind":"metric","mono_ns":{mono},"wall_ns":1795720731554430670,"group":{group},"name":{name},'
            f'"value":{value}{tail}}}')


VALUES = ["1.0", "-0", "0", "-0.0", "1E3", "1e999", "123456789012345678901234567890", "9223372036854775807",
          "9223372036854775808", "true", "false", "null", '"NaN"', '"Infinity"', '"-Infinity"', '"nan"', "NaN",
          "-Infinity", '"x"', "[1]", "{}", "0.1", "1.50", "01", "2.5e-3", "1.7976931348623157e308"]
INTS = ["0", "-0", "-5", "1.0", "1e3", '"5"', "true", "8999999999999999999", "9000000000000000000",
        "9223372036854775807", "9223372036854775808", "-9223372036854775809", "007"]
STRINGS = ['""', '"a\\"b"', '"\\u00e9"', '"é"', '"日本"', '"a\\\\b"', '"\\n"', '"a\tb"', "5", "null", '"a,b:c"',
           '"\\ud800"']
LINES = [
    *DAMAGED,
    *(_metric(v) for v in VALUES),
    *(_metric(v, tail=',"unit":"s","step":3') for v in VALUES),
    *(_metric(mono=i) for i in INTS),
    *(_metric(tail=f',"step":{i}') for i in [*INTS, "null"]),
    *(_metric(group=s) for s in STRINGS),
    *(_metric(name=s, tail=f',"unit":{s}') for s in STRINGS),
    _metric(tail=',"x":NaN'), _metric(tail=',"x":1'), _metric(tail=',"name":"dup"'), _metric(tail=',"value":"dup"'),
    _metric(tail=',"attributes":{}'), _metric(tail=',"attributes":{"a":NaN}'), _metric(tail=',"step":1,"unit":"s"'),
    _metric() + " ", " " + _metric(), _metric() + "\r", _metric().replace(":", ": "),
    _metric().replace('"v":2', '"v":3'), _metric().replace('"v":2', '"v":1'),
    _metric()[:-1], _metric() + "}", _metric().replace("metric", "Metric"),
]


def _bits(row: tuple[Any, ...]) -> list[Any]:
    return [struct.pack("<d", v) if isinstance(v, float) and not math.isnan(v) else
            ("nan" if isinstance(v, float) else v) for v in row]


def test_fast_path_gives_the_general_paths_rows_bit_for_bit() -> None:
    text = replace_lone_surrogates(("\n".join(LINES) + "\n").encode()).decode()
    con = connect()
    con.execute("CREATE TEMP TABLE src AS SELECT $c AS content", {"c": text})
    rows = {}
    for fast in (True, False):
        rows[fast] = [_bits(r) for r in con.execute(
            f"SELECT * FROM ({typed_rows_sql('src', fast=fast)}) ORDER BY n",
            {"headers": [], "lines": len(LINES)}).fetchall()]
    assert rows[True] == rows[False]
    kept = sum(1 for r in rows[True] if r[1] is not None)
    assert 0 < kept < len(rows[True])  # both kept and corrupt lines were compared


def test_a_chunk_with_a_long_line_keeps_every_record(tmp_path: Path) -> None:
    run = _write_run(tmp_path, ranks=1, n=300)
    f = next(run.glob("rank-*.jsonl"))
    with open(f, "a") as fh:
        fh.write('{"v":2,"kind":"event","mono_ns":5,"wall_ns":1,"group":"g","name":"long","severity":"info",'
                 f'"attributes":{{"blob":"{"x" * (4 * FAST_PATH_MAX_LINE)}"}},"event_id":"","span_id":""}}\n')
        fh.write(_metric() + "\n")
    expected = len(open_run(run).processes[0].records)
    result = compact(run)
    assert not result.errors and result.records == expected


# -- compaction's two steps (convert._fast_step / _general_step) and the Arrow line split -----------------------------

def _span_start(v: str = "2", mono: str = "5", group: str = '"training"', name: str = '"x"', span_id: str = '"a1"',
                trace_id: str = '"t1"', attributes: str = "{}") -> str:
    return (f'{{"v":{v},"kind":"span_start","mono_ns":{mono},"wall_ns":1,"group":{group},"name":{name},'
            f'"span_id":{span_id},"parent_id":"","trace_id":{trace_id},"attributes":{attributes}}}')


def _span_end(v: str = "2", duration: str = "3", status: str = '"ok"', error: str = '""', attributes: str = "{}",
              tail: str = "") -> str:
    return (f'{{"v":{v},"kind":"span_end","mono_ns":5,"wall_ns":1,"group":"training","name":"x","span_id":"a1",'
            f'"duration_ns":{duration},"status":{status},"attributes":{attributes},"error":{error}{tail}}}')


ODD = [
    _metric('"NaN"', tail=',"unit":"é","step":9223372036854775807'), _metric("1e-05", name='"日本"'),
    _metric("-9223372036854775808"), _metric(tail=',"step":-9223372036854775809'), _metric(mono="1" * 30),
    _metric().replace(',"group":"g"', ""), _metric().replace('"value":1', '"value":Infinity'),
    '{"v":2,"kind":"span_start","mono_ns":5,"wall_ns":1,"group":"training","name":"x","span_id":"a","parent_id":"",'
    '"trace_id":"t","attributes":{}}',
    '{"v":2,"kind":"span_end","mono_ns":5,"wall_ns":1,"group":"training","name":"x","span_id":"a","duration_ns":3,'
    '"status":"ok","attributes":{},"error":""}',
    *(_span_start(**kw) for kw in ({}, {"span_id": '"a\\"b"'}, {"span_id": "7"}, {"trace_id": '""'},
                                    {"attributes": '{"k":1}'}, {"attributes": "null"}, {"name": '"日本"'},
                                    {"mono": "9223372036854775808"}, {"group": '"a\tb"'})),
    *(_span_end(**kw) for kw in ({}, {"duration": '"3"'}, {"duration": "-9223372036854775808"}, {"duration": "1.0"},
                                  {"status": "null"}, {"error": '"boom \\u00e9"'}, {"attributes": '{"k":NaN}'},
                                  {"tail": ',"x":1'}, {"v": "3"})),
    _span_end().replace(',"error":""', ""), _span_start().replace('"kind":"span_start"', '"kind":"span_end"'),
    '{"v":2,"kind":"event","mono_ns":5,"wall_ns":1,"group":"g","name":"e","severity":"info","attributes":{"a":"\\u00e9",'
    '"n":"NaN"},"event_id":"","span_id":""}',
    '{"v":2,"kind":"event","mono_ns":5,"wall_ns":1,"group":"g","name":"long","severity":"info","attributes":'
    f'{{"blob":"{"x" * (2 * FAST_PATH_MAX_LINE)}"}},"event_id":"","span_id":""}}',  # long: no effect on two steps
    "", "\r", "\x0c",
]


def _seg_rows(con: Any) -> list[list[Any]]:
    names = [r[0] for r in con.execute("DESCRIBE SELECT * FROM seg").fetchall()]
    cols = ", ".join(f'"{n}"' for n in sorted(names))
    return [_bits(r) for r in con.execute(f"SELECT {cols} FROM seg ORDER BY line").fetchall()]


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 700])
@pytest.mark.parametrize("arrow", [True, False])
def test_compactions_two_steps_give_the_general_paths_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          chunk_bytes: int, arrow: bool) -> None:
    """Every line of every shape (LINES, ODD), after a real header, through compaction's conversion (metric lines in a
    table of their own, the rest through the general path once per segment; lines split by pyarrow or by DuckDB) and
    through the general path alone: the same rows, bit for bit, identity and line numbers included; chunks of 700
    bytes cut the file in many pieces."""
    from telemetrain.identity import identity_from_env
    from telemetrain.store import convert

    run = _write_run(tmp_path, ranks=1, n=20)
    f = next(run.glob("rank-*.jsonl"))
    with open(f, "a") as fh:
        for i, line in enumerate([*LINES, *ODD] * 2):
            fh.write(line + "\n")
            if i % 7 == 0:
                fh.write(_metric(tail=f',"step":{i}') + "\n")
        fh.write(_metric()[:-5])  # torn
    fallback = identity_from_env({}, run_id="r1", session_tag="s")
    rows = {}
    if arrow:
        monkeypatch.setattr(convert, "ARROW_SPLIT_AFTER_BYTES", 0)
        monkeypatch.setattr(convert, "ARROW_SPLIT_MIN_BYTES", 0)
        real_split = convert.split_lines
        used: list[int] = []

        def counted_split(data: bytes) -> Any:
            used.append(1)
            return real_split(data)

        monkeypatch.setattr(convert, "split_lines", counted_split)
    else:
        monkeypatch.setattr(convert, "split_lines", lambda data: None)
    for way in ("two steps", "general"):
        if way == "general":
            monkeypatch.setattr(convert, "split_lines", lambda data: None)
            monkeypatch.setattr(convert, "FAST_PATH_MAX_LINE", -1)
        con = connect()
        scan, _ = convert.convert_segment(con, f, fallback, "s", "r1", 0, chunk_bytes=chunk_bytes,
                                          chunk_tables=way == "two steps")
        rows[way] = _seg_rows(con)
        if way == "two steps":
            tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
            assert "seg_g0" in tables  # the general step ran (once, for the whole segment)
        if way == "two steps":
            convert.drop_converted(con)
        else:
            con.execute("DROP TABLE seg")
        assert not con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary AND "
                               "starts_with(table_name, 'seg')").fetchone()[0]
        assert scan.torn == 1
    assert rows["two steps"] == rows["general"]
    assert not arrow or used
    assert len(rows["general"]) > len(LINES) * 2


@pytest.mark.parametrize("text", ["", "\n", "a", "a\n", "a\n\nb\r\n", "é\n日本\n\n", '{"x":1}\n' * 5 + "torn"])
def test_split_lines_splits_as_duckdb_does(text: str) -> None:
    from telemetrain.store.convert import split_lines

    con = connect()
    expected = con.execute("SELECT unnest(l), generate_subscripts(l, 1) - 1 FROM "
                           "(SELECT string_split($t, chr(10)) AS l)", {"t": text}).fetchall()
    table = split_lines(text.encode())
    assert list(zip(table.column("line").to_pylist(), table.column("n").to_pylist(), strict=True)) == expected


@pytest.mark.parametrize("with_attributes", [False, True])
def test_the_metrics_file_is_in_file_order_sorted_or_not(tmp_path: Path, with_attributes: bool) -> None:
    """A segment whose metric rows all took the fast step is written without a sort (``metrics_in_order``); one with
    a metric of the general path (attributes) is sorted: either way the file's rows are its lines, in order."""
    run = _write_run(tmp_path, ranks=1, n=3000)
    f = next(run.glob("rank-*.jsonl"))
    lines = f.read_text().splitlines(keepends=True)
    odd = len(lines) // 2  # the line number of the metric with attributes, if any
    if with_attributes:
        lines.insert(odd, _metric(tail=',"attributes":{"a":1}') + "\n")
    f.write_text("".join(lines))
    expected = len(open_run(run).processes[0].records)
    result = compact(run)
    assert not result.errors and result.records == expected
    con = connect()
    files = f"{run}/_columnar/_shared/metrics/*/*/*.parquet"  # (a small segment: compacted in a batch)
    got = [r[0] for r in con.execute(f"SELECT line FROM read_parquet('{files}', hive_partitioning=false)").fetchall()]
    assert got == sorted(got) and len(set(got)) == len(got) >= 3000
    assert not with_attributes or odd in got
