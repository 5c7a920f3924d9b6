"""The user guides (``docs/*.md``, ``docs/backends/*.md``) and ``telemetrain docs``, which prints them.

An installed package carries them as ``telemetrain/_guides/`` (``setup.py`` copies them there at build time); a
checkout, or an editable install, reads ``docs/`` beside ``src/``. The commands' text cites a guide as the command
that prints it, in backticks (`telemetrain docs report findings`); tests/test_docs_command.py resolves every one.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .cli_common import CLIError

__all__ = ["Guide", "Section", "find_guide", "find_sections", "guides", "guides_dir", "register", "sections"]

_PACKAGED = Path(__file__).with_name("_guides")
_CHECKOUT = Path(__file__).resolve().parents[2]  # the repository root when running from src/
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Guide:
    topic: str  # the file's stem: what `telemetrain docs` takes
    path: Path
    title: str  # its first heading
    backend: bool  # under docs/backends/


@dataclass(frozen=True)
class Section:
    level: int  # 1 for '#', 2 for '##', ...
    heading: str
    start: int  # line index of the heading
    end: int  # line index past the section: the next heading of the same or a higher level, or the end


def guides_dir() -> Path:
    """Where the guides are: the package's copy, else a checkout's ``docs/``."""
    if (_PACKAGED / "report.md").is_file():
        return _PACKAGED
    docs = _CHECKOUT / "docs"
    if (_CHECKOUT / "pyproject.toml").is_file() and (docs / "report.md").is_file():
        return docs
    raise CLIError(f"the guides are missing: neither {_PACKAGED} nor a checkout's docs/ holds them (a package built "
                   "without them; reinstall telemetrain)")


def sections(text: str) -> list[Section]:
    """The headings of a Markdown text and the lines each covers; '#' lines inside code fences are not headings."""
    lines = text.splitlines()
    found: list[tuple[int, str, int]] = []
    fenced = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match:
            found.append((len(match.group(1)), match.group(2), i))
    result = []
    for n, (level, heading, start) in enumerate(found):
        end = next((s for lv, _, s in found[n + 1:] if lv <= level), len(lines))
        result.append(Section(level, heading, start, end))
    return result


def guides() -> dict[str, Guide]:
    """Every guide by topic: the top-level ones, then the backends', each group by name."""
    base = guides_dir()
    result: dict[str, Guide] = {}
    for path in [*sorted(base.glob("*.md")), *sorted(base.glob("backends/*.md"))]:
        text = path.read_text(encoding="utf-8")
        heads = sections(text)
        title = _plain(heads[0].heading) if heads else path.stem
        result[path.stem] = Guide(path.stem, path, title, path.parent != base)
    return result


def find_guide(topic: str) -> Guide:
    known = guides()
    guide = known.get(topic.lower().removesuffix(".md"))
    if guide is None:
        raise CLIError(f"no guide {topic!r}; the guides: {', '.join(known)}")
    return guide


def _plain(heading: str) -> str:
    return heading.replace("`", "")


def _key(heading: str) -> str:
    return " ".join(_plain(heading).lower().split())


def find_sections(guide: Guide, name: str) -> tuple[list[str], list[Section]]:
    """The guide's lines and the sections ``name`` picks: the headings equal to it (case, spacing and backticks
    aside), else the one heading that starts with it."""
    text = guide.path.read_text(encoding="utf-8")
    heads = sections(text)
    key = _key(name)
    exact = [s for s in heads if _key(s.heading) == key]
    picked = exact or [s for s in heads if _key(s.heading).startswith(key)]
    if not key or not picked:
        choices = "; ".join(_plain(s.heading) for s in heads if s.level > 1)
        raise CLIError(f"no section {name!r} in `telemetrain docs {guide.topic}`; its sections: {choices}")
    if len(picked) > 1 and not exact:
        choices = "; ".join(_plain(s.heading) for s in picked)
        raise CLIError(f"{name!r} starts several sections of `telemetrain docs {guide.topic}`: {choices}")
    return text.splitlines(), picked


# -- the command -------------------------------------------------------------------------------------------------------


def register(sub: Any) -> None:
    """Add ``telemetrain docs`` to the parser (``sub`` is its subparsers action)."""
    docs = sub.add_parser(
        "docs",
        help="read the user guides (what each number means, the formats, the backends)",
        description=(
            "Print a user guide, or one section of it, as Markdown text. Without TOPIC, list the guides. SECTION "
            "names a heading, case aside, or the start of one: `telemetrain docs report findings`."
        ),
    )
    docs.add_argument("topic", nargs="?", metavar="TOPIC", help="a guide, e.g. report, goodput, compare, format")
    docs.add_argument("section", nargs="*", metavar="SECTION", help="a heading in it (several words: one heading)")
    docs.add_argument("--path", action="store_true",
                      help="print the guide's file path instead (without TOPIC: the guides' folder)")
    docs.set_defaults(run=_cmd_docs)


def _cmd_docs(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.topic is None:
        if args.path:
            print(guides_dir(), file=out)
            return 0
        listed = list(guides().values())
        width = max(len(g.topic) for g in listed)
        print("guides (telemetrain docs TOPIC [SECTION]):", file=out)
        for backend in (False, True):
            if backend:
                print("backends:", file=out)
            for g in (g for g in listed if g.backend == backend):
                print(f"  {g.topic:<{width}}  {g.title}", file=out)
        return 0
    guide = find_guide(args.topic)
    if args.path:
        print(guide.path, file=out)
        return 0
    if not args.section:
        out.write(guide.path.read_text(encoding="utf-8"))
        return 0
    lines, picked = find_sections(guide, " ".join(args.section))
    print("\n\n".join("\n".join(lines[s.start:s.end]).rstrip() for s in picked), file=out)
    return 0
