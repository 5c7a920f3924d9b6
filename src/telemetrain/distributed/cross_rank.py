"""Cross-rank aggregation: every N iterations the ranks swap their window summaries and rank 0 records the spread.

The aggregator is a background sink on this process's own ``training_metrics_update`` events (the derived metrics
the recorder computes every ``log_every_n_train_iterations``, docs/training.md). Everything happens in the sink's
thread: the training thread pays only for handing one more sink the report it already emits. At a report whose
global step reaches the next multiple of ``every``, the ranks all-gather one vector each (step, window iterations,
mean iteration / data loading / forward / backward / optimizer time, samples per second) over their own gloo group
(``exchange``), and the recording rank(s) write:

- metrics, group ``cross_rank``, step = the global step: ``cross_rank.<phase>.{min,median,max}`` and
  ``cross_rank.<phase>.{min_rank,max_rank}`` (which rank);
- events, group ``cross_rank``: ``straggler`` when a rank starts being slow in a phase and ``straggler_end`` when it
  stops (``stragglers.StragglerDetector``), with rank, host, phase, kind, score, threshold, step;
- ``cross_rank_stopped`` (warning) if an exchange fails: a rank died, or did not answer within ``timeout_s``. The
  aggregator then stops for this run; training goes on.

Exchanges happen at the same steps on every rank because reports do. The final report of a loop is not exchanged:
at a SIGTERM it may exist on some ranks only, and the survivors would wait out the timeout at exit.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from ..dispatch import warn_safely
from ..sinks.base import Sink
from ..telemetry import Telemetry, get_telemetry
from .exchange import Exchange, ExchangeError
from .stragglers import _WORK_PHASES, PHASES, Finding, StragglerDetector, phase_clock, phases_of

__all__ = ["ENV", "CrossRankAggregator", "enable_cross_rank", "enable_from_env"]

ENV = "TELEMETRAIN_CROSS_RANK"
GROUP = "cross_rank"
REPORT = "training_metrics_update"
DEFAULT_EVERY = 50
_PHASE_LIST = tuple(PHASES)


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
    ) -> None:
        if type(every) is not int or every < 1:
            raise ValueError(f"every must be an int >= 1 (iterations), got {every!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        if record_on not in ("zero", "all"):
            raise ValueError(f"record_on must be 'zero' or 'all', got {record_on!r}")
        if detector is not None and not isinstance(detector, StragglerDetector):
            raise TypeError(f"detector must be a StragglerDetector, got {type(detector).__name__}")
        self.telemetry = telemetry
        self.every = every
        self.timeout_s = float(timeout_s)
        self.record_on = record_on
        self.detector = detector if detector is not None else StragglerDetector()
        self.exchanges = 0
        self.phase_clock = "host"  # the clock of the work phases of the last exchanged report (phase_times)
        self.cpu_ns = 0  # this thread's CPU time in exchanges and recording (bench/bench_cross_rank.py reports it)
        self.wall_ns = 0  # and the wall time, waits for the other ranks included
        self.stopped: str | None = None  # why, once an exchange failed
        self._exchange: Exchange | None = None
        self._hosts: list[str] = []
        self._next_due = every
        self._run_id = ""

    def write(self, records: Sequence[Any]) -> None:
        for record in records:
            if record.name != REPORT or record.group != "training" or self.stopped is not None:
                continue
            attributes = record.attributes or {}
            step = attributes.get("current_iteration")
            if attributes.get("final") or type(step) is not int or step + 1 < self._next_due:
                continue
            self._next_due = ((step + 1) // self.every + 1) * self.every
            cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
            self._exchange_report(record.identity, step, attributes)
            self.cpu_ns += time.thread_time_ns() - cpu
            self.wall_ns += time.perf_counter_ns() - wall

    def _exchange_report(self, identity: Any, step: int, report: dict[str, Any]) -> None:
        if identity.world_size < 2:
            return
        if identity.run_id != self._run_id:  # a new attempt (or a re-identified run): a new group
            self._exchange, self._run_id = None, identity.run_id
        phases = phases_of(report)
        self.phase_clock = phase_clock(report)  # said in the straggler events of the work phases
        window = report.get("window_iterations")
        vector = [float(step), float(window) if isinstance(window, int) else math.nan]
        vector += [phases[p] for p in _PHASE_LIST]
        try:
            if self._exchange is None:
                self._exchange = Exchange(identity.rank, identity.world_size, identity.run_id, self.timeout_s)
                self._hosts = self._exchange.hosts(identity.host)
            rows = self._exchange.allgather(vector)
        except ExchangeError as exc:
            self._stop(str(exc), step)
            return
        self.exchanges += 1
        if self.record_on == "zero" and identity.rank != 0:
            return
        steps = {int(row[0]) for row in rows}
        if len(steps) != 1:
            self.telemetry.event("cross_rank_misaligned", {"steps": ",".join(map(str, sorted(steps))), "step": step},
                                 group=GROUP, severity="warning")
            return
        values = {rank: dict(zip(_PHASE_LIST, row[2:], strict=True)) for rank, row in enumerate(rows)}
        self._record_spread(step, values)
        for finding in self.detector.update(step, values):
            self._record_finding(finding)

    def _record_spread(self, step: int, values: dict[int, dict[str, float]]) -> None:
        metric = self.telemetry.metric
        for phase in _PHASE_LIST:
            present = {r: v[phase] for r, v in values.items() if math.isfinite(v[phase])}
            if not present:
                continue
            unit = "1/s" if phase == "samples_per_second" else "s"
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
             "time": self.phase_clock if f.phase in _WORK_PHASES else "host"},
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
) -> CrossRankAggregator:
    """Attach a cross-rank aggregator to ``telemetry`` (default: the default Telemetry). Every rank must enable it
    with the same ``every``; the exchange starts at the first report that reaches step ``every``."""
    telemetry = telemetry if telemetry is not None else get_telemetry()
    aggregator = CrossRankAggregator(telemetry, every=every, timeout_s=timeout_s, record_on=record_on,
                                     detector=detector)
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
        return enable_cross_rank(telemetry, every=every)
    except ValueError as exc:
        warn_safely(f"telemetrain: ${ENV}={raw!r} is not on/off or a number of iterations: {exc}")
        return None
