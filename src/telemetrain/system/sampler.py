"""The sampler: one background thread per process that reads the sources every ``interval`` seconds and records the
values as metric records (run store, console, any sink) and as gauges (``stats.registry``: Prometheus, reports).

Lifecycle. Nothing runs at import. ``start()`` starts the thread, whose first cycle samples at once (a short run
still has data); ``stop()`` ends it and takes a last sample. ``Telemetry.close()`` stops the samplers that record
into it, with that last sample, before its sinks close: so do exit and SIGTERM, through the producer hook every
``Telemetry`` already has (no signal handler of our own). Start and stop are idempotent and may race from any
threads. A forked child inherits no running sampler (its thread does not exist there): its samplers are stopped,
forget the parent's readings and may be started again; the child's records then carry the child's pid.

Why a thread of its own rather than the stats collector's: NVML calls can block for a long time on a GPU in trouble
(they release the GIL meanwhile, so training is not held up), and that must not delay the closing of stat windows.

Failures never reach the program: a source or value that raises is counted (``errors``, ``error_counts``), warned
about once per sampler (``TelemetryWarning``) and recorded once per kind as a ``Diagnostic("sampler_error")``; that
value is absent from the data until it reads again. Arguments are checked at the call (``TypeError``/``ValueError``).
What a cycle's values become (records, gauges, events) and the failure accounting are in ``sampler_output``; the
arguments' checks and the sources they make, in ``sampler_sources``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from ..dispatch import describe, warn_safely
from ..stats.gauge import Gauge
from ..telemetry import Telemetry, get_telemetry
from .base import Cycle, Source
from .names import GROUP
from .nvml import NvmlSource
from .sampler_output import SamplerOutput
from .sampler_sources import (
    MIN_INTERVAL_S,
    GpuRequest,
    SamplerSources,
    _check_bool,
    _check_gpus,
    _check_interval,
    _check_paths,
)

__all__ = [
    "DEFAULT_INTERVAL_S",
    "ENV",
    "MIN_INTERVAL_S",
    "Sampler",
    "enable_from_env",
    "get_sampler",
    "start_sampler",
    "stop_sampler",
]

DEFAULT_INTERVAL_S = 10.0  # W&B samples every 15 s, MLflow every 10 s
CLOSE_TIMEOUT_S = 2.0  # of the exit/SIGTERM budget, what stopping the sampler may take
_EXTENSION = "system.sampler"
_mono = time.monotonic_ns


# -- the sampler -----------------------------------------------------------------------------------------------------


_all: weakref.WeakSet[Sampler] = weakref.WeakSet()
_fork_hook = {"installed": False}


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # another thread may have held it at the fork
    for sampler in list(_all):
        try:
            sampler._after_fork_in_child()
        except Exception:  # noqa: BLE001 - a child must start even if our reset failed
            pass


class _TelemetryHook:
    """The producer every ``Telemetry`` with a sampler gets: its close (exit, SIGTERM included) stops the samplers
    recording into it, with a last sample, while its sinks still listen."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.samplers: weakref.WeakSet[Sampler] = weakref.WeakSet()
        telemetry.add_producer(self)

    def collect(self, final: bool) -> None:
        if final:
            for sampler in list(self.samplers):
                sampler.stop(CLOSE_TIMEOUT_S, reason="close")

    def after_fork_in_child(self) -> None:  # the samplers reset themselves (_after_fork_in_child)
        pass


class Sampler(SamplerOutput, SamplerSources):
    """Samples host, process tree, GPUs and the torch.cuda allocator every ``interval`` seconds into ``telemetry``
    (default: the default instance).

    ``host``: record host-wide metrics (CPU, memory, swap, disk and network I/O, filesystems); default: only on local
    rank 0, once per node. ``process_tree``: include descendants (DataLoader workers). ``gpus``: see
    ``telemetrain.system.devices`` (default: this rank's GPUs; ``[]``: none; ``"all"``). ``disk_paths``: filesystems
    whose usage to record (default: ``/`` and the run store's). ``cuda_allocator``: read torch.cuda's allocator when
    the program has initialised CUDA.
    """

    def __init__(
        self,
        telemetry: Telemetry | None = None,
        *,
        interval: float = DEFAULT_INTERVAL_S,
        host: bool | None = None,
        process_tree: bool = True,
        gpus: GpuRequest = None,
        disk_paths: Sequence[str | os.PathLike[str]] | None = None,
        cuda_allocator: bool = True,
    ) -> None:
        if telemetry is not None and not isinstance(telemetry, Telemetry):
            raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
        self.interval = _check_interval(interval)
        self._host = _check_bool(host, "host", allow_none=True)
        self._process_tree = bool(_check_bool(process_tree, "process_tree"))
        self._gpus = _check_gpus(gpus)
        self._disk_paths = _check_paths(disk_paths)
        self._cuda_allocator = bool(_check_bool(cuda_allocator, "cuda_allocator"))
        self._telemetry = telemetry if telemetry is not None else get_telemetry()
        self._reset_state()
        _all.add(self)
        if not _fork_hook["installed"] and hasattr(os, "register_at_fork"):
            with _lock:
                if not _fork_hook["installed"]:
                    os.register_at_fork(after_in_child=_after_fork_in_child)
                    _fork_hook["installed"] = True

    def _reset_state(self) -> None:
        self._pid = os.getpid()
        # re-entrant: SIGTERM's close (stop) may interrupt this thread's own start or stop
        self._state_lock = threading.RLock()
        self._sample_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop_event: threading.Event | None = None
        self._running = False
        self._sources: list[Source] | None = None
        self._nvml: NvmlSource | None = None
        self._energy_probed = False
        self._sampling_ident: int | None = None
        self._latest: dict[tuple[str, str], int | float] = {}
        self._recorded: dict[tuple[str, str], int | float] = {}  # last recorded value of the SET_ON_CHANGE ones
        self._series: dict[tuple[str, str], tuple[str, str, dict[str, Any] | None]] = {}  # -> name, unit, attributes
        self._gauges: dict[tuple[str, str], Gauge] = {}
        self._no_new_gauges = False
        self._warned = False
        self.samples = 0
        self.errors = 0
        self.error_counts: dict[str, int] = {}
        self.cpu_ns = 0  # thread CPU time spent in sampling cycles
        self.sessions = 0
        self.first_sample = threading.Event()

    # -- lifecycle --------------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running and self._pid == os.getpid()

    def start(self) -> Sampler:
        """Start the thread (its first cycle samples at once). Idempotent. ``RuntimeError`` if the Telemetry is
        closed."""
        with self._state_lock:
            if self._pid != os.getpid():  # forked without our hook having run
                self._after_fork_in_child()
            if self._running:
                return self
            if self._telemetry.closed:
                raise RuntimeError("this Telemetry is closed: a sampler cannot record into it")
            hook: _TelemetryHook = self._telemetry.extension(_EXTENSION, _TelemetryHook)
            hook.samplers.add(self)
            # Resolve our route here, in the caller's thread (usually the main one): that is where the exit and
            # SIGTERM handlers can be installed; from the sampler thread they could not, and a program whose only
            # records are samples would die of SIGTERM without its last sample.
            self._telemetry.listening("metric", GROUP)
            event = threading.Event()
            thread = threading.Thread(target=self._run, args=(event,), name="telemetrain-sampler", daemon=True)
            self._thread, self._stop_event, self._running = thread, event, True
            self.sessions += 1
            self._no_new_gauges = False
            thread.start()
        return self

    def stop(self, timeout: float | None = 5.0, *, reason: str = "stop") -> bool:
        """Stop the thread and take a last sample. Idempotent. False if the thread did not end within ``timeout``
        (stuck in a driver call): it is abandoned (a daemon) and that last sample is skipped."""
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(f"timeout must be None or a number of seconds, got {type(timeout).__name__}")
            if not timeout >= 0:
                raise ValueError(f"timeout must be None or seconds >= 0, got {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._state_lock:
            if not self._running or self._pid != os.getpid():
                return True
            self._running = False
            thread, event = self._thread, self._stop_event
            self._thread = self._stop_event = None
        assert thread is not None and event is not None
        event.set()
        if thread is not threading.current_thread():
            try:
                thread.join(timeout)
            except RuntimeError:  # interrupted our own start() before the thread started: it will see the event
                pass
        joined = not thread.is_alive() or thread is threading.current_thread() or thread.ident is None
        final = False
        if joined:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            final = self._final_cycle(left)
        else:
            self._fail("sampler thread", TimeoutError(f"did not stop within {timeout} s (a driver call hanging?)"))
        self._no_new_gauges = True
        self._event(
            GROUP,
            "system.sampler.stop",
            {
                "reason": reason,
                "final_sample": final,
                "samples": self.samples,
                "errors": self.errors,
                "cpu_seconds": round(self.cpu_ns / 1e9, 6),
            },
        )
        self._close_gauges()
        return joined

    def _final_cycle(self, timeout: float | None) -> bool:
        if self._sampling_ident == threading.get_ident():
            return False  # re-entered from inside a cycle (a signal handler): that cycle's data stands
        if not self._sample_lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        try:
            self._no_new_gauges = True  # the pipeline may be closing: register nothing new now
            self._cycle(start=False)
        finally:
            self._sample_lock.release()
        return True

    def _run(self, event: threading.Event) -> None:
        interval_ns = round(self.interval * 1e9)
        try:
            with self._sample_lock:
                self._cycle(start=True)
            due = _mono() + interval_ns
            while not event.wait(max(0.0, (due - _mono()) / 1e9)):
                if self._telemetry.closed:  # closed while start() raced its close: nothing listens, end quietly
                    with self._state_lock:
                        if self._stop_event is event:
                            self._running = False
                            self._thread = self._stop_event = None
                    break
                with self._sample_lock:
                    if event.is_set():  # stop() came while we waited for the lock: its final sample follows
                        break
                    self._cycle(start=False, thorough=False)
                due += interval_ns
                now = _mono()
                if due <= now:  # fell behind (a suspended process, a slow driver): no burst of catch-up samples
                    due = now + interval_ns
        except BaseException as exc:  # noqa: BLE001 - the thread ends; the program must not see it
            self._fail("sampler thread", exc)

    def sample_now(self) -> dict[tuple[str, str], int | float]:
        """Take one sample now, in this thread (serialised with the sampler's own); returns what it read,
        ``{(group, name): value}``. Works whether or not the thread runs."""
        with self._sample_lock:
            return self._cycle(start=self.samples == 0)

    # -- one cycle --------------------------------------------------------------------------------------------------

    def _cycle(self, start: bool, thorough: bool = True) -> dict[tuple[str, str], int | float]:
        """One sample of every source. Holds ``_sample_lock``. Never raises. ``thorough``: no cost-saving shortcut
        (the periodic samples take them; the first, the last and those on demand do not)."""
        self._sampling_ident = threading.get_ident()
        c0 = time.thread_time_ns()
        out: dict[tuple[str, str], int | float] = {}
        try:
            if self._sources is None:
                self._sources = self._build_sources()
            cycle = Cycle(_mono(), self._fail, thorough)
            if not self._energy_probed and self._nvml is not None:
                self._energy_probed = True
                self._nvml.probe_energy(cycle)
            if start:
                self._start_events()
            for source in self._sources:
                try:
                    source.sample(cycle)
                except Exception as exc:  # noqa: BLE001
                    self._fail(source.name, exc)
            out = self._publish(cycle)
            self.samples += 1
            self.first_sample.set()
        except Exception as exc:  # noqa: BLE001 - building a source failed, say: counted and recorded
            self._fail("sampler", exc)
        finally:
            self.cpu_ns += time.thread_time_ns() - c0
            self._sampling_ident = None
        return out

    # -- fork ---------------------------------------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        gauges = list(self._gauges.values())
        sessions = self.sessions
        self._reset_state()  # the parent's thread does not exist here; its readings are the parent's
        self.sessions = sessions
        for gauge in gauges:
            try:
                gauge.close()
            except Exception:  # noqa: BLE001
                pass

    # -- readings ---------------------------------------------------------------------------------------------------

    def latest(self) -> dict[tuple[str, str], int | float]:
        """The most recent value of everything sampled, ``{(group, name): value}``."""
        return dict(self._latest)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"Sampler({state}, interval={self.interval}, samples={self.samples}, errors={self.errors})"


# -- the process-wide sampler --------------------------------------------------------------------------------------

_lock = threading.RLock()
_active: dict[str, Sampler | None] = {"sampler": None}


def start_sampler(
    telemetry: Telemetry | None = None,
    *,
    interval: float = DEFAULT_INTERVAL_S,
    host: bool | None = None,
    process_tree: bool = True,
    gpus: GpuRequest = None,
    disk_paths: Sequence[str | os.PathLike[str]] | None = None,
    cuda_allocator: bool = True,
) -> Sampler:
    """Start this process's sampler (see ``Sampler`` for the arguments) and return it. Called again with the same
    arguments: the running one is returned; with others: it is stopped (with its last sample) and a new one starts."""
    sampler = Sampler(
        telemetry,
        interval=interval,
        host=host,
        process_tree=process_tree,
        gpus=gpus,
        disk_paths=disk_paths,
        cuda_allocator=cuda_allocator,
    )
    with _lock:
        current = _active["sampler"]
        if current is not None and current.running:
            if current.telemetry is sampler.telemetry and current.config() == sampler.config():
                _all.discard(sampler)
                return current
            current.stop()
        _active["sampler"] = sampler
        return sampler.start()


def stop_sampler(timeout: float | None = 5.0) -> bool:
    """Stop this process's sampler, with a last sample. Idempotent (True if none runs)."""
    with _lock:
        current = _active["sampler"]
    return True if current is None else current.stop(timeout)


ENV = "TELEMETRAIN_SYSTEM"
_OFF = {"", "0", "off", "false", "no"}
_ON = {"1", "on", "true", "yes"}


def enable_from_env(telemetry: Telemetry | None = None) -> Sampler | None:
    """Start this process's sampler if ``$TELEMETRAIN_SYSTEM`` asks for it: ``1``/``on``/``true`` (every
    ``DEFAULT_INTERVAL_S``) or an interval in seconds; unset, ``0`` or ``off``: not. The config flag for launchers
    and job scripts. A value that is neither is warned about and ignored (it comes from the environment, not from a
    call the program made); so is a sampler that cannot start."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in _OFF or _in_dataloader_worker():
        return None
    try:
        interval = DEFAULT_INTERVAL_S if raw in _ON else _check_interval(float(raw))
    except ValueError:
        warn_safely(f"telemetrain: ${ENV}={raw!r} is not on/off or an interval in seconds >= {MIN_INTERVAL_S}; "
                    "no system sampler")
        return None
    try:
        return start_sampler(telemetry, interval=interval)
    except Exception as exc:  # noqa: BLE001 - a closed Telemetry, say: the job goes on without samples
        warn_safely(f"telemetrain: the system sampler asked for by ${ENV} did not start: {describe(exc)}")
        return None


def _in_dataloader_worker() -> bool:
    """Whether this is a torch DataLoader worker: a spawned or forkserver worker inherits ``$TELEMETRAIN_SYSTEM`` and,
    through any telemetrain call, would start a sampler of its own -- host metrics again (it inherits ``LOCAL_RANK``)
    and CPU and memory its parent's process tree already counts. (A forked one inherits no running sampler.)"""
    data = sys.modules.get("torch.utils.data")  # never imported here: a worker has it already
    info = getattr(data, "get_worker_info", None)
    try:
        return info is not None and info() is not None
    except Exception:  # noqa: BLE001 - not knowing is not being one
        return False


def get_sampler() -> Sampler | None:
    """This process's sampler (running or stopped), if ``start_sampler`` was called."""
    return _active["sampler"]
