"""Aggregation names: parsing and validation (shared by ``Stat`` and the torch.monitor drop-in)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

__all__ = ["DEFAULT_AGGREGATIONS", "VALID", "parse_aggregations", "quantile_of"]

# value: the last sample; rate: samples per second of window; stddev: population (ddof=0, like numpy.std)
SIMPLE = ("value", "count", "sum", "mean", "min", "max", "stddev", "rate", "histogram")
VALID = "value, count, sum, mean, min, max, stddev, rate, histogram, or a quantile p0..p100 (p50, p90, p95, p99, p99.9)"
DEFAULT_AGGREGATIONS = ("count", "sum", "mean", "min", "max", "p50", "p90", "p99")

_QUANTILE = re.compile(r"p(\d{1,3}(?:\.\d+)?)")

# what a summary must track for a set of aggregations (bit flags)
MINMAX, M2, DIST = 1, 2, 4


def _quantile_key(text: str) -> str | None:
    match = _QUANTILE.fullmatch(text)
    if match is None:
        return None
    percent = float(match.group(1))
    if not 0.0 <= percent <= 100.0:
        return None
    return f"p{percent:g}"


def quantile_of(key: str) -> float | None:
    """0.99 for "p99", None for a key that is not a quantile."""
    if key[:1] != "p" or key == "p":
        return None
    try:
        return float(key[1:]) / 100.0
    except ValueError:
        return None


def parse_aggregations(aggregations: Any) -> tuple[str, ...]:
    """Names in their canonical form, duplicates dropped, order kept. Accepts strings and enum members (ours or
    torch.monitor's: their ``name``). ``ValueError`` names the valid ones."""
    if isinstance(aggregations, (str, bytes)) or not isinstance(aggregations, Iterable):
        raise TypeError(f"aggregations must be a list of names, got {type(aggregations).__name__}")
    out: list[str] = []
    for agg in aggregations:
        name = agg if isinstance(agg, str) else getattr(agg, "name", None)
        if not isinstance(name, str):
            raise TypeError(f"aggregations must be names or Aggregation members, got {type(agg).__name__}: {agg!r}")
        text = name.strip().lower()
        key = text if text in SIMPLE else _quantile_key(text)
        if key is None:
            raise ValueError(f"unknown aggregation {name!r}: valid are {VALID}")
        if key not in out:
            out.append(key)
    return tuple(out)


def tracking(aggregations: Iterable[str]) -> int:
    flags = 0
    for key in aggregations:
        if key in ("min", "max"):
            flags |= MINMAX
        elif key == "stddev":
            flags |= M2
        elif key == "histogram" or quantile_of(key) is not None:
            flags |= DIST | MINMAX  # min and max make q=0 and q=1 exact and clamp the sketch's estimates
    return flags

