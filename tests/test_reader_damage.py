"""The readers on damaged runs and many ranks, on the pure-Python path and (where DuckDB is installed) the SQL path:
issue 15 items 9 and 13. Needs nothing beyond the core: the CI's core-only environment runs this module."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest

from telemetrain import Telemetry, identity_from_env
from telemetrain.cli import main as cli_main
from telemetrain.spans import Tracer
from telemetrain.store import open_run

ENGINES = ("python", "duckdb") if importlib.util.find_spec("duckdb") is not None else ("python",)


def _write_run(root: Path, *, ranks: int = 2, n: int = 200, run_id: str = "r1", session: str = "s",
               host: str | None = None) -> Path:
    for rank in range(ranks):
        ident = identity_from_env({}, run_id=run_id, session_tag=session, perf_tag="p", rank=rank, world_size=ranks)
        if host is not None:
            ident = ident.replace(host=f"{host}-{rank}")
        t = Telemetry(ident, store=root)
        tracer = Tracer(t)
        for i in range(n):
            t.metric("loss", 1.0 / (i + 1), step=i)
        t.metric("nan", math.nan)
        t.metric("flag", True)
        t.metric("count", 7)
        t.event("hello", {"a": 1, "x": math.inf, "s": "NaN"}, severity="warning")
        with tracer.span("step", group="training", k="v"):
            pass
        assert t.close(timeout=30)
    return root / session / run_id


# Lines a damaged or hostile file may hold, each either loaded or skipped the same way by both readers.
DAMAGED = [
    '{"v":1,"kind":"metric","mono_ns":"5","wall_ns":1,"group":"g","name":"n","value":1}',  # int as a string
    '{"v":1,"kind":"metric","mono_ns":5,"wall_ns":1' + "0" * 400 + ',"group":"g","name":"n","value":1}',  # huge
    '{"v":1,"kind":"metric","mono_ns":5,"wall_ns":1,"group":"g","name":"n","value":"x"}',
    '{"v":1,"kind":"metric","mono_ns":5,"wall_ns":1,"group":"g","name":"n","value":1,"unit":null}',
    '{"v":1,"kind":"metric","mono_ns":5,"wall_ns":1,"group":"g","name":"n","value":1,"step":1.5}',
    '{"v":1,"kind":"metric","mono_ns":5,"wall_ns":1,"group":"g","name":"big","value":123456789012345678901234567890}',
    '{"v":1,"kind":"metric","mono_ns":5,"wall_ns":1,"group":"g","name":"ok","value":"-Infinity","step":3}',
    '{"v":3,"kind":"metric","mono_ns":5,"wall_ns":1,"group":"g","name":"n","value":1}',  # a version from the future
    '{"v":1.0,"kind":"metric","mono_ns":5,"wall_ns":1,"group":"g","name":"n","value":1}',
    '{"v":1,"kind":"span_end","mono_ns":5,"wall_ns":1,"group":"training","name":"x","span_id":"a",'
    '"duration_ns":"x","status":"ok","attributes":{},"error":""}',
    '{"v":1,"kind":"span_end","mono_ns":5,"wall_ns":1,"group":"training","name":"ok2","span_id":"a",'
    '"duration_ns":3,"status":"ok","attributes":null,"error":""}',
    '{"v":1,"kind":"event","mono_ns":5,"wall_ns":1,"group":"g","name":"n","severity":"info","attributes":[1],'
    '"event_id":"","span_id":""}',
    '{"v":1,"kind":"event","mono_ns":5,"wall_ns":1,"group":"g","name":"deep","severity":"info","attributes":'
    + '{"a":' * 50 + "1" + "}" * 50 + ',"event_id":"","span_id":""}',
    '{"v":1,"kind":"event","mono_ns":5,"wall_ns":1,"group":"g","name":"deeper","severity":"info","attributes":'
    + '{"a":' * 5000 + "1" + "}" * 5000 + ',"event_id":"","span_id":""}',  # deeper than Python decodes: kept, empty
    '{"v":1,"kind":"stat","mono_ns":5,"wall_ns":1,"group":"g","name":"n","start_mono_ns":1,"count":2,'
    '"values":{"mean":"bad"},"unit":"s"}',
    '{"v":1,"kind":"stat","mono_ns":5,"wall_ns":1,"group":"g","name":"st","start_mono_ns":1,"count":2,'
    '"values":{"mean":1.5,"nan_count":1,"max":"NaN"},"unit":"s"}',
    '{"v":1,"kind":"diagnostic","mono_ns":5,"wall_ns":1,"group":"g","name":"dropped","sink":"s","count":"3",'
    '"message":""}',
    '{"v":1,"kind":"process","mono_ns":1,"wall_ns":2,"identity":"abc"}',  # a header whose identity is a string
    '{"v":1,"kind":"unknown","mono_ns":5,"wall_ns":1,"group":"g","name":"n"}',
    '[1, 2, 3]',
    "not json",
    '{"v":1,"kind":"metric","mono_ns":5,"wall_ns":1,"group":"g","name":"n","value":NaN}',
    "   ",
]


def test_damaged_runs_do_not_crash_any_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 15 item 13: damaged lines are skipped and counted; a damaged run.json is read for what is usable."""
    run = _write_run(tmp_path, ranks=1, n=5)
    f = next(run.glob("rank-*.jsonl"))
    good = f.read_text()
    metas = ["[" * 100_000 + "]" * 100_000, json.dumps({"run_id": "a/b", "world_size": [1]}),
             json.dumps({"run_id": "r1", "world_size": "x", "session_tag": 5}), "{"]
    for engine in ENGINES:
        os.environ["TELEMETRAIN_ENGINE"] = engine
        try:
            for meta in metas:
                f.write_text('{"v":1,"kind":"process","mono_ns":1,"wall_ns":2,"identity":"abc"}\n' + good
                             + "\n".join(DAMAGED) + "\n")
                (run / "run.json").write_text(meta)
                for argv in (["show", str(run)], ["report", str(run), "-o", str(tmp_path / "r.html")],
                             ["goodput", str(run)], ["trace", str(run), "-o", str(tmp_path / "t.json")],
                             ["compare", str(run), "--baseline", str(run)], ["show", "--list", str(tmp_path)]):
                    code = cli_main(argv)
                    assert code in (0, 2), (engine, meta[:20], argv)
        finally:
            del os.environ["TELEMETRAIN_ENGINE"]
    assert "Traceback" not in capsys.readouterr().err


def test_records_sharing_timestamps_merge_over_64_ranks(tmp_path: Path) -> None:
    """Issue 15 item 9: iter_records over many ranks whose records tie on every key but the record."""
    run = tmp_path / "s" / "r"
    run.mkdir(parents=True)
    for rank in range(64):
        ident = identity_from_env({}, run_id="r", session_tag="s", perf_tag="p", rank=rank, world_size=64)
        header = {"v": 1, "kind": "process", "mono_ns": 1, "wall_ns": 1, "identity": ident.replace(pid=1).as_dict()}
        lines = [json.dumps(header)] + [json.dumps({"v": 1, "kind": "metric", "mono_ns": 5, "wall_ns": 7,
                                                    "group": "g", "name": "m", "value": i}) for i in range(3)]
        (run / f"rank-{rank}.1.jsonl").write_text("\n".join(lines) + "\n")
    records = open_run(run).records()
    assert len(records) == 64 * 3
    assert [r.identity.rank for r in records[:6]] == [0, 0, 0, 1, 1, 1]
