"""Record names, units and attributes -> Prometheus names and labels (pure functions).

Prometheus' conventions (https://prometheus.io/docs/practices/naming/): base units (seconds, bytes), the unit as a
suffix, ``_total`` on counters, ``_ratio`` for a unitless 0..1 value; labels for dimensions, not for identity that is
constant per target (that goes in an info metric, ``telemetrain_run_info``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...semconv import SEMCONV_METRICS
from ...ucum import base_unit

__all__ = ["PREFIX", "UNIT_SUFFIXES", "label_name", "metric_name", "unit_of"]

PREFIX = "telemetrain_"

# UCUM base unit -> Prometheus suffix (base units, plural). Annotations ({thing}) and other units add none.
UNIT_SUFFIXES = {
    "s": "seconds",
    "By": "bytes",
    "J": "joules",
    "W": "watts",
    "Hz": "hertz",
    "Cel": "celsius",
    "1": "ratio",
}
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def sanitise(text: str) -> str:
    out = _INVALID.sub("_", text)
    return "_" + out if out[:1].isdigit() else out


def _unit_suffix(unit: str) -> str:
    if unit in UNIT_SUFFIXES:
        return UNIT_SUFFIXES[unit]
    if unit == "1/s" or (unit.startswith("{") and unit.endswith("}/s")):
        return "per_second"
    if unit.endswith("/s") and unit[:-2] in UNIT_SUFFIXES:
        return f"{UNIT_SUFFIXES[unit[:-2]]}_per_second"
    return ""


def unit_of(unit: str) -> tuple[str, float]:
    """(the base unit the series is served in, the factor a value is multiplied by): ``ms`` -> (``s``, 0.001)."""
    return base_unit(unit)


def metric_name(name: str, unit: str = "", *, counter: bool = False) -> str:
    """The Prometheus name of a metric (without ``_total``): dots to underscores, the ``telemetrain_`` prefix unless
    the name is one of OpenTelemetry's semantic conventions (``system_disk_io_bytes``, as OpenTelemetry's own
    Prometheus exporter writes it), the suffix of the unit's base unit unless the name already ends with it (``ms``
    -> ``_seconds``: the value is converted, see ``unit_of``). A ``counter``'s own ``_total`` is dropped (the
    sample adds it back after the unit: ``tokens_total`` -> ``telemetrain_tokens_total``, not ``..._total_total``),
    as prometheus_client's ``Counter`` and OpenTelemetry's Prometheus exporter do."""
    base = sanitise(name)
    if counter and base.endswith("_total") and len(base) > len("_total"):
        base = base[: -len("_total")]
    if name not in SEMCONV_METRICS and not base.startswith(PREFIX):
        base = PREFIX + base
    suffix = _unit_suffix(unit_of(unit)[0])
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    return base


def label_name(key: str) -> str:
    """An attribute key as a label name: ``disk.io.direction`` -> ``disk_io_direction`` (``__`` is reserved)."""
    out = sanitise(key)
    return "a" + out if out.startswith("__") else out


def labels_of(attributes: Mapping[str, Any]) -> dict[str, str]:
    """A record's attributes as labels (values as text; a bool as ``true``/``false``)."""
    out: dict[str, str] = {}
    for key, value in attributes.items():
        out[label_name(str(key))] = ("true" if value else "false") if type(value) is bool else str(value)
    return out
