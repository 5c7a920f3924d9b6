"""Which sinks listen to which record kind and group, and the fast "is anyone listening?" answer.

A route is one delivery callable for one (kind, group) -- the sink's enqueue when one sink listens, a fan-out when
several do -- or ``False`` when nobody listens. Routes are resolved on first use and cached in plain dicts that the
instrumentation hot paths read directly: ``routes[kind].get(group)`` is the whole cost of a call nobody listens to.
Any change to the attachments clears the caches in place (the hot paths hold the dicts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Literal

from .dispatch import BackgroundRunner, InlineRunner
from .records import KINDS
from .sinks.base import Sink

Deliver = Callable[[Any], None]
Route = Deliver | Literal[False]  # the delivery callable for a (kind, group), or False when nobody listens

__all__ = ["Attachment", "Router"]


def _frozen(
    values: Iterable[str] | str | None, what: str, allowed: Iterable[str] | None = None
) -> frozenset[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        values = (values,)
    out = frozenset(values)
    for v in out:
        if not isinstance(v, str) or not v:
            raise TypeError(f"{what} must be non-empty strings, got {v!r}")
        if allowed is not None and v not in allowed:
            raise ValueError(f"unknown record kind {v!r} in {what}; known: {', '.join(sorted(allowed))}")
    return out


@dataclasses.dataclass(eq=False)
class Attachment:
    """A sink attached to a router, with its subscription and its runner."""

    sink: Sink
    runner: InlineRunner | BackgroundRunner
    kinds: frozenset[str] | None
    groups: frozenset[str] | None

    def listens(self, kind: str, group: str) -> bool:
        return (self.kinds is None or kind in self.kinds) and (self.groups is None or group in self.groups)


class Router:
    def __init__(self) -> None:
        self.attachments: list[Attachment] = []
        self.muted: set[str] = set()
        self.routes: dict[str, dict[str, Route]] = {kind: {} for kind in KINDS}
        # Per-kind extra listeners keyed by group, with a default under None (the torchelastic-compatible
        # per-group MetricHandler lives here). A group mapped to None is explicitly silent.
        self.hooks: dict[str, dict[str | None, Deliver | None]] = {kind: {} for kind in KINDS}
        # group -> (span_start route, span_end route, paired): see Telemetry.span_routes
        self.span_routes: dict[str, tuple[Route, Route, bool]] = {}

    def subscription(self, kinds: Iterable[str] | str | None, groups: Iterable[str] | str | None) -> tuple[Any, Any]:
        return _frozen(kinds, "kinds", KINDS), _frozen(groups, "groups")

    def attach(self, attachment: Attachment) -> None:
        self.attachments.append(attachment)
        self.invalidate()

    def detach(self, attachment: Attachment) -> None:
        self.attachments.remove(attachment)
        self.invalidate()

    def set_hook(self, kind: str, group: str | None, deliver: Deliver | None) -> None:
        self.hooks[kind][group] = deliver
        self.invalidate()

    def invalidate(self) -> None:
        for cache in self.routes.values():
            cache.clear()
        self.span_routes.clear()

    def same_listeners(self, kind: str, other: str, group: str) -> bool:
        """Whether records of ``kind`` and ``other`` in ``group`` go to exactly the same sinks, and no hook
        takes either (so one packed pair standing for both reaches every listener of each)."""
        group = str.__str__(group)
        for k in (kind, other):
            hooks = self.hooks[k]
            if hooks.get(group, hooks.get(None)) is not None:
                return False
        return all(a.listens(kind, group) == a.listens(other, group) for a in self.attachments)

    def resolve(self, kind: str, group: str, *, start: bool = True) -> Route:
        """Compute, cache and return the route for (kind, group); starts the runners it needs. The caller has
        checked that ``group`` is a non-empty str."""
        key = group  # cached under what the hot path looks up; matched by its text (a str Enum hashes otherwise)
        group = str.__str__(group)
        delivers: list[Deliver] = []
        if group in self.muted:  # muted means nobody at all: sinks and hooks
            self.routes[kind][key] = False
            return False
        for a in self.attachments:
            if a.listens(kind, group):
                if start:
                    a.runner.start()
                delivers.append(a.runner.enqueue)
        hooks = self.hooks[kind]
        hook = hooks.get(group, hooks.get(None))
        if hook is not None:
            delivers.append(hook)
        route = fan_out(delivers)
        self.routes[kind][key] = route
        return route

    def native_route(self, kind: str, group: str) -> Route:
        """The sinks only, without hooks (not cached)."""
        if group in self.muted:
            return False
        out = []
        for a in self.attachments:
            if a.listens(kind, group):
                a.runner.start()
                out.append(a.runner.enqueue)
        return fan_out(out)


def fan_out(delivers: list[Deliver]) -> Route:
    """One callable delivering to all of ``delivers``; ``False`` for none."""
    if not delivers:
        return False
    if len(delivers) == 1:
        return delivers[0]
    targets = tuple(delivers)

    def deliver_all(packed: Any) -> None:
        for deliver in targets:
            deliver(packed)

    return deliver_all
