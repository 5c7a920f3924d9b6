"""Regression tests for defects found by review: each failed before its fix."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from telemetrain import Telemetry
from telemetrain.span_lifecycle import _current
from telemetrain.spans import tracer
from telemetrain.stats import Gauge, Stat, registry
from telemetrain.store import open_run
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig


def _in_thread(fn: Any, timeout: float = 10.0) -> None:
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it does not finish."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), "deadlock: the call did not finish"
    if errors:
        raise errors[0]


def test_close_inside_the_registrys_own_lock_does_not_deadlock(tmp_path: Path) -> None:
    """SIGTERM's handler closes the Telemetry on the main thread, possibly while that thread is inside the
    registry (creating a stat, a snapshot): closing must not wait for a lock the same thread holds."""

    def scenario() -> None:
        t = Telemetry(store=tmp_path)
        s = Stat("held", window=60, telemetry=t)
        s.add(1.0)
        with registry(t)._lock:  # the state the signal handler interrupts
            t.close()
        assert s.closed

    _in_thread(scenario)


def test_close_during_a_stats_own_fold_still_reports_its_window(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        s = Stat("folding", ["count", "sum"], window=60, telemetry=t)
        for i in range(5000):
            s.add(float(i))
        with s._guard():  # the fold a signal handler interrupts
            t.close()
        run_dir = t.run_dir
    assert run_dir is not None
    windows = [r for r in open_run(run_dir).records("stat") if r.name == "folding"]
    assert windows and windows[-1].sample_count >= 5000 - 2048  # at most the batch being folded is missing


def test_a_failing_unexported_span_is_exported_with_its_real_parent(tmp_path: Path) -> None:
    token = _current.set(None)
    try:
        with Telemetry(store=tmp_path) as t:
            tr = tracer(t)
            tr.sample("iteration", every=2)
            with tr.span("loop"):
                for i in range(2):
                    try:
                        with tr.span("iteration", i=i), tr.span("forward"):
                            if i == 1:
                                raise RuntimeError("boom")
                    except RuntimeError:
                        pass
            run_dir = t.run_dir
    finally:
        _current.reset(token)
    assert run_dir is not None
    starts = {r.span_id: r for r in open_run(run_dir).records("span_start")}
    failed_forward = [r for r in starts.values() if r.name == "forward" and r.parent_id
                      and starts[r.parent_id].attributes == {"i": 1}]
    assert len(failed_forward) == 1  # its parent is iteration 1 (exported with it), not the loop
    ends = {r.span_id: r for r in open_run(run_dir).records("span_end")}
    assert ends[failed_forward[0].parent_id].status == "error"


def test_a_gauge_returning_an_array_is_counted_not_raised(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t, pytest.warns(Warning):
        g = Gauge("array", lambda: np.array([1.0, 2.0]), interval=None, telemetry=t)
        assert g.read() is None
        assert g.errors == 1


def test_cumulative_throughput_without_warmup(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        config = TrainingTelemetryConfig(global_batch_size_or_fn=4, flops_per_sample_or_fn=1e9,
                                         log_every_n_train_iterations=4, warmup_iterations=0)
        r = TrainingRecorder(config, telemetry=t)
        r.on_train_start(0)
        for _ in range(8):
            r.on_training_single_iteration_start()
            r.on_training_single_iteration_end()
        r.on_train_end()
        run_dir = t.run_dir
    assert run_dir is not None
    reports = [e.attributes for e in open_run(run_dir).records("event") if e.name == "training_metrics_update"]
    assert reports and all("cumulative_samples_per_second" in a and "cumulative_train_throughput_per_gpu" in a
                           for a in reports)


def _odd_line(tmp_path: Path, line: str) -> Path:
    """A normal run, plus one odd line appended to its process file."""
    with Telemetry(store=tmp_path) as t:
        t.metric("m", 1.0)
        run_dir = t.run_dir
    assert run_dir is not None
    process_file = next(run_dir.glob("rank-*.jsonl"))
    with process_file.open("a") as f:
        f.write(line + "\n")
    return run_dir


@pytest.mark.parametrize(
    "fields",
    [
        '"kind":"stat","start_mono_ns":0,"count":3,"values":[],"unit":""',
        '"kind":"stat","start_mono_ns":0,"count":"3","values":{},"unit":""',
        '"kind":"diagnostic","sink":"s","count":"3","message":"m"',
        '"kind":"metric","value":1,"unit":5',
        '"kind":"event","severity":"info","attributes":{"forward_time_fraction":"x"},"event_id":"","span_id":""',
    ],
)
def test_show_survives_an_odd_line(tmp_path: Path, fields: str, capsys: pytest.CaptureFixture[str]) -> None:
    from telemetrain import cli

    head = '{"v":1,"mono_ns":5,"wall_ns":1700000000000000000,"group":"training","name":"training_metrics_update",'
    run_dir = _odd_line(tmp_path, head + fields + "}")
    assert cli.main(["show", str(run_dir)]) == 0
    assert "problems" in capsys.readouterr().out


def test_histogram_merge_rescales_each_sign() -> None:
    """Merging the positive side may downscale: the negative side must then be shifted by the new difference."""
    from telemetrain.stats import ExpHistogram

    a = ExpHistogram(max_buckets=16)
    a.record([1e-3, -5.0])
    b = ExpHistogram(max_buckets=16)
    b.record([1e3, -5.0])
    a.merge(b)
    assert a.count == 4
    base = 2.0 ** (2.0**-a.scale)
    (estimate,) = a.quantiles([0.25])  # between the two -5.0 order statistics; no clamping
    assert estimate is not None and 5.0 / base <= -estimate <= 5.0 * base  # within its bucket at the final scale


def test_span_ids_given_as_strings_are_escaped() -> None:
    from telemetrain.identity import identity_from_env
    from telemetrain.records import SpanStart
    from telemetrain.store.codec import decode_line, encode

    identity = identity_from_env({})
    line = encode(SpanStart(1, 2, identity, "g", "n", 'ab"c', "", "", None))
    assert decode_line(line, identity).span_id == 'ab"c'


def test_a_monitor_value_past_float_range_is_inf_not_an_error(tmp_path: Path) -> None:
    import datetime

    from telemetrain import monitor
    from telemetrain.telemetry import set_telemetry

    with Telemetry(store=tmp_path) as t:
        previous = set_telemetry(t)
        try:
            s = monitor.Stat("big", [monitor.VALUE, monitor.MEAN], datetime.timedelta(seconds=60), max_samples=1)
            s.add(10**400)
            assert s.get()[monitor.VALUE] == float("inf")
        finally:
            if previous is not None:
                set_telemetry(previous)
            else:
                import telemetrain

                telemetrain.reset()
