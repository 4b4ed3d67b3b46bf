"""The librdkafka settings of the relay's Kafka clients: the transactional producer that writes
each batch, the consumer of the half and op topics, and the admin client that lists topics.

``RelaySettings.kafka`` passes librdkafka keys through; what the relay's correctness rests on
(the ``transactional.id``, ``read_committed``, no offset reset, no auto-commit, the range
assignor) is set after it and cannot be overridden.
"""

from __future__ import annotations

from typing import Any

from outbox.group_member import group_member_config
from relay.settings import RelaySettings


def base_config(settings: RelaySettings) -> dict[str, Any]:
    """What every client of the relay shares: the brokers and the user's ``kafka`` keys."""
    return {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka}


def producer_config(settings: RelaySettings) -> dict[str, Any]:
    """The transactional producer's settings.

    ``retry.backoff.ms`` 10 (librdkafka's default is 100): a transaction's commit returns
    before the coordinator has written its markers, so the next transaction's
    AddOffsetsToTxn often meets CONCURRENT_TRANSACTIONS and is retried after this back-off
    (librdkafka retries AddPartitionsToTxn after 20 ms whatever it is set to). With 100 ms,
    1 in 4-5 commits waited that long under the benchmark's 100 txn/s: end-to-end p99
    210-326 against 107-175 ms with 10 in paired runs (docs/benchmarks.md). ``linger.ms`` 5
    and ``batch.num.messages`` 10,000 batch a backlog's promotions (a commit flushes at once
    whatever the linger; 0 measured no different end to end at 100 txn/s). Set ``kafka`` to
    override any of these three.
    """
    return {
        "retry.backoff.ms": 10,
        "linger.ms": 5,
        "batch.num.messages": 10000,
        **base_config(settings),
        "transactional.id": settings.transactional_id,
        "transaction.timeout.ms": int(settings.transaction_timeout_s * 1000),
        "enable.idempotence": True,
        "acks": "all",
        "allow.auto.create.topics": False,
        "partitioner": "murmur2_random",
    }


def consumer_config(settings: RelaySettings) -> dict[str, Any]:
    """The settings of the consumer of the half and op topics (the group's member,
    :mod:`outbox.group_member`). Offsets are always given on assignment (the committed
    progress, or 0), so a read position out of range means the broker shows less than was read
    before (right after a restart) or retention removed records: jumping to either end would
    repeat or skip decisions, so the session starts over instead."""
    # librdkafka prefetches up to 64 MiB by default; a batch needs far less
    prefetch = {"queued.max.messages.kbytes": 16384}
    return group_member_config(settings.group_id, base_config(settings), defaults=prefetch)


def admin_config(settings: RelaySettings) -> dict[str, Any]:
    """The topic list's admin client: the shared settings less the keys of a producer's or a
    consumer's queueing (``linger.*``, ``batch.*``, ``queue*``) a user may have set in ``kafka``."""
    return {
        k: v
        for k, v in base_config(settings).items()
        if not k.startswith(("linger", "batch", "queue"))
    }
