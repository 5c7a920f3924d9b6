"""A curve bucket (``curves.CurveBuilder``'s ten slots) packed into 81 bytes once it is complete, and unpacked bit
for bit when it is read or merged again; a series' packed buckets held together (``PackedBuckets``).

The builder keeps ``capacity`` buckets per series *and rank*: as Python lists of ten numbers they were ~430 bytes
each, ~13 MiB for two series of 64 ranks, held from the curves' queries to the report's end (docs/scale.md). Packed,
a bucket is one ``bytes`` object. Only a bucket whose slots have the types the SQL path gives them is packed (counts,
wall times and x as integers within int64, sums and extremes as floats; the x of the maximum a float only while the
bucket has no finite value, the x of the first non-finite one a float only while it has none): anything else (a
Python integer past int64, a sum of x kept as an integer) stays a list, so that what is read back is always what was
put in, value and type.

A series whose buckets all pack is held as one ``PackedBuckets``: the records one after another in one ``bytes``, their
keys in an ``array``. A ``bytes`` object and a dict entry per bucket (its key an int object too) cost ~100 bytes more
than the record itself: ~3 MiB of the report's ~3.4 MiB of buckets on 64 ranks x 1M iterations, and it grows with
the ranks.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator
from typing import Any

__all__ = ["BAD", "BAD_X", "HI", "HI_X", "LO", "SUM", "WALL", "XN", "XSUM", "N", "PackedBuckets", "merge", "opened",
           "pack", "pack_series", "unpack"]

# a bucket's slots: finite count, sum, min, max, x of the max, non-finite count, x of the first non-finite, last wall
# ns, sum of x, points
N, SUM, LO, HI, HI_X, BAD, BAD_X, WALL, XSUM, XN = range(10)


def _format(flags: int) -> struct.Struct:
    hi_x = "d" if flags & 1 else "q"
    bad_x = "d" if flags & 2 else "q"
    return struct.Struct(f"<Bqddd{hi_x}q{bad_x}qdq")


# the byte of flags first: bit 0 the x of the maximum is a float, bit 1 the x of the first non-finite value is one
_FORMATS = {flags: _format(flags) for flags in range(4)}
RECORD = _FORMATS[0].size  # every format's: 81 bytes
_LOWEST, _HIGHEST = -(2**63), 2**63


def _i64(value: Any) -> bool:
    return type(value) is int and _LOWEST <= value < _HIGHEST


def pack(bucket: list[Any]) -> bytes | list[Any]:
    """``bucket`` as bytes, or itself when a slot has another type than the packed form keeps."""
    n, total, lo, hi, hi_x, bad, bad_x, wall, xsum, xn = bucket
    if not (_i64(n) and type(total) is float and type(lo) is float and type(hi) is float and _i64(bad)
            and _i64(wall) and type(xsum) is float and _i64(xn)):
        return bucket
    flags = 0
    if type(hi_x) is float:
        flags |= 1
    elif not _i64(hi_x):
        return bucket
    if type(bad_x) is float:
        flags |= 2
    elif not _i64(bad_x):
        return bucket
    return _FORMATS[flags].pack(flags, n, total, lo, hi, hi_x, bad, bad_x, wall, xsum, xn)


def unpack(packed: bytes) -> list[Any]:
    """The bucket ``pack`` packed: the same values of the same types, in a new list."""
    return list(_FORMATS[packed[0]].unpack(packed))[1:]


def opened(bucket: bytes | list[Any]) -> list[Any]:
    """``bucket`` as a list: unpacked when packed, else itself (not a copy)."""
    if isinstance(bucket, bytes):
        return unpack(bucket)
    return bucket


def merge(into: list[float], b: list[float]) -> None:
    """Bucket ``b`` added into ``into`` (the builder's merge of two neighbours, or of a rank's parts)."""
    into[N] += b[N]
    into[SUM] += b[SUM]
    if b[LO] < into[LO]:
        into[LO] = b[LO]
    if b[HI] > into[HI]:
        into[HI] = b[HI]
        into[HI_X] = b[HI_X]
    if b[BAD]:
        into[BAD_X] = b[BAD_X] if not into[BAD] else min(into[BAD_X], b[BAD_X])
        into[BAD] += b[BAD]
    into[WALL] = max(into[WALL], b[WALL])
    into[XSUM] += b[XSUM]
    into[XN] += b[XN]


class PackedBuckets:
    """A series' buckets, every one packed, read-only, in the order of the dict they came from (``items`` gives each
    as ``pack`` made it). The builder opens it into a dict again (``to_dict``) before changing it."""

    __slots__ = ("_data", "_keys")

    def __init__(self, keys: array[int], data: bytes) -> None:
        self._keys, self._data = keys, data

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> array[int]:
        return self._keys

    def values(self) -> Iterator[bytes]:
        data = self._data
        return (data[i:i + RECORD] for i in range(0, len(data), RECORD))

    def items(self) -> Iterator[tuple[int, bytes]]:
        return zip(self._keys, self.values(), strict=True)

    def to_dict(self) -> dict[int, Any]:
        return dict(self.items())


def pack_series(buckets: dict[int, Any]) -> PackedBuckets | dict[int, Any]:
    """``buckets`` (each a list or already packed) as one ``PackedBuckets``; as a dict of the packed buckets where
    one cannot be packed (a key or a slot out of the packed form's range)."""
    packed = {k: pack(b) if type(b) is list else b for k, b in buckets.items()}
    records = [b for b in packed.values() if type(b) is bytes]
    if len(records) < len(packed) or not all(_i64(k) for k in packed):
        return packed
    return PackedBuckets(array("q", packed), b"".join(records))
