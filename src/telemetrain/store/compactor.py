"""The run store writer's side of compaction: start ``python -m telemetrain.store.compact`` for a process's closed
segments, and reap it.

What this must never do, and how it does not:

- **break or slow training**: the conversion runs in a separate process (no GIL, no memory shared with training),
  started by ``posix_spawn``/``vfork`` (the training process's pages are not copied), at ``nice 10``, only when DuckDB
  is installed; a failure to start is
  counted, never raised. At most ``TELEMETRAIN_COMPACT_JOBS`` conversions run at once per host and user (the
  compactor waits for a slot: a node's eight ranks rolling their segments together do not take eight cores).
- **leave a zombie**: a daemon thread waits for each compactor it started, so an exited one is reaped at once, even
  in a process that runs as PID 1 of a container.
- **hold the training job hostage**: the compactor runs in its own session with no descriptor of the training
  process (stdin/stdout/stderr are ``/dev/null``, every other descriptor is closed), so a launcher waiting for its
  worker's pipes or signalling its process group is not held up by it; when training exits, is SIGTERMed or
  SIGKILLed, the compactor finishes or is killed on its own, and whatever it left half-written is ignored by readers
  (a copy is trusted only through its manifest, written last) and redone by the next ``telemetrain compact``.
- **compact a segment twice at once**: the compactor takes an exclusive ``flock`` per segment (released by the
  kernel when it dies, SIGKILL included) and re-checks the manifest under it, so the writer's compactors, a user's
  ``telemetrain compact`` and a second writer's close never convert the same segment concurrently.
- **be on when not wanted**: ``RunStoreSink(compact=False)`` or ``TELEMETRAIN_COMPACT=0`` turn it off; a forked
  child forgets its parent's compactors.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

__all__ = ["COMPACT_ENV", "BackgroundCompactor", "compaction_enabled"]

COMPACT_ENV = "TELEMETRAIN_COMPACT"


def compaction_enabled(setting: bool | None) -> bool:
    """``setting`` when given, else ``$TELEMETRAIN_COMPACT`` (on unless ``0``/``false``/``no``/``off``)."""
    if setting is not None:
        return setting
    return os.environ.get(COMPACT_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class BackgroundCompactor:
    """Starts and reaps the compaction processes of one run store writer."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.setting = enabled
        self.started = 0
        self.failures = 0  # could not start, or exited with an error
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._has_duckdb: bool | None = None

    @property
    def enabled(self) -> bool:
        if not compaction_enabled(self.setting):
            return False
        if self._has_duckdb is None:
            self._has_duckdb = importlib.util.find_spec("duckdb") is not None
        return self._has_duckdb

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def start(self, segments: Sequence[Path], *, include_last: bool) -> bool:
        """Compact ``segments`` (one process's, in order; the last one too with ``include_last``) in a new process.
        False when off or when it could not be started."""
        if not segments or not self.enabled:
            return False
        argv = [sys.executable, "-m", "telemetrain.store.compact", "--segments", *(str(p) for p in segments)]
        if include_last:
            argv.append("--include-last")
        env = {**os.environ, COMPACT_ENV: "0", "CUDA_VISIBLE_DEVICES": ""}  # no GPU, no compaction of its own
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True, env=env)
        except (OSError, ValueError, subprocess.SubprocessError):
            self.failures += 1
            return False
        self.started += 1
        with self._lock:
            self._running.add(proc)
        try:
            threading.Thread(target=self._reap, args=(proc,), name="compaction reaper (telemetrain)",
                             daemon=True).start()
        except RuntimeError:  # at interpreter shutdown no thread starts: the exiting process leaves it to init
            with self._lock:
                self._running.discard(proc)
        return True

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            code = proc.wait()
        except Exception:  # noqa: BLE001 - a reaper must not raise in its thread
            code = -1
        with self._lock:
            self._running.discard(proc)
        if code != 0:
            self.failures += 1

    def after_fork_in_child(self) -> None:
        """The compactors are the parent's children: this process can neither wait for them nor must it."""
        self._running = set()
        self._lock = threading.Lock()
