"""The protocol floor: baseline A plus the two records every half-message design writes.

A proves nothing: it commits, then publishes. Ours must also leave, for each transaction, proof
in the producer's own database that it committed (the evidence row the check endpoint answers
from) and a decision on Kafka (the op record the relay promotes on). The floor is A's
transaction with exactly those two added and nothing else of ours:

- the evidence row, inserted with :func:`outbox.evidence.write_evidence` in the business
  write's DB transaction;
- after ``COMMIT``, A's synchronous produce, then the op record (:func:`outbox.protocol.op.
  encode_op`) produced one-way to the op topic by a second producer with ``linger.ms`` 0, as
  ours sends it (ours also asks for a delivery report, and picks the op's partition itself;
  here the key does, which spreads the ops as evenly).

So it is A's serial shape - commit, publish, then a one-way op - with the two records added.
A design can do better than this floor where it overlaps work (ours inserts the evidence row
while the half record travels on PostgreSQL) or batches the ops (``op_linger_ms``); where
ours is slower than the floor, the difference is ours' own machinery.

It is not a design anyone should ship (a crash between the commit and the produce loses the
message, as in A). It answers one question in the same run as ours and A: how close to A does
that shape with these two records come on this machine (docs/benchmarks.md, "What our safety
costs on the producer")?
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy.orm import Session

from bench.baselines import SyncProducer, records
from bench.workload import business_write
from outbox.evidence import write_evidence
from outbox.protocol.ids import new_transaction_id
from outbox.protocol.op import OpRecord, encode_op
from outbox.protocol.states import DecidedBy, OpState

#: The producer group the floor's evidence rows and op records name.
GROUP = "bench-floor"


class OneWayProducer(SyncProducer):
    """Produces without waiting, as ours sends an op record (``linger.ms`` 0); the poll thread
    serves librdkafka's queue. No delivery report is asked for: ours counts each op in one,
    which costs ~0.4 us a record (docs/benchmarks.md, "Delivery callbacks are cheap")."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(bootstrap, **{"linger.ms": 0})

    def send_one_way(self, topic: str, key: bytes, value: bytes) -> None:
        self._producer.produce(topic, value=value, key=key)


def place_order_floor(
    factory: Callable[[], Session],
    producer: SyncProducer,
    ops: OneWayProducer,
    topic: str,
    op_topic: str,
    customer: int,
    messages: int,
) -> None:
    """Baseline A's transaction with the evidence row in it and a one-way op record after it."""
    txn_id = new_transaction_id()
    with factory() as session, session.begin():
        business_write(session, customer)
        write_evidence(session, txn_id, GROUP)
    producer.send(records(topic, customer, messages, {}))
    ops.send_one_way(op_topic, *committed(txn_id, messages))


def committed(txn_id: str, messages: int) -> tuple[bytes, bytes]:
    """``(key, value)`` of the COMMIT op record of a floor transaction, as ours encodes one."""
    return encode_op(
        OpRecord(
            txn_id=txn_id,
            state=OpState.COMMIT,
            producer_group=GROUP,
            half_partition=0,
            half_offsets=tuple(range(messages)),
            decided_by=DecidedBy.PRODUCER,
            decided_at_ms=int(time.time() * 1000),
        )
    )
