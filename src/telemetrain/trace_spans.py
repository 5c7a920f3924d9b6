"""The trace's spans (``trace``): a process's spans collected from its records (an open one ends at the process's
last record), capped per name (evenly spaced, the dropped counted), nested by their parent ids and given tracks:
the lifecycle stack, async saves beside it, a thread's own track, another for a span that does not fit its parent's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

OPEN_STATUS = "open at end of data"

TID_LIFECYCLE = 1
TID_ASYNC = 2

# spans that run beside the lifecycle stack, not inside it
_ASYNC_SPANS = frozenset({"checkpoint_save_async", "checkpoint_save_finalization"})


class _Span:
    __slots__ = ("args", "category", "children", "dropped", "end", "name", "parent_id", "span_id", "start", "thread")

    def __init__(self, span_id: str, name: str, category: str, parent_id: str, start: int) -> None:
        self.span_id = span_id
        self.name = name
        self.category = category
        self.parent_id = parent_id
        self.start = start  # µs from the trace origin, set to ints once rounded
        self.end = start
        self.args: dict[str, Any] = {}
        self.children: list[_Span] = []
        self.dropped = False
        self.thread = ""


def _thread_of(attributes: Mapping[str, Any]) -> str:
    """The thread a span says it ran in (OpenTelemetry's ``thread.name`` / ``thread.id`` attributes), else ""."""
    for key in ("thread.name", "thread.id"):
        value = attributes.get(key)
        if value is not None and value != "":
            return str(value)
    return ""


def _collect_spans(records: Iterable[Any], last_ns: int, origin_ns: int) -> list[_Span]:
    """Start and end records paired by span id, in µs from ``origin_ns``. A start without an end ends at
    ``last_ns``; an end without a start (its line lost) begins ``duration`` before it."""
    spans: dict[str, _Span] = {}
    ended: set[str] = set()
    for r in records:
        if r.kind == "span_start":
            s = spans.get(r.span_id)
            if s is None:
                s = spans[r.span_id] = _Span(r.span_id, r.name, r.group, r.parent_id, r.wall_ns)
                s.end = last_ns
            else:  # its end came first (same wall time, or a late writer): the start fixes where it begins
                s.end = r.wall_ns + (s.end - s.start)
                s.start, s.parent_id = r.wall_ns, r.parent_id
            if r.attributes:
                s.args.update(r.attributes)
        elif r.kind == "span_end":
            s = spans.get(r.span_id)
            if s is None:
                s = spans[r.span_id] = _Span(r.span_id, r.name, r.group, "", r.wall_ns - r.duration_ns)
            s.end = s.start + r.duration_ns
            ended.add(r.span_id)
            if r.attributes:
                s.args.update(r.attributes)
            if r.status != "ok":
                s.args["status"] = r.status
            if r.error:
                s.args["error"] = r.error
    out = list(spans.values())
    for s in out:
        s.thread = _thread_of(s.args)
        if s.span_id not in ended:
            s.args["status"] = OPEN_STATUS
        s.args["span_id"] = s.span_id
        s.start, s.end = _us(s.start - origin_ns), _us(max(s.end, s.start) - origin_ns)
    return out


def _us(ns: int) -> int:
    """ns -> µs, rounded half up. Monotonic, so a child inside its parent in ns stays inside in µs."""
    return (ns + 500) // 1000


def _evenly(items: Sequence[Any], keep: int) -> tuple[list[Any], list[Any]]:
    """(kept, dropped): ``keep`` items evenly spaced over ``items``, first and last included."""
    n = len(items)
    if n <= keep:
        return list(items), []
    if keep <= 1:
        return list(items[:keep]), list(items[keep:])
    chosen = {round(i * (n - 1) / (keep - 1)) for i in range(keep)}
    return [x for i, x in enumerate(items) if i in chosen], [x for i, x in enumerate(items) if i not in chosen]


def _cap_spans(spans: list[_Span], by_id: Mapping[str, _Span], max_per_name: int, dropped: dict[str, int]) -> None:
    """At most ``max_per_name`` spans per name, evenly spaced in time. Names are capped from the top of the tree down,
    and a dropped span takes its subtree with it, so the kept sub-phases are those of kept iterations."""
    depth: dict[str, int] = {}

    def depth_of(s: _Span) -> int:
        d, p, seen = 0, by_id.get(s.parent_id), {s.span_id}
        while p is not None and p.span_id not in seen:  # (ids from corrupt data could form a loop)
            known = depth.get(p.span_id)
            if known is not None:
                d += known + 1
                break
            seen.add(p.span_id)
            d += 1
            p = by_id.get(p.parent_id)
        depth[s.span_id] = d
        return d

    by_name: dict[str, list[_Span]] = {}
    min_depth: dict[str, int] = {}
    for s in sorted(spans, key=lambda x: x.start):
        by_name.setdefault(s.name, []).append(s)
        d = depth_of(s)
        min_depth[s.name] = min(d, min_depth.get(s.name, d))

    def drop(s: _Span) -> None:
        stack = [s]
        while stack:
            x = stack.pop()
            if not x.dropped:
                x.dropped = True
                dropped[x.name] = dropped.get(x.name, 0) + 1
                stack.extend(x.children)

    for name in sorted(by_name, key=lambda n: (min_depth[n], n)):
        live = [s for s in by_name[name] if not s.dropped]
        for s in _evenly(live, max_per_name)[1]:
            drop(s)


def _family(s: _Span, parent: _Span | None, parent_family: str) -> str:
    """The track family of a span: async saves and spans of a named thread leave their parent's; roots start one."""
    if s.name in _ASYNC_SPANS and (parent is None or parent.name not in _ASYNC_SPANS):
        return "async"
    if s.thread and (parent is None or s.thread != parent.thread):
        return f"thread {s.thread}"
    if parent is None:
        return "lifecycle" if s.category == "training" else "other"
    return parent_family


def _walk(spans: list[_Span], by_id: Mapping[str, _Span]) -> list[tuple[str, int, _Span]]:
    """(family, depth, span) for every kept span, parents before children; each child clipped into its parent (it
    ran inside it: only clock rounding or a late end record puts it outside)."""
    out: list[tuple[str, int, _Span]] = []
    seen: set[str] = set()
    roots = [s for s in spans if not s.dropped and (s.parent_id not in by_id or s.parent_id == s.span_id)]
    stack: list[tuple[_Span, _Span | None, str, int]] = [(s, None, "", 0) for s in roots]
    while True:
        while stack:
            s, parent, parent_family, depth = stack.pop()
            if s.span_id in seen:
                continue
            seen.add(s.span_id)
            family = _family(s, parent, parent_family)
            if parent is not None and family == parent_family:
                s.start = min(max(s.start, parent.start), parent.end)
                s.end = min(max(s.end, s.start), parent.end)
            out.append((family, depth, s))
            stack.extend((c, s, family, depth + 1) for c in s.children if not c.dropped)
        # spans no root leads to (parent ids in a loop: corrupt data) still show, as roots
        rest = [s for s in spans if not s.dropped and s.span_id not in seen]
        if not rest:
            return out
        stack.append((min(rest, key=lambda x: x.start), None, "", 0))


def _assign_tracks(walked: list[tuple[str, int, _Span]]) -> tuple[list[tuple[int, _Span]], dict[int, str]]:
    """Spans onto tracks so that each track nests perfectly. Per family, lanes of open-span stacks: a span goes to
    its parent's lane if it nests there (the usual case: one thread's spans nest in time), else to the first lane
    where it nests, else to a new lane."""
    lanes: dict[str, list[tuple[int, list[_Span]]]] = {}  # family -> [(tid, stack of open spans)]
    lane_of: dict[str, int] = {}  # span id -> index of its lane in its family
    names: dict[int, str] = {}
    labels = {"lifecycle": "lifecycle", "async": "checkpoint (async)"}
    next_tid = 3
    placed: list[tuple[int, _Span]] = []
    for family, _depth, s in sorted(walked, key=lambda fds: (fds[2].start, -fds[2].end, fds[1])):
        family_lanes = lanes.setdefault(family, [])
        preferred = lane_of.get(s.parent_id)
        order = list(range(len(family_lanes)))
        if preferred is not None and preferred < len(order):
            order.remove(preferred)
            order.insert(0, preferred)
        chosen = None
        for k in order:
            stack = family_lanes[k][1]
            while stack and stack[-1].end <= s.start:
                stack.pop()
            if not stack or s.end <= stack[-1].end:
                chosen = k
                break
        if chosen is None:
            if not family_lanes and family in ("lifecycle", "async"):
                tid = TID_LIFECYCLE if family == "lifecycle" else TID_ASYNC
            else:
                tid, next_tid = next_tid, next_tid + 1
            label = labels.get(family, family)
            names[tid] = label if not family_lanes else f"{label} ({len(family_lanes) + 1})"
            family_lanes.append((tid, []))
            chosen = len(family_lanes) - 1
        tid, stack = family_lanes[chosen]
        stack.append(s)
        lane_of[s.span_id] = chosen
        placed.append((tid, s))
    return placed, names
