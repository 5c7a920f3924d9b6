"""Cross-rank aggregation: every N iterations the ranks swap their window summaries and rank 0 records the spread.

The aggregator is a background sink on this process's own ``training_metrics_update`` events (the derived metrics
the recorder computes every ``log_every_n_train_iterations``, docs/training.md). Everything happens in the sink's
thread: the training thread pays only for handing one more sink the report it already emits. At a report whose
global step reaches the next multiple of ``every``, the ranks all-gather one vector each (step, window iterations,
mean iteration / data loading / host-to-device / forward / backward / optimizer / zero_grad time, samples per
second, step interval, and -- with instrumented communication (``comm``) -- the time in and waiting in collectives,
per phase, and the wait in the collectives over every rank, which the late-rank attribution compares; and the CPU
wait and CPU time per iteration, with which the detector discounts a descheduled rank) over their own gloo group
(``exchange``), and the recording rank(s) write:

- metrics, group ``cross_rank``, step = the global step: ``cross_rank.<phase>.{min,median,max}`` and
  ``cross_rank.<phase>.{min_rank,max_rank}`` (which rank), also for ``comm_time`` and ``comm_wait``;
- events, group ``cross_rank``: ``straggler`` when a rank starts holding the others up (or being slow) and
  ``straggler_end`` when it stops, with rank, host, phase, kind, score, threshold, step and the kind's evidence.
  Which signal speaks (docs/distributed.md, "Stragglers"): when every rank reported its communication wait, the
  late-rank attribution (``late_rank``: kind ``late``, phase = the cause) replaces the detector's relative score,
  and the detector's individual score runs on compute times (waits taken out) and is not raised on a rank that
  was waiting for a late one; otherwise ``stragglers.StragglerDetector`` as it is;
- ``cross_rank_stopped`` (warning) if an exchange fails: a rank died, or did not answer within ``timeout_s``. The
  aggregator then stops for this run; training goes on.

Clock offsets (``clock_sync``): at the first report of a run every rank, and at each exchange the next
``CLOCK_PEERS`` ranks in turn (all of them up to 65 ranks), measure their clock's offset to rank 0's with NTP-style
round trips over the same group (``Exchange.clock_offset``) and record a ``clock_offset`` event (group ``clock``:
``offset_ns``, ``error_ns``, ``rtt_ns``; rank 0 records 0 each time), which ``telemetrain trace`` applies to put every
rank on rank 0's clock.

One aggregator per process: its exchange group is keyed by the run id, and a second one on the same ranks would
build a second group on the same keys and hang (then abort the process at exit). A second one raises ``ValueError``
when made, except that one the environment enabled (``TELEMETRAIN_CROSS_RANK``, set by ``telemetrain launch``) gives
way to an explicit ``enable_cross_rank`` made before its first exchange; the environment never adds a second.

Exchanges happen at the same steps on every rank because reports do. The final report of a loop is not exchanged:
at a SIGTERM it may exist on some ranks only, and the survivors would wait out the timeout at exit.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from ..dispatch import warn_safely
from ..sinks.base import Sink
from ..telemetry import Telemetry, get_telemetry
from .exchange import Exchange, ExchangeError
from .late_rank import LateRankAttributor, has_waits
from .stragglers import _WORK_PHASES, CPU_FIELDS, PHASES, Finding, StragglerDetector, phase_clock, phases_of

__all__ = ["ENV", "CrossRankAggregator", "enable_cross_rank", "enable_from_env"]

ENV = "TELEMETRAIN_CROSS_RANK"
GROUP = "cross_rank"
REPORT = "training_metrics_update"
DEFAULT_EVERY = 50
CLOCK_GROUP = "clock"
CLOCK_ROUNDS_START = 8  # round trips at the first report (the estimate the whole run leans on) ...
CLOCK_ROUNDS = 4  # ... and at each exchange,
CLOCK_PEERS = 64  # ... for this many ranks in turn: rank 0 answers ranks one after the other, so an exchange's
# clock work stays bounded at any world size; each rank's estimate is renewed every ceil((world-1)/64) exchanges
# what each rank sends (after its step and window size): the detector's phases, then ours
_FIELDS = (*PHASES, "h2d", "zero_grad", "interval", "comm_time", "comm_wait", "wait_dataloader", "wait_h2d",
           "wait_forward", "wait_backward", "wait_optimizer", "wait_zero_grad", "wait_other", "world_wait", *CPU_FIELDS)
# the training report's CPU figures of the window (totals), sent per iteration
_CPU_OF = dict(zip(CPU_FIELDS, ("cpu_wait_sec", "cpu_time_sec", "train_thread_cpu_wait_sec",
                                "train_thread_cpu_time_sec"), strict=True))
_SPREAD = (*PHASES, "comm_time", "comm_wait")
_WAIT_OF = {"dataloader": "wait_dataloader", "h2d": "wait_h2d", "forward": "wait_forward",
            "backward": "wait_backward", "optimizer": "wait_optimizer", "zero_grad": "wait_zero_grad"}


_PROCESS_LOCK = threading.Lock()
_process_aggregator: weakref.ref[CrossRankAggregator] | None = None  # this process's, while open


def _running_aggregator() -> CrossRankAggregator | None:
    """This process's cross-rank aggregator, unless closed (callers hold ``_PROCESS_LOCK``)."""
    found = _process_aggregator() if _process_aggregator is not None else None
    return found if found is not None and not found.closed else None


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def window_values(report: dict[str, Any]) -> dict[str, float]:
    """One rank's vector (``_FIELDS``) from its ``training_metrics_update`` attributes (absent: NaN; a phase's wait
    is 0 when the rank reported communication at all)."""
    out = phases_of(report)
    out["h2d"] = _number(report.get("avg_h2d_time_sec"))
    out["zero_grad"] = _number(report.get("avg_zero_grad_time_sec"))
    iterations, seconds = report.get("window_iterations"), _number(report.get("window_seconds"))
    out["interval"] = seconds / iterations if isinstance(iterations, int) and iterations > 0 else math.nan
    out["comm_time"] = _number(report.get("avg_comm_time_sec"))
    out["comm_wait"] = wait = _number(report.get("avg_comm_wait_time_sec"))
    known = math.isfinite(wait)
    for phase, key in (*_WAIT_OF.items(), ("other", "wait_other")):
        value = _number(report.get(f"avg_{phase}_comm_wait_sec"))
        out[key] = value if math.isfinite(value) else (0.0 if known else math.nan)
    out["world_wait"] = _number(report.get("avg_comm_world_wait_time_sec"))
    for field, key in _CPU_OF.items():  # (the detector's busy-machine discount)
        out[field] = (_number(report.get(key)) / iterations if isinstance(iterations, int) and iterations > 0
                      else math.nan)
    return out


def compute_values(values: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    """The detector's view with communication known: each work phase less the wait in it."""
    out = {}
    for rank, v in values.items():
        w = dict(v)
        for phase, key in _WAIT_OF.items():
            wait = v.get(key, math.nan)
            if phase in w and math.isfinite(w[phase]):
                w[phase] = max(w[phase] - (wait if math.isfinite(wait) else 0.0), 0.0)
        out[rank] = w
    return out


class CrossRankAggregator(Sink):
    """See the module docstring. ``record_on``: ``"zero"`` (rank 0 records) or ``"all"``."""

    name = "cross_rank"
    kinds = frozenset({"event"})

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        every: int = DEFAULT_EVERY,
        timeout_s: float = 60.0,
        record_on: str = "zero",
        detector: StragglerDetector | None = None,
        late: LateRankAttributor | None = None,
        clock_sync: bool = True,
    ) -> None:
        if type(every) is not int or every < 1:
            raise ValueError(f"every must be an int >= 1 (iterations), got {every!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        if record_on not in ("zero", "all"):
            raise ValueError(f"record_on must be 'zero' or 'all', got {record_on!r}")
        if detector is not None and not isinstance(detector, StragglerDetector):
            raise TypeError(f"detector must be a StragglerDetector, got {type(detector).__name__}")
        if late is not None and not isinstance(late, LateRankAttributor):
            raise TypeError(f"late must be a LateRankAttributor, got {type(late).__name__}")
        self.telemetry = telemetry
        self.every = every
        self.timeout_s = float(timeout_s)
        self.record_on = record_on
        self.detector = detector if detector is not None else StragglerDetector()
        self.late = late if late is not None else LateRankAttributor(min_share=self.detector.min_share,
                                                                     patience=self.detector.patience)
        self.clock_sync = bool(clock_sync)
        self.clock_syncs = 0
        self.clock_ns = 0  # wall time in clock round trips (bench/bench_cross_rank.py reports it)
        self._started_run = ""  # the run whose first report has been handled (the start's clock estimate)
        self._clock_turn = 0  # which slice of ranks renews its estimate at the next exchange
        self.exchanges = 0
        self.phase_clock = "host"  # the clock of the work phases of the last exchanged report (phase_times)
        self.cpu_ns = 0  # this thread's CPU time in exchanges and recording (bench/bench_cross_rank.py reports it)
        self.wall_ns = 0  # and the wall time, waits for the other ranks included
        self.stopped: str | None = None  # why, once an exchange failed
        self._exchange: Exchange | None = None
        self._hosts: list[str] = []
        self._next_due = every
        self._run_id = ""
        self.from_env = False  # enabled by $TELEMETRAIN_CROSS_RANK: an explicit one may take its place
        self.closed = False
        self._state_lock = threading.Lock()
        self._started = False  # it has begun an exchange: its group exists on the other ranks, it cannot give way
        self._retired = False  # it gave way to another, before any exchange
        self._claim()

    def _claim(self) -> None:
        """Become this process's aggregator, replacing one the environment enabled that has not exchanged yet."""
        global _process_aggregator
        with _PROCESS_LOCK:
            old = _running_aggregator()
            if old is not None and not (old.from_env and old._retire()):
                raise ValueError(
                    f"a cross-rank aggregator already runs in this process (every={old.every}, "
                    f"{'from $' + ENV if old.from_env else 'enabled in code'}"
                    f"{', exchanging already' if old.from_env else ''}): one per process, since a second one's "
                    "exchange group would share the first's keys and hang. Enable it once: $TELEMETRAIN_CROSS_RANK "
                    "(telemetrain launch sets it) or enable_cross_rank(), which replaces the environment's before "
                    "training starts; or close the Telemetry it is on first")
            _process_aggregator = weakref.ref(self)
        if old is not None:  # retired: it will not exchange; what it has queued is delivered, then it is closed
            old.telemetry.remove_sink(old)

    def _retire(self) -> bool:
        with self._state_lock:
            if not self._started:
                self._retired = True
            return self._retired

    def _begin(self) -> bool:
        """Whether this aggregator may exchange (it has not given way to another); from now on it cannot."""
        with self._state_lock:
            self._started = not self._retired
            return self._started

    def close(self) -> None:
        self.closed = True

    def write(self, records: Sequence[Any]) -> None:
        for record in records:
            if record.name != REPORT or record.group != "training" or self.stopped is not None:
                continue
            attributes = record.attributes or {}
            step = attributes.get("current_iteration")
            if attributes.get("final") or type(step) is not int:
                continue
            due = step + 1 >= self._next_due
            start = self.clock_sync and record.identity.run_id != self._started_run
            if not (due or start):
                continue
            if due:
                self._next_due = ((step + 1) // self.every + 1) * self.every
            cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
            self._exchange_report(record.identity, step, attributes, due)
            self.cpu_ns += time.thread_time_ns() - cpu
            self.wall_ns += time.perf_counter_ns() - wall

    def _exchange_report(self, identity: Any, step: int, report: dict[str, Any], due: bool = True) -> None:
        if identity.world_size < 2 or not self._begin():
            return
        if identity.run_id != self._run_id:  # a new attempt (or a re-identified run): a new group
            self._exchange, self._run_id = None, identity.run_id
        starting = identity.run_id != self._started_run
        self._started_run = identity.run_id
        self.phase_clock = phase_clock(report)  # said in the straggler events of the work phases
        values_of = window_values(report)
        window = report.get("window_iterations")
        vector = [float(step), float(window) if isinstance(window, int) else math.nan]
        vector += [values_of[f] for f in _FIELDS]
        try:
            if self._exchange is None:
                self._exchange = Exchange(identity.rank, identity.world_size, identity.run_id, self.timeout_s)
                self._hosts = self._exchange.hosts(identity.host)
            rows = self._exchange.allgather(vector) if due else []
            if self.clock_sync:
                self._sync_clock(identity, step, CLOCK_ROUNDS_START if starting else CLOCK_ROUNDS, starting)
        except ExchangeError as exc:
            self._stop(str(exc), step)
            return
        if not due:
            return
        self.exchanges += 1
        if self.record_on == "zero" and identity.rank != 0:
            return
        steps = {int(row[0]) for row in rows}
        if len(steps) != 1:
            self.telemetry.event("cross_rank_misaligned", {"steps": ",".join(map(str, sorted(steps))), "step": step},
                                 group=GROUP, severity="warning")
            return
        values = {rank: dict(zip(_FIELDS, row[2:], strict=True)) for rank, row in enumerate(rows)}
        self._record_spread(step, values)
        if has_waits(values):
            iterations = int(rows[0][1]) if math.isfinite(rows[0][1]) else 0
            late_changes, verdict = self.late.update(step, values, iterations)
            waiting = frozenset(values) - frozenset(verdict.late) if verdict is not None else frozenset()
            changes = late_changes + self.detector.update(step, compute_values(values), relative=False,
                                                          waiting=waiting)
        else:
            changes = self.detector.update(step, values)
        for finding in changes:
            self._record_finding(finding)

    def _sync_clock(self, identity: Any, step: int, rounds: int, starting: bool) -> None:
        assert self._exchange is not None
        telemetry = self.telemetry
        peers = None
        if starting:
            self._clock_turn = 0
        else:  # the next slice of CLOCK_PEERS ranks (the same on every rank: exchanges are aligned)
            slices = max(-(-(identity.world_size - 1) // CLOCK_PEERS), 1)
            first = 1 + (self._clock_turn % slices) * CLOCK_PEERS
            peers = range(first, min(first + CLOCK_PEERS, identity.world_size))
            self._clock_turn += 1
        began = time.perf_counter_ns()
        found = self._exchange.clock_offset(lambda: telemetry.now()[1], rounds, peers)
        self.clock_ns += time.perf_counter_ns() - began
        if found is None:
            return  # not this rank's turn
        offset, error, rtt = found
        self.clock_syncs += 1
        telemetry.event("clock_offset", {"offset_ns": offset, "error_ns": error, "rtt_ns": rtt, "rounds": rounds,
                                         "reference_rank": 0, "step": step, "at": "start" if starting else "exchange"},
                        group=CLOCK_GROUP)

    def _record_spread(self, step: int, values: dict[int, dict[str, float]]) -> None:
        metric = self.telemetry.metric
        for phase in _SPREAD:
            present = {r: v[phase] for r, v in values.items() if math.isfinite(v[phase])}
            if not present:
                continue
            unit = "{sample}/s" if phase == "samples_per_second" else "s"  # (as train.samples_per_second)
            low = min(present, key=lambda r: (present[r], r))
            high = max(present, key=lambda r: (present[r], -r))
            metric(f"cross_rank.{phase}.min", present[low], GROUP, unit=unit, step=step)
            metric(f"cross_rank.{phase}.median", statistics.median(present.values()), GROUP, unit=unit, step=step)
            metric(f"cross_rank.{phase}.max", present[high], GROUP, unit=unit, step=step)
            metric(f"cross_rank.{phase}.min_rank", low, GROUP, step=step)
            metric(f"cross_rank.{phase}.max_rank", high, GROUP, step=step)

    def _record_finding(self, f: Finding) -> None:
        host = self._hosts[f.rank] if 0 <= f.rank < len(self._hosts) else ""
        self.telemetry.event(
            "straggler_end" if f.ended else "straggler",
            {"rank": f.rank, "host": host, "phase": f.phase, "kind": f.kind, "score": f.score,
             "threshold": f.threshold, "step": f.step, "value": f.value, "reference": f.reference,
             "time": self.phase_clock if f.phase in _WORK_PHASES else "host", **f.evidence},
            group=GROUP,
            severity="info" if f.ended else "warning",
        )

    def _stop(self, reason: str, step: int) -> None:
        self.stopped = reason
        self._exchange = None
        warn_safely(f"telemetrain: cross-rank aggregation stopped at step {step}: {reason}")
        self.telemetry.event("cross_rank_stopped", {"reason": reason, "step": step}, group=GROUP, severity="warning")


def enable_cross_rank(
    telemetry: Telemetry | None = None,
    *,
    every: int = DEFAULT_EVERY,
    timeout_s: float = 60.0,
    record_on: str = "zero",
    detector: StragglerDetector | None = None,
    clock_sync: bool = True,
) -> CrossRankAggregator:
    """Attach a cross-rank aggregator to ``telemetry`` (default: the default Telemetry). Every rank must enable it
    with the same ``every``; the exchange starts at the first report that reaches step ``every``. One per process:
    ``ValueError`` if one runs already, unless the environment enabled it and it has not exchanged yet (then this
    one replaces it)."""
    telemetry = telemetry if telemetry is not None else get_telemetry()
    aggregator = CrossRankAggregator(telemetry, every=every, timeout_s=timeout_s, record_on=record_on,
                                     detector=detector, clock_sync=clock_sync)
    telemetry.add_sink(aggregator, kinds="event", groups="training")
    return aggregator


def enable_from_env(telemetry: Telemetry) -> CrossRankAggregator | None:
    """``$TELEMETRAIN_CROSS_RANK``: ``1``/``on`` (every 50 iterations) or a number of iterations; unset/``0``/``off``:
    not. ``telemetrain launch`` sets it. A bad value is warned about and ignored (it comes from the environment)."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in ("", "0", "off", "false", "no"):
        return None
    try:
        every = DEFAULT_EVERY if raw in ("1", "on", "true", "yes") else int(raw)
    except ValueError as exc:
        warn_safely(f"telemetrain: ${ENV}={raw!r} is not on/off or a number of iterations: {exc}")
        return None
    with _PROCESS_LOCK:
        if _running_aggregator() is not None:  # (enabled in code, or for another Telemetry): that one goes on
            return None
    try:
        aggregator = enable_cross_rank(telemetry, every=every)
    except ValueError as exc:
        warn_safely(f"telemetrain: ${ENV}={raw!r}: {exc}")
        return None
    aggregator.from_env = True
    return aggregator
