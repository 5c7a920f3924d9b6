"""docs/architecture.md's module table names every module of src/telemetrain, and names no module that is gone."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "telemetrain"
TICKED = re.compile(r"`([^`]+)`")


def _table() -> list[tuple[list[str], set[str]]]:
    """Each row of the module table: the names its first column gives, and every backticked name of the row."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    lines = text[text.index("| module | one job |"):].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        first = line[1:].split("|", 1)[0]
        rows.append((TICKED.findall(first), set(TICKED.findall(line))))
    return rows


def _named(rel: str, rows: list[tuple[list[str], set[str]]]) -> bool:
    """A top-level module is named as `x.py` (or a glob of it); a package's module by its stem in its package's row."""
    stem = rel.rsplit("/", 1)[-1][:-3]
    everywhere = set().union(*(toks for _, toks in rows))
    if "/" not in rel:
        return any(fnmatch.fnmatch(rel, h) for heads, _ in rows for h in heads) or rel in everywhere
    packages = [(h, toks) for heads, toks in rows for h in heads if h.endswith("/") and rel.startswith(h)]
    if not packages:
        return False
    head, toks = max(packages, key=lambda p: len(p[0]))  # the most specific row: analysis/findings/ over analysis/
    sub = rel[len(head):-3]
    return any(t in (stem, sub, f"{sub}.py") or t.endswith((f".{stem}", f"/{stem}.py")) for t in toks)


def test_the_module_table_names_every_module() -> None:
    rows = _table()
    assert len(rows) > 20
    modules = [p.relative_to(SRC).as_posix() for p in sorted(SRC.rglob("*.py"))]
    unnamed = [m for m in modules if not m.endswith("__init__.py") and m != "_version.py" and not _named(m, rows)]
    assert unnamed == []


def test_every_module_the_tables_first_column_names_exists() -> None:
    for heads, _ in _table():
        for head in heads:
            if head.endswith("/"):
                assert (SRC / head).is_dir(), head
            else:
                assert list(SRC.glob(head)), head
