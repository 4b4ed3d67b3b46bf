"""The relay's spans: a batch that promotes more transactions than one span keeps links for
still links every one of them, and a failed batch says so."""

from __future__ import annotations

import pytest
from opentelemetry.trace import StatusCode

from outbox.protocol import DecidedBy, HalfMessage, HalfRecord, OpRecord, OpState
from relay import tracing
from relay.actions import Batch, Drop, Promote
from tests.tracing_fixtures import Traces, w3c


def promote(n: int, *, traced: bool = True) -> Promote:
    """Transaction n: two messages from one send, whose span is (trace n, span n)."""
    txn_id = f"01a203d8-301f-7701-b6f4-{n:012x}"
    headers = (("traceparent", w3c(n + 1, n + 1, 1)),) if traced else ()
    records = tuple(
        HalfRecord(
            txn_id=txn_id,
            producer_group="orders",
            message=HalfMessage("orders", b"v", headers=(("k", b"v"), *headers)),
            index=i,
            count=None,
            created_at_ms=0,
            check_count=0,
        )
        for i in range(2)
    )
    op = OpRecord(txn_id, OpState.COMMIT, "orders", 0, (2 * n, 2 * n + 1), DecidedBy.PRODUCER, 0)
    return Promote(op, records)


def test_every_promoted_transaction_is_linked_however_many_one_batch_promotes(
    traces: Traces,
) -> None:
    # Given a Kafka transaction promoting more transactions than a span keeps links for, on
    # two partitions, one of them untraced, with a rolled-back one beside them
    count = tracing.LINKS_PER_SPAN * 2 + 3
    promotions = [promote(n) for n in range(count)]
    untraced = promote(count, traced=False)
    dropped = Drop(promote(count + 1).op)
    batches = {
        0: Batch([*promotions[:10], dropped], 0, 0, ""),
        1: Batch([*promotions[10:], untraced], 0, 0, ""),
    }
    with tracing.promoting(batches):
        pass
    # then one batch span has every promotion under it, in chunks a span can keep
    batch = traces.one("outbox.relay.batch")
    chunks = traces.named("outbox.relay.promote")
    assert [len(c.links) for c in chunks] == [tracing.LINKS_PER_SPAN] * 2 + [3]
    assert {c.parent.span_id for c in chunks if c.parent} == {batch.context.span_id}
    assert all(c.dropped_links == 0 for c in chunks)
    # each producer's span linked once (both messages came from one send), naming its
    # transaction
    links = [link for c in chunks for link in c.links]
    assert sorted(link.context.span_id for link in links) == [n + 1 for n in range(count)]
    assert {link.attributes["outbox.transaction.id"] for link in links} == {
        p.op.txn_id for p in promotions
    }
    assert dict(batch.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.batch.message_count": 2 * (count + 1),
        "outbox.relay.promoted": count + 1,
        "outbox.half.partitions": (0, 1),
    }
    assert sum(c.attributes["outbox.relay.promoted"] for c in chunks) == count
    # the links are not parents: the relay's spans are a trace of their own
    assert batch.parent is None


def test_a_failed_batch_fails_its_spans_and_a_batch_promoting_nothing_has_none(
    traces: Traces,
) -> None:
    with pytest.raises(RuntimeError), tracing.promoting({0: Batch([promote(1)], 0, 0, "")}):
        raise RuntimeError("Kafka transaction aborted")
    batch = traces.one("outbox.relay.batch")
    chunk = traces.one("outbox.relay.promote")
    assert batch.status.status_code is chunk.status.status_code is StatusCode.ERROR
    assert [e.name for e in chunk.events] == ["exception"]
    traces.exporter.clear()
    with tracing.promoting({0: Batch([Drop(promote(2).op)], 0, 0, "")}):
        pass
    assert traces.exporter.get_finished_spans() == ()
