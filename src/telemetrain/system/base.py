"""What a source of samples is given each cycle, and the contained read every source uses.

A source (host, process tree, NVML, torch.cuda allocator) adds values to the ``Cycle`` in base units; a value it
cannot read it does not add (absent, never 0). A read that raises is handed to ``Cycle.fail``: the sampler counts it,
warns once and records a diagnostic, and the cycle goes on with the next value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

__all__ = ["Cycle", "Source"]

T = TypeVar("T")


class Cycle:
    """One sampling cycle: its monotonic time, the values read, and what failed."""

    __slots__ = ("_on_fail", "mono_ns", "pids", "thorough", "values")

    def __init__(self, mono_ns: int, on_fail: Callable[[str, BaseException], None], thorough: bool = False) -> None:
        self.mono_ns = mono_ns
        self.thorough = thorough  # asked for (first, last, on demand): no cost-saving shortcut
        self.values: list[tuple[str, str, int | float]] = []  # (group, name, value)
        self.pids: frozenset[int] = frozenset()  # this process and its descendants, once the process source ran
        self._on_fail = on_fail

    def add(self, group: str, name: str, value: int | float | None) -> None:
        if value is not None:
            self.values.append((group, name, value))

    def fail(self, what: str, exc: BaseException) -> None:
        self._on_fail(what, exc)

    def read(self, what: str, fn: Callable[[], T]) -> T | None:
        """``fn()``, or ``None`` (recorded as a failure of ``what``) if it raises."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - one unreadable value must not cost the others
            self._on_fail(what, exc)
            return None


class Source(Protocol):
    """Something the sampler reads every cycle."""

    name: str

    def sample(self, cycle: Cycle) -> None: ...

    def describe(self) -> dict[str, Any]:
        """What it samples, for the sampler's start event (attribute values: str, int, float, bool)."""
        ...
