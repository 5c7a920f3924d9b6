"""A per-rank stall watchdog: notices when training stops advancing and writes the evidence to the run store.

One daemon thread per process (``telemetrain-watchdog``; no signal is needed to look). Every ``poll_s`` it reads
the training recorder's progress (``TrainingRecorder.progress()``: plain reads, no lock, nothing on the training
thread) and, while a training loop is open:

- **stall**: when no iteration has completed for ``max(k x p99, floor_s)`` seconds -- p99 the iteration time's 99th
  percentile so far (the recorder's cumulative one; the window's mean step interval, less its saves and validation,
  if longer), taken from the reports; ``startup_s`` until the first report -- it writes a ``stall_evidence`` event
  (group ``watchdog``, severity error; warning for the SIGTERM and exit evidence below) and flushes the run store.
  Time inside a checkpoint save/load or a validation/testing loop does not count (iterations stop advancing there by
  design).
  When iterations advance again: ``stall_end``.
- **a collective fails** (a peer died: gloo/NCCL raised; needs ``comm`` instrumentation): evidence at once -- the
  failure listener is registered at start (``comm.add_failure_listener``), and when the failure's exception ends the
  process before this thread wrote it, the close writes it (one record per failure either way).
- **SIGTERM** (torchelastic stopping the workers after another rank failed): evidence at once, from this thread --
  through a signal wakeup fd, so even while the training thread is blocked in a collective inside C++ (where
  Python's own handler cannot run until the call returns). Also when the process closes its telemetry while a
  collective is open or failed (an exception, exit): evidence at close.
- **SIGABRT** (NCCL's watchdog aborting the process): no Python code can run; ``faulthandler`` writes every
  thread's stack to ``fatal-stacks/rank-<R>.<pid>.txt`` beside the run (opened once training runs; removed at a
  clean close when empty).
- **heartbeat**: every ``heartbeat_s`` in which iterations advanced, a ``training_progress`` event (group
  ``training``: ``current_iteration``, ``num_iterations``, ``cumulative_iteration_time_sec``, the last iteration's
  end time), so that goodput can bound the progress a run killed between reports made (docs/goodput.md).

The evidence (``evidence``): reason, phase and since when, the step, stalled-for and threshold, the open spans, the
collective entered and not left (or the one that failed) with its kind and sequence number, every Python thread's
stack, and the Flight Recorder dump's path when torch's Flight Recorder is on. ``telemetrain launch``'s agent reads
the ranks' evidence and writes one ``stall`` event naming the ranks stuck elsewhere than the others
(``stall_view``).

Enable with ``enable_watchdog(telemetry, ...)`` or ``$TELEMETRAIN_WATCHDOG`` (``1``, or ``floor=5,k=10,...``;
``telemetrain launch`` sets ``1``). Fork: a forked child (a DataLoader worker) has no watchdog. The settings are
``watchdog_config``'s; the wakeup pipe, the signal wakeup fd and the fatal-signal stacks, ``watchdog_signals``'.
"""

from __future__ import annotations

import faulthandler
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, TextIO

from .. import process_hooks
from ..dispatch import describe, warn_safely
from ..spans import tracer
from ..telemetry import Telemetry, get_telemetry
from ..training.recorder import CURRENT
from ..training.reports import REPORT_SOURCES
from .comm import add_failure_listener
from .evidence import collective_state, dump_flight_recorder, open_spans, phase_state, thread_stacks
from .watchdog_config import WatchdogConfig, parse_config
from .watchdog_signals import FATAL_DIR as FATAL_DIR  # (still importable from here)
from .watchdog_signals import WatchdogSignals

__all__ = ["ENV", "StallWatchdog", "WatchdogConfig", "enable_from_env", "enable_watchdog", "parse_config"]

ENV = "TELEMETRAIN_WATCHDOG"
GROUP = "watchdog"
_EXTENSION = "distributed.watchdog"
_COMM = "distributed.comm"


class StallWatchdog(WatchdogSignals):
    """See the module docstring. Build it with ``enable_watchdog``."""

    def __init__(self, telemetry: Telemetry, config: WatchdogConfig | None = None) -> None:
        if config is not None and not isinstance(config, WatchdogConfig):
            raise TypeError(f"config must be a WatchdogConfig, got {type(config).__name__}")
        self.telemetry = telemetry
        self.config = config or WatchdogConfig()
        self.base_s: float | None = None  # p99 iteration time (or step interval), from the reports
        self.evidence_written = 0
        self.heartbeats = 0
        self.wakeups = 0
        self.stalled = False
        self.thread: threading.Thread | None = None
        self._lock = threading.RLock()
        self._stop = False
        self._key: tuple[int, str] | None = None
        self._since_ns = 0
        self._beat_ns = 0
        self._beat_done = -1
        self._failure: Any = None  # a failed collective not yet reported
        self._failure_reported: Any = None
        self._signal = ""  # a signal received and not yet reported
        self._signal_reported = False
        self._monitor: Any = None
        self._pipe: tuple[int, int] | None = None
        self._old_wakeup = -1
        self._fatal: TextIO | None = None
        self._warned = False
        self._pid = os.getpid()
        self._collected = False
        self._fatal_tried = False
        self._producer_after: Any = None  # the recorder after which this is a producer

    # -- the threshold ---------------------------------------------------------------------------------------------

    @property
    def threshold_s(self) -> float:
        """Seconds without a completed iteration that make a stall now."""
        c = self.config
        if self.base_s is None:
            return max(c.startup_s, c.floor_s)
        return max(c.k * self.base_s, c.floor_s)

    def _poll_s(self) -> float:
        if self.config.poll_s is not None:
            return float(self.config.poll_s)
        return min(max(self.threshold_s / 10, 0.1), 1.0)

    def _report_source(self) -> Any:
        """A report source (training.reports): each report's p99 feeds the threshold (read in the reporter's thread;
        adds nothing to the report)."""
        def finish(attributes: Mapping[str, Any]) -> Mapping[str, Any]:
            p99 = _num(attributes.get("cumulative_p99_iteration_time_sec"))
            if p99 is None:
                p99 = _num(attributes.get("p99_iteration_time_sec"))
            seconds, n = _num(attributes.get("window_seconds")), attributes.get("window_iterations")
            if seconds is not None:
                # less the window's saves and validation: a 20-minute save in a 10-iteration window would otherwise
                # make a 2-minute step interval, and a hang after it wait 20 minutes (past NCCL's timeout)
                seconds = max(seconds - (_num(attributes.get("window_paused_seconds")) or 0.0), 0.0)
            interval = seconds / n if seconds is not None and isinstance(n, int) and n > 0 else None
            candidates = [x for x in (p99, interval) if x is not None and x > 0]
            if candidates:
                self.base_s = max(candidates)
            return {}
        return finish

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def start(self) -> StallWatchdog:
        """Start the thread (idempotent); set up the SIGTERM wakeup and faulthandler when configured."""
        with self._lock:
            if self.thread is not None:
                return self
            self._open_pipe(self.config.on_signal)
            # the tracer before us: producers are collected newest first, and at close our evidence must see the
            # spans still open, before the tracer ends them
            tracer(self.telemetry)
            self.telemetry.add_producer(self)
            self.telemetry.extensions.setdefault(REPORT_SOURCES, []).append(self._report_source)
            # now, not at the thread's first look: a peer can die (and this rank's collective fail) before it
            add_failure_listener(self.telemetry, self._on_failure)
            self.thread = threading.Thread(target=self._run, name="telemetrain-watchdog", daemon=True)
            self.thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (without waiting long for it), give back the wakeup fd and faulthandler."""
        self._stop = True
        self._wake()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        self._give_back_wakeup()
        self._disable_fatal_stacks()

    # the Telemetry producer protocol. The watchdog is a producer newer than the tracer (see start), and registers
    # itself again once the recorder exists, so that at close it is collected before the tracer ends the open spans:
    # its evidence at a SIGTERM or an exit says where training was, not what was left after the spans were ended.
    def collect(self, final: bool) -> None:
        if os.getpid() != self._pid or (final and self._collected):
            return
        if threading.current_thread() is not self.thread:
            # a SIGTERM or a failed collective the thread has not reported yet (the process may be closing because
            # of it: the exception a dead peer raised in backward): handled here, in the flushing/closing thread
            self._read_pipe()
            if self._signal or self._pending_failure():
                self._evidence(self._reason(), flush=False, wait_s=1.0)
        if not final:
            return
        self._collected = True
        progress = self._progress()
        killed = process_hooks.ending() == "killed"
        if progress is not None and progress["loop_open"] and (killed or self._in_collective()) \
                and not (self._signal_reported or (self.stalled and not self._pending_failure())):
            self._evidence("signal" if killed else "exit", flush=False, wait_s=1.0)
        self.stop()

    def after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) has no watchdog: no thread, and the parent's wakeup fd let go."""
        self._stop = True
        self.thread = None
        self._signals_after_fork()

    # -- the thread ------------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop:
            try:
                self._wait(self._poll_s())
                if self._stop:
                    break
                self.wakeups += 1
                self._check()
            except Exception as exc:  # noqa: BLE001 - the watchdog never takes the job down
                self._warn(f"the stall watchdog failed: {describe(exc)}")
                time.sleep(1.0)

    def _on_failure(self, op: Any) -> None:
        if self._same_outage(self._failure):
            return  # the other collectives in flight (a step's other buckets) failing with the first: one record
        self._failure = op
        self._wake()

    def _same_outage(self, failure: Any) -> bool:
        """No collective launched after ``failure`` has completed: what fails or hangs now is the same outage."""
        monitor = self._comm_monitor()
        return failure is not None and monitor is not None and monitor.done_seq < failure.seq

    def _comm_monitor(self) -> Any:
        if self._monitor is None:
            self._monitor = self.telemetry.extensions.get(_COMM)
        return self._monitor

    def _progress(self) -> dict[str, Any] | None:
        recorder = self.telemetry.extensions.get(CURRENT)
        if recorder is None:
            return None
        if recorder is not self._producer_after and threading.current_thread() is self.thread:
            self._producer_after = recorder
            self.telemetry.add_producer(self)  # newest: collected first at close (see collect)
        progress: dict[str, Any] = recorder.progress()
        return progress

    def _in_collective(self) -> bool:
        monitor = self._comm_monitor()
        return monitor is not None and bool(monitor.open_ops() or self._pending_failure())

    def _pending_failure(self) -> bool:
        return self._failure is not None and self._failure is not self._failure_reported

    def _reason(self) -> str:
        if self._signal:
            return "signal"
        return "collective_failed" if self._pending_failure() else "stall"

    def _check(self) -> None:
        now = time.monotonic_ns()
        progress = self._progress()
        if self._signal or self._pending_failure():
            self._evidence(self._reason())
        if progress is None or not progress["loop_open"]:
            self._key = None
            return
        if self.config.fatal_stacks and not self._fatal_tried:  # the file, once training runs (not at enable)
            self._fatal_tried = True
            if not faulthandler.is_enabled():
                self._enable_fatal_stacks()
        key = (progress["completed"], progress["paused_in"])
        if key != self._key or progress["paused_in"]:
            if self.stalled:
                self.stalled = False
                self.telemetry.event("stall_end", {"stalled_for_s": (now - self._since_ns) / 1e9,
                                                   "step": progress["completed"] - 1}, group=GROUP)
            # a pause just ended (a checkpoint save, a validation loop): the clock starts now, not at the iteration
            # before it, or a save longer than the threshold was a stall the moment it ended
            resumed = self._key is not None and bool(self._key[1])
            self._key = key
            last = progress["last_end_ns"]
            self._since_ns = now if progress["paused_in"] or resumed or not last or key[0] == 0 else max(last, 0)
            if self._since_ns > now:
                self._since_ns = now
        self._heartbeat(progress, now)
        if not self.stalled and (now - self._since_ns) / 1e9 > self.threshold_s:
            self.stalled = True
            self._evidence("stall")

    def _heartbeat(self, progress: dict[str, Any], now: int) -> None:
        every = self.config.heartbeat_s
        if not every or progress["iterations"] == 0 or progress["completed"] == self._beat_done:
            return
        if (now - self._beat_ns) / 1e9 < every:
            return
        self._beat_ns, self._beat_done = now, progress["completed"]
        last = progress["last_end_ns"]
        attributes: dict[str, Any] = {"current_iteration": progress["completed"] - 1,
                                      "num_iterations": progress["iterations"],
                                      "cumulative_iteration_time_sec": progress["iteration_total_sec"]}
        if last:
            attributes["last_logged_train_iterations_finish_timestamp_sec"] = (
                last + self.telemetry.wall_offset_ns) / 1e9
        self.telemetry.event("training_progress", attributes, group="training")
        self.heartbeats += 1

    # -- the evidence ----------------------------------------------------------------------------------------------

    def _evidence(self, reason: str, flush: bool = True, wait_s: float = 5.0) -> None:
        """Write one ``stall_evidence`` record now (and flush the run store unless inside a flush/close). Another
        thread writing one meanwhile: wait for it up to ``wait_s``, then give up (it is being written)."""
        if not self._lock.acquire(timeout=wait_s):
            return
        try:
            now = time.monotonic_ns()
            if reason == "signal" and self._signal_reported:
                return
            failure = self._failure
            if reason == "collective_failed" and failure is self._failure_reported:
                return
            if reason == "exit" and (not self._in_collective() or self._same_outage(self._failure_reported)):
                return  # nothing open, or what is open is part of the failure already reported
            progress = self._progress()
            attributes: dict[str, Any] = {"reason": reason, **phase_state(progress, now)}
            if reason == "signal":
                attributes["signal"] = self._signal or "SIGTERM"
            if progress is not None and progress["loop_open"] and self._since_ns:
                attributes["stalled_for_s"] = (now - self._since_ns) / 1e9
            attributes["threshold_s"] = self.threshold_s
            attributes["p99_s"] = self.base_s if self.base_s is not None else math.nan
            attributes.update(collective_state(self._comm_monitor(), now,
                                               failure if reason == "collective_failed" else None))
            attributes["open_spans"] = open_spans(self.telemetry.extensions.get("tracer"), now)
            attributes["host"] = self.telemetry.identity.host
            attributes["stacks"] = thread_stacks(self.config.stacks_limit)
            if self.config.flight_recorder:
                began = time.monotonic_ns()
                path = dump_flight_recorder(self.telemetry.run_dir, self.telemetry.identity.rank, os.getpid())
                if path:
                    attributes["flight_recorder"] = path
                    attributes["flight_recorder_s"] = (time.monotonic_ns() - began) / 1e9
            attributes["evidence_s"] = (time.monotonic_ns() - now) / 1e9  # what gathering it took
            # a stall or a dead peer is an error; a SIGTERM (a scheduler's preemption, the agent stopping the workers)
            # or an exit inside a collective is worth a look, no more
            severity = "error" if reason in ("stall", "collective_failed") else "warning"
            self.telemetry.event("stall_evidence", attributes, group=GROUP, severity=severity)
            self.evidence_written += 1
            if reason == "signal":
                self._signal_reported, self._signal = True, ""
            if failure is not None:
                self._failure_reported = failure
        except Exception as exc:  # noqa: BLE001 - evidence is best effort, training goes on
            self._warn(f"could not write stall evidence: {describe(exc)}")
            return
        finally:
            self._lock.release()
        if flush:
            self.telemetry.flush(timeout=5.0)

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warn_safely(f"telemetrain: {message}")


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def enable_watchdog(telemetry: Telemetry | None = None, config: WatchdogConfig | None = None,
                    **settings: Any) -> StallWatchdog:
    """Start the stall watchdog of ``telemetry`` (default: the default instance); ``settings`` override
    ``config``'s fields (``floor_s=5``...). Once per Telemetry: a second call returns the first watchdog."""
    t = telemetry if telemetry is not None else get_telemetry()
    base = config if config is not None else WatchdogConfig()
    chosen = replace(base, **settings) if settings else base
    watchdog: StallWatchdog = t.extension(_EXTENSION, lambda tel: StallWatchdog(tel, chosen))
    return watchdog.start()


def enable_from_env(telemetry: Telemetry) -> StallWatchdog | None:
    """``$TELEMETRAIN_WATCHDOG`` (see ``parse_config``); unset/``0``/``off``: none. A bad value is warned about
    and ignored (it comes from the environment)."""
    raw = os.environ.get(ENV, "").strip()
    if raw.lower() in ("", "0", "off", "false", "no"):
        return None
    try:
        return enable_watchdog(telemetry, parse_config(raw))
    except (ValueError, TypeError) as exc:
        warn_safely(f"telemetrain: ${ENV}={raw!r} is not a watchdog setting: {exc}")
        return None
