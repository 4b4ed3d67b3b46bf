"""Seeded anomalies: raw records written straight to real topics, one set per finding type.

Every finding has its own transactions, and around them a stream of clean ones (committed by
producer or checker, rolled back, resumed and then committed, with a put-back copy), records
of aborted Kafka transactions that a read_committed reader must not see, and an evidence table
in PostgreSQL that agrees with the topics except where a finding says otherwise.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, field

import sqlalchemy as sa
from confluent_kafka import Producer

from outbox import migrations
from outbox.evidence import evidence_table
from outbox.protocol import DecidedBy, Header, OpState, new_transaction_id
from outbox.testing.stream import StreamTxn, StreamWriter
from tests.kafka_helpers import create_topic, unique

COMMIT, ROLLBACK, GIVEN_UP, RESUMED = (
    OpState.COMMIT,
    OpState.ROLLBACK,
    OpState.GIVEN_UP,
    OpState.RESUMED,
)
CHECKER = DecidedBy.CHECKER


@dataclass
class Seeded:
    """What was written, and what the audit must find."""

    prefix: str
    real_topics: list[str]
    evidence_url: str
    group: str
    expected: dict[str, set[str]] = field(default_factory=dict)
    clean: set[str] = field(default_factory=set)
    #: The transactions planted for the findings, by name (the keys of ``a`` below, and
    #: ``early`` / ``late``, the same-key pair), for tests that check every column.
    planted: dict[str, StreamTxn] = field(default_factory=dict)
    #: The unreadable records' transaction ids: ``future_half``, ``future_op``.
    unreadable_ids: dict[str, str] = field(default_factory=dict)
    #: Unix ms before the first record and after the last record and evidence row.
    began_ms: int = 0
    ended_ms: int = 0


def fresh_database(postgres_url: str, revision: str = "heads") -> str:
    """A new, empty database on the session's PostgreSQL, with the outbox migrations (up to
    ``revision``)."""
    name = unique("audit").replace("-", "_")
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    admin.dispose()
    url = sa.make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    migrations.upgrade(url, revision)
    return url


def add_evidence(url: str, rows: list[tuple[str, str, str]]) -> None:
    engine = sa.create_engine(url)
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as conn:
        conn.execute(
            evidence_table.insert(),
            [{"txn_id": t, "kind": k, "producer_group": g, "created_at": now} for t, k, g in rows],
        )
    engine.dispose()


def aborted(bootstrap: str, records: list[tuple[str, bytes, bytes, list, int | None]]) -> None:
    """Records written in a Kafka transaction that is then aborted."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("aborted")})
    producer.init_transactions(30)
    producer.begin_transaction()
    for topic, key, value, headers, partition in records:
        kwargs = {"partition": partition} if partition is not None else {}
        producer.produce(topic, key=key, value=value, headers=headers, **kwargs)
    producer.flush(30)
    producer.abort_transaction(30)


def seed(bootstrap: str, postgres_url: str) -> Seeded:
    orders, payments = unique("orders"), unique("payments")
    for topic in (orders, payments):
        create_topic(bootstrap, topic, partitions=2)
    group = unique("shop")
    w = StreamWriter(bootstrap, prefix=unique("__outbox-audit"), partitions=3, group=group)
    seeded = Seeded(w.topics.prefix, [orders, payments], fresh_database(postgres_url), group)
    seeded.began_ms = int(time.time() * 1000)
    evidence: list[tuple[str, str, str]] = []

    def txn(n: int = 1, key: bytes | None = None, topic: str = orders) -> StreamTxn:
        key = key if key is not None else new_transaction_id().encode()
        return w.begin([(topic if i % 2 == 0 else payments, key, b"v%d" % i) for i in range(n)])

    # Clean transactions of every kind, and the anomalies, halves first (as producers do).
    committed = [txn(1 + i % 3, key=b"customer-%d" % (i % 4)) for i in range(24)]
    by_checker = [txn() for _ in range(3)]
    declined = [txn(2) for _ in range(4)]
    resumed = txn()
    copied = txn()
    a = {name: txn() for name in ("lost", "phantom", "duplicate", "stuck", "given_up")}
    a["partial"] = txn(3)
    a["conflict"] = txn()
    a["evidence_rollback"] = txn()
    a["no_evidence"] = txn()
    a["fenced_commit"] = txn()
    late, early = txn(key=b"same-key"), txn(key=b"same-key")
    w.flush()

    for t in committed:
        w.decide(t, COMMIT)
    for t in by_checker:
        w.decide(t, COMMIT, decided_by=CHECKER)
    for t in declined:
        w.decide(t, ROLLBACK)
    for state in (GIVEN_UP, RESUMED, COMMIT):
        w.decide(resumed, state, decided_by=CHECKER)
    w.decide(copied, COMMIT, decided_by=CHECKER)
    for name in ("lost", "duplicate", "partial", "no_evidence", "fenced_commit"):
        w.decide(a[name], COMMIT)
    w.decide(a["phantom"], ROLLBACK)
    w.decide(a["given_up"], GIVEN_UP, decided_by=CHECKER, reason="still UNKNOWN after 15 checks")
    w.decide(a["conflict"], COMMIT)
    w.decide(a["conflict"], ROLLBACK, decided_by=CHECKER)
    w.decide(a["evidence_rollback"], ROLLBACK, decided_by=CHECKER)
    w.decide(early, COMMIT)  # committed first: must be promoted first
    w.decide(late, COMMIT)
    w.flush()

    # Promotion, as the relay would do it - and as it must not.
    for t in [*committed, *by_checker, resumed, copied, a["conflict"], a["no_evidence"]]:
        w.promote(t)
    w.promote(a["fenced_commit"])
    w.promote(a["phantom"])
    w.promote(a["duplicate"])
    w.promote(a["duplicate"])
    w.promote(a["partial"], [0, 2])
    w.promote(late)
    w.promote(early)
    w.dead_letter(a["given_up"], "still UNKNOWN after 15 checks")
    w.flush()
    # A put-back copy, in a committed Kafka transaction, as the relay writes them.
    copy_producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("copy")})
    copy_producer.init_transactions(30)
    copy_producer.begin_transaction()
    original = copied.messages[0]
    copy_headers = [
        (Header.SCHEMA_VERSION.value, b"1"),
        (Header.TXN_ID.value, copied.txn_id.encode()),
        (Header.PRODUCER_GROUP.value, group.encode()),
        (Header.REAL_TOPIC.value, original.topic.encode()),
        (Header.REAL_KEY.value, original.key or b""),
        (Header.MESSAGE_INDEX.value, b"0"),
        (Header.CREATED_AT.value, b"0"),
        (Header.CHECK_COUNT.value, b"1"),
        (Header.ORIGIN_OFFSET.value, str(copied.offsets[0]).encode()),
    ]
    copy_producer.produce(
        w.topics.half,
        key=copied.txn_id.encode(),
        value=b"v0",
        headers=copy_headers,
        partition=copied.partition,
    )
    copy_producer.commit_transaction(30)

    # Aborted writes: a half nobody decides (would be stuck) and a promotion of a rolled-back
    # transaction (would be a phantom) - invisible to read_committed.
    ghost = new_transaction_id()
    ghost_headers = [
        (n, ghost.encode() if n == Header.TXN_ID.value else v) for n, v in copy_headers[:-1]
    ]
    aborted(
        bootstrap,
        [
            (w.topics.half, ghost.encode(), b"v", ghost_headers, 0),
            (
                orders,
                b"k",
                b"v",
                [
                    (Header.TXN_ID.value, declined[0].txn_id.encode()),
                    (Header.MESSAGE_INDEX.value, b"0"),
                ],
                None,
            ),
        ],
    )

    # Records the audit cannot read: a half of schema version 2, an op of version 2.
    future_half, future_op = new_transaction_id(), new_transaction_id()
    future_headers = [
        (n, future_half.encode() if n == Header.TXN_ID.value else v) for n, v in copy_headers[:-1]
    ]
    future_headers[0] = (Header.SCHEMA_VERSION.value, b"2")
    w.raw(w.topics.half, future_half.encode(), b"v", future_headers, 1)
    w.raw(
        w.topics.op, future_op.encode(), json.dumps({"v": 2, "txn_id": future_op}).encode(), None, 1
    )
    w.flush()
    w.close()

    for t in [*committed, *by_checker, resumed, copied, a["conflict"], late, early]:
        evidence.append((t.txn_id, "evidence", group))
    for name in ("lost", "duplicate", "partial", "evidence_rollback"):
        evidence.append((a[name].txn_id, "evidence", group))
    evidence.append((a["fenced_commit"].txn_id, "fence", group))
    for t in declined:
        evidence.append((t.txn_id, "fence", group))
    add_evidence(seeded.evidence_url, evidence)
    seeded.ended_ms = int(time.time() * 1000)
    seeded.planted = {**a, "early": early, "late": late}
    seeded.unreadable_ids = {"future_half": future_half, "future_op": future_op}

    seeded.expected = {
        "lost": {a["lost"].txn_id},
        "partial": {a["partial"].txn_id},
        "phantom": {a["phantom"].txn_id},
        "duplicate": {a["duplicate"].txn_id},
        "out_of_order": {early.txn_id},
        "stuck": {a["stuck"].txn_id},
        "given_up": {a["given_up"].txn_id},
        "conflicting_decisions": {a["conflict"].txn_id},
        "evidence_without_commit": {a["evidence_rollback"].txn_id},
        "commit_without_evidence": {a["no_evidence"].txn_id, a["fenced_commit"].txn_id},
        "unreadable": {future_half, future_op},
    }
    seeded.clean = {t.txn_id for t in [*committed, *by_checker, *declined, resumed, copied]}
    return seeded
