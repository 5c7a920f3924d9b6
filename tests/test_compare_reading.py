"""What compare reads of a run, on both paths: only the curves its quality comparison can use (the time origin of
every user series kept), the goodput by the same engine, the per-rank series a group of ranks at a time."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import cast

import pytest

pytest.importorskip("duckdb")

from telemetrain import Telemetry, identity_from_env
from telemetrain.analysis import samples_sql
from telemetrain.analysis.compare_quality import compare_quality, quality_series
from telemetrain.analysis.findings.noise import Contention
from telemetrain.analysis.samples import read_samples
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig
from telemetrain.training.goodput import goodput


def _run(root: Path, tag: str) -> Path:
    for rank in (0, 1):
        t = Telemetry(identity_from_env({}, run_id=tag, session_tag=tag, rank=rank, world_size=2), store=root)
        t.metric("warmup", 1.0, "train")  # the first user point, of a series compare does not draw, without a step
        recorder = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=5),
                                    telemetry=t)
        recorder.on_app_start()
        recorder.on_train_start(0)
        for step in range(40):
            recorder.on_training_single_iteration_start()
            t.metric("lr", 0.1 / (1 + step), "train", step=step)
            t.log({"loss": 3.0 / (1 + step) + 0.01 * rank}, step=step, group="train")
            if step % 10 == 9:
                t.metric("val_accuracy", step / 40, "val", step=step)
            recorder.on_training_single_iteration_end()
        recorder.on_train_end()
        recorder.on_app_end()
        assert t.close()
    return root / tag / tag


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("store"), "reading")


@pytest.mark.parametrize("engine", ["python", "duckdb"])
def test_only_the_quality_curves_are_fed_and_the_answers_are_the_same(run_dir: Path, engine: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if engine == "python":
        monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    full = read_samples(run_dir)
    some = read_samples(run_dir, curves=quality_series())
    assert full.curves.names() == [("train", "loss"), ("train", "lr"), ("train", "warmup"), ("val", "val_accuracy")]
    assert some.curves.names() == [("train", "loss"), ("val", "val_accuracy")]
    # the time origin is every user series' first point (here the warm-up's, fed in neither)
    assert some.curves.first_wall_ns == full.curves.first_wall_ns
    for key in some.curves.names():
        assert some.curves.curve(*key) == full.curves.curve(*key)
    assert compare_quality(some, some) == compare_quality(full, full) is not None
    by_name = read_samples(run_dir, curves=quality_series("lr"))  # --loss lr: that series, and the evaluations
    assert by_name.curves.names() == [("train", "lr"), ("val", "val_accuracy")]
    none = read_samples(run_dir, curves=lambda name: False)  # a run of the history: no curve
    assert none.curves.names() == [] and none.curves.first_wall_ns == full.curves.first_wall_ns
    assert dataclasses.replace(none, curves=full.curves, path=full.path) == full  # and nothing else differs


@pytest.mark.parametrize("engine", ["python", "duckdb"])
def test_goodput_read_with_the_samples_is_the_runs_own(run_dir: Path, engine: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if engine == "python":
        monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    alone = goodput(run_dir).goodput
    assert read_samples(run_dir, goodput=True).goodput == alone is not None
    assert read_samples(run_dir).goodput is None


def test_per_rank_series_a_rank_at_a_time(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    together = read_samples(run_dir)
    monkeypatch.setattr(samples_sql, "WINDOWS_AT_ONCE", 1)  # every rank its own query
    apart = read_samples(run_dir)
    assert together.precomputed is not None and apart.precomputed is not None
    assert {k: list(v) for k, v in apart.precomputed.items()} == {k: list(v) for k, v in together.precomputed.items()}
    assert len(together.series("iteration_time", 1)) == 7  # 8 reports less the warm-up's


def _windows_run(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Five ranks writing reports by hand, each rank's log cut into several segments: ranks 0 and 1 with host phase
    times, rank 2 with device ones, every window with its CPU wait; two training loops per rank (each loop's first
    report is its warm-up); values of many magnitudes (10 us to 50 s, throughputs to 1e7) whose sums round; ranks 3
    and 4 write only one report (a warm-up: no window)."""
    from telemetrain.sinks import jsonl

    monkeypatch.setattr(jsonl, "SEGMENT_BYTES", 4_000)
    for rank in range(5):
        t = Telemetry(identity_from_env({}, run_id="w", session_tag="w", rank=rank, world_size=5), store=root)
        for n in range(1 if rank >= 3 else 60):
            step = 10 * n + 9
            scale = (1e-5, 0.1, 50.0)[(n + rank) % 3]
            attributes: dict[str, object] = {
                "current_iteration": step, "window_iterations": 10, "train_iterations_start": 0 if n < 30 else 300,
                "avg_iteration_time_sec": scale * (1 + rank / 3 + (n % 7) / 11), "samples_per_second": 1e7 / (n + 3),
                "cpu_time_sec": 0.9 + n / 97, "cpu_wait_sec": 0.01 * (n % 5 + rank)}
            if rank < 2:
                attributes |= {"avg_forward_time_sec": scale / 3.1, "avg_backward_time_sec": scale / 7.3,
                               "avg_dataloader_time_sec": scale / (n + 1)}
            elif rank == 2:
                attributes |= {"avg_forward_device_time_sec": scale / 2.9, "avg_optimizer_device_time_sec": 1e-6}
            t.event("training_metrics_update", attributes, group="training")
        assert t.close()
    run = root / "w" / "w"
    assert len(list(run.glob("rank-0.*.jsonl"))) >= 2  # more than one segment
    return run


def test_windows_by_groups_of_ranks_are_the_whole_and_the_python_paths(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from telemetrain.analysis import samples_sums
    from telemetrain.analysis.samples import OTHER, PHASES
    from telemetrain.store.compact import compact

    run = _windows_run(tmp_path, monkeypatch)
    assert not compact(run).errors
    monkeypatch.setattr(samples_sql, "MAX_RANK_PHASES", 3)  # 5 ranks report, 3 have windows: phases per rank
    whole = read_samples(run)
    monkeypatch.setattr(samples_sql, "WINDOWS_AT_ONCE", 1)  # every rank its own group
    apart = read_samples(run)
    monkeypatch.setattr(samples_sums, "_BITS", 30)  # no scale fits: the run-level series from every window at once
    every = read_samples(run)
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    python = read_samples(run)
    assert python.windows and whole.precomputed is not None
    assert whole.waits_known and whole.phase_source == "mixed" and whole.ranks == [0, 1, 2]
    metrics = ("iteration_time", "samples_per_second", *PHASES)
    keys = [(m, None, bf) for m in (*metrics, OTHER) for bf in (False, True)] + \
        [(m, r, bf) for m in metrics for r in (0, 1, 2) for bf in (False, True)]
    assert set(whole.precomputed) == {k for k in keys if python.series(k[0], k[1], busy_free=k[2])}
    for metric, rank, busy_free in keys:
        expected = python.series(metric, rank, busy_free=busy_free)  # statistics.fmean: exact sums
        for sql in (whole, apart, every):
            assert sql.series(metric, rank, busy_free=busy_free) == expected, (metric, rank, busy_free)
    for sql in (apart, every):
        assert (sql.ranks, sql.window_count, sql.skipped_windows, sql.wait_fraction(), sql.phase_source) == \
            (whole.ranks, whole.window_count, whole.skipped_windows, whole.wait_fraction(), whole.phase_source)
    assert whole.wait_fraction() == python.wait_fraction() and whole.skipped_windows == python.skipped_windows
    # the training time behind compare's short-run note (the SQL path read it as 0 iterations: "trained 0 s")
    assert python.steady_iterations() > 0
    assert [sql.steady_iterations() for sql in (whole, apart, every)] == [python.steady_iterations()] * 3


def test_goodput_of_a_rank_in_several_segments_is_the_same_by_sql(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's lifecycle is read one segment at a time by SQL: the same goodput as the Python path's."""
    from telemetrain.sinks import jsonl
    from telemetrain.training.goodput import goodput_by_rank

    monkeypatch.setattr(jsonl, "SEGMENT_BYTES", 6_000)
    run = _run(tmp_path, "segments")
    assert len(list(run.glob("rank-0.*.jsonl"))) >= 2
    sql = goodput_by_rank(run.parent)
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    python = goodput_by_rank(run.parent)
    assert sorted(sql) == sorted(python) == [0, 1]
    for rank in python:
        assert sql[rank].as_dict() == python[rank].as_dict()


def test_run_sums_are_exact_where_a_double_would_round() -> None:
    """The groups' sums go through a file between groups: kept exactly (not as a double, which rounds a sum of
    values 2**35 apart), each iteration's mean is still ``statistics.fmean`` of its windows, to the last bit."""
    import random
    import statistics

    from telemetrain.analysis.samples_sums import RunSums
    from telemetrain.store.engine import Engine

    rng = random.Random(7)
    iterations = range(200)
    groups = [[(it, None, rng.uniform(1.0, 2.0) * 2.0 ** rng.randint(-25, 10)) for it in iterations for _ in range(8)]
              for _ in range(3)]
    engine = Engine([])
    try:
        sums = RunSums(engine, ["a"])
        for rows in groups:
            engine.execute("CREATE OR REPLACE TEMP TABLE g (iteration BIGINT, share DOUBLE, a DOUBLE)")
            engine.con.executemany("INSERT INTO g VALUES (?, ?, ?)", rows)
            sums.add("g")
        assert sums.ok and sums.groups == 3
        expected = [statistics.fmean(r[2] for rows in groups for r in rows if r[0] == it) for it in iterations]
        assert sums.series(False, ["a"])["a"] == expected
        sums.close()
    finally:
        engine.close()


def test_run_sums_of_groups_with_different_iterations_and_missing_values() -> None:
    """``RunSums`` adds groups whose iterations differ (one only in the first group, one only in the last) and whose
    values are missing for a metric in a whole group: each iteration's mean and largest share are those of every
    window at that iteration at once."""
    import statistics

    from telemetrain.analysis.samples_sums import RunSums
    from telemetrain.store.engine import Engine

    # (iteration, share, a, b): one window each
    groups: list[list[tuple[int, float | None, float | None, float | None]]] = [
        [(1, 0.1, 1.5, None), (2, 0.0, 2.25, None), (3, None, 0.125, None)],
        [(2, 0.3, 3.0, 7.0), (3, 0.2, None, 5.5), (4, 0.05, 1e-3, 2.0)],
        [(3, 0.0, 0.5, 1.25), (5, None, 4.0, None)],
    ]
    engine = Engine([])
    try:
        sums = RunSums(engine, ["a", "b"])
        for rows in groups:
            engine.execute("CREATE OR REPLACE TEMP TABLE g (iteration BIGINT, share DOUBLE, a DOUBLE, b DOUBLE)")
            engine.con.executemany("INSERT INTO g VALUES (?, ?, ?, ?)", rows)
            sums.add("g")
        assert sums.ok and sums.groups == 3
        for busy_free in (False, True):
            got = sums.series(busy_free, ["a", "b"])
            for k, name in enumerate(("a", "b")):
                expected = []
                for it in sorted({r[0] for rows in groups for r in rows}):
                    at = [r for rows in groups for r in rows if r[0] == it and r[2 + k] is not None]
                    if not at:
                        continue
                    mean = statistics.fmean(cast(float, r[2 + k]) for r in at)  # (not None: filtered above)
                    if busy_free:
                        mean *= 1.0 - min(max(r[1] or 0.0 for r in at), 0.999)
                    expected.append(mean)
                assert got[name] == expected, (name, busy_free)  # exact sums: the same doubles as fmean's
        sums.close()
    finally:
        engine.close()


def test_a_loss_named_but_missing_in_one_run_is_not_swapped_for_another_metric(run_dir: Path) -> None:
    """``--loss lr`` with a baseline that has no ``lr``: the quality comparison used to compare the first evaluation
    metric instead, unannounced; now it compares nothing and a note says which run lacks the metric."""
    from telemetrain.analysis.compare import compare_samples

    candidate = read_samples(run_dir, curves=quality_series("lr"))
    baseline = read_samples(run_dir, curves=quality_series())  # (the same run, read without its lr series)
    assert ("train", "lr") not in baseline.curves.names() and ("val", "val_accuracy") in baseline.curves.names()
    assert compare_quality(candidate, baseline, "lr") is None
    assert compare_quality(candidate, baseline) is not None  # without a name asked for, the fallback stands
    result = compare_samples(candidate, baseline, loss="lr", resamples=100)
    assert result.quality is None
    assert f"quality not compared: no metric 'lr' in the baseline {baseline.run_id}" in result.notes


@pytest.mark.parametrize("engine", ["python", "duckdb"])
def test_process_cpu_in_cores_uses_the_cpus_the_sampler_divided_by(tmp_path: Path, engine: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # a container limited to half a CPU on a host of many: process.cpu.utilization is a share of the half CPU (the
    # sampler's divisor, in its start event), so "cores" multiplies by that, not by the host's CPU count
    if engine == "python":
        monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    for rank, cpus in ((0, 0.5), (1, 1.5)):
        t = Telemetry(identity_from_env({}, run_id="quota", session_tag="quota", rank=rank, world_size=2),
                      store=tmp_path)
        t.event("system.sampler.start", {"interval_s": 1.0, "process.cpu_count": cpus}, group="system")
        t.metric("process.cpu.utilization", 0.8, "system", unit="1")
        assert t.close()
    samples = read_samples(tmp_path / "quota" / "quota")
    assert samples.cpu_count == pytest.approx(1.0)  # the ranks' mean divisor
    assert samples.contention["process_cpu"] == pytest.approx(0.8)
    described = Contention.of(None, samples.contention, samples.cpu_count).describe()
    assert "process CPU 80% = 0.80 cores" in described, described
