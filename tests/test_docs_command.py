"""``telemetrain docs``: the user guides from the command line, every citation of them in the commands' text resolved,
and the guides inside the built package (a user who did ``pip install telemetrain`` has no ``docs/`` folder)."""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from telemetrain import cli, guides

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# the form every user-visible citation takes: the command that prints the guide, in backticks
CITATION = re.compile(r"`telemetrain docs ([a-z0-9_-]+(?: [^`{}]+)?)`")
# the older form, "docs/report.md", in a string a user sees (docstrings and comments are for developers)
OLD_FORM = re.compile(r"docs/[\w/]+\.md")
# files being changed elsewhere at the time of writing, which still cite the older form; drop them as they adopt it
PENDING: set[str] = set()


def _docs(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["docs", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _headings(path: Path) -> list[tuple[int, str, int]]:
    """(level, heading, line index) of a Markdown file, counted here apart from the module's parser."""
    found, fenced = [], False
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#+) (.*)", line)):
            found.append((len(m.group(1)), m.group(2).strip(), i))
    return found


def test_without_topic_lists_every_guide_with_its_title(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _docs(capsys)
    assert code == 0
    files = [*sorted(DOCS.glob("*.md")), *sorted(DOCS.glob("backends/*.md"))]
    assert len(files) >= 15
    listed = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines() if line.startswith("  ")}
    assert list(listed) == [f.stem for f in files]  # one topic per file, none hidden by a namesake
    for f in files:
        assert listed[f.stem] == _headings(f)[0][1].replace("`", "")


def test_a_topic_prints_its_guide(capsys: pytest.CaptureFixture[str]) -> None:
    for topic, path in (("report", DOCS / "report.md"), ("prometheus", DOCS / "backends" / "prometheus.md")):
        assert _docs(capsys, topic) == (0, path.read_text(encoding="utf-8"), "")


def test_a_section_runs_to_the_next_heading_of_its_level_or_higher(capsys: pytest.CaptureFixture[str]) -> None:
    lines = (DOCS / "report.md").read_text(encoding="utf-8").splitlines()
    heads = _headings(DOCS / "report.md")
    n = next(n for n, (_, text, _) in enumerate(heads) if text == "Findings")
    level, _, start = heads[n]
    end = next((i for lv, _, i in heads[n + 1:] if lv <= level), len(lines))
    assert any(lv > level for lv, _, i in heads if start < i < end)  # its subsections come with it
    expected = "\n".join(lines[start:end]).rstrip() + "\n"
    for spelling in ("Findings", "findings", "FINDINGS"):
        assert _docs(capsys, "report", spelling) == (0, expected, "")
    # several words are one heading, matched by its start when no heading equals them
    code, out, _ = _docs(capsys, "format", "columnar", "copy")
    assert code == 0 and out.startswith("## Columnar copy (")


def test_markdown_structure_inside_code_fences_is_not_a_heading() -> None:
    text = "# T\n## A\n```bash\n# a comment\n## not a heading\n```\nbody\n### A.1\nx\n## B\ny\n"
    found = [(s.level, s.heading, s.start, s.end) for s in guides.sections(text)]
    assert found == [(1, "T", 0, 11), (2, "A", 1, 9), (3, "A.1", 7, 9), (2, "B", 9, 11)]


@pytest.mark.parametrize(("args", "says"), [
    (["nope"], "no guide 'nope'; the guides: "),
    (["report", "nope"], "no section 'nope' in `telemetrain docs report`; its sections: "),
    (["integrations", "lightning"], "'lightning' starts several sections of `telemetrain docs integrations`: "),
])
def test_an_unknown_topic_or_section_is_a_usage_error_listing_the_choices(
    capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    code, out, err = _docs(capsys, *args)
    assert (code, out) == (2, "")
    assert err.startswith(f"telemetrain: error: {says}") and err.count("\n") == 1
    if args == ["nope"]:
        assert all(f.stem in err for f in DOCS.glob("*.md"))
    if args == ["report", "nope"]:
        assert all(text in err for lv, text, _ in _headings(DOCS / "report.md") if lv > 1)


def test_path_prints_where_the_guides_are(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _docs(capsys, "--path")
    assert code == 0 and (Path(out.strip()) / "report.md").is_file()
    code, out, _ = _docs(capsys, "tensorboard", "--path")
    assert code == 0 and Path(out.strip()).read_bytes() == (DOCS / "backends" / "tensorboard.md").read_bytes()


def _user_strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings, with their line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_every_citation_in_the_commands_text_names_a_guide_and_section(capsys: pytest.CaptureFixture[str]) -> None:
    src = ROOT / "src" / "telemetrain"
    cited, old = [], []
    for path in sorted(src.rglob("*.py")):
        name = path.relative_to(src).as_posix()
        for line, text in _user_strings(path):
            cited += [(f"{name}:{line}", m.group(1)) for m in CITATION.finditer(text)]
            if name not in PENDING:
                old += [f"{name}:{line}: {m.group(0)}" for m in OLD_FORM.finditer(text)]
    assert old == []
    where = {w.split(":")[0] for w, _ in cited}
    assert {"report/html.py", "report/commands.py", "analysis/compare_text.py"} <= where  # the scan sees them
    for at, citation in cited:
        code, out, err = _docs(capsys, *shlex.split(citation))
        assert code == 0 and out, f"{at}: `telemetrain docs {citation}`: {err}"


# a command line the guides show: inline code that starts with it, or a line of a code block (after a "$ " prompt)
SHOWN_COMMAND = re.compile(r"`telemetrain ([a-z]+)([^`]*)`|^\s*(?:\$ )?telemetrain ([a-z]+)(.*)$")


def _shown_commands(text: str) -> list[tuple[int, str, str]]:
    """(line, command, the rest) of each command line shown in a Markdown text, outside Python code blocks."""
    found, fence = [], ""
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("```"):
            fence = "" if fence else (stripped[3:].strip() or "text")
            continue
        if fence == "python":
            continue
        for m in SHOWN_COMMAND.finditer(line):
            if fence and m.group(3) is not None:
                found.append((n, m.group(3), m.group(4)))
            elif not fence and m.group(1) is not None:
                found.append((n, m.group(1), m.group(2)))
    return found


def test_every_command_and_flag_the_guides_show_exists() -> None:
    """README.md and the guides show commands with their flags: each command must be one, and each flag one of its
    own (a renamed or removed flag would otherwise live on in the docs). Flags after `|` belong to a pipe's next
    command."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    checked, wrong = 0, []
    for path in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for n, command, rest in _shown_commands(path.read_text(encoding="utf-8")):
            where = f"{path.relative_to(ROOT)}:{n}"
            if command not in commands:
                wrong.append(f"{where}: no command `telemetrain {command}`")
                continue
            if command == "launch":  # torchrun's flags, parsed by torchrun
                continue
            flags = {o for a in commands[command]._actions for o in a.option_strings}
            for flag in re.findall(r"(?<![\w/.-])(--?[a-zA-Z][\w-]*)", rest.split(" | ")[0]):
                checked += 1
                if flag not in flags:
                    wrong.append(f"{where}: `telemetrain {command}` has no {flag}")
    assert wrong == []
    assert checked > 20  # the scan sees the command lines


def test_every_flag_of_every_command_is_in_the_docs() -> None:
    """The other way round: a flag added to a command is named in README.md or a guide (by one of its spellings)."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    text = "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))])
    missing = [f"telemetrain {name} {'/'.join(action.option_strings)}" for name, command in commands.items()
               for action in command._actions if action.option_strings and "--help" not in action.option_strings
               and not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text) for o in action.option_strings)]
    assert missing == []


def _setuptools_builds() -> bool:
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return False
    return major >= 77  # pyproject.toml's license form needs it


@pytest.mark.skipif(not _setuptools_builds(), reason="needs setuptools>=77 in this environment (built offline)")
def test_sdist_and_wheel_carry_the_guides_and_an_install_reads_them(tmp_path: Path) -> None:
    # a copy of what the sdist is made from, so that the build leaves nothing in the checkout
    tree = _mkdir(tmp_path / "tree")
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(DOCS, tree / "docs")
    env = dict(os.environ)

    def build(kind: str, cwd: Path, dest: Path) -> Path:
        script = f"from setuptools import build_meta as b; print(b.build_{kind}({str(dest)!r}))"
        done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=240,
                              env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return dest / done.stdout.strip().splitlines()[-1]

    sdist = build("sdist", tree, _mkdir(tmp_path / "dist"))
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    wheel = build("wheel", next((tmp_path / "unpacked").iterdir()), tmp_path / "dist")  # the wheel pip makes from it
    expected = {f"telemetrain/_guides/{f.relative_to(DOCS).as_posix()}"
                for f in [*DOCS.glob("*.md"), *DOCS.glob("backends/*.md")]}
    with zipfile.ZipFile(wheel) as whl:
        shipped = {n for n in whl.namelist() if n.startswith("telemetrain/_guides/")}
        assert shipped == expected  # the guides, and not the images or scripts beside them
        assert whl.read("telemetrain/_guides/report.md") == (DOCS / "report.md").read_bytes()
        whl.extractall(tmp_path / "site")
    # the installed layout, away from any checkout: the command reads the package's copy
    def installed(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "telemetrain.cli", "docs", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120,
                              env={**env, "PYTHONPATH": str(tmp_path / "site")})

    done = installed("report", "findings")
    assert done.returncode == 0 and done.stdout.startswith("## Findings\n"), done.stderr
    assert Path(installed("--path").stdout.strip()) == tmp_path / "site" / "telemetrain" / "_guides"


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
