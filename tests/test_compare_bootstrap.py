"""compare's bootstrap on NumPy arrays gives the interval of the loop over ``Random.choices``, to the last bit."""

from __future__ import annotations

import math
import random

import pytest

from telemetrain.analysis import compare_bootstrap
from telemetrain.analysis.compare_bootstrap import bootstrap_ratio, bootstrap_ratio_python

pytest.importorskip("numpy")


def _values(rng: random.Random, kind: int, n: int) -> list[float]:
    if kind == 0:
        return [rng.lognormvariate(-2.0, 0.3) for _ in range(n)]  # window times
    if kind == 1:
        return [float(rng.randint(0, 3)) for _ in range(n)]  # ties, and zero medians in many resamples
    if kind == 2:
        return [float(rng.randint(0, 1)) for _ in range(n)]  # a zero baseline median every other resample
    if kind == 3:
        return [rng.gauss(0.0, 1.0) for _ in range(n)]  # negative medians
    return [rng.lognormvariate(0.0, 3.0) * 1e-300 for _ in range(n)]  # ratios that overflow to inf


@pytest.mark.parametrize("kind", range(5))
def test_the_arrays_give_the_loops_interval(kind: int) -> None:
    rng = random.Random(kind)
    for _ in range(24):
        c = _values(rng, kind, rng.choice([1, 2, 3, 7, 50, 199, 200, rng.randint(1, 220)]))
        b = _values(rng, kind, rng.choice([1, 2, 3, 8, 51, 199, 200, rng.randint(1, 220)]))
        seed = rng.choice([0, 1, -7, 2**32, 2**64 + 3, rng.getrandbits(40)])
        resamples = rng.choice([100, 251, 2000])
        confidence = rng.choice([0.5, 0.9, 0.95, 0.99])
        loop = bootstrap_ratio_python(c, b, confidence=confidence, resamples=resamples, seed=seed)
        arrays = bootstrap_ratio(c, b, confidence=confidence, resamples=resamples, seed=seed)
        assert repr(arrays) == repr(loop), (len(c), len(b), seed, resamples, confidence)


def test_the_seed_decides_the_interval() -> None:
    rng = random.Random(5)
    c, b = _values(rng, 0, 200), _values(rng, 0, 200)
    first = bootstrap_ratio(c, b, seed=1)
    assert bootstrap_ratio(c, b, seed=1) == first  # deterministic
    assert bootstrap_ratio(c, b, seed=2) != first  # and the seed matters
    ratio, low, high = first
    assert low <= ratio <= high and 0.8 < low < high < 1.25


def test_without_numpy_or_with_non_finite_values_the_loop_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(9)
    c, b = _values(rng, 0, 120), _values(rng, 0, 90)
    with_arrays = bootstrap_ratio(c, b, seed=3)
    monkeypatch.setattr(compare_bootstrap, "_numpy", lambda: None)
    assert bootstrap_ratio(c, b, seed=3) == with_arrays
    monkeypatch.undo()
    nonfinite = [*c[:-1], math.inf]
    assert bootstrap_ratio(nonfinite, b, seed=3) == bootstrap_ratio_python(nonfinite, b, confidence=0.95,
                                                                            resamples=2000, seed=3)
    with pytest.raises(ValueError, match="both sides"):
        bootstrap_ratio([], b)
