"""Lines longer than the format's cap (``layout.MAX_LINE_BYTES``): both readers skip one as a corrupt line without
reading it whole, and the writer never writes one."""

from __future__ import annotations

import importlib.util
import tracemalloc
from pathlib import Path

import pytest

from telemetrain import Telemetry, identity_from_env
from telemetrain.store import open_run
from telemetrain.store.layout import MAX_LINE_BYTES

HAS_DUCKDB = importlib.util.find_spec("duckdb") is not None
HUGE = 64 << 20  # well past the cap: a reader that held it whole would show it in its peak


def _metric(name: str, unit: str = "s") -> bytes:
    return (f'{{"v":1,"kind":"metric","mono_ns":5,"wall_ns":1,"group":"g","name":"{name}","value":1,'
            f'"unit":"{unit}"}}\n').encode()


def _damaged_run(root: Path) -> Path:
    """Rank 0: a good line, a valid metric line past the cap, a good line. Rank 1: a torn last line past the cap."""
    for rank in range(2):
        ident = identity_from_env({}, run_id="r", session_tag="s", perf_tag="p", rank=rank, world_size=2)
        t = Telemetry(ident, store=root)
        t.metric("loss", 1.0, step=0)
        assert t.close(timeout=30)
    run = root / "s" / "r"
    files = sorted(run.glob("rank-*.jsonl"))
    with open(files[0], "ab") as fh:
        fh.write(_metric("before"))
        head = _metric("huge", "x" * 16)
        fh.write(head[:-3])  # the unit's text goes on, past the cap
        for _ in range(HUGE >> 20):
            fh.write(b"x" * (1 << 20))
        fh.write(b'"}\n')
        fh.write(_metric("after"))
    with open(files[1], "ab") as fh:
        fh.write(_metric("kept"))
        fh.write(_metric("torn")[:-3] + b"y" * (MAX_LINE_BYTES + 10))
    return run


def test_python_reader_skips_an_overlong_line_without_holding_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    run = _damaged_run(tmp_path)
    tracemalloc.start()
    try:
        logs = open_run(run).processes
        names = [[r.name for r in log.records] for log in logs]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert names == [["loss", "before", "after"], ["loss", "kept"]]
    assert [(log.torn, log.corrupt) for log in logs] == [(0, 1), (1, 0)]
    assert peak < HUGE // 2  # the 64 MiB line was never read whole


@pytest.mark.skipif(not HAS_DUCKDB, reason="needs duckdb (the columnar extra)")
def test_sql_reader_and_compaction_skip_an_overlong_line_as_the_python_reader_does(tmp_path: Path) -> None:
    from telemetrain.store.compact import compact
    from telemetrain.store.engine import Engine

    run = _damaged_run(tmp_path)
    python = open_run(run)
    expected = {log.rank: (log.torn, log.corrupt) for log in python.processes}
    for compacted in (False, True):
        if compacted:
            result = compact(run)
            assert not result.errors
        tracemalloc.start()
        try:
            with Engine([run]) as engine:
                damage = {rank: (torn, corrupt) for rank, torn, corrupt in engine.rows(
                    "SELECT rank, torn, corrupt FROM damage")}
                names = engine.rows("SELECT rank, name FROM metrics ORDER BY rank, line")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert damage == expected == {0: (0, 1), 1: (1, 0)}, compacted
        assert names == [(0, "loss"), (0, "before"), (0, "after"), (1, "loss"), (1, "kept")], compacted
        assert peak < HUGE // 2, compacted


def test_a_string_attribute_past_the_cap_is_refused_at_the_call(tmp_path: Path) -> None:
    from telemetrain.arguments import MAX_ATTRIBUTE_CHARS

    t = Telemetry(identity_from_env({}, run_id="r", session_tag="s", perf_tag="p"), store=tmp_path)
    try:
        with pytest.raises(ValueError, match=r"attributes\['blob'\] is a str of"):
            t.event("e", {"ok": "x", "blob": "x" * (MAX_ATTRIBUTE_CHARS + 1)})
        t.event("fits", {"blob": "\x01" * MAX_ATTRIBUTE_CHARS})  # escaped 6 bytes a character: still one line
    finally:
        assert t.close(timeout=30)
    run = open_run(tmp_path / "s" / "r")
    assert [r.name for r in run.records("event")] == ["fits"] and run.corrupt == 0


def test_the_writer_replaces_a_record_whose_line_would_pass_the_cap(tmp_path: Path) -> None:
    """What the call cannot see (a nested value, many long values): the record becomes its ``unencodable``
    diagnostic, counted, and the records around it are kept; no line the readers would skip is written."""
    from telemetrain.arguments import MAX_ATTRIBUTE_CHARS

    t = Telemetry(identity_from_env({}, run_id="r", session_tag="s", perf_tag="p"), store=tmp_path)
    t.event("before")
    t.event("nested", {"deep": {"blob": "y" * (MAX_LINE_BYTES + 1)}})
    t.event("many", {f"k{i}": "z" * MAX_ATTRIBUTE_CHARS for i in range(MAX_LINE_BYTES // MAX_ATTRIBUTE_CHARS + 1)})
    t.event("after")
    assert t.close(timeout=30)
    run = open_run(tmp_path / "s" / "r")
    assert [r.name for r in run.records("event")] == ["before", "after"] and run.corrupt == 0
    lost = [r for r in run.records("diagnostic") if r.name == "unencodable"]
    assert len(lost) == 2 and all("over the format's" in r.message for r in lost)
    assert max(map(len, next(run.path.glob("rank-*.jsonl")).read_bytes().split(b"\n"))) <= MAX_LINE_BYTES


def _event_line(name: str) -> bytes:
    return (f'{{"v":1,"kind":"event","mono_ns":5,"wall_ns":1,"group":"watchdog","name":"{name}","severity":"warning",'
            '"attributes":{"reason":"stall"},"event_id":"","span_id":""}\n').encode()


def test_live_followers_drop_an_overlong_line_instead_of_holding_it(tmp_path: Path) -> None:
    """``telemetrain tail``'s follower and the launcher agent's: a line growing past the cap is not kept in memory
    until its newline comes; the lines after it are read."""
    from telemetrain.analysis.tail import FileFollower
    from telemetrain.distributed.stall_view import _EvidenceFollower

    ident = identity_from_env({}, run_id="r", session_tag="s", perf_tag="p", rank=3, world_size=4)
    t = Telemetry(ident, store=tmp_path)
    t.metric("loss", 1.0)
    assert t.close(timeout=30)
    [path] = (tmp_path / "s" / "r").glob("rank-*.jsonl")
    tail, agent = FileFollower(path, {}), _EvidenceFollower(path)
    with open(path, "ab") as fh:
        fh.write(_event_line("stall_evidence"))
        fh.write(_event_line("stall_evidence")[:-3])
    assert [r.name for r in tail.poll()] == ["loss", "stall_evidence"] and len(agent.poll()) == 1
    for _ in range(3):  # the line grows past the cap, poll after poll
        with open(path, "ab") as fh:
            fh.write(b"x" * (MAX_LINE_BYTES // 2))
        tail.poll()
        agent.poll()
        assert len(tail.pending) <= MAX_LINE_BYTES and len(agent.pending) <= MAX_LINE_BYTES
    with open(path, "ab") as fh:
        fh.write(b'"}\n' + _event_line("stall_evidence"))
    assert [r.name for r in tail.poll()] == ["stall_evidence"] and tail.corrupt == 1
    assert [(rank, a["reason"]) for rank, a in agent.poll()] == [(3, "stall")]


@pytest.mark.parametrize("engine", ["python", "duckdb"] if HAS_DUCKDB else ["python"])
def test_a_line_of_exactly_the_cap_is_read_one_byte_more_is_not(tmp_path: Path, engine: str) -> None:
    ident = identity_from_env({}, run_id="r", session_tag="s", perf_tag="p")
    t = Telemetry(ident, store=tmp_path)
    t.metric("loss", 1.0)
    assert t.close(timeout=30)
    run = tmp_path / "s" / "r"
    [path] = run.glob("rank-*.jsonl")
    with open(path, "ab") as fh:
        for name, size in (("at_cap", MAX_LINE_BYTES), ("past_cap", MAX_LINE_BYTES + 1)):
            short = _metric(name, "")
            fh.write(_metric(name, "u" * (size - len(short) + 1)))
        fh.write(_metric("last"))
    assert [len(line) for line in path.read_bytes().split(b"\n")[-4:-2]] == [MAX_LINE_BYTES, MAX_LINE_BYTES + 1]
    if engine == "python":
        log = open_run(run).processes[0]
        assert [r.name for r in log.records] == ["loss", "at_cap", "last"] and log.corrupt == 1
    else:  # from the JSONL (under the SQL readers' memory limit), then from the copy compaction made of it
        from telemetrain.store.compact import compact
        from telemetrain.store.engine import Engine

        for compacted in (False, True):
            if compacted:
                assert not compact(run).errors
            with Engine([run]) as sql:
                names = [n for (n,) in sql.rows("SELECT name FROM metrics ORDER BY line")]
                assert names == ["loss", "at_cap", "last"], compacted
                assert sql.rows("SELECT torn, corrupt FROM damage") == [(0, 1)], compacted
