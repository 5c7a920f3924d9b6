"""Rewriting a peer's source: its module paths to telemetrain's, in imports and in dotted-path strings."""

from __future__ import annotations

import ast
import io
import json
import re
import subprocess
import sys
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass, field

from .sources import SetupError

_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\Z")


@dataclass
class Rewrite:
    text: str
    code_paths: int = 0  # module paths changed in code (imports)
    strings: list[tuple[str, str]] = field(default_factory=list)  # (old, new) dotted-path string literals
    kept: list[str] = field(default_factory=list)  # strings naming a peer path that telemetrain does not have


def _map_path(dotted: str, mapping: Mapping[str, str]) -> str | None:
    for key in sorted(mapping, key=len, reverse=True):
        if dotted == key or dotted.startswith(key + "."):
            return mapping[key] + dotted[len(key):]
    return None


def _code_pattern(mapping: Mapping[str, str]) -> re.Pattern[str]:
    keys = "|".join(re.escape(k) for k in sorted(mapping, key=len, reverse=True))
    return re.compile(rf"(?<![\w.])(?:{keys})(?![\w])")


def _offsets(source: str) -> list[int]:
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def rewrite_source(source: str, mapping: Mapping[str, str], resolvable: set[str]) -> Rewrite:
    """Change the module paths in ``source``: every one in code (imports); a string literal only when it is a whole
    dotted path under a mapped module that names something telemetrain has (``resolvable``), so that an event named
    ``"torch.monitor.TestEvent"`` stays as it is. Comments are not touched."""
    starts = _offsets(source)
    pattern = _code_pattern(mapping)
    edits: list[tuple[int, int, str]] = []
    result = Rewrite(source)
    code_start = 0

    def code_edits(begin: int, end: int) -> None:
        for match in pattern.finditer(source, begin, end):
            new = _map_path(match.group(0), mapping)
            assert new is not None
            edits.append((match.start(), match.end(), new))
            result.code_paths += 1

    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.STRING, tokenize.COMMENT):
            continue
        begin = starts[tok.start[0] - 1] + tok.start[1]
        end = starts[tok.end[0] - 1] + tok.end[1]
        code_edits(code_start, begin)
        code_start = end
        if tok.type != tokenize.STRING:
            continue
        try:
            value = ast.literal_eval(tok.string)
        except (ValueError, SyntaxError):
            continue
        if not isinstance(value, str) or not _DOTTED.match(value):
            continue
        new = _map_path(value, mapping)
        if new is None:
            continue
        if new in resolvable:
            quote = tok.string[-1]
            prefix = tok.string[: tok.string.index(quote)]
            edits.append((begin, end, f"{prefix}{quote}{new}{quote}"))
            result.strings.append((value, new))
        else:
            result.kept.append(value)
    code_edits(code_start, len(source))
    text = source
    for begin, end, new in sorted(edits, reverse=True):
        text = text[:begin] + new + text[end:]
    result.text = text
    return result


def string_candidates(source: str, mapping: Mapping[str, str]) -> set[str]:
    """The telemetrain paths that the dotted-path string literals of ``source`` would become."""
    found: set[str] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.STRING:
            continue
        try:
            value = ast.literal_eval(tok.string)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, str) and _DOTTED.match(value):
            new = _map_path(value, mapping)
            if new is not None:
                found.add(new)
    return found


_RESOLVE = """
import importlib, json, sys
ok = []
for path in json.loads(sys.stdin.read()):
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            break
        ok.append(path)
        break
print(json.dumps(ok))
"""


def resolve(paths: set[str], env: Mapping[str, str]) -> set[str]:
    """Those of ``paths`` that name a module or an attribute in telemetrain (checked in a process of its own)."""
    if not paths:
        return set()
    done = subprocess.run(
        [sys.executable, "-c", _RESOLVE], input=json.dumps(sorted(paths)), capture_output=True, text=True,
        env=dict(env), check=False,
    )
    if done.returncode != 0:
        raise SetupError(f"cannot import telemetrain to resolve dotted paths:\n{done.stderr}")
    return set(json.loads(done.stdout))


def leftover_imports(source: str, package: str) -> list[str]:
    """Imports of the peer's own package still in ``source`` after rewriting (an incomplete mapping)."""
    left: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        left += [name for name in names if name == package or name.startswith(package + ".")]
    return left

