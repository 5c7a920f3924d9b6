"""Prometheus backend: ``PrometheusSink`` serves the latest values per rank (``pip install 'telemetrain[prometheus]'``).

See ``docs/backends/prometheus.md``.
"""

from __future__ import annotations

from ...extras import missing_extra

try:
    import prometheus_client  # noqa: F401 - the one check, so a missing client gives one clear error
except ImportError as exc:
    raise missing_extra("telemetrain.sinks.prometheus", "prometheus_client", "prometheus", exc) from None

from .names import metric_name
from .sink import DEFAULT_BASE_PORT, DEFAULT_PUSH_JOB, PUSH_GROUPING_KEY, PrometheusSink

__all__ = ["DEFAULT_BASE_PORT", "DEFAULT_PUSH_JOB", "PUSH_GROUPING_KEY", "PrometheusSink", "metric_name"]
