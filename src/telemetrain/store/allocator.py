"""Hands the memory DuckDB's allocator has freed back to the system, between the readers' queries.

DuckDB's Linux wheels allocate through their own statically linked jemalloc. jemalloc keeps the pages a query freed
("dirty") for reuse and returns them only as they decay, or when DuckDB flushes after a long task. A reader runs
hundreds of queries in a row: the pages one query freed were still resident when the next began, and each query's
peak stood on them. On 64 ranks x 1M iterations a report held up to 60 MiB so between its queries, none of it in
use (jemalloc's own ``stats.resident`` against ``stats.allocated``: docs/scale.md).

``purge_freed()`` reads how much jemalloc holds freed and, past ``PURGE_PAST``, asks it to purge every arena's
dirty pages, through the ``mallctl`` interface the wheel exports (``duckdb_je_mallctl``; ``stats.resident``,
``stats.allocated`` and ``arena.<MALLCTL_ARENAS_ALL>.purge``, jemalloc's documented controls). It touches no memory
in use, costs microseconds when little is held, and does nothing on a build without jemalloc (only DuckDB's Linux
x86 wheels have it): there the system allocator is DuckDB's, and this module finds no symbol.

``flush_freed_in_queries(con)`` is the same within a query, by DuckDB's own setting: a bulk of memory freed at once
(a hash table, evicted buffers) goes back to the system at once.

``trim_freed()`` is the same for the C library's heap, where Python's larger objects live (the rows a query returned,
lists of them): glibc returns freed memory at the top of its heap only, and a reader's heap was left ~20 MiB free
but resident in the middle once those rows were gone (``show`` on 64 ranks x 1M iterations). Past ``TRIM_PAST`` free,
``malloc_trim(0)`` (glibc's, documented in malloc_trim(3)) hands back every free page of it. Elsewhere (musl, macOS)
it does nothing.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["FLUSH_FREED", "flush_freed_in_queries", "freed_held", "heap_free", "one_c_heap", "purge_freed",
           "trim_freed"]

_ARENAS_ALL = 4096  # jemalloc's MALLCTL_ARENAS_ALL: "every arena" in an arena.<i>.* name
_PURGE = f"arena.{_ARENAS_ALL}.purge".encode()
# the modules DuckDB's native code has lived in across releases (2.x: a top-level ``_duckdb``)
_NATIVE_MODULES = ("_duckdb", "duckdb.duckdb", "duckdb._duckdb")

# bytes held freed past which they are purged (jemalloc's own metadata is ~6 MiB of it): at 32 MiB the report on
# 64 x 1M started its curves' query on ~29 MiB of them (peak +6 MiB, no time measurably saved against 16)
PURGE_PAST = 16 << 20
_lock = threading.Lock()
# past this much freed at once within a query, DuckDB hands it back to the system: a reader's peak RSS on 64 ranks x 1M
# iterations fell ~18 MiB (goodput) and ~8 MiB (show) for ~15% more CPU (docs/scale.md). (DuckDB's default, 512 MB,
# never triggers under the readers' 128 MB limit.)
FLUSH_FREED = "8MB"
_mallctl: Callable[..., int] | None = None
_looked = False
TRIM_PAST = 8 << 20  # bytes free in the C library's heap past which its free pages are handed back
_M_ARENA_MAX = -8  # mallopt's parameter number (glibc's malloc.h)


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later): every field a ``size_t``."""

    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _find_glibc() -> tuple[Callable[[], _MallInfo2], Callable[[int], int], Callable[[int, int], int]] | None:
    try:
        libc = ctypes.CDLL(None)
        mallinfo2, malloc_trim, mallopt = libc.mallinfo2, libc.malloc_trim, libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc, one older than 2.33, or Windows (no CDLL(None))
        return None
    mallinfo2.argtypes, mallinfo2.restype = [], _MallInfo2
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallinfo2, malloc_trim, mallopt


_glibc = _find_glibc()


def _find_mallctl() -> Callable[..., int] | None:
    for name in _NATIVE_MODULES:
        path = getattr(sys.modules.get(name), "__file__", None)
        if not path:
            continue
        try:
            function = ctypes.CDLL(path).duckdb_je_mallctl
        except (OSError, AttributeError):
            continue
        function.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        function.restype = ctypes.c_int
        return function
    return None


def _read(mallctl: Callable[..., int], name: bytes) -> int | None:
    value = ctypes.c_size_t(0)
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if mallctl(name, ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return None
    return value.value


def _allocator() -> Callable[..., int] | None:
    global _mallctl, _looked
    if not _looked and "duckdb" in sys.modules:
        with _lock:
            if not _looked:
                _mallctl = _find_mallctl()
                _looked = True
    return _mallctl


def freed_held() -> int | None:
    """Bytes DuckDB's jemalloc holds resident but not allocated (its statistics refreshed first); None without
    such an allocator."""
    mallctl = _allocator()
    if mallctl is None:
        return None
    epoch = ctypes.c_uint64(1)
    size = ctypes.c_size_t(ctypes.sizeof(epoch))
    if mallctl(b"epoch", ctypes.byref(epoch), ctypes.byref(size), ctypes.byref(epoch), size) != 0:
        return None
    resident, allocated = _read(mallctl, b"stats.resident"), _read(mallctl, b"stats.allocated")
    if resident is None or allocated is None:
        return None
    return resident - allocated


def purge_freed(past: int | None = None) -> bool:
    """Return the pages DuckDB's jemalloc holds freed to the system, when they are more than ``past`` bytes (by
    default ``PURGE_PAST``); False where there is no such allocator, it refused, or it held less. Call it between
    queries, with DuckDB loaded.

    Not after every query: a purged page is faulted in again by the next query that needs memory, and purging after
    each of a report's ~600 queries cost 8 x 1M ~20% more time for 2-5 MiB of peak (docs/scale.md)."""
    mallctl = _allocator()
    if mallctl is None:
        return False
    held = freed_held()
    if held is not None and held <= (PURGE_PAST if past is None else past):
        return False
    return mallctl(_PURGE, None, None, None, 0) == 0


def flush_freed_in_queries(con: Any) -> None:
    """Set ``con``'s ``allocator_bulk_deallocation_flush_threshold`` to ``FLUSH_FREED``; a DuckDB without the setting
    (before 1.2) keeps its default behaviour."""
    import duckdb

    try:
        con.execute(f"SET allocator_bulk_deallocation_flush_threshold = '{FLUSH_FREED}'")
    except duckdb.Error:
        pass


def heap_free() -> int | None:
    """Bytes free in the C library's heap (glibc's ``mallinfo2().fordblks``, every arena); None elsewhere."""
    if _glibc is None:
        return None
    return int(_glibc[0]().fordblks)


def one_c_heap() -> bool:
    """Have the C library serve every thread of this process from one heap (glibc's ``mallopt(M_ARENA_MAX, 1)``,
    mallopt(3)); False where that is not glibc. A process's own choice, made before its threads start: the
    ``telemetrain`` command does it for its readers, whose DuckDB threads otherwise each fill a heap of their own
    (64 MiB reserved each) with what its native code allocates outside jemalloc, freed in pieces no trim returns
    (``show`` on 64 ranks x 1M: peak -5 to -7 MiB, no time measurable; docs/scale.md)."""
    if _glibc is None:
        return False
    return bool(_glibc[2](_M_ARENA_MAX, 1))


def trim_freed(past: int | None = None) -> bool:
    """Hand the C library heap's free pages back to the system (``malloc_trim(0)``) when more than ``past`` bytes
    (by default ``TRIM_PAST``) are free in it; False where that is not glibc, or less was free."""
    free = heap_free()
    if _glibc is None or free is None or free <= (TRIM_PAST if past is None else past):
        return False
    _glibc[1](0)
    return True
