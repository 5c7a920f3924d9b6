"""Compaction: JSONL segments -> the columnar copy (Parquet, zstd), one segment at a time, with DuckDB.

``compact(path)`` takes a run directory, a session directory or a store root; every segment without a valid copy is
converted (a segment torn by SIGKILL included: every complete line is kept). The JSONL files stay as they are: they
are the write-ahead log, the copy is derived and can be deleted and rebuilt at any time.

This module decides what to convert: which runs, which segments have no valid copy (``compact_process``, under
``compact_locks.segment_lock``), which small ones go together (``compact_batch``). One segment's copy is written by
``segment_copy.compact_segment``: ``convert.convert_segment`` parses and type-checks every line into a temporary table
(8 MiB at a time), a Parquet file per table is written, and the manifest (``_segments/.../<segment>.json``) last: a
reader trusts a copy only when its manifest is there, names the JSONL size it was made from, and every file it lists
is whole (docs/format.md). ``dest`` may be another directory or an object-store URL (``s3://bucket/prefix``, through
fsspec): the files are written locally, then uploaded.

The run store's writer runs this module as a separate, low-priority process when a segment is closed
(``python -m telemetrain.store.compact --segments FILE...``), so compaction never runs on the training thread or in
the training process (``compact_segments``, one at a time per host: ``compact_locks.host_slot``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..identity import Identity
from ..text import printable
from .columnar import KEPT_SINCE, PROCESS_TABLE
from .compact_locks import LOCK_TIMEOUT_S as LOCK_TIMEOUT_S  # (re-exported: imported from here before the split)
from .compact_locks import host_slot
from .compact_locks import segment_lock as segment_lock
from .files import foreign_link, private_temp_dir
from .files import make_dirs_under as make_dirs_under
from .manifest import SEGMENTS_DIR, Manifest, manifest_is_valid, manifest_path, read_manifest
from .reader import FormatVersionError, check_run_format, fallback_identity, find_runs, list_processes, read_run_meta
from .segment_copy import ROW_GROUP_ROWS as ROW_GROUP_ROWS
from .segment_copy import ROW_GROUP_ROWS_DEFAULT as ROW_GROUP_ROWS_DEFAULT
from .segment_copy import ZSTD_LEVEL as ZSTD_LEVEL
from .segment_copy import compact_segment

__all__ = ["COLUMNAR_DIR", "CompactResult", "Manifest", "compact", "manifest_path", "read_manifest"]

COLUMNAR_DIR = "_columnar"
MEMORY_LIMIT = "512MB"


@dataclass
class CompactResult:
    segments: int = 0  # segments converted now
    skipped: int = 0  # segments whose copy was already valid
    records: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def connect(memory_limit: str = MEMORY_LIMIT, threads: int = 1) -> Any:
    import duckdb

    # spilled rows go under the system's temp dir: DuckDB's default for an in-memory database is ".tmp" in the
    # current directory, which a background compaction would leave in the user's working directory
    spill = os.path.join(private_temp_dir(), str(os.getpid()))
    con = duckdb.connect(":memory:", config={"memory_limit": memory_limit, "threads": threads,
                                             "preserve_insertion_order": True, "autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False, "temp_directory": spill})
    return con


def segment_plan(run_dir: Path) -> list[tuple[Path, list[Path], dict[str, Any]]]:
    """(run directory, segment files of each process, meta) for compaction."""
    meta = read_run_meta(run_dir)
    return [(run_dir, paths, meta) for _, paths in sorted(list_processes(run_dir).items())]


def _session_run(run_dir: Path, meta: dict[str, Any]) -> tuple[str, str]:
    return str(meta.get("session_tag") or run_dir.parent.name or "unknown"), str(meta.get("run_id") or run_dir.name)


def compact_process(con: Any, run_dir: Path, paths: Sequence[Path], meta: dict[str, Any], prefix: Path,
                    result: CompactResult, *, include_last: bool = True, force: bool = False,
                    lock: bool = True, prefix_parents: bool = True) -> None:
    """Compact the segments of one process (in order) that have no valid copy under ``prefix``. With ``lock``, each
    segment is converted under an exclusive lock (``segment_lock``), its manifest checked again once the lock is held:
    two compactors never convert one segment at the same time. ``prefix_parents``: whether ``prefix``'s missing
    parents may be created (a destination the user named), or only ``prefix`` itself (``<run>/_columnar``: a run
    deleted meanwhile is not made again)."""
    from .segments import parse_segment_name

    if not prefix_parents and prefix.is_symlink():  # the store's own copy: a link there was planted, not followed
        result.errors.append(f"{prefix}: a link, not followed")
        return
    session, run = _session_run(run_dir, meta)
    identity: Identity | None = None
    for i, path in enumerate(paths):
        name = path.name
        parsed = parse_segment_name(name)
        segment = parsed.segment if parsed is not None else i
        mpath = prefix / manifest_path(session, run, name)
        existing = read_manifest(mpath, KEPT_SINCE)
        if existing is not None and not force and not manifest_is_valid(existing, prefix, path):
            result.skipped += 1
            identity = _identity_from(existing.last_identity) or identity
            continue
        if i == len(paths) - 1 and not include_last:
            break
        fallback = identity or fallback_identity(path, meta)
        try:
            prefix.mkdir(parents=prefix_parents, exist_ok=True)
            with segment_lock(mpath, enabled=lock, prefix=prefix):
                existing = read_manifest(mpath, KEPT_SINCE)  # another compactor may have done it while we waited
                if existing is not None and not force and not manifest_is_valid(existing, prefix, path):
                    result.skipped += 1
                    identity = _identity_from(existing.last_identity) or identity
                    continue
                manifest = compact_segment(con, path, prefix, fallback, session, run, segment)
        except (OSError, ValueError) as exc:
            result.errors.append(f"{path}: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - DuckDB's errors: one bad segment must not stop the others
            result.errors.append(f"{path}: {type(exc).__name__}: {exc}")
            continue
        identity = _identity_from(manifest.last_identity) or identity
        result.segments += 1
        result.records += sum(n for t, n in manifest.records.items() if t != PROCESS_TABLE)
        result.bytes_in += manifest.file_size
        result.bytes_out += sum(int(f["bytes"]) for f in manifest.files)


def _identity_from(data: Any) -> Identity | None:
    try:
        return Identity.from_dict(data) if isinstance(data, dict) else None
    except (TypeError, ValueError):
        return None


def compact(path: str | os.PathLike[str], dest: str | None = None, *, force: bool = False,
            include_last: bool = True) -> CompactResult:
    """Compact every run under ``path`` (a run, a session directory or a store root). ``dest``: where the copy goes
    (default: ``<run>/_columnar`` of each run; another directory, or an fsspec URL such as ``s3://bucket/prefix``,
    receives the same Hive tree for every run). ``force`` rewrites valid copies too."""
    base = Path(path)
    if not base.exists():
        raise FileNotFoundError(f"no such directory: {base}")
    runs = find_runs(base)
    if not runs:
        from .reader import NotARunError

        raise NotARunError(f"{base} holds no telemetrain run")
    t0 = time.perf_counter()
    result = CompactResult()
    remote = dest is not None and "://" in dest and not dest.startswith("file://")
    target = _remote_fs(str(dest)) if remote else None  # a URL that cannot be used fails before any work
    con = connect()
    try:
        for run_dir in runs:
            try:  # a run of a newer format would read as empty, and its empty copy be trusted
                check_run_format(run_dir)
            except FormatVersionError as exc:
                result.errors.append(str(exc))
                continue
            if target is not None:
                with tempfile.TemporaryDirectory(prefix="telemetrain-compact-") as tmp:
                    _compact_run(con, run_dir, Path(tmp), result, include_last=include_last, force=True,
                                 share=False)
                    _upload(Path(tmp), str(dest), *target)
            else:
                prefix = Path(dest.removeprefix("file://")) if dest is not None else run_dir / COLUMNAR_DIR
                if dest is None and prefix.is_symlink():  # the store's own copy; a --to link is the user's choice
                    result.errors.append(f"{prefix}: a link, not followed")
                    continue
                if dest is None and (why := foreign_link(run_dir)) is not None:  # a run path through a planted link
                    result.errors.append(why)
                    continue
                _compact_run(con, run_dir, prefix, result, include_last=include_last, force=force,
                             prefix_parents=dest is not None, share=dest is None)
    finally:
        con.close()
    result.seconds = time.perf_counter() - t0
    return result


def _compact_run(con: Any, run_dir: Path, prefix: Path, result: CompactResult, *, include_last: bool, force: bool,
                 prefix_parents: bool = True, share: bool = True) -> None:
    """The segments of a run without a valid copy: those of processes whose segments are all small together
    (``compact_batch``: thousands of ranks of a segment or two each), the others a process at a time. ``share``:
    a batch's segments share a file per table (the run's own copy, which telemetrain's readers read by its
    manifests), else each has its own files (a ``--to`` tree, for engines that read its Hive layout as it is)."""
    from .compact_batch import BatchPool

    pool = BatchPool(con, prefix, result, force=force, prefix_parents=prefix_parents, share=share)
    for _, paths, meta in segment_plan(run_dir):
        if not pool.take(run_dir, paths, meta, include_last=include_last):
            compact_process(con, run_dir, paths, meta, prefix, result, include_last=include_last, force=force,
                            prefix_parents=prefix_parents)
    pool.flush()


def _remote_fs(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path in it; an OSError naming the URL when it cannot be had (fsspec,
    or the protocol's package, not installed; an unknown protocol)."""
    try:
        import fsspec  # type: ignore[import-untyped]
    except ImportError:
        raise OSError(f'cannot write to {url}: fsspec is not installed: pip install "telemetrain[s3]"') from None
    try:
        fs, root = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise OSError(f"cannot write to {url}: {exc}") from None
    return fs, str(root)


def _upload(local: Path, url: str, fs: Any, root: str) -> None:
    """The local tree under ``local`` to ``root`` on ``fs`` (``url``'s), data files first and the manifests last."""
    files = sorted(p for p in local.rglob("*") if p.is_file() and not p.name.startswith("."))
    for p in sorted(files, key=lambda p: p.parts[len(local.parts)] == SEGMENTS_DIR):
        rel = p.relative_to(local).as_posix()
        try:
            fs.put_file(str(p), f"{root.rstrip('/')}/{rel}")
        except Exception as exc:  # each fsspec backend raises its own kinds (botocore's: no credentials, ...)
            raise OSError(f"cannot upload to {url}: {type(exc).__name__}: {exc}") from exc


# -- the writer's compaction process ---------------------------------------------------------------------------------


def compact_segments(paths: Iterable[Path], *, include_last: bool) -> CompactResult:
    """The segments of one process (the writer's) without a valid copy; the last one too with ``include_last``.
    Passes are repeated until one converts nothing: segments the writer closed meanwhile are taken too, so one
    compactor keeps up with a writer that rolls faster than it converts, and what was closed before the writer died
    (SIGKILL) is converted all the same."""
    from .segments import parse_segment_name, process_segments

    paths = list(paths)
    result = CompactResult()
    if not paths:
        return result
    run_dir = paths[0].parent
    if run_dir.is_symlink() or run_dir.parent.is_symlink():  # the writer made directories there: swapped in since
        result.errors.append(f"{run_dir}: its run or session directory is now a link, not followed")
        return result
    name = parse_segment_name(paths[0].name)
    meta = read_run_meta(run_dir)
    con = connect(memory_limit="256MB")
    try:
        while True:
            current = paths
            if name is not None:
                try:
                    found = process_segments(f for f in run_dir.iterdir() if f.is_file())
                except OSError:
                    found = {}
                current = found.get((name.agent, name.rank, name.pid), paths)
            before = (result.segments, len(result.errors))
            compact_process(con, run_dir, current, meta, run_dir / COLUMNAR_DIR, result, include_last=include_last,
                            prefix_parents=False)
            if not run_dir.is_dir():  # the run was deleted meanwhile (its store cleaned up): nothing is wrong
                result.errors.clear()
                break
            if (result.segments, len(result.errors)) == before or result.errors:
                break
    finally:
        con.close()
    return result


def _lower_priority() -> None:
    """The training job comes first: nice 10 (about a tenth of a core's share against one busy training process; the
    idle class would starve compaction for good on a node whose data loaders keep every core busy)."""
    try:
        os.nice(10)
    except OSError:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m telemetrain.store.compact")
    parser.add_argument("--segments", nargs="+", required=True, help="the segment files of one process, in order")
    parser.add_argument("--include-last", action="store_true", help="the last segment is closed: compact it too")
    args = parser.parse_args(argv)
    _lower_priority()
    with host_slot():
        result = compact_segments([Path(p) for p in args.segments], include_last=args.include_last)
    for error in result.errors:
        print(f"telemetrain compact: {printable(error)}", file=sys.stderr)  # run by hand, it is a terminal
    return 1 if result.errors else 0


def remove_copy(run_dir: Path) -> None:
    """Delete a run's columnar copy (it is derived: ``compact`` rebuilds it)."""
    shutil.rmtree(run_dir / COLUMNAR_DIR, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
