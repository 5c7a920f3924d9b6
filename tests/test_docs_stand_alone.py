"""The documentation stands alone (issue 15, item 5): no page, and no comment a reader follows from one, points into a
folder that users of the repository do not have; facts relied on cite their public source instead."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `shared/...` (the development team's notes) and the names of the notes in it
PRIVATE = re.compile(r"\bshared/|\bDESIGN(\.md)?\b|landscape\.md|torch_apis\.md|one_logger\.md|peer_overheads\.md|"
                     r"peers_bench\.py")


def _texts() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
    files += sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "bench").glob("*.py"))
    files += sorted((ROOT / "examples").glob("*.py"))
    return files


def test_no_reference_to_a_folder_users_do_not_have() -> None:
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in _texts()
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if PRIVATE.search(line)]
    assert found == []
