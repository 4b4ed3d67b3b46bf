"""Transactions written straight onto the outbox topics, as producers (and relays) write them.

Uses :class:`outbox.testing.stream.StreamWriter`, which follows docs/protocol.md through
:mod:`outbox.protocol`. Records are uncompressed, as the producer library writes them. Writing
goes in chunks the way a producer does: halves acknowledged first, then their ops.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.workload import CUSTOMER_KEYS, PAYLOAD
from outbox.protocol.states import OpState
from outbox.testing.stream import StreamWriter

PARTITIONS = 6


def writer(bootstrap: str, prefix: str, group: str = "bench") -> StreamWriter:
    """A writer onto the topics under ``prefix`` (created, 6 partitions), uncompressed."""
    return StreamWriter(
        bootstrap,
        prefix=prefix,
        partitions=PARTITIONS,
        group=group,
        producer_config={"compression.type": "none", "linger.ms": 5},
    )


def write_transactions(
    stream: StreamWriter,
    real_topic: str,
    count: int,
    *,
    commit: bool = True,
    promote: bool = False,
    chunk: int = 5000,
    on_chunk: Callable[[list[str]], None] | None = None,
) -> int:
    """``count`` one-message transactions of 1 KiB, keyed by customer.

    ``commit``: each gets its COMMIT op (else it is left undecided). ``promote``: its message is
    also written to ``real_topic`` as the relay would. ``on_chunk`` gets each chunk's
    transaction ids once they are on the broker.
    """
    customers = len(CUSTOMER_KEYS) - 1
    for start in range(0, count, chunk):
        txns = [
            stream.begin([(real_topic, CUSTOMER_KEYS[1 + i % customers], PAYLOAD)])
            for i in range(start, min(start + chunk, count))
        ]
        stream.flush()
        if commit or promote:
            for txn in txns:
                if commit:
                    stream.decide(txn, OpState.COMMIT)
                if promote:
                    stream.promote(txn)
            stream.flush()
        if on_chunk is not None:
            on_chunk([t.txn_id for t in txns])
    return count
