"""The benchmark and example commands the docs give still run as written: each script they name exists, answers
``--help`` (argparse, not a run or a traceback), and defines every flag they show it with."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
PAGES = [ROOT / "BENCHMARKS.md", ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMMAND = re.compile(r"((?:bench|examples)/\w+\.py)((?: +--?[a-z][\w-]*(?: +[^ #`|)\n-][^ #`|)\n]*)?)*)")


@functools.cache
def _modules(script: Path) -> tuple[ast.Module, ...]:
    """The script's syntax tree and those of the modules beside it that it imports (the harnesses split out of it)."""
    seen, todo, trees = set(), [script], []
    while todo:
        path = todo.pop()
        if path in seen or not path.exists():
            continue
        seen.add(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        trees.append(tree)
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            todo += [script.parent / f"{n.split('.')[0]}.py" for n in names]
    return tuple(trees)


@functools.cache
def _flags(script: Path) -> set[str]:
    return {arg.value for tree in _modules(script) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
            for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}


def _parses_arguments(script: Path) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "parse_args"
               for tree in _modules(script) for node in ast.walk(tree))


def test_every_bench_script_answers_help() -> None:
    scripts = [p for p in sorted(BENCH.glob("*.py")) if not p.name.startswith("_")]  # examples take no flags or few
    assert len(scripts) > 15
    assert [p.name for p in scripts if not _parses_arguments(p)] == []


def test_every_bench_command_in_the_docs_names_a_script_and_its_flags() -> None:
    commands = [(page.name, m.group(1), m.group(2)) for page in PAGES
                for m in COMMAND.finditer(page.read_text(encoding="utf-8"))]
    assert len(commands) > 40
    wrong = []
    for page, name, args in commands:
        script = ROOT / name
        if not script.exists():
            wrong.append(f"{page}: {name}")
            continue
        if script.name.startswith("_"):
            continue  # a worker or helper module, named, not run
        flags = _flags(script)
        wrong += [f"{page}: {name} {f}" for f in re.findall(r"(?<!\S)(--?[a-z][\w-]*)", args) if f not in flags]
    assert wrong == []
