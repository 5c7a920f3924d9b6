"""A run store written by someone else, read by you (docs/security.md): what it names must not make the readers read
outside it, and what it holds must reach the terminal as text."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from test_reader_damage import _write_run

duckdb = pytest.importorskip("duckdb")

from telemetrain.store.compact import COLUMNAR_DIR, compact  # noqa: E402
from telemetrain.store.engine import ColumnarWarning, Engine  # noqa: E402

MARKER = "read-from-outside-the-store"


def _outside_copy(run: Path, outside: Path) -> tuple[Path, Path, dict[str, Any]]:
    """A Parquet file outside the store, in the copy's own layout, whose metric names are MARKER; with the run's
    manifest (path and data) naming the run's first metrics file."""
    manifest = next((run / COLUMNAR_DIR / "_segments").rglob("*.json"))
    data = json.loads(manifest.read_text())
    entry = next(f for f in data["files"] if f["table"] == "metrics")
    target = outside / entry["path"]
    target.parent.mkdir(parents=True)
    con = duckdb.connect()
    source = str(run / COLUMNAR_DIR / entry["path"]).replace("'", "''")
    con.execute(f"COPY (SELECT * REPLACE ('{MARKER}' AS name) FROM read_parquet('{source}')) "
                f"TO '{str(target).replace(chr(39), chr(39) * 2)}' (FORMAT parquet)")
    con.close()
    return manifest, target, data


@pytest.mark.parametrize("how", ["absolute", "dot-dot", "link"])
def test_a_manifest_naming_a_file_outside_the_store_is_not_read(tmp_path: Path, how: str) -> None:
    """The manifest is the store's: one that names an absolute path, climbs out with ``../`` or reaches a file
    through a link planted in the copy is ignored (the JSONL is read instead), whatever that file holds."""
    run = _write_run(tmp_path / "store", ranks=1, n=20)
    compact(run)
    manifest, target, data = _outside_copy(run, tmp_path / "outside")
    entry = next(f for f in data["files"] if f["table"] == "metrics")
    entry["bytes"] = target.stat().st_size
    if how == "absolute":
        entry["path"] = str(target)
    elif how == "dot-dot":
        entry["path"] = os.path.relpath(target, run / COLUMNAR_DIR)
    else:  # the copy's own file replaced by a link to the outside one
        own = run / COLUMNAR_DIR / entry["path"]
        own.unlink()
        own.symlink_to(target)
    manifest.write_text(json.dumps(data))
    with pytest.warns(ColumnarWarning, match="not a file of the copy|leads out of"), Engine([run]) as engine:
        names = {row[0] for row in engine.rows("SELECT DISTINCT name FROM metrics")}
        assert MARKER not in names and "loss" in names
        assert engine.scalar("SELECT count(*) FROM metrics WHERE name = 'loss'") == 20
