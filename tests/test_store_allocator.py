"""``store.allocator``: what DuckDB's jemalloc freed goes back to the system between the readers' queries."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

duckdb = pytest.importorskip("duckdb")

from telemetrain.store import allocator  # noqa: E402
from telemetrain.store.engine import Engine  # noqa: E402

needs_jemalloc = pytest.mark.skipif(allocator.freed_held() is None,
                                    reason="this DuckDB build does not allocate through jemalloc (only Linux x86 "
                                           "wheels do): there is nothing to purge")


def _free_a_hash_table(con: object) -> None:
    # a grouped aggregate over 2M distinct keys: its hash table (tens of MB) is freed when the query ends
    con.execute("SELECT count(*) FROM (SELECT i % 2000003 AS k, sum(i) FROM range(4000000) t(i) GROUP BY k)"
                ).fetchall()  # type: ignore[attr-defined]


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
