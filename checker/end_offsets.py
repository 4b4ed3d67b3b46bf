"""The end offsets of the half partitions a checker reads to their end before it writes a COMMIT.

Asked of the admin client first (one ListOffsets request per leader, read uncommitted). A
partition it cannot answer for is asked of a consumer, one partition at a time. An answer is an
offset of 0 or more: when a leader's reply fails as a whole (the broker down or frozen, its
reply later than ``timeout``), librdkafka 2.16's admin client answers that leader's partitions
with offset -1001 (``OFFSET_INVALID``) and no error - an end every read position passes, so a
COMMIT was written naming only the half records read so far, and the relay delivered part of a
committed transaction (the three-broker fault test; ``tests/checker/test_end_offsets.py``). On a
three-broker cluster whose leaders moved under kill -9, librdkafka's admin client kept answering
``FENCED_LEADER_EPOCH`` ("Leader epoch is older than broker epoch") for 15 minutes - its cached
leader epoch was never refreshed - and a checker that asked it alone never applied its answers,
leaving transactions whose op was lost undelivered (docs/clusters.md). The consumer's metadata
follows leadership changes, as the relay's watermark queries show, and a consumer whose metadata
went stale is replaced by a fresh one after a failed query (``outbox.watermarks``). Not the
checker's own consumer: it reads committed, and would answer with the last stable offset, below
half records acknowledged after a Kafka transaction still open (``outbox.watermarks``).
"""

from __future__ import annotations

import logging

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from outbox.logs import fields
from outbox.watermarks import Watermarks

log = logging.getLogger("checker")


def end_offsets(
    admin: AdminClient | None,
    watermarks: Watermarks,
    topic: str,
    partitions: set[int],
    timeout: float,
) -> dict[int, int]:
    """High-watermarks of ``partitions`` of ``topic``; a partition neither client could answer
    for is left out (its caller treats it as not read to its end, and asks again next round),
    and so are those the consumer would have been asked after it."""
    if admin is None:
        return {}  # the session has ended (its consumer is closing too)
    ends: dict[int, int] = {}
    request = {
        TopicPartition(topic, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
        for p in sorted(partitions)
    }
    futures = admin.list_offsets(
        request, isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=timeout
    )
    for tp, future in futures.items():
        try:
            end = int(future.result().offset)
        except KafkaException as err:  # the consumer is asked below
            log.debug("admin: end offset of %s [%d] not known: %s", topic, tp.partition, err)
            continue
        if end < 0:  # librdkafka's answer when the leader's reply failed or came too late
            log.debug("admin: end offset of %s [%d] not known (%d)", topic, tp.partition, end)
            continue
        ends[tp.partition] = end
    admin.poll(0)  # its librdkafka log comes out only here (outbox.kafka_logging)
    for p in sorted(partitions - ends.keys()):
        try:
            _, high = watermarks.query(topic, p, timeout=timeout)
        except KafkaException as err:
            log.warning(
                "end offset of %s [%d] not known: %s",
                topic,
                p,
                err,
                extra=fields(topic=topic, partition=p),
            )
            # The caller needs every end: the rest are not asked (each question may wait out
            # ``timeout`` on a leader that is down, and a round must not outlast the checker's
            # stuck timer).
            break
        ends[p] = high
    return ends
