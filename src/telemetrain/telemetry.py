"""``Telemetry``: one instance owns identity, routing, sinks and their runners. Module-level APIs use a default
instance (``default_instance``: which one, and the warnings when records would split between two); tests and
libraries create their own. The argument checks are in ``arguments``, the clock offset in ``clock``; flush, close,
health and the producers in its base class (``telemetry_delivery``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from . import process_hooks
from .arguments import _ATTRIBUTE_VALUE_SET, check_attribute_lengths, check_metric_attributes, check_seconds, check_step
from .arguments import check_name as check_name  # (re-exported, as the two below: the APIs import them from here)
from .arguments import check_value as check_value
from .clock import CLOCK_SKEW_ENV as CLOCK_SKEW_ENV  # (re-exported: its old home)
from .clock import _read_offset
from .containment import warn_safely
from .default_instance import _claim_default, get_telemetry, reset, set_telemetry
from .default_instance import _default as _default  # (re-exported: the module-level APIs read it from here)
from .dispatch import BackgroundRunner, FailurePolicy, InlineRunner
from .identity import Identity, identity_from_env, identity_of, token_for
from .records import KINDS, SEVERITIES, check_attribute_keys, check_record, pack
from .router import Attachment, Router
from .sinks.base import Sink
from .sinks.console import ConsoleSink
from .sinks.jsonl import RunStoreSink
from .store.layout import check_root
from .telemetry_delivery import STORE_CLOSE_BUDGET_S as STORE_CLOSE_BUDGET_S  # (re-exported: its old home)
from .telemetry_delivery import TelemetryDelivery

__all__ = ["Telemetry", "get_telemetry", "reset", "set_telemetry"]

_monotonic_ns = time.monotonic_ns
_SEVERITY_SET = frozenset(SEVERITIES)
_RECORD_TYPES = frozenset(KINDS.values())


class Telemetry(TelemetryDelivery):
    """Routing, sinks and identity for one process (or one test).

    ``store``: ``True`` writes the run store under ``$TELEMETRAIN_DIR`` or ``./telemetrain-runs``; a path writes it
    there; ``False`` writes none. ``console``: also print a progress view to stderr, on rank 0 only: a line per
    training report (step of target, throughput, iteration time, MFU) and per other record, less what that line
    already says (``ConsoleSink(verbose=True)``: every record). Nothing is opened, and no thread starts, until the
    first record is emitted.

    ``default``: ``True`` makes this instance the process default at once (what ``training.*``, ``Stat``,
    ``metrics.put_metric``... write to); ``None`` (the default) makes it the default if it is the first instance
    still open when a module-level API first needs one (so ``t = Telemetry(store=..., config=...)`` followed by
    ``training.*`` writes one run); ``False`` never (an isolated instance: a library's, a test's).

    ``flush_interval``: seconds between the background sinks' writes (``math.inf``: only at ``flush()`` and close).
    ``flush``/``close`` take a ``timeout`` in seconds; ``None`` or ``math.inf`` waits without a limit.
    """

    def __init__(
        self,
        identity: Identity | None = None,
        *,
        store: bool | str | os.PathLike[str] = True,
        console: bool = False,
        config: Mapping[str, Any] | None = None,
        queue_capacity: int = 100_000,
        flush_interval: float = 0.2,
        failure_policy: FailurePolicy | None = None,
        default: bool | None = None,
    ) -> None:
        if default is not None and not isinstance(default, bool):
            raise TypeError(f"default must be True, False or None, got {type(default).__name__}")
        if identity is not None and not isinstance(identity, Identity):
            raise TypeError(f"identity must be an Identity, got {type(identity).__name__}")
        if type(queue_capacity) is not int or queue_capacity < 1:
            raise ValueError(f"queue_capacity must be a positive int, got {queue_capacity!r}")
        if not check_seconds(flush_interval, "flush_interval") > 0:
            raise ValueError(f"flush_interval must be > 0 seconds, got {flush_interval!r}")
        self._pid = os.getpid()
        self._install_identity(identity if identity is not None else identity_from_env())
        self.queue_capacity = queue_capacity
        self.flush_interval = check_seconds(flush_interval, "flush_interval")  # inf: only flush() and close()
        self.failure_policy = failure_policy or FailurePolicy()
        self._router = Router()
        self._metric_routes = self._router.routes["metric"]
        self._event_routes = self._router.routes["event"]
        self._lock = threading.RLock()
        self._closed = False  # no new records are accepted
        self._shut = False  # and every sink has been closed
        self._reporting = threading.local()
        self._hook_runners: dict[tuple[str, str | None], InlineRunner] = {}
        self.extensions: dict[str, Any] = {}  # per-instance state of compatible APIs and integrations
        self._producers: list[Any] = []
        self.skipped_sinks: list[Sink] = []  # "zero" sinks not attached because this process is not rank 0
        self._rank_zero_only: list[Attachment] = []  # "zero" sinks attached while the rank was 0 (set_identity)
        self._final_collect_done = False
        self._warned_after_exit = False  # a record emitted after the exit close was dropped (warned once)
        self.refresh_clock()
        self.config: dict[str, Any] = dict(config or {})  # the run's config (run.json; Sink.run_config)
        self.store: RunStoreSink | None = None
        if store is not False:
            if store is not True and not isinstance(store, (str, os.PathLike)):
                raise TypeError(f"store must be a bool or a path, got {type(store).__name__}")
            self.store = RunStoreSink(None if store is True else check_root(store, "store"), config=config)
            self.add_sink(self.store)
        if console:
            self.add_sink(ConsoleSink())
        process_hooks.track(self)
        if default is not False:
            _claim_default(self, default is True)

    # -- identity and clock ----------------------------------------------------------------------------------------

    @property
    def identity(self) -> Identity:
        return self._identity

    def set_identity(self, identity: Identity | None = None, **changes: Any) -> Identity:
        """Replace the identity (whole, or some fields). Later records carry the new one."""
        base = identity if identity is not None else self._identity
        if not isinstance(base, Identity):
            raise TypeError(f"identity must be an Identity, got {type(base).__name__}")
        installed = self._install_identity(base.replace(**changes) if changes else base)
        if installed.rank != 0 and self._rank_zero_only:
            self._skip_rank_zero_sinks()
        return installed

    def _install_identity(self, identity: Identity) -> Identity:
        # token first: a record built between the two stores carries the old pair, whose token stays valid
        self._token = token_for(identity)
        self._identity = identity
        return identity

    def identity_of(self, token: int) -> Identity:
        """The identity a packed record's token stands for (tokens are process-wide, see ``identity.token_for``)."""
        return identity_of(token)

    @property
    def wall_offset_ns(self) -> int:
        """Wall ns minus monotonic ns, as last read (see ``refresh_clock``)."""
        return self._wall_offset_ns

    def refresh_clock(self) -> None:
        """Wall time of a record is its monotonic time plus this offset, re-read on every dispatcher wake-up before
        the batch is written: the hot path reads one clock instead of two, and packs one big int instead of two.

        The offset is replaced only when the wall clock really moved (a step, or 1 ms of slew): reading the two
        clocks jitters by ~100 ns, and every sink should stamp a given record with the same wall time. The wall clock
        is read between two monotonic reads, and a read the thread was preempted in (a gap over 50 us: a loaded
        machine, the GIL) is taken again, so a preemption is never mistaken for a clock step."""
        offset = _read_offset()
        if abs(offset - getattr(self, "_wall_offset_ns", offset + 10**9)) >= 1_000_000:
            self._wall_offset_ns = offset

    @property
    def run_dir(self) -> Path | None:
        """The run directory this process writes (``None`` without a run store)."""
        return self.store.run_dir_for(self._identity) if self.store is not None else None

    # -- sinks and routing -----------------------------------------------------------------------------------------

    def add_sink(
        self,
        sink: Sink,
        *,
        kinds: Iterable[str] | str | None = None,
        groups: Iterable[str] | str | None = None,
        background: bool | None = None,
        ranks: str | None = None,
    ) -> Attachment:
        """Attach a sink for some record kinds (default: the sink's own ``kinds``, else all) and groups (default:
        all). ``background`` overrides the sink's own choice of running behind the dispatcher; ``ranks`` its
        ``Sink.ranks``: with ``"zero"``, a process whose rank is not 0 does not attach the sink but closes it and
        lists it in ``skipped_sinks``."""
        if not isinstance(sink, Sink):
            raise TypeError(f"sink must be a telemetrain.sinks.Sink, got {type(sink).__name__}")
        kinds_f, groups_f = self._router.subscription(kinds if kinds is not None else sink.kinds, groups)
        rank_policy = sink.ranks if ranks is None else ranks
        if rank_policy not in ("all", "zero"):
            raise ValueError(f"ranks must be 'all' or 'zero', got {rank_policy!r}")
        if self.config and sink.run_config is None:
            from .hparams import flatten  # (not at import: the core's import stays as small as it was)

            sink.run_config = flatten(self.config)
        if rank_policy == "zero" and self._identity.rank != 0:
            self.skipped_sinks.append(sink)
            sink.close()
            return Attachment(sink=sink, runner=InlineRunner(sink, self.failure_policy, self._report, self),
                              kinds=frozenset(), groups=frozenset())
        run_behind = sink.background if background is None else bool(background)
        runner: InlineRunner | BackgroundRunner
        if run_behind:
            runner = BackgroundRunner(
                sink,
                self.failure_policy,
                self._report,
                self,
                capacity=self.queue_capacity,
                interval=self.flush_interval,
                on_wake=self.refresh_clock,
                on_route_change=self._routes_changed,
            )
        else:
            runner = InlineRunner(sink, self.failure_policy, self._report, self)
        attachment = Attachment(sink=sink, runner=runner, kinds=kinds_f, groups=groups_f)
        with self._lock:
            if self._closed:
                raise RuntimeError("this Telemetry is closed")
            self._router.attach(attachment)
            if rank_policy == "zero":
                self._rank_zero_only.append(attachment)
        return attachment

    @property
    def sinks(self) -> list[Sink]:
        return [a.sink for a in self._router.attachments]

    def mute(self, *groups: str) -> None:
        """No sink listens to these groups any more: calls for them return at once, before building a record."""
        with self._lock:
            self._router.muted.update(check_name(g, "group") for g in groups)
            self._router.invalidate()

    def unmute(self, *groups: str) -> None:
        with self._lock:
            self._router.muted.difference_update(groups)
            self._router.invalidate()

    def set_hook(self, kind: str, group: str | None, sink: Sink | None) -> None:
        """An extra inline listener for one kind and group (``None``: every group without its own hook), contained
        like any sink. ``sink=None`` makes the group explicitly silent for hooks."""
        with self._lock:
            runner = None if sink is None else InlineRunner(sink, self.failure_policy, self._report, self)
            if runner is None:
                self._hook_runners.pop((kind, group), None)
            else:
                self._hook_runners[(kind, group)] = runner
            self._router.set_hook(kind, group, None if runner is None else runner.enqueue)

    def listening(self, kind: str, group: str) -> bool:
        """Whether a record of this kind and group would go anywhere."""
        return bool(self.route(kind, group))

    def _resolve(self, kind: str, group: str, arg: str = "group") -> Any:
        check_name(group, arg)
        if self._pid != os.getpid():  # forked without our at-fork hook having run (it is installed lazily)
            self._after_fork_in_child()
        with self._lock:
            if self._closed:  # closed (e.g. at exit): remember that nobody listens, so later calls stay cheap
                self._router.routes[kind][group] = False
                if process_hooks.exiting():
                    self._warn_after_exit(kind, group)
                return False
            route = self._router.resolve(kind, group)
        if route:
            process_hooks.install()
        return route

    def _warn_after_exit(self, kind: str, group: str) -> None:
        if not self._warned_after_exit:
            self._warned_after_exit = True
            warn_safely(f"telemetrain: a record ({kind}, group {group!r}) was emitted after telemetrain closed at "
                        "exit (from an atexit handler registered before telemetrain was imported?) and was dropped, "
                        "as are those after it", stacklevel=4)

    def route(self, kind: str, group: str) -> Any:
        """The delivery callable for packed records of (kind, group), or ``False`` when nobody listens."""
        routes = self._router.routes[kind]
        try:
            route = routes.get(group)
        except TypeError:
            raise TypeError(f"group must be a str, got {type(group).__name__}") from None
        return route if route is not None else self._resolve(kind, group)

    def span_routes(self, group: str) -> tuple[Any, Any, bool]:
        """(the ``span_start`` route, the ``span_end`` route, paired) for ``group``: paired when both go to the same
        sinks, so that a short span may travel as one ``SPAN_PAIR`` tuple on the end route (see records). Cached
        until the routes change."""
        found = self._router.span_routes.get(group)
        if found is not None:
            return found
        start = self.route("span_start", group)
        end = self.route("span_end", group)
        with self._lock:
            router = self._router
            paired = bool(start) and bool(end) and router.same_listeners("span_start", "span_end", group)
            entry = (start, end, paired)
            # cached only if no attachment changed meanwhile (a change clears the caches)
            if router.routes["span_start"].get(group) is start and router.routes["span_end"].get(group) is end:
                router.span_routes[group] = entry
        return entry

    def native_route(self, kind: str, group: str) -> Any:
        """The route without hooks (for compatible APIs that deliver to their own handler themselves)."""
        with self._lock:
            return False if self._closed else self._router.native_route(kind, group)

    def extension(self, key: str, factory: Callable[[Telemetry], Any]) -> Any:
        """The per-instance state of an API built on this Telemetry (the stats registry, the tracer, the training
        recorder, the torch.monitor handlers): created once by ``factory(self)``, under a lock."""
        found = self.extensions.get(key)
        if found is None:
            with self._lock:
                found = self.extensions.get(key)
                if found is None:
                    found = self.extensions[key] = factory(self)
        return found

    # -- emitting --------------------------------------------------------------------------------------------------

    def metric(
        self,
        name: str,
        value: float,
        group: str = "default",
        attributes: Mapping[str, str | int | float | bool] | None = None,
        *,
        unit: str = "",
        step: int | None = None,
    ) -> None:
        """Record one value. Returns at once (before any check) if nobody listens to ``group``. ``attributes``: the
        dimension labels of the series (``{"disk.io.direction": "read"}``), str keys and str/int/float/bool values;
        copied. (Positional-or-keyword, not keyword-only: CPython fills a missing keyword-only default with a dict
        lookup per call, a positional one from a tuple, and a metric without attributes must cost what it did.)"""
        try:
            route = self._metric_routes.get(group)
        except TypeError:
            raise TypeError(f"group must be a str, got {type(group).__name__}") from None
        if not route:  # (one test on the common path, not two: it pays for the attributes test below)
            if route is None:
                route = self._resolve("metric", group)
            if not route:
                return
        if type(value) is not float and type(value) is not int:
            value = check_value(value, "value")
        if type(name) is not str or not name:
            name = check_name(name, "name")
        if unit or step is not None or attributes:  # the common case (none of them) skips these checks
            if type(unit) is not str:
                raise TypeError(f"unit must be a str, got {type(unit).__name__}")
            if step is not None and type(step) is not int:
                step = check_step(step)
            if attributes:  # flattened to the end of the long form, keys then values (records.ATTRIBUTE_LAYOUT)
                if type(attributes) is dict:  # the common case, checked inline (a call and an ABC check cost more)
                    for k, v in attributes.items():
                        if type(k) is not str or type(v) not in _ATTRIBUTE_VALUE_SET or not k:
                            check_metric_attributes(attributes)  # raises, naming the key
                else:
                    check_metric_attributes(attributes)
                route(("metric", _monotonic_ns(), self._token, group, name, value, unit, step, *attributes,
                       *attributes.values()))
            else:
                route(("metric", _monotonic_ns(), self._token, group, name, value, unit, step))
        else:  # the short packed form: trailing defaults left out (see records)
            route(("metric", _monotonic_ns(), self._token, group, name, value))

    def log(
        self,
        metrics: Mapping[str, Any],
        step: int | None = None,
        *,
        group: str = "default",
        unit: str = "",
        attributes: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        """Record several values at once, ``wandb.log``/``mlflow.log_metrics`` style: ``log({"loss": 0.31, "lr":
        3e-4}, step=120)``. Every value is checked before any is recorded, so a bad one (a tensor: pass
        ``.item()`` yourself) raises a ``TypeError`` naming its key and records nothing. One metric record per key,
        all with the same time, ``step``, ``unit`` and ``attributes``."""
        if not isinstance(metrics, Mapping):
            raise TypeError(f"metrics must be a mapping of name -> number, got {type(metrics).__name__}")
        try:
            route = self._metric_routes.get(group)
        except TypeError:
            raise TypeError(f"group must be a str, got {type(group).__name__}") from None
        if route is None:
            route = self._resolve("metric", group)
        if not route or not metrics:
            return
        items: list[tuple[str, int | float | bool]] = []
        for name, value in metrics.items():
            if type(name) is not str or not name:
                name = check_name(name, "metrics key")
            if type(value) is not float and type(value) is not int:
                value = check_value(value, f"metrics[{name!r}]")
            items.append((name, value))
        if type(unit) is not str:
            raise TypeError(f"unit must be a str, got {type(unit).__name__}")
        if step is not None and type(step) is not int:
            step = check_step(step)
        tail: tuple[Any, ...] = (unit, step)
        if attributes:
            check_metric_attributes(attributes)
            tail = (unit, step, *attributes, *attributes.values())
        elif attributes is not None and not isinstance(attributes, Mapping):
            raise TypeError(f"attributes must be a mapping, got {type(attributes).__name__}")
        mono, token = _monotonic_ns(), self._token
        for name, value in items:
            route(("metric", mono, token, group, name, value, *tail))

    def event(
        self,
        name: str,
        attributes: Mapping[str, Any] | None = None,
        *,
        severity: str = "info",
        group: str = "events",
        event_id: str = "",
        span_id: str = "",
    ) -> None:
        """Record that something happened. ``attributes`` is copied (shallow)."""
        try:
            route = self._event_routes.get(group)
        except TypeError:
            raise TypeError(f"group must be a str, got {type(group).__name__}") from None
        if route is None:
            route = self._resolve("event", group)
        if not route:
            return
        if type(name) is not str or not name:
            name = check_name(name, "name")
        if type(event_id) is not str or type(span_id) is not str:
            bad, value = ("event_id", event_id) if type(event_id) is not str else ("span_id", span_id)
            raise TypeError(f"{bad} must be a str, got {type(value).__name__}")
        if severity not in _SEVERITY_SET:
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}, got {severity!r}")
        if not attributes:
            if attributes is not None and not isinstance(attributes, Mapping):
                raise TypeError(f"attributes must be a mapping, got {type(attributes).__name__}")
            route(("event", _monotonic_ns(), self._token, group, name, severity, event_id, span_id))
            return
        if not isinstance(attributes, Mapping):
            raise TypeError(f"attributes must be a mapping, got {type(attributes).__name__}")
        for key in attributes:  # keys must be str: the cheapest exact check measured (no allocation but the iterator)
            if type(key) is not str:
                check_attribute_keys(attributes, "attributes")  # a str subclass passes; anything else raises
        check_attribute_lengths(attributes, "attributes")
        # packed with the attributes flattened to the end, keys then values (see records.ATTRIBUTE_LAYOUT): a copy
        # the caller cannot change afterwards
        route(
            (
                "event",
                _monotonic_ns(),
                self._token,
                group,
                name,
                severity,
                event_id,
                span_id,
                *attributes,
                *attributes.values(),
            )
        )

    def emit(self, record: Any) -> None:
        """Route a typed record built elsewhere (samplers, stats, bridges). Not for the hottest paths."""
        if type(record) not in _RECORD_TYPES:
            raise TypeError(f"record must be a telemetrain record ({', '.join(KINDS)}), got {type(record).__name__}")
        if not isinstance(record.identity, Identity):
            raise TypeError(f"record.identity must be an Identity, got {type(record.identity).__name__}")
        route = self.route(record.kind, record.group)
        if route:
            check_record(record)  # every field as the store writes it: a bad one is refused here, naming it
            route(pack(record, token_for(record.identity)))

    def now(self) -> tuple[int, int]:
        """(monotonic ns, wall ns) on this instance's clocks, as records carry them."""
        mono = _monotonic_ns()
        return mono, mono + self._wall_offset_ns

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------------------------

    def _routes_changed(self) -> None:
        """A runner's enqueue changed (an overflowing queue guards its route): the cached routes hold the old one."""
        with self._lock:
            self._router.invalidate()

    def _after_fork_in_child(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._reporting = threading.local()
        self._install_identity(self._identity.replace(pid=os.getpid()))
        self.refresh_clock()
        for a in self._router.attachments:
            a.runner.after_fork_in_child()
        for runner in self._hook_runners.values():
            runner.after_fork_in_child()
        self._router.invalidate()
        for producer in self._producers:
            reset = getattr(producer, "after_fork_in_child", None)
            if reset is not None:
                reset()
