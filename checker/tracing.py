"""The checker's spans: one per transaction it decides, linked to that transaction's producer.

``outbox.checker.decide`` (INTERNAL) starts when a round decides a transaction - its producer
answered COMMIT or ROLLBACK, or it is given up - and ends when the round's Kafka transaction,
which writes the decision's op record, has committed: its end is when the relay can act on it.
A round that fails ends its spans with an error status (the next session decides again, in a
span of its own). A GIVEN_UP decision has an error status too, with the reason: its messages
went to the dead-letter topic instead of their topic.

One span per decision, not one per round with a link per transaction: decisions are rare (only
transactions whose op was lost), so a span apiece costs nothing in steady state, and each span
can carry its transaction's own outcome, reason and status, and be found by
``outbox.transaction.id``. It *links* to the producer's ``outbox.send`` span (the context its
half records carry) rather than joining that trace: the decision is made seconds to hours later,
by another service, and a trace that long is not one request any more.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from checker.tracker import Pending
from outbox import tracing
from outbox.protocol.op import OpRecord
from outbox.protocol.states import OpState

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("checker")

DECIDE = "outbox.checker.decide"
#: COMMIT, ROLLBACK or GIVEN_UP.
DECISION = "outbox.decision"
REASON = "outbox.decision.reason"
CHECKS = "outbox.check.count"


def decision(otel: tracing.Otel, entry: Pending, op: OpRecord) -> Span | None:
    """A started span for the decision ``op`` on ``entry`` (ended by :func:`written`); None
    when the SDK fails to start one (logged: tracing never fails a round)."""
    try:
        return _decision(otel, entry, op)
    except Exception:
        log.debug("tracing: the decision span could not start", exc_info=True)
        return None


def _decision(otel: tracing.Otel, entry: Pending, op: OpRecord) -> Span:
    from opentelemetry.trace import Link

    attributes: tracing.Attributes = {
        tracing.TRANSACTION_ID: op.txn_id,
        tracing.PRODUCER_GROUP: op.producer_group,
        tracing.HALF_PARTITION: op.half_partition,
        DECISION: op.state.value,
        CHECKS: entry.checks,
    }
    if op.reason is not None:
        attributes[REASON] = op.reason
    records = [entry.records[i].message for i in sorted(entry.records)]
    links = [Link(context) for context in otel.span_contexts(records)]
    span = otel.tracer.start_span(DECIDE, kind=otel.INTERNAL, links=links, attributes=attributes)
    if op.state is OpState.GIVEN_UP:
        otel.failed(span, op.reason or "given up")
    return span


@contextmanager
def written(spans: Sequence[Span]) -> Iterator[None]:
    """End a round's decision spans once the block (the round's write) has returned, or failed
    (recorded on each)."""
    if not spans:
        yield
        return
    otel = tracing.otel
    try:
        yield
    except Exception as err:
        for span in spans:
            _ended(otel, span, err)
        raise
    for span in spans:
        _ended(otel, span, None)


def _ended(otel: tracing.Otel | None, span: Span, err: Exception | None) -> None:
    """End a decision span; the SDK's own failure is logged, never raised (tracing must not
    fail a round: a raising span processor would stop every decision)."""
    try:
        if err is not None:
            span.record_exception(err)
            if otel is not None:
                otel.failed(span, f"decision not written: {type(err).__name__}: {err}")
        span.end()
    except Exception:
        log.debug("tracing: a decision span could not end", exc_info=True)
