"""The build's one addition to pyproject.toml: the user guides in ``docs/`` go into the package as
``telemetrain/_guides/``, so that ``telemetrain docs`` has them after a plain ``pip install``.

``docs/`` stays their only copy in the repository. A ``package-dir`` mapping of a subpackage onto ``docs/`` was the
alternative: it needs ``docs/__init__.py``, turns ``docs/*.py`` into modules of the package, and setuptools' package
auto-discovery does not combine with it (pypa/setuptools#4248). Editable installs and checkouts copy nothing:
``telemetrain.guides`` reads ``docs/`` beside ``src/`` there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DOCS = Path(__file__).resolve().parent / "docs"
GUIDES = ("*.md", "backends/*.md")  # not the images or the scripts beside them
TARGET = Path("telemetrain", "_guides")


class BuildPyWithGuides(build_py):
    def _guides(self) -> list[tuple[Path, Path]]:
        if self.editable_mode:  # the package is read from src/, and the guides from docs/, in place
            return []
        found = sorted(path for pattern in GUIDES for path in DOCS.glob(pattern))
        if not found:  # an sdist made without MANIFEST.in's docs lines would give a wheel without guides
            raise RuntimeError(f"no user guides under {DOCS}")
        return [(path, Path(self.build_lib, TARGET, path.relative_to(DOCS))) for path in found]

    def run(self) -> None:
        super().run()
        for source, dest in self._guides():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *(str(dest) for _, dest in self._guides())]


setup(cmdclass={"build_py": BuildPyWithGuides})
