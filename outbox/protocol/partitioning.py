"""Which partition of the half and op topics a transaction uses.

A transaction's half records and op records share one partition number, chosen from the key of
its first message (its transaction id when that has no key) with the Java client's murmur2 hash,
so every transaction on one key meets the same relay in the order of its COMMIT ops.
"""

from __future__ import annotations

import struct

_WORDS = struct.Struct("<I")


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), as a signed 32-bit int."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    # the 4-byte little-endian words unpacked in one call, not sliced and converted one by one
    for (k,) in _WORDS.iter_unpack(data[: length - length % 4]):
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = length - rest
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition the Java client's default partitioner picks for ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
