"""``report.curve_buckets``: a curve bucket packed and unpacked is the same bucket, value and type; a builder whose
buckets were packed draws the same curves, and goes on merging into them."""

from __future__ import annotations

import math
import random
import struct

import pytest

from telemetrain.report.curve_buckets import PackedBuckets, pack, pack_series, unpack
from telemetrain.report.curves import CurveBuilder


def _same(a: list[object], b: list[object]) -> bool:
    """Equal slot by slot, of the same type, NaN equal to NaN and -0.0 told from 0.0."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if type(x) is not type(y):
            return False
        if isinstance(x, float):
            if struct.pack("<d", x) != struct.pack("<d", y):  # (NaN, the sign of zero)
                return False
        elif x != y:
            return False
    return True


def _sql_bucket(rng: random.Random) -> list[object]:
    n = rng.choice([0, 1, 7, 4096])
    bad = rng.choice([0, 0, 3])
    return [n, rng.choice([0.0, -0.0, 1.5, 1e300, -2.5e-308]), math.inf if not n else rng.uniform(-1, 1),
            -math.inf if not n else rng.choice([math.inf, 2.0, -0.0]), 0.0 if not n else rng.randrange(-2**63, 2**63),
            bad, math.nan if not bad else rng.randrange(0, 2**62), rng.randrange(0, 2**63), rng.uniform(0, 1e22),
            n + bad]


def test_a_packed_bucket_unpacks_to_the_same_values_and_types() -> None:
    rng = random.Random(17)
    for _ in range(2000):
        bucket = _sql_bucket(rng)
        packed = pack(bucket)
        assert type(packed) is bytes and len(packed) == 81
        assert _same(unpack(packed), bucket), bucket


@pytest.mark.parametrize("bucket", [
    [1, 2.0, 2.0, 2.0, 2**63, 0, math.nan, 5, 5.0, 1],  # an x past int64
    [1, 2.0, 2.0, 2.0, 3, 0, math.nan, 5, 5, 1],  # a sum of x kept as an integer
    [1, 2, 2.0, 2.0, 3, 0, math.nan, 5, 5.0, 1],  # an integer sum
    [True, 2.0, 2.0, 2.0, 3, 0, math.nan, 5, 5.0, 1],  # a bool count
    [1, 2.0, 2.0, 2.0, 3, 0, None, 5, 5.0, 1],  # anything else
], ids=["x-past-int64", "int-xsum", "int-sum", "bool", "none"])
def test_a_bucket_the_packed_form_cannot_hold_stays_a_list(bucket: list[object]) -> None:
    assert pack(bucket) is bucket


def _feed(builder: CurveBuilder, rng: random.Random, ranks: range, pack_after: bool) -> None:
    for rank in ranks:
        for x0 in range(0, 4000, 8):  # buckets of 8 steps, more than the capacity: the builder widens
            n = rng.randrange(0, 8)
            bad = rng.randrange(0, 2)
            values = [rng.gauss(0, 1) for _ in range(n)]
            builder.add_bucket(rank, "train", "loss", True, x0,
                               [n, math.fsum(values), min(values, default=0.0), max(values, default=0.0),
                                x0 + rng.randrange(8) if n else 0, bad, x0 if bad else 0, 10**18 + x0, float(x0 * 8),
                                n + bad], 10**18 + x0)
        if pack_after:
            builder.pack([rank])


def test_packed_buckets_draw_the_same_curves_and_take_more_points() -> None:
    plain, packed = CurveBuilder(capacity=64), CurveBuilder(capacity=64)
    _feed(plain, random.Random(3), range(12), pack_after=False)
    _feed(packed, random.Random(3), range(12), pack_after=True)
    series = packed._series[("train", "loss")].values()
    assert all(isinstance(s.buckets, PackedBuckets) for s in series)  # each series' buckets in one bytes
    assert all(type(b) is bytes and len(b) == 81 for s in series for b in s.buckets.values())
    assert plain.curves() == packed.curves()  # 12 ranks that differ: the median line and its band
    assert plain.curve("train", "loss") == packed.curve("train", "loss")
    # points after the packing merge into the packed buckets (unpacked first), by add and by add_bucket
    for builder in (plain, packed):
        builder.add(3, "train", "loss", 5, 100.0, 10**18 + 5)
        builder.add_bucket(4, "train", "loss", True, 16, [1, -7.0, -7.0, -7.0, 17, 0, 0, 10**18, 17.0, 1], 10**18)
        builder.add(5, "train", "loss", 10**6, 1.0, 10**18 + 10**6)  # far past the end: the series widens again
    assert plain.curves() == packed.curves()


def test_a_series_packs_whole_in_its_order_or_stays_a_dict() -> None:
    a = [3, 1.5, -1.0, 2.0, 7, 0, 0, 10**18, 21.0, 3]
    b = [0, 0.0, math.inf, -math.inf, 0.0, 2, 9.5, 10**18 + 1, 19.0, 2]
    series = pack_series({9: a, -4: pack(b)})  # a list and a packed bucket, keys out of order
    assert isinstance(series, PackedBuckets) and len(series) == 2
    assert list(series.keys()) == [9, -4]  # the dict's order: what merges iterate in, so the same sums
    assert [(k, unpack(v)) for k, v in series.items()] == [(9, a), (-4, b)]
    assert series.to_dict() == {9: pack(a), -4: pack(b)}
    # a bucket the packed form cannot hold, or a key past int64: the series stays a dict, its other buckets packed
    mixed = pack_series({1: a, 2: [1, 1, 1.0, 1.0, 1, 0, 0, 5, 1.0, 1]})
    assert type(mixed) is dict and mixed[1] == pack(a) and type(mixed[2]) is list
    huge = pack_series({2**63: a})
    assert type(huge) is dict and huge == {2**63: pack(a)}
