"""``report.packed_windows.PackedWindows``: a rank's report windows packed, read back as the same ``Window``s."""

from __future__ import annotations

import math

import pytest

from telemetrain.report.model import PHASES, Window
from telemetrain.report.packed_windows import PackedWindows


def _window(i: int, **overrides: object) -> Window:
    fields: dict[str, object] = dict(
        rank=3, iteration=100 * i + 99, wall_ns=1_700_000_000_000_000_000 + i, iterations=100, avg=0.25 + i,
        p50=0.2, p90=0.3, p99=0.4, max=1.5, total=25.0, samples_per_second=4096.0,
        phases={"forward": 0.1, "backward": 0.12}, phase_source="host", phase_avg=None)
    fields.update(overrides)
    return Window(**fields)  # type: ignore[arg-type]


def test_windows_read_back_equal_field_for_field() -> None:
    windows = [
        _window(0),
        _window(1, avg=None, p50=None, p90=None, p99=None, max=None, total=None, samples_per_second=None),
        _window(2, phases={p: float(k) for k, p in enumerate(PHASES)}, phase_source="device", phase_avg=0.33),
        _window(3, phases={}, iterations=0, avg=-0.0),
        _window(4, iteration=None, wall_ns=None),  # (a row without them: kept as None, not as 0)
        _window(5, iteration=-(2 ** 63), wall_ns=2 ** 63 - 1, total=1e308, p99=5e-324),
    ]
    packed = PackedWindows(3, windows)
    assert len(packed) == 6 and packed.nbytes() == 6 * 136
    assert list(packed) == windows and packed == windows and windows == list(packed)
    for i, w in enumerate(windows):
        got = packed[i]
        assert got == w and got.phases == w.phases and type(got.iterations) is int
        assert [type(getattr(got, f)) for f in ("avg", "p50")] == [type(getattr(w, f)) for f in ("avg", "p50")]
    assert packed[-1] == windows[-1] and packed[1:5:2] == windows[1:5:2] and packed[10:] == []
    zero = packed[3].avg
    assert zero is not None and zero == 0.0 and math.copysign(1.0, zero) == -1.0  # the sign of zero kept


def test_nan_and_infinities_are_data_not_none() -> None:
    w = _window(0, avg=math.nan, max=math.inf, p50=-math.inf, phases={"forward": math.nan})
    got = PackedWindows(3, [w])[0]
    assert got.avg is not None and math.isnan(got.avg) and got.max == math.inf and got.p50 == -math.inf
    assert set(got.phases) == {"forward"} and math.isnan(got.phases["forward"])


def test_a_window_of_another_rank_or_an_unknown_phase_is_refused_and_nothing_is_added() -> None:
    packed = PackedWindows(3, [_window(0)])
    with pytest.raises(ValueError, match="rank 4"):
        packed.append(_window(1, rank=4))
    with pytest.raises(ValueError, match="warmup"):
        packed.append(_window(1, phases={"warmup": 1.0}))
    assert len(packed) == 1 and packed.nbytes() == 136
    with pytest.raises(IndexError):
        packed[1]
    with pytest.raises(IndexError):
        packed[-2]


def test_sequences_of_other_windows_are_not_equal() -> None:
    packed = PackedWindows(3, [_window(0), _window(1)])
    assert packed != [_window(0)] and packed != [_window(0), _window(2)] and packed != "ab"
    assert packed == PackedWindows(3, [_window(0), _window(1)])
    assert PackedWindows(3) == [] and not PackedWindows(3)
