"""Where the docs give a findings threshold with its value -- `` `slowdown_effect` (1.3) `` -- the value is the
default of that field of ``Thresholds``: a recalibrated threshold must not leave the old number in the docs."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from telemetrain.analysis.findings.thresholds import DEFAULT_THRESHOLDS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FIELDS = {f.name for f in dataclasses.fields(DEFAULT_THRESHOLDS)}
# the field last in inline code, its value in brackets after it (across a line break), or both inside the code
STATED = re.compile(r"\b([a-z_]+)`?\s+\(([^()`\n]*)\)")
UNITS = {"": 1.0, "%": 0.01, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "MiB": 2.0**20}


def _value(text: str) -> float | None:
    if text == "half":
        return 0.5
    m = re.fullmatch(r"([0-9][0-9.,]*)\s*(%|s|ms|us|µs|MiB)?", text.strip())
    return float(m.group(1).replace(",", "")) * UNITS[m.group(2) or ""] if m else None


def test_every_threshold_the_docs_state_is_the_default() -> None:
    stated, wrong = 0, []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in STATED.finditer(text):
            name, given = m.groups()
            if name not in FIELDS:
                continue
            stated += 1
            value = _value(given)
            if value is None or not math.isclose(value, getattr(DEFAULT_THRESHOLDS, name), rel_tol=1e-9):
                n = text.count("\n", 0, m.start()) + 1
                wrong.append(f"{page.name}:{n}: {name} ({given}), default {getattr(DEFAULT_THRESHOLDS, name)}")
    assert stated > 20  # the scan sees them
    assert wrong == []
