"""Reading the peers' files: from a git directory at pinned revisions, or from a plain directory tree."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .expected import PeerFile


class SetupError(Exception):
    """The peer sources or the environment are not usable (exit status 2)."""


class PeerSource:
    """A git directory (bare or a checkout's) read at pinned revisions, or a plain directory tree read as it is."""

    def __init__(self, root: Path) -> None:
        if not root.is_dir():
            raise SetupError(f"{root}: not a directory")
        self.root = root
        self.git_dir: str | None = None
        probe = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--absolute-git-dir"], capture_output=True, text=True, check=False
        )
        if probe.returncode == 0:
            self.git_dir = probe.stdout.strip()

    def describe(self, rev: str) -> str:
        if self.git_dir is None:
            return f"{self.root} (plain tree: pins not checked)"
        return f"{self.git_dir} @ {rev}"

    def read(self, peer_file: PeerFile) -> str:
        if self.git_dir is None:
            path = self.root / peer_file.path
            if not path.is_file():
                raise SetupError(f"{path}: missing")
            return path.read_text(encoding="utf-8")
        shown = subprocess.run(
            ["git", "--git-dir", self.git_dir, "show", f"{peer_file.rev}:{peer_file.path}"],
            capture_output=True, text=True, check=False,
        )
        if shown.returncode != 0:
            raise SetupError(
                f"{self.git_dir}: cannot read {peer_file.rev}:{peer_file.path}: {shown.stderr.strip()} (a shallow "
                "clone lacks the pinned revisions: fetch them, choose one with --pytorch-rev/--one-logger-rev, or "
                "give a plain directory tree holding the files at their repository paths)"
            )
        return shown.stdout

