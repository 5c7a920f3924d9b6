"""The report page's tables: cells escaped (``Raw`` markup excepted), a per-rank table of many rows shortened to its
first rows and outliers with the whole table folded (``many_ranks.few_rows``), attributes as a cell shows them."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .many_ranks import few_rows
from .svg import esc

__all__ = ["Raw", "attribute_value", "attributes_cell", "few_table", "folded", "table"]


# a cell with a run of this many characters without a space (a long metric name, a path) may break anywhere; only
# such cells: every cell breakable lets the table squeeze its short words and numbers into stacks of letters
_LONG_WORD = re.compile(r"\S{48}")


class Raw(str):
    """Markup built by the page's own code (already escaped), to put in a table cell as is."""


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    """A table; the cells of the columns ``numeric`` right-aligned; None is shown as "-" (not known)."""
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = cell if isinstance(cell, Raw) else "-" if cell is None else esc(cell)
            cls = ' class="num"' if i in numeric else ' class="wrap"' if _LONG_WORD.search(text) else ""
            cells.append(f"<td{cls}>{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def few_table(header: Sequence[str], rows: Sequence[Sequence[Any]], *, numeric: Sequence[int],
              key: Callable[[Sequence[Any]], float | None], what: str, outliers: str,
              marked: Callable[[Sequence[Any]], bool] = lambda row: False) -> str:
    """A per-rank table: past 16 rows, the first and the outliers (the lowest and the highest ``key``, the rows
    ``marked``; ``outliers`` says which), then every row folded (``<details>``: no script)."""
    shown, left = few_rows(rows, key=key, marked=marked)
    if not left:
        return table(header, rows, numeric=numeric)
    return (table(header, shown, numeric=numeric)
            + f'<p class="note">{left:,} more not listed above (listed: the first {esc(what)}, {esc(outliers)}).</p>'
            + folded(f"all {len(rows):,} {what}", table(header, rows, numeric=numeric)))


def folded(summary: str, body: str) -> str:
    """``body`` folded under the line ``summary`` (``<details>``: opened by a click, no script)."""
    return f"<details><summary>{esc(summary)}</summary>{body}</details>"


def attributes_cell(attributes: dict[str, Any] | None, limit: int = 240) -> Raw:
    """A record's attributes in one cell, ``key=value`` each, cut after ``limit`` characters."""
    if not attributes:
        return Raw("")
    text = ", ".join(f"{k}={attribute_value(v)}" for k, v in attributes.items())
    if len(text) > limit:
        text = text[:limit] + " ..."
    return Raw(f'<span class="attrs">{esc(text)}</span>')


def attribute_value(v: Any) -> str:
    """An attribute or config value as a cell shows it: six significant digits, except that large numbers (a Unix
    timestamp in seconds, a byte count) keep every integer digit and up to three decimals, not 1.79587e+09."""
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if 1e6 <= abs(v) < 1e16:
            return f"{v:.3f}".rstrip("0").rstrip(".")
        return f"{v:.6g}"
    return str(v)
