"""The registry of one ``Telemetry``'s stats and gauges: list them, find them by name or prefix.

It is also what ties them to the pipeline's lifecycle: ``Telemetry.flush()`` closes open windows (and reads
gauges), ``Telemetry.close()`` (at exit, on SIGTERM) does so a last time, and a forked child resets every stat.

Stats are held weakly, as torch.monitor's are: a stat lives as long as the code using it holds it, and reports its
open window when it is garbage-collected. Gauges are held strongly (a gauge is usually created and forgotten) until
``close()``. Names need not be unique; ``get`` returns the most recently created live one.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .. import process_hooks
from ..collector import collector
from ..dispatch import describe, is_interrupt, warn_safely
from ..telemetry import Telemetry, get_telemetry

if TYPE_CHECKING:
    from .gauge import Gauge
    from .stat import Stat

__all__ = ["StatRegistry", "registry"]

_EXTENSION = "stats"


class StatRegistry:
    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        # re-entrant: SIGTERM's close runs collect() on the main thread, possibly inside its own register()
        self._lock = threading.RLock()
        self._stats: dict[int, weakref.ref[Stat]] = {}
        self._gauges: dict[int, Gauge] = {}
        self._dead: list[int] = []
        telemetry.add_producer(self)

    # -- membership ------------------------------------------------------------------------------------------------

    def register(self, item: Stat | Gauge) -> None:
        from .gauge import Gauge

        with self._lock:
            self._prune()
            if isinstance(item, Gauge):
                self._gauges[id(item)] = item
            else:
                key = id(item)
                self._stats[key] = weakref.ref(item, lambda _, key=key: self._forget(key))  # type: ignore[misc]
                if item._window_ns:
                    collector.schedule(item, item._deadline)
        # a process that only uses stats still reports its open windows at exit and on SIGTERM
        process_hooks.install()

    def _forget(self, key: int) -> None:
        # a weakref callback: it may run in any thread, inside any code (even this registry's own iteration), so it
        # only notes the key; the next locked call prunes it
        self._dead.append(key)
        collector.poke()

    def _prune(self) -> None:
        """Under the lock: drop the entries of garbage-collected stats."""
        while self._dead:
            key = self._dead.pop()
            ref = self._stats.get(key)
            if ref is not None and ref() is None:
                del self._stats[key]

    def unregister(self, item: Stat | Gauge) -> None:
        with self._lock:
            self._prune()
            self._gauges.pop(id(item), None)
            ref = self._stats.get(id(item))
            if ref is not None and ref() is item:
                del self._stats[id(item)]

    # -- queries ---------------------------------------------------------------------------------------------------

    @property
    def stats(self) -> list[Stat]:
        """Live stats, oldest first."""
        with self._lock:
            self._prune()
            refs = list(self._stats.values())
        return [s for s in (r() for r in refs) if s is not None]

    @property
    def gauges(self) -> list[Gauge]:
        with self._lock:
            return list(self._gauges.values())

    def __iter__(self) -> Iterator[Stat | Gauge]:
        return iter([*self.stats, *self.gauges])

    def __len__(self) -> int:
        return len(self.stats) + len(self.gauges)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def get(self, name: str) -> Stat | Gauge | None:
        """The stat or gauge called ``name`` (the newest, if several), or ``None``."""
        found = [item for item in self if item.name == name]
        return found[-1] if found else None

    def find(self, prefix: str = "") -> list[Stat | Gauge]:
        """Stats and gauges whose name starts with ``prefix``, sorted by name."""
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        return sorted((item for item in self if item.name.startswith(prefix)), key=lambda item: item.name)

    def names(self) -> list[str]:
        return sorted({item.name for item in self})

    def snapshot(self, prefix: str = "") -> dict[str, Any]:
        """``{name: last values}`` of the matching stats and ``{name: reading}`` of the matching gauges."""
        from .gauge import Gauge

        out: dict[str, Any] = {}
        for item in self.find(prefix):
            out[item.name] = item.read() if isinstance(item, Gauge) else item.get()
        return out

    # -- the Telemetry producer protocol ---------------------------------------------------------------------------

    def collect(self, final: bool) -> None:
        """Flush every stat (close open windows) and read every gauge once; ``final`` (the Telemetry is closing):
        then close them all, so no collector work is left for a pipeline that no longer listens."""
        from .gauge import Gauge

        items: list[Stat | Gauge] = [*self.stats, *self.gauges]
        for item in items:
            try:
                if isinstance(item, Gauge):
                    item.collect()
                    if final:
                        item.close()
                elif final:
                    item.close()
                else:
                    item.flush()
            except BaseException as exc:  # one broken stat must not stop the others' flush
                if is_interrupt(exc):
                    raise
                warn_safely(f"telemetrain: flushing {item.name!r} failed: {describe(exc)}")
        if final:
            collector.cancel()  # garbage-collected stats' entries too: let the thread end now if nothing is left

    def after_fork_in_child(self) -> None:
        self._lock = threading.RLock()
        for stat in self.stats:
            stat._after_fork_in_child()
            if stat._window_ns:
                collector.schedule(stat, stat._deadline)
        for gauge in self.gauges:
            gauge._after_fork_in_child()


def registry(telemetry: Telemetry | None = None) -> StatRegistry:
    """The registry of ``telemetry`` (default: the default instance), created on first use."""
    t = telemetry if telemetry is not None else get_telemetry()
    found: StatRegistry = t.extension(_EXTENSION, StatRegistry)
    return found
