"""What the system ``Sampler`` makes of each cycle (a base class of it): a metric record per value (those in
``SET_ON_CHANGE`` only when they change), a gauge per series in the stats registry (``_SampledGauge``: it reads the
latest sample, or the torch.cuda allocator when read), the ``system.sampler.start`` and GPU description events, and
the failures: counted, warned about once, recorded once per kind as ``Diagnostic("sampler_error")``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..dispatch import describe, warn_safely
from ..records import Diagnostic
from ..stats.gauge import Gauge
from ..telemetry import Telemetry
from .base import Cycle, Source
from .cuda_allocator import STATS as CUDA_STATS
from .cuda_allocator import reader
from .names import CATALOGUE, GROUP, SET_ON_CHANGE, gpu_group, record_series
from .nvml import NvmlSource

__all__ = ["SamplerOutput"]


# -- gauges ----------------------------------------------------------------------------------------------------------


class _SampledGauge(Gauge):
    """A gauge in the stats registry whose value comes from the sampler: ``read()`` gives the latest sample (or, for
    the torch.cuda allocator, reads the allocator now). It does not record on its own: the sampler's records are
    the time series, and a flush must not add copies of them."""

    def collect(self) -> None:
        pass


class SamplerOutput:
    """Records, gauges, events and failures of a ``Sampler`` (which sets these fields in ``_reset_state``)."""

    interval: float
    sessions: int
    errors: int
    error_counts: dict[str, int]
    _telemetry: Telemetry
    _sources: list[Source] | None
    _nvml: NvmlSource | None
    _latest: dict[tuple[str, str], int | float]
    _recorded: dict[tuple[str, str], int | float]  # last recorded value of the SET_ON_CHANGE ones
    _series: dict[tuple[str, str], tuple[str, str, dict[str, Any] | None]]  # -> name, unit, attributes
    _gauges: dict[tuple[str, str], Gauge]
    _no_new_gauges: bool
    _warned: bool

    if TYPE_CHECKING:  # (the Sampler's)
        def _records_host(self) -> bool: ...

    def _publish(self, cycle: Cycle) -> dict[tuple[str, str], int | float]:
        telemetry = self._telemetry
        metric = telemetry.metric
        latest = dict(self._latest)
        out: dict[tuple[str, str], int | float] = {}
        for group, name, value in cycle.values:
            key = (group, name)
            out[key] = latest[key] = value
            if name in SET_ON_CHANGE:
                if self._recorded.get(key) == value:
                    continue
                self._recorded[key] = value
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = record_series(group, name)
            metric(series[0], value, group, unit=series[1], attributes=series[2])
            if key not in self._gauges and not self._no_new_gauges:
                self._add_gauge(group, name)
        self._latest = latest  # replaced whole: a gauge read in another thread sees one sample or the next
        return out

    def _add_gauge(self, group: str, name: str) -> None:
        unit, help_text = CATALOGUE.get(name, ("", ""))
        fn: Callable[[], int | float | None]
        if group.startswith(f"{GROUP}.cuda.") and name in CUDA_STATS:
            fn = reader(int(group.rsplit(".", 1)[1]), CUDA_STATS[name])  # a callback gauge: read when read
        else:
            key = (group, name)

            def fn() -> int | float | None:
                return self._latest.get(key)

        try:
            self._gauges[(group, name)] = _SampledGauge(
                name, fn, unit=unit, help=help_text, group=group, interval=None, telemetry=self._telemetry
            )
        except Exception as exc:  # noqa: BLE001 - no gauge, the records still flow
            self._fail("gauge", exc)

    def _close_gauges(self) -> None:
        gauges, self._gauges = list(self._gauges.values()), {}
        for gauge in gauges:
            try:
                gauge.close()
            except Exception:  # noqa: BLE001
                pass

    def _start_events(self) -> None:
        attributes: dict[str, Any] = {
            "interval_s": self.interval,
            "session": self.sessions,
            "host_metrics": self._records_host(),
        }
        for source in self._sources or ():
            try:
                attributes.update(source.describe())
            except Exception as exc:  # noqa: BLE001
                self._fail(f"{source.name} description", exc)
        self._event(GROUP, "system.sampler.start", attributes)
        nvml = self._nvml
        if nvml is not None:
            for device in nvml.devices:
                self._event(gpu_group(device.choice.nvml_index), "system.gpu.device", nvml.device_attributes(device))
            if nvml.reason:
                self._event(GROUP, "system.gpu.unavailable", {"reason": nvml.reason})

    def _event(self, group: str, name: str, attributes: dict[str, Any]) -> None:
        try:
            self._telemetry.event(name, attributes, group=group)
        except Exception as exc:  # noqa: BLE001
            warn_safely(f"telemetrain: the system sampler could not record {name}: {describe(exc)}")

    # -- failures ---------------------------------------------------------------------------------------------------

    def _fail(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        n = self.error_counts[what] = self.error_counts.get(what, 0) + 1
        if n > 1:
            return
        message = f"reading {what} failed: {describe(exc)}; it is absent from the data until it reads again"
        if not self._warned:
            self._warned = True
            warn_safely(f"telemetrain system sampler: {message} (further failures are counted and recorded)")
        telemetry = self._telemetry
        try:
            mono, wall = telemetry.now()
            telemetry.emit(
                Diagnostic(mono, wall, telemetry.identity, "telemetrain", "sampler_error", "system.sampler", 1, message)
            )
        except Exception:  # noqa: BLE001
            pass
