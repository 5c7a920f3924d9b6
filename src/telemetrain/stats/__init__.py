"""Windowed stats with exact or bounded-error percentiles, callback gauges and a queryable registry.

``Stat`` aggregates samples over count or time windows (or cumulatively) into ``StatWindow`` records; ``Summary`` is
the mergeable form of a window (across windows, processes and ranks); ``ExpHistogram`` the OpenTelemetry-compatible
sketch behind quantiles; ``Gauge`` a function read at collection time; ``registry()`` lists them.
"""

from __future__ import annotations

from .aggregations import DEFAULT_AGGREGATIONS, parse_aggregations
from .gauge import Gauge
from .histogram import ExpHistogram, relative_error
from .registry import StatRegistry, registry
from .stat import Stat
from .summary import RAW_LIMIT, Summary, merge_all

__all__ = [
    "DEFAULT_AGGREGATIONS",
    "RAW_LIMIT",
    "ExpHistogram",
    "Gauge",
    "Stat",
    "StatRegistry",
    "Summary",
    "merge_all",
    "parse_aggregations",
    "registry",
    "relative_error",
]
