"""``store.allocator``: what DuckDB's jemalloc and the C heap freed goes back to the system between the readers'
queries; and ``Engine.one_thread`` and ``Engine.temp_table``, the engine's other memory controls."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

duckdb = pytest.importorskip("duckdb")

from telemetrain.store import allocator  # noqa: E402
from telemetrain.store.engine import Engine  # noqa: E402

needs_jemalloc = pytest.mark.skipif(allocator.freed_held() is None,
                                    reason="this DuckDB build does not allocate through jemalloc (only Linux x86 "
                                           "wheels do): there is nothing to purge")


def _free_a_hash_table(con: DuckDBPyConnection) -> None:
    # a grouped aggregate over 2M distinct keys: its hash table (tens of MB) is freed when the query ends
    con.execute("SELECT count(*) FROM (SELECT i % 2000003 AS k, sum(i) FROM range(4000000) t(i) GROUP BY k)"
                ).fetchall()


@needs_jemalloc
def test_a_purge_hands_back_what_a_query_freed() -> None:
    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.execute("SET allocator_bulk_deallocation_flush_threshold = '16GB'")  # (nothing flushed behind our back)
    _free_a_hash_table(con)
    held = allocator.freed_held()
    assert held is not None
    assert allocator.purge_freed(past=held + 1) is False  # less held than asked for: nothing purged
    assert (allocator.freed_held() or 0) > held - (2 << 20)  # (jemalloc may decay a page or two meanwhile)
    assert allocator.purge_freed(past=0) is True
    after = allocator.freed_held()
    assert after is not None and after < held
    assert held - after > 4 << 20, (held, after)  # megabytes of the hash table's pages, not a rounding
    con.close()


@needs_jemalloc
def test_the_engine_purges_before_each_of_its_queries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "PURGE_PAST", 1 << 20)
    engine = Engine([])
    try:
        engine.execute("SET allocator_bulk_deallocation_flush_threshold = '16GB'")
        _free_a_hash_table(engine.con)
        held = allocator.freed_held()
        assert held is not None
        assert engine.scalar("SELECT 1") == 1
        after = allocator.freed_held()
        assert after is not None and held - after > 4 << 20, (held, after)
    finally:
        engine.close()


@needs_jemalloc
def test_release_freed_hands_back_what_the_queries_kept_for_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    # held under the engine's threshold, a query's freed pages stay for the next query; when the queries are done
    # for a while (the findings engine's work in Python follows), release_freed hands them all back
    engine = Engine([])
    try:
        engine.execute("SET allocator_bulk_deallocation_flush_threshold = '16GB'")
        _free_a_hash_table(engine.con)
        held = allocator.freed_held()
        assert held is not None and held > 4 << 20, held
        monkeypatch.setattr(allocator, "PURGE_PAST", held + (64 << 20))
        assert engine.scalar("SELECT 1") == 1
        kept = allocator.freed_held()
        assert kept is not None and kept > held - (2 << 20), (held, kept)  # (a page or two may decay meanwhile)
        engine.release_freed()
        after = allocator.freed_held()
        assert after is not None and kept - after > 4 << 20, (kept, after)
    finally:
        engine.close()


def test_without_duckdb_loaded_nothing_is_looked_up_or_purged() -> None:
    # a fresh interpreter that never imported duckdb: no symbol is searched for, nothing is cached as missing
    code = textwrap.dedent("""
        import sys
        from telemetrain.store import allocator
        assert allocator.purge_freed() is False
        assert allocator.freed_held() is None
        assert allocator._looked is False and "duckdb" not in sys.modules
        import duckdb
        duckdb.connect().execute("SELECT 1").fetchall()
        print(allocator.freed_held() is not None, allocator._looked)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "True"  # looked up once duckdb was loaded (found or not, per the build)


needs_glibc = pytest.mark.skipif(allocator.heap_free() is None,
                                 reason="the C library is not glibc 2.33+ (no mallinfo2/malloc_trim): nothing to trim")


@needs_glibc
def test_a_trim_hands_back_the_c_heaps_free_pages() -> None:
    # in a fresh interpreter: 2,000 blocks of 16 KiB (below glibc's mmap threshold: on its heap), every other one
    # freed; the heap cannot shrink from its top (the last block is held), so ~16 MiB stay free and resident
    code = textwrap.dedent("""
        import ctypes
        from telemetrain.store import allocator
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        def rss():
            with open("/proc/self/status") as fh:
                return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
        blocks = [libc.malloc(16384) for _ in range(2000)]
        for b in blocks:
            ctypes.memset(b, 1, 16384)
        for b in blocks[::2]:
            libc.free(b)
        free, before = allocator.heap_free(), rss()
        print(free, allocator.trim_freed(past=free + 1), allocator.trim_freed(past=1 << 20), before - rss())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    free, too_little, trimmed, handed_back_kib = int(out[0]), out[1], out[2], int(out[3])
    assert free >= 15 << 20, free  # the freed blocks are counted free
    assert too_little == "False"  # less free than asked for: nothing trimmed
    assert trimmed == "True"
    assert handed_back_kib > 8 << 10, handed_back_kib  # megabytes of resident pages went back, not a rounding


@needs_glibc
def test_the_engine_trims_before_each_of_its_queries(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int | None] = []

    def trim_freed(past: int | None = None) -> bool:
        calls.append(past)
        return False

    monkeypatch.setattr("telemetrain.store.engine.trim_freed", trim_freed)
    engine = Engine([])
    try:
        assert engine.scalar("SELECT 1") == 1
        engine.rows("SELECT 2")
        assert len(calls) >= 2
    finally:
        engine.close()


def test_one_thread_runs_the_queries_within_on_one_thread_and_restores_the_count() -> None:
    engine = Engine([], threads=2)
    try:
        def threads() -> int:
            return int(engine.scalar("SELECT current_setting('threads')"))
        assert threads() == 2
        with engine.one_thread():
            assert threads() == 1
            assert engine.scalar("SELECT count(*) FROM range(100000)") == 100000
        assert threads() == 2
        with pytest.raises(duckdb.Error), engine.one_thread():
            engine.execute("SELECT * FROM no_such_table")
        assert threads() == 2  # restored after a failed query too
    finally:
        engine.close()
    single = Engine([], threads=1)
    try:
        with single.one_thread():
            assert int(single.scalar("SELECT current_setting('threads')")) == 1
    finally:
        single.close()


def test_temp_table_replaces_a_table_by_a_new_select() -> None:
    engine = Engine([])
    try:
        engine.temp_table("t", "SELECT range AS i FROM range(3)")
        assert engine.rows("SELECT i FROM t ORDER BY i") == [(0,), (1,), (2,)]
        engine.temp_table("t", "SELECT 'x' AS s")  # another shape: dropped, not inserted into
        assert engine.rows("SELECT * FROM t") == [("x",)]
    finally:
        engine.close()


# in a fresh interpreter: SETUP runs (argv[1]), then 6 threads each malloc a block and wait; glibc gives each thread
# that allocates a heap of its own (a 64 MiB reservation in /proc/self/maps) unless the arenas are limited to one
_THREAD_HEAPS = textwrap.dedent("""
    import ctypes, sys, threading
    from telemetrain import cli
    from telemetrain.store import allocator
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    def heaps():
        with open("/proc/self/maps") as fh:  # a thread's heap: 64 MiB, aligned, read-write then reserved
            spans = [[int(x, 16) for x in line.split()[0].split("-")] for line in fh]
        return sum(1 for lo, hi in spans if lo % (64 << 20) == 0 and hi - lo <= 64 << 20 and hi - lo >= 132 << 10)
    before = heaps()
    result = eval(sys.argv[1])
    go, done = threading.Event(), threading.Barrier(7)
    def work():
        libc.malloc(200)
        done.wait()
        go.wait()
    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    done.wait()
    print(result, heaps() - before)
    go.set()
""")


def _thread_heaps(setup: str, *argv: str) -> list[str]:
    """(what SETUP returned, the heaps the threads started after it added), from a fresh interpreter whose
    ``sys.argv[1:]`` is ARGV."""
    code = _THREAD_HEAPS.replace("eval(sys.argv[1])", setup)
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True
                          ).stdout.split()


@needs_glibc
def test_one_c_heap_serves_new_threads_from_the_one_heap() -> None:
    assert _thread_heaps("allocator.one_c_heap()") == ["True", "0"]  # no thread got a heap of its own
    default = _thread_heaps("None")
    assert default[0] == "None" and int(default[1]) >= 3, default  # (the contrast: glibc's default)


@needs_glibc
def test_the_command_limits_the_c_heaps_for_its_readers_only(tmp_path: Path) -> None:
    # the real command: a reader (show, given no run: exit status 2) leaves one heap; a training command (demo, a
    # usage error: 2 too) leaves glibc's default, whose threads are the user's
    missing = str(tmp_path / "no-run")
    assert _thread_heaps("cli.console()", "show", missing) == ["2", "0"]
    assert _thread_heaps("cli.console()", "goodput", missing)[1] == "0"
    demo = _thread_heaps("cli.console()", "demo", "--steps", "0")
    assert demo[0] == "2" and int(demo[1]) >= 3, demo


def test_the_views_read_their_file_lists_from_variables(tmp_path: Path) -> None:
    # the compacted files' list is held once, in a variable per table, not written into each view's text
    from telemetrain import Telemetry, identity_from_env
    from telemetrain.store.compact import compact

    ident = identity_from_env({}, run_id="vars", session_tag="s", perf_tag="p", rank=0, world_size=1)
    t = Telemetry(ident, store=tmp_path)
    for i in range(300):
        t.metric("loss", float(i), step=i)
    assert t.close(30)
    run = tmp_path / "s" / "vars"
    compact(run)
    with Engine([run]) as engine:  # (a small segment: compacted in a batch, its files shared)
        assert engine.tail_segments == 0 and engine.shared["metrics"] and not engine.parquet["metrics"]
        assert engine.scalar("SELECT getvariable('files_metrics_shared')") == list(engine.shared["metrics"])
        view = engine.scalar("SELECT sql FROM duckdb_views() WHERE view_name = 'metrics'")
        assert "getvariable('files_metrics_shared')" in view and ".parquet" not in view
        assert engine.rows("SELECT count(*), sum(step) FROM metrics") == [(300, sum(range(300)))]
    from telemetrain.store import compact_batch

    compact_batch.SMALL_SEGMENT_BYTES, small = -1, compact_batch.SMALL_SEGMENT_BYTES  # a segment's own files
    try:
        compact(run, force=True)
    finally:
        compact_batch.SMALL_SEGMENT_BYTES = small
    with Engine([run]) as engine:
        assert engine.tail_segments == 0 and engine.parquet["metrics"]
        assert engine.scalar("SELECT getvariable('files_metrics')") == engine.parquet["metrics"]
        view = engine.scalar("SELECT sql FROM duckdb_views() WHERE view_name = 'metrics'")
        assert "getvariable('files_metrics')" in view and ".parquet" not in view
        assert engine.rows("SELECT count(*), sum(step) FROM metrics") == [(300, sum(range(300)))]


def test_rank_groups_bound_each_count_of_a_group() -> None:
    from telemetrain.store.rank_groups import rank_groups

    assert rank_groups([(0, 5), (1, 5), (2, 20), (3, 1)], 10) == ["(0, 1)", "(2)", "(3)"]  # a rank past it: alone
    # the curves' groups: at most 16 series and 4 Mi steps together (two 1M-step series a rank: two ranks a group;
    # eight ranks of 100k steps: one group)
    big = [(r, 2, 2_000_000) for r in range(4)]
    assert rank_groups(big, 16, 1 << 22) == ["(0, 1)", "(2, 3)"]
    assert rank_groups([(r, 2, 200_000) for r in range(9)], 16, 1 << 22) == ["(0, 1, 2, 3, 4, 5, 6, 7)", "(8)"]
    assert rank_groups([(0, 3, None), (1, 20, 0)], 16, 1 << 22) == ["(0)", "(1)"]  # (no steps: a wall-clock series)
