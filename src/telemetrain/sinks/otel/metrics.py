"""The metrics side of ``OTelSink``: a ``MetricPoint`` sets a synchronous gauge (once per batch, with the batch's
latest value), or feeds an observable counter or up-down counter when it is a cumulative reading
(``convert.is_counter``, the semantic conventions' sums); each aggregation of a ``StatWindow`` sets a gauge
``<name>.<aggregation>``, and its histogram goes out as an exponential histogram through the sink's own reader. NaN
and infinite values, which the SDK refuses, are counted in ``<prefix>non_finite`` instead."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation, _Gauge
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, ExponentialHistogram, Metric, MetricExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from ..._version import __version__
from ...dispatch import warn_safely
from ...identity import Identity
from ...semconv import SEMCONV_UPDOWN
from ...ucum import is_ucum
from .convert import histogram_point, is_counter, metric_name, otel_number, otel_resource, point_attributes, stat_unit
from .export import PushMetricReader, quiet_own_exports

__all__ = ["SCOPE", "MetricSide"]

SCOPE = "telemetrain"
_INFINITIES = (float("inf"), float("-inf"))


class MetricSide:
    """``OTelSink``'s metric records -> instruments (its state is made in ``OTelSink.__init__``)."""

    run_config: Mapping[str, Any] | None
    metric_interval: float
    metric_prefix: str
    non_ucum_units: set[str]
    non_finite_values: int
    _user_mp: MeterProvider | None
    _metric_exporter: MetricExporter | None
    _timeout_ms: int
    _meter: Meter | None
    _own_mp: SdkMeterProvider | None
    _reader: PushMetricReader | None
    _histograms: list[Metric]
    _gauges: dict[tuple[str, str], _Gauge]
    _counters: dict[tuple[str, str], dict[Any, float]]
    _point_attrs: dict[Any, dict[str, Any]]
    _latest: dict[tuple[str, str, Any], tuple[Identity, float]]
    _names: dict[tuple[str, str], tuple[str, str]]
    _last_collect: float
    _non_finite: dict[str, int]
    _non_finite_made: bool

    def _default_exporters(self, signal: str, module: str, cls: str) -> tuple[Any, Any]:
        raise NotImplementedError  # the sink's

    def _meter_for(self, identity: Identity) -> Meter:
        if self._meter is None:
            provider = self._user_mp
            if provider is None:
                mexporter, mquick = (self._metric_exporter, None) if self._metric_exporter is not None else \
                    self._default_exporters("METRICS", "metric_exporter", "OTLPMetricExporter")
                quiet_own_exports()
                self._reader = PushMetricReader(mexporter, mquick)
                resource = otel_resource(identity, self.run_config)
                self._reader.extra = (InstrumentationScope(SCOPE, __version__), resource, self._take_histograms)
                self._own_mp = provider = SdkMeterProvider(
                    metric_readers=[self._reader], resource=resource, shutdown_on_exit=False
                )
            self._meter = provider.get_meter(SCOPE, __version__)
        return self._meter

    def _point(self, group: str, labels: dict[str, Any] | None) -> Any:
        """The key of a data point (group and attributes), its attributes cached under it."""
        key = (group, tuple(labels.items())) if labels else group
        if key not in self._point_attrs:
            if len(self._point_attrs) >= 100_000:  # bounded, whatever attributes come
                self._point_attrs.clear()
            self._point_attrs[key] = point_attributes(group, labels)
        return key

    def _attrs_of(self, key: Any) -> dict[str, Any]:
        found = self._point_attrs.get(key)
        if found is None:  # dropped by the bound meanwhile: rebuilt
            group, items = (key, None) if isinstance(key, str) else (key[0], dict(key[1]))
            found = self._point_attrs[key] = point_attributes(group, items)
        return found

    def _name(self, name: str, unit: str) -> tuple[str, str]:
        known = self._names.get((name, unit))
        if known is None:
            if not is_ucum(unit):
                self.non_ucum_units.add(unit)
                if len(self.non_ucum_units) == 1:
                    warn_safely(f"telemetrain: unit {unit!r} of metric {name!r} is not a UCUM unit "
                                "(https://ucum.org), as OpenTelemetry asks: use 's', 'By', '1', '{thing}' (further "
                                "units are not warned about)")
            kind = "counter" if is_counter(name, unit) else "updown" if name in SEMCONV_UPDOWN else "gauge"
            known = self._names[(name, unit)] = (metric_name(name, self.metric_prefix), kind)
        return known

    def _metric(self, record: Any) -> None:
        value = record.value
        if type(value) is not float:  # (the common case costs no call)
            value = otel_number(value)
        name, kind = self._name(record.name, record.unit)
        point = self._point(record.group, record.attributes)
        if kind != "gauge":
            self._count(record.identity, name, record.unit, point, value, kind == "counter")
        else:
            self._latest[(name, record.unit, point)] = (record.identity, value)

    def _stat(self, record: Any) -> None:
        base, _ = self._name(record.name, record.unit)
        point = self._point(record.group, None)
        for aggregation, value in record.values.items():
            self._latest[(f"{base}.{aggregation}", stat_unit(aggregation, record.unit), point)] = (
                record.identity, value if type(value) is float else otel_number(value))
        if record.histogram is not None and self._user_mp is None:
            self._meter_for(record.identity)  # builds the sink's own reader, which exports these
            hist = histogram_point(record, self._attrs_of(point))
            if hist is not None:
                self._histograms.append(Metric(base, record.name, record.unit, ExponentialHistogram(
                    [hist], AggregationTemporality.DELTA)))

    def _take_histograms(self) -> list[Metric]:
        taken, self._histograms = self._histograms, []
        return taken

    def _set_latest(self) -> None:
        latest, self._latest = self._latest, {}
        for (name, unit, point), (identity, value) in latest.items():
            gauge = self._gauges.get((name, unit))
            if gauge is None:
                gauge = self._gauges[(name, unit)] = self._meter_for(identity).create_gauge(name, unit=unit)
            if value != value or value in _INFINITIES:
                self._refused(identity, name)
            else:
                gauge.set(value, self._attrs_of(point))

    def _count(self, identity: Identity, name: str, unit: str, point: Any, total: float, monotonic: bool) -> None:
        """A cumulative reading: an observable counter (monotonic), or an up-down counter (a usage the conventions
        give as a non-monotonic sum: ``system.memory.usage``)."""
        values = self._counters.get((name, unit))
        if values is None:
            values = self._counters[(name, unit)] = {}
            meter = self._meter_for(identity)
            create = meter.create_observable_counter if monotonic else meter.create_observable_up_down_counter
            create(name, callbacks=[self._observer(values)], unit=unit)
        if total != total or total in _INFINITIES:
            self._refused(identity, name)
        else:
            values[point] = total

    def _refused(self, identity: Identity, name: str) -> None:
        """A NaN or infinite value: the SDK's instruments drop it (with a log line each), so the series would keep
        showing its last finite value with no sign of a diverged loss. Counted, per series, in the counter
        ``<prefix>non_finite`` (attribute ``telemetrain.metric``) a dashboard can alert on; warned about once."""
        self.non_finite_values += 1
        if self.non_finite_values == 1:
            warn_safely(f"telemetrain: metric {name!r} had a NaN or infinite value, which OpenTelemetry's SDK refuses: "
                        f"such values are counted in {self.metric_prefix}non_finite{{telemetrain.metric=...}} instead "
                        "(the gauge keeps its last finite value; further ones are not warned about)")
        if not self._non_finite_made:
            self._non_finite_made = True
            counts = self._non_finite
            self._meter_for(identity).create_observable_counter(
                f"{self.metric_prefix}non_finite", unit="{value}",
                callbacks=[lambda _: [Observation(n, {"telemetrain.metric": k}) for k, n in list(counts.items())]])
        self._non_finite[name] = self._non_finite.get(name, 0) + 1

    def _observer(self, values: dict[Any, float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            # read in the collecting thread (a periodic reader's): list() copies the dict in one C call
            return [Observation(v, self._attrs_of(p)) for p, v in list(values.items())]

        return observe

    def _collect(self) -> None:
        self._last_collect = time.monotonic()
        assert self._reader is not None
        self._reader.collect(timeout_millis=self._timeout_ms)
