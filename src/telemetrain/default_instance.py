"""The default ``Telemetry`` instance, the target of the module-level APIs (like ``logging``'s root logger), and the
warnings that keep a split of one program's records between two instances from being silent.

Which instance is the default (the module-level APIs' target: ``training.*``, ``Stat``, ``metrics``, ``events``,
``monitor``, ``span``...): the one ``set_telemetry()`` or ``Telemetry(default=True)`` installed; else the first
``Telemetry`` created (with ``default`` left ``None``) that is still open when a module-level API first needs one;
else one built from the environment. ``default=False`` keeps an instance out of it. See ``_claim_default``.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

from .dispatch import warn_safely

if TYPE_CHECKING:
    from .telemetry import Telemetry

_FALSY = {"0", "off", "false", "no", ""}


def _no_default_yet(group: str) -> None:
    """The metric route lookup before a default exists: build the default; ``None`` sends the caller down its slow
    path."""
    get_telemetry()


class _Default:
    """Holds the default instance; module-level APIs read it on every call so ``reset()`` and ``set_telemetry()`` take
    effect at once. ``metric_routes_get`` is the default's metric route lookup, kept ready so the torchelastic
    ``put_metric`` answers "anyone listening?" with one call. (If the default changes between that lookup and the
    identity token read, the record carries the new default's identity: tokens are process-wide, so it stays
    valid.)

    ``how`` says how the default came to be: ``"env"`` (built from the environment by a module-level call),
    ``"auto"`` (the first open ``Telemetry`` created with ``default=None``), ``"explicit"`` (``default=True``) or
    ``"set"`` (``set_telemetry``). ``candidates`` are the instances created with ``default=None``, oldest first, held
    weakly: the first one still open becomes the default when a module-level API first needs one."""

    def __init__(self) -> None:
        self._after_fork()
        self.candidates: list[weakref.ref[Telemetry]] = []
        self.install(None, "")

    def _after_fork(self) -> None:
        self.lock = threading.Lock()  # a fork while another thread held it must not leave the child stuck

    def install(self, telemetry: Telemetry | None, how: str) -> None:
        self.telemetry = telemetry
        self.how = how
        self.metric_routes_get: Any = telemetry._metric_routes.get if telemetry is not None else _no_default_yet

    def open_candidates(self) -> list[Telemetry]:
        """The candidates still alive and open, oldest first (the dead ones are forgotten)."""
        alive = [(ref, ref()) for ref in self.candidates]
        self.candidates = [ref for ref, t in alive if t is not None]
        return [t for _, t in alive if t is not None and not t.closed]


_default = _Default()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_default._after_fork)

_MODULE_APIS = "training.*, Stat, Gauge, span, metrics, events, monitor"


def _describe(telemetry: Telemetry) -> str:
    """Where an instance writes, for a warning."""
    where = telemetry.run_dir
    return f"run store {where}" if where is not None else f"run {telemetry.identity.run_id} (no run store)"


def _in_use(telemetry: Telemetry) -> bool:
    """Whether anything was recorded through, or bound to, this instance (a stat, a recorder, a resolved route)."""
    if telemetry.extensions:
        return True
    try:  # list(): copied at once (no Python code runs meanwhile), as other threads may be resolving routes
        return any(any(list(routes.values())) for routes in list(telemetry._router.routes.values()))
    except RuntimeError:  # changed while copied after all: it is in use
        return True


def _claim_default(telemetry: Telemetry, explicit: bool) -> None:
    """A new instance's claim on the default slot (``Telemetry(default=True|None)``). What would split a program's
    records between two instances warns (``TelemetryWarning``), naming both:

    - ``default=True`` replacing a default that is open and already in use (what it recorded, and the stats and
      recorders bound to it, stay there);
    - ``default=None`` while the default is another open instance that module-level calls already built from the
      environment, or adopted as the first of several: those calls keep writing there, not here.

    A default that was closed (not one installed by ``set_telemetry``) is replaced by the next instance quietly."""
    with _default.lock:
        current, how = _default.telemetry, _default.how
        if not explicit:
            _default.candidates.append(weakref.ref(telemetry))
        replace = explicit or (current is not None and current.closed and how != "set")
        if replace:
            _default.install(telemetry, "explicit" if explicit else "auto")
    if replace:
        _enable_from_env(telemetry)
    if current is None or current is telemetry or current.closed:
        return
    if explicit and _in_use(current):
        warn_safely(
            f"telemetrain: this Telemetry (default=True) replaces the default instance, which is open and already in "
            f"use ({_describe(current)}): what was recorded there, and the stats and recorders made before, stay "
            f"there; this one writes to {_describe(telemetry)}. Create it before the first telemetrain call to get "
            "one run.",
            stacklevel=3,
        )
    elif not explicit and how in ("env", "auto"):
        origin = ("was built from the environment by an earlier module-level call" if how == "env"
                  else "is the first Telemetry this program created")
        warn_safely(
            f"telemetrain: a second Telemetry: the default instance ({_describe(current)}) {origin}, so module-level "
            f"APIs ({_MODULE_APIS}) keep writing there, not to this one ({_describe(telemetry)}). Pass default=True "
            "to make this one the default, default=False to keep it apart on purpose, or create it before the first "
            "telemetrain call.",
            stacklevel=3,
        )


def _enable_from_env(telemetry: Telemetry) -> None:
    """What the environment asks of the default instance besides its store and console: the system sampler
    (``TELEMETRAIN_SYSTEM``) and cross-rank aggregation (``TELEMETRAIN_CROSS_RANK``, set by ``telemetrain
    launch``)."""
    if os.environ.get("TELEMETRAIN_SYSTEM", "").strip().lower() not in _FALSY:
        try:  # the system sampler, asked for by the environment (docs/system.md); an extra
            from .system import enable_from_env
        except ImportError as exc:
            warn_safely(f"telemetrain: $TELEMETRAIN_SYSTEM is set but the system sampler cannot load: {exc}")
        else:
            enable_from_env(telemetry)
    if os.environ.get("TELEMETRAIN_CROSS_RANK", "").strip().lower() not in _FALSY:
        # cross-rank aggregation, asked for by the environment (`telemetrain launch` sets it; docs/distributed.md)
        from .distributed.cross_rank import enable_from_env as enable_cross_rank_from_env

        enable_cross_rank_from_env(telemetry)
    if os.environ.get("TELEMETRAIN_WATCHDOG", "").strip().lower() not in _FALSY:
        # the stall watchdog, asked for by the environment (`telemetrain launch` sets it; docs/distributed.md)
        from .distributed.watchdog import enable_from_env as enable_watchdog_from_env

        enable_watchdog_from_env(telemetry)


def _from_env() -> Telemetry:
    from .telemetry import Telemetry  # (here: telemetry imports this module)

    store_env = os.environ.get("TELEMETRAIN_STORE")
    store: bool | str = True
    if store_env is not None:
        store = False if store_env.strip().lower() in _FALSY else True
    console = os.environ.get("TELEMETRAIN_CONSOLE", "").strip().lower() not in _FALSY
    return Telemetry(store=store, console=console, default=False)


def get_telemetry() -> Telemetry:
    """The default instance: the one ``set_telemetry()`` or ``Telemetry(default=True)`` installed, else the first
    ``Telemetry`` created (with ``default=None``) that is still open, else one created on first use from the
    environment (``TELEMETRAIN_DIR``, ``TELEMETRAIN_STORE``, ``TELEMETRAIN_CONSOLE``, the identity variables).
    Creating it opens nothing and starts no thread."""
    t = _default.telemetry
    if t is not None:
        return t
    with _default.lock:
        t = _default.telemetry
        if t is not None:
            return t
        candidates = _default.open_candidates()
        if candidates:
            t = candidates[0]
            _default.install(t, "auto")
        else:
            t = _from_env()
            _default.install(t, "env")
    _enable_from_env(t)
    if len(candidates) > 1:
        others = "; ".join(_describe(c) for c in candidates[1:])
        warn_safely(
            f"telemetrain: {len(candidates)} Telemetry instances are open and none is the default: module-level APIs "
            f"({_MODULE_APIS}) write to the first one created ({_describe(t)}), not to the others ({others}). Pass "
            "default=True to the one meant, or default=False to the others.",
            stacklevel=2,
        )
    return t


def set_telemetry(telemetry: Telemetry) -> Telemetry | None:
    """Make ``telemetry`` the default instance; returns the previous one (not closed)."""
    from .telemetry import Telemetry  # (here: telemetry imports this module)

    if not isinstance(telemetry, Telemetry):
        raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
    with _default.lock:
        previous = _default.telemetry
        _default.install(telemetry, "set")
    return previous


def reset(timeout: float | None = 5.0) -> None:
    """Close the default instance and forget it, and the instances waiting to become it; the next use builds a fresh
    one from the environment unless a ``Telemetry`` is created before (for tests)."""
    with _default.lock:
        previous = _default.telemetry
        _default.install(None, "")
        _default.candidates = []
    if previous is not None:
        previous.close(timeout)
