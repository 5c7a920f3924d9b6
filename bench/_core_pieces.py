"""bench_core.py's pieces section: where the time of one call goes, and what a record keeps alive."""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable
from time import monotonic_ns
from typing import Any

from _core_caller import _caller_side_telemetry, _flusher
from _core_harness import bench
from _method import NOTES


def _capture(routes: dict[str, Any], group: str, call: Callable[[], None]) -> tuple[Any, ...]:
    """The packed record a hot path hands to its route, captured by swapping the cached route for a moment (so
    these rows follow whatever layout ``src`` uses today)."""
    got: list[tuple[Any, ...]]
    real, got = routes[group], []
    routes[group] = got.append
    try:
        call()
    finally:
        routes[group] = real
    return got[0]


def _tracked_after_gc(rec: tuple[Any, ...]) -> str:
    """CPython creates every tuple GC-tracked and untracks it at a collection if no item can hold a reference
    cycle; a record that stays tracked is traversed again by every later collection while it is queued."""
    when_built = gc.is_tracked(rec)
    gc.collect()
    return (
        f"GC-tracked when built: {when_built}, after a collection: {gc.is_tracked(rec)} "
        "(CPython untracks a tuple whose items are all atomic: str, int, float, None, untracked tuples)"
    )


def _clock_slots(rec: tuple[Any, ...]) -> tuple[set[int], set[int]]:
    """Positions of the monotonic and the wall-clock readings in a packed record (ints within a minute of now)."""
    from time import time_ns

    now_mono, now_wall = monotonic_ns(), time_ns()
    ints = [(i, v) for i, v in enumerate(rec) if type(v) is int]
    return (
        {i for i, v in ints if abs(v - now_mono) < 60 * 10**9},
        {i for i, v in ints if abs(v - now_wall) < 60 * 10**9},
    )


def section_pieces(tmpdir: str) -> None:
    """The hot paths taken apart, each piece as its own statement (same harness, GC on unless stated).

    Uses telemetrain internals (``_default``, ``Telemetry._metric_routes``): if they change, this section is
    skipped with a note and the rest of the run is unaffected.
    """
    import telemetrain
    from telemetrain import events as tevents
    from telemetrain import metrics as tmetrics
    from telemetrain.telemetry import _default, get_telemetry

    lib = "pieces"
    t = _caller_side_telemetry(tmpdir)
    flush = _flusher(t)
    try:
        pm = tmetrics.put_metric
        pm("m", 1, "grp")  # resolve the route, start the writer
        flush()
        route = t._metric_routes["grp"]
        rec = _capture(t._metric_routes, "grp", lambda: pm("m", 1, "grp"))
        mono_at, wall_at = _clock_slots(rec)
        fields = {f"a{i}": v for i, v in enumerate(rec)}  # as variables: no constant folding

        def layout(rec_len: int, mono_expr: str, wall_expr: str) -> str:
            items = (mono_expr if i in mono_at else wall_expr if i in wall_at else f"a{i}" for i in range(rec_len))
            return "(" + ", ".join(items) + ")"

        tup, fresh = layout(len(rec), "v", "v + off"), layout(len(rec), "mono()", "0")
        shape = ", ".join(type(x).__name__ for x in rec)
        NOTES.append(
            f"pieces: put_metric hands its route a packed {len(rec)}-tuple ({shape}; monotonic clock at "
            f"{sorted(mono_at)}, wall clock at {sorted(wall_at)}); {_tracked_after_gc(rec)}"
        )

        def f3(a: object, b: object, c: object) -> None:
            pass

        bench(lib, 'call of an empty 3-argument function `f3("m", 1, "grp")`', 'f3("m", 1, "grp")', {"f3": f3})
        bench(
            lib,
            "default instance `_default.telemetry or get_telemetry()`",
            "_default.telemetry or get_telemetry()",
            {"_default": _default, "get_telemetry": get_telemetry},
        )
        bench(lib, 'route lookup `t._metric_routes.get("grp")`', 't._metric_routes.get("grp")', {"t": t})
        bench(lib, "clock read `time.monotonic_ns()`", "mono()", {"mono": monotonic_ns})
        wall_txt = ", wall = mono + offset" if wall_at else ""
        bench(
            lib,
            f"build the packed {len(rec)}-tuple{wall_txt} (discarded at once)",
            f"x = {tup}",
            dict(fields, v=123_456_789_012, off=987_654_321),
        )
        bench(
            lib,
            "enqueue: the real route called with one prebuilt record (same object queued n times)",
            "route(rec)",
            {"route": route, "rec": rec},
            between=flush,
        )
        q: deque[tuple[Any, ...]] = deque()  # a private queue: its append is a C call, whatever the real route is today
        names = dict(fields, enqueue=q.append, mono=monotonic_ns)
        bench(
            lib,
            "private deque.append of a fresh record as put_metric builds it, the queue keeps it",
            f"enqueue({fresh})",
            names,
            between=q.clear,
        )
        bench(lib, "same, GC disabled during the repeat", f"enqueue({fresh})", names, between=q.clear, gc_off=True)
        bench(
            lib,
            "same with one GC-tracked item (a class object in place of the kind) in the tuple",
            f"enqueue({fresh})",
            dict(names, a0=type(t)),
            between=q.clear,
        )
        bench(
            lib,
            'full put_metric("m", 1, "grp") -> async JSONL, GC disabled during the repeat',
            'put_metric("m", 1, "grp")',
            {"put_metric": pm},
            between=flush,
            gc_off=True,
        )

        # events.record: is its record still GC-tracked after a collection (it is if it holds a dict)?
        ev = tevents.Event(name="bench", source=tevents.EventSource.WORKER, metadata={"k": "v", "step": 1})
        tevents.record(ev)
        erec = _capture(t._event_routes, tevents.ELASTIC_GROUP, lambda: tevents.record(ev))
        NOTES.append(
            f"pieces: events.record hands its route a packed {len(erec)}-tuple "
            f"({', '.join(type(x).__name__ for x in erec)}); {_tracked_after_gc(erec)}"
        )
        bench(
            lib,
            "full events.record(prebuilt Event) -> async JSONL, GC disabled during the repeat",
            "record(ev)",
            {"record": tevents.record, "ev": ev},
            between=flush,
            gc_off=True,
        )
        flush()
        if t.health()["dropped"] or t.health()["failed"]:
            raise RuntimeError(f"pieces: records lost: {t.health()}")
    finally:
        t.close()
    telemetrain.set_telemetry(telemetrain.Telemetry(store=False))
