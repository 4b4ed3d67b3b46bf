"""The checker's decision spans: linked to the producer's span, ended as the round is written."""

from __future__ import annotations

import pytest
from opentelemetry.trace import StatusCode

from checker import tracing
from checker.tracker import Pending
from outbox import tracing as outbox_tracing
from outbox.protocol import DecidedBy, HalfMessage, HalfRecord, OpRecord, OpState
from tests.tracing_fixtures import Traces, w3c

TXN = "01a203d8-301f-7701-b6f4-468000000001"


def pending(*sends: int) -> Pending:
    """A transaction with one message per send; send n's span is (trace 7, span n)."""
    entry = Pending(TXN, "orders", 2, checks=1)
    for index, send in enumerate(sends):
        entry.records[index] = HalfRecord(
            txn_id=TXN,
            producer_group="orders",
            message=HalfMessage("orders", b"v", headers=(("traceparent", w3c(7, send, 1)),)),
            index=index,
            count=None,
            created_at_ms=0,
            check_count=0,
        )
    return entry


def op(state: OpState, reason: str | None = None) -> OpRecord:
    return OpRecord(TXN, state, "orders", 2, (0, 1, 2), DecidedBy.CHECKER, 0, reason)


def test_a_decision_links_each_send_of_its_transaction_and_ends_when_written(
    traces: Traces,
) -> None:
    otel = outbox_tracing.otel
    assert otel is not None
    # Given a decision on a transaction that sent twice (two messages in the second send)
    span = tracing.decision(otel, pending(5, 6, 6), op(OpState.COMMIT))
    assert traces.named("outbox.checker.decide") == []  # open until its round is written
    with tracing.written([span]):
        pass
    decide = traces.one("outbox.checker.decide")
    assert [(link.context.trace_id, link.context.span_id) for link in decide.links] == [
        (7, 5),
        (7, 6),
    ]
    assert decide.parent is None
    assert dict(decide.attributes or {}) == {
        "outbox.transaction.id": TXN,
        "outbox.producer.group": "orders",
        "outbox.half.partition": 2,
        "outbox.decision": "COMMIT",
        "outbox.check.count": 1,
    }
    assert decide.status.status_code is StatusCode.UNSET


def test_a_given_up_transaction_and_an_unwritten_round_are_failures(traces: Traces) -> None:
    otel = outbox_tracing.otel
    assert otel is not None
    given_up = tracing.decision(otel, pending(5), op(OpState.GIVEN_UP, "still UNKNOWN"))
    rolled_back = tracing.decision(otel, pending(), op(OpState.ROLLBACK))
    with pytest.raises(RuntimeError), tracing.written([given_up, rolled_back]):
        raise RuntimeError("round aborted")
    first, second = traces.named("outbox.checker.decide")
    assert first.attributes["outbox.decision.reason"] == "still UNKNOWN"
    assert second.links == ()  # no record in hand (a resumed transaction): nothing to link
    # the round's failure is on both (why the first was given up stays in its attribute)
    assert first.status.status_code is second.status.status_code is StatusCode.ERROR
    assert second.status.description.startswith("decision not written: RuntimeError")
    assert [e.name for e in first.events] == ["exception"]
