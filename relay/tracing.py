"""The relay's spans: each Kafka transaction that promotes something, linked to the producers'
spans of the transactions it promotes.

The promoted records keep the trace context their producer wrote (it rides in the message's own
headers, which :func:`relay.promotion.promoted` copies): a consumer's span is the child of the
producer's ``outbox.send`` span, in the request's trace, whichever relay batch carried it. The
relay's span cannot be a parent of that: one batch promotes the transactions of many requests,
so it *links* to each of them instead, and starts a trace of its own.

- ``outbox.relay.batch`` (INTERNAL), one per Kafka transaction that promotes at least one
  outbox transaction: from before ``begin_transaction`` to after ``commit_transaction``, so
  its end is when the records became readable to read_committed consumers. A failed batch
  (aborted, redone by a new session) ends with an error status.
- ``outbox.relay.promote`` (INTERNAL), its children, each with up to :data:`LINKS_PER_SPAN`
  links, one per producer span context of the transactions promoted (a link's attributes name
  the transaction). Several, because an SDK keeps only so many links on one span (128 by
  default, ``OTEL_SPAN_LINK_COUNT_LIMIT``) and a batch promotes up to ``batch_max_records``:
  one span would silently lose the rest.

INTERNAL, not PRODUCER: a PRODUCER span is one whose context the message carries, which tools
pair with the CONSUMER spans under it; the records carry the producer's context, not the
relay's, so the relay's span would be a producer with no consumer ever. The producer's
``outbox.send`` span is the PRODUCER span of the message.

Nothing is extracted unless the batch span is recording (an SDK is configured and sampled it):
reading the context of every promoted transaction costs microseconds apiece.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from outbox import tracing
from relay.actions import Batch, Promote

if TYPE_CHECKING:
    from opentelemetry.trace import Link, Span

log = logging.getLogger("relay")

BATCH = "outbox.relay.batch"
PROMOTE = "outbox.relay.promote"
#: How many outbox transactions one batch promoted (on both spans: the batch's, the chunk's).
PROMOTED = "outbox.relay.promoted"
HALF_PARTITIONS = "outbox.half.partitions"


def _link_limit() -> int:
    """The SDK's link limit as its environment variable sets it (128 by default)."""
    try:
        return max(1, int(os.environ.get("OTEL_SPAN_LINK_COUNT_LIMIT", "128")))
    except ValueError:
        return 128


#: Links per ``outbox.relay.promote`` span.
LINKS_PER_SPAN = _link_limit()


@contextmanager
def promoting(batches: Mapping[int, Batch]) -> Iterator[None]:
    """Spans for the Kafka transaction the block writes (``batches``: what each half partition
    hands it); nothing when tracing is off or the batch promotes nothing."""
    otel = tracing.otel
    promotions = (
        []
        if otel is None
        else [a for b in batches.values() for a in b.actions if isinstance(a, Promote)]
    )
    if otel is None or not promotions:
        yield
        return
    attributes: tracing.Attributes = {
        tracing.MESSAGING_SYSTEM: "kafka",
        tracing.OPERATION_TYPE: "send",
        PROMOTED: len(promotions),
        tracing.BATCH_COUNT: sum(len(p.records) for p in promotions),
        HALF_PARTITIONS: sorted(batches),
    }
    with otel.span(BATCH, kind=otel.INTERNAL, attributes=attributes) as s:
        spans = _promote_spans(otel, promotions) if s is not None and s.is_recording() else []
        try:
            yield
        except Exception as err:
            for span in spans:
                _ended(otel, span, err)
            raise
        for span in spans:
            _ended(otel, span, None)


def _promote_spans(otel: tracing.Otel, promotions: list[Promote]) -> list[Span]:
    """One promote span per ``LINKS_PER_SPAN`` linked transactions; none if the SDK fails
    (tracing never fails a batch: a raising span processor would stop every promotion)."""
    try:
        found = links(otel, promotions)
        return [
            otel.tracer.start_span(
                PROMOTE,
                kind=otel.INTERNAL,
                links=[link for _, link in chunk],
                attributes={PROMOTED: len({txn_id for txn_id, _ in chunk})},
            )
            for chunk in (
                found[start : start + LINKS_PER_SPAN]
                for start in range(0, len(found), LINKS_PER_SPAN)
            )
        ]
    except Exception:
        log.debug("tracing: the promote spans could not start", exc_info=True)
        return []


def _ended(otel: tracing.Otel, span: Span, err: Exception | None) -> None:
    try:
        if err is not None:
            span.record_exception(err)
            otel.failed(span, f"{type(err).__name__}: {err}")
        span.end()
    except Exception:
        log.debug("tracing: a promote span could not end", exc_info=True)


def links(otel: tracing.Otel, promotions: Iterable[Promote]) -> list[tuple[str, Link]]:
    """One link per producer span context of each promoted transaction (usually one: one per
    send), naming it; with the transaction's id."""
    from opentelemetry.trace import Link

    found = []
    for promote in promotions:
        records = promote.records
        attributes: tracing.Attributes = {
            tracing.TRANSACTION_ID: promote.op.txn_id,
            tracing.PRODUCER_GROUP: promote.op.producer_group,
            tracing.BATCH_COUNT: len(records),
        }
        for context in otel.span_contexts(r.message for r in records):
            found.append((promote.op.txn_id, Link(context, attributes)))
    return found
