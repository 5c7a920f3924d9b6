"""Fuzzed inputs: whatever a caller passes, the call either records it faithfully or raises a clear TypeError or
ValueError, and nothing else that was recorded is lost."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import telemetrain
from conftest import as_default, run_dir_of
from telemetrain import metrics
from telemetrain.store import open_run

# By default the same 60 examples every run (CI must not fail on a counterexample nobody has seen yet); to explore,
# TELEMETRAIN_FUZZ_EXAMPLES=2000 draws that many fresh ones per test.
_EXPLORE = os.environ.get("TELEMETRAIN_FUZZ_EXAMPLES")
FUZZ = settings(
    max_examples=int(_EXPLORE or 60),
    derandomize=_EXPLORE is None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

names = st.text(min_size=1, max_size=40)  # any unicode, control characters and lone surrogates included
floats = st.floats(allow_nan=True, allow_infinity=True)
numbers = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), floats, st.booleans())
leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**64), max_value=2**64), floats, st.text(max_size=20)
)
attr_values = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)
attributes = st.dictionaries(st.text(min_size=1, max_size=12), attr_values, max_size=5)
TAGS = ({"$float": "NaN"}, {"$float": "Infinity"}, {"$float": "-Infinity"})  # reserved in attributes (docs/format.md)


def no_reserved_tag(value: Any) -> bool:
    if isinstance(value, dict):
        return value not in TAGS and all(no_reserved_tag(v) for v in value.values())
    if isinstance(value, list):
        return all(no_reserved_tag(v) for v in value)
    return True


def same(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN, at any depth."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _fresh(tmp_path: Path) -> telemetrain.Telemetry:
    return telemetrain.Telemetry(telemetrain.identity_from_env(env={}), store=tmp_path)


@FUZZ
@given(group=names, name=names, value=numbers, step=st.one_of(st.none(), st.integers(0, 2**40)))
def test_any_metric_round_trips_exactly(
    tmp_path_factory: pytest.TempPathFactory, group: str, name: str, value: Any, step: Any
) -> None:
    t = _fresh(tmp_path_factory.mktemp("m"))
    try:
        t.metric("before", 1, "fence")
        t.metric(name, value, group, step=step)
        t.metric("after", 2, "fence")
        assert t.flush()
        assert t.health()["failed"] == 0
    finally:
        t.close()
    records = open_run(run_dir_of(t)).records()
    assert [r.name for r in records] == ["before", name, "after"]
    got = records[1]
    assert (got.group, got.step) == (group, step)
    # an integer past the 64-bit range comes back as a float, as the columnar copy stores it (store.codec)
    wide = type(value) is int and not -(2**63) <= value < 2**63
    assert same(got.value, float(value) if wide else value)


@FUZZ
@given(name=names, attrs=attributes.filter(no_reserved_tag), severity=st.sampled_from(telemetrain.records.SEVERITIES))
def test_any_event_round_trips_exactly(
    tmp_path_factory: pytest.TempPathFactory, name: str, attrs: dict[str, Any], severity: str
) -> None:
    t = _fresh(tmp_path_factory.mktemp("e"))
    try:
        t.event(name, attrs, severity=severity)
        t.metric("after", 2, "fence")
        assert t.flush()
    finally:
        t.close()
    records = open_run(run_dir_of(t)).records()
    assert [r.kind for r in records] == ["event", "metric"]
    got = records[0]
    assert (got.name, got.severity) == (name, severity)
    # JSON has no tuples: they come back as lists; everything else exactly, NaN and infinities included
    assert same(got.attributes or {}, attrs)


junk = st.one_of(
    st.text(max_size=5),
    st.binary(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.just(None),
    st.just(object()),
    st.complex_numbers(allow_nan=False),
    numbers,
)


@FUZZ
@given(name=st.one_of(names, junk), value=junk, group=st.one_of(names, junk))
def test_put_metric_accepts_numbers_and_rejects_the_rest_clearly(
    tmp_path_factory: pytest.TempPathFactory, name: Any, value: Any, group: Any
) -> None:
    t = _fresh(tmp_path_factory.mktemp("p"))
    with as_default(t):
        try:
            metrics.put_metric(name, value, group)
            accepted = True
        except (TypeError, ValueError) as exc:
            accepted = False
            assert any(arg in str(exc) for arg in ("metric_name", "metric_value", "metric_group")), exc
        metrics.put_metric("after", 1, "fence")  # a rejected call loses nothing else
        assert t.flush()
    valid = (
        isinstance(name, str)
        and name != ""
        and isinstance(group, str)
        and group != ""
        and isinstance(value, (int, float))  # bool is an int
    )
    assert accepted == valid, (name, value, group)
    recorded = [r.name for r in open_run(run_dir_of(t)).records()]
    assert recorded == ([name, "after"] if valid else ["after"])


def test_an_unencodable_value_costs_only_itself(tmp_path: Path) -> None:
    """An int past Python's 4300-digit str limit cannot be written as JSON; the batch around it still is."""
    t = _fresh(tmp_path)
    try:
        t.metric("before", 1)
        t.metric("huge", 10**5000)
        t.metric("after", 2)
        assert t.flush()
        assert t.health()["failed"] == 0
    finally:
        t.close()
    records = open_run(run_dir_of(t)).records()
    assert [(r.kind, r.name) for r in records] == [
        ("metric", "before"),
        ("diagnostic", "unencodable"),
        ("metric", "after"),
    ]
    assert "'huge'" in records[1].message and "ValueError" in records[1].message


def test_a_dict_that_only_looks_like_a_nan_tag_is_kept(tmp_path: Path) -> None:
    """Found by the fuzz test above: ``{"$float": None}`` was taken for a NaN tag and the whole event was lost."""
    t = _fresh(tmp_path)
    odd = {"a": {"$float": None}, "b": {"$float": "nan"}, "c": {"$float": 1.5, "x": 2}, "d": float("nan")}
    try:
        t.event("odd", odd)
        assert t.flush()
    finally:
        t.close()
    [got] = open_run(run_dir_of(t)).records()
    assert same(got.attributes, odd)
