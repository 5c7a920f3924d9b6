"""Record fields -> OpenTelemetry names, attributes and resources (pure functions)."""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from opentelemetry.sdk.metrics.export import Buckets, ExponentialHistogramDataPoint
from opentelemetry.sdk.resources import Resource
from opentelemetry.util.types import AttributeValue

from ...cumulative import is_cumulative
from ...identity import Identity
from ...semconv import SEMCONV_METRICS
from ..base import as_float

# The semantic conventions' metrics (semconv.SEMCONV_METRICS) keep their name, and so do torch's allocator metrics
# (``torch.cuda.*``); every other name gets a prefix, as the conventions ask of application-specific names -- the
# sampler's own names in OpenTelemetry's namespaces too (``telemetrain.hw.gpu.clock.sm``): those are reserved.
KEEP_PREFIXES = ("torch.",)

# Running totals (energy, I/O since a start...) are observable counters: the list is shared (cumulative.py).

GROUP_KEY = "telemetrain.group"
CONFIG_PREFIX = "telemetrain.config."  # the run's config: resource and root-span attributes
HPARAM_PREFIX = "telemetrain.hparam."  # hyperparameters logged later (hparams.log_hyperparams): root-span attributes
_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_./\-]")
_INT64 = 2**63


def metric_name(name: str, prefix: str) -> str:
    """A valid OTel instrument name (``[A-Za-z][A-Za-z0-9_./-]{0,254}``) for a record name."""
    full = name if name in SEMCONV_METRICS or name.startswith(KEEP_PREFIXES) else prefix + name
    full = _BAD_NAME_CHARS.sub("_", full)
    if not full[:1].isalpha():
        full = "m" + full
    return full[:255]


is_counter = is_cumulative


def otel_number(value: Any) -> Any:
    """A value as OTLP carries it: a bool as 0/1, an int beyond int64 as a float (+-inf beyond a float's range: it
    failed the batch, or every later export of its gauge), the rest as it is."""
    if type(value) is bool:
        return int(value)
    if type(value) is int and not -_INT64 <= value < _INT64:
        return as_float(value)
    return value


def point_attributes(group: str, labels: Mapping[str, Any] | None) -> dict[str, Any]:
    """A data point's attributes: the record's (the semantic conventions' dimensions: ``disk.io.direction``,
    ``hw.id``...), and ``telemetrain.group`` for groups other than the system sampler's (whose device is in the
    attributes already)."""
    extra = None if group == "system" or group.startswith("system.") else {GROUP_KEY: group}
    return attributes(labels, extra)


def stat_unit(aggregation: str, unit: str) -> str:
    """The unit of one aggregation of a stat whose samples are in ``unit``: counts are of samples, and so is
    ``rate`` (samples per second of the window, ``stats.aggregations``), whatever the samples measure."""
    if aggregation in ("count", "nan_count", "inf_count"):
        return "{sample}"
    if aggregation == "rate":
        return "{sample}/s"
    return unit


def _scalar(value: Any) -> str | bool | int | float | None:
    if value is None:
        return None
    if isinstance(value, (str, bool, float)):
        return value
    if hasattr(value, "__index__"):  # int, numpy ints
        try:
            i = operator.index(value)
        except TypeError:
            return repr(value)
        return i if -_INT64 <= i < _INT64 else str(i)  # OTLP ints are int64
    if hasattr(value, "__float__"):  # numpy floats, Decimal, ...
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    return repr(value)


def attribute_value(value: Any) -> AttributeValue | None:
    """An OTel attribute value: str/bool/int/float or a homogeneous sequence of one of them; anything else as its
    ``repr`` (a record's attributes are free-form). ``None`` for no value (the key is left out)."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        items = [_scalar(v) for v in value]
        kinds = {type(v) for v in items}
        if len(kinds) == 1 and None not in items:
            return tuple(items)
        return repr(value)
    return _scalar(value)


def attributes(values: Mapping[str, Any] | None, extra: Mapping[str, AttributeValue] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = dict(extra) if extra else {}
    if values:
        for key, value in values.items():
            converted = attribute_value(value)
            if converted is not None:
                out[str(key)] = converted
    return out


def resource_attributes(identity: Identity, config: Mapping[str, Any] | None = None) -> dict[str, AttributeValue]:
    """Constant per process: who produced the telemetry. ``service.name`` is the perf tag (runs that should perform
    alike) unless ``OTEL_SERVICE_NAME`` is set; the run identity goes under ``telemetrain.*``, the run's config
    (flattened) under ``telemetrain.config.*``."""
    attrs: dict[str, AttributeValue] = {
        "service.namespace": "telemetrain",
        "service.instance.id": f"{identity.run_id}.rank{identity.rank}",
        "telemetrain.run_id": identity.run_id,
        "telemetrain.session_tag": identity.session_tag,
        "telemetrain.perf_tag": identity.perf_tag,
        "telemetrain.rank": identity.rank,
        "telemetrain.local_rank": identity.local_rank,
        "telemetrain.world_size": identity.world_size,
        "telemetrain.restart_count": identity.restart_count,
        "host.name": identity.host,
        "process.pid": identity.pid,
    }
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attrs["service.name"] = identity.perf_tag
    attrs.update(prefixed(CONFIG_PREFIX, config))
    return attrs


def prefixed(prefix: str, values: Mapping[str, Any] | None) -> dict[str, AttributeValue]:
    """Hyperparameters as attributes under ``prefix`` (None values left out)."""
    out: dict[str, AttributeValue] = {}
    for key, value in (values or {}).items():
        converted = attribute_value(value)
        if converted is not None:
            out[prefix + str(key)] = converted
    return out


def otel_resource(identity: Identity, config: Mapping[str, Any] | None = None) -> Resource:
    """The resource the sink's own providers use (for providers you build yourself: ``resource=otel_resource(...)``).
    ``OTEL_RESOURCE_ATTRIBUTES`` is merged in, ours taking precedence."""
    return Resource.create(resource_attributes(identity, config))


def histogram_point(record: Any, attrs: Mapping[str, Any]) -> ExponentialHistogramDataPoint | None:
    """A stat window's exponential histogram (records.StatWindow.histogram: OpenTelemetry's layout already) as a
    delta data point over the window; None when the window's sum cannot be known (no ``sum`` or ``mean``
    aggregation): the aggregations still go out as gauges."""
    h = record.histogram
    values = record.values
    positive, negative = h.get("positive") or {}, h.get("negative") or {}
    count = int(h.get("zero_count", 0)) + sum(positive.get("counts", ())) + sum(negative.get("counts", ()))
    total = values.get("sum")
    if total is None and values.get("mean") is not None:
        total = values["mean"] * count
    if total is None or not count:
        return None
    window_ns = record.mono_ns - record.start_mono_ns
    return ExponentialHistogramDataPoint(
        attributes=dict(attrs),
        start_time_unix_nano=record.wall_ns - window_ns,
        time_unix_nano=record.wall_ns,
        count=count,
        sum=float(total),
        scale=int(h["scale"]),
        zero_count=int(h.get("zero_count", 0)),
        positive=Buckets(int(positive.get("offset", 0)), list(positive.get("counts", ()))),
        negative=Buckets(int(negative.get("offset", 0)), list(negative.get("counts", ()))),
        flags=0,
        min=_optional(values.get("min")),
        max=_optional(values.get("max")),
    )


def _optional(value: Any) -> float:
    """A window's min or max; unknown (the stat does not keep it) stays None, which OTLP's optional field leaves
    unset, where NaN would reach the backend as the minimum (the SDK annotates float; its encoder passes None on)."""
    return cast(float, None) if value is None else float(value)
