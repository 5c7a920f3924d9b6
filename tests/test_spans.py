"""Spans: nesting and ids in the run store, attributes, linked events, error status, the decorator (sync, async,
concurrent asyncio tasks), threads, per-name sampling (parent-based; failures exported anyway), ``on_end``
listeners, the ``start()``/``end()`` callback style, misuse, and spans left open at exit or SIGTERM (subprocesses).

Durations are checked against the span's own clock readings or explicit ``start_ns``/``end_ns``, never against a
wall-clock expectation.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import telemetrain
from conftest import run_dir_of, run_helper_process
from telemetrain import Telemetry, TelemetryWarning
from telemetrain.spans import Span, current_span, span, tracer
from telemetrain.store import open_run

HANG_S = 20.0  # only a hang gets near it
TESTS = Path(__file__).parent
SESSION = "spans"
SPAN_ID = re.compile(r"^[0-9a-f]{16}$")
TRACE_ID = re.compile(r"^[0-9a-f]{32}$")


# -- helpers -----------------------------------------------------------------------------------------------------------


def _of(records: list[Any], kind: str, name: str | None = None) -> list[Any]:
    return [r for r in records if r.kind == kind and (name is None or r.name == name)]


def _one(records: list[Any], kind: str, name: str) -> Any:
    found = _of(records, kind, name)
    assert len(found) == 1, f"{len(found)} {kind} records named {name!r}: {found}"
    return found[0]


def _by_id(records: list[Any], kind: str) -> dict[str, Any]:
    return {r.span_id: r for r in records if r.kind == kind}


# -- nesting, ids, attributes, events ----------------------------------------------------------------------------------


def test_nesting_gives_parent_and_trace_ids_in_the_store(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    with span("root") as root:
        with span("child") as child:
            with span("grandchild") as grandchild:
                assert current_span() is grandchild
            assert current_span() is child
        with span("sibling") as sibling:
            pass
        assert current_span() is root
    assert current_span() is None
    with span("other_root") as other_root:
        pass

    records = read_run(telemetry)
    starts = {r.name: r for r in _of(records, "span_start")}
    ends = {r.name: r for r in _of(records, "span_end")}
    assert set(starts) == set(ends) == {"root", "child", "grandchild", "sibling", "other_root"}
    for name, s in (("root", root), ("child", child), ("grandchild", grandchild), ("sibling", sibling),
                    ("other_root", other_root)):
        assert SPAN_ID.match(starts[name].span_id) and starts[name].span_id != "0" * 16
        assert TRACE_ID.match(starts[name].trace_id)
        assert starts[name].span_id == ends[name].span_id == s.span_id_hex
        assert starts[name].trace_id == s.trace_id_hex
        assert ends[name].status == "ok" and ends[name].error == ""
        # the end record's duration is the span's own, and its times are the start record's and the end record's
        assert ends[name].duration_ns == s.duration_ns == ends[name].mono_ns - starts[name].mono_ns > 0
    assert starts["root"].parent_id == "" and starts["other_root"].parent_id == ""
    assert starts["child"].parent_id == starts["root"].span_id
    assert starts["grandchild"].parent_id == starts["child"].span_id
    assert starts["sibling"].parent_id == starts["root"].span_id
    assert child.parent is root and grandchild.parent_id == child.span_id
    # a root and all its descendants share one trace id; another root starts another trace
    assert {starts[n].trace_id for n in ("root", "child", "grandchild", "sibling")} == {starts["root"].trace_id}
    assert starts["other_root"].trace_id != starts["root"].trace_id
    assert len({r.span_id for r in starts.values()}) == 5
    # a child lies within its parent
    assert starts["root"].mono_ns <= starts["child"].mono_ns <= ends["grandchild"].mono_ns <= ends["child"].mono_ns
    assert ends["sibling"].mono_ns <= ends["root"].mono_ns


def test_attributes_at_start_and_set_later(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    with span("step", lr=0.1, batch=3) as s:
        s.set_attribute("loss", 2.5)
        s.set_attributes({"tokens": 128, "lr": 0.2})  # replacing a start attribute: an update
        s.set_attribute("loss", 1.5)
    with span("plain"):
        pass
    records = read_run(telemetry)
    start, end = _one(records, "span_start", "step"), _one(records, "span_end", "step")
    assert start.attributes == {"lr": 0.1, "batch": 3}
    assert end.attributes == {"loss": 1.5, "tokens": 128, "lr": 0.2}
    assert not _one(records, "span_start", "plain").attributes
    assert not _one(records, "span_end", "plain").attributes


def test_events_are_linked_to_their_span(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    with span("outer") as outer:
        outer.add_event("begin")
        with span("inner", group="custom") as inner:
            inner.add_event("checkpoint", {"step": 3}, severity="warning")
    records = read_run(telemetry)
    begin, checkpoint = _one(records, "event", "begin"), _one(records, "event", "checkpoint")
    assert begin.span_id == outer.span_id_hex == _one(records, "span_start", "outer").span_id
    assert checkpoint.span_id == inner.span_id_hex == _one(records, "span_start", "inner").span_id
    assert checkpoint.attributes == {"step": 3} and checkpoint.severity == "warning"
    assert checkpoint.group == "custom" and _one(records, "span_end", "inner").group == "custom"
    assert begin.group == "spans"


def test_an_exception_gives_status_error_and_is_re_raised(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    with span("outer") as outer:
        with pytest.raises(ValueError, match="boom") as info:
            with span("fails") as failing:
                raise ValueError("boom")
        with pytest.raises(KeyError):
            with span("fails_too"):
                raise KeyError("missing")
    assert info.value.args == ("boom",)
    assert failing.status == "error" and failing.error == "ValueError: boom"
    records = read_run(telemetry)
    end = _one(records, "span_end", "fails")
    assert (end.status, end.error) == ("error", "ValueError: boom")
    assert _one(records, "span_end", "fails_too").error == "KeyError: 'missing'"
    assert (outer.status, _one(records, "span_end", "outer").status) == ("ok", "ok")  # the exception was caught
    assert current_span() is None


# -- the decorator -----------------------------------------------------------------------------------------------------


def test_decorator_on_a_sync_function(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    seen: list[Span | None] = []

    @span("compute", kind="sync")
    def compute(x: int) -> int:
        """Doubles."""
        seen.append(current_span())
        if x < 0:
            raise ArithmeticError("negative")
        return 2 * x

    assert compute.__name__ == "compute" and compute.__doc__ == "Doubles."
    with span("caller") as caller:
        assert [compute(1), compute(2)] == [2, 4]
    with pytest.raises(ArithmeticError, match="negative"):
        compute(-1)
    assert len(seen) == 3 and len({id(s) for s in seen}) == 3  # every call is a new span
    assert all(s is not None and s.name == "compute" for s in seen)
    records = read_run(telemetry)
    starts = _of(records, "span_start", "compute")
    ends = _by_id(records, "span_end")
    assert [s.span_id for s in starts] == [s.span_id_hex for s in seen if s is not None]
    assert all(s.attributes == {"kind": "sync"} for s in starts)
    assert [s.parent_id for s in starts] == [caller.span_id_hex, caller.span_id_hex, ""]
    assert [ends[s.span_id].status for s in starts] == ["ok", "ok", "error"]
    assert ends[starts[2].span_id].error == "ArithmeticError: negative"


def test_decorator_on_async_functions_keeps_concurrent_tasks_apart(
    telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    @span("work")
    async def work(k: int, delays: tuple[float, float]) -> str:
        me = current_span()
        assert me is not None
        me.set_attribute("k", k)
        await asyncio.sleep(delays[0])
        assert current_span() is me  # the other tasks ran in between: still this task's span
        with span("inner", k=k) as inner:
            await asyncio.sleep(delays[1])
            assert current_span() is inner
        assert current_span() is me
        return me.span_id_hex

    async def main() -> tuple[Span, list[str], str]:
        with span("root") as root:
            # interleaved: each task enters and leaves its spans while the others are inside theirs
            ids = await asyncio.gather(work(1, (0.02, 0.0)), work(2, (0.0, 0.02)), work(3, (0.01, 0.01)))
            assert current_span() is root
            with span("parent_of_task") as p:
                task = asyncio.create_task(work(4, (0.0, 0.0)))  # a task inherits the current span
            assert current_span() is root
            own = await task
            return root, list(ids), own + p.span_id_hex

    assert asyncio.iscoroutinefunction(work)
    root, ids, pair = asyncio.run(main())
    records = read_run(telemetry)
    starts = _by_id(records, "span_start")
    ends = _by_id(records, "span_end")
    work_by_k = {ends[i].attributes["k"]: starts[i] for i in starts if starts[i].name == "work"}
    assert sorted(work_by_k) == [1, 2, 3, 4]
    assert [work_by_k[k].span_id for k in (1, 2, 3)] == ids
    assert all(work_by_k[k].parent_id == root.span_id_hex for k in (1, 2, 3))
    assert work_by_k[4].span_id + work_by_k[4].parent_id == pair
    for inner in (s for s in starts.values() if s.name == "inner"):
        assert inner.parent_id == work_by_k[inner.attributes["k"]].span_id
    assert len([s for s in starts.values() if s.name == "inner"]) == 4
    assert {s.trace_id for s in starts.values()} == {root.trace_id_hex}
    assert all(e.status == "ok" for e in ends.values())


# -- threads -----------------------------------------------------------------------------------------------------------


def test_a_span_in_a_new_thread_is_a_root_unless_a_parent_is_given(
    telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    tr = tracer(telemetry)
    got: dict[str, Any] = {}

    def in_thread(main_span: Span) -> None:
        got["current_at_start"] = current_span()
        with span("thread_root") as s:
            got["thread_root"] = s
            child = tr.start("thread_child_of_main", parent=main_span)
            got["current_after_start"] = current_span()
            child.end()
            got["child"] = child

    with span("main") as main_span:
        th = threading.Thread(target=in_thread, args=(main_span,))
        th.start()
        th.join(HANG_S)
        assert current_span() is main_span  # the thread changed nothing here
    assert not th.is_alive()
    assert got["current_at_start"] is None
    assert got["current_after_start"] is got["child"]  # make_current=True: in the thread that started it
    records = read_run(telemetry)
    main_start = _one(records, "span_start", "main")
    thread_root = _one(records, "span_start", "thread_root")
    child = _one(records, "span_start", "thread_child_of_main")
    assert thread_root.parent_id == "" and thread_root.trace_id != main_start.trace_id
    assert child.parent_id == main_start.span_id and child.trace_id == main_start.trace_id


# -- sampling ----------------------------------------------------------------------------------------------------------


def test_sampling_exports_every_nth_and_never_an_orphan(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    tr = tracer(telemetry)
    tr.sample("step", 4)
    ended: list[Span] = []
    tr.on_end("step", ended.append)
    with span("run") as run:
        steps = []
        for i in range(10):
            with span("step", i=i) as s:
                with span("forward") as fwd:
                    fwd.add_event("inside", {"i": i})
                assert fwd.exported == s.exported
            steps.append(s)
    assert [s.exported for s in steps] == [i % 4 == 0 for i in range(10)]
    assert len(ended) == 10 and ended == steps  # the listener sees every span, exported or not
    records = read_run(telemetry)
    step_starts = _of(records, "span_start", "step")
    assert [r.attributes["i"] for r in step_starts] == [0, 4, 8]
    assert len(_of(records, "span_end", "step")) == 3
    exported_steps = {r.span_id for r in step_starts}
    forwards = _of(records, "span_start", "forward")
    assert len(forwards) == 3 and {r.parent_id for r in forwards} == exported_steps
    assert len(_of(records, "span_end", "forward")) == 3
    starts = _by_id(records, "span_start")
    for r in records:  # the parent of every exported span is in the store
        if r.kind == "span_start" and r.parent_id:
            assert r.parent_id in starts
    # an event inside an unexported span is linked to the nearest exported ancestor
    links = {e.attributes["i"]: e.span_id for e in _of(records, "event", "inside")}
    forward_of_step = {starts[f.parent_id].attributes["i"]: f.span_id for f in forwards}
    assert links == {i: forward_of_step.get(i, run.span_id_hex) for i in range(10)}

    tr.sample("step", 1)  # every one again
    with span("step", i=10):
        pass
    assert _of(read_run(telemetry), "span_start", "step")[-1].attributes == {"i": 10}


def test_a_failing_unexported_span_is_exported_with_its_real_start(
    telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    tr = tracer(telemetry)
    tr.sample("step", 3)
    with span("run") as run:
        with span("step", i=0):
            pass  # exported: the first
        with pytest.raises(RuntimeError, match="nan loss"):
            with span("step", i=1) as failing:
                assert not failing.exported
                with span("forward") as fwd:
                    pass  # ended ok: stays unexported
                time.sleep(0.002)
                failing.set_attribute("loss", float("inf"))
                raise RuntimeError("nan loss")
        # callback style, backdated: its start and end are exactly what was given
        t0 = time.monotonic_ns() - 50_000_000
        late = tr.start("step", start_ns=t0, attributes={"i": 2})
        assert not late.exported
        late.end("error", "Timeout: too slow", end_ns=t0 + 12_345_678)
    records = read_run(telemetry)
    starts = {r.attributes["i"]: r for r in _of(records, "span_start", "step")}
    assert sorted(starts) == [0, 1, 2]
    ends = _by_id(records, "span_end")
    start1, end1 = starts[1], ends[starts[1].span_id]
    assert start1.span_id == failing.span_id_hex and start1.parent_id == run.span_id_hex
    assert start1.trace_id == run.trace_id_hex
    assert start1.mono_ns == failing.start_ns < fwd.start_ns  # its real start, not the time it failed
    assert start1.wall_ns - start1.mono_ns == end1.wall_ns - end1.mono_ns  # one clock offset for both
    assert (end1.status, end1.error) == ("error", "RuntimeError: nan loss")
    assert end1.duration_ns == failing.end_ns - failing.start_ns == end1.mono_ns - start1.mono_ns >= 2_000_000
    assert end1.attributes == {"loss": float("inf")}
    assert not _of(records, "span_start", "forward")  # the failure exported its own span, not its children
    start2, end2 = starts[2], ends[starts[2].span_id]
    assert (start2.mono_ns, end2.mono_ns, end2.duration_ns) == (t0, t0 + 12_345_678, 12_345_678)
    assert (end2.status, end2.error) == ("error", "Timeout: too slow")


def test_on_end_listeners_get_every_span_and_never_break_the_code(
    telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    tr = tracer(telemetry)
    tr.sample("tick", 5)
    first: list[tuple[str, int, str]] = []
    second: list[Span] = []
    tr.on_end("tick", lambda s: first.append((s.name, s.duration_ns, s.status)))
    tr.on_end("tick", second.append)
    tr.on_end("tock", lambda s: 1 / 0)  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spans = []
        for _ in range(7):
            with span("tick") as s:
                pass
            spans.append(s)
        for _ in range(3):
            with span("tock"):
                pass  # the listener raises: the traced code does not see it
        with pytest.raises(ValueError):
            with span("tick") as bad:
                raise ValueError("x")
    spans.append(bad)
    assert second == spans
    assert first == [("tick", s.duration_ns, s.status) for s in spans]
    assert first[-1][2] == "error" and all(d > 0 for _, d, _ in first)
    telemetry_warnings = [w for w in caught if issubclass(w.category, TelemetryWarning)]
    assert len(telemetry_warnings) == 1 and "listener" in str(telemetry_warnings[0].message)
    assert len(_of(read_run(telemetry), "span_end", "tock")) == 3


# -- the callback style: start() and end() -----------------------------------------------------------------------------


def test_start_and_end_callback_style(telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    tr = tracer(telemetry)
    with span("outer") as outer:
        cb = tr.start("callback", attributes={"a": 1})
        assert cb.parent is outer and current_span() is cb and not cb.ended
        with span("nested") as nested:
            assert nested.parent is cb
        quiet = tr.start("not_current", make_current=False)
        assert current_span() is cb and quiet.parent is cb
        explicit = tr.start("explicit_child", parent=quiet, make_current=False)
        assert tr.open_spans == [outer, cb, quiet, explicit]  # every open span (with-spans too), oldest first
        explicit.end()
        quiet.end(status="error", error="Cancelled: by user")
        cb.set_attribute("b", 2)
        cb.end()
        cb.end("error", "ignored")  # a second end is ignored
        assert current_span() is outer  # its parent is current again
        assert tr.open_spans == [outer]
        t0 = time.monotonic_ns() - 10_000_000
        backdated = tr.start("backdated", start_ns=t0)
        backdated.end(end_ns=t0 + 1_234_567)
        clamped = tr.start("clamped", start_ns=t0)
        clamped.end(end_ns=t0 - 5)  # before its start: never a negative duration
    records = read_run(telemetry)
    starts = {r.name: r for r in _of(records, "span_start")}
    ends = {r.name: r for r in _of(records, "span_end")}
    assert len(_of(records, "span_end", "callback")) == 1
    assert starts["callback"].attributes == {"a": 1} and ends["callback"].attributes == {"b": 2}
    assert ends["callback"].status == "ok"
    assert starts["callback"].parent_id == outer.span_id_hex
    assert starts["nested"].parent_id == starts["not_current"].parent_id == starts["callback"].span_id
    assert starts["explicit_child"].parent_id == starts["not_current"].span_id
    assert (ends["not_current"].status, ends["not_current"].error) == ("error", "Cancelled: by user")
    assert (starts["backdated"].mono_ns, ends["backdated"].mono_ns) == (t0, t0 + 1_234_567)
    assert ends["backdated"].duration_ns == backdated.duration_ns == 1_234_567
    assert ends["clamped"].duration_ns == 0
    assert current_span() is None


def test_ending_started_spans_out_of_order_never_leaves_an_ended_span_current(
    telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    tr = tracer(telemetry)

    def body() -> None:
        a = tr.start("a")
        b = tr.start("b")
        assert b.parent is a
        a.end()
        assert current_span() is b
        b.end()
        with span("later") as later:
            pass
        assert later.parent is None or not later.parent.ended, f"{later.parent!r} was ended before 'later' started"

    contextvars.copy_context().run(body)  # whatever it leaves current stays in that copy


def test_a_span_is_entered_once(telemetry: Telemetry) -> None:
    s = span("once")
    with s:
        with pytest.raises(RuntimeError, match="once"):
            with s:
                pass
        assert current_span() is s
    with pytest.raises(RuntimeError, match="once"):
        with s:
            pass
    with pytest.raises(RuntimeError, match="decorate"):
        s(lambda: None)
    started = tracer(telemetry).start("started")
    with pytest.raises(RuntimeError, match="started"):
        started.__enter__()
    started.end()
    assert current_span() is None


def _bad_calls() -> list[tuple[str, Callable[[Telemetry], Any], type[Exception], str]]:
    def started(t: Telemetry) -> Span:
        return tracer(t).start("s", make_current=False)

    return [
        ("name int", lambda t: span(3), TypeError, "name"),  # type: ignore[arg-type]
        ("name empty", lambda t: span(""), ValueError, "name"),
        ("group int", lambda t: span("x", group=5), TypeError, "group"),  # type: ignore[arg-type]
        ("group empty", lambda t: span("x", group=""), ValueError, "group"),
        ("sample every 0", lambda t: tracer(t).sample("x", 0), ValueError, "every"),
        ("sample every float", lambda t: tracer(t).sample("x", 2.0), ValueError, "every"),  # type: ignore[arg-type]
        ("sample every bool", lambda t: tracer(t).sample("x", True), ValueError, "every"),
        ("sample name", lambda t: tracer(t).sample(None, 2), TypeError, "name"),  # type: ignore[arg-type]
        ("on_end listener", lambda t: tracer(t).on_end("x", "f"), TypeError, "listener"),  # type: ignore[arg-type]
        ("on_end name", lambda t: tracer(t).on_end("", print), ValueError, "name"),
        ("start parent", lambda t: tracer(t).start("x", parent=object()), TypeError, "parent"),  # type: ignore
        ("start start_ns", lambda t: tracer(t).start("x", start_ns=1.5), TypeError, "start_ns"),  # type: ignore
        ("start attributes", lambda t: tracer(t).start("x", attributes=[("a", 1)]), TypeError, "attributes"),  # type: ignore[arg-type]
        ("start name", lambda t: tracer(t).start(b"x"), TypeError, "name"),  # type: ignore[arg-type]
        ("decorate non-callable", lambda t: span("x")(42), TypeError, "function"),  # type: ignore[type-var]
        ("attribute key", lambda t: span("x").set_attribute(1, 2), TypeError, "key"),  # type: ignore[arg-type]
        ("status value", lambda t: span("x").set_status("fine"), ValueError, "status"),
        ("status error type", lambda t: span("x").set_status("error", 3), TypeError, "error"),  # type: ignore
        ("end status", lambda t: started(t).end("fine"), ValueError, "status"),
        ("add_event severity", lambda t: span("x").add_event("e", severity="loud"), ValueError, "severity"),
    ]


@pytest.mark.parametrize("call, exc, match", [c[1:] for c in _bad_calls()], ids=[c[0] for c in _bad_calls()])
def test_bad_arguments_raise_naming_the_argument(
    telemetry: Telemetry, call: Callable[[Telemetry], Any], exc: type[Exception], match: str
) -> None:
    with pytest.raises(exc, match=match):
        call(telemetry)
    assert current_span() is None


def test_end_with_a_non_int_end_ns_raises(telemetry: Telemetry) -> None:
    s = tracer(telemetry).start("x", make_current=False)
    with pytest.raises(TypeError, match="end_ns"):
        s.end(end_ns=float(s.start_ns + 1000))  # type: ignore[arg-type]


# -- terminated: open at close, at exit, at SIGTERM --------------------------------------------------------------------


def test_spans_open_when_the_telemetry_closes_end_terminated(tmp_path: Path) -> None:
    t = Telemetry(store=tmp_path)
    tr = tracer(t)
    started = tr.start("started", make_current=False)
    with tr.span("outer") as outer:
        with tr.span("inner") as inner:
            t.close()
            assert (inner.status, outer.status, started.status) == ("terminated",) * 3
    records = open_run(run_dir_of(t)).records("span_end")
    assert [(r.name, r.status) for r in records] == [
        ("inner", "terminated"), ("outer", "terminated"), ("started", "terminated")]  # innermost first
    assert all("still open" in r.error for r in records)
    assert tr.open_spans == []


def _run_open_spans_helper(tmp_path: Path, then: str) -> tuple[int | None, list[Any], str]:
    run_id = f"spans-{uuid.uuid4().hex[:8]}"
    code = f"import _proc_helpers as h; h.spans_open_at_exit({str(tmp_path)!r}, {then!r})"
    returncode, path, stderr = run_helper_process(tmp_path, code, run_id, SESSION, sigterm=then == "sleep",
                                                  timeout=HANG_S)
    return returncode, open_run(path).records() if path.is_dir() else [], stderr


def test_sigterm_ends_the_open_spans_terminated(tmp_path: Path) -> None:
    returncode, records, stderr = _run_open_spans_helper(tmp_path, "sleep")
    assert returncode == -signal.SIGTERM, stderr  # it still dies of the signal
    ends = [(r.name, r.status) for r in _of(records, "span_end")]
    assert ends == [("closed_before", "ok"), ("inner", "terminated"), ("outer", "terminated"),
                    ("started_open", "terminated")], stderr
    starts = {r.name: r for r in _of(records, "span_start")}
    assert starts["inner"].parent_id == starts["outer"].span_id
    for r in _of(records, "span_end"):
        assert r.span_id == starts[r.name].span_id
        assert r.duration_ns == r.mono_ns - starts[r.name].mono_ns


def test_a_normal_exit_ends_a_started_span_terminated(tmp_path: Path) -> None:
    returncode, records, stderr = _run_open_spans_helper(tmp_path, "exit")
    assert returncode == 0, stderr
    assert [(r.name, r.status) for r in _of(records, "span_end")] == [
        ("closed_before", "ok"), ("started_open", "terminated")], stderr
    assert "still open" in _one(records, "span_end", "started_open").error


def test_the_default_instance_serves_module_level_spans(tmp_path: Path) -> None:
    t = Telemetry(store=tmp_path)
    telemetrain.set_telemetry(t)
    try:
        with span("on_default") as s:
            assert s.exported
        assert tracer() is tracer(t)
    finally:
        telemetrain.reset()
        t.close()
    assert [r.name for r in open_run(run_dir_of(t)).records("span_end")] == ["on_default"]
