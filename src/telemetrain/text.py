"""Text from records, made safe to print: one line per item, no terminal control sequences, no reordered text."""

from __future__ import annotations

__all__ = ["printable"]

# C0 controls, DEL and C1 controls: a name or attribute must not move the cursor, recolour or retitle a terminal.
_ESCAPES = {i: f"\\x{i:02x}" for i in (*range(0x20), 0x7F, *range(0x80, 0xA0))} | {
    # Unicode's line and paragraph separators (a line break to many viewers and to str.splitlines) and the bidi
    # embeddings, overrides and isolates, which make a name show as other text (CVE-2021-42574, "Trojan Source")
    i: f"\\u{i:04x}" for i in (0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
} | {
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\\t",
}


def printable(text: str) -> str:
    """``text`` with control characters written as escapes (``\\n``, ``\\x1b``, ...)."""
    return text.translate(_ESCAPES)
