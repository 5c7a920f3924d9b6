"""A real v1 memory cgroup with a limit, for the tests that need the kernel's own OOM killer (root, a writable v1
memory hierarchy); the test skips, saying why, where one cannot be made."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

MiB = 1 << 20


def own_memory_cgroup() -> str | None:
    """This process's v1 memory cgroup directory, or None (v2 alone, no cgroups)."""
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
            return d if os.path.isfile(os.path.join(d, "memory.limit_in_bytes")) else None
    return None


@contextlib.contextmanager
def limited_memory_cgroup(prefix: str, limit: int) -> Iterator[str]:
    """A child of this process's v1 memory cgroup limited to ``limit`` bytes, removed after (empty by then: the
    processes put in it have ended)."""
    own = own_memory_cgroup()
    if own is None:
        pytest.skip("no v1 memory cgroup here")
    child = os.path.join(own, f"{prefix}-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(child)
        Path(child, "memory.limit_in_bytes").write_text(str(limit))
    except OSError as exc:
        if os.path.isdir(child):
            os.rmdir(child)
        pytest.skip(f"cannot make a cgroup with a memory limit here: {exc}")
    try:
        yield child
    finally:
        os.rmdir(child)
