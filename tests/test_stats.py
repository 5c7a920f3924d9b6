"""Stats: windowed ``Stat``, mergeable ``Summary``, the OpenTelemetry-compatible ``ExpHistogram``, ``Gauge``, the
registry and the collector thread.

Accuracy is checked against numpy (quantiles, stddev) and against the OpenTelemetry SDK's own exponential histogram
(bucket layout); lifecycle with real threads, forks, a real DataLoader and subprocesses that exit or get SIGTERM.
Nothing here asserts a wall-clock duration: timeouts only turn a hang into a failure.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import inspect
import json
import math
import os
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ListSink, run_dir_of, run_helper_process
from telemetrain import Diagnostic, StatWindow, Telemetry, TelemetryWarning, identity_from_env
from telemetrain.stats import (
    RAW_LIMIT,
    ExpHistogram,
    Gauge,
    Stat,
    Summary,
    merge_all,
    registry,
    relative_error,
)
from telemetrain.store import open_run

HANG_S = 20.0  # a generous limit: only a hang gets near it
QS = [0.01, 0.1, 0.5, 0.9, 0.95, 0.99, 0.999]
BOUND = relative_error(6)  # 0.5415 %: the histogram's guarantee at its starting scale
SLACK = 1e-9  # rounding on top of the bound (a power of two sits exactly at the bound)
TESTS = Path(__file__).parent
SESSION = "stats"


# -- helpers -----------------------------------------------------------------------------------------------------------


def _collector_threads() -> list[threading.Thread]:
    return [th for th in threading.enumerate() if th.name == "telemetrain-collector" and th.is_alive()]


def _wait_until(predicate: Callable[[], Any], what: str, timeout: float = HANG_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


def _inline_sink(t: Telemetry, kinds: Sequence[str] = ("stat",)) -> ListSink:
    """A sink that receives records on the emitting thread (no dispatcher in between), so polling it shows what was
    emitted without calling ``flush`` (which would close windows itself)."""
    sink = ListSink(background=False)
    t.add_sink(sink, kinds=list(kinds))
    return sink


def _stat_records(records: Sequence[Any], name: str) -> list[StatWindow]:
    return [r for r in records if r.kind == "stat" and r.name == name]


def _stored(t: Telemetry, name: str | None = None) -> list[StatWindow]:
    assert t.flush(HANG_S)
    records = open_run(run_dir_of(t)).records("stat")
    return records if name is None else [r for r in records if r.name == name]


def _distribution(name: str, n: int, seed: int) -> list[float]:
    """``n`` samples (Python floats, or ints for "integers") of a named distribution."""
    rng = np.random.default_rng(seed)
    if name == "uniform":
        x = rng.uniform(0.001, 1000.0, n)
    elif name == "lognormal":
        x = rng.lognormal(0.0, 2.0, n)
    elif name == "bimodal":
        x = np.concatenate([rng.normal(10.0, 1.0, n // 2), rng.normal(1e6, 1e4, n - n // 2)])
        rng.shuffle(x)
    elif name == "outliers":
        x = rng.normal(100.0, 5.0, n)
        x[rng.choice(n, size=min(n, 5), replace=False)] = [1e12, 3e13, 7e14, 2e15, 9e15][: min(n, 5)]
    elif name == "negative":
        x = -rng.lognormal(3.0, 1.0, n)
    elif name == "mixed":
        x = rng.normal(0.0, 10.0, n)
    elif name == "integers":
        return cast(list[float], rng.integers(-500, 500, n).tolist())  # (numpy types tolist() as Any)
    else:
        raise ValueError(name)
    return cast(list[float], x.tolist())


DISTRIBUTIONS = ["uniform", "lognormal", "bimodal", "outliers", "negative", "mixed", "integers"]


def _neighbours(ordered: np.ndarray, q: float) -> tuple[float, float]:
    """The two order statistics numpy's linear method interpolates between for quantile ``q``."""
    rank = q * (len(ordered) - 1)
    lo = math.floor(rank)
    return float(ordered[lo]), float(ordered[min(lo + 1, len(ordered) - 1)])


def _assert_within_bound(estimates: Sequence[float | None], values: Sequence[float], qs: Sequence[float],
                         bound: float = BOUND) -> None:
    """Each estimate is within ``bound`` (relative) of numpy's quantile when the two order statistics it lies
    between share a sign; otherwise it lies between them, widened by the bound."""
    data = np.asarray(values, dtype=float)
    ordered = np.sort(data)
    reference = np.quantile(data, qs)
    for q, est, ref in zip(qs, estimates, reference, strict=True):
        assert est is not None, f"q={q}: no estimate"
        a, b = _neighbours(ordered, q)
        if a * b >= 0:
            assert abs(est - ref) <= bound * abs(ref) * (1 + SLACK) + 1e-300, (
                f"q={q}: {est!r} vs numpy {ref!r}: relative error {abs(est - ref) / abs(ref):.3g} > {bound:.4g}"
            )
        else:
            lo = min(a, b) - bound * abs(min(a, b))
            hi = max(a, b) + bound * abs(max(a, b))
            assert lo * (1 + SLACK) <= est <= hi * (1 + SLACK), f"q={q}: {est!r} outside [{lo}, {hi}]"


def _assert_exact(estimates: Sequence[float | None], values: Sequence[float], qs: Sequence[float]) -> None:
    data = np.asarray(values, dtype=float)
    ordered = np.sort(data)
    reference = np.quantile(data, qs)
    for q, est, ref in zip(qs, estimates, reference, strict=True):
        assert est is not None
        a, b = _neighbours(ordered, q)
        tol = 1e-12 * max(abs(ref), abs(a), abs(b))
        assert abs(est - ref) <= tol, f"q={q}: {est!r} vs numpy {ref!r}"


# -- 1. quantile accuracy against numpy --------------------------------------------------------------------------------


def test_relative_error_of_scale_6_is_0_5415_percent() -> None:
    assert BOUND == pytest.approx(0.005415, abs=5e-7)
    assert relative_error(5) == pytest.approx(2 * BOUND, rel=1e-2)  # each scale step doubles it (about)
    assert ExpHistogram().relative_error == BOUND


@pytest.mark.parametrize("n", [1, 2, 3, 10, 257, RAW_LIMIT])
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_quantiles_are_exact_up_to_raw_limit(dist: str, n: int) -> None:
    values = _distribution(dist, n, seed=n)
    s = Summary.of(values)
    assert s.exact
    qs = [0.0, *QS, 1.0, 0.25, 0.333, 0.75]
    _assert_exact(s.quantiles(qs), values, qs)


@pytest.mark.parametrize("n", [10_000, 200_000])
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_quantiles_beyond_raw_limit_are_within_the_histogram_bound(dist: str, n: int) -> None:
    values = _distribution(dist, n, seed=7 + n)
    s = Summary.of(values)
    assert not s.exact
    _assert_within_bound(s.quantiles(QS), values, QS)
    p0, p100 = s.quantiles([0.0, 1.0])
    assert p0 == float(min(values)) and p100 == float(max(values))  # the exact min and max


def test_just_past_raw_limit_switches_to_the_histogram() -> None:
    values = _distribution("lognormal", RAW_LIMIT + 1, seed=3)
    s = Summary.of(values[:RAW_LIMIT])
    assert s.exact
    s.fold(values[RAW_LIMIT:])
    assert not s.exact
    _assert_within_bound(s.quantiles(QS), values, QS)


@pytest.mark.parametrize("n", [1000, 5000])
def test_stat_window_quantiles_match_numpy(tmp_path: Path, n: int) -> None:
    values = _distribution("lognormal", n, seed=n)
    aggregations = ["count", "p0", "p100", *(f"p{q * 100:g}" for q in QS)]
    with Telemetry(store=tmp_path) as t:
        stat = Stat("latency", aggregations, samples=n, telemetry=t)
        for v in values:
            stat.add(v)
        got = stat.get()
    assert got["count"] == n
    estimates = [got[f"p{q * 100:g}"] for q in QS]
    if n <= RAW_LIMIT:
        _assert_exact(estimates, values, QS)
    else:
        _assert_within_bound(estimates, values, QS)
    assert got["p0"] == min(values) and got["p100"] == max(values)


# -- 2. merging and transport ------------------------------------------------------------------------------------------


def _split(values: list[float], rng: np.random.Generator) -> list[list[float]]:
    k = int(rng.integers(2, 9))
    cuts = sorted(rng.choice(np.arange(1, len(values)), size=k - 1, replace=False).tolist())
    return [values[a:b] for a, b in zip([0, *cuts], [*cuts, len(values)], strict=True)]


def _assert_same_exact_parts(merged: Summary, values: list[float]) -> None:
    data = np.asarray(values, dtype=float)
    assert merged.count == merged.finite == len(values)
    assert merged.min == min(values) and merged.max == max(values)
    assert merged.sum == pytest.approx(math.fsum(values), rel=1e-9, abs=1e-9 * float(np.abs(data).sum()))
    assert merged.mean == pytest.approx(float(np.mean(data)), rel=1e-9, abs=1e-9 * float(np.abs(data).mean()))
    assert merged.stddev == pytest.approx(float(np.std(data)), rel=1e-9)


@pytest.mark.parametrize("n", [300, 2000, 20_000])
@pytest.mark.parametrize("seed", range(4))
def test_merge_of_random_parts_equals_the_whole(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed * 1000 + n)
    dist = ["lognormal", "mixed", "bimodal", "integers"][seed]
    values = _distribution(dist, n, seed=seed)
    parts = _split(values, rng)
    summaries = [Summary.of(p) for p in parts]
    merged = merge_all(summaries)
    assert merged is not None
    _assert_same_exact_parts(merged, values)
    assert merged.last == values[-1]
    whole = Summary.of(values)
    if n <= RAW_LIMIT:
        assert merged.exact
        _assert_exact(merged.quantiles(QS), values, QS)
    else:
        assert not merged.exact
        _assert_within_bound(merged.quantiles(QS), values, QS)
        # merging histograms is exact: the same buckets as recording everything into one
        assert merged.histogram_dict() == whole.histogram_dict()
    # a left fold in another order gives the same exact parts
    other = summaries[-1].copy()
    for s in reversed(summaries[:-1]):
        other = other.merge(s)
    _assert_same_exact_parts(other, values)


@pytest.mark.parametrize("n", [500, 6000])
def test_to_dict_from_dict_round_trip_then_merge(n: int) -> None:
    values = _distribution("lognormal", n, seed=11)
    half = n // 2
    a, b = Summary.of(values[:half]), Summary.of(values[half:])
    direct = a.merge(b)
    a2 = Summary.from_dict(json.loads(json.dumps(a.to_dict())))
    b2 = Summary.from_dict(json.loads(json.dumps(b.to_dict())))
    through = a2.merge(b2)
    assert through.to_dict() == direct.to_dict()
    assert through.quantiles(QS) == direct.quantiles(QS)

    # compact: the kept samples travel as the histogram; exact parts stay exact, quantiles within the bound
    ac = Summary.from_dict(json.loads(json.dumps(a.to_dict(compact=True))))
    bc = Summary.from_dict(json.loads(json.dumps(b.to_dict(compact=True))))
    assert "raw" not in a.to_dict(compact=True)
    compact = ac.merge(bc)
    for part in ("count", "finite", "nan_count", "inf_count", "sum", "min", "max", "m2", "last"):
        assert getattr(compact, part) == getattr(direct, part), part
    assert not compact.exact
    _assert_within_bound(compact.quantiles(QS), values, QS)
    assert compact.histogram_dict() == Summary.of(values).histogram_dict()  # bucket counts merge exactly


def _valid_summary_dict() -> dict[str, Any]:
    return Summary.of([1.0, 2.0, 3.0]).to_dict()


def _without(d: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != key}


MALFORMED_SUMMARIES: dict[str, Callable[[], Any]] = {
    "None": lambda: None,
    "a list": lambda: [1, 2, 3],
    "a str": lambda: "summary",
    "empty": dict,
    "no count": lambda: _without(_valid_summary_dict(), "count"),
    "negative count": lambda: {**_valid_summary_dict(), "count": -1},
    "count as str": lambda: {**_valid_summary_dict(), "count": "3"},
    "count as float": lambda: {**_valid_summary_dict(), "count": 3.0},
    "track not a number": lambda: {**_valid_summary_dict(), "track": "all"},
    "sum as str": lambda: {**_valid_summary_dict(), "sum": "6"},
    "raw with a str": lambda: {**_valid_summary_dict(), "raw": [1.0, "2", 3.0]},
    "raw too long": lambda: {**_valid_summary_dict(), "raw": [1.0] * (RAW_LIMIT + 1)},
    "neither raw nor histogram": lambda: _without(_valid_summary_dict(), "raw"),
    "histogram not a dict": lambda: {**_without(_valid_summary_dict(), "raw"), "histogram": "buckets"},
    "histogram scale out of range": lambda: {**_without(_valid_summary_dict(), "raw"), "histogram": {"scale": 99}},
    "histogram negative count": lambda: {
        **_without(_valid_summary_dict(), "raw"),
        "histogram": {"scale": 6, "positive": {"offset": 0, "counts": [1, -1]}},
    },
}


@pytest.mark.parametrize("case", list(MALFORMED_SUMMARIES))
def test_summary_from_dict_rejects_malformed_input(case: str) -> None:
    with pytest.raises(ValueError):
        Summary.from_dict(MALFORMED_SUMMARIES[case]())


INCONSISTENT_SUMMARIES: dict[str, Callable[[], dict[str, Any]]] = {
    "finite > count": lambda: {**_valid_summary_dict(), "finite": 5},
    "raw shorter than finite": lambda: {**_valid_summary_dict(), "raw": [1.0]},
    "NaN among the raw finite samples": lambda: {**_valid_summary_dict(), "raw": [1.0, math.nan, 3.0]},
}


@pytest.mark.parametrize("case", list(INCONSISTENT_SUMMARIES))
def test_summary_from_dict_rejects_inconsistent_counts(case: str) -> None:
    with pytest.raises(ValueError):
        Summary.from_dict(INCONSISTENT_SUMMARIES[case]())


def test_exphistogram_from_dict_round_trip_and_rejects_malformed() -> None:
    h = ExpHistogram()
    h.record([-3.0, -0.5, 0.0, 0.0, 1e-3, 1.0, 2.0, 7.5, 1e6])
    back = ExpHistogram.from_dict(json.loads(json.dumps(h.to_dict())))
    assert back == h and back.count == 9 and back.zero_count == 2
    bad: object
    for bad in (None, [], {"scale": "x"}, {"scale": 6, "zero_count": -1},
                {"scale": 6, "positive": {"offset": 0, "counts": "ab"}},
                {"scale": 6, "positive": {"offset": 1.5, "counts": [1]}},
                {"scale": 6, "positive": {"offset": 0, "counts": [1] * 5000}}):
        with pytest.raises(ValueError):
            ExpHistogram.from_dict(bad)  # type: ignore[arg-type]


# -- 3. the histogram is OpenTelemetry's -------------------------------------------------------------------------------


def _otel_point(values: Sequence[float]) -> Any:
    """The SDK's own exponential histogram of ``values`` (max 4096 buckets, starting at scale 6, like ours)."""
    pytest.importorskip("opentelemetry.sdk.metrics", reason="the reference is OpenTelemetry's SDK (the [otel] extra)")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ExponentialHistogramDataPoint, InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View

    reader = InMemoryMetricReader()
    view = View(instrument_name="h", aggregation=ExponentialBucketHistogramAggregation(max_size=4096, max_scale=6))
    provider = MeterProvider(metric_readers=[reader], views=[view], shutdown_on_exit=False)
    try:
        instrument = provider.get_meter("telemetrain-tests").create_histogram("h")
        for v in values:
            instrument.record(v)
        data = reader.get_metrics_data()
    finally:
        provider.shutdown()
    assert data is not None
    [resource_metrics] = data.resource_metrics
    [scope_metrics] = resource_metrics.scope_metrics
    [metric] = scope_metrics.metrics
    [point] = metric.data.data_points
    assert isinstance(point, ExponentialHistogramDataPoint)
    return point


def _trimmed(offset: int, counts: Sequence[int]) -> tuple[int, list[int]]:
    """(offset, counts) without empty buckets at either end (the SDK keeps a larger backing array)."""
    counts = list(counts)
    lo, hi = 0, len(counts)
    while lo < hi and not counts[lo]:
        lo += 1
    while hi > lo and not counts[hi - 1]:
        hi -= 1
    return (offset + lo if lo < hi else 0), counts[lo:hi]


def _away_from_boundaries(values: Sequence[float]) -> list[float]:
    """Drop values within ~1e-9 (in index units) of a scale-6 bucket boundary (coarser boundaries are among these),
    where two correct log computations may round to neighbouring buckets; exact powers of two are kept (both sides
    treat them exactly)."""
    out = []
    for v in values:
        if v == 0:
            out.append(v)  # zero_count
            continue
        y = math.log2(v) * 64
        if abs(y - round(y)) > 1e-9 or math.frexp(v)[0] == 0.5:
            out.append(v)
    return out


OTEL_CASES: dict[str, Callable[[], list[float]]] = {
    "lognormal": lambda: _distribution("lognormal", 5000, seed=21),
    "uniform with zeros": lambda: _distribution("uniform", 3000, seed=22) + [0.0] * 7,
    "powers of two": lambda: [2.0**k for k in range(-30, 31)] * 2,
    "many powers of two": lambda: [2.0**k for k in range(-60, 61)] * 3,  # a large batch (numpy's path when loaded)
    "integers": lambda: [float(i) for i in range(1, 2001)],
    "wide range (downscaled to scale 4)": lambda: [1.3 * 2.0**k for k in range(-100, 100)] + [1e-30, 1e30],
    "tiny and huge": lambda: [1e-300, 3e-200, 1e-5, 1.0, 1e200, 1e300],
}


@pytest.mark.parametrize("case", list(OTEL_CASES))
def test_exphistogram_buckets_match_the_opentelemetry_sdk(case: str) -> None:
    values = _away_from_boundaries(OTEL_CASES[case]())
    point = _otel_point(values)
    h = ExpHistogram()
    h.record(values)
    ours = h.to_dict()
    assert ours["scale"] == point.scale
    assert ours["zero_count"] == point.zero_count
    assert (ours["positive"]["offset"], ours["positive"]["counts"]) == _trimmed(
        point.positive.offset, point.positive.bucket_counts
    )
    assert sum(ours["positive"]["counts"]) + ours["zero_count"] == point.count == len(values)
    assert ours["negative"]["counts"] == []
    # a Summary's histogram (the record's "histogram" aggregation) is the same thing
    assert Summary.of(values).histogram_dict() == ours


def test_small_and_large_batches_bucket_alike() -> None:
    """Values recorded in small batches (the plain path) and in one large batch (vectorised when numpy is loaded)
    land in the same buckets, boundaries and powers of two included."""
    values = (
        _distribution("lognormal", 4000, seed=51)
        + [-v for v in _distribution("uniform", 1000, seed=52)]
        + [2.0**k for k in range(-50, 51)]
        + [-(2.0**k) for k in range(-5, 6)]
        + [float(i) for i in range(1, 600)]
        + [0.0, -0.0, 5e-324, 1e308]
    )
    whole, chunked = ExpHistogram(), ExpHistogram()
    whole.record(values)
    for i in range(0, len(values), 100):
        chunked.record(values[i : i + 100])
    assert whole.to_dict() == chunked.to_dict()
    assert whole.count == len(values)


def test_merged_histograms_match_the_opentelemetry_sdk_of_all_values() -> None:
    """Parts recorded at different scales (a narrow one stays at 6, a wide one downscales) merge into what the SDK
    records for all the values at once."""
    narrow = _away_from_boundaries(_distribution("uniform", 2000, seed=31))
    wide = _away_from_boundaries([1.7 * 2.0**k for k in range(-70, 70)])
    a, b = ExpHistogram(), ExpHistogram()
    a.record(narrow)
    b.record(wide)
    assert a.scale == 6 and b.scale < 6
    a.merge(b)
    point = _otel_point(narrow + wide)
    ours = a.to_dict()
    assert ours["scale"] == point.scale
    assert (ours["positive"]["offset"], ours["positive"]["counts"]) == _trimmed(
        point.positive.offset, point.positive.bucket_counts
    )


def test_exphistogram_downscales_past_max_buckets_and_keeps_its_bound() -> None:
    values = _distribution("lognormal", 20_000, seed=41)
    h = ExpHistogram(max_buckets=64)
    h.record(values)
    d = h.to_dict()
    assert h.scale < 6 and len(d["positive"]["counts"]) <= 64 and h.count == len(values)
    _assert_within_bound(h.quantiles(QS, min(values), max(values)), values, QS, bound=h.relative_error)


def test_exphistogram_negative_values_mirror_positive_ones() -> None:
    values = _distribution("lognormal", 3000, seed=42)
    pos, neg = ExpHistogram(), ExpHistogram()
    pos.record(values)
    neg.record([-v for v in values])
    assert neg.to_dict()["negative"] == pos.to_dict()["positive"]
    assert neg.to_dict()["positive"]["counts"] == []
    qs = [0.1, 0.5, 0.9]
    mirrored = [-q for q in reversed(pos.quantiles([1 - q for q in reversed(qs)]))]  # type: ignore[operator]
    assert neg.quantiles(qs) == pytest.approx(mirrored, rel=1e-12)


# -- 4. windows --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 5, 1000, 5000])
def test_count_window_closes_exactly_at_the_nth_sample(tmp_path: Path, n: int) -> None:
    with Telemetry(store=tmp_path) as t:
        stat = Stat("items", ["count", "sum", "min", "max", "p50"], samples=n, telemetry=t)
        assert stat.get() == {} and stat.count == 0
        previous: dict[str, Any] = {}
        for w in range(3):
            base = w * n
            for i in range(n - 1):
                stat.add(base + i)
            assert stat.count == n - 1
            assert stat.get() == previous  # not closed yet
            stat.add(base + n - 1)  # the N-th sample closes the window, at once
            assert stat.count == 0
            previous = stat.get()
            assert previous["count"] == n and previous["sum"] == sum(range(base, base + n))
            assert previous["min"] == base and previous["max"] == base + n - 1
            assert stat.last_summary is not None and stat.last_summary.count == n
        records = _stored(t, "items")
    assert [r.sample_count for r in records] == [n, n, n]
    assert [r.values["count"] for r in records] == [n, n, n]
    assert [r.values["min"] for r in records] == [0, n, 2 * n]


def _crosses_wall_boundary(record: StatWindow, window_s: float) -> bool:
    """The window (start, end] in wall time contains a multiple of the window size (boundaries are aligned)."""
    size = round(window_s * 1e9)
    start_wall = record.start_mono_ns + (record.wall_ns - record.mono_ns)
    return record.wall_ns // size > start_wall // size


def test_time_window_closes_at_its_boundary_without_another_add(tmp_path: Path) -> None:
    window = 0.5
    with Telemetry(store=tmp_path) as t:
        sink = _inline_sink(t)
        # created 0.1-0.25 s before a wall-clock multiple of the window: the first window ends there, short
        _wait_for_phase(window, 0.5, 0.8)
        stat = Stat("step_time", ["count", "sum", "mean"], window=window, unit="s", telemetry=t)
        for v in (1.0, 2.0, 3.0, 4.0, 5.0):
            stat.add(v)
        # no add, no flush: the collector thread closes the window at the boundary
        first = _wait_until(lambda: _stat_records(sink.records, "step_time"), "the time window to close")[0]
        assert first.sample_count == 5 and first.values == {"count": 5, "sum": 15.0, "mean": 3.0}
        got = stat.get()
        if len(_stat_records(sink.records, "step_time")) == 1:  # the next window has not closed yet
            assert got == first.values
        assert stat.count == 0
        assert first.unit == "s" and first.group == "stats" and first.identity == t.identity
        assert first.start_mono_ns < first.mono_ns
        assert _crosses_wall_boundary(first, window)
        # aligned: it closed at that boundary, well before a full window had passed (the collector may be late by a
        # few ms under the GIL; this allows 250 ms)
        assert first.mono_ns - first.start_mono_ns < window * 1e9, "the first window was not cut at the boundary"
        assert abs((first.wall_ns - first.mono_ns) - (time.time_ns() - time.monotonic_ns())) < 1e9
        # the next window is reported empty (report_empty), and starts where the first ended
        second = _wait_until(lambda: _stat_records(sink.records, "step_time")[1:], "an empty window")[0]
        assert second.sample_count == 0 and second.values == {"count": 0, "sum": 0}
        assert second.start_mono_ns == first.mono_ns < second.mono_ns
        assert _crosses_wall_boundary(second, window)
    stored = _stored_after_close(t, "step_time")
    assert stored[0].sample_count == 5 and stored[0].mono_ns == first.mono_ns and stored[0].wall_ns == first.wall_ns


def _wait_for_phase(window_s: float, lo: float, hi: float) -> None:
    """Return when the wall clock is between ``lo`` and ``hi`` (fractions) of the way through a window-sized slot
    (slots start at wall-clock multiples of the window, as a stat's time windows do)."""
    size = round(window_s * 1e9)
    deadline = time.monotonic() + HANG_S
    while not lo <= (time.time_ns() % size) / size <= hi:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def _not_near_a_boundary(window_s: float, margin_s: float = 0.05) -> None:
    """Return when the next wall-clock multiple of the window is at least ``margin_s`` away, so that a few adds
    made now all fall in one time window."""
    size = round(window_s * 1e9)
    margin = round(margin_s * 1e9)
    while size - time.time_ns() % size < margin:
        time.sleep(0.002)


def _stored_after_close(t: Telemetry, name: str) -> list[StatWindow]:
    return [r for r in open_run(run_dir_of(t)).records("stat") if r.name == name]


def test_timedelta_window(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        sink = _inline_sink(t)
        stat = Stat("td", ["count"], window=datetime.timedelta(milliseconds=100), telemetry=t)
        assert stat.window == pytest.approx(0.1)
        stat.add(1)
        record = _wait_until(lambda: _stat_records(sink.records, "td"), "the window to close")[0]
        assert record.sample_count == 1 and _crosses_wall_boundary(record, 0.1)


def test_both_count_and_time_close_at_whichever_comes_first(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        sink = _inline_sink(t)
        by_count = Stat("by_count", ["count", "sum"], window=3600, samples=3, telemetry=t)
        for i in range(7):
            by_count.add(i)
        assert [r.sample_count for r in _stat_records(sink.records, "by_count")] == [3, 3]
        assert by_count.count == 1 and by_count.get() == {"count": 3, "sum": 12}
        _not_near_a_boundary(0.2)
        by_time = Stat("by_time", ["count", "sum"], window=0.2, samples=1000, telemetry=t)
        for i in range(5):
            by_time.add(i)
        record = _wait_until(lambda: _stat_records(sink.records, "by_time"), "the time window to close")[0]
        assert record.sample_count == 5 and _crosses_wall_boundary(record, 0.2)
        # a count close does not move the time boundary: the rest of that window still closes on the boundary
        _not_near_a_boundary(0.2)
        mixed = Stat("mixed", ["count"], window=0.2, samples=2, telemetry=t)
        mixed.add(1)
        mixed.add(2)
        mixed.add(3)
        records = _wait_until(lambda: _stat_records(sink.records, "mixed")[1:] and _stat_records(sink.records, "mixed"),
                              "the time window to close")
        assert [r.sample_count for r in records[:2]] == [2, 1]
        assert records[1].start_mono_ns == records[0].mono_ns and _crosses_wall_boundary(records[1], 0.2)
        assert sum(r.sample_count for r in _stat_records(sink.records, "mixed")) == 3


def test_cumulative_stat_reports_totals_once_per_flush_when_changed(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        stat = Stat("tokens", ["count", "sum", "max", "rate"], telemetry=t)
        for v in (1, 2, 3):
            stat.add(v)
        now = stat.get()
        assert now["count"] == 3 and now["sum"] == 6 and now["max"] == 3 and now["rate"] > 0
        assert stat.count == 3
        assert [r.sample_count for r in _stored(t, "tokens")] == [3]
        assert [r.sample_count for r in _stored(t, "tokens")] == [3]  # unchanged: no second record
        stat.add(4)
        assert stat.get()["sum"] == 10  # never resets
        records = _stored(t, "tokens")
        assert [r.sample_count for r in records] == [3, 4]
        assert records[1].values["sum"] == 10 and records[1].start_mono_ns == records[0].start_mono_ns
        assert stat.last_summary is not None and stat.last_summary.count == 4
    assert [r.sample_count for r in _stored_after_close(t, "tokens")] == [3, 4]  # close: nothing new to report


def test_cumulative_stat_without_samples_and_report_empty_false_reports_nothing(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        never = Stat("never", ["count", "sum"], report_empty=False, telemetry=t)
        t.metric("marker", 1)  # the run directory exists whatever the stat does
        assert t.flush()
        assert never.count == 0
    assert _stored_after_close(t, "never") == []


def test_empty_time_windows_reported_only_with_report_empty(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        sink = _inline_sink(t)
        quiet = Stat("quiet", ["count", "mean"], window=0.05, report_empty=False, telemetry=t)
        loud = Stat("loud", ["count", "mean"], window=0.05, report_empty=True, telemetry=t)
        _wait_until(lambda: len(_stat_records(sink.records, "loud")) >= 3, "three empty windows")
        assert not _stat_records(sink.records, "quiet")
        for r in _stat_records(sink.records, "loud"):
            assert r.sample_count == 0 and r.values == {"count": 0}  # no invented mean
        quiet.add(2.0)
        record = _wait_until(lambda: _stat_records(sink.records, "quiet"), "the window with a sample")[0]
        assert record.sample_count == 1 and record.values == {"count": 1, "mean": 2.0}
        n_loud = len(_stat_records(sink.records, "loud"))
        _wait_until(lambda: len(_stat_records(sink.records, "loud")) >= n_loud + 2, "two more empty windows")
        assert len(_stat_records(sink.records, "quiet")) == 1  # its later empty windows stay absent
        del loud


@pytest.mark.parametrize("n", [100, 5000])
def test_histogram_aggregation_in_the_record_and_the_run_store(tmp_path: Path, n: int) -> None:
    values = [-v for v in _distribution("lognormal", n // 10, seed=5)] + [0.0] * 3 + _distribution(
        "lognormal", n - n // 10 - 3, seed=6
    )
    with Telemetry(store=tmp_path) as t:
        sink = _inline_sink(t)
        stat = Stat("h", ["count", "histogram", "p50"], samples=n, telemetry=t)
        for v in values:
            stat.add(v)
        [record] = _stat_records(sink.records, "h")
        stored = _stored(t, "h")
    expected = ExpHistogram()
    expected.record(values)
    assert record.histogram == expected.to_dict()
    assert set(record.histogram) == {"scale", "zero_count", "positive", "negative"}
    assert record.histogram["zero_count"] == 3
    assert "histogram" not in record.values and record.values["count"] == n
    [back] = stored
    assert back.histogram == record.histogram and back.values == record.values
    assert ExpHistogram.from_dict(back.histogram) == expected
    total = sum(back.histogram["positive"]["counts"]) + sum(back.histogram["negative"]["counts"]) + 3
    assert total == n


def test_no_histogram_in_the_record_unless_asked(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        stat = Stat("plain", ["count", "p50"], samples=2, telemetry=t)
        stat.add(1.0)
        stat.add(2.0)
        [record] = _stored(t, "plain")
    assert record.histogram is None


# -- 5. flush, close, exit ---------------------------------------------------------------------------------------------


def test_telemetry_flush_and_close_report_the_open_window(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        stat = Stat("loss", ["count", "sum"], window=3600, telemetry=t)
        for i in range(10):
            stat.add(i)
        [first] = _stored(t, "loss")  # flush closed the partial window
        assert first.sample_count == 10 and first.values == {"count": 10, "sum": 45}
        assert stat.get() == first.values and stat.count == 0
        assert _stored(t, "loss") == [first]  # an empty open window is not closed by flush
        for i in range(5):
            stat.add(i)
    assert stat.closed
    records = _stored_after_close(t, "loss")
    assert [r.sample_count for r in records] == [10, 5]
    assert records[1].start_mono_ns == records[0].mono_ns


def test_stat_flush_and_close_of_the_stat_itself(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        stat = Stat("own", ["count"], samples=100, telemetry=t)
        stat.add(1)
        stat.flush()
        stat.add(2)
        stat.add(3)
        stat.close()
        assert stat.closed and "own" not in registry(t).names()
        stat.add(4)  # still aggregated after close, never emitted
        stat.flush()
        records = _stored(t, "own")
    assert [r.sample_count for r in records] == [1, 2]


def _run_partial_window_helper(tmp_path: Path, emit_first: str, then: str) -> tuple[int | None, list[StatWindow]]:
    run_id = f"partial-{uuid.uuid4().hex[:8]}"
    code = f"import _proc_helpers as h; h.stat_partial_window({str(tmp_path)!r}, {emit_first!r}, {then!r})"
    # exiting takes a fraction of a second; a process still there after the limit is hung
    returncode, path, _ = run_helper_process(tmp_path, code, run_id, SESSION, sigterm=then == "sleep",
                                             timeout=HANG_S if then == "sleep" else 8.0)
    return returncode, [r for r in open_run(path).records("stat") if r.name == "partial"] if path.is_dir() else []


@pytest.mark.parametrize("emit_first", ["metric", "none"])
def test_subprocess_normal_exit_reports_the_partial_window(tmp_path: Path, emit_first: str) -> None:
    returncode, records = _run_partial_window_helper(tmp_path, emit_first, "exit")
    stderr = (tmp_path / "stderr.txt").read_text()
    assert returncode is not None, "the process hung at exit"
    assert returncode == 0, stderr
    assert [(r.sample_count, r.values) for r in records] == [(10, {"count": 10, "sum": 45})], stderr


@pytest.mark.parametrize("emit_first", ["metric", "none"])
def test_subprocess_sigterm_reports_the_partial_window(tmp_path: Path, emit_first: str) -> None:
    returncode, records = _run_partial_window_helper(tmp_path, emit_first, "sleep")
    stderr = (tmp_path / "stderr.txt").read_text()
    assert returncode == -signal.SIGTERM, stderr  # it still dies of the signal
    assert [(r.sample_count, r.values) for r in records] == [(10, {"count": 10, "sum": 45})], stderr


# -- 6. bad input ------------------------------------------------------------------------------------------------------


def test_add_refuses_what_is_not_a_number(tmp_path: Path) -> None:
    import torch

    with Telemetry(store=tmp_path) as t:
        stat = Stat("x", ["count"], samples=10, telemetry=t)
        for bad in ("x", None, torch.tensor(1.0), [1.0], b"1", object()):
            with pytest.raises(TypeError, match="value"):
                stat.add(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"tensor\.item\(\)"):
            stat.add(torch.tensor([2.0]))  # type: ignore[arg-type]
        assert stat.count == 0
        # numbers of other types are fine: numpy scalars, bools (as 0/1)
        stat.add(np.float32(1.5))  # type: ignore[arg-type]  # (Stat.add is annotated float)
        stat.add(np.int64(2))  # type: ignore[arg-type]
        stat.add(True)
        assert stat.count == 3
        stat.flush()
        [record] = _stored(t, "x")
    assert record.sample_count == 3


@pytest.mark.parametrize("window", [0, -1, 0.0005, math.nan, math.inf, datetime.timedelta(0),
                                    datetime.timedelta(seconds=-1)], ids=repr)
def test_bad_window_is_a_value_error(telemetry: Telemetry, window: Any) -> None:
    with pytest.raises(ValueError, match="window"):
        Stat("x", window=window)


@pytest.mark.parametrize("window", ["1", True, [1]], ids=repr)
def test_window_of_the_wrong_type_is_a_type_error(telemetry: Telemetry, window: Any) -> None:
    with pytest.raises(TypeError, match="window"):
        Stat("x", window=window)


@pytest.mark.parametrize("samples", [0, -1, 1.5, True, "3"], ids=repr)
def test_bad_samples_is_a_value_error(telemetry: Telemetry, samples: Any) -> None:
    with pytest.raises(ValueError, match="samples"):
        Stat("x", samples=samples)


@pytest.mark.parametrize("aggregations", [["count", "median"], ["p101"], ["p-1"], ["avg"]], ids=repr)
def test_unknown_aggregation_lists_the_valid_ones(telemetry: Telemetry, aggregations: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        Stat("x", aggregations)
    message = str(info.value)
    assert repr(aggregations[-1]) in message
    for valid in ("value", "count", "sum", "mean", "min", "max", "stddev", "rate", "histogram", "p50", "p99.9"):
        assert valid in message


def test_aggregation_names_are_canonical(telemetry: Telemetry) -> None:
    stat = Stat("x", ["COUNT", " p99 ", "p99.90", "p50", "count"])
    assert stat.aggregations == ("count", "p99", "p99.9", "p50")
    with pytest.raises(TypeError):
        Stat("x", "count")


def test_time_on_a_non_time_unit_is_a_value_error(telemetry: Telemetry) -> None:
    stat = Stat("alloc", unit="bytes")
    with pytest.raises(ValueError, match="bytes"):
        stat.time()
    with pytest.raises(ValueError, match="bytes"):
        stat.time(lambda: None)


def test_non_finite_samples_are_counted_apart(tmp_path: Path) -> None:
    aggregations = ["count", "sum", "mean", "min", "max", "stddev", "p50", "p99", "value"]
    finite = _distribution("lognormal", 3000, seed=9)
    specials = [math.nan, math.inf, -math.inf, math.nan]
    mixed = finite[:1000] + specials[:2] + finite[1000:] + specials[2:]
    with Telemetry(store=tmp_path) as t:
        small = Stat("small", aggregations, samples=6, telemetry=t)
        for v in (1.0, math.nan, 2.0, math.inf, 3.0, -math.inf):
            small.add(v)
        big = Stat("big", aggregations, samples=len(mixed), telemetry=t)
        for v in mixed:
            big.add(v)
        records = {r.name: r for r in _stored(t)}
    s = records["small"].values
    assert records["small"].sample_count == 6 and s["count"] == 6
    assert s["nan_count"] == 1 and s["inf_count"] == 2
    assert s["sum"] == 6.0 and s["mean"] == 2.0 and s["min"] == 1.0 and s["max"] == 3.0 and s["p50"] == 2.0
    assert s["stddev"] == pytest.approx(float(np.std([1.0, 2.0, 3.0])), rel=1e-12)
    assert s["value"] == -math.inf  # the last sample, as it was
    b = records["big"].values
    assert b["count"] == len(mixed) and b["nan_count"] == 2 and b["inf_count"] == 2
    assert b["sum"] == pytest.approx(math.fsum(finite), rel=1e-12)
    assert b["min"] == min(finite) and b["max"] == max(finite)
    assert b["stddev"] == pytest.approx(float(np.std(finite)), rel=1e-9)
    _assert_within_bound([b["p50"], b["p99"]], finite, [0.5, 0.99])
    assert math.isnan(b["value"])
    for key in ("sum", "mean", "min", "max", "stddev", "p50", "p99"):
        assert math.isfinite(b[key]), key


def test_summary_of_only_non_finite_samples() -> None:
    s = Summary.of([math.nan, math.inf, -math.inf])
    assert (s.count, s.finite, s.nan_count, s.inf_count) == (3, 0, 1, 2)
    assert s.values(["count", "sum", "mean", "min", "max", "stddev", "p50"]) == {
        "count": 3, "sum": 0, "nan_count": 1, "inf_count": 2
    }


def test_an_int_too_large_for_a_float_is_aggregated_as_an_infinity(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught, Telemetry(store=tmp_path) as t:
        warnings.simplefilter("always")
        stat = Stat("huge", ["count", "sum", "mean"], samples=3, telemetry=t)
        for v in (1, 10**400, 2, 3, 4, 5):
            stat.add(v)  # never an OverflowError, here or when the window is folded
        stat.flush()
        records = _stored(t, "huge")
    assert not [w for w in caught if issubclass(w.category, TelemetryWarning)], [str(w.message) for w in caught]
    assert [r.sample_count for r in records] == [3, 3]
    # documented: an int past float range counts as an infinity, apart from the finite aggregates
    assert records[0].values == {"count": 3, "sum": 3, "mean": 1.5, "inf_count": 1}


# -- 7. threads --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_threads", [2, 4])
def test_concurrent_adds_lose_nothing_and_windows_hold_exactly_n(tmp_path: Path, n_threads: int) -> None:
    per_thread = 200_001  # not a multiple of the window: a partial window is left for the flush
    window = 1000
    with Telemetry(store=tmp_path) as t:
        stat = Stat("shared", ["count", "sum"], samples=window, telemetry=t)
        seen: list[StatWindow] = []
        stat.add_listener(lambda _, record: seen.append(record))
        barrier = threading.Barrier(n_threads)

        def work() -> None:
            add = stat.add
            barrier.wait()
            for _ in range(per_thread):
                add(1)

        threads = [threading.Thread(target=work, name=f"adder-{k}") for k in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(HANG_S * 3)
        assert not any(th.is_alive() for th in threads)
        assert t.flush(HANG_S)
    total = n_threads * per_thread
    counts = [r.sample_count for r in seen]
    assert sum(counts) == total
    assert counts[:-1] == [window] * (total // window) and counts[-1] == total % window
    assert all(r.values["sum"] == r.sample_count == r.values["count"] for r in seen)
    assert [r.sample_count for r in _stored_after_close(t, "shared")] == counts


# -- 8. time() ---------------------------------------------------------------------------------------------------------


def test_time_context_manager_in_seconds_and_milliseconds(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        secs = Stat("secs", ["count", "min"], samples=1, telemetry=t)
        with secs.time():
            time.sleep(0.02)
        assert secs.unit == "s"
        assert 0.02 <= secs.get()["min"] < 60
        ms = Stat("ms", ["count", "min"], samples=1, unit="ms", telemetry=t)
        with ms.time():
            time.sleep(0.02)
        assert 20 <= ms.get()["min"] < 60_000
        ns = Stat("ns", ["min"], samples=1, unit="ns", telemetry=t)
        with ns.time():
            time.sleep(0.001)
        assert ns.get()["min"] >= 1_000_000
        records = {r.name: r for r in _stored(t)}
    assert records["secs"].unit == "s" and records["ms"].unit == "ms" and records["ns"].unit == "ns"


def test_time_decorators_sync_async_and_exceptions(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        stat = Stat("calls", ["count", "min"], unit="ms", telemetry=t)

        @stat.time
        def plain(x: int) -> int:
            """doc"""
            time.sleep(0.01)
            return x + 1

        @stat.time()
        def failing() -> None:
            time.sleep(0.01)
            raise KeyError("boom")

        @stat.time
        async def coro(x: int) -> int:
            await asyncio.sleep(0.01)
            return x * 2

        @stat.time()
        async def coro_failing() -> None:
            await asyncio.sleep(0.01)
            raise RuntimeError("async boom")

        assert plain(1) == 2 and plain.__name__ == "plain" and plain.__doc__ == "doc"
        with pytest.raises(KeyError, match="boom"):
            failing()
        assert asyncio.run(coro(3)) == 6
        assert inspect.iscoroutinefunction(coro)
        with pytest.raises(RuntimeError, match="async boom"):
            asyncio.run(coro_failing())
        got = stat.get()
        assert got["count"] == 4  # the failing calls were timed too
        assert got["min"] >= 10  # ms
        with pytest.raises(TypeError):
            stat.time()(42)  # type: ignore[type-var]


# -- 9. fork -----------------------------------------------------------------------------------------------------------


def _wait_child(pid: int) -> int:
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child hung")


def _by_process(t: Telemetry) -> dict[int, list[StatWindow]]:
    run = open_run(run_dir_of(t))
    return {p.pid: [r for r in p.records if r.kind == "stat"] for p in run.processes}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_parent_and_child_windows_stay_apart(tmp_path: Path) -> None:
    t = Telemetry(identity_from_env(env={}), store=tmp_path)
    with t:
        by_count = Stat("by_count", ["count", "sum"], samples=1000, telemetry=t)
        by_time = Stat("by_time", ["count", "sum"], window=3600, telemetry=t)
        cumulative = Stat("cumulative", ["count", "sum"], telemetry=t)
        idle_time = Stat("idle_time", ["count"], window=0.05, telemetry=t)  # reports empty windows in the parent
        assert idle_time.report_empty
        for stat in (by_count, by_time, cumulative):
            for _ in range(10):
                stat.add(100)  # pending in the parent at the fork
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            code = 1
            try:
                for stat in (by_count, by_time, cumulative):
                    assert stat.count == 0 and stat.get() in ({}, {"count": 0, "sum": 0})
                    for _ in range(3):
                        stat.add(-1)
                time.sleep(0.2)  # several idle_time boundaries pass in the child
                code = 0 if t.flush(HANG_S) else 2
            except BaseException:  # noqa: BLE001 - report; the exit code fails the test
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        assert _wait_child(pid) == 0
        for _ in range(5):
            by_time.add(100)
    records = _by_process(t)
    parent, child = os.getpid(), pid
    assert set(records) == {parent, child}
    mine = {name: [r for r in records[parent] if r.name == name] for name in ("by_count", "by_time", "cumulative")}
    assert [(r.sample_count, r.values["sum"]) for r in mine["by_count"]] == [(10, 1000)]
    assert [(r.sample_count, r.values["sum"]) for r in mine["by_time"]] == [(15, 1500)]
    assert [(r.sample_count, r.values["sum"]) for r in mine["cumulative"]] == [(10, 1000)]
    theirs = {r.name: r for r in records[child]}
    for name in ("by_count", "by_time", "cumulative"):
        assert (theirs[name].sample_count, theirs[name].values["sum"]) == (3, -3), name
        assert theirs[name].identity.pid == child
    assert "idle_time" not in theirs  # a stat the child never used writes no (empty) window there


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_that_never_adds_writes_no_cumulative_record(tmp_path: Path) -> None:
    t = Telemetry(identity_from_env(env={}), store=tmp_path)
    with t:
        cumulative = Stat("cumulative", ["count"], telemetry=t)
        cumulative.add(1)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = 0 if t.flush(HANG_S) else 2
            finally:
                os._exit(code)
        assert _wait_child(pid) == 0
    records = _by_process(t)
    assert [r.sample_count for r in records[os.getpid()]] == [1]
    assert records.get(pid, []) == []


def test_dataloader_workers_report_their_own_windows(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    n = 40
    t = Telemetry(identity_from_env(env={}), store=tmp_path)
    with t:
        fetched = Stat("fetched", ["count", "sum", "min", "max"], window=3600, telemetry=t)
        unused = Stat("unused", ["count"], window=0.05, telemetry=t)
        for _ in range(5):
            fetched.add(-1000)  # pending in the parent while the workers fork

        class Items(torch.utils.data.Dataset):  # type: ignore[misc, name-defined]  # (a base from pytest.importorskip's module object: Any to mypy)
            def __len__(self) -> int:
                return n

            def __getitem__(self, index: int) -> Any:
                fetched.add(index)
                return torch.tensor([index])

        loader = torch.utils.data.DataLoader(Items(), batch_size=4, num_workers=2, multiprocessing_context="fork")
        seen = sorted(int(x) for batch in loader for x in batch)
        del loader
        assert seen == list(range(n))
        del unused
    records = _by_process(t)
    parent = os.getpid()
    assert [(r.sample_count, r.values["sum"]) for r in records[parent] if r.name == "fetched"] == [(5, -5000)]
    workers = [pid for pid in records if pid != parent]
    assert len(workers) == 2
    items: list[int] = []
    for pid in workers:
        names = {r.name for r in records[pid]}
        assert names == {"fetched"}, f"worker {pid} wrote {names}"
        [record] = records[pid]
        assert record.values["min"] >= 0 and record.identity.pid == pid
        items.append(record.sample_count)
    assert sum(items) == n


# -- 10. gauges and the registry ---------------------------------------------------------------------------------------


def test_gauge_is_read_on_its_interval_and_at_flush(tmp_path: Path) -> None:
    reads = {"n": 0}

    def read() -> int:
        reads["n"] += 1
        return reads["n"]

    with Telemetry(store=tmp_path) as t:
        sink = _inline_sink(t, kinds=("metric",))
        gauge = Gauge("queue.depth", read, unit="items", interval=0.02, telemetry=t)
        _wait_until(lambda: len([r for r in sink.records if r.name == "queue.depth"]) >= 3, "three readings")
        gauge.close()
        assert "queue.depth" not in registry(t).names()
        time.sleep(0.05)  # a reading in flight when it was closed has landed by now
        before = len([r for r in sink.records if r.name == "queue.depth"])
        on_demand = Gauge("on.demand", lambda: 2.5, interval=None, telemetry=t)
        assert t.flush()
        time.sleep(0.1)  # five intervals
        assert t.flush()
        assert len([r for r in sink.records if r.name == "queue.depth"]) == before  # closed: not read any more
        assert [r.value for r in sink.records if r.name == "on.demand"] == [2.5, 2.5]
        values = [r.value for r in sink.records if r.name == "queue.depth"]
        assert values == sorted(values) and values[0] >= 1
        assert {(r.group, r.unit) for r in sink.records if r.name == "queue.depth"} == {("gauges", "items")}
        assert on_demand.read() == 2.5 and on_demand.last_value == 2.5
    stored = [r for r in open_run(run_dir_of(t)).records("metric") if r.name == "on.demand"]
    assert [r.value for r in stored] == [2.5, 2.5, 2.5]  # two flushes and the close


def test_failing_gauge_is_counted_warned_once_recorded_and_absent(tmp_path: Path) -> None:
    state = {"fail": True}

    def read() -> float:
        if state["fail"]:
            raise OSError("sensor gone")
        return 1.25

    with Telemetry(store=tmp_path) as t:
        sink = _inline_sink(t, kinds=("metric", "diagnostic"))
        with pytest.warns(TelemetryWarning) as caught:
            gauge = Gauge("temp", read, interval=None, telemetry=t)
            for _ in range(3):
                assert t.flush()
            assert gauge.read() is None
        mine = [w for w in caught if "temp" in str(w.message)]
        assert len(mine) == 1 and "OSError" in str(mine[0].message) and "sensor gone" in str(mine[0].message)
        assert gauge.errors == 4
        assert not [r for r in sink.records if r.kind == "metric" and r.name == "temp"]  # absent, never 0
        [diag] = [r for r in sink.records if r.kind == "diagnostic" and r.name == "gauge_error"]
        assert isinstance(diag, Diagnostic) and diag.sink == "temp" and "sensor gone" in diag.message
        state["fail"] = False  # it reads again
        assert t.flush()
        assert [r.value for r in sink.records if r.kind == "metric" and r.name == "temp"] == [1.25]
    stored = open_run(run_dir_of(t)).records("diagnostic")
    assert [r.sink for r in stored if r.name == "gauge_error"] == ["temp"]


@pytest.mark.parametrize("value", ["12", b"1", [1.0], {"a": 1}], ids=repr)
def test_gauge_returning_a_non_number_is_an_error(tmp_path: Path, value: Any) -> None:
    import torch

    with Telemetry(store=tmp_path) as t, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sink = _inline_sink(t, kinds=("metric",))
        gauge = Gauge("odd", lambda: value, interval=None, telemetry=t)
        tensor_gauge = Gauge("tensor", lambda: torch.tensor(3.0), interval=None, telemetry=t)
        assert gauge.read() is None and tensor_gauge.read() is None
        assert t.flush()
        assert gauge.errors == 2 and tensor_gauge.errors == 2
        assert not sink.records
        assert len([w for w in caught if issubclass(w.category, TelemetryWarning)]) == 2
        fine = Gauge("fine", lambda: np.float32(0.5), interval=None, telemetry=t)
        none = Gauge("none", lambda: None, interval=None, telemetry=t)
        assert fine.read() == 0.5 and none.read() is None and none.errors == 0


def test_registry_get_find_names_snapshot(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        reg = registry(t)
        assert registry(t) is reg and len(reg) == 0
        a = Stat("train.loss", ["count", "mean"], samples=2, telemetry=t)
        b = Stat("train.lr", ["value"], telemetry=t)
        c = Stat("eval.acc", ["mean"], samples=1, telemetry=t)
        g = Gauge("train.mem", lambda: 42, interval=None, telemetry=t)
        a.add(1.0)
        a.add(3.0)
        b.add(0.1)
        assert reg.names() == ["eval.acc", "train.loss", "train.lr", "train.mem"]
        assert reg.get("train.loss") is a and reg.get("train.mem") is g and reg.get("nope") is None
        assert "eval.acc" in reg and "nope" not in reg and len(reg) == 4
        assert reg.find("train.") == [a, b, g]
        assert reg.find() == [c, a, b, g]
        assert reg.stats == [a, b, c] and reg.gauges == [g]
        assert reg.snapshot("train.") == {"train.loss": {"count": 2, "mean": 2.0}, "train.lr": {"value": 0.1},
                                          "train.mem": 42}
        assert reg.snapshot("eval") == {"eval.acc": {}}
        newer = Stat("train.loss", ["count"], samples=5, telemetry=t)
        assert reg.get("train.loss") is newer  # the newest of the same name
        with pytest.raises(TypeError):
            reg.find(3)  # type: ignore[arg-type]
        g.close()
        assert "train.mem" not in reg.names()
    other = Telemetry(store=False)
    with other:
        assert registry(other).names() == []


def test_garbage_collected_stat_leaves_the_registry_and_reports_its_window(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        sink = _inline_sink(t)
        stat = Stat("temporary", ["count", "sum"], window=3600, telemetry=t)
        keep = Stat("kept", ["count"], window=3600, telemetry=t)
        for i in range(4):
            stat.add(i)
        assert "temporary" in registry(t).names()
        del stat
        gc.collect()
        assert registry(t).names() == ["kept"]
        [record] = _stat_records(sink.records, "temporary")
        assert record.sample_count == 4 and record.values == {"count": 4, "sum": 6}
        assert keep.count == 0
    assert [r.sample_count for r in _stored_after_close(t, "temporary")] == [4]


# -- 11. the collector thread ------------------------------------------------------------------------------------------


def test_collector_thread_leaves_after_close(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        stat = Stat("windowed", window=0.05, telemetry=t)
        gauge = Gauge("g", lambda: 1, interval=0.05, telemetry=t)
        stat.add(1.0)
        assert len(_collector_threads()) == 1
        assert gauge.interval == 0.05
    assert stat.closed
    _wait_until(lambda: not _collector_threads(), "the collector thread to leave", timeout=HANG_S)
    # a fresh Telemetry starts it again, and it leaves again
    with Telemetry(store=tmp_path) as t2:
        again = Stat("again", window=0.05, telemetry=t2)
        again.add(1.0)
        assert len(_collector_threads()) == 1
    _wait_until(lambda: not _collector_threads(), "the collector thread to leave again", timeout=HANG_S)


def test_no_collector_thread_without_timed_work(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        Stat("counted", samples=10, telemetry=t).add(1.0)
        Stat("cumulative", telemetry=t).add(1.0)
        Gauge("on_demand", lambda: 1, interval=None, telemetry=t)
        assert not _collector_threads()


@pytest.mark.parametrize("window", [None, 600.0])
def test_pending_samples_stay_below_a_batch(tmp_path: Path, window: float | None) -> None:
    """Memory bound: the adding thread folds every BATCH samples, so fewer than BATCH ever wait."""
    from telemetrain.stats.stat import BATCH

    with Telemetry(store=tmp_path) as t:
        stat = Stat("appended", ["count", "sum"], window=window, telemetry=t)
        for i in range(5 * BATCH + 7):
            stat.add(float(i))
            assert len(stat._buf) < BATCH
        assert stat.count == 5 * BATCH + 7
        stat.flush()
        assert stat.get()["sum"] == sum(range(5 * BATCH + 7))


def test_collector_leaves_when_its_stats_are_garbage_collected(tmp_path: Path) -> None:
    with Telemetry(store=tmp_path) as t:
        stat = Stat("short_lived", window=3600, telemetry=t)
        assert len(_collector_threads()) == 1
        del stat
        gc.collect()
        _wait_until(lambda: not _collector_threads(), "the collector to drop its last task")


# -- 12. property: merge of two parts equals the whole -----------------------------------------------------------------

PROPERTY = settings(
    max_examples=int(os.environ.get("TELEMETRAIN_FUZZ_EXAMPLES") or 150),
    derandomize=os.environ.get("TELEMETRAIN_FUZZ_EXAMPLES") is None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# finite magnitudes bounded so that no partial sum overflows (an overflow to inf depends on the order of the sum)
samples = st.lists(
    st.one_of(
        st.floats(min_value=-1e300, max_value=1e300, allow_nan=False),
        st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 0]),
        st.integers(min_value=-(2**53), max_value=2**53),  # samples are aggregated as floats: exact up to 2**53
    ),
    max_size=60,
)


@PROPERTY
@given(values=samples, cut=st.integers(min_value=0, max_value=60))
def test_property_merge_of_two_parts_equals_the_whole(values: list[float], cut: int) -> None:
    cut = min(cut, len(values))
    whole = Summary.of(values)
    merged = Summary.of(values[:cut]).merge(Summary.of(values[cut:]))
    finite = [v for v in values if math.isfinite(v)]
    for part in ("count", "finite", "nan_count", "inf_count", "min", "max"):
        assert getattr(merged, part) == getattr(whole, part), part
    assert (merged.count, merged.finite) == (len(values), len(finite))
    assert merged.nan_count == sum(1 for v in values if v != v)
    if finite:
        assert merged.min == min(finite) and merged.max == max(finite)
        scale = math.fsum(abs(v) for v in finite)
        assert abs(merged.sum - whole.sum) <= 1e-9 * scale
        assert abs(merged.sum - math.fsum(finite)) <= 1e-9 * scale
        assert merged.quantiles([0.0, 0.5, 1.0]) == whole.quantiles([0.0, 0.5, 1.0])
    else:
        assert merged.min is None and merged.max is None and merged.quantiles([0.5]) == [None]
    if values:
        assert merged.last is values[-1]
    # and through the wire format
    wire = json.dumps(merged.to_dict())
    assert json.dumps(Summary.from_dict(json.loads(wire)).to_dict()) == wire


def test_absorb_equals_merge() -> None:
    """absorb() (in place, growing its own histogram) computes what merge() does."""
    import random as _random

    rng = _random.Random(7)
    parts = [[rng.lognormvariate(0, 1.5) for _ in range(rng.randrange(1, 3000))] for _ in range(6)]
    merged = Summary()
    absorbed = Summary()
    for part in parts:
        merged = merged.merge(Summary.of(part))
        absorbed.absorb(Summary.of(part))
    qs = [0.0, 0.1, 0.5, 0.9, 0.99, 1.0]
    assert absorbed.count == merged.count and absorbed.sum == merged.sum
    assert absorbed.min == merged.min and absorbed.max == merged.max
    assert absorbed.quantiles(qs) == merged.quantiles(qs)
    assert absorbed.histogram_dict() == merged.histogram_dict()
