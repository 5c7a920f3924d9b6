"""``training.goodput_windows.WindowList``: a loop's windows packed, read back as the same ``_Window``s."""

from __future__ import annotations

import math

from telemetrain.training.goodput_read import _Loop, _Span
from telemetrain.training.goodput_windows import WindowList, _Window


def test_windows_read_back_equal_field_for_field_in_order() -> None:
    windows = [
        _Window(51, 50, 49, 4.9, 0.1, 0.5, 5.2, False),
        _Window(101, 50, 50, 5.0, None, 0.0, 5.0, False, energy_J=1234.5),
        _Window(151, 50, 50, 5.1, -0.0, 0.25, 5.3, True, energy_J=0.0),
        _Window(-(2 ** 63), 2 ** 63 - 1, 0, 1e308, 5e-324, -1.5, 0.0, False, energy_J=None),
    ]
    packed = WindowList(windows)
    assert len(packed) == 4 and packed and list(packed) == windows and packed == windows
    got = list(packed)
    assert got[1].avg_sec is None and got[0].energy_J is None and got[1].energy_J == 1234.5 and got[2].final
    assert got[2].avg_sec is not None and math.copysign(1.0, got[2].avg_sec) == -1.0  # the sign of zero kept
    assert [type(w.completed) for w in got] == [int] * 4 and all(type(w.total_sec) is float for w in got)


def test_a_window_past_64_bits_is_kept_as_it_is() -> None:
    huge = _Window(10 ** 30 + 1, 50, 50, 5.0, 0.1, 0.0, 5.0, False)
    packed = WindowList([_Window(51, 50, 50, 5.0, 0.1, 0.0, 5.0, False)])
    packed.append(huge)
    packed.append(_Window(101, 50, 50, 5.0, 0.1, 0.0, 5.0, True))
    got = list(packed)
    assert got[1] is huge and got[1].completed == 10 ** 30 + 1 and [w.completed for w in got] == [51, 10 ** 30 + 1, 101]


def test_a_loop_starts_with_no_windows_and_lists_compare_equal() -> None:
    loop = _Loop(span=_Span("", "", "", 0, 0), start=0, index=0)
    assert isinstance(loop.windows, WindowList) and not loop.windows and loop.windows == []
    loop.windows.append(_Window(1, 1, 1, 0.0, None, 0.0, 0.0, False))
    assert loop.windows == [_Window(1, 1, 1, 0.0, None, 0.0, 0.0, False)]
    assert loop.windows != [_Window(1, 1, 1, 0.0, 0.5, 0.0, 0.0, False)] and loop.windows != "x"
