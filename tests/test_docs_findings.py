"""docs/report.md names every kind of finding the engine and the report make, and Note's docstring every kind of
note: a user filtering `show --json` by kind reads the names there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from telemetrain.analysis.findings.model import SEVERITIES, Note

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "telemetrain"
MAKERS = [*sorted((SRC / "analysis" / "findings").glob("*.py")), SRC / "report" / "findings.py",
          SRC / "report" / "gpu_health.py"]


def _made(kind_of: str) -> set[str]:
    """The kinds each `Finding(severity, kind, ...)` (or a finding's tuple) / `Note(kind, ...)` call is given."""
    found = set()
    for path in MAKERS:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Call, ast.Tuple)):
                continue
            args = node.args if isinstance(node, ast.Call) else node.elts
            name = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
            values = [a.value if isinstance(a, ast.Constant) else None for a in args]
            severity, kind = [*values, None, None][:2]
            if kind_of == "finding" and len(values) >= 3 and severity in SEVERITIES and isinstance(kind, str) \
                    and kind not in SEVERITIES and name in ("Finding", None):
                found.add(kind)
            elif kind_of == "note" and name == "Note" and values and isinstance(values[0], str):
                found.add(values[0])
    return found


def test_report_md_names_every_kind_of_finding() -> None:
    kinds = _made("finding")
    assert {"slowdown", "straggler", "slow checkpoint rank", "gpu throttling", "failed spans"} <= kinds
    text = (ROOT / "docs" / "report.md").read_text(encoding="utf-8").lower()
    marks = ("**", "*", "`")  # bold, italic, code
    assert sorted(k for k in kinds if not any(f"{m}{k}{m}" in text for m in marks)) == []


def test_notes_docstring_names_every_kind_of_note() -> None:
    kinds = _made("note")
    assert {"contention", "brief", "unconfirmed"} <= kinds
    documented = set(re.findall(r"``(\w+)``", Note.__doc__ or ""))
    assert documented == kinds | {"kind"}
