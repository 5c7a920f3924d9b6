"""``torch.distributed.elastic.metrics.api``'s module path: the same names as ``telemetrain.metrics`` (torch's docs and
tests import from ``.api``). The implementation lives in the package; this module only re-exports it."""

from __future__ import annotations

from . import (
    ConsoleMetricHandler,
    MetricData,
    MetricHandler,
    MetricsConfig,
    MetricStream,
    NullMetricHandler,
    _get_metric_name,
    configure,
    get_elapsed_time_ms,
    getStream,
    initialize_metrics,
    prof,
    profile,
    publish_metric,
    put_metric,
)

__all__ = [
    "ConsoleMetricHandler",
    "MetricData",
    "MetricHandler",
    "MetricStream",
    "MetricsConfig",
    "NullMetricHandler",
    "_get_metric_name",
    "configure",
    "getStream",
    "get_elapsed_time_ms",
    "initialize_metrics",
    "prof",
    "profile",
    "publish_metric",
    "put_metric",
]
