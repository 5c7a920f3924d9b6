"""``telemetrain query --format csv``: SQL NULL and an empty (or NULL-spelled) string stay distinct, read back by
DuckDB's own CSV reader told the null string, as PostgreSQL's CSV convention has it."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from telemetrain.cli import main
from test_cli import _synthetic_run

SQL = ("SELECT NULL AS n, '' AS empty, 'NULL' AS word, 'a,\"b\"' AS quoted, 1.5 AS x, 'nan'::DOUBLE AS nan "
       "FROM metrics LIMIT 1")
EXPECTED = (None, "", "NULL", 'a,"b"', 1.5)


@pytest.mark.parametrize(("flags", "null"), [([], ""), (["--null", "NULL"], "NULL"), (["--null", r"\N"], r"\N")])
def test_csv_keeps_null_apart_from_strings(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                                           null: str) -> None:
    duckdb = pytest.importorskip("duckdb")
    run_dir = _synthetic_run(tmp_path, "q", loss=1.0)
    assert main(["query", str(run_dir), SQL, "--format", "csv", *flags]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "out.csv"
    path.write_text(text, newline="")
    read = duckdb.sql(f"SELECT * FROM read_csv('{path}', header = true, nullstr = '{null}', "
                      "allow_quoted_nulls = false, all_varchar = false)").fetchall()
    assert len(read) == 1
    n, empty, word, quoted, x, nan = read[0]
    assert (n, empty, word, quoted, float(x)) == EXPECTED
    assert str(nan).lower() == "nan"
    # the raw fields: NULL unquoted, every string equal to the null string quoted
    line = text.splitlines()[1]
    assert line.startswith(f"{null},")
    fields = next(csv.reader([line]))
    assert fields[:4] == [null, "", "NULL", 'a,"b"']


def test_table_writes_null_as_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("duckdb")
    run_dir = _synthetic_run(tmp_path, "q", loss=1.0)
    assert main(["query", str(run_dir), "SELECT NULL AS n, 'x' AS s FROM metrics LIMIT 1"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split() == ["NULL", "x"]
    assert main(["query", str(run_dir), "SELECT NULL AS n, 'x' AS s FROM metrics LIMIT 1", "--null", "(null)"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split() == ["(null)", "x"]


def test_a_null_string_that_csv_would_quote_is_a_usage_error(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _synthetic_run(tmp_path, "q", loss=1.0)
    assert main(["query", str(run_dir), "SELECT 1", "--format", "csv", "--null", "a,b"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "argument --null: must not hold a comma, a double quote or a line break, got 'a,b'" in captured.err


def test_a_table_of_no_rows_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A header alone (a metric name mistyped in WHERE) read like a cut-off output."""
    pytest.importorskip("duckdb")
    run_dir = _synthetic_run(tmp_path, "q", loss=1.0)
    assert main(["query", str(run_dir), "SELECT name FROM metrics WHERE name = 'los'"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["name", "----"] and captured.err == "(0 rows)\n"
    assert main(["query", str(run_dir), "SELECT name FROM metrics WHERE name = 'loss'"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["query", str(run_dir), "SELECT name FROM metrics WHERE name = 'los'", "--format", "csv"]) == 0
    assert capsys.readouterr() == ("name\r\n", "")  # (csv and json stay as they are, for scripts)
