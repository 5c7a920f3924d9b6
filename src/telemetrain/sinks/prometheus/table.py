"""The in-memory table a scrape reads: the latest value per series, and the cumulative histograms and summaries.

Histograms are Prometheus' classic ones (``_bucket{le=...}``, ``_sum``, ``_count``, all cumulative), so
``histogram_quantile(0.99, sum by (le) (rate(x_bucket[5m])))`` aggregates across ranks. A stat window brings its
exponential histogram (OpenTelemetry's layout, ``stats.histogram``); its buckets are added into a fixed lattice of
bounds ``2**(k/2)`` (``LATTICE_SCALE``: each bound 1.41x the previous), the same on every rank, so the buckets of two
ranks line up. The lattice spans a fixed range per unit (``RANGES``); values beyond it count in ``+Inf`` only (as in
any classic histogram), below it in the first bucket. A rank serves the buckets from the one below the lowest it has
filled to the top of the range: a bucket left out below is one whose cumulative count is 0, so sums across ranks
stay right.
(Native histograms would need the protobuf exposition, which prometheus_client does not serve.)
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import utils as _utils
from prometheus_client.metrics_core import Metric

__all__ = ["LATTICE_SCALE", "RANGES", "Table"]

LATTICE_SCALE = 1  # bounds 2**(k / 2**LATTICE_SCALE)
_STEPS = 1 << LATTICE_SCALE
# base unit -> (lowest k, highest k): seconds 2**-13 (122 us) .. 2**12 (68 min); bytes 1 B .. 1 TiB; else 2**-20..2**20
RANGES: dict[str, tuple[int, int]] = {"s": (-13 * _STEPS, 12 * _STEPS), "By": (0, 40 * _STEPS)}
DEFAULT_RANGE = (-20 * _STEPS, 20 * _STEPS)
_go: Callable[[float], str] = _utils.floatToGoString  # ``le``/``quantile`` text exactly as the client writes it


def bound(k: int) -> float:
    return float(2.0 ** (k / _STEPS))


def lattice_counts(histogram: Mapping[str, Any], factor: float, k_range: tuple[int, int]) -> dict[int, int]:
    """An exponential histogram's counts on the lattice: ``{k: count of values <= bound(k) and > bound(k-1)}``, with
    ``k_range[1] + 1`` standing for "above the range" (``+Inf`` only). ``factor`` converts to the base unit."""
    lo, hi = k_range
    out: dict[int, int] = {}
    scale = int(histogram.get("scale", 0))
    negative = (histogram.get("negative") or {}).get("counts", ())
    below = int(histogram.get("zero_count", 0)) + sum(int(c) for c in negative)
    if below:
        out[lo] = below
    positive = histogram.get("positive") or {}
    offset = int(positive.get("offset", 0))
    for i, count in enumerate(positive.get("counts", ())):
        if not count:
            continue
        index = offset + i  # the bucket (base**index, base**(index+1)]
        if factor == 1.0:
            if scale >= LATTICE_SCALE:
                k = (index >> (scale - LATTICE_SCALE)) + 1
            else:
                k = (index + 1) << (LATTICE_SCALE - scale)
        else:  # a converted unit (ms -> s): the bucket's top in the base unit, up to the next lattice bound
            top = 2.0 ** ((index + 1) / 2.0**scale) * factor
            k = math.ceil(math.log2(top) * _STEPS - 1e-9)
        k = min(max(k, lo), hi + 1)
        out[k] = out.get(k, 0) + int(count)
    return out


class _Family:
    __slots__ = ("doc", "samples", "type")

    def __init__(self, type_: str, doc: str) -> None:
        self.type = type_
        self.doc = doc
        self.samples: dict[int, Any] = {}  # label set id -> value (gauge, counter, info) or _Distribution


class _Distribution:
    """One histogram's or summary's series: cumulative count and sum; lattice bucket counts or the last quantiles."""

    __slots__ = ("buckets", "count", "k_range", "quantiles", "sum")

    def __init__(self, k_range: tuple[int, int]) -> None:
        self.buckets: dict[int, int] = {}
        self.count = 0
        self.sum: float | None = None  # None while no window brought a sum (no sum or mean aggregation)
        self.k_range = k_range
        self.quantiles: dict[float, float] = {}


class Table:
    """The families and their series, under one lock (a scrape copies it; encoding happens outside).

    A label set is an int id into ``label_sets`` (a tuple of label pairs would be re-hashed at every value); each has
    its push group (the ``run_id``/``rank`` of the identity that made it)."""

    def __init__(self, max_series: int) -> None:
        self.lock = threading.Lock()
        self.families: dict[str, _Family] = {}
        self.label_sets: list[dict[str, str]] = []
        self.group_keys: list[tuple[str, ...]] = []
        self._label_ids: dict[tuple[tuple[str, str], ...], int] = {}
        self.max_series = max_series
        self.series = 0
        self.dropped_series = 0  # values of new series refused above max_series
        self.renamed: set[str] = set()  # names two types of series wanted (the later type served as <name>_<type>)

    def label_id(self, labels: dict[str, str], group_key: tuple[str, ...]) -> int:
        key = (*labels.items(), ("", "|".join(group_key)))
        found = self._label_ids.get(key)
        if found is None:
            found = self._label_ids[key] = len(self.label_sets)
            self.label_sets.append(labels)
            self.group_keys.append(group_key)
        return found

    def _family(self, name: str, type_: str, doc: str) -> _Family:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = _Family(type_, doc)
        elif family.type != type_:  # one name, two types (a metric and a stat both called "loss"): the later one
            self.renamed.add(name)  # is served as <name>_<type>
            return self._family(f"{name}_{type_}", type_, doc)
        return family

    def _admit(self, family: _Family, label_id: int) -> bool:
        if label_id in family.samples:
            return True
        if self.series >= self.max_series:
            self.dropped_series += 1
            return False
        self.series += 1
        return True

    def set(self, name: str, type_: str, doc: str, label_id: int, value: float) -> None:
        family = self._family(name, type_, doc)
        if self._admit(family, label_id):
            family.samples[label_id] = value

    def discard(self, name: str, label_id: int) -> None:
        """Remove one series (it is no longer true)."""
        family = self.families.get(name)
        if family is not None and family.samples.pop(label_id, None) is not None:
            self.series -= 1

    def add(self, name: str, doc: str, label_id: int, amount: float) -> None:
        family = self._family(name, "counter", doc)
        if self._admit(family, label_id):
            family.samples[label_id] = family.samples.get(label_id, 0.0) + amount

    def observe(self, name: str, doc: str, label_id: int, count: int, total: float | None,
                histogram: Mapping[str, Any] | None, factor: float, k_range: tuple[int, int],
                quantiles: Mapping[float, float]) -> None:
        """A stat window into a histogram family (with a ``histogram``) or a summary family (without)."""
        family = self._family(name, "histogram" if histogram is not None else "summary", doc)
        if not self._admit(family, label_id):
            return
        if family.type == "summary":
            histogram = None
        dist = family.samples.get(label_id)
        if dist is None:
            dist = family.samples[label_id] = _Distribution(k_range)
        if histogram is not None:
            for k, n in lattice_counts(histogram, factor, dist.k_range).items():
                dist.buckets[k] = dist.buckets.get(k, 0) + n
            count = sum(dist.buckets.values()) - dist.count  # the finite samples the histogram holds
        dist.count += count
        if total is not None and math.isfinite(total):
            dist.sum = (dist.sum or 0.0) + total * factor
        if family.type == "summary":
            dist.quantiles = {q: v * factor for q, v in quantiles.items()}

    def clear(self) -> None:
        self.families.clear()
        self.label_sets.clear()
        self.group_keys.clear()
        self._label_ids.clear()
        self.series = 0
        self.dropped_series = 0

    def push_groups(self) -> list[tuple[str, ...]]:
        """The distinct push groups among the label sets in use, first seen first."""
        with self.lock:
            return list(dict.fromkeys(self.group_keys))

    def collect(self) -> Iterator[Metric]:
        return self.collect_group(None)

    def collect_group(self, group: tuple[str, ...] | None) -> Iterator[Metric]:
        """The families, with only the samples of one push group (``None``: all of them)."""
        with self.lock:  # copy only: the exposition is encoded outside the lock
            snapshot = [(n, f.type, f.doc, [(i, _copy(v)) for i, v in f.samples.items()])
                        for n, f in self.families.items()]
            label_sets = list(self.label_sets)  # label dicts are never changed once made
            group_keys = list(self.group_keys)
            dropped = self.dropped_series
        for name, type_, doc, samples in snapshot:
            if group is not None:
                samples = [s for s in samples if group_keys[s[0]] == group]
                if not samples:
                    continue
            metric = Metric(name, doc, type_)
            for label_id, value in samples:
                _add_samples(metric, name, type_, label_sets[label_id], value)
            yield metric
        metric = Metric("telemetrain_prometheus_dropped_series", "new series refused above max_series", "counter")
        metric.add_sample("telemetrain_prometheus_dropped_series_total", {}, float(dropped))
        yield metric


def _copy(value: Any) -> Any:
    if isinstance(value, _Distribution):
        out = _Distribution(value.k_range)
        out.buckets, out.count, out.sum, out.quantiles = dict(value.buckets), value.count, value.sum, value.quantiles
        return out
    return value


def _add_samples(metric: Metric, name: str, type_: str, labels: dict[str, str], value: Any) -> None:
    if type_ == "counter":
        metric.add_sample(name + "_total", labels, value)
    elif type_ == "info":
        metric.add_sample(name + "_info", labels, 1.0)
    elif type_ == "histogram":
        hi = value.k_range[1]
        filled = [k for k, n in value.buckets.items() if n and k <= hi]
        cumulative = 0
        # from one empty bucket below the lowest filled one: histogram_quantile takes 0 as the first bucket's lower
        # bound, and interpolates inside the right bucket only with its lower neighbour there
        for k in range(max(min(filled) - 1, value.k_range[0]) if filled else hi, hi + 1):
            cumulative += value.buckets.get(k, 0)
            metric.add_sample(name + "_bucket", {**labels, "le": _go(bound(k))}, float(cumulative))
        metric.add_sample(name + "_bucket", {**labels, "le": "+Inf"}, float(value.count))
        metric.add_sample(name + "_count", labels, float(value.count))
        if value.sum is not None:
            metric.add_sample(name + "_sum", labels, value.sum)
    elif type_ == "summary":
        for q, v in sorted(value.quantiles.items()):
            metric.add_sample(name, {**labels, "quantile": _go(q)}, v)
        metric.add_sample(name + "_count", labels, float(value.count))
        if value.sum is not None:
            metric.add_sample(name + "_sum", labels, value.sum)
    else:
        metric.add_sample(name, labels, value)
