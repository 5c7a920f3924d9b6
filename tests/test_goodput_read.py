"""Goodput's reading of one process's records (``goodput_read.read_records``): of the spans of which there is one per
iteration it keeps only what goodput reads, with the answers of the whole spans (the SQL path hands the same function
its rows, so both paths build these objects)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from telemetrain.training.goodput import _warmup_seconds
from telemetrain.training.goodput_read import _Loop, _Process, _Span, read_records
from telemetrain.training.goodput_windows import _Window

LOOP, ITER, DATA, SAVE = "training_loop", "training_single_iteration", "data_loading", "checkpoint_save_sync"


def start(name: str, span_id: str, parent: str, ns: int, **attributes: Any) -> SimpleNamespace:
    return SimpleNamespace(group="training", kind="span_start", name=name, span_id=span_id, parent_id=parent,
                           wall_ns=ns, status=None, attributes=attributes or None)


def end(name: str, span_id: str, ns: int, status: str = "ok") -> SimpleNamespace:
    return SimpleNamespace(group="training", kind="span_end", name=name, span_id=span_id, parent_id="", wall_ns=ns,
                           status=status, attributes=None)


def report(iterations: int, current: int) -> SimpleNamespace:
    """A window of warm-up iterations only (no iteration time reported)."""
    return SimpleNamespace(group="training", kind="event", name="training_metrics_update", span_id="", parent_id="",
                           wall_ns=0, status=None,
                           attributes={"current_iteration": current, "window_iterations": iterations})


def read(*records: SimpleNamespace) -> _Process:
    return read_records(records, 0, 1, 0)


def pairs(loop: _Loop) -> list[tuple[int, int]]:
    t = loop.iteration_times
    return [(t[i], t[i + 1]) for i in range(0, len(t), 2)]


def test_a_loop_keeps_its_ok_iterations_times_in_the_order_of_their_starts() -> None:
    p = read(
        start(LOOP, "L", "", 100, train_iterations_start=3),
        start(ITER, "a", "L", 110),
        start(ITER, "b", "L", 120),
        end(ITER, "b", 125),  # ends before a, which started first
        end(ITER, "a", 140),
        end(ITER, "a", 999),  # a second end: passed over
        start(ITER, "c", "L", 150),
        end(ITER, "c", 160, "error"),  # not ok: left out
        end(ITER, "d", 175),  # its end before its start (the tracer's tick): the end counts
        start(ITER, "d", "L", 170),
        start(ITER, "e", "L", 180),  # never ends: left out
        start(ITER, "f", "L", 190),
        start(ITER, "f", "L", 200),  # the same id again: the second start is the one its end ends
        end(ITER, "f", 195),  # (before that start: the span lasts 0 ns)
        start(ITER, "g", "other", 210),  # not a child of the loop: not its iteration
        end(ITER, "g", 220),
        end(LOOP, "L", 300),
    )
    (loop,) = p.loops
    assert loop.start == 3 and loop.span.attributes == {"train_iterations_start": 3}
    assert pairs(loop) == [(110, 140), (120, 125), (170, 175), (200, 200)]
    # the iteration spans' starts and ends are lifecycle timestamps (an end read before its start is not one)
    assert (p.first_ns, p.last_ns) == (100, 300)
    assert [s.name for s in p.spans] == [LOOP]  # iteration spans are not kept as spans


def test_the_warm_up_is_the_earliest_iterations_ties_in_file_order() -> None:
    p = read(
        start(LOOP, "L", "", 100),
        start(ITER, "a", "L", 200),
        start(ITER, "b", "L", 110),  # the earliest start
        start(ITER, "c", "L", 200),  # the same start as a, later in the file
        end(ITER, "c", 203),
        end(ITER, "b", 111),
        end(ITER, "a", 207),
        report(3, 2),
    )
    (loop,) = p.loops
    assert _warmup_seconds(loop, 2) == ((1 + 7) / 1e9, None)  # b, then a (not c)
    assert _warmup_seconds(loop, 3) == ((1 + 7 + 3) / 1e9, None)


@pytest.mark.parametrize(("parent", "outside"), [("i", False), ("L", True)])
def test_data_loading_is_outside_when_its_parent_is_no_iteration(parent: str, outside: bool) -> None:
    p = read(
        start(LOOP, "L", "", 100),
        start(DATA, "d", parent, 105),  # before its parent iteration's start in the file
        end(DATA, "d", 108),
        start(ITER, "i", "L", 110),
        end(ITER, "i", 120),
    )
    assert p.data_outside is outside
    assert p.spans == [p.loops[0].span] and (p.first_ns, p.last_ns) == (100, 120)


def test_the_phase_spans_are_kept_whole_without_their_attributes() -> None:
    p = read(
        start(SAVE, "s", "", 10, checkpoint="x"),
        end(SAVE, "s", 20, "error"),
        end(SAVE, "s", 30),  # a second end: passed over
    )
    assert p.spans == [_Span(SAVE, "s", "", 10, 20, "error")]
    assert dict(p.spans[0].attributes) == {}
    with pytest.raises(TypeError):  # shared by every such span: read-only
        p.spans[0].attributes["k"] = 1  # type: ignore[index]


def test_the_lifecycle_objects_have_no_dict() -> None:
    """A rank of a long run holds tens of thousands of windows: slots, no per-object dict."""
    window = _Window(1, 1, 1, 0.0, None, 0.0, 0.0, False)
    for obj in (window, read(start(LOOP, "L", "", 1)), read(start(LOOP, "L", "", 1)).loops[0]):
        assert not hasattr(obj, "__dict__")
