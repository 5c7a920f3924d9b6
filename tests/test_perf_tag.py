"""One perf tag per run and the run's workload (issue 15, item 3): the training config's perf tag is the run's in its
records, process headers, run.json, the config event and compare; run.json records the workload, and compare
refuses clearly different workloads unless forced."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from conftest import run_dir_of
from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis import ConfigMismatch, PerfTagMismatch, compare_runs
from telemetrain.cli import main
from telemetrain.store import open_run
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

BASE_MS = 1_700_000_000_000


def simulate(root: Path, run_id: str, *, perf_tag: str = "gpt-tiny", gbs: Any = 32, world_size: int = 1,
             seq: int | None = None, flops: float | None = None, iterations: int = 40,
             identity_tag: str = "train_script", ms: float = 100.0) -> Path:
    """A finished one-rank run on an explicit timeline, its identity's perf tag being the script's name (what
    ``identity_from_env`` gives) and the config's ``perf_tag``."""
    identity = identity_from_env({}, run_id=run_id, session_tag=run_id, perf_tag=identity_tag, world_size=world_size)
    t = Telemetry(identity, store=root)
    config = TrainingTelemetryConfig(global_batch_size_or_fn=gbs, perf_tag_or_fn=perf_tag, seq_length_or_fn=seq,
                                     flops_per_sample_or_fn=flops, log_every_n_train_iterations=5)
    r = TrainingRecorder(config, telemetry=t)
    now = float(BASE_MS)
    r.on_app_start(now)
    r.on_train_start(0, start_time_msec=now)
    for i in range(iterations):
        r.on_training_single_iteration_start(now)
        now += ms * (1 + 0.01 * (i % 3))
        r.on_training_single_iteration_end(now)
    r.on_train_end(now)
    r.on_app_end(now + 1)
    assert t.close()
    return root / run_id / run_id


def headers(run_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for f in sorted(run_dir.glob("rank-*.jsonl")) for line in f.read_text().splitlines()]
    return [line for line in lines if line.get("kind") == "process"]


def cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_configs_perf_tag_is_the_runs_everywhere(tmp_path: Path) -> None:
    run_dir = simulate(tmp_path, "r1", perf_tag="gpt-tiny")
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["perf_tag"] == "gpt-tiny"
    assert [h["identity"]["perf_tag"] for h in headers(run_dir)] == ["gpt-tiny"]  # one header: set before any record
    run = open_run(run_dir)
    assert run.perf_tag == "gpt-tiny"
    assert {r.identity.perf_tag for r in run.records()} == {"gpt-tiny"}
    (config,) = [r for r in run.records("event") if r.name == "update_training_telemetry_config"]
    assert config.attributes["perf_tag"] == "gpt-tiny"


def test_compare_finds_the_baseline_by_the_configs_tag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = simulate(tmp_path, "a-base", identity_tag="old_script")
    cand = simulate(tmp_path, "b-cand", identity_tag="new_script")  # another script name, the same config tag
    simulate(tmp_path, "c-other", perf_tag="llama", identity_tag="new_script")
    code, _, err = cli("compare", str(cand), "--root", str(tmp_path), capsys=capsys)
    assert code == 0, err
    assert f"baseline: {base}" in err and "perf_tag 'gpt-tiny'" in err


def test_a_late_config_updates_run_json_and_later_records(tmp_path: Path) -> None:
    t = Telemetry(identity_from_env({}, run_id="late", session_tag="late", perf_tag="script"), store=tmp_path)
    t.metric("early", 1)
    assert t.flush()
    run_dir = t.run_dir
    assert run_dir is not None and json.loads((run_dir / "run.json").read_text())["perf_tag"] == "script"
    r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, perf_tag_or_fn=["bert", "large"]),
                         telemetry=t)
    r.on_app_start()
    r.on_app_end()
    assert t.close()
    assert json.loads((run_dir / "run.json").read_text())["perf_tag"] == "bert+large"  # a list joined
    assert [h["identity"]["perf_tag"] for h in headers(run_dir)] == ["script", "bert+large"]
    run = open_run(run_dir)
    assert run.perf_tag == "bert+large"
    assert [r.identity.perf_tag for r in run.records() if r.kind in ("metric", "span_start")] == [
        "script", "bert+large"]  # the metric before the config, the application after


def test_the_configs_tag_wins_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``telemetrain launch`` sets $TELEMETRAIN_PERF_TAG to the script's name for every rank: the config says more."""
    monkeypatch.setenv("TELEMETRAIN_PERF_TAG", "train_script")
    t = Telemetry(identity_from_env(run_id="env", session_tag="env"), store=tmp_path, default=False)
    assert t.identity.perf_tag == "train_script"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=8, perf_tag_or_fn="gpt-tiny"),
                             telemetry=t)
    r.on_app_start()
    r.on_app_end()
    assert t.close()
    assert t.identity.perf_tag == "gpt-tiny" and open_run(run_dir_of(t)).perf_tag == "gpt-tiny"


def test_run_json_records_the_workload(tmp_path: Path) -> None:
    sizes = {"gbs": 0}
    run_dir = simulate(tmp_path, "w", gbs=lambda: sizes["gbs"] or 64, world_size=2, seq=128, flops=6e6)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["workload"] == {"flops_per_sample": 6e6, "world_size": 2, "global_batch_size": 64,
                                "seq_length": 128}
    assert re.fullmatch(r"[0-9a-f]{12}", meta["fingerprint"])
    again = json.loads((simulate(tmp_path, "w2", gbs=64, world_size=2, seq=128, flops=6e6) / "run.json").read_text())
    assert again["fingerprint"] == meta["fingerprint"]
    other = json.loads((simulate(tmp_path, "w3", gbs=32, world_size=2, seq=128, flops=6e6) / "run.json").read_text())
    assert other["fingerprint"] != meta["fingerprint"]


def test_compare_refuses_different_workloads_unless_forced(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    base = simulate(tmp_path, "small", gbs=32, flops=1e6)
    big = simulate(tmp_path, "big", gbs=64, flops=4e6)  # the same perf tag: a different model and batch
    code, out, err = cli("compare", str(big), "--baseline", str(base), capsys=capsys)
    assert code == 2 and out == ""
    message = err.strip()
    assert message == ("telemetrain: error: the workload differs from the baseline small (big: flops_per_sample 4e+06 "
                       "vs 1e+06, global_batch_size 64 vs 32, candidate vs baseline): these are different workloads; "
                       "pass --force to compare anyway")
    with pytest.raises(ConfigMismatch, match="pass force=True to compare anyway"):
        compare_runs(big, base)
    code, out, err = cli("compare", str(big), "--baseline", str(base), "--force", capsys=capsys)
    assert code == 0, err
    assert "the workload differs from the baseline small" in out and "compared anyway (forced)" in out
    same = simulate(tmp_path, "same", gbs=32, flops=1e6)
    assert not compare_runs(same, base).forced


def test_the_perf_tag_refusal_names_force_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = simulate(tmp_path, "a", perf_tag="gpt-tiny")
    other = simulate(tmp_path, "b", perf_tag="llama")
    code, _, err = cli("compare", str(other), "--baseline", str(base), capsys=capsys)
    assert code == 2
    assert err.strip() == ("telemetrain: error: perf_tag differs from the baseline a ('gpt-tiny'): b ('llama'); these "
                           "are different workloads; pass --force to compare anyway")
    with pytest.raises(PerfTagMismatch) as caught:
        compare_runs(other, base)
    assert str(caught.value).endswith("these are different workloads; pass force=True to compare anyway")


def test_run_json_takes_the_workload_while_the_writer_reopens_its_file(tmp_path: Path) -> None:
    """The writer thread clears the sink's identity while it opens a new file (a new identity: the config's perf
    tag). The training thread's ``set_run_meta`` (on_train_start's workload) at that moment read it half-way -- an
    ``AttributeError`` on None, recorded as an ``error`` event (seen in the planted crash scenario) -- or skipped the
    update. It now writes with the identity run.json was written with."""
    t = Telemetry(identity_from_env({}, run_id="reopen", session_tag="reopen", perf_tag="script"), store=tmp_path)
    t.metric("early", 1)
    assert t.flush()
    sink, run_dir = t.store, t.run_dir
    assert sink is not None and run_dir is not None
    opened, sink._identity = sink._identity, None  # the writer is inside _open
    try:
        sink.set_run_meta(workload={"world_size": 1}, fingerprint="abc")
    finally:
        sink._identity = opened
    assert t.close()
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["workload"], meta["fingerprint"], meta["perf_tag"]) == ({"world_size": 1}, "abc", "script")
